//! The CPU numeric kernels every layer of the crate shares: gemm on raw slices, products by a
//! matrix packed once ([`PackedMatrix`], phase 2's frozen layers), a vectorisable
//! exp, the erf GELU and the softmax row (compiled for AVX2 + FMA too and chosen at run time), the
//! CPU feature check, the padding-mask helpers, and the fused backward-and-update products of a
//! trained matrix ([`linear_backward`], the synthetic encoder's weights). They sit below the encoder, the model and the
//! runtime, and import nothing of the crate.

mod amx;
pub(crate) mod arm;
pub mod bf16;
pub mod host_reads;
mod linear;
mod packed;
mod tiles;
pub use bf16::Precision;
pub(crate) use linear::{
    WeightGradient, linear_backward, linear_forward, transposed_backward, transposed_forward,
};
pub(crate) use packed::{PackedMatrix, ProductPart, products_parallel};

mod primitives;

pub use primitives::*;
