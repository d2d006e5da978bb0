//! Datasets a user brings (docs/data.md, "Your own data") on fixtures written by the tools a user
//! would write them with (tests/fixtures/own/, scripts/make_own_fixtures.py: Pillow's PNG and
//! JPEG files, Python's csv and json modules, the `datasets` library's Parquet files): each loads
//! in its documented order and runs `finetune` end to end; an `hf:` dataset comes from a loopback
//! hub, is cached, and runs offline; `--rng authors` on a folder draws numpy's rows; bad input is
//! one line and leaves nothing behind; a run on files that changed is refused.

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

    // `datasets`' Parquet files: classes from the ClassLabel feature, images decoded from the
    // Image feature's bytes, alternating labels as the script wrote them.
    let hf = load(&format!("{}#image=img", spec("hf", "hf_images")));
    assert_eq!(hf.class_names, ["ant", "bee"]);
    let train = hf.train.as_ref().unwrap();
    assert_eq!((train.len(), hf.test.len()), (12, 4));
    assert_eq!(train.labels, [0, 1].repeat(6));
    let Inputs::Images(images) = &train.inputs else {
        panic!("not images")
    };
    assert_eq!((images.channels, images.height, images.width), (3, 16, 16));
    // Class 0 is dark (50 ± 30), class 1 light (200 ± 30): the bytes decoded are the pixels.
    assert!(images.image(0).iter().all(|&p| (20..80).contains(&p)));
    assert!(images.image(1).iter().all(|&p| (170..230).contains(&p)));
    // Other splits by name: here the two swapped.
    let swapped = load(&format!(
        "{}#image=img#train=test#test=train",
        spec("hf", "hf_images")
    ));
    assert_eq!(
        (swapped.train.as_ref().unwrap().len(), swapped.test.len()),
        (4, 12)
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
    let mut args = common::quick_finetune_args(spec, out);
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = benign(&args, cache);
    assert!(run.status.success(), "{spec}: {}", stderr(&run));
    summary_of(out)
}

#[test]
fn every_source_runs_finetune_end_to_end() {
    let test = "every_source_runs_finetune_end_to_end";
    if common::models_root(test).is_none() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let sources: [(String, &[&str], &[&str]); 5] = [
        (spec("folder", "images_split"), &[], &["cat", "dog"]),
        (spec("folder", "images_pool"), &[], &["2", "7", "10"]),
        (
            spec("csv", "reviews.csv"),
            &["--text-column", "review", "--label-column", "stars"],
            &["1", "2", "3"],
        ),
        (spec("jsonl", "topics"), &[], &["sport", "tech"]),
        (
            format!("{}#image=img", spec("hf", "hf_images")),
            &[],
            &["ant", "bee"],
        ),
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
        common::assert_one_error_line(
            "changed files",
            &out,
            &["the files changed since this run was configured"],
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
    for split in ["train", "test"] {
        let file = format!("hf_images/default/{split}/0000.parquet");
        mkdir(&format!("hf_images/default/{split}"));
        std::fs::copy(own(&file), root.join(&file)).unwrap();
    }
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
            "mixes integers (mixed.jsonl line 1: \"1\") and words (mixed.jsonl line 2: \"two\")",
        ),
        ("csv:absent.csv", "absent.csv: no such file"),
        (
            "hf:hf_images#image=picture",
            "default/train/0000.parquet: no image column \"picture\" (its columns: \"img\", \"label\")",
        ),
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
        common::assert_one_error_line(&source, &out, &[expected]);
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
    // A pool too small to hold a test sample out says why, once.
    let small = cache.path().join("small.csv");
    std::fs::write(&small, "text,label\na b,x\nc d,y\ne f,x\n").unwrap();
    let small = format!("csv:{}", small.display());
    let verify = benign(&["data", "verify", &small], cache.path());
    let stdout = String::from_utf8_lossy(&verify.stdout);
    assert_eq!(verify.status.code(), Some(1), "{stdout}");
    assert_eq!(stdout.matches(small.as_str()).count(), 1, "{stdout}");
    assert!(
        stdout.contains("nothing is held out for a test split"),
        "{stdout}"
    );
    let list = benign(&["data", "list", &spec("jsonl", "topics")], cache.path());
    let stdout = String::from_utf8_lossy(&list.stdout);
    assert!(
        stdout.contains("40 train, 12 test, complete; 2 classes (sport, tech)"),
        "{stdout}"
    );
}

const COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";
const HUB_REPO: &str = "org/tiny-images";

/// A loopback hub serving tests/fixtures/own/hf_images as the dataset `org/tiny-images` the way
/// the hub serves a dataset's Parquet revision: the API's listing of `refs/convert/parquet`, and
/// each file under `datasets/<id>/resolve/refs%2Fconvert%2Fparquet/` with its commit and etag.
fn parquet_hub() -> (common::http::Server, tempfile::TempDir) {
    use common::http::{Route, Server};
    let scratch = tempfile::tempdir().unwrap();
    let server = Server::start(scratch.path().join("empty"));
    let files = ["default/train/0000.parquet", "default/test/0000.parquet"];
    let listing = serde_json::json!({
        "id": HUB_REPO,
        "sha": COMMIT,
        "siblings": [{"rfilename": ".gitattributes"}, {"rfilename": files[0]}, {"rfilename": files[1]}],
    });
    let listing_file = scratch.path().join("listing.json");
    std::fs::write(&listing_file, listing.to_string()).unwrap();
    server.route(
        &format!("api/datasets/{HUB_REPO}/revision/refs%2Fconvert%2Fparquet"),
        Route::File {
            path: listing_file,
            headers: Vec::new(),
        },
    );
    for file in files {
        let path = own("hf_images").join(file);
        let sha = benign_attention::io::hex(&<sha2::Sha256 as sha2::Digest>::digest(
            std::fs::read(&path).unwrap(),
        ));
        server.route(
            &format!("datasets/{HUB_REPO}/resolve/refs%2Fconvert%2Fparquet/{file}"),
            Route::File {
                path,
                headers: vec![
                    ("x-repo-commit".into(), COMMIT.into()),
                    ("ETag".into(), format!("\"{sha}\"")),
                ],
            },
        );
    }
    (server, scratch)
}

/// The binary with `args`, its hub at `endpoint` (none: offline), its caches under `home`.
fn benign_hub(args: &[&str], home: &Path, endpoint: Option<&str>) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_benign-attention"));
    command
        .args(args)
        .env("BENIGN_CACHE_DIR", home.join("features"))
        .env("HF_HOME", home.join("hf"))
        .env_remove("HF_HUB_OFFLINE");
    match endpoint {
        Some(url) => command.env("HF_ENDPOINT", url),
        None => command.env("HF_HUB_OFFLINE", "1"),
    };
    command.output().unwrap()
}

fn summary_of(folder: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(folder.join("summary.json")).unwrap()).unwrap()
}

/// `finetune --dataset hf:org/name` downloads the Parquet files into the hub cache in hf-hub's
/// layout and runs; offline, with the files in place, it runs without a request; an id the hub
/// does not have is one line.
#[test]
fn a_hub_dataset_downloads_caches_and_runs_offline() {
    let test = "a_hub_dataset_downloads_caches_and_runs_offline";
    if common::models_root(test).is_none() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let (server, _scratch) = parquet_hub();
    let source = format!("hf:{HUB_REPO}#image=img");
    let run = |folder: &str, endpoint: Option<&str>| {
        let args = common::quick_finetune_args(&source, &home.path().join(folder));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = benign_hub(&args, home.path(), endpoint);
        assert!(out.status.success(), "{folder}: {}", stderr(&out));
        summary_of(&home.path().join(folder))
    };
    let online = run("online", Some(&server.url));
    // Configuration, set-up and load resolve the files; the hub is listed once.
    let listings = server
        .requests()
        .iter()
        .filter(|r| r.path.starts_with("api/"))
        .count();
    assert_eq!(listings, 1);
    let snapshot = home
        .path()
        .join("hf/hub/datasets--org--tiny-images/snapshots")
        .join(COMMIT);
    for file in ["default/train/0000.parquet", "default/test/0000.parquet"] {
        assert_eq!(
            std::fs::read(snapshot.join(file)).unwrap(),
            std::fs::read(own("hf_images").join(file)).unwrap(),
            "{file}"
        );
    }
    assert_eq!(online["config"]["dataset"], source.as_str());
    assert_eq!(
        online["resolved"]["class_names"],
        serde_json::json!(["ant", "bee"])
    );

    // `data fetch` asks the hub again and finds both files present (nothing downloaded twice).
    let fetch = benign_hub(&["data", "fetch", &source], home.path(), Some(&server.url));
    assert!(fetch.status.success(), "{}", stderr(&fetch));
    assert!(String::from_utf8_lossy(&fetch.stdout).contains(": 2 Parquet files present"));
    let requests = server.requests().len();
    let offline = run("offline", None);
    assert_eq!(server.requests().len(), requests, "offline asked the hub");
    // The same files, so the same run: equal digests and numbers.
    assert_eq!(offline["config"], online["config"]);
    assert_eq!(offline["final"], online["final"]);

    let absent = benign_hub(
        &[
            "finetune",
            "--dataset",
            "hf:org/absent#image=img",
            "--eta",
            "0.2",
        ],
        home.path(),
        Some(&server.url),
    );
    common::assert_one_error_line(
        "absent hub id",
        &absent,
        &["hf:org/absent#image=img: no such dataset on http://127.0.0.1"],
    );
}

/// TREC written out as `jsonl:` files (each split in the release's order, labels as their class
/// indices, so that the documented numeric order is TREC's own) runs as `--dataset trec` does:
/// the same split, the same texts, the same numbers. What the `jsonl:` path adds (reading,
/// classes, digest) changes nothing it should not.
#[test]
fn trec_as_jsonl_runs_as_trec_does() {
    let test = "trec_as_jsonl_runs_as_trec_does";
    let Some((root, _)) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let trec = data::load(&DatasetName::Trec, &root).unwrap();
    let work = tempfile::tempdir().unwrap();
    let copy = work.path().join("trec");
    std::fs::create_dir(&copy).unwrap();
    for (file, split) in [
        ("train", trec.train.as_ref().unwrap()),
        ("test", &trec.test),
    ] {
        let Inputs::Texts(texts) = &split.inputs else {
            panic!("not texts")
        };
        let lines: Vec<String> = texts
            .iter()
            .zip(&split.labels)
            .map(|(text, label)| serde_json::json!({"text": text, "label": label}).to_string())
            .collect();
        std::fs::write(copy.join(format!("{file}.jsonl")), lines.join("\n") + "\n").unwrap();
    }
    let cache = tempfile::tempdir().unwrap();
    let run = |dataset: &str, out: &str| {
        let out = work.path().join(out);
        let mut args = common::quick_finetune_args(dataset, &out);
        args.extend(["--data-dir".into(), root.to_str().unwrap().into()]);
        // Sizes above quick_args' own: the later flag would be refused, so they are replaced.
        for (flag, value) in [("--n", "12"), ("--pretrain-n", "40"), ("--test-n", "40")] {
            let at = args.iter().position(|a| a == flag).unwrap();
            args[at + 1] = value.into();
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = benign(&args, cache.path());
        assert!(output.status.success(), "{dataset}: {}", stderr(&output));
        summary_of(&out)
    };
    let built_in = run("trec", "built_in");
    let own = run(&format!("jsonl:{}", copy.display()), "own");
    assert_eq!(
        own["resolved"]["class_names"],
        serde_json::json!(["0", "1", "2", "3", "4", "5"])
    );
    for key in ["baseline_test_acc", "reset_test_acc", "final", "snr"] {
        assert!(!built_in[key].is_null(), "{key}: {built_in}");
        assert_eq!(own[key], built_in[key], "{key}");
    }
}

/// `reproduce` takes sources in its `--datasets` list (a spec's options are set apart by `#`, so
/// it stays one item): the grid runs and its report names each source.
#[test]
fn a_grid_of_sources_runs_and_reports() {
    let test = "a_grid_of_sources_runs_and_reports";
    if common::models_root(test).is_none() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let images = spec("folder", "images_split");
    let reviews = format!("{}#text=review#label=stars", spec("csv", "reviews.csv"));
    let datasets = format!("{images},{reviews}");
    let grid = benign(
        &[
            "reproduce",
            "table2",
            "--datasets",
            &datasets,
            "--budget",
            "quick",
            "--seeds",
            "42",
            "--ns",
            "8",
            "--etas",
            "0,0.2",
            "--out",
            out.path().to_str().unwrap(),
        ],
        cache.path(),
    );
    let stdout = String::from_utf8_lossy(&grid.stdout);
    assert!(grid.status.success(), "{stdout}{}", stderr(&grid));
    let said = stderr(&grid);
    assert!(
        said.contains("4 runs done, 0 were already finished, 0 failed"),
        "{said}"
    );
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    for source in [&images, &reviews] {
        assert!(report.contains(&format!("| {source} |")), "{source}");
    }
    let runs: Vec<String> = std::fs::read_dir(out.path().join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        runs.iter()
            .filter(|r| r.starts_with("csv-reviews-"))
            .count()
            == 2
            && runs
                .iter()
                .filter(|r| r.starts_with("folder-images_split-"))
                .count()
                == 2,
        "{runs:?}"
    );
}

/// The emulator of `parquet_hub` read by hf-hub's own client (its repository listing and its
/// download of a dataset revision), and the cache this program fills read back by hf-hub's own
/// cache reader: both sides of the protocol are checked against the reference client, not only
/// against this program's reading of it.
#[test]
fn hf_hubs_own_client_reads_the_dataset_emulator_and_our_cache() {
    let (server, _scratch) = parquet_hub();
    let repo = || {
        hf_hub::Repo::with_revision(
            HUB_REPO.into(),
            hf_hub::RepoType::Dataset,
            "refs/convert/parquet".into(),
        )
    };
    let theirs = tempfile::tempdir().unwrap();
    let api = hf_hub::api::sync::ApiBuilder::from_cache(hf_hub::Cache::new(theirs.path().into()))
        .with_endpoint(server.url.clone())
        .with_progress(false)
        .build()
        .unwrap();
    let listed: Vec<String> = api
        .repo(repo())
        .info()
        .unwrap()
        .siblings
        .into_iter()
        .map(|s| s.rfilename)
        .collect();
    assert!(
        listed.contains(&"default/train/0000.parquet".to_string()),
        "{listed:?}"
    );
    let file = api.repo(repo()).get("default/train/0000.parquet").unwrap();
    assert_eq!(
        std::fs::read(file).unwrap(),
        std::fs::read(own("hf_images/default/train/0000.parquet")).unwrap()
    );

    // This program's download, read back through hf-hub's cache.
    let home = tempfile::tempdir().unwrap();
    let fetch = benign_hub(
        &["data", "fetch", &format!("hf:{HUB_REPO}#image=img")],
        home.path(),
        Some(&server.url),
    );
    assert!(fetch.status.success(), "{}", stderr(&fetch));
    let cache = hf_hub::Cache::new(home.path().join("hf/hub"));
    for name in ["default/train/0000.parquet", "default/test/0000.parquet"] {
        let cached = cache
            .repo(repo())
            .get(name)
            .unwrap_or_else(|| panic!("{name}"));
        assert_eq!(
            std::fs::read(cached).unwrap(),
            std::fs::read(own("hf_images").join(name)).unwrap()
        );
    }
}
