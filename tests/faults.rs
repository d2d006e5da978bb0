//! Runs under faults (TREC, all-MiniLM-L6-v2, small sizes): SIGTERM and SIGINT end a run with
//! its checkpoint and no temporary file, and the resumed run equals an uninterrupted one; a
//! second process given the same --out is refused while the first writes; a checkpoint with a
//! flipped byte or a state that contradicts itself is refused; a refused resume or rerun leaves
//! the folder's config.json as it was; temporary files a killed writer left are removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use benign_attention::train::checkpoint;
use candle_core::Device;

mod common;

const EPOCHS: usize = 150;

fn command(args: &[String], cache: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_benign-attention"));
    command.args(args).env("BENIGN_CACHE_DIR", cache);
    command
}

fn run(args: &[String], cache: &Path) -> Output {
    command(args, cache).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The run's flags with `--out out`, η = `eta`, and --resume when asked.
fn args(out: &Path, eta: &str, resume: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "finetune",
        "--dataset",
        "trec",
        "--eta",
        eta,
        "--pretrain-n",
        "200",
        "--n",
        "30",
        "--pretrain-epochs",
        "2",
        "--test-n",
        "60",
        "--eval-every",
        "25",
        "--checkpoint-every",
        "10",
        "--epochs",
        &EPOCHS.to_string(),
        "--out",
        out.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if resume {
        args.push("--resume".into());
    }
    args
}

/// summary.json without its wall time, and metrics.jsonl, of a finished run.
fn outcome(dir: &Path) -> (serde_json::Value, String) {
    let mut summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    summary.as_object_mut().unwrap().remove("wall_seconds");
    (
        summary,
        std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap(),
    )
}

/// Names under `dir`, recursively, that start with ".tmp".
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with(".tmp") {
            found.push(path.clone());
        }
        if path.is_dir() {
            found.extend(temporaries(&path));
        }
    }
    found
}

/// Waits until the run writing `dir` has checkpointed a phase-2 epoch.
fn wait_for_phase2_checkpoint(child: &mut Child, dir: &Path) {
    let started = Instant::now();
    loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it could be signalled"
        );
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no phase-2 checkpoint in 300 s"
        );
        if let Ok(Some(saved)) = checkpoint::load(dir, &Device::Cpu)
            && saved.state.epochs_done > 0
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The run of `args` in the background, its stderr into `log` (a file: a pipe nobody reads
/// could fill and stall it).
fn spawn(args: &[String], cache: &Path, log: &Path) -> Child {
    command(args, cache)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Sends `signal` (TERM, INT) to the child and returns its exit code and its stderr's last line.
fn signal(mut child: Child, signal: &str, log: &Path) -> (Option<i32>, String) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let code = child.wait().unwrap().code();
    let err = std::fs::read_to_string(log).unwrap();
    (
        code,
        err.trim_end()
            .lines()
            .last()
            .unwrap_or_default()
            .to_string(),
    )
}

/// `bytes` (a safetensors file) with one bit flipped in the middle of tensor `name`'s data.
fn flip_inside(mut bytes: Vec<u8>, name: &str) -> Vec<u8> {
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let offsets = &header[name]["data_offsets"];
    let (start, end) = (offsets[0].as_u64().unwrap(), offsets[1].as_u64().unwrap());
    bytes[8 + header_len + ((start + end) / 2) as usize] ^= 0x10;
    bytes
}

/// The epoch an "after phase-2 epoch K" line names.
fn stopped_epoch(line: &str) -> usize {
    let rest = line
        .split("after phase-2 epoch ")
        .nth(1)
        .unwrap_or_else(|| panic!("no epoch in: {line}"));
    rest.split(';').next().unwrap().trim().parse().unwrap()
}

fn assert_refused(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    // Progress lines may come first (a checkpoint is checked once the backbone's features are
    // ready); the error is one line, the last.
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert_eq!(err.trim_end().lines().last(), Some(errors[0]), "{err}");
    for needle in needles {
        assert!(errors[0].contains(needle), "no {needle:?} in: {err}");
    }
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn signals_locks_and_tampered_checkpoints() {
    let test = "faults::signals_locks_and_tampered_checkpoints";
    let Some(_) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let whole = dir.path().join("whole");
    let out = run(&args(&whole, "0.2", false), &cache);
    assert!(out.status.success(), "{}", stderr(&out));

    // SIGTERM mid phase 2; meanwhile a second process on the same folder is refused.
    let stopped = dir.path().join("stopped");
    let log = dir.path().join("stopped.log");
    let mut child = spawn(&args(&stopped, "0.2", false), &cache, &log);
    wait_for_phase2_checkpoint(&mut child, &stopped);
    let config = std::fs::read(stopped.join("config.json")).unwrap();
    let second = run(&args(&stopped, "0.2", true), &cache);
    assert_refused(
        &second,
        &["another process is writing", "choose another --out"],
    );
    let (code, line) = signal(child, "TERM", &log);
    assert_eq!(code, Some(143), "{line}");
    assert!(
        line.starts_with("error: stopped by SIGTERM after phase-2 epoch"),
        "{line}"
    );
    assert!(line.contains("--resume"), "{line}");
    let epoch = stopped_epoch(&line);
    let saved = checkpoint::load(&stopped, &Device::Cpu).unwrap().unwrap();
    assert_eq!(
        saved.state.epochs_done, epoch,
        "the checkpoint is the stopped epoch's"
    );
    assert!(epoch < EPOCHS);
    assert!(
        temporaries(&stopped).is_empty(),
        "{:?}",
        temporaries(&stopped)
    );
    assert!(temporaries(&cache).is_empty(), "{:?}", temporaries(&cache));
    assert_eq!(std::fs::read(stopped.join("config.json")).unwrap(), config);

    // Tampered copies of that checkpoint are refused, and leave their folder's files alone.
    let file = checkpoint::path(&stopped);
    let bytes = std::fs::read(&file).unwrap();
    let flipped = dir.path().join("flipped");
    std::fs::create_dir_all(&flipped).unwrap();
    std::fs::write(flipped.join("config.json"), &config).unwrap();
    let tensor = saved
        .tensors
        .keys()
        .find(|k| k.starts_with("adam_v."))
        .expect("a phase-2 checkpoint holds AdamW's moments");
    std::fs::write(checkpoint::path(&flipped), flip_inside(bytes, tensor)).unwrap();
    let out = run(&args(&flipped, "0.2", true), &cache);
    assert_refused(
        &out,
        &["checkpoint.safetensors", "does not match its checksum"],
    );
    assert_eq!(std::fs::read(flipped.join("config.json")).unwrap(), config);

    let edited = dir.path().join("edited");
    let mut state = saved.state.clone();
    state.epochs_done += 10;
    checkpoint::save(&edited, &state, &saved.tensors).unwrap();
    let out = run(&args(&edited, "0.2", true), &cache);
    assert_refused(&out, &["epochs_done", "contradicts itself"]);
    assert!(
        !edited.join("config.json").exists(),
        "a refused resume wrote config.json"
    );

    // A resume of another run, and a fresh run of another η into the finished folder, are
    // refused and leave config.json as it was.
    let out = run(&args(&stopped, "0.3", true), &cache);
    assert_refused(&out, &["belongs to another run", "eta"]);
    assert_eq!(std::fs::read(stopped.join("config.json")).unwrap(), config);
    let finished_config = std::fs::read(whole.join("config.json")).unwrap();
    let out = run(&args(&whole, "0.3", false), &cache);
    assert_refused(&out, &["holds another run", "eta"]);
    assert_eq!(
        std::fs::read(whole.join("config.json")).unwrap(),
        finished_config
    );

    // What a writer killed mid-checkpoint leaves goes when the folder is next written; the
    // resumed sitting is stopped by SIGINT, and the third sitting ends where `whole` ended.
    let left = stopped.join(".tmp-Xy12ab.safetensors");
    std::fs::write(&left, b"half a checkpoint").unwrap();
    let mut child = spawn(&args(&stopped, "0.2", true), &cache, &log);
    let started = Instant::now();
    while checkpoint::load(&stopped, &Device::Cpu)
        .ok()
        .flatten()
        .is_none_or(|c| c.state.epochs_done <= epoch)
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the resumed run ended early"
        );
        assert!(started.elapsed() < Duration::from_secs(300));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!left.exists(), "a killed writer's temporary file was kept");
    let (code, line) = signal(child, "INT", &log);
    assert_eq!(code, Some(130), "{line}");
    assert!(
        line.starts_with("error: stopped by SIGINT after phase-2 epoch"),
        "{line}"
    );
    let out = run(&args(&stopped, "0.2", true), &cache);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        outcome(&stopped),
        outcome(&whole),
        "stopped twice, then resumed"
    );
    assert!(temporaries(&stopped).is_empty());
}
