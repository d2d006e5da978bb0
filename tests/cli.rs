//! The binary as a user meets it: outputs on disk, one-line errors with exit status 2.

use std::path::Path;
use std::process::{Command, Output};

fn benign(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_flags_give_one_line_and_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["--eta", "0.7"], "--noise-ratio"),
        (&["--noise-ratio", "-0.1"], "--noise-ratio"),
        (&["--train-n", "1"], "--train-n"),
        (&["--seq-len", "2"], "--seq-len"),
        (&["--embed-dim", "1"], "--embed-dim"),
        (&["--learning-rate", "0"], "--learning-rate"),
        (&["--learning-rate", "-0.1"], "--learning-rate"),
        (&["--learning-rate", "NaN"], "--learning-rate"),
        (&["--signal-norm", "0"], "--signal-norm"),
        (&["--num-steps", "0"], "--num-steps"),
        (&["--log-interval", "0"], "--log-interval"),
        (&["--locater", "-1"], "--locater"),
        // The default subspace engine cannot carry the penalty.
        (&["--locater", "1"], "--engine dense"),
        (&["--embed-dim", "many"], "--embed-dim"),
        (&["--no-such-flag"], "--no-such-flag"),
        (
            &["--config", "/nonexistent/synthetic.toml"],
            "/nonexistent/synthetic.toml",
        ),
        // The encoder's flags and the token selector's do not mix.
        (&["--mlp-dim", "10"], "--model encoder"),
        (&["--init-seed", "1"], "--model encoder"),
        (&["--model", "encoder", "--engine", "dense"], "--engine"),
        (&["--model", "encoder", "--locater", "1"], "--locater"),
        (&["--model", "encoder", "--mlp-dim", "0"], "--mlp-dim"),
    ];
    for (args, expected) in cases {
        let mut full = vec!["synthetic"];
        full.extend_from_slice(args);
        let out = benign(&full);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?} printed more than one line:\n{err}"
        );
        assert!(
            err.contains(expected),
            "{args:?}: error does not name {expected}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?} printed results");
    }
    let out = benign(&["synthetic-sweep", "--jobs", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--jobs"));
}

#[test]
fn synthetic_writes_metrics_summary_and_figures() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let out = benign(&[
        "synthetic",
        "--embed-dim",
        "300",
        "--signal-norm",
        "8",
        "--num-steps",
        "50",
        "--test-n",
        "100",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let metrics = std::fs::read_to_string(out_dir.join("metrics.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        rows.iter()
            .map(|r| r["step"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![0, 10, 20, 30, 40, 50]
    );
    for key in [
        "train_loss",
        "train_acc",
        "test_loss",
        "test_acc",
        "noisy_fitted",
        "clean_token_probs",
        "noisy_token_probs",
    ] {
        assert!(rows[0].get(key).is_some(), "metrics lack {key}");
    }
    assert_eq!(rows[0]["clean_token_probs"].as_array().unwrap().len(), 8);

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    for key in [
        "train_acc",
        "test_acc",
        "train_loss",
        "test_loss",
        "noisy_fitted",
        "noisy_total",
        "clean_x1_prob",
        "regime",
    ] {
        assert!(summary.get(key).is_some(), "summary lacks {key}");
    }
    assert_eq!(summary["noisy_total"], 4);
    assert_eq!(summary["config"]["embed_dim"], 300);
    // stdout carries the summary as one JSON line.
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["regime"], summary["regime"]);
    for png in ["token_probs.png", "selected_tokens.png"] {
        assert!(
            std::fs::metadata(out_dir.join(png)).unwrap().len() > 10_000,
            "{png} too small"
        );
    }
}

#[test]
fn config_file_is_overridden_by_flags() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "embed_dim = 100\nnum_steps = 20\ntest_n = 10\nseed = 3\n",
    )
    .unwrap();
    let out = benign(&[
        "synthetic",
        "--config",
        config.to_str().unwrap(),
        "--seed",
        "5",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let summary: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(summary["config"]["embed_dim"], 100);
    assert_eq!(summary["config"]["seed"], 5);
    // Without --out the metrics stream to stdout before the summary: steps 0, 10, 20.
    assert_eq!(text.lines().count(), 4);
}

#[test]
fn an_output_path_that_is_a_file_is_refused_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("taken");
    std::fs::write(&file, "keep").unwrap();
    let out = benign(&[
        "synthetic",
        "--embed-dim",
        "50",
        "--num-steps",
        "5",
        "--test-n",
        "5",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not a directory"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// `command` (a sweep) on the coarse grid with tiny runs, writing to `out_dir`.
fn tiny_coarse_sweep(command: &str, out_dir: &std::path::Path) {
    let out = benign(&[
        command,
        "--grid",
        "coarse",
        "--num-steps",
        "30",
        "--train-n",
        "6",
        "--test-n",
        "20",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{command}: {}", stderr(&out));
}

#[test]
fn localization_sweep_writes_spectrum_columns_and_the_plot() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("loc");
    tiny_coarse_sweep("localization-sweep", &out_dir);
    let mut reader = csv::Reader::from_path(out_dir.join("localization.csv")).unwrap();
    let headers = reader.headers().unwrap().clone();
    let column = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (var, init) = (column("qk_sym_var"), column("qk_sym_var_init"));
    let records: Vec<csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    assert_eq!(records.len(), 81);
    for record in &records {
        let v: f64 = record[var].parse().unwrap();
        let v0: f64 = record[init].parse().unwrap();
        assert!(
            (v - v0).abs() < 0.05 && v > 0.1,
            "W₀ dominates W's spectrum: {v} vs {v0}"
        );
    }
    assert!(out_dir.join("entropy_vs_eigen_variance.png").exists());
}

#[test]
fn coarse_sweep_writes_csv_and_heat_maps() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("sweep");
    tiny_coarse_sweep("synthetic-sweep", &out_dir);
    let mut reader = csv::Reader::from_path(out_dir.join("sweep.csv")).unwrap();
    let headers = reader.headers().unwrap().clone();
    for column in [
        "embed_dim",
        "signal_norm",
        "snr",
        "train_loss",
        "test_loss",
        "train_acc",
        "test_acc",
        "noisy_fitted",
        "regime",
    ] {
        assert!(
            headers.iter().any(|h| h == column),
            "sweep.csv lacks {column}"
        );
    }
    assert_eq!(reader.records().count(), 81);
    for png in [
        "heatmap_train_loss.png",
        "heatmap_test_loss.png",
        "regime.png",
    ] {
        let path = out_dir.join(png);
        assert!(
            Path::new(&path).exists() && std::fs::metadata(&path).unwrap().len() > 5_000,
            "{png}"
        );
    }
}

/// A tiny encoder grid (coarse d and ‖μ‖, 3 steps, a narrow FFN) into `out_dir`, with `extra`.
fn tiny_encoder_sweep(out_dir: &std::path::Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "synthetic-sweep",
        "--model",
        "encoder",
        "--grid",
        "coarse",
        "--num-steps",
        "3",
        "--train-n",
        "4",
        "--test-n",
        "6",
        "--mlp-dim",
        "8",
        "--out",
        out_dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    benign(&args)
}

#[test]
fn an_encoder_sweep_in_shards_adds_up_to_one_run_and_resumes_only_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let out = tiny_encoder_sweep(&whole, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Two shards into one folder: the first draws nothing, the second everything.
    let parts = dir.path().join("parts");
    let first = tiny_encoder_sweep(&parts, &["--shard", "1/2"]);
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stderr(&first).contains("40 of 81 still to run"),
        "{}",
        stderr(&first)
    );
    assert!(!parts.join("sweep.csv").exists());
    let second = tiny_encoder_sweep(&parts, &["--shard", "2/2"]);
    assert!(second.status.success(), "{}", stderr(&second));
    let read = |folder: &std::path::Path| std::fs::read(folder.join("sweep.csv")).unwrap();
    assert_eq!(read(&whole), read(&parts), "two shards differ from one run");
    // A lost cell is run again, alone, and the table is the same.
    let lost = std::fs::read_dir(parts.join("cells"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.file_name().unwrap().to_str().unwrap().starts_with('d'))
        .unwrap();
    std::fs::remove_file(&lost).unwrap();
    let again = tiny_encoder_sweep(&parts, &[]);
    assert!(stderr(&again).contains("1 cells run"), "{}", stderr(&again));
    assert_eq!(read(&whole), read(&parts));
    // Another configuration is refused before it runs a cell, naming the sweep's record.
    let other = tiny_encoder_sweep(&parts, &["--learning-rate", "0.01"]);
    assert_eq!(other.status.code(), Some(2));
    assert!(
        stderr(&other).contains("cells/sweep.json"),
        "{}",
        stderr(&other)
    );
    // The encoder's heat maps are drawn.
    assert!(parts.join("heatmap_test_loss.png").exists());
}

#[test]
fn an_encoder_run_writes_its_outputs_and_config() {
    let dir = tempfile::tempdir().unwrap();
    let out = benign(&[
        "synthetic",
        "--model",
        "encoder",
        "--embed-dim",
        "64",
        "--mlp-dim",
        "16",
        "--num-steps",
        "20",
        "--test-n",
        "50",
        "--init-seed",
        "3",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["config"]["encoder"]["mlp_dim"], 16);
    assert_eq!(summary["config"]["encoder"]["init_seed"], 3);
    assert!(summary.get("engine").is_none(), "the encoder has no engine");
    assert!(summary["qk_symmetric"]["var"].as_f64().unwrap() > 0.0);
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 3, "steps 0, 10 and 20");
    for png in ["token_probs.png", "selected_tokens.png"] {
        assert!(dir.path().join(png).exists(), "{png}");
    }
}

#[test]
fn data_verify_fails_when_a_file_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("trec")).unwrap();
    let out = benign(&[
        "data",
        "verify",
        "trec",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("missing"), "{stdout}");
}

#[test]
fn extract_refuses_an_empty_selection() {
    let out = benign(&[
        "extract",
        "--dataset",
        "trec",
        "--backbone",
        "org/none",
        "--limit",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("--limit") && err.lines().count() == 1, "{err}");
}

#[test]
fn diagnose_snr_refuses_an_output_folder() {
    let out = benign(&[
        "diagnose",
        "snr",
        "--dataset",
        "trec",
        "--eta",
        "0.2",
        "--out",
        "/tmp/x",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("--out /tmp/x") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn a_missing_dataset_is_fetched_and_offline_fails_fast_naming_where_to_put_it() {
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let out = benign(&[
        "finetune",
        "--dataset",
        "breastmnist",
        "--eta",
        "0.2",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--cache-dir",
        dir.path().join("cache").to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    // It tried the download (this machine is offline), then kept the load's own advice.
    assert!(err.contains("downloading the official"), "{err}");
    assert!(err.contains("download failed"), "{err}");
    assert!(
        started.elapsed().as_secs() < 60,
        "took {:?}",
        started.elapsed()
    );
    assert!(
        !dir.path().join("medmnist").exists(),
        "a failed download left its folder"
    );
}
