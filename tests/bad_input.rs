//! Bad input through the binary: one `error: …` line on stderr naming the file or flag, exit
//! status 2, never a panic, a hang or an allocation abort. And progress lines on a stderr that is
//! not a terminal. Fixtures are built in temp folders at run time.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};
use serde_json::json;

mod common;

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
    common::assert_one_error_line(
        "label 7",
        &out,
        &[path_str(&npz), "train_labels[3] is 7", "2 classes"],
    );
    assert!(out.stdout.is_empty());
}

/// Fewer labels than images is a count mismatch, said as such (not blamed on multi-label tasks).
#[test]
fn medmnist_label_count_mismatch_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let labels: Vec<u8> = (0..20).map(|k| k % 2).collect();
    let npz = write_medmnist(
        dir.path(),
        "breastmnist",
        &[("train", &labels), ("val", &[0, 1]), ("test", &[1, 0, 1])],
    );
    // Rewrite the archive with 19 train labels for its 20 train images.
    let mut arrays = Tensor::read_npz(&npz).unwrap();
    for (name, tensor) in &mut arrays {
        if name == "train_labels" {
            *tensor = tensor.narrow(0, 0, 19).unwrap();
        }
    }
    let named: Vec<(&str, Tensor)> = arrays
        .iter()
        .map(|(k, t)| (k.as_str(), t.clone()))
        .collect();
    Tensor::write_npz(&named, &npz).unwrap();
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
    common::assert_one_error_line(
        "19 labels for 20 images",
        &out,
        &[
            path_str(&npz),
            "train_labels has shape [19, 1] for 20 images",
            "one label per image",
        ],
    );
    assert!(!stderr(&out).contains("multi-label"), "{}", stderr(&out));
}

/// A grid whose every n exceeds the data (BreastMNIST has 546 training images) is refused naming
/// --ns, before any backbone is loaded, and writes nothing.
#[test]
fn a_grid_no_run_of_which_fits_the_data_names_ns() {
    let dir = tempfile::tempdir().unwrap();
    tiny_breastmnist(dir.path());
    let out_dir = dir.path().join("grid");
    let out = benign(&[
        "reproduce",
        "table2",
        "--datasets",
        "breastmnist",
        "--ns",
        "2000",
        "--data-dir",
        path_str(dir.path()),
        "--out",
        path_str(&out_dir),
    ]);
    common::assert_one_error_line(
        "--ns 2000",
        &out,
        &[
            "--ns",
            "no run of the grid can be made",
            "breastmnist n = 2000",
        ],
    );
    assert!(
        !out_dir.exists(),
        "a refused grid left {}",
        out_dir.display()
    );
}

#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn empty_text_files_are_refused_at_load_naming_the_file() {
    let test = "bad_input::empty_text_files_are_refused_at_load_naming_the_file";
    let Some(data) = common::data_root_with(test, &["trec"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let trec = dir.path().join("trec");
    std::fs::create_dir_all(&trec).unwrap();
    std::fs::copy(
        data.join("trec/train_5500.label"),
        trec.join("train_5500.label"),
    )
    .unwrap();
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
    common::assert_one_error_line("empty TREC_10.label", &split("trec", &[]), &[&expected]);

    // AG-news offline: an empty test.csv, the only file a carved run reads.
    let ag = dir.path().join("ag_news");
    std::fs::create_dir_all(&ag).unwrap();
    std::fs::write(ag.join("test.csv"), "").unwrap();
    let expected = format!("{}: no rows", ag.join("test.csv").display());
    let out = split("ag_news", &["--carve-train-from-test", "0.5"]);
    common::assert_one_error_line("empty test.csv", &out, &[&expected]);
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
        common::assert_one_error_line(flag, &out, &[&format!("{flag} must be at least 1, got 0")]);
    }
}

/// A copy of fixture model `name` in `dir` (config.json edited by `edit`), and for the ViT a
/// preprocessor_config.json matching its 32-pixel images, edited by `edit_preprocessor`.
fn model_copy(
    dir: &Path,
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
    edit_preprocessor: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let fixture = common::fixtures().join(name);
    let model = dir.join(name);
    std::fs::create_dir_all(&model).unwrap();
    std::fs::copy(
        fixture.join("model.safetensors"),
        model.join("model.safetensors"),
    )
    .unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap())
            .unwrap();
    edit(&mut config);
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    if name == "tiny_vit" {
        let mut preprocessor =
            serde_json::json!({"size": {"height": 32, "width": 32}, "resample": 2});
        edit_preprocessor(&mut preprocessor);
        // Written by hand: serde_json cannot write the non-finite numbers a test may put there.
        let text = preprocessor.to_string().replace("\"INF\"", "1e999");
        std::fs::write(model.join("preprocessor_config.json"), text).unwrap();
    }
    model
}

/// `extract` of 4 tiny BreastMNIST images through the backbone folder `model`.
fn extract(data: &Path, model: &Path, cache: &Path) -> Output {
    benign(&[
        "extract",
        "--backbone",
        path_str(model),
        "--dataset",
        "breastmnist",
        "--limit",
        "4",
        "--data-dir",
        path_str(data),
        "--cache-dir",
        path_str(cache),
    ])
}

#[test]
fn backbone_configs_the_forward_cannot_run_are_refused_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    tiny_breastmnist(&data);
    let cache = dir.path().join("cache");

    // The unedited copy extracts: what fails below fails for the edited field.
    let model = model_copy(&dir.path().join("ok"), "tiny_vit", |_| {}, |_| {});
    let out = extract(&data, &model, &cache);
    assert!(out.status.success(), "{}", stderr(&out));

    let expect_refusal = |model: PathBuf, file: &str, field: &str| {
        let out = extract(&data, &model, &cache);
        let file = model.join(file);
        common::assert_one_error_line(
            &format!("{} {field}", model.display()),
            &out,
            &[&format!("{}: ", file.display()), field],
        );
    };
    // (model, config.json key, value, what the error says)
    #[rustfmt::skip]
    let config_cases = [
        ("tiny_vit", "patch_size", json!(0), "patch_size is 0"),
        ("tiny_vit", "num_hidden_layers", json!(0), "num_hidden_layers is 0"),
        ("tiny_vit", "hidden_size", json!(0), "hidden_size is 0"),
        ("tiny_vit", "num_attention_heads", json!(0), "num_attention_heads is 0"),
        ("tiny_vit", "num_attention_heads", json!(5), "num_attention_heads 5"),
        ("tiny_vit", "image_size", json!(30), "image_size 30 is not a multiple of patch_size 8"),
        ("tiny_vit", "patch_size", json!(-1), "\"patch_size\": invalid value"),
        ("tiny_bert", "num_hidden_layers", json!(0), "num_hidden_layers is 0"),
        ("tiny_bert", "hidden_size", json!(0), "hidden_size is 0"),
        ("tiny_bert", "num_attention_heads", json!(0), "num_attention_heads is 0"),
        ("tiny_bert", "intermediate_size", json!(0), "intermediate_size is 0"),
        ("tiny_bert", "vocab_size", json!(0), "vocab_size is 0"),
        ("tiny_bert", "max_position_embeddings", json!(0), "max_position_embeddings is 0"),
        ("tiny_bert", "max_position_embeddings", json!(16), "max_position_embeddings 16 is below the 128 tokens"),
    ];
    for (k, (name, key, value, field)) in config_cases.into_iter().enumerate() {
        let place = dir.path().join(format!("config-{k}"));
        let model = model_copy(&place, name, |c| c[key] = value, |_| {});
        expect_refusal(model, "config.json", field);
    }
    // (preprocessor_config.json key, value, what the error says)
    #[rustfmt::skip]
    let preprocessor_cases = [
        ("size", json!({"height": 0, "width": 32}), "size is 0×32"),
        ("size", json!(0), "size is 0×0"),
        ("size", json!({"shortest_edge": 0}), "size.shortest_edge"),
        ("image_std", json!([0.5, 0.0, 0.5]), "image_std [0.5, 0.0, 0.5] holds 0"),
        // JSON has no infinity: 1e999 is out of range (see model_copy).
        ("image_std", json!([0.5, "INF", 0.5]), "\"image_std\": number out of range"),
        ("size", json!({"height": 16, "width": 16}), "does not match image_size 32"),
    ];
    for (k, (key, value, field)) in preprocessor_cases.into_iter().enumerate() {
        let place = dir.path().join(format!("preprocessor-{k}"));
        let model = model_copy(&place, "tiny_vit", |_| {}, |p| p[key] = value);
        expect_refusal(model, "preprocessor_config.json", field);
    }
}

/// A tiny BreastMNIST under `dir/data` and a copy of the tiny ViT under `dir/ok`.
fn tiny_data_and_model(dir: &Path) -> (PathBuf, PathBuf) {
    let data = dir.join("data");
    tiny_breastmnist(&data);
    (
        data,
        model_copy(&dir.join("ok"), "tiny_vit", |_| {}, |_| {}),
    )
}

/// `extract --device cuda` from a CPU-only build: one line saying how to build with CUDA.
#[test]
fn extract_on_cuda_from_a_cpu_build_is_one_error_line() {
    if cfg!(feature = "cuda") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (data, model) = tiny_data_and_model(dir.path());
    let cache = dir.path().join("cache");
    let out = benign(&[
        "extract",
        "--backbone",
        path_str(&model),
        "--dataset",
        "breastmnist",
        "--data-dir",
        path_str(&data),
        "--cache-dir",
        path_str(&cache),
        "--device",
        "cuda",
    ]);
    common::assert_one_error_line(
        "extract --device cuda",
        &out,
        &["--device cuda", "--features cuda"],
    );
}

/// `finetune --device cuda` and `--train-device cuda` from a CPU-only build: one line naming the
/// flag, and no run folder.
#[test]
fn finetune_on_cuda_from_a_cpu_build_is_one_error_line() {
    if cfg!(feature = "cuda") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (data, model) = tiny_data_and_model(dir.path());
    for flag in ["--device", "--train-device"] {
        let out_dir = dir.path().join(flag.trim_start_matches('-'));
        let out = benign(&[
            "finetune",
            "--dataset",
            "breastmnist",
            "--eta",
            "0.2",
            "--backbone",
            path_str(&model),
            "--data-dir",
            path_str(&data),
            "--cache-dir",
            path_str(&dir.path().join("cache")),
            "--out",
            path_str(&out_dir),
            flag,
            "cuda",
        ]);
        let shown = format!("finetune {flag} cuda");
        common::assert_one_error_line(&shown, &out, &[&format!("{flag} cuda"), "--features cuda"]);
        assert!(!out_dir.exists(), "{shown} left {}", out_dir.display());
    }
}

#[test]
fn memory_implausible_synthetic_runs_are_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let started = Instant::now();
    let out = benign(&[
        "synthetic",
        "--embed-dim",
        "10000000",
        "--out",
        path_str(&out_dir),
    ]);
    common::assert_one_error_line(
        "--embed-dim 10000000",
        &out,
        &["--embed-dim 10000000", "GiB"],
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    assert!(!out_dir.exists(), "{} was created", out_dir.display());
    assert!(out.stdout.is_empty());
}

#[test]
fn progress_is_printed_as_lines_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let run = |every: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_benign-attention"));
        command.args([
            "synthetic",
            "--num-steps",
            "200",
            "--embed-dim",
            "200",
            "--test-n",
            "100",
            "--out",
            path_str(&dir.path().join("run")),
        ]);
        match every {
            Some(secs) => command.env(PROGRESS_ENV, secs),
            None => command.env_remove(PROGRESS_ENV),
        };
        let out = command.output().expect("binary runs");
        assert!(out.status.success(), "{}", stderr(&out));
        stderr(&out)
    };
    let progress = |err: &str| -> Vec<String> {
        err.lines()
            .filter(|l| l.contains("/201 steps"))
            .map(String::from)
            .collect()
    };

    // Every update: a start line, one per step, a last line.
    let err = run(Some("0"));
    let lines = progress(&err);
    assert!(lines[0].ends_with("0/201 steps started"), "{err}");
    assert!(lines.iter().any(|l| l.ends_with(" 100/201 steps")), "{err}");
    assert!(
        lines.last().unwrap().ends_with(" 201/201 steps done"),
        "{err}"
    );
    assert_eq!(lines.len(), 202, "{err}");

    // The default interval (30 s): a run of a second prints the first and the last line only.
    let err = run(None);
    let lines = progress(&err);
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].ends_with("0/201 steps started") && lines[1].ends_with("201/201 steps done"));
}

/// Input refused after set-up (here `--test-n` beyond the test set) leaves no run folder behind:
/// the folder is written only once everything about the run has been checked.
#[test]
#[cfg_attr(
    benign_no_models,
    ignore = "needs real checkpoints: BENIGN_MODELS_DIR is not set"
)]
fn a_run_refused_after_set_up_writes_no_run_folder() {
    let Some(models) =
        common::models_root("bad_input::a_run_refused_after_set_up_writes_no_run_folder")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    tiny_breastmnist(dir.path());
    let run = dir.path().join("run");
    let out = benign(&[
        "finetune",
        "--dataset",
        "breastmnist",
        "--eta",
        "0.2",
        "--pretrain-n",
        "10",
        "--n",
        "5",
        "--test-n",
        "50",
        "--data-dir",
        path_str(dir.path()),
        "--models-dir",
        path_str(&models),
        "--cache-dir",
        path_str(&dir.path().join("cache")),
        "--out",
        path_str(&run),
    ]);
    common::assert_one_error_line("--test-n", &out, &["--test-n"]);
    assert!(!run.exists(), "a refused run left {}", run.display());
}
