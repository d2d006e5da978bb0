//! Hostile use of the commands that write result folders: lists given a value twice, an `--out`
//! laid out for the other kind of command, sweeps sharing an `--out`, cell files and summaries
//! edited by hand, a damaged log under a report, links in a result folder. Each is refused in one
//! line naming the flag or the file, with a non-zero exit, before anything is written. None needs
//! data or a backbone: every check comes before the work.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

fn benign(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .env("BENIGN_DATA_DIR", "/nonexistent-data-root")
        .env(
            "BENIGN_CACHE_DIR",
            std::env::temp_dir().join("benign-hostile-use-cache"),
        )
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Refused: a non-zero exit, and `needle` in the last line of stderr.
fn refused(out: &Output, needle: &str, case: &str) {
    let err = stderr(out);
    assert!(!out.status.success(), "{case}: accepted\n{err}");
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains(needle),
        "{case}: last line {last:?} lacks {needle:?}\n{err}"
    );
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

const FINETUNE: [&str; 5] = ["finetune", "--dataset", "breastmnist", "--epochs", "2"];

fn finetune(extra: &[&str]) -> Output {
    let args: Vec<&str> = FINETUNE.iter().chain(extra).copied().collect();
    benign(&args)
}

#[test]
fn a_value_given_twice_is_refused_and_minus_zero_is_zero() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for (eta, seed, flag) in [
        ("0.2,0.2", "42", "--eta: 0.2 is given twice"),
        ("0,-0", "42", "--eta: -0 is given twice"),
        ("0.1", "7,8,7", "--seed: 7 is given twice"),
    ] {
        let ended = finetune(&["--eta", eta, "--seed", seed, "--out", path(&out)]);
        refused(&ended, flag, eta);
        assert!(
            !out.exists(),
            "{eta}: a refused command left {}",
            out.display()
        );
    }
    // A value with a leading minus is a value, refused by its range, not an unknown flag.
    refused(
        &finetune(&["--eta", "-inf"]),
        "--eta must be in [0, 1), got -inf",
        "-inf",
    );
}

#[test]
fn minus_zero_names_the_run_as_zero_does() {
    use benign_attention::data::DatasetName;
    use benign_attention::train::run::RunConfig;
    let paper = RunConfig::paper(&DatasetName::BreastMnist).unwrap();
    let name = |eta: f64| {
        RunConfig {
            eta,
            ..paper.clone()
        }
        .with_noise_draw()
        .run_name()
        .unwrap()
    };
    assert_eq!(name(-0.0), name(0.0));
    assert!(name(-0.0).contains("_eta0_"), "{}", name(-0.0));
}

#[test]
fn one_layout_per_out() {
    let dir = tempfile::tempdir().unwrap();
    // A lone run's folder refuses a stack.
    let lone = dir.path().join("lone");
    std::fs::create_dir(&lone).unwrap();
    std::fs::write(lone.join("config.json"), "{}").unwrap();
    refused(
        &finetune(&["--eta", "0,0.1", "--out", path(&lone)]),
        "holds a single run",
        "stack into a lone run's folder",
    );
    assert!(!lone.join("runs").exists());
    // A stack's folder refuses a lone run, resumed or not.
    let stack = dir.path().join("stack");
    std::fs::create_dir_all(stack.join("runs/some-run")).unwrap();
    for resume in [false, true] {
        let mut args = vec!["--eta", "0.1", "--out", path(&stack)];
        if resume {
            args.push("--resume");
        }
        refused(
            &finetune(&args),
            "holds several runs",
            "lone run into a stack's folder",
        );
    }
    assert!(!stack.join("config.json").exists());
}

#[test]
fn absurd_sizes_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "synthetic-sweep",
                "--grid",
                "coarse",
                "--num-steps",
                "100000000000",
            ],
            "--num-steps must be in 1..=100000000",
        ),
        (
            &[
                "synthetic-sweep",
                "--grid",
                "coarse",
                "--num-steps",
                "3",
                "--jobs",
                "1000000",
            ],
            "--jobs must be at most 4096",
        ),
        (
            &["synthetic", "--signal-norm", "1e40"],
            "--signal-norm must be a number in (0, 1e12]",
        ),
        (
            &[
                "reproduce",
                "table2",
                "--jobs",
                "1000000",
                "--datasets",
                "trec",
            ],
            "--jobs must be at most 4096",
        ),
    ];
    for (args, needle) in cases {
        let mut args = args.to_vec();
        args.extend(["--out", path(&out)]);
        let started = Instant::now();
        let ended = benign(&args);
        refused(&ended, needle, &args.join(" "));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{args:?} took {:?}",
            started.elapsed()
        );
        assert!(!out.exists(), "{args:?} left {}", out.display());
    }
}

/// A tiny synthetic sweep: 81 cells of a few steps each.
fn sweep_args<'a>(out: &'a Path, seed: &'a str, steps: &'a str) -> Vec<&'a str> {
    vec![
        "synthetic-sweep",
        "--model",
        "token-selector",
        "--grid",
        "coarse",
        "--num-steps",
        steps,
        "--train-n",
        "4",
        "--test-n",
        "4",
        "--jobs",
        "1",
        "--seed",
        seed,
        "--out",
        path(out),
    ]
}

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_sweep_holds_its_out() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    // A long sweep, seen to have started (its record written) before the second comes.
    let mut first = spawn(&sweep_args(&out, "42", "20000"));
    let started = Instant::now();
    while !out.join("cells/sweep.json").exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the first sweep never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let other_seed = benign(&sweep_args(&out, "7", "20000"));
    let same = benign(&sweep_args(&out, "42", "20000"));
    first.kill().unwrap();
    first.wait().unwrap();
    refused(
        &other_seed,
        "holds the cells of another sweep",
        "another seed",
    );
    refused(
        &same,
        "another sweep process is running this part",
        "the same sweep twice",
    );
}

#[test]
fn a_cell_file_must_hold_its_cells_row() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    let made = benign(&sweep_args(&out, "42", "3"));
    assert!(made.status.success(), "{}", stderr(&made));
    let cell = out.join("cells/d1500_mu30.json");
    let original = std::fs::read_to_string(&cell).unwrap();
    let edits: [(&str, serde_json::Value); 4] = [
        ("embed_dim", 99999.into()),
        ("test_acc", 7.5.into()),
        ("noisy_fitted", 1_000_000_000u64.into()),
        ("train_loss", (-1.0).into()),
    ];
    for (field, value) in edits {
        let mut file: serde_json::Value = serde_json::from_str(&original).unwrap();
        file["row"][field] = value;
        std::fs::write(&cell, serde_json::to_string(&file).unwrap()).unwrap();
        std::fs::remove_file(out.join("sweep.csv")).unwrap_or(());
        let ended = benign(&sweep_args(&out, "42", "3"));
        refused(
            &ended,
            "d1500_mu30.json: not the row of the cell it names",
            field,
        );
        assert!(
            !out.join("sweep.csv").exists(),
            "{field}: sweep.csv written"
        );
    }
}

/// A copy of one committed Table 2 run (summary.json and config.json) under `dir/runs/`.
fn committed_run(dir: &Path) -> PathBuf {
    let runs = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/table2-offline/runs");
    let name = "breastmnist_last-layer_n200_eta0.2_seed42_";
    let source = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with(name))
        .expect("the committed BreastMNIST run");
    let run = dir.join("runs").join(source.file_name().unwrap());
    std::fs::create_dir_all(&run).unwrap();
    for file in ["summary.json", "config.json"] {
        std::fs::copy(source.join(file), run.join(file)).unwrap();
    }
    run
}

fn edit_summary(run: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let file = run.join("summary.json");
    let mut summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    edit(&mut summary);
    std::fs::write(&file, serde_json::to_string(&summary).unwrap()).unwrap();
}

#[test]
fn a_report_reads_every_input_before_it_writes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    let run = committed_run(&input);
    let out = dir.path().join("out");
    std::fs::write(run.join("metrics.jsonl"), "{\"epoch\": 0, \"train_lo").unwrap();
    let args = [
        "reproduce",
        "report",
        path(&input),
        "--out",
        path(&out),
        "--allow-partial",
    ];
    refused(&benign(&args), "metrics.jsonl: line 1", "a log cut short");
    assert!(!out.exists(), "a refused report wrote {}", out.display());
    // Into the input folder itself: nothing beside the runs.
    let args = [
        "reproduce",
        "report",
        path(&input),
        "--out",
        path(&input),
        "--allow-partial",
    ];
    refused(
        &benign(&args),
        "metrics.jsonl: line 1",
        "a log cut short, --out the input",
    );
    assert!(!input.join("results.csv").exists());
    std::fs::remove_file(run.join("metrics.jsonl")).unwrap();
    // An n·SNR² no estimate makes.
    for value in [-1.0, 1e308] {
        edit_summary(&run, |s| {
            s["snr"] = serde_json::json!({
                "estimator": 3, "samples": 200, "classes": 2, "embed_dim": 192,
                "effective_dim": 70.0, "mean_tokens": 197.0, "signal_norm": 1.0,
                "noise_norm": 1.0, "other_noise_norm": 1.0, "snr": 0.1, "n_snr2": value,
                "n_snr2_interval": [0.0, 1.0], "raw_n_snr2": value,
                "floor": {"mean": 0.0, "q95": 1.0, "permutations": 1000},
                "p_value": 0.001, "modal_position": 0, "modal_share": 0.1
            })
        });
        let args = [
            "reproduce",
            "report",
            path(&input),
            "--out",
            path(&out),
            "--allow-partial",
        ];
        refused(
            &benign(&args),
            "summary.json: snr is not an estimate",
            &value.to_string(),
        );
        assert!(!out.exists());
    }
}

#[test]
fn reproduce_snr_checks_every_run_before_it_works() {
    let dir = tempfile::tempdir().unwrap();
    let snr = |folder: &Path| benign(&["reproduce", "snr", path(folder)]);
    // A run folder linked from another result folder.
    let elsewhere = dir.path().join("elsewhere");
    let run = committed_run(&elsewhere);
    let linked = dir.path().join("linked");
    std::fs::create_dir_all(linked.join("runs")).unwrap();
    std::os::unix::fs::symlink(&run, linked.join("runs").join(run.file_name().unwrap())).unwrap();
    refused(
        &snr(&linked),
        ": a link; reproduce snr writes only the runs inside",
        "a link",
    );
    // A loop of links in runs/.
    let looped = dir.path().join("looped");
    std::fs::create_dir_all(looped.join("runs")).unwrap();
    std::os::unix::fs::symlink(looped.join("runs/b"), looped.join("runs/a")).unwrap();
    std::os::unix::fs::symlink(looped.join("runs/a"), looped.join("runs/b")).unwrap();
    refused(&snr(&looped), ": a link", "a loop of links");
    // A summary edited to another seed, another dataset, or a value no run takes.
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit, &str); 3] = [
        (
            "seed",
            |s| s["config"]["seed"] = 43.into(),
            "its config differs from",
        ),
        (
            "dataset",
            |s| s["config"]["dataset"] = "trec".into(),
            "its config differs from",
        ),
        (
            "n 0",
            |s| s["config"]["n"] = 0.into(),
            "summary.json: its config is not a run's",
        ),
    ];
    for (case, edit, needle) in edits {
        let own = dir.path().join(case);
        let run = committed_run(&own);
        edit_summary(&run, |s| {
            s.as_object_mut().unwrap().remove("snr");
            edit(s)
        });
        let before = std::fs::read(run.join("summary.json")).unwrap();
        let ended = snr(&own);
        refused(&ended, needle, case);
        assert!(
            !stderr(&ended).contains("features"),
            "{case}: work started before the refusal"
        );
        assert_eq!(
            before,
            std::fs::read(run.join("summary.json")).unwrap(),
            "{case}"
        );
    }
    // Both files edited alike: the folder's name still tells.
    let both = dir.path().join("both");
    let run = committed_run(&both);
    edit_summary(&run, |s| {
        s.as_object_mut().unwrap().remove("snr");
        s["config"]["seed"] = 43.into();
    });
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("config.json")).unwrap()).unwrap();
    config["seed"] = 43.into();
    std::fs::write(run.join("config.json"), config.to_string()).unwrap();
    refused(&snr(&both), "not its folder's", "seed edited in both files");
}

/// `finetune` at quick sizes on BreastMNIST under the shell limit `ulimit`, with `seeds` seeds.
fn finetune_limited(ulimit: &str, seeds: std::ops::Range<u64>, n: &str, out: &Path) -> Output {
    let seeds: Vec<String> = seeds.map(|s| s.to_string()).collect();
    let seeds = seeds.join(",");
    let args = [
        "-c",
        &format!("ulimit {ulimit} && exec \"$0\" \"$@\""),
        env!("CARGO_BIN_EXE_benign-attention"),
        "finetune",
        "--dataset",
        "breastmnist",
        "--pretrain-n",
        "120",
        "--n",
        n,
        "--test-n",
        "60",
        "--pretrain-epochs",
        "10",
        "--epochs",
        "2",
        "--eta",
        "0.2",
        "--seed",
        &seeds,
        "--out",
        path(out),
    ];
    Command::new("sh").args(args).output().unwrap()
}

fn summaries(out: &Path) -> usize {
    std::fs::read_dir(out.join("runs"))
        .map(|runs| {
            runs.flatten()
                .filter(|run| run.path().join("summary.json").is_file())
                .count()
        })
        .unwrap_or(0)
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn a_stack_fits_the_process_limits_or_is_refused_before_work() {
    let test = "hostile_use::a_stack_fits_the_process_limits_or_is_refused_before_work";
    let Some(_) = common::data_and_models_roots(test, &["medmnist"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Few descriptors: the stack is split so that each part's files fit.
    let out = dir.path().join("files");
    let ended = finetune_limited("-n 100", 1..61, "30", &out);
    assert!(ended.status.success(), "{}", stderr(&ended));
    assert_eq!(summaries(&out), 60);
    // Little address space: split by memory, every run finished.
    let out = dir.path().join("split");
    let ended = finetune_limited("-v 3000000", 1..41, "200", &out);
    assert!(ended.status.success(), "{}", stderr(&ended));
    assert!(stderr(&ended).contains("40 runs in"), "{}", stderr(&ended));
    assert_eq!(summaries(&out), 40);
    // Too little for one run: one line, nothing written.
    let out = dir.path().join("refused");
    let ended = finetune_limited("-v 1500000", 1..31, "30", &out);
    refused(&ended, "one run of --n 30 needs about", "ulimit -v 1500000");
    assert_eq!(ended.status.code(), Some(2));
    assert!(!out.exists(), "a refused stack left {}", out.display());
}
