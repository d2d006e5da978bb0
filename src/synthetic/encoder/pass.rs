//! The encoder's forward and backward passes over a batch of samples, computed where the output
//! is read: only at the CLS position.
//!
//! The logit reads the CLS row alone, and every block after attention (residual, FFN, LayerNorm,
//! head) works row by row, so the other T rows of the layer never reach the loss. Their queries,
//! their attention rows and their FFN are skipped; what is computed is exactly the authors'
//! logit and gradients (tested against torch in `tests/encoder_parity.rs`):
//!
//! - the CLS query q₀ = W_q LN₁(p) is one vector for all samples, so every score is one dot
//!   product: s_ij = d^-½ · LN₁(x_ij) · u with u = W_kᵀ q₀;
//! - LN₁(x) = γ₁ ⊙ x̂ + β₁ with x̂ the token normalised without scale or shift, which for the data
//!   tokens never changes ([`NormedTokens`], computed once per run);
//! - the value product is taken once per sample, after the attention sum:
//!   Σ_j a_ij W_v LN₁(x_ij) = W_v (γ₁ ⊙ ẑ_i + β₁) with ẑ_i = Σ_j a_ij x̂_ij.
//!
//! So a step reads each weight matrix once forward and once backward, updating it in the same
//! pass (`kernels::linear_backward`): about 3·4·(3d² + 2·m·d) bytes of memory traffic.

use super::params::{EncoderParams, LAYER_NORM_EPS, NormParams};
use crate::kernels::{
    self, WeightGradient, linear_backward, linear_forward, transposed_backward, transposed_forward,
};

/// Rows normalised by their own mean and standard deviation (LayerNorm without its scale and
/// shift), and 1/σ of each: what a LayerNorm's backward needs.
#[derive(Clone, Debug)]
pub struct Normalized {
    pub dim: usize,
    /// (rows × dim), row-major.
    pub rows: Vec<f32>,
    pub inv_std: Vec<f32>,
}

impl Normalized {
    pub fn of(x: &[f32], dim: usize) -> Self {
        let mut rows = vec![0f32; x.len()];
        let mut inv_std = Vec::with_capacity(x.len() / dim);
        for (row, out) in x.chunks_exact(dim).zip(rows.chunks_exact_mut(dim)) {
            let (mean, inv) = kernels::mean_and_inv_std(row, LAYER_NORM_EPS);
            out.iter_mut()
                .zip(row)
                .for_each(|(o, &v)| *o = (v - mean) * inv);
            inv_std.push(inv);
        }
        Self { dim, rows, inv_std }
    }

    /// γ ⊙ x̂ + β of every row.
    fn affine(&self, norm: &NormParams) -> Vec<f32> {
        affine_rows(&self.rows, norm)
    }

    /// The gradient at the LayerNorm's input from `d_out` at its output, adding to its scale's and
    /// shift's gradients: dx = (1/σ)(dx̂ − mean(dx̂) − x̂ · mean(dx̂ ⊙ x̂)) with dx̂ = d_out ⊙ γ.
    fn backward(&self, d_out: &[f32], norm: &NormParams, grads: &mut NormGrads) -> Vec<f32> {
        let dim = self.dim;
        let mut d_in = vec![0f32; d_out.len()];
        for (((dy, x_hat), dx), &inv) in d_out
            .chunks_exact(dim)
            .zip(self.rows.chunks_exact(dim))
            .zip(d_in.chunks_exact_mut(dim))
            .zip(&self.inv_std)
        {
            for k in 0..dim {
                grads.weight[k] += dy[k] * x_hat[k];
                grads.bias[k] += dy[k];
            }
            let dx_hat: Vec<f32> = dy.iter().zip(&norm.weight).map(|(d, g)| d * g).collect();
            normalization_backward(&dx_hat, x_hat, inv, dx);
        }
        d_in
    }
}

/// dx from dx̂ through x̂ = (x − mean)/σ alone.
fn normalization_backward(dx_hat: &[f32], x_hat: &[f32], inv_std: f32, dx: &mut [f32]) {
    let dim = dx_hat.len() as f64;
    let mean = dx_hat.iter().map(|&v| v as f64).sum::<f64>() / dim;
    let mean_dot = dx_hat
        .iter()
        .zip(x_hat)
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum::<f64>()
        / dim;
    let (mean, mean_dot) = (mean as f32, mean_dot as f32);
    for ((o, &g), &x) in dx.iter_mut().zip(dx_hat).zip(x_hat) {
        *o = inv_std * (g - mean - x * mean_dot);
    }
}

fn affine_rows(rows: &[f32], norm: &NormParams) -> Vec<f32> {
    let dim = norm.weight.len();
    let mut out = vec![0f32; rows.len()];
    for (row, o) in rows.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        for k in 0..dim {
            o[k] = norm.weight[k] * row[k] + norm.bias[k];
        }
    }
    out
}

/// A batch's data tokens, LayerNorm-normalised without scale or shift: (n·T × d). For the
/// training set, computed once per run.
#[derive(Clone, Debug)]
pub struct NormedTokens {
    pub samples: usize,
    pub seq_len: usize,
    pub normed: Normalized,
}

impl NormedTokens {
    /// `tokens`: (samples · seq_len × dim), row-major.
    pub fn of(tokens: &[f32], samples: usize, seq_len: usize, dim: usize) -> Self {
        assert_eq!(tokens.len(), samples * seq_len * dim, "token shape");
        Self {
            samples,
            seq_len,
            normed: Normalized::of(tokens, dim),
        }
    }

    fn token(&self, i: usize, t: usize) -> &[f32] {
        let dim = self.normed.dim;
        let start = (i * self.seq_len + t) * dim;
        &self.normed.rows[start..start + dim]
    }
}

/// The CLS query, the same for every sample: LN₁(p) and u = W_kᵀ W_q LN₁(p).
#[derive(Clone, Debug)]
pub struct ClsQuery {
    cls_normed: Normalized,
    /// h₀ = LN₁(p).
    h0: Vec<f32>,
    /// q₀ = W_q h₀.
    q0: Vec<f32>,
    /// u = W_kᵀ q₀: every token's score is d^-½ · LN₁(x) · u.
    u: Vec<f32>,
}

impl ClsQuery {
    pub fn of(params: &EncoderParams) -> Self {
        let d = params.dim;
        let cls_normed = Normalized::of(&params.cls, d);
        let h0 = cls_normed.affine(&params.attn_norm);
        let q0 = linear_forward(params.query(), (d, d), &h0, 1);
        let u = transposed_forward(params.key(), (d, d), &q0, 1);
        Self {
            cls_normed,
            h0,
            q0,
            u,
        }
    }

    /// The direction that scores a normalised token x̂: s = d^-½ (x̂ · (γ₁ ⊙ u) + β₁ · u).
    pub fn direction(&self) -> &[f32] {
        &self.u
    }
}

/// The forward pass of a batch, with what its backward needs.
#[derive(Clone, Debug)]
pub struct Pass {
    pub samples: usize,
    /// The CLS row's attention over the T + 1 positions, itself first, (samples × (T + 1)).
    pub attention: Vec<f32>,
    /// The logit of each sample.
    pub logits: Vec<f32>,
    query: ClsQuery,
    /// ẑ_i = Σ_j a_ij x̂_ij and z_i = γ₁ ⊙ ẑ_i + β₁, (samples × d).
    z_hat: Vec<f32>,
    z: Vec<f32>,
    ff_normed: Normalized,
    /// The FFN's input LN₂(r), its hidden pre-activation and activation.
    ff_input: Vec<f32>,
    hidden: Vec<f32>,
    activation: Vec<f32>,
    final_normed: Normalized,
    /// LN_f(y): the head's input.
    head_input: Vec<f32>,
}

/// The forward pass of `tokens` through the encoder.
pub fn forward(params: &EncoderParams, tokens: &NormedTokens) -> Pass {
    forward_with(params, ClsQuery::of(params), tokens)
}

/// [`forward`] with the CLS query computed already (evaluation in chunks).
pub fn forward_with(params: &EncoderParams, query: ClsQuery, tokens: &NormedTokens) -> Pass {
    let (d, m, n) = (params.dim, params.mlp_dim, tokens.samples);
    let attention = cls_attention(params, &query, tokens);
    let z_hat = attended_tokens(&query, tokens, &attention);
    let z = affine_rows(&z_hat, &params.attn_norm);
    // r = W_v z + p: the attention output at the CLS position and its residual.
    let mut residual = linear_forward(params.value(), (d, d), &z, n);
    add_to_rows(&mut residual, &params.cls);
    let ff_normed = Normalized::of(&residual, d);
    let ff_input = ff_normed.affine(&params.ff_norm);
    let mut hidden = linear_forward(&params.ff_in.weight, (m, d), &ff_input, n);
    add_to_rows(&mut hidden, &params.ff_in.bias);
    let mut activation = vec![0f32; hidden.len()];
    kernels::gelu(&hidden, &mut activation);
    let mut block_out = linear_forward(&params.ff_out.weight, (d, m), &activation, n);
    add_to_rows(&mut block_out, &params.ff_out.bias);
    block_out
        .iter_mut()
        .zip(&residual)
        .for_each(|(y, r)| *y += r);
    let final_normed = Normalized::of(&block_out, d);
    let head_input = final_normed.affine(&params.final_norm);
    let logits = head_input
        .chunks_exact(d)
        .map(|e| dot(e, &params.head.weight) + params.head.bias[0])
        .collect();
    Pass {
        samples: n,
        attention,
        logits,
        query,
        z_hat,
        z,
        ff_normed,
        ff_input,
        hidden,
        activation,
        final_normed,
        head_input,
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn add_to_rows(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
    }
}

/// softmax over the T + 1 positions of d^-½ · LN₁(x_ij) · u, the CLS token first.
fn cls_attention(params: &EncoderParams, query: &ClsQuery, tokens: &NormedTokens) -> Vec<f32> {
    let d = params.dim;
    let scale = 1.0 / (d as f32).sqrt();
    let scaled_u: Vec<f32> = params
        .attn_norm
        .weight
        .iter()
        .zip(&query.u)
        .map(|(g, u)| g * u)
        .collect();
    let shift = dot(&params.attn_norm.bias, &query.u);
    let own = scale * dot(&query.h0, &query.u);
    let positions = tokens.seq_len + 1;
    let mut attention = vec![0f32; tokens.samples * positions];
    for (i, row) in attention.chunks_exact_mut(positions).enumerate() {
        row[0] = own;
        for t in 0..tokens.seq_len {
            row[t + 1] = scale * (dot(tokens.token(i, t), &scaled_u) + shift);
        }
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        row.iter_mut().for_each(|s| *s = (*s - max).exp());
        let total: f32 = row.iter().sum();
        row.iter_mut().for_each(|s| *s /= total);
    }
    attention
}

/// ẑ_i = a_i0 p̂ + Σ_t a_i,t+1 x̂_it, (samples × d).
fn attended_tokens(query: &ClsQuery, tokens: &NormedTokens, attention: &[f32]) -> Vec<f32> {
    let d = query.h0.len();
    let positions = tokens.seq_len + 1;
    let mut z_hat = vec![0f32; tokens.samples * d];
    for (i, (z, a)) in z_hat
        .chunks_exact_mut(d)
        .zip(attention.chunks_exact(positions))
        .enumerate()
    {
        z.iter_mut()
            .zip(&query.cls_normed.rows)
            .for_each(|(z, c)| *z = a[0] * c);
        for t in 0..tokens.seq_len {
            let weight = a[t + 1];
            z.iter_mut()
                .zip(tokens.token(i, t))
                .for_each(|(z, x)| *z += weight * x);
        }
    }
    z_hat
}

/// What the backward pass does with the gradients.
pub enum Update<'a> {
    /// One SGD step of every parameter, in place.
    Descend(f32),
    /// Every parameter's gradient written here; the parameters stay as they are.
    Gradients(&'a mut EncoderParams),
}

/// The gradient of the mean logistic loss log(1 + e^(−y f)) with respect to each logit.
pub fn logistic_loss_grads(logits: &[f32], labels: &[f64]) -> Vec<f32> {
    let n = labels.len() as f64;
    logits
        .iter()
        .zip(labels)
        .map(|(&f, &y)| {
            let margin = y * f as f64;
            // −y σ(−y f) / n, σ computed without overflow.
            let sigma = if margin >= 0.0 {
                let e = (-margin).exp();
                e / (1.0 + e)
            } else {
                1.0 / (1.0 + margin.exp())
            };
            (-y * sigma / n) as f32
        })
        .collect()
}

/// A LayerNorm's gradients.
struct NormGrads {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

impl NormGrads {
    fn zeros(dim: usize) -> Self {
        Self {
            weight: vec![0.0; dim],
            bias: vec![0.0; dim],
        }
    }
}

/// The gradients of the parameters that are vectors; the matrices' go straight to their update.
struct VectorGrads {
    cls: Vec<f32>,
    /// dL/dp̂, the normalised CLS token's, until it is taken back through the normalisation.
    cls_normed: Vec<f32>,
    attn_norm: NormGrads,
    ff_norm: NormGrads,
    ff_in_bias: Vec<f32>,
    ff_out_bias: Vec<f32>,
    final_norm: NormGrads,
    head_weight: Vec<f32>,
    head_bias: f32,
}

impl VectorGrads {
    fn zeros(dim: usize, mlp_dim: usize) -> Self {
        Self {
            cls: vec![0.0; dim],
            cls_normed: vec![0.0; dim],
            attn_norm: NormGrads::zeros(dim),
            ff_norm: NormGrads::zeros(dim),
            ff_in_bias: vec![0.0; mlp_dim],
            ff_out_bias: vec![0.0; dim],
            final_norm: NormGrads::zeros(dim),
            head_weight: vec![0.0; dim],
            head_bias: 0.0,
        }
    }
}

/// Where a weight's gradient goes: into its slot of the stored gradients, else a descent by `lr`.
struct Sink<'a, 'b> {
    stored: &'a mut Option<&'b mut EncoderParams>,
    lr: f32,
}

impl Sink<'_, '_> {
    fn weight(
        &mut self,
        slot: impl FnOnce(&mut EncoderParams) -> &mut [f32],
    ) -> WeightGradient<'_> {
        match self.stored {
            Some(grads) => WeightGradient::Store(slot(grads)),
            None => WeightGradient::Descend(self.lr),
        }
    }
}

/// The backward pass of `pass` from the loss's gradient `d_logits`, then `update`. Each weight
/// matrix is updated as soon as its own backward product has read it (nothing later reads it);
/// the vectors at the end, as torch's SGD steps after the whole backward.
pub fn backward(
    params: &mut EncoderParams,
    pass: &Pass,
    tokens: &NormedTokens,
    d_logits: &[f32],
    update: Update,
) {
    let (lr, mut stored) = match update {
        Update::Descend(lr) => (lr, None),
        Update::Gradients(grads) => (0.0, Some(grads)),
    };
    let mut sink = Sink {
        stored: &mut stored,
        lr,
    };
    let mut grads = VectorGrads::zeros(params.dim, params.mlp_dim);
    let d_attended = block_backward(params, pass, d_logits, &mut grads, &mut sink);
    attention_backward(params, pass, tokens, &d_attended, &mut grads, &mut sink);
    match stored {
        Some(stored) => store_vectors(stored, grads),
        None => descend_vectors(params, grads, lr),
    }
}

/// From the logits back to the attention output W_v z: the head, the final LayerNorm, the FFN
/// and its LayerNorm, the residuals (p's share of them into `grads.cls`), and W_v itself.
/// Returns dL/dz, (samples × d).
fn block_backward(
    params: &mut EncoderParams,
    pass: &Pass,
    d_logits: &[f32],
    grads: &mut VectorGrads,
    sink: &mut Sink,
) -> Vec<f32> {
    let (d, m, n) = (params.dim, params.mlp_dim, pass.samples);
    let mut d_head_input = vec![0f32; n * d];
    for ((e, de), &dl) in pass
        .head_input
        .chunks_exact(d)
        .zip(d_head_input.chunks_exact_mut(d))
        .zip(d_logits)
    {
        grads.head_bias += dl;
        for k in 0..d {
            grads.head_weight[k] += dl * e[k];
            de[k] = dl * params.head.weight[k];
        }
    }
    // y = FFN(LN₂(r)) + r.
    let d_block_out =
        pass.final_normed
            .backward(&d_head_input, &params.final_norm, &mut grads.final_norm);
    sum_rows_into(&d_block_out, &mut grads.ff_out_bias);
    let mut d_activation = linear_backward(
        &mut params.ff_out.weight,
        (d, m),
        &pass.activation,
        &d_block_out,
        n,
        sink.weight(|g| &mut g.ff_out.weight),
    );
    kernels::gelu_backward(&pass.hidden, &mut d_activation);
    sum_rows_into(&d_activation, &mut grads.ff_in_bias);
    let d_ff_input = linear_backward(
        &mut params.ff_in.weight,
        (m, d),
        &pass.ff_input,
        &d_activation,
        n,
        sink.weight(|g| &mut g.ff_in.weight),
    );
    let mut d_residual = pass
        .ff_normed
        .backward(&d_ff_input, &params.ff_norm, &mut grads.ff_norm);
    d_residual
        .iter_mut()
        .zip(&d_block_out)
        .for_each(|(r, y)| *r += y);
    // r = W_v z + p.
    sum_rows_into(&d_residual, &mut grads.cls);
    let value_rows = 2 * d * d..3 * d * d;
    linear_backward(
        &mut params.qkv[value_rows.clone()],
        (d, d),
        &pass.z,
        &d_residual,
        n,
        sink.weight(|g| &mut g.qkv[value_rows]),
    )
}

fn sum_rows_into(rows: &[f32], total: &mut [f32]) {
    for row in rows.chunks_exact(total.len()) {
        total.iter_mut().zip(row).for_each(|(t, v)| *t += v);
    }
}

/// From dL/dz back through the attention: z = γ₁ ⊙ ẑ + β₁, the softmax, the scores, u = W_kᵀ q₀,
/// q₀ = W_q h₀ and h₀ = LN₁(p).
fn attention_backward(
    params: &mut EncoderParams,
    pass: &Pass,
    tokens: &NormedTokens,
    d_z: &[f32],
    grads: &mut VectorGrads,
    sink: &mut Sink,
) {
    let d = params.dim;
    let query = &pass.query;
    let d_scores = scores_backward(params, pass, tokens, d_z, grads);
    // s_ij = d^-½ · h_ij · u with h_ij = γ₁ ⊙ x̂_ij + β₁ (h_i0 = h₀).
    let scale = 1.0 / (d as f32).sqrt();
    let positions = tokens.seq_len + 1;
    let mut x_weighted = vec![0f32; d];
    let (mut own_total, mut data_total) = (0f32, 0f32);
    for (i, ds) in d_scores.chunks_exact(positions).enumerate() {
        own_total += scale * ds[0];
        for t in 0..tokens.seq_len {
            let w = scale * ds[t + 1];
            data_total += w;
            x_weighted
                .iter_mut()
                .zip(tokens.token(i, t))
                .for_each(|(acc, x)| *acc += w * x);
        }
    }
    let mut d_u = vec![0f32; d];
    let mut d_h0: Vec<f32> = query.u.iter().map(|u| own_total * u).collect();
    for k in 0..d {
        d_u[k] = params.attn_norm.weight[k] * x_weighted[k]
            + params.attn_norm.bias[k] * data_total
            + own_total * query.h0[k];
        grads.attn_norm.weight[k] += query.u[k] * x_weighted[k];
        grads.attn_norm.bias[k] += query.u[k] * data_total;
    }
    let (query_rows, key_rows) = (0..d * d, d * d..2 * d * d);
    let d_q0 = transposed_backward(
        &mut params.qkv[key_rows.clone()],
        (d, d),
        &query.q0,
        &d_u,
        1,
        sink.weight(|g| &mut g.qkv[key_rows]),
    );
    let d_h0_query = linear_backward(
        &mut params.qkv[query_rows.clone()],
        (d, d),
        &query.h0,
        &d_q0,
        1,
        sink.weight(|g| &mut g.qkv[query_rows]),
    );
    d_h0.iter_mut().zip(&d_h0_query).for_each(|(a, b)| *a += b);
    // h₀ = γ₁ ⊙ p̂ + β₁, then p̂ = (p − mean)/σ.
    let cls_hat = &query.cls_normed.rows;
    for k in 0..d {
        grads.attn_norm.weight[k] += d_h0[k] * cls_hat[k];
        grads.attn_norm.bias[k] += d_h0[k];
        grads.cls_normed[k] += params.attn_norm.weight[k] * d_h0[k];
    }
    let mut d_cls = vec![0f32; d];
    normalization_backward(
        &grads.cls_normed,
        cls_hat,
        query.cls_normed.inv_std[0],
        &mut d_cls,
    );
    grads.cls.iter_mut().zip(&d_cls).for_each(|(g, v)| *g += v);
}

/// Through z = γ₁ ⊙ ẑ + β₁ and ẑ_i = Σ_j a_ij x̂_ij to the scores: returns dL/ds (samples ×
/// (T + 1)), adding LN₁'s and p̂'s shares of the value path to `grads`.
fn scores_backward(
    params: &EncoderParams,
    pass: &Pass,
    tokens: &NormedTokens,
    d_z: &[f32],
    grads: &mut VectorGrads,
) -> Vec<f32> {
    let d = params.dim;
    let positions = tokens.seq_len + 1;
    let cls_hat = &pass.query.cls_normed.rows;
    let mut d_scores = vec![0f32; pass.samples * positions];
    for (i, ((dz, z_hat), a)) in d_z
        .chunks_exact(d)
        .zip(pass.z_hat.chunks_exact(d))
        .zip(pass.attention.chunks_exact(positions))
        .enumerate()
    {
        let d_z_hat: Vec<f32> = dz
            .iter()
            .zip(&params.attn_norm.weight)
            .map(|(g, w)| g * w)
            .collect();
        for k in 0..d {
            grads.attn_norm.weight[k] += dz[k] * z_hat[k];
            grads.attn_norm.bias[k] += dz[k];
            grads.cls_normed[k] += a[0] * d_z_hat[k];
        }
        // dL/da_ij = dẑ_i · x̂_ij + dz_i · β₁ (x̂_i0 = p̂).
        let shift = dot(dz, &params.attn_norm.bias);
        let mut d_attention = Vec::with_capacity(positions);
        d_attention.push(dot(&d_z_hat, cls_hat) + shift);
        for t in 0..tokens.seq_len {
            d_attention.push(dot(&d_z_hat, tokens.token(i, t)) + shift);
        }
        // Through the softmax: ds_j = a_j (da_j − Σ_l a_l da_l).
        let mean: f32 = a.iter().zip(&d_attention).map(|(a, g)| a * g).sum();
        for (j, ds) in d_scores[i * positions..(i + 1) * positions]
            .iter_mut()
            .enumerate()
        {
            *ds = a[j] * (d_attention[j] - mean);
        }
    }
    d_scores
}

fn store_vectors(stored: &mut EncoderParams, grads: VectorGrads) {
    stored.cls = grads.cls;
    stored.attn_norm.weight = grads.attn_norm.weight;
    stored.attn_norm.bias = grads.attn_norm.bias;
    stored.ff_norm.weight = grads.ff_norm.weight;
    stored.ff_norm.bias = grads.ff_norm.bias;
    stored.ff_in.bias = grads.ff_in_bias;
    stored.ff_out.bias = grads.ff_out_bias;
    stored.final_norm.weight = grads.final_norm.weight;
    stored.final_norm.bias = grads.final_norm.bias;
    stored.head.weight = grads.head_weight;
    stored.head.bias = vec![grads.head_bias];
}

fn descend_vectors(params: &mut EncoderParams, grads: VectorGrads, lr: f32) {
    let descend = |values: &mut [f32], grad: &[f32]| {
        values.iter_mut().zip(grad).for_each(|(v, g)| *v -= lr * g);
    };
    descend(&mut params.cls, &grads.cls);
    descend(&mut params.attn_norm.weight, &grads.attn_norm.weight);
    descend(&mut params.attn_norm.bias, &grads.attn_norm.bias);
    descend(&mut params.ff_norm.weight, &grads.ff_norm.weight);
    descend(&mut params.ff_norm.bias, &grads.ff_norm.bias);
    descend(&mut params.ff_in.bias, &grads.ff_in_bias);
    descend(&mut params.ff_out.bias, &grads.ff_out_bias);
    descend(&mut params.final_norm.weight, &grads.final_norm.weight);
    descend(&mut params.final_norm.bias, &grads.final_norm.bias);
    descend(&mut params.head.weight, &grads.head_weight);
    descend(&mut params.head.bias, &[grads.head_bias]);
}
