//! The loaders on the real release files of the offline mirror. The data root is found the way
//! the program finds it (`BENIGN_DATA_DIR`, else ./datasets); `.ci/run` points it at the mirror.

use std::path::PathBuf;
use std::process::Command;

use benign_attention::data::noise::NoiseModel;
use benign_attention::data::prepare::{NoiseSpec, prepare};
use benign_attention::data::split::SplitPlan;
use benign_attention::data::{self, DatasetName, Inputs, cifar10n};
use benign_attention::rng::RngChoice;

fn root() -> PathBuf {
    let root = data::data_root(None);
    assert!(
        root.join("mnist").is_dir(),
        "no datasets under {}: set BENIGN_DATA_DIR to the offline data mirror (.ci/run uses ../shared/data)",
        root.display()
    );
    root
}

fn load(name: DatasetName) -> data::Dataset {
    data::load(&name, &root()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn mnist_counts_and_class_histogram() {
    let mnist = load(DatasetName::Mnist);
    let train = mnist.train.as_ref().unwrap();
    assert_eq!(train.len(), 60_000);
    assert_eq!(
        train.class_counts(10),
        [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    );
    assert_eq!(mnist.test.len(), 10_000);
    let Inputs::Images(images) = &train.inputs else {
        panic!("images expected")
    };
    assert_eq!((images.channels, images.height, images.width), (1, 28, 28));
}

#[test]
fn cifar10_partial_batches_load_with_warnings() {
    let cifar = load(DatasetName::Cifar10);
    let train = cifar.train.as_ref().unwrap();
    assert_eq!(train.len(), 8068);
    assert_eq!(cifar.test.len(), 1017);
    // data_batch_1 holds the first 4000 records of the release.
    let batch1: Vec<usize> = (0..train.len())
        .filter(|&i| train.release_index[i] < 10_000)
        .collect();
    assert_eq!(batch1.len(), 4000);
    assert_eq!(
        train.subset(&batch1).class_counts(10),
        [396, 366, 420, 384, 422, 393, 414, 385, 407, 413]
    );
    assert_eq!(
        train.release_index[4000], 10_000,
        "batch 2 starts at release index 10000"
    );
    assert_eq!(cifar.warnings.len(), 6, "{:?}", cifar.warnings);
    assert!(
        cifar.warnings[0].contains("data_batch_1.bin: 4000 of 10000 records"),
        "{}",
        cifar.warnings[0]
    );
}

#[test]
fn trec_counts_and_latin1() {
    let trec = load(DatasetName::Trec);
    let train = trec.train.as_ref().unwrap();
    let counts = train.class_counts(6);
    let by_name = |name: &str| counts[trec.class_names.iter().position(|c| c == name).unwrap()];
    assert_eq!(
        [
            by_name("ABBR"),
            by_name("DESC"),
            by_name("ENTY"),
            by_name("HUM"),
            by_name("LOC"),
            by_name("NUM")
        ],
        [86, 1162, 1250, 1223, 835, 896]
    );
    assert_eq!(trec.test.len(), 500);
    let Inputs::Texts(texts) = &train.inputs else {
        panic!("texts expected")
    };
    assert!(
        texts[65].ends_with("sisterðcity with Los Angeles ?"),
        "{}",
        texts[65]
    );
}

#[test]
fn ag_news_test_only() {
    let ag = load(DatasetName::AgNews);
    assert!(ag.train.is_none());
    assert_eq!(ag.test.class_counts(4), [1900; 4]);
    assert_eq!(ag.class_names, ["World", "Sports", "Business", "Sci/Tech"]);
    let Inputs::Texts(texts) = &ag.test.inputs else {
        panic!()
    };
    assert!(
        texts[0].starts_with("Fears for T N pension after talks Unions representing"),
        "{}",
        texts[0]
    );
}

#[test]
fn medmnist_splits() {
    let breast = load(DatasetName::BreastMnist);
    let sizes = (
        breast.train.as_ref().unwrap().len(),
        breast.val.as_ref().unwrap().len(),
        breast.test.len(),
    );
    assert_eq!(sizes, (546, 78, 156));
    let pneumonia = load(DatasetName::PneumoniaMnist);
    assert_eq!(pneumonia.train.as_ref().unwrap().len(), 3882);
    assert_eq!(
        (pneumonia.val.as_ref().unwrap().len(), pneumonia.test.len()),
        (524, 624)
    );
}

#[test]
fn cifar10n_clean_labels_match_the_cifar_release() {
    let root = root();
    let cifar = load(DatasetName::Cifar10);
    let train = cifar.train.as_ref().unwrap();
    let annotations = cifar10n::load(
        &root.join("cifar10n").join(cifar10n::FILE_NAME),
        cifar10n::HumanLabels::Aggre,
    )
    .unwrap();
    for (label, &k) in train.labels.iter().zip(&train.release_index) {
        assert_eq!(annotations.clean[k], *label, "release index {k}");
    }
    // Whole-release disagreement rates of the MANIFEST: aggre 9.01 %, worse 40.21 %.
    let rate = |a: &cifar10n::Annotations| {
        a.human.iter().zip(&a.clean).filter(|(h, c)| h != c).count() as f64 / 50_000.0
    };
    assert!((rate(&annotations) - 0.0901).abs() < 5e-4);
    let worse = cifar10n::load(
        &root.join("cifar10n").join(cifar10n::FILE_NAME),
        cifar10n::HumanLabels::Worse,
    )
    .unwrap();
    assert!((rate(&worse) - 0.4021).abs() < 5e-4);
}

#[test]
fn paper_split_with_real_human_noise() {
    let root = root();
    let cifar = load(DatasetName::Cifar10);
    let plan = SplitPlan {
        pretrain_n: 5000,
        n: 1000,
        test_n: Some(500),
        seed: 42,
        carve_train_from_test: None,
        rng: RngChoice::Own,
    };
    let noise = NoiseSpec {
        model: "cifar10n:worse".parse::<NoiseModel>().unwrap(),
        eta: 0.0,
        seed: 42,
    };
    let prepared = prepare(&cifar, &plan, &noise, &root).unwrap();
    assert_eq!(
        (
            prepared.pretrain.len(),
            prepared.finetune.len(),
            prepared.test.len()
        ),
        (5000, 1000, 500)
    );
    // The realised rate of the worst annotation on 1000 images: 40 % ± 5 %.
    assert!(
        (prepared.labels.rate() - 0.40).abs() < 0.05,
        "realised η {}",
        prepared.labels.rate()
    );
    for i in 0..1000 {
        assert_eq!(
            prepared.labels.noisy_mask[i],
            prepared.finetune.labels[i] != prepared.labels.clean_labels[i]
        );
    }
    // AG-news: no training split unless carved.
    let ag = load(DatasetName::AgNews);
    let noise = NoiseSpec {
        model: NoiseModel::Symmetric,
        eta: 0.2,
        seed: 1,
    };
    let plan = SplitPlan {
        pretrain_n: 3000,
        n: 200,
        test_n: None,
        seed: 1,
        carve_train_from_test: None,
        rng: RngChoice::Own,
    };
    let err = prepare(&ag, &plan, &noise, &root).unwrap_err().to_string();
    assert!(err.contains("--carve-train-from-test"), "{err}");
    let carved = prepare(
        &ag,
        &SplitPlan {
            carve_train_from_test: Some(0.5),
            ..plan
        },
        &noise,
        &root,
    )
    .unwrap();
    assert_eq!(carved.test.len(), 3800);
    assert_eq!(carved.partition.deviations.len(), 1);
}

fn benign(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.code().is_some());
    out
}

#[test]
fn data_list_reports_completeness() {
    root();
    let out = benign(&["data", "list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "mnist: 60000/60000 train, 10000/10000 test, complete",
        "cifar10: 8068/50000 train, 1017/10000 test, partial",
        "pneumoniamnist: 3882/4708 train, 524/524 val, 624/624 test, partial",
        "breastmnist: 546/546 train, 78/78 val, 156/156 test, complete",
        "ag_news: 0/120000 train (missing), 7600/7600 test, partial",
        "trec: 5452/5452 train, 500/500 test, complete",
        "cifar10n: 50000/50000 annotations, complete",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing line {line:?} in:\n{text}"
        );
    }
}

#[test]
fn data_verify_flags_the_unofficial_pneumoniamnist() {
    root();
    let out = benign(&["data", "verify", "pneumoniamnist", "breastmnist", "mnist"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("pneumoniamnist: medmnist/pneumoniamnist.npz: MISMATCH: md5"),
        "{text}"
    );
    assert!(
        text.contains("breastmnist: medmnist/breastmnist.npz: ok"),
        "{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("mnist:") && l.ends_with(": ok"))
            .count(),
        4,
        "{text}"
    );
    let out = benign(&["data", "verify", "trec"]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn data_split_prints_a_summary() {
    root();
    let out = benign(&[
        "data",
        "split",
        "--dataset",
        "trec",
        "--pretrain-n",
        "3000",
        "--n",
        "200",
        "--eta",
        "0.2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["pretrain"]["count"], 3000);
    assert_eq!(summary["finetune"]["count"], 200);
    assert_eq!(summary["test"]["count"], 500);
    let noisy = summary["noisy"].as_u64().unwrap();
    assert!((20..=60).contains(&noisy), "{noisy} noisy of 200 at η 0.2");
    let out = benign(&[
        "data",
        "split",
        "--dataset",
        "trec",
        "--pretrain-n",
        "6000",
        "--n",
        "200",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("exceeds the 5452") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn a_truncated_real_gzip_is_an_error_naming_the_file() {
    let source = root().join("mnist");
    let dir = tempfile::tempdir().unwrap();
    let mnist = dir.path().join("mnist");
    std::fs::create_dir(&mnist).unwrap();
    for f in [
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
        "train-images-idx3-ubyte.gz",
    ] {
        std::fs::copy(source.join(f), mnist.join(f)).unwrap();
    }
    let labels = std::fs::read(source.join("train-labels-idx1-ubyte.gz")).unwrap();
    std::fs::write(
        mnist.join("train-labels-idx1-ubyte.gz"),
        &labels[..labels.len() / 2],
    )
    .unwrap();
    let err = data::load(&DatasetName::Mnist, dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("train-labels-idx1-ubyte.gz") && err.contains("truncated or corrupt gzip"),
        "{err}"
    );
}
