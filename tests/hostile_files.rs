//! Inputs that are not files: for a checkpoint, a data file of each loader (all eight, and
//! CIFAR-10N's annotations), a backbone's config, weights and tokenizer, each of a FIFO,
//! `/dev/zero`, `/dev/urandom`, a directory, a dangling link and a loop of links in its place
//! ends the command within 5 s, with exit status 2, one line on stderr naming the file, and a
//! peak memory under 1 GiB. A FIFO used to hang the open (and the first SIGTERM with it); a
//! device used to be read without end.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

/// What takes the place of an input file.
#[derive(Clone, Copy, Debug)]
enum Hostile {
    Fifo,
    DevZero,
    DevUrandom,
    Directory,
    DanglingLink,
    LinkLoop,
}

const ALL: [Hostile; 6] = [
    Hostile::Fifo,
    Hostile::DevZero,
    Hostile::DevUrandom,
    Hostile::Directory,
    Hostile::DanglingLink,
    Hostile::LinkLoop,
];

/// Puts `what` at `path` (replacing whatever was there).
fn plant(path: &Path, what: Hostile) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_dir_all(path);
    match what {
        Hostile::Fifo => {
            let name = CString::new(path.to_str().unwrap()).unwrap();
            // SAFETY: a plain C call with a valid NUL-terminated path.
            assert_eq!(
                unsafe { libc::mkfifo(name.as_ptr(), 0o644) },
                0,
                "mkfifo {}",
                path.display()
            );
        }
        Hostile::DevZero => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
        Hostile::DevUrandom => std::os::unix::fs::symlink("/dev/urandom", path).unwrap(),
        Hostile::Directory => std::fs::create_dir(path).unwrap(),
        Hostile::DanglingLink => {
            std::os::unix::fs::symlink(path.with_extension("nowhere"), path).unwrap()
        }
        Hostile::LinkLoop => {
            let other = path.with_extension("loop");
            let _ = std::fs::remove_file(&other);
            std::os::unix::fs::symlink(&other, path).unwrap();
            std::os::unix::fs::symlink(path, &other).unwrap();
        }
    }
}

/// How a command ended: its exit status, stderr, wall time and peak resident memory.
struct Ended {
    code: Option<i32>,
    stderr: String,
    seconds: f64,
    peak_bytes: u64,
}

/// Runs the binary with `args` (and `env`), killed after 20 s; its peak RSS from `wait4`.
fn run(args: &[&str], env: &[(&str, &Path)]) -> Ended {
    let log = tempfile::NamedTempFile::new().unwrap();
    let started = Instant::now();
    let mut command = Command::new(env!("CARGO_BIN_EXE_benign-attention"));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap());
    for (key, value) in env {
        command.env(key, value);
    }
    // Reaped by `wait4` below, which also gives its peak memory.
    #[allow(clippy::zombie_processes)]
    let child = command.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let (mut status, mut usage): (libc::c_int, libc::rusage) = (0, unsafe { std::mem::zeroed() });
    loop {
        // SAFETY: waits for our own child, writing into the two locals.
        let done = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if done == pid {
            break;
        }
        if started.elapsed() > Duration::from_secs(20) {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
            panic!("{args:?}: still running after 20 s, killed");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Ended {
        code,
        stderr: std::fs::read_to_string(log.path()).unwrap(),
        seconds: started.elapsed().as_secs_f64(),
        peak_bytes: usage.ru_maxrss as u64 * 1024,
    }
}

/// The command refused `file` as it should: exit 2, one error line naming it, fast and small.
fn assert_refused(ended: &Ended, file: &Path, what: Hostile, case: &str) {
    let name = file.to_str().unwrap();
    // Notes and warnings about other files (CIFAR-10's partial batches) may come first.
    let lines: Vec<&str> = ended
        .stderr
        .lines()
        .filter(|l| !l.starts_with("note:") && !l.starts_with("warning:"))
        .collect();
    assert_eq!(ended.code, Some(2), "{case}, {what:?}: {}", ended.stderr);
    assert_eq!(
        lines.len(),
        1,
        "{case}, {what:?}: not one line:\n{}",
        ended.stderr
    );
    assert!(
        lines[0].contains(name),
        "{case}, {what:?}: {} not named: {}",
        name,
        lines[0]
    );
    assert!(
        ended.seconds < 5.0,
        "{case}, {what:?}: {:.1} s",
        ended.seconds
    );
    assert!(
        ended.peak_bytes < 1 << 30,
        "{case}, {what:?}: peak {} bytes",
        ended.peak_bytes
    );
}

/// A copy of the mirror's `folder` under `root`, every file a link to the mirror's.
fn link_tree(mirror: &Path, root: &Path, folder: &str) {
    fn walk(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap().flatten() {
            let (source, target) = (entry.path(), to.join(entry.file_name()));
            if source.is_dir() {
                walk(&source, &target);
            } else {
                std::os::unix::fs::symlink(&source, &target).unwrap();
            }
        }
    }
    walk(&mirror.join(folder), &root.join(folder));
}

/// `data split` of `dataset` under `root`: loads the data, and nothing else.
fn split(dataset: &str, root: &Path, extra: &[&str]) -> Ended {
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
    ];
    args.push(root.to_str().unwrap());
    args.extend(extra);
    run(&args, &[])
}

/// STL-10 and SST-2 are not in the offline mirror: release-format files of a few samples.
fn write_stl10_and_sst2(root: &Path) {
    let stl = root.join("stl10/stl10_binary");
    std::fs::create_dir_all(&stl).unwrap();
    for split in ["train", "test"] {
        std::fs::write(
            stl.join(format!("{split}_X.bin")),
            vec![7u8; 20 * 96 * 96 * 3],
        )
        .unwrap();
        std::fs::write(
            stl.join(format!("{split}_y.bin")),
            (0..20u8).map(|k| k % 10 + 1).collect::<Vec<_>>(),
        )
        .unwrap();
    }
    let names = "airplane\nbird\ncar\ncat\ndeer\ndog\nhorse\nmonkey\nship\ntruck\n";
    std::fs::write(stl.join("class_names.txt"), names).unwrap();
    let sst = root.join("sst2/SST-2");
    std::fs::create_dir_all(&sst).unwrap();
    for file in ["train.tsv", "dev.tsv"] {
        let rows: String = (0..20)
            .map(|k| format!("sentence {k}\t{}\n", k % 2))
            .collect();
        std::fs::write(sst.join(file), format!("sentence\tlabel\n{rows}")).unwrap();
    }
}

#[test]
#[cfg_attr(
    benign_no_data,
    ignore = "needs real data: BENIGN_DATA_DIR (or ./datasets)"
)]
fn a_data_file_that_is_not_a_file_is_one_line_at_once() {
    let test = "hostile_files::a_data_file_that_is_not_a_file_is_one_line_at_once";
    let Some(mirror) = common::data_root_with(
        test,
        &[
            "mnist", "cifar10", "medmnist", "ag_news", "trec", "cifar10n",
        ],
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for folder in [
        "mnist", "cifar10", "medmnist", "ag_news", "trec", "cifar10n",
    ] {
        link_tree(&mirror, root, folder);
    }
    write_stl10_and_sst2(root);
    // (dataset, the file a hostile thing replaces, extra flags)
    let cases: [(&str, PathBuf, &[&str]); 9] = [
        ("mnist", root.join("mnist/train-images-idx3-ubyte.gz"), &[]),
        (
            "cifar10",
            root.join("cifar10/cifar-10-batches-bin/data_batch_1.bin"),
            &[],
        ),
        ("breastmnist", root.join("medmnist/breastmnist.npz"), &[]),
        (
            "pneumoniamnist",
            root.join("medmnist/pneumoniamnist.npz"),
            &[],
        ),
        (
            "ag_news",
            root.join("ag_news/test.csv"),
            &["--carve-train-from-test", "0.5"],
        ),
        ("trec", root.join("trec/train_5500.label"), &[]),
        ("stl10", root.join("stl10/stl10_binary/train_X.bin"), &[]),
        ("sst2", root.join("sst2/SST-2/train.tsv"), &[]),
        (
            "cifar10",
            root.join("cifar10n/CIFAR-10_human.npz"),
            &["--noise", "cifar10n:worse"],
        ),
    ];
    for (dataset, file, extra) in cases {
        let kept = std::fs::read_link(&file).ok();
        for what in ALL {
            plant(&file, what);
            assert_refused(&split(dataset, root, extra), &file, what, dataset);
        }
        // Put the file back for the cases after it.
        let _ = std::fs::remove_file(&file);
        let _ = std::fs::remove_dir_all(&file);
        match kept {
            Some(target) => std::os::unix::fs::symlink(target, &file).unwrap(),
            None => write_stl10_and_sst2(root),
        }
    }
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn a_checkpoint_or_backbone_file_that_is_not_a_file_is_one_line_at_once() {
    let test =
        "hostile_files::a_checkpoint_or_backbone_file_that_is_not_a_file_is_one_line_at_once";
    let Some((data, models)) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let env = [
        ("BENIGN_CACHE_DIR", cache.as_path()),
        ("BENIGN_DATA_DIR", data.as_path()),
    ];
    let small = [
        "--pretrain-n",
        "50",
        "--n",
        "10",
        "--test-n",
        "20",
        "--epochs",
        "2",
        "--pretrain-epochs",
        "2",
    ];

    // A checkpoint, resumed.
    let out = dir.path().join("run");
    std::fs::create_dir_all(&out).unwrap();
    let checkpoint = out.join("checkpoint.safetensors");
    let mut resume = vec![
        "finetune",
        "--dataset",
        "trec",
        "--eta",
        "0.2",
        "--resume",
        "--out",
    ];
    resume.push(out.to_str().unwrap());
    resume.extend(small);
    for what in ALL {
        plant(&checkpoint, what);
        let mut env = env.to_vec();
        env.push(("BENIGN_MODELS_DIR", models.as_path()));
        assert_refused(&run(&resume, &env), &checkpoint, what, "checkpoint");
    }

    // The backbone's config, weights and tokenizer, in a copy of all-MiniLM-L6-v2's folder.
    let backbone = dir.path().join("minilm");
    link_tree(
        &models.join("sentence-transformers"),
        dir.path(),
        "all-MiniLM-L6-v2",
    );
    std::fs::rename(dir.path().join("all-MiniLM-L6-v2"), &backbone).unwrap();
    let mut args = vec![
        "finetune",
        "--dataset",
        "trec",
        "--eta",
        "0.2",
        "--backbone",
    ];
    args.push(backbone.to_str().unwrap());
    args.extend(small);
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        let file = backbone.join(name);
        let kept = std::fs::read_link(&file).unwrap();
        for what in ALL {
            plant(&file, what);
            assert_refused(&run(&args, &env), &file, what, name);
        }
        std::fs::remove_file(&file).ok();
        std::os::unix::fs::symlink(kept, &file).unwrap();
    }
}
