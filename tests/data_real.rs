//! The loaders on real release files. The data root is found the way the program finds it
//! (`BENIGN_DATA_DIR`, else ./datasets); `.ci/run` points it at the offline mirror. Without one,
//! every test here says on stderr that it was skipped (a failure under `BENIGN_REQUIRE_DATA=1`).
//!
//! The assertions hold on any honest copy, complete or partial: the tests count the records of the
//! files themselves (by size, by rows, from the npy headers) and hash them, and check the loaders,
//! `data list` and `data verify` against that and against the manifests of datasets/*.toml.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use benign_attention::data::catalog::{self, Completeness, FileStatus};
use benign_attention::data::noise::NoiseModel;
use benign_attention::data::prepare::{NoiseSpec, prepare};
use benign_attention::data::split::SplitPlan;
use benign_attention::data::{self, DatasetName, Inputs, Split, cifar10n};
use benign_attention::rng::RngChoice;
use md5::Md5;
use sha2::{Digest, Sha256};

mod common;

fn load(name: DatasetName, root: &Path) -> data::Dataset {
    data::load(&name, root).unwrap_or_else(|e| panic!("{e}"))
}

/// The official record count of `split` (datasets/<name>.toml).
fn official(name: &str, split: &str) -> usize {
    catalog::manifest(name).unwrap().expected[split]
}

fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn md5_hex(bytes: &[u8]) -> String {
    format!("{:x}", Md5::digest(bytes))
}

/// Whether the file at `path` is the official one of `name`'s manifest: every checksum and size
/// the manifest gives for `file` matches (computed here, not by the library).
fn is_official(name: &str, file: &str, path: &Path) -> bool {
    let manifest = catalog::manifest(name).unwrap();
    let entry = manifest.files.iter().find(|f| f.path == file).unwrap();
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    entry.md5.as_ref().is_none_or(|m| *m == md5_hex(&bytes))
        && entry
            .sha256
            .as_ref()
            .is_none_or(|s| *s == sha256_hex(&bytes))
        && entry.bytes.is_none_or(|b| b == bytes.len() as u64)
}

fn texts(split: &Split) -> &[String] {
    let Inputs::Texts(texts) = &split.inputs else {
        panic!("texts expected")
    };
    texts
}

fn images(split: &Split) -> &data::ImageSet {
    let Inputs::Images(images) = &split.inputs else {
        panic!("images expected")
    };
    images
}

// ---- The files read here, without the loaders ----

/// An IDX file of the MNIST folder, `<base>.gz` or `<base>`, gunzipped.
fn idx_bytes(dir: &Path, base: &str) -> Option<Vec<u8>> {
    let gz = dir.join(format!("{base}.gz"));
    let raw = std::fs::read(&gz)
        .or_else(|_| std::fs::read(dir.join(base)))
        .ok()?;
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Some(raw);
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&raw[..])
        .read_to_end(&mut out)
        .unwrap();
    Some(out)
}

/// (label bytes, image bytes) of an MNIST split ("train" or "t10k"), counted by size: 8-byte
/// label header, 16-byte image header, 784 bytes per image.
fn mnist_records(dir: &Path, prefix: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    let labels = idx_bytes(dir, &format!("{prefix}-labels-idx1-ubyte"))?;
    let images = idx_bytes(dir, &format!("{prefix}-images-idx3-ubyte"))?;
    let (labels, images) = (labels[8..].to_vec(), images[16..].to_vec());
    assert_eq!(
        images.len() % 784,
        0,
        "{prefix} images: not whole 28×28 records"
    );
    assert_eq!(
        images.len() / 784,
        labels.len(),
        "{prefix}: images vs labels"
    );
    Some((labels, images))
}

const CIFAR_RECORD: usize = 3073;
const CIFAR_TRAIN: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];

/// The records of a CIFAR-10 batch file (1 label byte + 3072 pixel bytes each), by size.
fn cifar_records(root: &Path, file: &str) -> Option<Vec<u8>> {
    let bytes = std::fs::read(root.join("cifar10/cifar-10-batches-bin").join(file)).ok()?;
    assert_eq!(
        bytes.len() % CIFAR_RECORD,
        0,
        "{file}: not whole {CIFAR_RECORD}-byte records"
    );
    Some(bytes)
}

/// (shape, data bytes) of array `name` of an .npz, from its npy header.
fn npy(npz: &Path, name: &str) -> Option<(Vec<usize>, Vec<u8>)> {
    let mut archive = zip::ZipArchive::new(std::fs::File::open(npz).ok()?).unwrap();
    let mut bytes = Vec::new();
    archive
        .by_name(&format!("{name}.npy"))
        .ok()?
        .read_to_end(&mut bytes)
        .unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{}: {name}", npz.display());
    let (len_bytes, header_len) = if bytes[6] == 1 {
        (2, u16::from_le_bytes([bytes[8], bytes[9]]) as usize)
    } else {
        (
            4,
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
        )
    };
    let start = 8 + len_bytes + header_len;
    let header = std::str::from_utf8(&bytes[8 + len_bytes..start]).unwrap();
    let shape: Vec<usize> = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    Some((shape, bytes[start..].to_vec()))
}

/// (label, title + " " + description) of every row of an AG-news CSV.
fn ag_rows(path: &Path) -> Option<Vec<(u32, String)>> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_path(path)
        .ok()?;
    Some(
        reader
            .records()
            .map(|r| {
                let r = r.unwrap();
                (
                    r[0].parse::<u32>().unwrap() - 1,
                    format!("{} {}", &r[1], &r[2]),
                )
            })
            .collect(),
    )
}

/// (coarse label, question) of every non-blank line of a TREC file, decoded as Latin-1.
fn trec_lines(path: &Path) -> Option<Vec<(String, String)>> {
    let text: String = std::fs::read(path)
        .ok()?
        .iter()
        .map(|&b| char::from(b))
        .collect();
    Some(
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let (label, question) = l.split_once(' ').unwrap();
                (
                    label.split(':').next().unwrap().to_string(),
                    question.to_string(),
                )
            })
            .collect(),
    )
}

/// Records per split of a dataset as its files hold them, counted here; `None` when a file the
/// loader needs is absent.
fn census(name: &DatasetName, root: &Path) -> Option<Vec<(&'static str, usize)>> {
    Some(match name {
        DatasetName::Mnist => {
            let dir = root.join("mnist");
            vec![
                ("train", mnist_records(&dir, "train")?.0.len()),
                ("test", mnist_records(&dir, "t10k")?.0.len()),
            ]
        }
        DatasetName::Cifar10 => {
            let mut train = 0;
            for file in CIFAR_TRAIN {
                train += cifar_records(root, file)?.len() / CIFAR_RECORD;
            }
            let test = cifar_records(root, "test_batch.bin")?.len() / CIFAR_RECORD;
            vec![("train", train), ("test", test)]
        }
        DatasetName::PneumoniaMnist | DatasetName::BreastMnist => {
            let npz = root.join("medmnist").join(format!("{name}.npz"));
            let mut counts = Vec::new();
            for split in ["train", "val", "test"] {
                counts.push((split, npy(&npz, &format!("{split}_labels"))?.0[0]));
            }
            counts
        }
        DatasetName::AgNews => {
            let dir = root.join("ag_news");
            let test = ag_rows(&dir.join("test.csv"))?.len();
            let train = ag_rows(&dir.join("train.csv")).map_or(0, |rows| rows.len());
            vec![("train", train), ("test", test)]
        }
        DatasetName::Trec => {
            let dir = root.join("trec");
            vec![
                ("train", trec_lines(&dir.join("train_5500.label"))?.len()),
                ("test", trec_lines(&dir.join("TREC_10.label"))?.len()),
            ]
        }
        DatasetName::Stl10 => {
            // Image bytes over 96×96×3; the files are independent of the loader under test.
            let dir = root.join("stl10/stl10_binary");
            let images = |split: &str| {
                std::fs::metadata(dir.join(format!("{split}_X.bin")))
                    .ok()
                    .map(|m| m.len() as usize / (3 * 96 * 96))
            };
            vec![("train", images("train")?), ("test", images("test")?)]
        }
        DatasetName::Sst2 => {
            // Lines after the header.
            let dir = root.join("sst2/SST-2");
            let rows = |file: &str| {
                std::fs::read_to_string(dir.join(file))
                    .ok()
                    .map(|t| t.lines().skip(1).filter(|l| !l.is_empty()).count())
            };
            vec![("train", rows("train.tsv")?), ("test", rows("dev.tsv")?)]
        }
        DatasetName::OtherMedMnist(_) | DatasetName::Own(_) => unreachable!(),
    })
}

/// Every split holds the official count (none holds more).
fn census_complete(name: &DatasetName, counts: &[(&str, usize)]) -> bool {
    counts.iter().all(|&(split, n)| {
        let expected = official(name.id(), split);
        assert!(
            n <= expected,
            "{name} {split}: {n} records, the release has {expected}"
        );
        n == expected
    })
}

/// What the loaded dataset must be: the counts the files hold, within the release's, and its
/// completeness report saying complete exactly when every split is whole.
fn check_counts(dataset: &data::Dataset, root: &Path) {
    let name = &dataset.name;
    let counts = census(name, root).unwrap();
    let report = Completeness::of(dataset);
    let loaded: Vec<(String, usize)> = report
        .splits
        .iter()
        .map(|s| (s.split.clone(), s.present))
        .collect();
    let counted: Vec<(String, usize)> = counts.iter().map(|&(s, n)| (s.into(), n)).collect();
    assert_eq!(loaded, counted, "{name}: loaded vs counted in the files");
    for s in &report.splits {
        assert_eq!(s.expected, Some(official(name.id(), &s.split)), "{name}");
    }
    assert_eq!(report.complete, census_complete(name, &counts), "{name}");
}

// ---- Loaders ----

#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn mnist_counts_and_class_histogram() {
    let test = "data_real::mnist_counts_and_class_histogram";
    let Some(root) = common::data_root_with(test, &["mnist"]) else {
        return;
    };
    let mnist = load(DatasetName::Mnist, &root);
    check_counts(&mnist, &root);
    let train = mnist.train.as_ref().unwrap();
    for (prefix, split) in [("train", train), ("t10k", &mnist.test)] {
        let (labels, pixels) = mnist_records(&root.join("mnist"), prefix).unwrap();
        let labels: Vec<u32> = labels.into_iter().map(u32::from).collect();
        assert_eq!(split.labels, labels, "{prefix}: labels as in the file");
        assert_eq!(
            images(split).pixels,
            pixels,
            "{prefix}: pixels as in the file"
        );
        assert_eq!(split.release_index, (0..split.len()).collect::<Vec<_>>());
    }
    let histogram = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949];
    let counts = train.class_counts(10);
    if train.len() == official("mnist", "train") {
        assert_eq!(counts, histogram, "the release's class histogram");
    } else {
        assert!(
            counts.iter().zip(histogram).all(|(&n, h)| n <= h),
            "{counts:?}"
        );
    }
    let images = images(train);
    assert_eq!((images.channels, images.height, images.width), (1, 28, 28));
}

#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn cifar10_loads_every_record_present_and_warns_of_partial_files() {
    let test = "data_real::cifar10_loads_every_record_present_and_warns_of_partial_files";
    let Some(root) = common::data_root_with(test, &["cifar10"]) else {
        return;
    };
    let cifar = load(DatasetName::Cifar10, &root);
    check_counts(&cifar, &root);
    let mut partial = Vec::new();
    for (split, files) in [
        (cifar.train.as_ref().unwrap(), &CIFAR_TRAIN[..]),
        (&cifar.test, &["test_batch.bin"][..]),
    ] {
        // Batch b's record r is release image b·10000 + r, pixels and label as in the file.
        let (mut k, images) = (0, images(split));
        for (b, file) in files.iter().enumerate() {
            let bytes = cifar_records(&root, file).unwrap();
            let records = bytes.len() / CIFAR_RECORD;
            assert!(records <= 10_000, "{file}: {records} records");
            if records < 10_000 {
                partial.push(format!("{file}: {records} of 10000 records"));
            }
            for (r, record) in bytes.chunks_exact(CIFAR_RECORD).enumerate() {
                assert_eq!(split.release_index[k], b * 10_000 + r, "{file} record {r}");
                assert_eq!(split.labels[k], u32::from(record[0]), "{file} record {r}");
                assert!(images.image(k) == &record[1..], "{file} record {r}: pixels");
                k += 1;
            }
        }
        assert_eq!(k, split.len());
    }
    // One warning per partial file, naming it and its count.
    assert_eq!(cifar.warnings.len(), partial.len(), "{:?}", cifar.warnings);
    for (warning, expected) in cifar.warnings.iter().zip(&partial) {
        assert!(
            warning.contains(expected.as_str()),
            "{warning} vs {expected}"
        );
    }
    // The release's first 4000 training images, wherever a copy holds them.
    let train = cifar.train.as_ref().unwrap();
    let batch1: Vec<usize> = (0..train.len())
        .filter(|&i| train.release_index[i] < 4000)
        .collect();
    if batch1.len() == 4000 {
        assert_eq!(
            train.subset(&batch1).class_counts(10),
            [396, 366, 420, 384, 422, 393, 414, 385, 407, 413]
        );
    }
}

#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn trec_counts_and_latin1() {
    let test = "data_real::trec_counts_and_latin1";
    let Some(root) = common::data_root_with(test, &["trec"]) else {
        return;
    };
    let trec = load(DatasetName::Trec, &root);
    check_counts(&trec, &root);
    let train = trec.train.as_ref().unwrap();
    for (file, split) in [("train_5500.label", train), ("TREC_10.label", &trec.test)] {
        let lines = trec_lines(&root.join("trec").join(file)).unwrap();
        let labels: Vec<&str> = split
            .labels
            .iter()
            .map(|&l| trec.class_names[l as usize].as_str())
            .collect();
        let expected: Vec<&str> = lines.iter().map(|(label, _)| label.as_str()).collect();
        assert_eq!(labels, expected, "{file}: coarse labels");
        let questions: Vec<&str> = lines.iter().map(|(_, q)| q.as_str()).collect();
        assert_eq!(texts(split), questions, "{file}: questions, Latin-1");
    }
    let counts = train.class_counts(6);
    let by_name = |name: &str| counts[trec.class_names.iter().position(|c| c == name).unwrap()];
    let by_name = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"].map(by_name);
    if train.len() == official("trec", "train") {
        assert_eq!(by_name, [86, 1162, 1250, 1223, 835, 896]);
    }
    // The release's one non-ASCII byte (0xF0) is ð in Latin-1, not a UTF-8 error.
    let path = root.join("trec/train_5500.label");
    if is_official("trec", "train_5500.label", &path) {
        let texts = texts(train);
        assert!(
            texts[65].ends_with("sisterðcity with Los Angeles ?"),
            "{}",
            texts[65]
        );
    }
}

#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn ag_news_splits_match_the_files() {
    let test = "data_real::ag_news_splits_match_the_files";
    let Some(root) = common::data_root_with(test, &["ag_news"]) else {
        return;
    };
    let ag = load(DatasetName::AgNews, &root);
    check_counts(&ag, &root);
    let dir = root.join("ag_news");
    let test_rows = ag_rows(&dir.join("test.csv")).unwrap();
    let train_rows = ag_rows(&dir.join("train.csv"));
    for (split, rows, file) in [
        (Some(&ag.test), Some(&test_rows), "test.csv"),
        (ag.train.as_ref(), train_rows.as_ref(), "train.csv"),
    ] {
        let Some(rows) = rows else {
            assert!(split.is_none(), "{file} is absent, yet a split was loaded");
            assert!(
                ag.warnings
                    .iter()
                    .any(|w| w.contains(file) && w.contains("missing")),
                "{:?}",
                ag.warnings
            );
            continue;
        };
        let split = split.unwrap_or_else(|| panic!("{file} is there but was not loaded"));
        let (labels, texts_): (Vec<u32>, Vec<String>) = rows.iter().cloned().unzip();
        assert_eq!(split.labels, labels, "{file}: labels (class − 1)");
        assert_eq!(texts(split), texts_, "{file}: title + \" \" + description");
        let per_class = if file == "test.csv" { 1900 } else { 30_000 };
        if split.len() == 4 * per_class {
            assert_eq!(split.class_counts(4), [per_class; 4], "{file}");
        }
    }
    assert_eq!(ag.class_names, ["World", "Sports", "Business", "Sci/Tech"]);
    if is_official("ag_news", "test.csv", &dir.join("test.csv")) {
        let first = &texts(&ag.test)[0];
        assert!(
            first.starts_with("Fears for T N pension after talks Unions representing"),
            "{first}"
        );
    }
}

#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn medmnist_splits() {
    let test = "data_real::medmnist_splits";
    let Some(root) = common::data_root_with(test, &["medmnist"]) else {
        return;
    };
    for name in [DatasetName::BreastMnist, DatasetName::PneumoniaMnist] {
        let npz = root.join("medmnist").join(format!("{name}.npz"));
        if !npz.is_file() {
            common::skip::<()>(test, &format!("{} is absent", npz.display()));
            continue;
        }
        let dataset = load(name.clone(), &root);
        check_counts(&dataset, &root);
        let splits = [
            ("train", dataset.train.as_ref().unwrap()),
            ("val", dataset.val.as_ref().unwrap()),
            ("test", &dataset.test),
        ];
        for (split, loaded) in splits {
            let (shape, labels) = npy(&npz, &format!("{split}_labels")).unwrap();
            assert_eq!(
                labels.len(),
                shape.iter().product::<usize>(),
                "{name} {split}"
            );
            let labels: Vec<u32> = labels.into_iter().map(u32::from).collect();
            assert_eq!(
                loaded.labels, labels,
                "{name} {split}: labels as in the file"
            );
        }
        // The official file is the whole release.
        if is_official(name.id(), &format!("{name}.npz"), &npz) {
            for (split, loaded) in splits {
                assert_eq!(loaded.len(), official(name.id(), split), "{name} {split}");
            }
        }
    }
}

#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn cifar10n_clean_labels_match_the_cifar_release() {
    let test = "data_real::cifar10n_clean_labels_match_the_cifar_release";
    let Some(root) = common::data_root_with(test, &["cifar10", "cifar10n"]) else {
        return;
    };
    let cifar = load(DatasetName::Cifar10, &root);
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
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn paper_split_with_real_human_noise() {
    let test = "data_real::paper_split_with_real_human_noise";
    let Some(root) = common::data_root_with(test, &["cifar10", "cifar10n"]) else {
        return;
    };
    let cifar = load(DatasetName::Cifar10, &root);
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
    let result = prepare(&cifar, &plan, &noise, &root);
    if cifar.train.as_ref().unwrap().len() < 6000 || cifar.test.len() < 500 {
        let err = result.unwrap_err().to_string();
        assert!(err.contains("exceeds"), "{err}");
        return;
    }
    let prepared = result.unwrap();
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
}

/// AG-news: the training split when the copy has one, else only an explicit carve of the test
/// split, recorded as a deviation.
#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn ag_news_split_needs_a_training_split_or_an_explicit_carve() {
    let test = "data_real::ag_news_split_needs_a_training_split_or_an_explicit_carve";
    let Some(root) = common::data_root_with(test, &["ag_news"]) else {
        return;
    };
    let ag = load(DatasetName::AgNews, &root);
    let noise = NoiseSpec {
        model: NoiseModel::Symmetric,
        eta: 0.2,
        seed: 1,
    };
    let plan = SplitPlan {
        pretrain_n: 300,
        n: 200,
        test_n: None,
        seed: 1,
        carve_train_from_test: None,
        rng: RngChoice::Own,
    };
    let result = prepare(&ag, &plan, &noise, &root);
    match &ag.train {
        None => {
            let err = result.unwrap_err().to_string();
            assert!(err.contains("--carve-train-from-test"), "{err}");
        }
        Some(train) if train.len() < 500 => {
            let err = result.unwrap_err().to_string();
            assert!(err.contains("exceeds"), "{err}");
        }
        Some(_) => {
            let prepared = result.unwrap();
            assert!(prepared.partition.deviations.is_empty());
            assert_eq!(prepared.test.len(), ag.test.len());
        }
    }
    let carved = prepare(
        &ag,
        &SplitPlan {
            carve_train_from_test: Some(0.5),
            ..plan
        },
        &noise,
        &root,
    );
    let pool = (0.5 * ag.test.len() as f64).round() as usize;
    if pool < 500 {
        let err = carved.unwrap_err().to_string();
        assert!(err.contains("exceeds"), "{err}");
        return;
    }
    let carved = carved.unwrap();
    assert_eq!(carved.test.len(), ag.test.len() - pool);
    assert_eq!(carved.partition.deviations.len(), 1);
    let train: std::collections::HashSet<_> = carved
        .partition
        .pretrain
        .iter()
        .chain(&carved.partition.finetune)
        .collect();
    assert!(carved.partition.test.iter().all(|k| !train.contains(k)));
}

// ---- The command line ----

fn benign(root: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .env(catalog::DATA_DIR_ENV, root)
        .output()
        .unwrap();
    assert!(out.status.code().is_some());
    out
}

/// The line `data list` must print for a dataset, from the records counted in its files.
fn list_line(name: &DatasetName, counts: &[(&str, usize)]) -> String {
    let parts: Vec<String> = counts
        .iter()
        .map(|&(split, n)| match (n, official(name.id(), split)) {
            (0, e) => format!("0/{e} {split} (missing)"),
            (n, e) => format!("{n}/{e} {split}"),
        })
        .collect();
    let status = if census_complete(name, counts) {
        "complete"
    } else {
        "partial"
    };
    format!("{name}: {}, {status}", parts.join(", "))
}

#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn data_list_reports_completeness() {
    let test = "data_real::data_list_reports_completeness";
    let Some(root) = common::data_root(test) else {
        return;
    };
    let out = benign(&root, &["data", "list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let has_line = |line: &str| text.lines().any(|l| l == line);
    for name in DatasetName::all() {
        match census(&name, &root) {
            Some(counts) => {
                let line = list_line(&name, &counts);
                assert!(has_line(&line), "missing line {line:?} in:\n{text}");
                // The library's report says the same.
                let report = Completeness::of(&load(name.clone(), &root));
                assert_eq!(report.line(), line);
                assert_eq!(report.complete, census_complete(&name, &counts));
            }
            None => {
                let prefix = format!("{name}: unavailable: ");
                assert!(
                    text.lines().any(|l| l.starts_with(&prefix)),
                    "{prefix:?} expected in:\n{text}"
                );
            }
        }
    }
    let annotations = npy(
        &root.join("cifar10n").join(cifar10n::FILE_NAME),
        "clean_label",
    );
    match annotations.map(|(shape, _)| shape) {
        Some(shape) if shape == [official("cifar10n", "annotations")] => {
            let line = "cifar10n: 50000/50000 annotations, complete";
            assert!(has_line(line), "missing line {line:?} in:\n{text}");
        }
        _ => assert!(
            text.lines()
                .any(|l| l.starts_with("cifar10n: unavailable: ")),
            "{text}"
        ),
    }
}

/// `data verify` reports a file ok exactly when its checksums and size are the official ones
/// (computed here), partial when it is shorter than the release, and exits 1 iff any file is
/// missing or differs.
#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn data_verify_says_ok_iff_the_checksums_are_official() {
    let test = "data_real::data_verify_says_ok_iff_the_checksums_are_official";
    let Some(root) = common::data_root(test) else {
        return;
    };
    let out = benign(&root, &["data", "verify"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let mut differ = 0;
    for name in catalog::manifest_names() {
        let manifest = catalog::manifest(name).unwrap();
        let statuses = catalog::verify(&manifest, &root).unwrap();
        for (file, (_, status)) in manifest.files.iter().zip(statuses) {
            let shown = format!("{}/{}", manifest.folder, file.path);
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}: {shown}: ")))
                .unwrap_or_else(|| panic!("no line for {shown} in:\n{text}"));
            let path = root.join(&shown);
            let Ok(bytes) = std::fs::read(&path) else {
                assert_eq!(line, "missing", "{shown}");
                assert_eq!(status, FileStatus::Missing, "{shown}");
                differ += 1;
                continue;
            };
            let (md5, sha256, size) = (md5_hex(&bytes), sha256_hex(&bytes), bytes.len() as u64);
            let official = file.md5.as_ref().is_none_or(|m| *m == md5)
                && file.sha256.as_ref().is_none_or(|s| *s == sha256)
                && file.bytes.is_none_or(|b| b == size);
            assert_eq!(line == "ok", official, "{shown}: {line}");
            assert_eq!(status.is_ok(), official, "{shown}: {status}");
            if official {
                continue;
            }
            differ += 1;
            match file.bytes.filter(|&b| size < b) {
                Some(b) => assert_eq!(line, format!("PARTIAL: {size} of {b} bytes"), "{shown}"),
                None => {
                    assert!(line.starts_with("MISMATCH: "), "{shown}: {line}");
                    if let Some(m) = file.md5.as_ref().filter(|m| **m != md5) {
                        let why = format!("md5 {md5} is not the official {m}");
                        assert!(line.contains(&why), "{shown}: {line}");
                    }
                    if let Some(s) = file.sha256.as_ref().filter(|s| **s != sha256) {
                        let why = format!("sha256 {sha256} is not the official {s}");
                        assert!(line.contains(&why), "{shown}: {line}");
                    }
                }
            }
        }
    }
    let expected_code = if differ > 0 { 1 } else { 0 };
    assert_eq!(out.status.code(), Some(expected_code), "{text}");
    if differ > 0 {
        let summary = format!("{differ} file(s) missing or differing from the official releases");
        assert!(text.lines().any(|l| l == summary), "{text}");
    }
}

#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn data_split_prints_a_summary() {
    let test = "data_real::data_split_prints_a_summary";
    let Some(root) = common::data_root_with(test, &["trec"]) else {
        return;
    };
    let trec = load(DatasetName::Trec, &root);
    let (train_len, test_len) = (trec.train.as_ref().unwrap().len(), trec.test.len());
    let args = |pretrain_n: &'static str| {
        let mut args = vec!["data", "split", "--dataset", "trec", "--pretrain-n"];
        args.extend([pretrain_n, "--n", "200", "--eta", "0.2"]);
        args
    };
    let out = benign(&root, &args("3000"));
    if train_len >= 3200 {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["pretrain"]["count"], 3000);
        assert_eq!(summary["finetune"]["count"], 200);
        assert_eq!(summary["test"]["count"], test_len);
        let noisy = summary["noisy"].as_u64().unwrap();
        assert!((20..=60).contains(&noisy), "{noisy} noisy of 200 at η 0.2");
    } else {
        assert_eq!(out.status.code(), Some(2));
    }
    // More than any copy holds (the release has 5452).
    let out = benign(&root, &args("6000"));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("exceeds the {train_len}")) && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn a_truncated_real_gzip_is_an_error_naming_the_file() {
    let test = "data_real::a_truncated_real_gzip_is_an_error_naming_the_file";
    let Some(root) = common::data_root_with(test, &["mnist"]) else {
        return;
    };
    let source: PathBuf = root.join("mnist");
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
