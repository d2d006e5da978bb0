//! The authors' other two datasets, STL-10 and SST-2, on small files written here in the official
//! formats (STL-10's binary release: column-major 96×96×3 u8 images, labels 1..10; GLUE's SST-2
//! TSVs): `data list` names eight datasets, `finetune` runs end to end on each, and a corrupt or
//! truncated file is one error line naming it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

const IMAGE_BYTES: usize = 3 * 96 * 96;
const STL10_CLASSES: &str = "airplane\nbird\ncar\ncat\ndeer\ndog\nhorse\nmonkey\nship\ntruck\n";

fn benign(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .env("BENIGN_CACHE_DIR", cache)
        .output()
        .expect("binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// `<root>/stl10/stl10_binary/` with `train` and `test` images: image k is a gradient whose
/// brightness follows its label (k mod 10, stored as 1..10), so the classes can be told apart.
fn write_stl10(root: &Path, train: usize, test: usize) -> PathBuf {
    let dir = root.join("stl10/stl10_binary");
    std::fs::create_dir_all(&dir).unwrap();
    for (split, count) in [("train", train), ("test", test)] {
        let mut images = Vec::with_capacity(count * IMAGE_BYTES);
        let mut labels = Vec::with_capacity(count);
        for k in 0..count {
            let class = (k % 10) as u8;
            // Column-major planes: byte (c, x, y) is the pixel at row y, column x.
            for c in 0..3u8 {
                for x in 0..96u8 {
                    for y in 0..96u8 {
                        images.push(class * 25 + (x / 8 + y / 16 + c * 3) % 20);
                    }
                }
            }
            labels.push(class + 1);
        }
        std::fs::write(dir.join(format!("{split}_X.bin")), images).unwrap();
        std::fs::write(dir.join(format!("{split}_y.bin")), labels).unwrap();
    }
    std::fs::write(dir.join("class_names.txt"), STL10_CLASSES).unwrap();
    dir
}

/// `<root>/sst2/SST-2/` with `train` and `dev` sentences, labelled by their words.
fn write_sst2(root: &Path, train: usize, dev: usize) -> PathBuf {
    let dir = root.join("sst2/SST-2");
    std::fs::create_dir_all(&dir).unwrap();
    for (file, count) in [("train.tsv", train), ("dev.tsv", dev)] {
        let mut text = String::from("sentence\tlabel\n");
        for k in 0..count {
            let (words, label) = if k % 2 == 0 {
                ("a wonderful , moving film ", 1)
            } else {
                ("a dull and tedious mess ", 0)
            };
            text.push_str(&format!("{words}number {k} \t{label}\n"));
        }
        std::fs::write(dir.join(file), text).unwrap();
    }
    dir
}

/// The tiny fixture ViT (32-pixel inputs) with the preprocessor config it needs.
fn tiny_vit(dir: &Path) -> PathBuf {
    let fixture = common::fixtures().join("tiny_vit");
    let model = dir.join("tiny_vit");
    std::fs::create_dir_all(&model).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(file), model.join(file)).unwrap();
    }
    std::fs::write(
        model.join("preprocessor_config.json"),
        r#"{"size": {"height": 32, "width": 32}, "resample": 2}"#,
    )
    .unwrap();
    model
}

fn assert_one_error_line(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 1, "more than one line:\n{err}");
    for needle in needles {
        assert!(lines[0].contains(needle), "no {needle:?} in: {err}");
    }
}

#[test]
fn data_list_names_eight_datasets() {
    let dir = tempfile::tempdir().unwrap();
    write_stl10(dir.path(), 30, 10);
    write_sst2(dir.path(), 40, 12);
    let out = benign(
        &["data", "list", "--data-dir", path_str(dir.path())],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "mnist:",
        "cifar10:",
        "pneumoniamnist:",
        "breastmnist:",
        "ag_news:",
        "trec:",
        "stl10: 30/5000 train, 10/8000 test, partial",
        "sst2: 40/67349 train, 12/872 test, partial",
    ] {
        assert!(text.contains(name), "no {name:?} in:\n{text}");
    }
}

#[test]
fn finetune_runs_on_stl10_files_in_the_release_format() {
    let dir = tempfile::tempdir().unwrap();
    write_stl10(dir.path(), 40, 20);
    let model = tiny_vit(dir.path());
    let out_dir = dir.path().join("run");
    let out = benign(
        &[
            "finetune",
            "--dataset",
            "stl10",
            "--eta",
            "0.2",
            "--pretrain-n",
            "20",
            "--n",
            "10",
            "--pretrain-epochs",
            "2",
            "--epochs",
            "3",
            "--data-dir",
            path_str(dir.path()),
            "--backbone",
            path_str(&model),
            "--out",
            path_str(&out_dir),
        ],
        &dir.path().join("cache"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["config"]["dataset"], "stl10");
    assert_eq!(summary["resolved"]["test_n"], 20);
    assert_eq!(summary["resolved"]["pretrain_n"], 20);
    assert!(summary["final"]["test_acc"].as_f64().is_some());
}

#[test]
#[cfg_attr(
    benign_no_models,
    ignore = "needs real checkpoints: BENIGN_MODELS_DIR is not set"
)]
fn finetune_runs_on_sst2_files_in_the_glue_format() {
    let test = "stl10_sst2::finetune_runs_on_sst2_files_in_the_glue_format";
    let Some(models) = common::models_root(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_sst2(dir.path(), 60, 16);
    let out_dir = dir.path().join("run");
    let out = benign(
        &[
            "finetune",
            "--dataset",
            "sst2",
            "--eta",
            "0.2",
            "--pretrain-n",
            "30",
            "--n",
            "10",
            "--pretrain-epochs",
            "2",
            "--epochs",
            "3",
            "--data-dir",
            path_str(dir.path()),
            "--models-dir",
            path_str(&models),
            "--out",
            path_str(&out_dir),
        ],
        &dir.path().join("cache"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["config"]["dataset"], "sst2");
    // The test set is GLUE's dev.tsv.
    assert_eq!(summary["resolved"]["test_n"], 16);
}

/// A split of `dataset` under `root`: loads the data, and nothing else.
fn split(dataset: &str, root: &Path, extra: &[&str]) -> Output {
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
        path_str(root),
    ];
    args.extend(extra);
    benign(&args, root)
}

#[test]
fn corrupt_or_truncated_files_are_one_line_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let stl = write_stl10(dir.path(), 20, 10);
    let sst = write_sst2(dir.path(), 20, 10);
    assert!(split("stl10", dir.path(), &[]).status.success());
    assert!(split("sst2", dir.path(), &[]).status.success());

    // STL-10: images cut mid-image, a label outside 1..10, fewer labels than images.
    let images = std::fs::read(stl.join("train_X.bin")).unwrap();
    std::fs::write(stl.join("train_X.bin"), &images[..images.len() - 100]).unwrap();
    let train_x = stl.join("train_X.bin");
    assert_one_error_line(
        &split("stl10", dir.path(), &[]),
        &[path_str(&train_x), "not a whole number of 96×96×3 images"],
    );
    std::fs::write(&train_x, &images).unwrap();
    let mut labels = std::fs::read(stl.join("train_y.bin")).unwrap();
    labels[3] = 0;
    std::fs::write(stl.join("train_y.bin"), &labels).unwrap();
    assert_one_error_line(
        &split("stl10", dir.path(), &[]),
        &[path_str(&stl.join("train_y.bin")), "outside 1..10"],
    );
    std::fs::write(stl.join("train_y.bin"), &labels[..19]).unwrap();
    assert_one_error_line(
        &split("stl10", dir.path(), &[]),
        &[
            path_str(&stl.join("train_y.bin")),
            "19 labels for the 20 images",
        ],
    );

    // SST-2: a row cut before its label, a label that is not 0/1, GLUE's unlabelled test header.
    let dev = sst.join("dev.tsv");
    std::fs::write(&dev, "sentence\tlabel\ngood\t1\ncut off here").unwrap();
    assert_one_error_line(
        &split("sst2", dir.path(), &[]),
        &[path_str(&dev), "line 3: no tab"],
    );
    std::fs::write(&dev, "sentence\tlabel\ngood\t1\nbad\t3\n").unwrap();
    assert_one_error_line(
        &split("sst2", dir.path(), &[]),
        &[path_str(&dev), "label \"3\""],
    );
    std::fs::write(&dev, "index\tsentence\n0\tno label\n").unwrap();
    assert_one_error_line(&split("sst2", dir.path(), &[]), &[path_str(&dev), "header"]);
}

/// The authors drew row numbers of the hub copies; their order is not checked here, so
/// `--rng authors` is refused rather than claimed.
#[test]
fn the_authors_draw_is_refused_for_the_hub_copies_it_was_made_on() {
    let dir = tempfile::tempdir().unwrap();
    write_stl10(dir.path(), 20, 10);
    let out = split("stl10", dir.path(), &["--rng", "authors"]);
    assert_one_error_line(&out, &["--rng authors", "tanganke/stl10", "--rng own"]);
}
