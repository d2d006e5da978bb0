//! Phase 2 (docs/protocol.md §3) of a stack of runs: the last layer's query and key
//! re-initialised and trained on each run's noisy samples (the paper), or the card's
//! token-selection head on the frozen final tokens, with the query-key diagnostics (§5) at every
//! scored epoch. A lone run is a stack of one. Read in this order:
//!
//! - [`runs`]: the runs trained together, each with its explicit context (job, classifier,
//!   labels, sets, checkpoints), and which samples they share;
//! - [`trainee`]: what phase 2 trains, as one trait: each batch's gradients, the optimizer, the
//!   evaluations an epoch's end completes;
//! - [`objective`]: the stack's loss and its gradients through autograd;
//! - [`epochs`]: the loop over a trainee (batches, gradients, update; evaluations; checkpoints);
//! - [`record`]: each evaluated epoch's metrics, log, progress and checkpoint, run by run;
//! - [`query_key`] and its [`look_ahead`]: the paper's trainee; [`head`]: the card's.
//!
//! [`phase_two`] puts them together.

pub mod epochs;
pub mod head;
pub mod look_ahead;
pub mod objective;
pub mod query_key;
pub mod record;
pub mod runs;
pub mod trainee;

mod parameters;
mod stack;

pub use parameters::*;
pub use stack::*;
