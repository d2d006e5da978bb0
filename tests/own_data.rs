//! Datasets a user brings (docs/data.md, "Your own data") on fixtures written by the tools a user
//! would write them with (tests/fixtures/own/, scripts/make_own_fixtures.py: Pillow's PNG and
//! JPEG files, Python's csv and json modules): each loads in its documented order and runs
//! `finetune` end to end; `--rng authors` on a folder draws numpy's rows; bad input is one line
//! and leaves nothing behind; a run on files that changed is refused.

use std::path::{Path, PathBuf};
use std::process::Output;

use benign_attention::data::{self, DatasetName, Inputs};

mod common;

fn own(name: &str) -> PathBuf {
    common::fixtures().join("own").join(name)
}

fn spec(kind: &str, name: &str) -> String {
    format!("{kind}:{}", own(name).display())
}

fn load(spec: &str) -> data::Dataset {
    let name: DatasetName = spec.parse().unwrap();
    data::load(&name, Path::new("unused")).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn benign(args: &[&str], cache: &Path) -> Output {
    common::benign_cached(args, cache)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn every_source_loads_in_its_documented_order() {
    let split = load(&spec("folder", "images_split"));
    assert_eq!(split.class_names, ["cat", "dog"]);
    let Inputs::Images(images) = &split.test.inputs else {
        panic!("not images")
    };
    assert_eq!((images.channels, images.height, images.width), (3, 16, 16));
    assert_eq!(
        (split.train.as_ref().unwrap().len(), split.test.len()),
        (24, 8)
    );
    assert_eq!(
        split.train.as_ref().unwrap().labels[..13],
        [0; 12].iter().chain(&[1]).copied().collect::<Vec<_>>()[..]
    );
    assert!(split.warnings.is_empty(), "{:?}", split.warnings);

    // Classes named by integers sort as numbers; grayscale stays one channel; two sizes are
    // resized to 224; every fifth image of each class is the test split. Each image is one grey
    // value unique to its file, listed by the fixture script in the documented order.
    let pool = load(&spec("folder", "images_pool"));
    assert_eq!(pool.class_names, ["2", "7", "10"]);
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(own("images_pool.expected.json")).unwrap()).unwrap();
    let train = pool.train.as_ref().unwrap();
    let Inputs::Images(images) = &train.inputs else {
        panic!("not images")
    };
    assert_eq!(
        (images.channels, images.height, images.width),
        (1, 224, 224)
    );
    let values: Vec<u64> = (0..train.len())
        .map(|i| u64::from(images.image(i)[0]))
        .collect();
    let listed: Vec<u64> = expected["train_values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(values, listed);
    assert!(images.image(5).iter().all(|&p| u64::from(p) == listed[5]));
    assert_eq!(pool.test.len(), 9);
    assert_eq!(pool.warnings.len(), 2, "{:?}", pool.warnings);

    let reviews = load(&format!(
        "{}#text=review#label=stars",
        spec("csv", "reviews.csv")
    ));
    assert_eq!(reviews.class_names, ["1", "2", "3"]);
    assert_eq!(
        (reviews.train.as_ref().unwrap().len(), reviews.test.len()),
        (48, 12)
    );
    let Inputs::Texts(texts) = &reviews.train.as_ref().unwrap().inputs else {
        panic!("not texts")
    };
    // Row 0 (stars 1) quotes a comma and quotation marks, as Python's csv module writes them.
    assert!(
        texts[0].ends_with(", \"quoted\", and a comma"),
        "{}",
        texts[0]
    );
    // The column by its 0-based index reads the same.
    let by_index = load(&format!("{}#text=1#label=2", spec("csv", "reviews.csv")));
    assert_eq!(by_index.train, reviews.train);

    let topics = load(&spec("jsonl", "topics"));
    assert_eq!(topics.class_names, ["sport", "tech"]);
    assert_eq!(
        (topics.train.as_ref().unwrap().len(), topics.test.len()),
        (40, 12)
    );
}

/// `data split --rng authors` on a folder: numpy's `default_rng(seed).choice(N, k,
/// replace=False)` over the N training images in the documented order (the fixture script drew it).
#[test]
fn authors_split_on_a_folder_is_numpys_choice() {
    let cache = tempfile::tempdir().unwrap();
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(own("images_pool.expected.json")).unwrap()).unwrap();
    let drawn = cache.path().join("drawn.json");
    let out = benign(
        &[
            "data",
            "split",
            "--dataset",
            &spec("folder", "images_pool"),
            "--rng",
            "authors",
            "--seed",
            &expected["seed"].to_string(),
            "--pretrain-n",
            &expected["pretrain_n"].to_string(),
            "--n",
            &expected["n"].to_string(),
            "--eta",
            "0",
            "--out",
            drawn.to_str().unwrap(),
        ],
        cache.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(drawn).unwrap()).unwrap();
    let ours: Vec<serde_json::Value> = [&rows["pretrain_indices"], &rows["finetune_indices"]]
        .iter()
        .flat_map(|v| v.as_array().unwrap().clone())
        .collect();
    assert_eq!(&ours, expected["choice"].as_array().unwrap());
}

/// What a quick run of `spec` leaves: its summary.
fn quick_run(spec: &str, extra: &[&str], out: &Path, cache: &Path) -> serde_json::Value {
    let mut args = vec![
        "finetune",
        "--dataset",
        spec,
        "--pretrain-n",
        "8",
        "--n",
        "8",
        "--test-n",
        "8",
        "--pretrain-epochs",
        "2",
        "--epochs",
        "2",
        "--eval-every",
        "1",
        "--eta",
        "0.25",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    let run = benign(&args, cache);
    assert!(run.status.success(), "{spec}: {}", stderr(&run));
    serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn every_source_runs_finetune_end_to_end() {
    let test = "every_source_runs_finetune_end_to_end";
    if common::models_root(test).is_none() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let sources: [(String, &[&str], &[&str]); 4] = [
        (spec("folder", "images_split"), &[], &["cat", "dog"]),
        (spec("folder", "images_pool"), &[], &["2", "7", "10"]),
        (
            spec("csv", "reviews.csv"),
            &["--text-column", "review", "--label-column", "stars"],
            &["1", "2", "3"],
        ),
        (spec("jsonl", "topics"), &[], &["sport", "tech"]),
    ];
    for (k, (source, extra, classes)) in sources.iter().enumerate() {
        let folder = out.path().join(k.to_string());
        let summary = quick_run(source, extra, &folder, cache.path());
        let recorded = summary["config"]["dataset"].as_str().unwrap();
        assert!(recorded.starts_with(source.as_str()), "{recorded}");
        assert_eq!(summary["config"]["data_digest"].as_str().unwrap().len(), 16);
        assert_eq!(
            summary["resolved"]["class_names"],
            serde_json::json!(classes)
        );
        assert!(summary["final"]["test_acc"].as_f64().is_some(), "{summary}");
    }
    // The column flags are part of the dataset the run records.
    let csv = quick_run(
        &spec("csv", "reviews.csv"),
        &["--text-column", "review", "--label-column", "stars"],
        &out.path().join("csv"),
        cache.path(),
    );
    assert!(
        csv["config"]["dataset"]
            .as_str()
            .unwrap()
            .ends_with("reviews.csv#text=review#label=stars")
    );
}

/// A run folder made on a folder's files is refused when the files change: replaying its
/// config.json, or resuming it.
#[test]
fn a_run_on_files_that_changed_is_refused() {
    let test = "a_run_on_files_that_changed_is_refused";
    if common::models_root(test).is_none() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join("topics");
    std::fs::create_dir(&copy).unwrap();
    for file in ["train.jsonl", "test.jsonl"] {
        std::fs::copy(own("topics").join(file), copy.join(file)).unwrap();
    }
    let source = format!("jsonl:{}", copy.display());
    let run = work.path().join("run");
    quick_run(&source, &[], &run, cache.path());
    let mut test_file = std::fs::read_to_string(copy.join("test.jsonl")).unwrap();
    test_file.push_str("{\"text\": \"one more\", \"label\": \"tech\"}\n");
    std::fs::write(copy.join("test.jsonl"), test_file).unwrap();
    let config = run.join("config.json");
    for args in [
        vec!["finetune", "--config", config.to_str().unwrap()],
        vec![
            "finetune",
            "--config",
            config.to_str().unwrap(),
            "--out",
            run.to_str().unwrap(),
            "--resume",
        ],
    ] {
        let out = benign(&args, cache.path());
        let err = stderr(&out);
        assert!(!out.status.success());
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains("the files changed since this run was configured"),
            "{err}"
        );
    }
}

/// One class, an empty class folder, an image that does not decode, a missing column, a label
/// column of mixed kinds, a missing file: one line naming the file, exit non-zero, no run folder.
#[test]
fn bad_sources_are_one_line_and_leave_nothing() {
    let cache = tempfile::tempdir().unwrap();
    let bad = tempfile::tempdir().unwrap();
    let root = bad.path();
    let png = own("images_split/train/cat/cat_00.png");
    let mkdir = |p: &str| std::fs::create_dir_all(root.join(p)).unwrap();
    let copy = |to: &str| {
        std::fs::copy(&png, root.join(to)).unwrap();
    };
    mkdir("one/cat");
    copy("one/cat/a.png");
    mkdir("empty/cat");
    mkdir("empty/dog");
    copy("empty/cat/a.png");
    mkdir("undecodable/cat");
    mkdir("undecodable/dog");
    copy("undecodable/cat/a.png");
    std::fs::write(root.join("undecodable/dog/b.png"), "not a png").unwrap();
    std::fs::write(root.join("no_text.csv"), "review,label\ngood,1\nbad,2\n").unwrap();
    std::fs::write(
        root.join("mixed.jsonl"),
        "{\"text\": \"a\", \"label\": 1}\n{\"text\": \"b\", \"label\": \"two\"}\n",
    )
    .unwrap();
    let cases = [
        ("folder:one", "one class only (cat)"),
        ("folder:empty", "empty/dog: an empty class folder"),
        ("folder:undecodable", "undecodable/dog/b.png: not an image"),
        ("csv:no_text.csv", "no_text.csv: no column \"text\""),
        (
            "jsonl:mixed.jsonl",
            "mixes integers (mixed.jsonl line 1: 1) and words (mixed.jsonl line 2: \"two\")",
        ),
        ("csv:absent.csv", "absent.csv: no such file"),
    ];
    for (source, expected) in cases {
        let (kind, path) = source.split_once(':').unwrap();
        let source = format!("{kind}:{}", root.join(path).display());
        let out_dir = root.join("out");
        let out = benign(
            &[
                "finetune",
                "--dataset",
                &source,
                "--eta",
                "0.2",
                "--out",
                out_dir.to_str().unwrap(),
            ],
            cache.path(),
        );
        let err = stderr(&out);
        assert!(!out.status.success(), "{source}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(expected), "{source}: {err}");
        assert!(!out_dir.exists(), "{source}: left {}", out_dir.display());
    }
}

/// `data verify` reads a source whole and says ok or why not; `data list` lists a source with its
/// classes and digest.
#[test]
fn data_list_and_verify_show_a_source() {
    let cache = tempfile::tempdir().unwrap();
    let folder = spec("folder", "images_split");
    let verify = benign(&["data", "verify", &folder], cache.path());
    let stdout = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "{stdout}{}", stderr(&verify));
    assert!(
        stdout.contains("24 train, 8 test, complete; 2 classes (cat, dog); digest ")
            && stdout.trim_end().ends_with(": ok"),
        "{stdout}"
    );
    let list = benign(&["data", "list", &spec("jsonl", "topics")], cache.path());
    let stdout = String::from_utf8_lossy(&list.stdout);
    assert!(
        stdout.contains("40 train, 12 test, complete; 2 classes (sport, tech)"),
        "{stdout}"
    );
}
