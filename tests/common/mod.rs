//! Helpers shared by the integration tests: the committed fixtures (tests/fixtures/), the roots
//! of real data and real checkpoints, which a test without them skips (`data_root`,
//! `models_root`), and the device the device-parameterised tests run on (`test_device`).

#![allow(dead_code)] // each test crate uses its own subset

pub mod http;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

use benign_attention::encoder::bert::TextBatch;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

/// Set to 1 (as `.ci/run` does), a test that finds no data root or models root fails instead of
/// skipping.
pub const REQUIRE_DATA_ENV: &str = "BENIGN_REQUIRE_DATA";

fn data_required() -> bool {
    std::env::var(REQUIRE_DATA_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `test` cannot run, because `why`: says so on stderr and returns `None`, or panics when
/// `BENIGN_REQUIRE_DATA=1`. Written to the stderr handle itself, not through `eprintln!`, so that
/// the line shows even while the test harness captures output.
pub fn skip<T>(test: &str, why: &str) -> Option<T> {
    if data_required() {
        panic!("{test}: {why}; {REQUIRE_DATA_ENV}=1 makes this a failure instead of a skip");
    }
    let _ = writeln!(std::io::stderr(), "skipped {test}: {why}");
    None
}

/// A root given by `variable`: `None` when unset or empty; a failure when it is not a directory,
/// because then it was set by mistake.
fn root_from_env(test: &str, variable: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os(variable).filter(|v| !v.is_empty())?);
    assert!(
        dir.is_dir(),
        "{test}: {variable}={} is not a directory",
        dir.display()
    );
    Some(dir)
}

/// The data root, found the way the program finds it (`BENIGN_DATA_DIR`, else ./datasets when it
/// holds a dataset folder), holding every dataset folder of `folders` (e.g. "trec"). Otherwise the
/// test is skipped with the reason on stderr (a failure under `BENIGN_REQUIRE_DATA=1`).
pub fn data_root_with(test: &str, folders: &[&str]) -> Option<PathBuf> {
    use benign_attention::data::catalog;
    let root = match root_from_env(test, catalog::DATA_DIR_ENV) {
        Some(root) => root,
        None => {
            let default = catalog::data_root(None);
            let holds_data = catalog::manifest_names()
                .filter_map(catalog::manifest)
                .any(|m| default.join(&m.folder).is_dir());
            if !holds_data {
                return skip(
                    test,
                    &format!(
                        "{env} is not set and ./{}/ holds no dataset (point {env} at a data root; CI exports its offline mirror)",
                        default.display(),
                        env = catalog::DATA_DIR_ENV,
                    ),
                );
            }
            default
        }
    };
    for folder in folders {
        if !root.join(folder).is_dir() {
            return skip(
                test,
                &format!("the data root {} has no {folder}/", root.display()),
            );
        }
    }
    Some(root)
}

/// The data root (see `data_root_with`), for a test that checks which datasets it holds itself.
pub fn data_root(test: &str) -> Option<PathBuf> {
    data_root_with(test, &[])
}

/// The models root (`BENIGN_MODELS_DIR`, checkpoints as <org>/<name>/), else the test is skipped
/// with the reason on stderr (a failure under `BENIGN_REQUIRE_DATA=1`).
pub fn models_root(test: &str) -> Option<PathBuf> {
    use benign_attention::encoder::hub::MODELS_DIR_ENV;
    root_from_env(test, MODELS_DIR_ENV).or_else(|| {
        skip(
            test,
            &format!(
                "{MODELS_DIR_ENV} is not set (point it at a models root of <org>/<name>/ checkpoints; CI exports its offline mirror)"
            ),
        )
    })
}

/// Both roots, for a test that needs real data (its dataset folders `folders`) and real
/// checkpoints; each missing one is reported.
pub fn data_and_models_roots(test: &str, folders: &[&str]) -> Option<(PathBuf, PathBuf)> {
    let data = data_root_with(test, folders);
    let models = models_root(test);
    Some((data?, models?))
}

/// `cpu` (the default) or `cuda`: where the device-parameterised tests (encoder_parity,
/// last_layer_equivalence, fused_attention) compute; they compare with the CPU or the HF reference.
pub const TEST_DEVICE_ENV: &str = "BENIGN_TEST_DEVICE";

/// The device of [`TEST_DEVICE_ENV`]: the CPU when unset, CUDA GPU 0 with `cuda` (which needs a
/// build with `--features cuda` and a GPU).
pub fn test_device() -> Device {
    match std::env::var(TEST_DEVICE_ENV).unwrap_or_default().as_str() {
        "" | "cpu" => Device::Cpu,
        "cuda" if !cfg!(feature = "cuda") => panic!(
            "{TEST_DEVICE_ENV}=cuda, but these tests were built without CUDA: run them with `cargo test --release --features cuda` (or scripts/build-cuda.sh and scripts/gpu-tests.sh)"
        ),
        "cuda" => Device::new_cuda(0)
            .unwrap_or_else(|e| panic!("{TEST_DEVICE_ENV}=cuda: no usable GPU 0 ({e})")),
        other => panic!("{TEST_DEVICE_ENV}={other}: expected cpu or cuda"),
    }
}

/// The binary under test with `args`, its feature cache in `cache`.
pub fn benign_cached(args: &[&str], cache: &std::path::Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .env("BENIGN_CACHE_DIR", cache)
        .output()
        .unwrap()
}

/// tests/fixtures of the source tree: `CARGO_MANIFEST_DIR` as cargo sets it when it runs the
/// tests, else where the tests were built (a test binary carried elsewhere, as
/// scripts/gpu-tests.sh does, is run with the variable set to its checkout).
pub fn fixtures() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("tests/fixtures")
}

/// Every tensor of a fixture safetensors file, on the CPU.
pub fn load(name: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixtures().join(name), &Device::Cpu).unwrap()
}

/// The weights of a fixture model folder (`tiny_vit`, `tiny_bert`), on `device`.
pub fn model_vb(dir: &str, device: &Device) -> VarBuilder<'static> {
    let path = fixtures().join(dir).join("model.safetensors");
    // SAFETY: committed fixtures are not modified while the tests run.
    unsafe { VarBuilder::from_mmaped_safetensors(&[path], DType::F32, device).unwrap() }
}

/// The config.json of a fixture model folder.
pub fn config<T: serde::de::DeserializeOwned>(dir: &str) -> T {
    serde_json::from_str(
        &std::fs::read_to_string(fixtures().join(dir).join("config.json")).unwrap(),
    )
    .unwrap()
}

/// The tiny BERT's input batch from its io fixture, on `device`.
pub fn bert_batch(io: &HashMap<String, Tensor>, device: &Device) -> TextBatch {
    let u32s = |name: &str| {
        io[name]
            .to_dtype(DType::U32)
            .unwrap()
            .to_device(device)
            .unwrap()
    };
    TextBatch {
        input_ids: u32s("input_ids"),
        token_type_ids: u32s("token_type_ids"),
        attention_mask: u32s("attention_mask"),
    }
}

/// A copy on the CPU (what the reference tensors are on).
pub fn on_cpu(t: &Tensor) -> Tensor {
    t.to_device(&Device::Cpu).unwrap()
}

/// The largest absolute entry.
pub fn max_abs(t: &Tensor) -> f32 {
    on_cpu(t)
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// The largest absolute difference, on the CPU (`a` and `b` may be on different devices).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    max_abs(&(on_cpu(a) - on_cpu(b)).unwrap())
}

/// Checks that `path` is a whole, valid 8-bit PNG: the signature, every chunk's CRC, IHDR first
/// and IEND last, and image data that inflates to exactly the rows IHDR announces. Returns its
/// (width, height).
pub fn png_size(path: &std::path::Path) -> (u32, u32) {
    use std::io::Read;
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{}: no PNG signature",
        path.display()
    );
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    let (mut at, mut chunks, mut data) = (8, Vec::new(), Vec::new());
    while at + 12 <= bytes.len() {
        let len = be(at) as usize;
        let kind = &bytes[at + 4..at + 8];
        let body = &bytes[at + 8..at + 8 + len];
        let mut crc = flate2::Crc::new();
        crc.update(kind);
        crc.update(body);
        assert_eq!(crc.sum(), be(at + 8 + len), "{}: bad CRC", path.display());
        if kind == b"IDAT" {
            data.extend_from_slice(body);
        }
        chunks.push(String::from_utf8_lossy(kind).into_owned());
        at += 12 + len;
    }
    assert_eq!(at, bytes.len(), "{}: trailing bytes", path.display());
    assert_eq!(chunks.first().map(String::as_str), Some("IHDR"));
    assert_eq!(chunks.last().map(String::as_str), Some("IEND"));
    let (width, height) = (be(16), be(20));
    let (depth, colour) = (bytes[24], bytes[25]);
    let channels = match colour {
        0 => 1,
        2 => 3,
        4 => 2,
        6 => 4,
        other => panic!("{}: colour type {other}", path.display()),
    };
    assert_eq!(depth, 8, "{}: bit depth {depth}", path.display());
    let mut pixels = Vec::new();
    flate2::read::ZlibDecoder::new(&data[..])
        .read_to_end(&mut pixels)
        .unwrap_or_else(|e| panic!("{}: image data does not inflate: {e}", path.display()));
    assert_eq!(
        pixels.len(),
        height as usize * (1 + width as usize * channels),
        "{}: image data of the wrong size",
        path.display()
    );
    (width, height)
}

/// Exit status 2 and exactly one stderr line, `error: …`, holding every needle.
pub fn assert_one_error_line(what: &str, out: &std::process::Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 1, "{what} printed more than one line:\n{err}");
    assert!(lines[0].starts_with("error: "), "{what}: {err}");
    for needle in needles {
        assert!(lines[0].contains(needle), "{what}: no {needle:?} in: {err}");
    }
}

/// `finetune` on `dataset` at quick sizes (8 + 8 samples, 4 scored, two epochs of each phase,
/// η 0.25), into `out`.
pub fn quick_finetune_args(dataset: &str, out: &std::path::Path) -> Vec<String> {
    [
        "finetune",
        "--dataset",
        dataset,
        "--pretrain-n",
        "8",
        "--n",
        "8",
        "--test-n",
        "4",
        "--pretrain-epochs",
        "2",
        "--epochs",
        "2",
        "--eval-every",
        "1",
        "--eta",
        "0.25",
        "--out",
        out.to_str().expect("temp paths are UTF-8"),
    ]
    .map(String::from)
    .to_vec()
}
