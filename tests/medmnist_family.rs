//! The MedMNIST 2D family (datasets/medmnist.toml) on fixtures in the official layout
//! (tests/fixtures/medmnist/, written with numpy by scripts/make_medmnist_fixtures.py): every
//! single-label task loads with its release's classes and channels and runs `finetune` end to end
//! at quick sizes; a MedMNIST+ size loads at its size; the multi-label ChestMNIST and a file of
//! another size under a size's name are refused in one line.

use std::path::Path;
use std::process::Output;

use benign_attention::data::medmnist_family::{release, task_names};
use benign_attention::data::{self, DatasetName, Inputs};

mod common;

fn fixtures_root() -> std::path::PathBuf {
    common::fixtures()
}

/// Every task but the multi-label one, and one MedMNIST+ size.
fn single_label_names() -> Vec<String> {
    let mut names: Vec<String> = task_names()
        .into_iter()
        .filter(|t| *t != "chestmnist")
        .map(String::from)
        .collect();
    names.push("organamnist_64".into());
    names
}

#[test]
fn every_task_loads_with_its_release_classes_channels_and_size() {
    for name in single_label_names() {
        let dataset_name: DatasetName = name.parse().unwrap();
        let dataset = data::load(&dataset_name, &fixtures_root()).unwrap_or_else(|e| panic!("{e}"));
        let release = release(&name).unwrap();
        assert_eq!(dataset.class_names, release.task.classes, "{name}");
        let Inputs::Images(images) = &dataset.test.inputs else {
            panic!("{name}: not images");
        };
        assert_eq!(
            (images.channels, images.height, images.width),
            (release.task.channels, release.pixels, release.pixels),
            "{name}"
        );
        assert_eq!(dataset.train.as_ref().unwrap().len(), 16, "{name}");
        assert!(dataset.val.is_some() && dataset.test.len() == 8, "{name}");
        // The manifest `data fetch` and `data verify` read: the release's own file and md5.
        let manifest = dataset_name.manifest().unwrap();
        assert_eq!(manifest.files[0].path, format!("{name}.npz"));
        assert!(manifest.files[0].urls[0].contains(&format!("/{name}.npz")));
    }
}

fn benign(args: &[&str], cache: &Path) -> Output {
    common::benign_cached(args, cache)
}

#[test]
fn chestmnist_and_a_file_of_another_size_are_refused_in_one_line() {
    let cache = tempfile::tempdir().unwrap();
    let root = fixtures_root();
    let chest = benign(
        &[
            "finetune",
            "--dataset",
            "chestmnist",
            "--data-dir",
            root.to_str().unwrap(),
        ],
        cache.path(),
    );
    common::assert_one_error_line("chestmnist", &chest, &["multi-label"]);
    // The 28 px file under the 64 px name.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(other.path().join("medmnist")).unwrap();
    std::fs::copy(
        root.join("medmnist/dermamnist.npz"),
        other.path().join("medmnist/dermamnist_64.npz"),
    )
    .unwrap();
    let wrong = data::load(&"dermamnist_64".parse().unwrap(), other.path())
        .err()
        .unwrap()
        .to_string();
    assert!(
        wrong.contains("dermamnist_64.npz") && wrong.contains("expected 64×64"),
        "{wrong}"
    );
}

#[test]
fn every_task_runs_finetune_end_to_end() {
    let test = "every_task_runs_finetune_end_to_end";
    if common::models_root(test).is_none() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let root = fixtures_root();
    for name in single_label_names() {
        let folder = out.path().join(&name);
        let mut args = common::quick_finetune_args(&name, &folder);
        args.extend(["--data-dir".into(), root.to_str().unwrap().into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = benign(&args, cache.path());
        assert!(
            run.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(folder.join("summary.json")).unwrap()).unwrap();
        assert_eq!(summary["config"]["dataset"], name.as_str(), "{name}");
        assert!(
            summary["final"]["test_acc"].as_f64().is_some(),
            "{name}: {summary}"
        );
    }
}

/// `data list` counts every family file present against its release; `data verify` checks a
/// family file against the release's md5 (a fixture is not the release: exit 1, MISMATCH).
#[test]
fn data_list_and_verify_show_the_family() {
    let cache = tempfile::tempdir().unwrap();
    let root = fixtures_root();
    let list = benign(
        &["data", "list", "--data-dir", root.to_str().unwrap()],
        cache.path(),
    );
    let stdout = String::from_utf8_lossy(&list.stdout);
    assert!(
        stdout.contains("dermamnist: 16/7007 train, 4/1003 val, 8/2005 test, partial")
            && stdout.contains("organamnist_64: 16/34561 train"),
        "{stdout}"
    );
    let verify = benign(
        &[
            "data",
            "verify",
            "--data-dir",
            root.to_str().unwrap(),
            "dermamnist",
        ],
        cache.path(),
    );
    let stdout = String::from_utf8_lossy(&verify.stdout);
    assert_eq!(verify.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("medmnist/dermamnist.npz: MISMATCH: md5"),
        "{stdout}"
    );
}
