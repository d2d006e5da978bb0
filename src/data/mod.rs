//! Real datasets, read from their canonical release files into one in-memory form, then split and
//! label-noised as the paper does (docs/protocol.md §3).
//!
//! Read in order: `files` (errors, gzip, checksums) → one loader per format (`mnist`, `cifar`,
//! `medmnist`, `agnews`, `trec`, `stl10`, `sst2`, `cifar10n`; `own/` for the folders, tables and
//! hub Parquet files a user brings) → `catalog` (dataset names, data root, manifests,
//! completeness) → `split` → `noise` → `fetch` (and `hub`, the Hugging Face hub's file protocol).

pub mod agnews;
pub mod catalog;
pub mod cifar;
pub mod cifar10n;
pub mod download;
pub mod fetch;
pub mod files;
pub mod hub;
pub mod manifest;
pub mod medmnist;
pub mod medmnist_family;
pub mod mnist;
pub mod name;
pub mod noise;
pub mod npz;
pub mod own;
pub mod prepare;
pub mod split;
pub mod sst2;
pub mod stl10;
pub mod trec;
pub use catalog::{Dataset, data_root, load};
pub use files::DataError;
pub use name::{DatasetName, Defaults};

mod samples;

pub use samples::*;
