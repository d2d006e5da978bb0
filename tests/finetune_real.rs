//! `finetune` on real data with a real backbone (TREC, all-MiniLM-L6-v2; BreastMNIST, ViT-Ti),
//! small sizes: both modes run end to end and write their outputs, attention maps included, also
//! when resumed; bad input is one line and exit 2.

use std::process::{Command, Output};

mod common;

fn benign(args: &[&str], cache: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .env("BENIGN_CACHE_DIR", cache)
        .output()
        .unwrap()
}

const SMALL: [&str; 12] = [
    "--pretrain-n",
    "200",
    "--n",
    "30",
    "--epochs",
    "4",
    "--pretrain-epochs",
    "3",
    "--test-n",
    "60",
    "--eval-every",
    "2",
];

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn both_modes_run_and_write_summary_and_metrics() {
    let test = "finetune_real::both_modes_run_and_write_summary_and_metrics";
    let Some((_, models)) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    // Without bert-base-uncased's weights (the offline mirror has only its tokenizer), the
    // fallback to the next backbone is a recorded deviation.
    let paper_bert = models.join("google-bert/bert-base-uncased/model.safetensors");
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    for mode in ["last-layer", "head"] {
        let out_dir = dir.path().join(mode);
        let mut args = vec![
            "finetune",
            "--dataset",
            "trec",
            "--eta",
            "0.2",
            "--mode",
            mode,
            "--out",
            out_dir.to_str().unwrap(),
        ];
        args.extend(SMALL);
        let out = benign(&args, &cache);
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if mode == "last-layer" {
            // The cold cache's samples go through the backbone on every core, not on the one
            // thread phases 1 and 2 train on.
            let cores = std::thread::available_parallelism().unwrap().get();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(&format!("through the backbone on {cores} threads")),
                "{stderr}"
            );
        }
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
                .unwrap();
        for key in [
            "config.dataset",
            "config.mode",
            "config.eta",
            "config.n",
            "config.seed",
            "resolved.backbone",
            "baseline_test_acc",
            "final.train_loss",
            "final.train_acc",
            "final.memorization",
            "final.clean_train_acc",
            "final.test_acc",
            "final.test_loss",
            "final.max_cls_attention",
            "deviations",
        ] {
            let value = key.split('.').fold(&summary, |v, k| &v[k]);
            assert!(!value.is_null(), "{mode}: summary lacks {key}");
        }
        assert_eq!(summary["config"]["mode"], mode);
        assert_eq!(summary["config"]["n"], 30);
        // Where each part ran: all on the host without --device or --train-device.
        assert_eq!(
            summary["resolved"]["placement"],
            serde_json::json!({"backbone": "cpu", "phase1": "cpu", "phase2": "cpu"})
        );
        assert!(summary["config"].get("train_device").is_none(), "{summary}");
        // config.json beside it is the configuration the summary reports.
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out_dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config, summary["config"]);
        if !paper_bert.exists() {
            assert!(
                summary["deviations"][0]
                    .as_str()
                    .unwrap()
                    .contains("instead of the paper's bert-base-uncased")
            );
        }
        let metrics = std::fs::read_to_string(out_dir.join("metrics.jsonl")).unwrap();
        let epochs: Vec<serde_json::Value> = metrics
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // Epoch 0, right after the reset, scored; then the 4 epochs, the test set every second.
        assert_eq!(epochs.len(), 5);
        assert_eq!(epochs[0]["epoch"], 0);
        assert!(epochs[0]["test_acc"].is_number() && epochs[0]["train_loss"].is_null());
        assert!(epochs[1]["test_acc"].is_null() && epochs[2]["test_acc"].is_number());
        assert!(epochs[4]["train_eval_loss"].is_number());
        assert_eq!(summary["reset_test_acc"], epochs[0]["test_acc"]);
        assert_eq!(
            std::fs::read_to_string(out_dir.join("pretrain.jsonl"))
                .unwrap()
                .lines()
                .count(),
            3
        );
        // The fine-tune set on the n·SNR² axis, and `diagnose snr` on the same flags (phase 1
        // from the cache) gives the very estimate the run recorded.
        let snr = &summary["snr"];
        assert_eq!(snr["samples"], 30, "{mode}: {snr}");
        for key in [
            "signal_norm",
            "noise_norm",
            "other_noise_norm",
            "snr",
            "n_snr2",
        ] {
            assert!(
                snr[key].as_f64().is_some_and(f64::is_finite),
                "{mode}: {key} in {snr}"
            );
        }
        let mut args = vec![
            "diagnose",
            "snr",
            "--dataset",
            "trec",
            "--eta",
            "0.2",
            "--mode",
            mode,
        ];
        args.extend(SMALL);
        let out = benign(&args, &cache);
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
        for key in [
            "samples",
            "signal_norm",
            "noise_norm",
            "snr",
            "n_snr2",
            "modal_position",
        ] {
            assert_eq!(printed[key], snr[key], "{mode}: {key}");
        }
        assert!(String::from_utf8_lossy(&out.stderr).contains("n·SNR²"));
    }
    // The second mode reused the cached sentences: every sample went through MiniLM once.
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn bad_input_is_one_line_and_exit_2() {
    let test = "finetune_real::bad_input_is_one_line_and_exit_2";
    let Some(_) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cases: &[(&[&str], &str)] = &[
        (&["--dataset", "trec", "--eta", "1.0"], "--eta"),
        (&["--dataset", "trec", "--eta", "-0.1"], "--eta"),
        (
            &["--dataset", "trec", "--eta", "0.2", "--n", "6000"],
            "exceeds",
        ),
        (
            &["--dataset", "imagenet", "--eta", "0.2"],
            "unknown dataset",
        ),
        (
            &[
                "--dataset",
                "trec",
                "--eta",
                "0.2",
                "--backbone",
                "org/nothing-here",
            ],
            "org/nothing-here",
        ),
        (
            &[
                "--dataset",
                "trec",
                "--eta",
                "0.2",
                "--backbone",
                "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k",
            ],
            "bert backbone is needed",
        ),
        (
            &["--dataset", "trec", "--eta", "0.2", "--device", "cuda"],
            "--features cuda",
        ),
        // Empty selections, refused by the flag that made them.
        (
            &["--dataset", "trec", "--eta", "0.2", "--pretrain-n", "0"],
            "--pretrain-n",
        ),
        (
            &["--dataset", "trec", "--eta", "0.2", "--test-n", "0"],
            "--test-n",
        ),
        // An unwritable cache is reported before any backbone is looked for.
        (
            &[
                "--dataset",
                "trec",
                "--eta",
                "0.2",
                "--backbone",
                "org/nothing-here",
                "--cache-dir",
                "/dev/null/cache",
            ],
            "cannot be written",
        ),
    ];
    let out_dir = dir.path().join("out");
    for (args, expected) in cases {
        let mut full = vec!["finetune", "--out", out_dir.to_str().unwrap()];
        full.extend_from_slice(args);
        let out = benign(&full, &cache);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}:\n{err}");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(!out_dir.exists(), "{args:?} left {}", out_dir.display());
    }
}

/// summary.json without its wall time, and metrics.jsonl, of a finished run.
fn outcome(dir: &std::path::Path) -> (serde_json::Value, String) {
    let mut summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    summary.as_object_mut().unwrap().remove("wall_seconds");
    (
        summary,
        std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap(),
    )
}

/// A run killed (SIGKILL) after a mid-phase-2 checkpoint and resumed ends exactly where an
/// uninterrupted run ends: same summary, same per-epoch metrics.
#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn killed_and_resumed_run_matches_an_uninterrupted_one() {
    use benign_attention::train::checkpoint;
    let test = "finetune_real::killed_and_resumed_run_matches_an_uninterrupted_one";
    let Some(_) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let epochs = 150;
    let args = |out: &std::path::Path| -> Vec<String> {
        let mut args: Vec<String> = [
            "finetune",
            "--dataset",
            "trec",
            "--eta",
            "0.2",
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
            "--out",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(out.to_str().unwrap().into());
        args.extend(["--epochs".into(), epochs.to_string()]);
        args
    };
    let whole = dir.path().join("whole");
    let out = benign(
        &args(&whole).iter().map(String::as_str).collect::<Vec<_>>(),
        &cache,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let killed = dir.path().join("killed");
    let mut child = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args(&killed))
        .env("BENIGN_CACHE_DIR", &cache)
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (done_at_kill, seconds_at_kill) = loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run finished before it could be killed"
        );
        if let Ok(Some(saved)) = checkpoint::load(&killed, &candle_core::Device::Cpu)
            && saved.state.epochs_done > 0
        {
            child.kill().unwrap();
            child.wait().unwrap();
            break (saved.state.epochs_done, saved.state.wall_seconds);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    assert!(done_at_kill < epochs, "killed at epoch {done_at_kill}");
    assert!(!killed.join("summary.json").exists());

    let mut resume = args(&killed);
    resume.push("--resume".into());
    let out = benign(
        &resume.iter().map(String::as_str).collect::<Vec<_>>(),
        &cache,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ours, theirs) = (outcome(&killed), outcome(&whole));
    assert_eq!(
        ours.0, theirs.0,
        "summary after resuming from epoch {done_at_kill}"
    );
    assert_eq!(
        ours.1, theirs.1,
        "metrics.jsonl after resuming from epoch {done_at_kill}"
    );
    // The wall time is the whole run's: the killed sitting's up to its checkpoint, then this one.
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(killed.join("summary.json")).unwrap()).unwrap();
    let wall = summary["wall_seconds"].as_f64().unwrap();
    assert!(
        seconds_at_kill > 0.0 && wall > seconds_at_kill,
        "wall_seconds {wall} after a sitting that had taken {seconds_at_kill} s"
    );
    // The epoch-0 panels come from the attention the checkpoint recorded: the same picture.
    assert!(
        std::fs::read(killed.join("attention_maps.png")).unwrap()
            == std::fs::read(whole.join("attention_maps.png")).unwrap(),
        "attention_maps.png after resuming from epoch {done_at_kill}"
    );

    // A checkpoint of another run is refused, in one line.
    let mut other = resume.clone();
    other[4] = "0.3".into();
    let out = benign(
        &other.iter().map(String::as_str).collect::<Vec<_>>(),
        &cache,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("belongs to another run") && err.contains("eta"),
        "{err}"
    );
}

/// Phase 1 is shared between runs only when it would be the same: another η reuses it, other
/// labels for the same sentences retrain it.
#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn phase_one_is_reused_only_with_the_same_labels() {
    let test = "finetune_real::phase_one_is_reused_only_with_the_same_labels";
    let Some((root, _)) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let root = root.to_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // A copy of TREC whose training labels are all moved to the next class.
    let relabelled = dir.path().join("data");
    std::fs::create_dir_all(relabelled.join("trec")).unwrap();
    let trec = std::path::Path::new(&root).join("trec");
    std::fs::copy(
        trec.join("TREC_10.label"),
        relabelled.join("trec/TREC_10.label"),
    )
    .unwrap();
    let classes = ["ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM"];
    let train = std::fs::read(trec.join("train_5500.label")).unwrap();
    let moved: Vec<u8> = train
        .split(|&b| b == b'\n')
        .map(|line| {
            let text = String::from_utf8_lossy(line);
            match classes
                .iter()
                .position(|c| text.starts_with(&format!("{c}:")))
            {
                Some(k) => {
                    let mut out = classes[(k + 1) % 6].as_bytes().to_vec();
                    out.extend_from_slice(&line[classes[k].len()..]);
                    out
                }
                None => line.to_vec(),
            }
        })
        .collect::<Vec<_>>()
        .join(&b'\n');
    std::fs::write(relabelled.join("trec/train_5500.label"), moved).unwrap();
    let run = |eta: &str, data: &str| {
        let mut args = vec![
            "finetune",
            "--dataset",
            "trec",
            "--eta",
            eta,
            "--data-dir",
            data,
        ];
        args.extend(["--pretrain-n", "200", "--n", "20", "--epochs", "1"]);
        args.extend(["--pretrain-epochs", "2", "--test-n", "40"]);
        let out = benign(&args, &cache);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err.contains("phase 1 epochs")
    };
    assert!(run("0.2", &root), "the first run trains phase 1");
    assert!(!run("0.0", &root), "another η reuses phase 1");
    assert!(
        run("0.2", relabelled.to_str().unwrap()),
        "other labels retrain phase 1"
    );
}

/// A data file that is not the official release (the offline PneumoniaMNIST is a derivative) is
/// a recorded deviation of the run, exactly when `data verify` says it differs.
#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn an_unofficial_data_file_is_a_recorded_deviation() {
    let test = "finetune_real::an_unofficial_data_file_is_a_recorded_deviation";
    let Some((root, _)) = common::data_and_models_roots(test, &["medmnist"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let verify = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args([
            "data",
            "verify",
            "pneumoniamnist",
            "--data-dir",
            root.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let differs = String::from_utf8_lossy(&verify.stdout).contains("MISMATCH");
    let out_dir = dir.path().join("run");
    let out = benign(
        &[
            "finetune",
            "--dataset",
            "pneumoniamnist",
            "--eta",
            "0.2",
            "--pretrain-n",
            "60",
            "--n",
            "20",
            "--epochs",
            "1",
            "--pretrain-epochs",
            "1",
            "--test-n",
            "30",
            "--out",
            out_dir.to_str().unwrap(),
        ],
        &dir.path().join("cache"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    let recorded = summary["deviations"].as_array().unwrap().iter().any(|d| {
        d.as_str()
            .unwrap()
            .contains("pneumoniamnist.npz is not the official release")
    });
    assert_eq!(recorded, differs, "{summary}");
}

/// attention_maps.png of a tiny image run (BreastMNIST, ViT-Ti) and a tiny text run (TREC,
/// MiniLM) is a valid PNG. A run killed before or right after epoch 0 and resumed draws the very
/// same picture: from the epoch-0 attention its checkpoint recorded, or, for a checkpoint without
/// that record (phase 1 only, or written before the maps existed), measured again on the reset
/// parameters, before the checkpoint's trained ones replace them.
#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn attention_maps_are_drawn_and_a_resumed_run_draws_the_same() {
    use benign_attention::train::checkpoint;
    let test = "finetune_real::attention_maps_are_drawn_and_a_resumed_run_draws_the_same";
    let Some(_) = common::data_and_models_roots(test, &["trec", "medmnist"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let image_sizes = [
        "--pretrain-n",
        "60",
        "--n",
        "20",
        "--epochs",
        "3",
        "--pretrain-epochs",
        "2",
        "--test-n",
        "30",
    ];
    for (dataset, sizes) in [("breastmnist", &image_sizes[..]), ("trec", &SMALL[..])] {
        let args = |out: &std::path::Path, resume: bool| -> Vec<String> {
            let mut args: Vec<String> = ["finetune", "--dataset", dataset, "--eta", "0.2"]
                .iter()
                .chain(sizes)
                .chain(&["--checkpoint-every", "1", "--out"])
                .map(|s| s.to_string())
                .collect();
            args.push(out.to_str().unwrap().into());
            if resume {
                args.push("--resume".into());
            }
            args
        };
        let run = |out: &std::path::Path, resume: bool| {
            let out = benign(
                &args(out, resume)
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
                &cache,
            );
            assert!(
                out.status.success(),
                "{dataset}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let whole = dir.path().join(dataset).join("whole");
        run(&whole, false);
        let maps = whole.join("attention_maps.png");
        let (width, height) = common::png_size(&maps);
        assert!(width >= 700 && height >= 500, "{dataset}: {width}×{height}");
        let picture = std::fs::read(&maps).unwrap();

        // What a run killed at those points leaves: the phase-1 classifier, and after epoch 0
        // its metrics (no step taken, so no optimizer state is read).
        let saved = checkpoint::load(&whole, &candle_core::Device::Cpu)
            .unwrap()
            .unwrap();
        assert!(saved.state.attention_reset.is_some(), "{dataset}");
        let classifier: std::collections::HashMap<_, _> = saved
            .tensors
            .iter()
            .filter(|(name, _)| name.starts_with("classifier."))
            .map(|(name, t)| (name.clone(), t.clone()))
            .collect();
        for (case, log, recorded) in [
            ("phase 1 only", Some(0), false),
            ("after epoch 0", Some(1), true),
            ("after epoch 0, no record", Some(1), false),
            // The finished run's own checkpoint, as one written before the maps existed.
            ("after the last epoch, no record", None, false),
        ] {
            let resumed = dir.path().join(dataset).join(case.replace([' ', ','], "-"));
            let mut state = saved.state.clone();
            if let Some(log) = log {
                state.epochs_done = 0;
                state.optimizer_step = 0;
                state.log.truncate(log);
            }
            if !recorded {
                state.attention_reset = None;
            }
            let tensors = if log.is_some() {
                &classifier
            } else {
                &saved.tensors
            };
            std::fs::create_dir_all(&resumed).unwrap();
            checkpoint::save(&resumed, &state, tensors).unwrap();
            run(&resumed, true);
            let (ours, theirs) = (outcome(&resumed), outcome(&whole));
            assert_eq!(ours, theirs, "{dataset}, resumed {case}");
            assert!(
                std::fs::read(resumed.join("attention_maps.png")).unwrap() == picture,
                "{dataset}, resumed {case}: another attention_maps.png"
            );
        }
    }
}

/// CPU ticks (user + system) of each of `pid`'s threads, by thread id.
fn thread_ticks(pid: u32) -> Vec<(u64, u64)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let tid: u64 = task.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            // Fields after the command name, which may hold spaces: state is field 3, utime 14.
            let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let ticks = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
            Some((tid, ticks))
        })
        .collect()
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn a_cold_run_extracts_on_every_core() {
    let test = "finetune_real::a_cold_run_extracts_on_every_core";
    let Some(_) = common::data_and_models_roots(test, &["medmnist"]) else {
        return;
    };
    let cores = std::thread::available_parallelism().unwrap().get();
    if cores < 2 {
        let _ = common::skip::<()>(test, "one core: nothing to spread the extraction over");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args([
            "finetune",
            "--dataset",
            "breastmnist",
            "--eta",
            "0.2",
            "--pretrain-n",
            "400",
            "--n",
            "30",
            "--test-n",
            "100",
            "--pretrain-epochs",
            "1",
            "--epochs",
            "1",
        ])
        .env("BENIGN_CACHE_DIR", dir.path().join("cache"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The last reading of every thread the run had: the extraction is nearly all of its work.
    let mut last: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    while child.try_wait().unwrap().is_none() {
        for (tid, ticks) in thread_ticks(child.id()) {
            last.insert(tid, ticks);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(child.wait().unwrap().success());
    let busiest = last.values().copied().max().unwrap_or(0);
    assert!(busiest > 0, "no CPU time read for the run's threads");
    let working = last.values().filter(|&&t| 4 * t >= busiest).count();
    assert!(
        working >= cores.min(4),
        "{working} of the run's threads did a quarter of the busiest one's work, on {cores} cores: {last:?}"
    );
}

/// A run folder's own config.json given back with `--config` replays the run: the same
/// metrics.jsonl byte for byte, the same config.json; a flag beside it overrides the file.
#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn a_run_replays_from_its_own_config_json() {
    let test = "finetune_real::a_run_replays_from_its_own_config_json";
    if common::data_and_models_roots(test, &["medmnist"]).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let first = dir.path().join("first");
    let mut args = vec!["finetune", "--dataset", "breastmnist", "--eta", "0.2"];
    args.extend(SMALL);
    args.extend([
        "--seed",
        "5",
        "--mode",
        "head",
        "--out",
        first.to_str().unwrap(),
    ]);
    let made = benign(&args, &cache);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let config = first.join("config.json");
    let replay = dir.path().join("replay");
    let again = benign(
        &[
            "finetune",
            "--config",
            config.to_str().unwrap(),
            "--out",
            replay.to_str().unwrap(),
        ],
        &cache,
    );
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    for file in ["metrics.jsonl", "config.json"] {
        assert_eq!(
            std::fs::read(first.join(file)).unwrap(),
            std::fs::read(replay.join(file)).unwrap(),
            "{file}"
        );
    }
    // A flag beside the file overrides it, and the run records the result.
    let other = dir.path().join("other");
    let changed = benign(
        &[
            "finetune",
            "--config",
            config.to_str().unwrap(),
            "--epochs",
            "2",
            "--out",
            other.to_str().unwrap(),
        ],
        &cache,
    );
    assert!(
        changed.status.success(),
        "{}",
        String::from_utf8_lossy(&changed.stderr)
    );
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(other.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (recorded["epochs"].as_u64(), recorded["seed"].as_u64()),
        (Some(2), Some(5))
    );
    assert_eq!(recorded["mode"], "head");
    // Bad files: one line naming the file, exit 2.
    let bad = dir.path().join("bad.toml");
    for (text, expected) in [
        (
            "dataset = \"breastmnist\"\neta = 0.1\nepoch = 3\n",
            "unknown key `epoch`",
        ),
        (
            "dataset = \"breastmnist\"\neta = 0.1\nn = \"many\"\n",
            "key `n`: expected a number",
        ),
    ] {
        std::fs::write(&bad, text).unwrap();
        let out = benign(&["finetune", "--config", bad.to_str().unwrap()], &cache);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains("bad.toml") && err.contains(expected), "{err}");
    }
    let missing = benign(&["finetune", "--config", "/nonexistent/lab.toml"], &cache);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/lab.toml"));
}
