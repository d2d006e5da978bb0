//! Datasets a user brings (docs/data.md, "Your own data"): `folder:PATH` (one sub-folder of
//! images per class), `csv:PATH` and `jsonl:PATH` (a text column and a label column), and
//! `hf:ORG/NAME` (a Hugging Face dataset's Parquet files, from the hub or a local copy). Each is
//! read into the same [`Dataset`] the built-in loaders make, so the split, the label noise, the
//! cache and both phases treat it as they treat MNIST.
//!
//! Read in order: the source's spec (`KIND:LOCATION#key=value#…`, its id and content digest) →
//! `classes` (labels to class indices, in the documented order) → `pool` (one pool split into
//! train and test) → `folder`, `table`, `parquet` (with `hf`, where its files come from).

pub mod classes;
pub mod folder;
pub mod hf;
pub mod images;
mod memo;
pub mod parquet;
pub mod pool;
mod read;
mod source;
pub mod table;

pub use read::Read;
pub use source::*;
