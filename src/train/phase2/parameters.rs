//! What phase 2 optimises, whichever trainee: the attention geometry it resets (the last layer's
//! heads, or the head's one D-dim head), the stack's optimizer over every run's parameters, and a
//! run's query-key eigenspectrum read back from it.

use anyhow::{Context, Result, ensure};
use candle_core::{Tensor, Var};

use crate::diagnostics::{Spectrum, head_spectrum, mean_over_heads, spectrum};
use crate::encoder::Model;
use crate::train::optim::AdamW;
use crate::train::run::{Mode, RunConfig};

/// The attention geometry of the last layer (or of the head, which has one D-dim head).
#[derive(Clone, Copy)]
pub struct QkShape {
    pub mode: Mode,
    pub heads: usize,
    pub head_dim: usize,
    pub hidden: usize,
}

impl QkShape {
    pub fn of(model: &Model, mode: Mode, hidden: usize) -> Self {
        let attention = match model {
            Model::Vit(v) => &v.last_layer().attention,
            Model::Bert(b) => &b.last_layer().attention,
        };
        Self {
            mode,
            heads: attention.num_heads,
            head_dim: attention.head_dim,
            hidden,
        }
    }

    pub fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }
}

/// The stack's optimizer over each run's freshly initialised parameters (`runs`, each run's named
/// parameters in one order), for all of `config`'s epochs.
pub fn stacked_optimizer(
    config: &RunConfig,
    runs: &[Vec<(String, Var)>],
    route: super::runs::Route,
) -> Result<AdamW> {
    let optimizer = AdamW::stacked(
        stacked_parameters(runs)?,
        runs.len(),
        config.optimizer.clone(),
        config.epochs * crate::train::classifier_loop::steps_per_epoch(config.n, config.batch_size),
    )?;
    match route {
        super::runs::Route::Host => Ok(optimizer),
        super::runs::Route::Resident => optimizer.with_device_moments(),
    }
}

/// Each named parameter of every run stacked along a new first axis, as one variable per name
/// (the runs' lists in the same order).
pub fn stacked_parameters(runs: &[Vec<(String, Var)>]) -> Result<Vec<(String, Var)>> {
    let first = runs.first().context("no runs to stack")?;
    first
        .iter()
        .enumerate()
        .map(|(k, (name, _))| {
            let parts = runs
                .iter()
                .map(|run| {
                    let (other, var) = run.get(k).context("runs of different parameters")?;
                    ensure!(other == name, "runs name their parameters differently");
                    Ok(var.as_tensor().detach())
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((name.clone(), Var::from_tensor(&Tensor::stack(&parts, 0)?)?))
        })
        .collect()
}

/// Run `run`'s query-key eigenspectrum (docs/protocol.md §5): per head and averaged in
/// last-layer mode; in head mode W itself, whose query is p, as in the synthetic model.
pub fn qk_spectrum(opt: &AdamW, run: usize, shape: QkShape) -> Result<Spectrum> {
    let host = |name: &str| -> Result<Vec<f32>> {
        Ok(crate::kernels::host_reads::flat(
            &opt.param_of_run(name, run)?,
        )?)
    };
    Ok(match shape.mode {
        Mode::LastLayer => {
            let (wq, wk) = (host("query.weight")?, host("key.weight")?);
            let rows = shape.head_dim * shape.hidden;
            let per_head: Vec<Spectrum> = (0..shape.heads)
                .map(|h| {
                    head_spectrum(
                        &wq[h * rows..(h + 1) * rows],
                        &wk[h * rows..(h + 1) * rows],
                        shape.head_dim,
                        shape.scale(),
                    )
                })
                .collect();
            mean_over_heads(&per_head)
        }
        Mode::Head => spectrum(&nalgebra::DMatrix::from_row_iterator(
            shape.hidden,
            shape.hidden,
            host("head.w")?.into_iter().map(f64::from),
        )),
    })
}
