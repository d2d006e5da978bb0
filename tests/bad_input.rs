//! Bad input through the binary: one `error: …` line on stderr naming the file or flag, exit
//! status 2, never a panic, a hang or an allocation abort. And progress lines on a stderr that is
//! not a terminal. Fixtures are built in temp folders at run time.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use candle_core::{Device, Tensor};

const PROGRESS_ENV: &str = "BENIGN_PROGRESS_EVERY_SECS";

fn benign(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .env_remove(PROGRESS_ENV)
        .output()
        .expect("binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit status 2 and exactly one stderr line, `error: …`, holding every needle.
fn assert_one_error_line(what: &str, out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 1, "{what} printed more than one line:\n{err}");
    assert!(lines[0].starts_with("error: "), "{what}: {err}");
    for needle in needles {
        assert!(lines[0].contains(needle), "{what}: no {needle:?} in: {err}");
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// A MedMNIST archive at `<root>/medmnist/<task>.npz` with 28×28 grayscale splits of the given
/// labels.
fn write_medmnist(root: &Path, task: &str, splits: &[(&str, &[u8])]) -> PathBuf {
    let dir = root.join("medmnist");
    std::fs::create_dir_all(&dir).unwrap();
    let mut arrays = Vec::new();
    for (split, labels) in splits {
        let n = labels.len();
        let pixels: Vec<u8> = (0..n * 28 * 28).map(|k| (k * 31 % 256) as u8).collect();
        let images = Tensor::from_vec(pixels, (n, 28, 28), &Device::Cpu).unwrap();
        let labels = Tensor::from_slice(labels, (n, 1), &Device::Cpu).unwrap();
        arrays.push((format!("{split}_images"), images));
        arrays.push((format!("{split}_labels"), labels));
    }
    let named: Vec<(&str, Tensor)> = arrays
        .iter()
        .map(|(k, t)| (k.as_str(), t.clone()))
        .collect();
    let path = dir.join(format!("{task}.npz"));
    Tensor::write_npz(&named, &path).unwrap();
    path
}

/// A valid tiny BreastMNIST under `root`: 20 train, 5 val, 5 test images.
fn tiny_breastmnist(root: &Path) {
    let labels: Vec<u8> = (0..20).map(|k| k % 2).collect();
    write_medmnist(
        root,
        "breastmnist",
        &[
            ("train", &labels),
            ("val", &labels[..5]),
            ("test", &labels[..5]),
        ],
    );
}

#[test]
fn medmnist_labels_outside_the_classes_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let mut train: Vec<u8> = (0..20).map(|k| k % 2).collect();
    train[3] = 7;
    let npz = write_medmnist(
        dir.path(),
        "breastmnist",
        &[("train", &train), ("val", &[0, 1]), ("test", &[1, 0, 1])],
    );
    let out = benign(&[
        "data",
        "split",
        "--dataset",
        "breastmnist",
        "--pretrain-n",
        "10",
        "--n",
        "5",
        "--data-dir",
        path_str(dir.path()),
    ]);
    assert_one_error_line(
        "label 7",
        &out,
        &[path_str(&npz), "train_labels[3] is 7", "2 classes"],
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn empty_text_files_are_refused_at_load_naming_the_file() {
    let data = benign_attention::data::data_root(None);
    let dir = tempfile::tempdir().unwrap();
    let trec = dir.path().join("trec");
    std::fs::create_dir_all(&trec).unwrap();
    std::fs::copy(
        data.join("trec/train_5500.label"),
        trec.join("train_5500.label"),
    )
    .unwrap_or_else(|e| panic!("{e}: set BENIGN_DATA_DIR to the offline data mirror"));
    std::fs::write(trec.join("TREC_10.label"), "").unwrap();
    let split = |dataset: &str, extra: &[&str]| {
        let mut args = vec![
            "data",
            "split",
            "--dataset",
            dataset,
            "--pretrain-n",
            "10",
            "--n",
            "5",
            "--data-dir",
            path_str(dir.path()),
        ];
        args.extend_from_slice(extra);
        benign(&args)
    };
    let expected = format!(
        "{}: no labelled questions",
        trec.join("TREC_10.label").display()
    );
    assert_one_error_line("empty TREC_10.label", &split("trec", &[]), &[&expected]);

    // AG-news offline: an empty test.csv, the only file a carved run reads.
    let ag = dir.path().join("ag_news");
    std::fs::create_dir_all(&ag).unwrap();
    std::fs::write(ag.join("test.csv"), "").unwrap();
    let expected = format!("{}: no rows", ag.join("test.csv").display());
    let out = split("ag_news", &["--carve-train-from-test", "0.5"]);
    assert_one_error_line("empty test.csv", &out, &[&expected]);
}

#[test]
fn empty_sets_of_a_split_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    tiny_breastmnist(dir.path());
    for (pretrain_n, n, test_n, flag) in [
        ("0", "5", "3", "--pretrain-n"),
        ("10", "0", "3", "--n"),
        ("10", "5", "0", "--test-n"),
    ] {
        let out = benign(&[
            "data",
            "split",
            "--dataset",
            "breastmnist",
            "--pretrain-n",
            pretrain_n,
            "--n",
            n,
            "--test-n",
            test_n,
            "--data-dir",
            path_str(dir.path()),
        ]);
        assert_one_error_line(flag, &out, &[&format!("{flag} must be at least 1, got 0")]);
    }
}
