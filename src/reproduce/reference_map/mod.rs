//! `reproduce reference-map`: the paper's token selector (W, p by gradient descent, ν fixed along
//! μ₊ − μ₋ with ‖ν‖ = 1/‖μ‖) on a dataset's real tokens as its noise, the paper's three-token
//! signal planted on them (docs/design.md, "The paper's model on real noise"). A regime map over
//! n ∈ {20, 200} × n·SNR² ∈ {0.3, 1, 3, 10, 30, 100} × 3 seeds, each run judged by [`judge`], and
//! the answer line: do the two n's boundaries coincide on the n·SNR² axis or on the ‖μ‖ axis?
//!
//! The clock: the paper's step size meets its ‖μ‖ 20 in lr·‖μ‖² = 5e-3·20² = 2, and its 1000
//! steps at T 8 select x₁; the time to select scales as 1/(lr·‖μ‖²), so each run takes lr =
//! 2/‖μ‖² and checkpoints at 1000, 2000 and 4000 steps (the stopping rule's two doublings), made
//! again to 16 000 where those moved; seed 0 of each cell is run again at half the step for
//! twice the steps.
//!
//! Each run is kept in `<out>/runs/` with its config and the digest of the tokens it was made
//! from, so the command resumes and a changed cache is refused rather than mixed in.

pub mod judge;
pub mod table;
pub mod tokens;
pub mod twin_table;
pub mod twins;

mod map;

pub use map::*;
