//! `--rng authors` on the real release files (`BENIGN_DATA_DIR`, e.g. the offline mirror; every
//! test returns early when it is unset): `data split`'s split and label noise, checked against
//! docs/protocol.md §3.1's seed-42 prefixes and against real numpy 2.2.3 / torch 2.6.0 run on the real
//! labels (`tests/fixtures/authors_rng.json`, `real_splits`), refused on partial data; and a small
//! `finetune` run (also needs `BENIGN_MODELS_DIR`) that records the choice and its deviations.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use benign_attention::data::{self, DatasetName};
use benign_attention::rng::numpy;
use serde_json::Value;
use sha2::{Digest, Sha256};

mod common;

/// The data root, or `None` after the common skip note (a failure under BENIGN_REQUIRE_DATA=1).
fn data_dir(test: &str) -> Option<PathBuf> {
    common::data_root(test)
}

fn benign(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .env(data::catalog::DATA_DIR_ENV, root)
        .output()
        .unwrap()
}

/// `data split --rng authors ARGS --out FILE`: the file's JSON.
fn authors_split(root: &Path, args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("split.json");
    let mut all = vec!["data", "split", "--rng", "authors"];
    all.extend(args);
    all.extend(["--out", file.to_str().unwrap()]);
    let out = benign(root, &all);
    assert!(
        out.status.success(),
        "{all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The summary stays on stdout.
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["rng"], "authors");
    serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap()
}

fn numbers(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// docs/protocol.md §3.1's seed-42 prefixes of the authors' split (MNIST: tail-shuffle path, TREC: Floyd).
#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn seed_42_prefixes_of_the_paper() {
    let Some(root) = data_dir("authors_split::seed_42_prefixes_of_the_paper") else {
        return;
    };
    let cases: [(&str, &str, &[u64], &[u64]); 2] = [
        (
            "mnist",
            "10000",
            &[
                54981, 48518, 41233, 30189, 32047, 44867, 34335, 743, 54777, 1126,
            ],
            &[57522, 20269, 7057, 20488, 5241],
        ),
        (
            "trec",
            "3000",
            &[2495, 2268, 1160, 1503, 4849, 1897, 353, 2564, 256, 1218],
            &[1396, 2109, 5136, 3615, 4051],
        ),
    ];
    for (dataset, pretrain_n, pretrain, finetune) in cases {
        let rows = authors_split(
            &root,
            &[
                "--dataset",
                dataset,
                "--pretrain-n",
                pretrain_n,
                "--n",
                "200",
                "--seed",
                "42",
            ],
        );
        let p = numbers(&rows["pretrain_indices"]);
        let f = numbers(&rows["finetune_indices"]);
        assert_eq!(p.len().to_string(), pretrain_n, "{dataset}");
        assert_eq!(f.len(), 200, "{dataset}");
        assert_eq!(&p[..pretrain.len()], pretrain, "{dataset} pretrain");
        assert_eq!(&f[..finetune.len()], finetune, "{dataset} fine-tune");
        assert_eq!(rows["deviations"], Value::Array(vec![]), "{dataset}");
    }
}

/// The split and the noisy labels of TREC, BreastMNIST and MNIST at seed 7, η 0.2 equal what real
/// numpy and torch give on the same real labels (the authors' noise line evaluated verbatim), index
/// for index and label for label.
#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn trec_breastmnist_and_mnist_at_seed_7_equal_real_numpy_and_torch() {
    let Some(root) =
        data_dir("authors_split::trec_breastmnist_and_mnist_at_seed_7_equal_real_numpy_and_torch")
    else {
        return;
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/authors_rng.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = fixture["real_splits"].as_array().unwrap();
    let names: Vec<&str> = cases
        .iter()
        .map(|c| c["dataset"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["trec", "breastmnist", "mnist"]);
    for case in cases {
        let dataset = case["dataset"].as_str().unwrap();
        // The fixture was made from these very files.
        let labels_file = root.join(case["labels_file"].as_str().unwrap());
        let digest: String = Sha256::digest(std::fs::read(&labels_file).unwrap())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            digest,
            case["labels_file_sha256"].as_str().unwrap(),
            "{}: not the file the fixture was made from",
            labels_file.display()
        );
        let arg = |key: &str| case[key].to_string();
        let (p, n, seed, eta) = (arg("P"), arg("n"), arg("seed"), arg("eta"));
        assert_ne!(seed, "42");
        let rows = authors_split(
            &root,
            &[
                "--dataset",
                dataset,
                "--pretrain-n",
                &p,
                "--n",
                &n,
                "--seed",
                &seed,
                "--eta",
                &eta,
            ],
        );
        for key in [
            "pretrain_indices",
            "finetune_indices",
            "finetune_clean_labels",
            "finetune_labels",
            "noisy_mask",
        ] {
            assert_eq!(rows[key], case[key], "{dataset} seed {seed}: {key}");
        }
        let flipped = rows["noisy_mask"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m.as_bool().unwrap())
            .count();
        assert!(flipped > 0, "{dataset}: no label flipped at η {eta}");
    }
}

/// Partial or foreign training files are refused in one line that says how many drawn rows are
/// missing.
#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn partial_data_is_refused_naming_the_missing_rows() {
    let Some(root) = data_dir("authors_split::partial_data_is_refused_naming_the_missing_rows")
    else {
        return;
    };
    let cifar = data::load(&DatasetName::Cifar10, &root).unwrap();
    let present: HashSet<usize> = cifar
        .train
        .as_ref()
        .unwrap()
        .release_index
        .iter()
        .copied()
        .collect();
    let drawn = numpy::choice(42, 50_000, 10_200).unwrap();
    let missing = drawn.iter().filter(|r| !present.contains(r)).count();
    let cases = [
        (
            "cifar10",
            "10000",
            format!("{missing} of the 10200 training rows the authors' split draws are missing"),
        ),
        (
            "pneumoniamnist",
            "3000",
            "not the official 4708".to_string(),
        ),
        (
            "ag_news",
            "10000",
            "all 10200 training rows the authors' split draws are missing".to_string(),
        ),
    ];
    for (dataset, pretrain_n, expected) in cases {
        let out = benign(
            &root,
            &[
                "data",
                "split",
                "--rng",
                "authors",
                "--dataset",
                dataset,
                "--pretrain-n",
                pretrain_n,
                "--n",
                "200",
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{dataset}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{dataset}: {stderr}");
        assert!(
            errors[0].contains("--rng authors") && errors[0].contains(&expected),
            "{dataset}: {}",
            errors[0]
        );
    }
    assert!(missing > 0 && missing < 10_200, "{missing}");
}

/// A small `finetune --rng authors` runs end to end; config.json and summary.json carry the
/// choice, and the deviations say what stays ours.
#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn finetune_runs_with_the_authors_draws_and_records_them() {
    let Some(root) =
        data_dir("authors_split::finetune_runs_with_the_authors_draws_and_records_them")
    else {
        return;
    };
    if common::models_root("authors_split::finetune").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (cache, run) = (dir.path().join("cache"), dir.path().join("run"));
    let out = benign(
        &root,
        &[
            "finetune",
            "--rng",
            "authors",
            "--dataset",
            "trec",
            "--eta",
            "0.2",
            "--pretrain-n",
            "200",
            "--n",
            "30",
            "--epochs",
            "2",
            "--pretrain-epochs",
            "2",
            "--test-n",
            "40",
            "--cache-dir",
            cache.to_str().unwrap(),
            "--out",
            run.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(run.join(name)).unwrap()).unwrap()
    };
    let summary = read("summary.json");
    assert_eq!(summary["config"]["rng"], "authors");
    assert_eq!(read("config.json"), summary["config"]);
    let deviations: Vec<&str> = summary["deviations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(
        deviations.contains(&benign_attention::train::setup::AUTHORS_RNG_DEVIATION),
        "{deviations:?}"
    );
    assert!(
        deviations
            .iter()
            .any(|d| d.starts_with("--rng authors with --test-n")),
        "{deviations:?}"
    );
    // The fine-tune labels are the authors' draw: their realised rate is that of `data split`.
    let rows = authors_split(
        &root,
        &["--dataset", "trec", "--pretrain-n", "200", "--n", "30"],
    );
    let flipped = rows["noisy_mask"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m.as_bool().unwrap())
        .count();
    assert_eq!(
        summary["resolved"]["realised_eta"].as_f64().unwrap(),
        flipped as f64 / 30.0
    );
}
