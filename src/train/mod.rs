//! Training: the optimizer of the authors' Trainer defaults; the phases and their metrics build
//! on it.

pub mod optim;
