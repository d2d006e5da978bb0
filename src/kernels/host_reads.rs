//! Every read of a tensor's values into host memory that phases 1 and 2 make goes through here
//! and is counted, so that a test can hold a step of the device-resident route to none: on a GPU
//! each read is a synchronisation that stalls the launch queue (docs/design.md, "Where each
//! phase runs"). tests/device_stack.rs checks the count across a step, and that no file of
//! phases 1 and 2 reads past this module.

use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{Result, Tensor, WithDType};

static READS: AtomicUsize = AtomicUsize::new(0);

/// Reads made so far by this process (every thread).
pub fn count() -> usize {
    READS.load(Ordering::SeqCst)
}

fn counted() {
    READS.fetch_add(1, Ordering::SeqCst);
}

/// The values of a tensor of any shape, flattened, row-major.
pub fn flat<T: WithDType>(tensor: &Tensor) -> Result<Vec<T>> {
    counted();
    tensor.flatten_all()?.to_vec1()
}

/// The rows of a matrix.
pub fn rows<T: WithDType>(tensor: &Tensor) -> Result<Vec<Vec<T>>> {
    counted();
    tensor.to_vec2()
}

/// The value of a tensor of one element.
pub fn scalar<T: WithDType>(tensor: &Tensor) -> Result<T> {
    counted();
    tensor.flatten_all()?.squeeze(0)?.to_scalar()
}

/// A read of values in place (`with_host_f32`), counted like a copy.
pub(crate) fn in_place() {
    counted();
}

#[cfg(test)]
mod tests {
    /// The files of phases 1 and 2 read tensors back only through this module, so that its
    /// count is every read they make: a `to_vec*` or `to_scalar` put back anywhere in them
    /// (outside their tests) fails here.
    #[test]
    fn phases_one_and_two_read_only_through_the_counter() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![
            root.join("train/phase1.rs"),
            root.join("train/classifier_loop.rs"),
            root.join("train/optim.rs"),
            root.join("train/metrics.rs"),
        ];
        for folder in [
            "train/phase2",
            "model",
            "model/last_layer",
            "model/last_layer/host",
        ] {
            for entry in std::fs::read_dir(root.join(folder)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        assert!(files.len() > 15, "{files:?}");
        let mut found = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            for (line, content) in code.lines().enumerate() {
                if [".to_vec1", ".to_vec2", ".to_vec3", ".to_scalar"]
                    .iter()
                    .any(|read| content.contains(read))
                {
                    found.push(format!("{}:{}", file.display(), line + 1));
                }
            }
        }
        assert!(found.is_empty(), "reads past the counter: {found:?}");
    }
}
