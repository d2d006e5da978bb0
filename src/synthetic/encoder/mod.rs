//! The one-layer Transformer encoder of the paper's Figs. 6 and 7 (the authors'
//! `main_one_layer.py`; docs/protocol.md §2.8) on the synthetic tokens: a learnable CLS token p
//! prepended to the T tokens, pre-LN single-head attention (`to_qkv` without bias, scale d^-½)
//! with its residual, a pre-LN FFN (d → 2000 → d, GELU) with its residual, a final LayerNorm and a
//! linear head on the CLS position; logistic loss, every parameter trained by full-batch SGD.
//!
//! Read in order: `params` (names, shapes, torch's initialisation) → `pass` (the forward and
//! backward passes, at the CLS position only) → `spectrum` (its query-key matrix) → `train` (a
//! run).

pub mod params;
pub mod pass;
pub mod spectrum;
pub mod train;

pub use params::EncoderParams;
pub use train::run;
