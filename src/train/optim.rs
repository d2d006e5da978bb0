//! The optimizer of the authors' HF `Trainer` defaults: torch's AdamW (β 0.9/0.999, ε 1e-8,
//! weight decay 0 by default), a linear decay of the learning rate to 0 without warm-up, and
//! gradient-norm clipping at 1.0 (`clip_grad_norm_`). Its state is plain tensors so that a
//! checkpoint restores it exactly.
//!
//! One optimizer may hold a stack of runs (phase 2's [`AdamW::stacked`]): every parameter then has
//! a leading run axis, and each run is clipped on its own gradient norm and updated as it would
//! be alone, bit for bit; the runs share only the step count and so the schedule.

use std::collections::HashMap;

use anyhow::{Context, Result};
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    pub learning_rate: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub epsilon: f64,
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (0 disables).
    pub max_grad_norm: f64,
    pub warmup_steps: usize,
}

/// Values that replace an optimizer's own; an absent one leaves it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerOverrides {
    pub learning_rate: Option<f64>,
    pub beta1: Option<f64>,
    pub beta2: Option<f64>,
    pub epsilon: Option<f64>,
    pub weight_decay: Option<f64>,
    pub max_grad_norm: Option<f64>,
    pub warmup_steps: Option<usize>,
}

impl OptimizerOverrides {
    /// `base` with these values in place of its own.
    pub fn apply(&self, base: &OptimizerConfig) -> OptimizerConfig {
        OptimizerConfig {
            learning_rate: self.learning_rate.unwrap_or(base.learning_rate),
            beta1: self.beta1.unwrap_or(base.beta1),
            beta2: self.beta2.unwrap_or(base.beta2),
            epsilon: self.epsilon.unwrap_or(base.epsilon),
            weight_decay: self.weight_decay.unwrap_or(base.weight_decay),
            max_grad_norm: self.max_grad_norm.unwrap_or(base.max_grad_norm),
            warmup_steps: self.warmup_steps.unwrap_or(base.warmup_steps),
        }
    }
}

impl OptimizerConfig {
    /// Every value AdamW cannot train with, named by its key (a run never starts with them: a
    /// negative or huge step, a β outside [0, 1), ε ≤ 0 or a negative decay or clip norm train to
    /// nonsense that still reports accuracies).
    pub fn check(&self) -> anyhow::Result<()> {
        let key = |name: &str| format!("[optimizer] {name}");
        let finite = |name: &str, v: f64| -> anyhow::Result<()> {
            if v.is_finite() {
                Ok(())
            } else {
                anyhow::bail!("{} must be a finite number, got {v}", key(name))
            }
        };
        for (name, v) in [
            ("learning_rate", self.learning_rate),
            ("beta1", self.beta1),
            ("beta2", self.beta2),
            ("epsilon", self.epsilon),
            ("weight_decay", self.weight_decay),
            ("max_grad_norm", self.max_grad_norm),
        ] {
            finite(name, v)?;
        }
        if !(self.learning_rate > 0.0 && self.learning_rate <= MAX_LEARNING_RATE) {
            anyhow::bail!(
                "{} must be in (0, {MAX_LEARNING_RATE}], got {}",
                key("learning_rate"),
                self.learning_rate
            );
        }
        for (name, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                anyhow::bail!("{} must be in [0, 1), got {v}", key(name));
            }
        }
        if self.epsilon <= 0.0 {
            anyhow::bail!("{} must be > 0, got {}", key("epsilon"), self.epsilon);
        }
        for (name, v) in [
            ("weight_decay", self.weight_decay),
            ("max_grad_norm", self.max_grad_norm),
        ] {
            if v < 0.0 {
                anyhow::bail!("{} must be ≥ 0, got {v}", key(name));
            }
        }
        Ok(())
    }
}

/// The largest step size a run accepts: far above any AdamW setting that trains (the paper's is
/// 5e-5), low enough that a typo such as 1e30 is refused.
pub const MAX_LEARNING_RATE: f64 = 10.0;

/// AdamW over named parameters with HF's linear schedule over `total_steps`.
pub struct AdamW {
    config: OptimizerConfig,
    total_steps: usize,
    /// Updates done so far.
    pub step: usize,
    params: Vec<(String, Var)>,
    /// Runs stacked along every parameter's first axis ([`AdamW::stacked`]); 1 and no such
    /// axis for [`AdamW::new`].
    runs: usize,
    /// Whether the parameters have the leading run axis ([`AdamW::stacked`], even of one run).
    run_axis: bool,
    /// Each parameter's shape in one run: its own without the run axis, when there is one.
    run_dims: Vec<Vec<usize>>,
    moments: AdamMoments,
}

/// The first and second moments of every parameter: on the CPU plain vectors, updated in place
/// with the parameter in one pass (a step allocates nothing); elsewhere tensors on the device.
enum AdamMoments {
    Host(Vec<(Vec<f32>, Vec<f32>)>),
    Device(Vec<(Tensor, Tensor)>),
}

impl AdamW {
    pub fn new(
        params: Vec<(String, Var)>,
        config: OptimizerConfig,
        total_steps: usize,
    ) -> Result<Self> {
        let run_dims = params.iter().map(|(_, v)| v.dims().to_vec()).collect();
        Self::build(params, (1, false), run_dims, config, total_steps)
    }

    /// A stack of `runs` runs that step together: each parameter (runs, …) holds run r's values
    /// at index r of its first axis. Run r's gradient norm, clipping and update are those of an
    /// optimizer over its slices alone.
    pub fn stacked(
        params: Vec<(String, Var)>,
        runs: usize,
        config: OptimizerConfig,
        total_steps: usize,
    ) -> Result<Self> {
        anyhow::ensure!(runs >= 1, "a stack holds at least one run");
        let mut run_dims = Vec::with_capacity(params.len());
        for (name, var) in &params {
            anyhow::ensure!(
                var.dims().first() == Some(&runs),
                "stacked parameter {name} of shape {:?} has no leading axis of {runs} runs",
                var.dims()
            );
            run_dims.push(var.dims()[1..].to_vec());
        }
        Self::build(params, (runs, true), run_dims, config, total_steps)
    }

    fn build(
        params: Vec<(String, Var)>,
        (runs, run_axis): (usize, bool),
        run_dims: Vec<Vec<usize>>,
        config: OptimizerConfig,
        total_steps: usize,
    ) -> Result<Self> {
        let moments = if params.iter().all(|(_, v)| v.device().is_cpu()) {
            AdamMoments::Host(
                params
                    .iter()
                    .map(|(_, v)| (vec![0.0; v.elem_count()], vec![0.0; v.elem_count()]))
                    .collect(),
            )
        } else {
            AdamMoments::Device(
                params
                    .iter()
                    .map(|(_, v)| Ok((v.zeros_like()?, v.zeros_like()?)))
                    .collect::<candle_core::Result<_>>()?,
            )
        };
        Ok(Self {
            config,
            total_steps: total_steps.max(1),
            step: 0,
            params,
            runs,
            run_axis,
            run_dims,
            moments,
        })
    }

    /// Every parameter as it is now (the variables' tensors, stacked), in the order given.
    pub fn tensors(&self) -> Vec<Tensor> {
        self.params
            .iter()
            .map(|(_, v)| v.as_tensor().clone())
            .collect()
    }

    /// Runs in the stack (1 for [`AdamW::new`]).
    pub fn runs(&self) -> usize {
        self.runs
    }

    /// HF `get_linear_schedule_with_warmup`: the factor for update number `step` (0-based).
    pub fn schedule(&self, step: usize) -> f64 {
        let warmup = self.config.warmup_steps;
        if step < warmup {
            return step as f64 / warmup.max(1) as f64;
        }
        ((self.total_steps as f64 - step as f64) / (self.total_steps - warmup).max(1) as f64)
            .max(0.0)
    }

    /// One update from `grads`, after clipping their global norm.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        let grads = self.gradients(grads)?;
        self.apply(grads)
    }

    /// One update from each parameter's gradient, in the order the parameters were given, each
    /// run's after clipping its own gradients' global norm. With moments on a device, the norms,
    /// the clipping and the update stay there: nothing is read back.
    pub fn apply(&mut self, grads: Vec<Tensor>) -> Result<()> {
        anyhow::ensure!(
            grads.len() == self.params.len()
                && grads
                    .iter()
                    .zip(&self.params)
                    .all(|(g, (_, v))| g.dims() == v.dims()),
            "{} gradients for {} parameters, or of other shapes",
            grads.len(),
            self.params.len()
        );
        let on_host = matches!(self.moments, AdamMoments::Host(_));
        let max_norm = self.config.max_grad_norm;
        let clips = if on_host {
            // torch: clip_coef = max_norm / (norm + 1e-6), clamped to 1, always multiplied.
            let clips = run_norms(&grads, self.runs)?
                .iter()
                .map(|norm| {
                    if max_norm > 0.0 {
                        (max_norm / (norm + 1e-6)).min(1.0)
                    } else {
                        1.0
                    }
                })
                .collect();
            Clips::Host(clips)
        } else {
            Clips::Device(device_clips(&grads, self.runs, max_norm)?)
        };
        let lr = self.config.learning_rate * self.schedule(self.step);
        self.step += 1;
        let t = self.step as i32;
        let step = StepConstants {
            clips,
            lr,
            step_size: lr / (1.0 - self.config.beta1.powi(t)),
            bias2_sqrt: (1.0 - self.config.beta2.powi(t)).sqrt(),
        };
        for (k, grad) in grads.iter().enumerate() {
            if on_host {
                self.update_on_host(k, grad, &step)?;
            } else {
                self.update_on_device(k, grad, &step)?;
            }
        }
        Ok(())
    }

    /// The same optimizer with its moments as tensors on the parameters' device even on the CPU:
    /// the device-resident route's update ([`crate::train::phase2`]), whole-buffer tensor ops
    /// with nothing read back. Before any step only.
    pub fn with_device_moments(mut self) -> Result<Self> {
        anyhow::ensure!(self.step == 0, "moments moved after {} steps", self.step);
        self.moments = AdamMoments::Device(
            self.params
                .iter()
                .map(|(_, v)| Ok((v.zeros_like()?, v.zeros_like()?)))
                .collect::<candle_core::Result<_>>()?,
        );
        Ok(self)
    }

    /// Every parameter's gradient, zeros for one the loss did not reach.
    pub fn gradients(&self, grads: &GradStore) -> Result<Vec<Tensor>> {
        gradients_of(self.params.iter().map(|(_, v)| v), grads)
    }

    /// Parameter `k`'s AdamW update in one pass over host memory, in place, instead of a dozen
    /// tensor ops, each allocating: the optimizer dominated small steps (BERT's pooler has 148k
    /// parameters).
    fn update_on_host(&mut self, k: usize, grad: &Tensor, step: &StepConstants) -> Result<()> {
        let AdamMoments::Host(moments) = &mut self.moments else {
            anyhow::bail!("host update of device moments");
        };
        let (m, v) = &mut moments[k];
        let Clips::Host(clips) = &step.clips else {
            anyhow::bail!("host update with clipping factors on a device");
        };
        // The constants as candle's scalar ops round them (f64 → f32), so that both paths
        // compute the same f32 arithmetic.
        let (b1, b2) = (self.config.beta1, self.config.beta2);
        let update = HostUpdate {
            grad: grad.flatten_all()?,
            moments: std::sync::Mutex::new((m, v)),
            one_b1: (1.0 - b1) as f32,
            one_b2: (1.0 - b2) as f32,
            clips: clips.iter().map(|&c| c as f32).collect(),
            b1: b1 as f32,
            b2: b2 as f32,
            decay: (self.config.weight_decay != 0.0)
                .then_some((1.0 - step.lr * self.config.weight_decay) as f32),
            inv_bias2: (1.0 / step.bias2_sqrt) as f32,
            eps: self.config.epsilon as f32,
            step_size: step.step_size as f32,
        };
        self.params[k].1.as_tensor().inplace_op1(&update)?;
        Ok(())
    }

    /// Parameter `k`'s AdamW update as tensor ops on its device.
    fn update_on_device(&mut self, k: usize, grad: &Tensor, step: &StepConstants) -> Result<()> {
        let var = &self.params[k].1;
        let (b1, b2) = (self.config.beta1, self.config.beta2);
        let AdamMoments::Device(moments) = &mut self.moments else {
            anyhow::bail!("device update of host moments");
        };
        let Clips::Device(clips) = &step.clips else {
            anyhow::bail!("device update with clipping factors on the host");
        };
        // Each run's slice times its own factor (torch multiplies by min(1, coef) always, so
        // that no norm is read back to decide).
        let mut shape = vec![1; grad.rank().max(1)];
        shape[0] = clips.elem_count();
        let g = grad.broadcast_mul(&clips.reshape(shape)?)?;
        let m = ((&moments[k].0 * b1)? + (&g * (1.0 - b1))?)?;
        let v = ((&moments[k].1 * b2)? + (g.sqr()? * (1.0 - b2))?)?;
        let mut theta = var.as_tensor().clone();
        if self.config.weight_decay != 0.0 {
            theta = (theta * (1.0 - step.lr * self.config.weight_decay))?;
        }
        let denom = ((v.sqrt()? / step.bias2_sqrt)? + self.config.epsilon)?;
        var.set(&(theta - (m.div(&denom)? * step.step_size)?)?)?;
        moments[k] = (m, v);
        Ok(())
    }

    /// The parameter called `name`.
    pub fn param(&self, name: &str) -> Option<&Var> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// A copy of every parameter as it is now, in the optimizer's order: the parameters change
    /// in place at the next step. The copies are variables, so that a model built on them
    /// (`QueryKey::from_params`, at every step of the look-ahead) takes them without copying
    /// them again.
    pub fn snapshot(&self) -> Result<Vec<Tensor>> {
        self.params
            .iter()
            // `detach` shares the storage without the variable flag, so `from_tensor` copies it
            // (a variable itself would be shared, and move at the next step).
            .map(|(_, var)| {
                Ok(Var::from_tensor(&var.as_tensor().detach())?
                    .as_tensor()
                    .clone())
            })
            .collect()
    }

    /// Run `run`'s parameters and moments by name, each of the run's own shape, for its
    /// checkpoint: what an optimizer of that run alone would hold.
    pub fn run_state(&self, run: usize) -> Result<HashMap<String, Tensor>> {
        anyhow::ensure!(run < self.runs, "run {run} of a stack of {}", self.runs);
        let mut state = HashMap::new();
        for (k, (name, var)) in self.params.iter().enumerate() {
            let dims = self.run_dims[k].as_slice();
            let len: usize = dims.iter().product();
            // A copy: the parameter itself changes in place at the next step.
            state.insert(format!("param.{name}"), self.run_param(k, run)?.copy()?);
            let (m, v) = match &self.moments {
                AdamMoments::Host(moments) => {
                    let host = |values: &[f32]| {
                        Tensor::from_slice(&values[run * len..(run + 1) * len], dims, var.device())
                    };
                    (host(&moments[k].0)?, host(&moments[k].1)?)
                }
                AdamMoments::Device(moments) => (
                    self.of_run(&moments[k].0, run)?.copy()?,
                    self.of_run(&moments[k].1, run)?.copy()?,
                ),
            };
            state.insert(format!("adam_m.{name}"), m);
            state.insert(format!("adam_v.{name}"), v);
        }
        Ok(state)
    }

    /// Parameters and moments by name, for checkpoints (a lone run's: [`Self::run_state`] 0).
    pub fn state(&self) -> Result<HashMap<String, Tensor>> {
        self.run_state(0)
    }

    /// Parameter `k` of run `run`, a view of the stacked parameter (the parameter itself when
    /// there is no run axis).
    fn run_param(&self, k: usize, run: usize) -> Result<Tensor> {
        self.of_run(self.params[k].1.as_tensor(), run)
    }

    /// Run `run`'s slice of a tensor of a parameter's stacked shape.
    fn of_run(&self, stacked: &Tensor, run: usize) -> Result<Tensor> {
        if !self.run_axis {
            return Ok(stacked.clone());
        }
        Ok(stacked.get(run)?)
    }

    /// The parameter called `name` as run `run` has it (a view; it changes at the next step).
    pub fn param_of_run(&self, name: &str, run: usize) -> Result<Tensor> {
        let k = self
            .params
            .iter()
            .position(|(n, _)| n == name)
            .with_context(|| format!("no parameter {name}"))?;
        self.run_param(k, run)
    }

    /// Restores what [`AdamW::state`] saved, after `step` updates.
    pub fn restore(&mut self, state: &HashMap<String, Tensor>, step: usize) -> Result<()> {
        self.restore_run(0, state, step)
    }

    /// Restores run `run` from what [`AdamW::run_state`] saved, after `step` updates (every run
    /// of a stack has made the same number of steps).
    pub fn restore_run(
        &mut self,
        run: usize,
        state: &HashMap<String, Tensor>,
        step: usize,
    ) -> Result<()> {
        anyhow::ensure!(run < self.runs, "run {run} of a stack of {}", self.runs);
        for (k, (name, var)) in self.params.iter().enumerate() {
            let get = |prefix: &str| {
                state
                    .get(&format!("{prefix}.{name}"))
                    .cloned()
                    .with_context(|| format!("checkpoint lacks {prefix}.{name}"))
            };
            let dims = self.run_dims[k].as_slice();
            let (param, m, v) = (get("param")?, get("adam_m")?, get("adam_v")?);
            for (what, t) in [
                ("parameter", &param),
                ("first moment", &m),
                ("second moment", &v),
            ] {
                anyhow::ensure!(
                    t.dims() == dims,
                    "checkpoint {what} of {name} is {:?}, the run's is {dims:?}",
                    t.dims()
                );
            }
            if !self.run_axis {
                var.set(&param)?;
            } else {
                var.as_tensor().slice_set(&param.unsqueeze(0)?, 0, run)?;
            }
            match &mut self.moments {
                AdamMoments::Host(moments) => {
                    let len: usize = dims.iter().product();
                    let host = |t: &Tensor| -> Result<Vec<f32>> {
                        Ok(crate::kernels::host_reads::flat::<f32>(t)?)
                    };
                    moments[k].0[run * len..(run + 1) * len].copy_from_slice(&host(&m)?);
                    moments[k].1[run * len..(run + 1) * len].copy_from_slice(&host(&v)?);
                }
                AdamMoments::Device(moments) => {
                    if !self.run_axis {
                        moments[k] = (m, v);
                    } else {
                        moments[k].0.slice_set(&m.unsqueeze(0)?, 0, run)?;
                        moments[k].1.slice_set(&v.unsqueeze(0)?, 0, run)?;
                    }
                }
            }
        }
        self.step = step;
        Ok(())
    }
}

/// Parameters a thread updates at once: 64 kB of each of the four arrays, large enough that
/// handing a part to another thread costs little beside it (ViT-Ti's 192 × 192 query: 3 parts).
const UPDATE_CHUNK: usize = 16 * 1024;

/// One parameter's AdamW update as candle's in-place op on the parameter's storage: the moments
/// are updated beside it in the same pass.
struct HostUpdate<'a> {
    grad: Tensor,
    moments: std::sync::Mutex<(&'a mut Vec<f32>, &'a mut Vec<f32>)>,
    one_b1: f32,
    one_b2: f32,
    /// Each run's clipping factor: run r's elements are the r-th equal part of the parameter.
    clips: Vec<f32>,
    b1: f32,
    b2: f32,
    /// 1 − lr·λ, when there is weight decay.
    decay: Option<f32>,
    inv_bias2: f32,
    eps: f32,
    step_size: f32,
}

impl candle_core::InplaceOp1 for HostUpdate<'_> {
    fn name(&self) -> &'static str {
        "adamw-host-update"
    }

    fn cpu_fwd(
        &self,
        storage: &mut candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        let candle_core::CpuStorage::F32(data) = storage else {
            candle_core::bail!("AdamW: f32 parameters only")
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("AdamW: contiguous parameters only")
        };
        let theta = &mut data[start..end];
        crate::kernels::with_host_f32(&self.grad, |g| self.update(theta, g))?
    }
}

impl HostUpdate<'_> {
    fn update(&self, theta: &mut [f32], g: &[f32]) -> candle_core::Result<()> {
        let mut moments = self
            .moments
            .lock()
            .expect("the moments' lock is not shared");
        let (m, v) = &mut *moments;
        let (m, v): (&mut [f32], &mut [f32]) = (m, v);
        if g.len() != theta.len() || m.len() != theta.len() || v.len() != theta.len() {
            candle_core::bail!("AdamW: gradient or moments do not fit the parameter")
        }
        // Element by element, so the parts are independent and the threads of the current pool
        // (phase 2's sample pool in a run) share them without changing a bit; each run's part
        // with its own clipping.
        use rayon::prelude::*;
        let run_len = theta.len() / self.clips.len().max(1);
        for (run, &clip) in self.clips.iter().enumerate() {
            let part = run * run_len..(run + 1) * run_len;
            theta[part.clone()]
                .par_chunks_mut(UPDATE_CHUNK)
                .zip(g[part.clone()].par_chunks(UPDATE_CHUNK))
                .zip(m[part.clone()].par_chunks_mut(UPDATE_CHUNK))
                .zip(v[part].par_chunks_mut(UPDATE_CHUNK))
                .for_each(|(((theta, g), m), v)| self.update_part(clip, theta, g, m, v));
        }
        Ok(())
    }

    /// [`Self::update_kernel`] in the widest vector instructions the CPU has.
    fn update_part(&self, clip: f32, theta: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        fn avx2(
            u: &HostUpdate,
            c: f32,
            theta: &mut [f32],
            g: &[f32],
            m: &mut [f32],
            v: &mut [f32],
        ) {
            u.update_kernel(c, theta, g, m, v)
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx2,fma")]
        fn avx512(
            u: &HostUpdate,
            c: f32,
            theta: &mut [f32],
            g: &[f32],
            m: &mut [f32],
            v: &mut [f32],
        ) {
            u.update_kernel(c, theta, g, m, v)
        }
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::avx512_fma() {
            // SAFETY: the CPU has the features `avx512` is compiled for.
            unsafe { avx512(self, clip, theta, g, m, v) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::avx2_fma() {
            // SAFETY: the CPU has the features `avx2` is compiled for.
            unsafe { avx2(self, clip, theta, g, m, v) };
            return;
        }
        self.update_kernel(clip, theta, g, m, v);
    }

    /// The update over slices of equal length, in a form that vectorises (Rust does not contract
    /// to FMA, so the vectorised loop computes exactly what the scalar one does; a missing weight
    /// decay multiplies by 1, which changes nothing).
    #[inline(always)]
    fn update_kernel(&self, clip: f32, theta: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        let decay = self.decay.unwrap_or(1.0);
        for (((theta, &g), m), v) in theta.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            let g = g * clip;
            *m = *m * self.b1 + g * self.one_b1;
            *v = *v * self.b2 + (g * g) * self.one_b2;
            *theta *= decay;
            let denom = v.sqrt() * self.inv_bias2 + self.eps;
            *theta -= (*m / denom) * self.step_size;
        }
    }
}

/// The gradient of each of `vars` in `grads`, zeros for one the loss did not reach.
pub fn gradients_of<'a>(
    vars: impl Iterator<Item = &'a Var>,
    grads: &GradStore,
) -> Result<Vec<Tensor>> {
    vars.map(|v| {
        Ok(grads
            .get(v)
            .cloned()
            .map_or_else(|| v.as_tensor().zeros_like(), Ok)?)
    })
    .collect()
}

/// Each run's gradient clipping factor (≤ 1), where the update runs.
enum Clips {
    Host(Vec<f64>),
    /// (runs,) f32 on the parameters' device.
    Device(Tensor),
}

/// One step's scalars, shared by every parameter's update.
struct StepConstants {
    clips: Clips,
    /// The scheduled learning rate.
    lr: f64,
    /// lr / (1 − β₁ᵗ).
    step_size: f64,
    /// √(1 − β₂ᵗ).
    bias2_sqrt: f64,
}

/// Each run's global L2 norm of its gradients (what torch's `clip_grad_norm_` clips): run r's
/// part of every gradient is its r-th equal part along the first axis. Summed in f64 on the host.
fn run_norms(grads: &[Tensor], runs: usize) -> Result<Vec<f64>> {
    // Each gradient's per-run sums on a thread of the current pool (phase 2's query and key on
    // one each), then each run's sums added in order: the same sum wherever each was taken, and
    // a run's the same as when it is alone.
    use rayon::prelude::*;
    let sums: Vec<Vec<f64>> = grads
        .par_iter()
        .map(|g| {
            crate::kernels::with_host_f32(g, |values| {
                let len = values.len() / runs.max(1);
                (0..runs)
                    .map(|r| crate::kernels::squared_norm(&values[r * len..(r + 1) * len]))
                    .collect()
            })
        })
        .collect::<candle_core::Result<_>>()?;
    Ok((0..runs)
        .map(|r| {
            let mut squared = 0f64;
            for sum in &sums {
                squared += sum[r];
            }
            squared.sqrt()
        })
        .collect())
}

/// Each run's clipping factor min(1, max_norm / (‖g_r‖ + 1e-6)) as a (runs,) f32 tensor on the
/// gradients' device, the norms summed in f64 there: nothing read back.
fn device_clips(grads: &[Tensor], runs: usize, max_norm: f64) -> Result<Tensor> {
    let first = grads.first().context("a step of no parameters")?;
    let device = first.device();
    if max_norm <= 0.0 {
        return Ok(Tensor::ones(runs, candle_core::DType::F32, device)?);
    }
    let mut squared = Tensor::zeros(runs, candle_core::DType::F64, device)?;
    for g in grads {
        let per_run = g
            .to_dtype(candle_core::DType::F64)?
            .sqr()?
            .reshape((runs, ()))?
            .sum(1)?;
        squared = (squared + per_run)?;
    }
    let coef = Tensor::full(max_norm, runs, device)?.div(&(squared.sqrt()? + 1e-6)?)?;
    Ok(coef.minimum(1.0)?.to_dtype(candle_core::DType::F32)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Two steps of torch.optim.AdamW(lr=0.1) on f(x) = Σ x² from x = [1, −2], with
    /// clip_grad_norm_(1.0) and a constant schedule; reference computed by hand from torch's
    /// update rule: the first step moves each coordinate by lr·sign(g), whatever the clipping.
    #[test]
    fn first_adam_steps_move_by_the_learning_rate() {
        let x = Var::new(&[1f32, -2.0], &Device::Cpu).unwrap();
        let config = OptimizerConfig {
            learning_rate: 0.1,
            ..Default::default()
        };
        let mut opt = AdamW::new(vec![("x".into(), x.clone())], config, 1_000_000).unwrap();
        let grads = x
            .as_tensor()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        opt.step(&grads).unwrap();
        let after: Vec<f32> = x.as_tensor().to_vec1().unwrap();
        assert!(
            (after[0] - 0.9).abs() < 1e-6 && (after[1] + 1.9).abs() < 1e-6,
            "{after:?}"
        );
    }

    /// The vectorised update (AVX-512 or AVX2, whichever this CPU takes) computes what the plain
    /// loop computes, bit for bit, with and without weight decay.
    #[test]
    fn vectorised_update_equals_the_plain_loop_bit_for_bit() {
        let n = 1003;
        let values = |seed: f32| -> Vec<f32> {
            (0..n)
                .map(|k| ((k as f32 * 0.37 + seed).sin()) * 0.01)
                .collect()
        };
        fn constants<'a>(
            m: &'a mut Vec<f32>,
            v: &'a mut Vec<f32>,
            decay: Option<f32>,
        ) -> HostUpdate<'a> {
            HostUpdate {
                grad: Tensor::new(&[0f32], &Device::Cpu).unwrap(),
                moments: std::sync::Mutex::new((m, v)),
                one_b1: 0.1,
                one_b2: 0.001,
                clips: vec![0.7],
                b1: 0.9,
                b2: 0.999,
                decay,
                inv_bias2: 3.1,
                eps: 1e-8,
                step_size: 5e-5,
            }
        }
        for decay in [None, Some(0.999f32)] {
            let (g, theta) = (values(4.0), values(3.0));
            let (m, v): (Vec<f32>, Vec<f32>) =
                (values(1.0), values(2.0).iter().map(|v| v * v).collect());
            // The plain loop, compiled without the CPU's vector extensions.
            let (mut plain_theta, mut plain_m, mut plain_v) = (theta.clone(), m.clone(), v.clone());
            let (mut unused_m, mut unused_v) = (Vec::new(), Vec::new());
            constants(&mut unused_m, &mut unused_v, decay).update_kernel(
                0.7,
                &mut plain_theta,
                &g,
                &mut plain_m,
                &mut plain_v,
            );
            // The dispatched form.
            let (mut theta, mut m, mut v) = (theta, m, v);
            constants(&mut m, &mut v, decay)
                .update(&mut theta, &g)
                .unwrap();
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same(&theta, &plain_theta) && same(&m, &plain_m) && same(&v, &plain_v));
        }
    }

    #[test]
    fn linear_schedule_decays_to_zero() {
        let x = Var::new(&[0f32], &Device::Cpu).unwrap();
        let opt = AdamW::new(vec![("x".into(), x)], OptimizerConfig::default(), 100).unwrap();
        assert_eq!(opt.schedule(0), 1.0);
        assert_eq!(opt.schedule(50), 0.5);
        assert_eq!(opt.schedule(100), 0.0);
    }

    #[test]
    fn state_round_trips() {
        let x = Var::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        let mut opt = AdamW::new(
            vec![("x".into(), x.clone())],
            OptimizerConfig::default(),
            10,
        )
        .unwrap();
        let grads = x
            .as_tensor()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        opt.step(&grads).unwrap();
        let saved = opt.state().unwrap();
        let y = Var::new(&[0f32, 0.0], &Device::Cpu).unwrap();
        let mut other = AdamW::new(
            vec![("x".into(), y.clone())],
            OptimizerConfig::default(),
            10,
        )
        .unwrap();
        other.restore(&saved, 1).unwrap();
        assert_eq!(
            y.as_tensor().to_vec1::<f32>().unwrap(),
            x.as_tensor().to_vec1::<f32>().unwrap()
        );
        assert_eq!(other.step, 1);
    }

    /// The device route (moments as tensors, norms and clipping on the device) steps a stack as
    /// the host route does: run 0's gradients far above the clipping norm, run 1's below it.
    #[test]
    fn device_moments_step_a_stack_as_host_moments_do() {
        let start = [[3f32, -4.0, 0.5], [0.01, 0.02, -0.03]];
        let train = |device_moments: bool| -> Vec<f32> {
            let x = Var::new(&start, &Device::Cpu).unwrap();
            let config = OptimizerConfig {
                learning_rate: 0.1,
                weight_decay: 0.01,
                ..Default::default()
            };
            let mut opt = AdamW::stacked(vec![("x".into(), x.clone())], 2, config, 10).unwrap();
            if device_moments {
                opt = opt.with_device_moments().unwrap();
            }
            for _ in 0..5 {
                let loss = (x.as_tensor().sqr().unwrap() * 10.0)
                    .unwrap()
                    .sum_all()
                    .unwrap();
                opt.step(&loss.backward().unwrap()).unwrap();
            }
            x.as_tensor().flatten_all().unwrap().to_vec1().unwrap()
        };
        let (host, device) = (train(false), train(true));
        for (h, d) in host.iter().zip(&device) {
            assert!((h - d).abs() <= 1e-6, "{host:?} vs {device:?}");
        }
        assert!(
            (host[0] - start[0][0]).abs() > 0.4,
            "the first run moved: {host:?}"
        );
    }
}
