//! The CLS pass of [`LastLayer`] written out by hand on the host, for a stack of runs at once:
//! the forward here, and in [`backward`] the step's cross-entropy and the backward to each run's
//! query and key, with no autograd.
//!
//! A phase-2 step is a few CLS rows (16 by default) of each run through a dozen small operations.
//! Through candle's autograd every operation allocates its output and its gradient, the
//! LayerNorms take the slow differentiable formula, and the frozen weights' gradients the graph
//! would compute are thrown away; at ViT-Ti that bookkeeping cost more than the arithmetic. Here
//! each operation is a loop or one product over flat rows, the backward stops at the query and
//! key, and the tokens are read by the same per-sample kernels as the fused attention op
//! ([`KeyValues`]). The candle route ([`LastLayer::forward_resident`], differentiated) stays the
//! reference: tests/last_layer_equivalence.rs holds the two equal in logits, loss and every
//! gradient.
//!
//! With x̂₀ the normed CLS input, q₀ = x̂₀W_Qᵀ + b_Q; per head rₕ = q₀ₕW_Kₕ and cₕ = q₀ₕ·b_Kₕ; the
//! attention pools the tokens into pooledₕ; context = pooled W_Vᵀ + b_V per head; then the rest
//! of the layer, which differs between the backbones only in where the MLP's residual starts:
//!
//!   ViT (pre-LN):   h = x₀ + O(context);  a = N₁(h);  z = N₂(h + MLP(a))
//!   BERT (post-LN): h = x₀ + O(context);  a = N₁(h);  z = N₂(a + MLP(a))
//!
//! and each run's classifier (BERT's pooler, tanh, first when the checkpoint has one).
//!
//! **A stack.** The runs of a stack share the frozen layer, not their query, key or classifier.
//! A pass puts every run's rows through each frozen product together, so each frozen weight is
//! read once for all of them, and the runs that read the same samples attend over each sample's
//! tokens together ([`attention`]), so each token is read once for all of them. Every operation
//! gives a row the same numbers whatever rows are beside it (the frozen products, gemm up to 48
//! rows, the attention kernels, the norms), and each run's sums over its batch (the loss, the
//! weight gradients) are taken over its own rows in the same order as alone: a run of a stack
//! gets the numbers it gets alone, bit for bit.

mod attention;
mod backward;
mod norm;
mod spread;
pub use self::spread::HostSpread;

mod forward;

pub use forward::*;
