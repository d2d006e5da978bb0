//! Runs trained together (`finetune --eta a,b --seed s,t`: one stack) on real data (TREC,
//! all-MiniLM-L6-v2, small sizes) against the same runs made alone: each run of the stack leaves
//! the same metrics.jsonl, summary.json (but its wall time) and checkpoint tensors, bit for bit, in
//! both modes; a stack stopped by SIGTERM resumes as a whole, and its run folders resume alone.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use benign_attention::train::checkpoint;
use candle_core::{Device, Tensor};

mod common;

fn benign(args: &[String], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .env("BENIGN_CACHE_DIR", cache)
        .output()
        .unwrap()
}

/// `finetune` on TREC at small sizes with `extra` flags.
fn finetune_args(mode: &str, epochs: usize, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "finetune",
        "--dataset",
        "trec",
        "--rng",
        "authors",
        "--mode",
        mode,
        "--pretrain-n",
        "200",
        "--n",
        "30",
        "--pretrain-epochs",
        "3",
        "--test-n",
        "60",
        "--eval-every",
        "5",
        "--checkpoint-every",
        "5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(["--epochs".to_string(), epochs.to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A run folder's outcome: summary.json without its wall time, metrics.jsonl, and the
/// checkpoint's tensors and state (without its wall time).
struct Outcome {
    summary: serde_json::Value,
    metrics: String,
    tensors: HashMap<String, Vec<u32>>,
    state: serde_json::Value,
}

fn outcome(dir: &Path) -> Outcome {
    let mut summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    summary.as_object_mut().unwrap().remove("wall_seconds");
    let saved = checkpoint::load(dir, &Device::Cpu)
        .unwrap()
        .expect("a checkpoint");
    let bits = |t: &Tensor| -> Vec<u32> {
        let values: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        values.iter().map(|v| v.to_bits()).collect()
    };
    let mut state = serde_json::to_value(&saved.state).unwrap();
    state.as_object_mut().unwrap().remove("wall_seconds");
    Outcome {
        summary,
        metrics: std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap(),
        tensors: saved
            .tensors
            .iter()
            .map(|(name, t)| (name.clone(), bits(t)))
            .collect(),
        state,
    }
}

fn assert_same(ours: &Outcome, theirs: &Outcome, what: &str) {
    assert_eq!(ours.summary, theirs.summary, "{what}: summary.json");
    assert_eq!(ours.metrics, theirs.metrics, "{what}: metrics.jsonl");
    assert_eq!(ours.state, theirs.state, "{what}: checkpoint state");
    assert_eq!(ours.tensors.len(), theirs.tensors.len(), "{what}: tensors");
    for (name, values) in &theirs.tensors {
        assert!(
            ours.tensors.get(name) == Some(values),
            "{what}: tensor {name}"
        );
    }
}

/// The run folders under `dir/runs`, by name.
fn run_folders(dir: &Path) -> Vec<PathBuf> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(dir.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    runs.sort();
    runs
}

/// η and the seed of a run folder, from its config.json.
fn eta_and_seed(dir: &Path) -> (String, String) {
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    (config["eta"].to_string(), config["seed"].to_string())
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn eta_and_seed_siblings_trained_together_end_as_alone() {
    let test = "stack::eta_and_seed_siblings_trained_together_end_as_alone";
    let Some(_) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    for mode in ["last-layer", "head"] {
        let together = dir.path().join(format!("{mode}-together"));
        let args = finetune_args(
            mode,
            12,
            &[
                "--eta",
                "0,0.2",
                "--seed",
                "42,7",
                "--out",
                together.to_str().unwrap(),
            ],
        );
        let out = benign(&args, &cache);
        ok(&out);
        // One summary line per run on stdout.
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 4);
        let runs = run_folders(&together);
        assert_eq!(runs.len(), 4, "{runs:?}");
        for run in runs {
            let (eta, seed) = eta_and_seed(&run);
            let alone = dir.path().join(format!("{mode}-alone-{eta}-{seed}"));
            let args = finetune_args(
                mode,
                12,
                &[
                    "--eta",
                    &eta,
                    "--seed",
                    &seed,
                    "--out",
                    alone.to_str().unwrap(),
                ],
            );
            ok(&benign(&args, &cache));
            assert_same(
                &outcome(&run),
                &outcome(&alone),
                &format!("{mode}, η {eta}, seed {seed}"),
            );
        }
    }
}

/// Sends SIGTERM to a stack once every run's checkpoint is past phase 1 and mid phase 2, and
/// returns the epoch they stopped after.
fn terminate_mid_phase_two(
    args: &[String],
    cache: &Path,
    folders: &dyn Fn() -> Vec<PathBuf>,
) -> usize {
    let mut child = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .env("BENIGN_CACHE_DIR", cache)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the stack finished before it could be stopped"
        );
        let done: Vec<usize> = folders()
            .iter()
            .filter_map(|dir| checkpoint::load(dir, &Device::Cpu).ok().flatten())
            .map(|saved| saved.state.epochs_done)
            .collect();
        if done.len() == folders().len() && !done.is_empty() && done.iter().all(|&d| d > 0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default().to_string();
    assert!(last.contains("--resume"), "{last}");
    let done: Vec<usize> = folders()
        .iter()
        .map(|dir| {
            checkpoint::load(dir, &Device::Cpu)
                .unwrap()
                .unwrap()
                .state
                .epochs_done
        })
        .collect();
    assert!(
        done.windows(2).all(|w| w[0] == w[1]),
        "the runs stopped apart: {done:?}"
    );
    done[0]
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn a_stack_stopped_by_sigterm_resumes_whole_and_its_folders_resume_alone() {
    let test = "stack::a_stack_stopped_by_sigterm_resumes_whole_and_its_folders_resume_alone";
    let Some(_) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let epochs = 400;
    let stack = |out: &Path, resume: bool| {
        let mut extra = vec!["--eta", "0,0.1,0.2", "--out", out.to_str().unwrap()];
        if resume {
            extra.push("--resume");
        }
        finetune_args("last-layer", epochs, &extra)
    };
    let whole = dir.path().join("whole");
    ok(&benign(&stack(&whole, false), &cache));

    // Stopped, then resumed as a whole.
    let stopped = dir.path().join("stopped");
    let folders = || {
        if stopped.join("runs").is_dir() {
            run_folders(&stopped)
        } else {
            Vec::new()
        }
    };
    let at = terminate_mid_phase_two(&stack(&stopped, false), &cache, &folders);
    assert!(at < epochs, "stopped at epoch {at}");
    ok(&benign(&stack(&stopped, true), &cache));
    for (ours, theirs) in run_folders(&stopped).iter().zip(run_folders(&whole)) {
        assert_same(
            &outcome(ours),
            &outcome(&theirs),
            &format!("{} resumed", ours.display()),
        );
    }

    // Stopped again; one folder resumes alone, then the others together: a run folder made by a
    // stack resumes alone, and runs stopped after other epochs train apart.
    let again = dir.path().join("again");
    let folders = || {
        if again.join("runs").is_dir() {
            run_folders(&again)
        } else {
            Vec::new()
        }
    };
    terminate_mid_phase_two(&stack(&again, false), &cache, &folders);
    let first = run_folders(&again)[0].clone();
    let (eta, seed) = eta_and_seed(&first);
    let alone = finetune_args(
        "last-layer",
        epochs,
        &[
            "--eta",
            &eta,
            "--seed",
            &seed,
            "--out",
            first.to_str().unwrap(),
            "--resume",
        ],
    );
    ok(&benign(&alone, &cache));
    ok(&benign(&stack(&again, true), &cache));
    for (ours, theirs) in run_folders(&again).iter().zip(run_folders(&whole)) {
        assert_same(
            &outcome(ours),
            &outcome(&theirs),
            &format!("{} resumed apart", ours.display()),
        );
    }
}

/// Puts a finished run back where a stop right after its epoch-0 log leaves it: the checkpoint
/// holds epoch 0's metrics and no trained epoch, and there is no summary yet.
fn back_to_epoch_zero(dir: &Path) {
    let saved = checkpoint::load(dir, &Device::Cpu).unwrap().unwrap();
    let mut state = saved.state;
    state.epochs_done = 0;
    state.optimizer_step = 0;
    state.log.truncate(1);
    checkpoint::save(dir, &state, &saved.tensors).unwrap();
    std::fs::remove_file(dir.join("summary.json")).unwrap();
}

/// A run that has not reached phase 2: nothing but its config.
fn back_to_nothing(dir: &Path) {
    for file in ["summary.json", "checkpoint.safetensors", "metrics.jsonl"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn a_resumed_stack_starts_each_run_where_its_own_folder_says() {
    let test = "stack::a_resumed_stack_starts_each_run_where_its_own_folder_says";
    let Some(_) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let epochs = 12;
    for mode in ["last-layer", "head"] {
        let stack = dir.path().join(format!("{mode}-stack"));
        let flags = |etas: &str, extra: &[&str]| {
            let mut args = vec![
                "--eta",
                etas,
                "--seed",
                "42,7",
                "--out",
                stack.to_str().unwrap(),
            ];
            args.extend(extra);
            finetune_args(mode, epochs, &args)
        };
        ok(&benign(&flags("0,0.1", &[]), &cache));
        // Seed 42's runs stopped right after epoch 0; seed 7's had not reached phase 2.
        for run in run_folders(&stack) {
            match eta_and_seed(&run).1.as_str() {
                "42" => back_to_epoch_zero(&run),
                _ => back_to_nothing(&run),
            }
        }
        // Resumed with a run added that starts fresh beside them.
        ok(&benign(&flags("0,0.1,0.2", &["--resume"]), &cache));
        let runs = run_folders(&stack);
        assert_eq!(runs.len(), 6, "{runs:?}");
        for run in runs {
            let (eta, seed) = eta_and_seed(&run);
            let alone = dir.path().join(format!("{mode}-alone-{eta}-{seed}"));
            let args = [
                "--eta",
                &eta,
                "--seed",
                &seed,
                "--out",
                alone.to_str().unwrap(),
            ];
            ok(&benign(&finetune_args(mode, epochs, &args), &cache));
            assert_same(
                &outcome(&run),
                &outcome(&alone),
                &format!("{mode}, η {eta}, seed {seed}, resumed beside others"),
            );
        }
    }
}
