//! Localization diagnostics (Bao, Hataya & Karakida, ICML 2024; docs/protocol.md §5): the eigenspectrum
//! of the query-key matrix, attention entropy and the rank-collapse residual.
//!
//! Definitions used (the paper's are reconstructed, docs/protocol.md §5):
//! - W_QK = W_Q W_Kᵀ / √d_h per head, a d × d matrix (d the model width). With torch's Linear
//!   weights (out × in), head h's rows W_qₕ, W_kₕ (d_h × d) give W_QK = W_qₕᵀ W_kₕ / √d_h. Its
//!   eigenvalues λ₁..λ_d are complex in general, and d − d_h of them are 0 (rank ≤ d_h).
//! - Eigen-mean and eigen-variance over all d eigenvalues, of the real parts (mean = tr W_QK / d)
//!   and, separately, of the moduli |λ|; population variance (divide by d).
//! - The same two of the symmetric part (W_QK + W_QKᵀ)/2, whose eigenvalues are real; exact from
//!   traces: mean = tr W / d, variance = ‖S‖_F² / d − mean², ‖S‖_F² = (‖W‖_F² + tr W²) / 2.
//! - Entropy of an attention distribution: −Σ p log p (natural log; uniform over T gives log T).
//! - Rank-collapse residual of an attention output Y (T × d): ‖Y − 1ȳᵀ‖_F / ‖Y‖_F with ȳ the mean
//!   row, the minimiser of ‖Y − 1yᵀ‖_F (Dong et al., 2021); 0 when all rows are equal.

pub mod locater;
pub mod plant;
pub mod snr;

mod localization;

pub use localization::*;
