//! Every random draw of the project comes from a ChaCha8 stream of a user seed. Streams of one
//! seed are independent generators, so e.g. the label noise does not change when the split does.
//! ChaCha8 is portable: the same seed gives the same draws on every platform and version of this
//! crate's lock file.
//!
//! `--rng authors` ([`RngChoice::Authors`]) draws the split, the symmetric label noise and the
//! batch orders of both phases as the authors' code does instead, from exact replicas of numpy's
//! `default_rng` ([`numpy`]) and torch's CPU generator ([`torch`]) (docs/protocol.md §3.1).

pub mod numpy;
pub mod torch;

mod streams;

pub use streams::*;
