//! Dataset downloads against a real HTTP server on 127.0.0.1 (`common::http`) that injects the
//! faults of a real network: a 404 at the first URL, 503s, corrupt bytes, a connection closed in
//! the middle of the body, a server that never answers, and a client killed mid-download and run
//! again. Each failure is one line naming every URL's outcome, leaves nothing half-written, and
//! the next fetch from a healthy server succeeds without clean-up.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use benign_attention::data::catalog::Manifest;
use benign_attention::data::fetch::fetch;
use common::http::{Fault, Server};
use sha2::{Digest, Sha256};

mod common;

/// Every test of this process waits at most 2 s for a silent server (set once, before any
/// download starts).
fn short_stall() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: set before any thread of this process reads the environment for a download.
        unsafe { std::env::set_var(benign_attention::data::download::STALL_SECS_ENV, "2") };
    });
}

/// Two generated release files under `<served>/toy/`, and the manifest listing them with
/// `urls` (each `{base}` replaced by a server's URL) and their real checksums.
fn toy_release(served: &Path, bases: &[&str]) -> Manifest {
    let dir = served.join("toy");
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = String::new();
    for (name, len) in [("a.bin", 300_000usize), ("b.txt", 5_000)] {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        std::fs::write(dir.join(name), &bytes).unwrap();
        let urls: Vec<String> = bases
            .iter()
            .map(|b| format!("\"{b}/toy/{name}\""))
            .collect();
        files.push_str(&format!(
            "[[files]]\npath = \"{name}\"\nurls = [{}]\nmd5 = \"{:x}\"\nsha256 = \"{}\"\nbytes = {len}\n\n",
            urls.join(", "),
            md5::Md5::digest(&bytes),
            benign_attention::io::hex(&Sha256::digest(&bytes)),
        ));
    }
    toml::from_str(&format!(
        "name = \"toy\"\nfolder = \"toy\"\ntitle = \"t\"\nhomepage = \"h\"\n[expected]\n\n{files}"
    ))
    .unwrap()
}

/// Every file name left in `dir`.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn a_404_at_the_first_url_falls_through_to_the_next() {
    short_stall();
    let served = tempfile::tempdir().unwrap();
    let (first, second) = (
        Server::start(served.path().into()),
        Server::start(served.path().into()),
    );
    let manifest = toy_release(served.path(), &[&first.url, &second.url]);
    first.fault("toy/a.bin", Fault::NotFound);
    let root = tempfile::tempdir().unwrap();
    let report = fetch(&manifest, root.path(), None).unwrap();
    assert_eq!(report.downloaded.len(), 2);
    assert_eq!(names(&root.path().join("toy")), ["a.bin", "b.txt"]);
    // Readable by others, as any file a user copies in.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(root.path().join("toy/a.bin"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o044, 0o044, "mode {mode:o}");
    assert!(second.requests().iter().any(|r| r.path == "toy/a.bin"));
    // Again: nothing is fetched twice.
    let again = fetch(&manifest, root.path(), None).unwrap();
    assert_eq!(
        (again.downloaded.len(), again.already_present.len()),
        (0, 2)
    );
}

#[test]
fn the_mirror_is_tried_first() {
    short_stall();
    let served = tempfile::tempdir().unwrap();
    let (mirror, canonical) = (
        Server::start(served.path().into()),
        Server::start(served.path().into()),
    );
    let manifest = toy_release(served.path(), &[&canonical.url]);
    let root = tempfile::tempdir().unwrap();
    fetch(&manifest, root.path(), Some(&format!("{}/", mirror.url))).unwrap();
    assert_eq!(mirror.requests().len(), 2);
    assert!(canonical.requests().is_empty());
}

#[test]
fn transient_failures_are_retried_and_a_cut_transfer_resumes_with_a_range() {
    short_stall();
    let served = tempfile::tempdir().unwrap();
    let server = Server::start(served.path().into());
    let manifest = toy_release(served.path(), &[&server.url]);
    server.fault("toy/a.bin", Fault::CloseAfter(100_000));
    server.fault("toy/b.txt", Fault::Unavailable(2));
    let root = tempfile::tempdir().unwrap();
    fetch(&manifest, root.path(), None).unwrap();
    let requests = server.requests();
    let a: Vec<_> = requests.iter().filter(|r| r.path == "toy/a.bin").collect();
    assert_eq!(a.len(), 2, "{requests:?}");
    assert_eq!(a[1].range.as_deref(), Some("bytes=100000-"));
    assert_eq!(requests.iter().filter(|r| r.path == "toy/b.txt").count(), 3);
    assert_eq!(names(&root.path().join("toy")), ["a.bin", "b.txt"]);
}

#[test]
fn corrupt_bytes_are_refused_by_name_and_the_next_url_is_tried() {
    short_stall();
    let served = tempfile::tempdir().unwrap();
    let (bad, good) = (
        Server::start(served.path().into()),
        Server::start(served.path().into()),
    );
    let manifest = toy_release(served.path(), &[&bad.url, &good.url]);
    bad.fault("toy/a.bin", Fault::Corrupt);
    let root = tempfile::tempdir().unwrap();
    fetch(&manifest, root.path(), None).unwrap();
    assert_eq!(names(&root.path().join("toy")), ["a.bin", "b.txt"]);

    // Corrupt everywhere: one line that says so for the URL, nothing left behind.
    let only_bad = toy_release(served.path(), &[&bad.url]);
    let root = tempfile::tempdir().unwrap();
    let err = format!("{:#}", fetch(&only_bad, root.path(), None).unwrap_err());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("toy: a.bin: ")
            && err.contains("corrupt download")
            && !err.contains("unreachable"),
        "{err}"
    );
    assert!(
        !root.path().join("toy").exists(),
        "{:?}",
        names(&root.path().join("toy"))
    );
}

#[test]
fn a_silent_server_costs_the_stall_timeout_and_each_failure_says_what_happened_where() {
    short_stall();
    let served = tempfile::tempdir().unwrap();
    let (silent, missing) = (
        Server::start(served.path().into()),
        Server::start(served.path().into()),
    );
    let manifest = toy_release(served.path(), &[&silent.url, &missing.url]);
    silent.fault("toy/a.bin", Fault::Stall);
    missing.fault("toy/a.bin", Fault::NotFound);
    let root = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let err = format!("{:#}", fetch(&manifest, root.path(), None).unwrap_err());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("{}/toy/a.bin: no answer within 2 s", silent.url)),
        "{err}"
    );
    assert!(
        err.contains(&format!("{}/toy/a.bin: HTTP 404", missing.url)),
        "{err}"
    );
    assert!(!root.path().join("toy").exists());
    // The same fetch from a healthy server needs no clean-up.
    silent.clear_faults();
    missing.clear_faults();
    fetch(&manifest, root.path(), None).unwrap();
    assert_eq!(names(&root.path().join("toy")), ["a.bin", "b.txt"]);
}

/// `finetune --dataset mnist` on an empty data root downloads the official MNIST files from a
/// mirror (here a loopback server holding the data root's copy), is killed in the middle of a
/// file, and run again resumes that file with a Range request, leaves nothing partial behind and
/// ends with the summary of the same run on the data root itself.
#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn finetune_downloads_from_the_mirror_and_resumes_after_a_kill() {
    short_stall();
    let Some((data, models)) = common::data_and_models_roots(
        "download::finetune_downloads_from_the_mirror_and_resumes_after_a_kill",
        &["mnist"],
    ) else {
        return;
    };
    if !benign_attention::data::catalog::verify(
        &benign_attention::data::catalog::manifest("mnist").unwrap(),
        &data,
    )
    .unwrap()
    .iter()
    .all(|(_, s)| s.is_ok())
    {
        common::skip::<()>(
            "download::finetune…",
            "the data root's MNIST is not the official release",
        );
        return;
    }
    let server = Server::start(data.clone());
    server.fault(
        "mnist/train-images-idx3-ubyte.gz",
        Fault::Throttle(1_000_000),
    );
    let work = tempfile::tempdir().unwrap();
    let empty_root = work.path().join("data");
    let run = |root: &Path, out: &str, mirror: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_benign-attention"));
        command
            .args([
                "finetune",
                "--dataset",
                "mnist",
                "--eta",
                "0.2",
                "--pretrain-n",
                "60",
                "--n",
                "20",
                "--test-n",
                "40",
                "--epochs",
                "3",
                "--pretrain-epochs",
                "3",
            ])
            .arg("--data-dir")
            .arg(root)
            .arg("--models-dir")
            .arg(&models)
            .arg("--cache-dir")
            .arg(work.path().join(format!("cache-{out}")))
            .arg("--out")
            .arg(work.path().join(out))
            .env_remove(benign_attention::data::fetch::MIRROR_ENV)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(m) = mirror {
            command.env(benign_attention::data::fetch::MIRROR_ENV, m);
        }
        command
    };
    // Killed once a megabyte of the 9.9 MB training images is on disk.
    let mut first = run(&empty_root, "killed", Some(&server.url))
        .spawn()
        .unwrap();
    let part = empty_root.join("mnist/.train-images-idx3-ubyte.gz.part");
    let started = Instant::now();
    while std::fs::metadata(&part).map_or(0, |m| m.len()) < 1_000_000 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no download progress"
        );
        assert!(
            first.try_wait().unwrap().is_none(),
            "finished before the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    server.clear_faults();

    let resumed = run(&empty_root, "resumed", Some(&server.url))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{stderr}");
    assert!(
        stderr.contains("train-images-idx3-ubyte.gz"),
        "no progress shown: {stderr}"
    );
    let ranged = server
        .requests()
        .into_iter()
        .filter(|r| r.path == "mnist/train-images-idx3-ubyte.gz")
        .filter_map(|r| r.range)
        .collect::<Vec<_>>();
    assert_eq!(ranged.len(), 1, "{:?}", server.requests());
    let left = names(&empty_root.join("mnist"));
    assert!(left.iter().all(|n| !n.starts_with('.')), "{left:?}");
    assert!(
        benign_attention::data::catalog::verify(
            &benign_attention::data::catalog::manifest("mnist").unwrap(),
            &empty_root
        )
        .unwrap()
        .iter()
        .all(|(_, s)| s.is_ok())
    );

    let reference = run(&data, "reference", None).output().unwrap();
    assert!(
        reference.status.success(),
        "{}",
        String::from_utf8_lossy(&reference.stderr)
    );
    let summary = |out: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(work.path().join(out).join("summary.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let (ours, theirs) = (summary("resumed"), summary("reference"));
    for key in ["final", "baseline_test_acc", "reset_test_acc", "config"] {
        assert_eq!(ours[key], theirs[key], "{key}");
    }
    assert!(!PathBuf::from(&part).exists());
}

/// A second MedMNIST task beside a first one in `medmnist/` is fetched (the folder's existence
/// does not stand for its files), from the mirror, and loads.
#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR is not set and ./datasets holds none"
)]
fn a_second_medmnist_task_is_fetched_beside_the_first() {
    short_stall();
    let Some(data) = common::data_root_with(
        "download::a_second_medmnist_task_is_fetched_beside_the_first",
        &["medmnist"],
    ) else {
        return;
    };
    let official = benign_attention::data::catalog::manifest("breastmnist").unwrap();
    if !benign_attention::data::catalog::verify(&official, &data)
        .unwrap()
        .iter()
        .all(|(_, s)| s.is_ok())
    {
        common::skip::<()>(
            "download::a_second_medmnist_task…",
            "the data root's BreastMNIST is not the official file",
        );
        return;
    }
    let server = Server::start(data.clone());
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("medmnist")).unwrap();
    std::fs::write(
        root.path().join("medmnist/pneumoniamnist.npz"),
        b"another task",
    )
    .unwrap();
    let dataset = benign_attention::data::fetch::load_or_fetch(
        &benign_attention::data::DatasetName::BreastMnist,
        root.path(),
        Some(&server.url),
    )
    .unwrap();
    assert_eq!(dataset.test.len(), 156);
    assert_eq!(
        names(&root.path().join("medmnist")),
        ["breastmnist.npz", "pneumoniamnist.npz"]
    );
}

/// A partial copy that loads without its missing files (AG-news's test file alone, which
/// `--carve-train-from-test` splits into train and test pools) is used as it is when the missing
/// files cannot be downloaded, instead of stopping every run offline.
#[test]
fn a_partial_copy_is_used_when_its_missing_files_cannot_be_fetched() {
    use benign_attention::data::DatasetName;
    short_stall();
    let served = tempfile::tempdir().unwrap();
    // Serves nothing: every file is a 404 (the canonical URLs are unreachable offline; online
    // they would complete the copy, which this test allows).
    let mirror = Server::start(served.path().into());
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ag_news");
    std::fs::create_dir_all(&dir).unwrap();
    let rows: String = (0..40)
        .map(|k| format!("\"{}\",\"Title {k}\",\"Description {k}\"\n", k % 4 + 1))
        .collect();
    std::fs::write(dir.join("test.csv"), rows).unwrap();
    std::fs::write(
        dir.join("classes.txt"),
        "World\nSports\nBusiness\nSci/Tech\n",
    )
    .unwrap();
    let dataset = benign_attention::data::fetch::load_or_fetch(
        &DatasetName::AgNews,
        root.path(),
        Some(&format!("{}/", mirror.url)),
    )
    .unwrap();
    assert_eq!(dataset.test.len(), 40);
    assert!(
        mirror
            .requests()
            .iter()
            .any(|r| r.path.contains("train.csv")),
        "the missing train.csv was not asked for"
    );
}
