//! Phase 2 of the paper (docs/protocol.md §3): the last layer's query and key re-initialised and trained,
//! everything else frozen, evaluated from the cached hidden states entering that layer.
//!
//! Only the CLS / position-0 output reaches the classifier, and every part of the layer after the
//! attention is token-wise, so only the CLS query row matters. Per head h:
//!
//!   scores_h = (q₀ₕ · Kₕᵀ)/√dₕ  with  q₀ = x̂₀ W_Qᵀ + b_Q,  Kₕ = X̂ W_Kₕᵀ + b_Kₕ
//!            = ((q₀ₕ W_Kₕ) X̂ᵀ + q₀ₕ · b_Kₕ)/√dₕ
//!
//! so a step costs O(B(D² + H·T·D)) instead of the full layer's O(B·T·D²). Attention is linear in
//! the values, so the context is (Σₜ pₜ x̂ₜ) W_Vₕᵀ + b_Vₕ: phase 2 needs nothing per sample but
//! the layer inputs X (x̂ = LN(X) is recomputed per batch for ViT), and the attention over them is
//! `attend::KeyValues`. It is the same function as the full forward; `full_forward_logits`
//! computes that one for the equivalence test.

mod host;
mod host_pass;
pub use host::HostSpread;
pub use host_pass::{HostRows, HostSource, HostStep, StackEval, StackRun, StackStep};

mod layer;

pub use layer::*;
