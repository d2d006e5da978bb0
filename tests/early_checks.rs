//! What a run or a grid can be refused for is found before any work, in one line, and leaves
//! nothing behind; grids tell what they lack. Each test here failed on the build before these
//! checks (docs/usage.md, errors): a run folder or `--out` refused only after extraction, a
//! tokenizer past the model's vocabulary refused midway, an empty `BENIGN_DATA_DIR` leaving a
//! folder, an overflowing `--pretrain-n` panicking, `--train-threads 100000` accepted, two
//! `reproduce` on one folder, a merge silent about a missing shard, a stop message counting
//! wrongly, an unquoted hint, and checkpoints and caches other accounts could not read.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use benign_attention::data::DatasetName;
use benign_attention::train::run::RunConfig;

mod common;

fn benign(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .env("BENIGN_CACHE_DIR", cache)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The error lines of `out` (notes and warnings left out).
fn error_lines(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter(|l| !l.starts_with("note:") && !l.starts_with("warning:"))
        .map(String::from)
        .collect()
}

fn assert_one_line(out: &Output, code: i32, needles: &[&str]) {
    let lines = error_lines(out);
    assert_eq!(out.status.code(), Some(code), "{}", stderr(out));
    assert_eq!(lines.len(), 1, "{}", stderr(out));
    for needle in needles {
        assert!(lines[0].contains(needle), "{needle:?} not in {}", lines[0]);
    }
}

/// Every file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// No feature was extracted into `cache`.
fn assert_no_features(cache: &Path) {
    let shards: Vec<PathBuf> = files_under(cache)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("shard-"))
        .collect();
    assert!(
        shards.is_empty(),
        "features were extracted first: {shards:?}"
    );
}

const SMALL: [&str; 10] = [
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

fn finetune_trec(extra: &[&str], cache: &Path) -> Output {
    let mut args = vec!["finetune", "--dataset", "trec", "--eta", "0.2"];
    args.extend(SMALL);
    args.extend(extra);
    benign(&args, cache)
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn a_run_is_refused_for_its_folder_and_flags_before_any_extraction() {
    let test = "early_checks::a_run_is_refused_for_its_folder_and_flags_before_any_extraction";
    let Some(_) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");

    // A folder holding another run's config.json (another η).
    let out = dir.path().join("other-run");
    std::fs::create_dir_all(&out).unwrap();
    let theirs = RunConfig {
        eta: 0.3,
        ..RunConfig::paper(&DatasetName::Trec).unwrap()
    };
    std::fs::write(
        out.join("config.json"),
        serde_json::to_vec(&theirs).unwrap(),
    )
    .unwrap();
    let refused = finetune_trec(&["--out", out.to_str().unwrap()], &cache);
    assert_one_line(&refused, 2, &["--out", "another run"]);
    assert_no_features(&cache);

    // An --out that cannot be made.
    let refused = finetune_trec(&["--out", "/proc/benign-attention-run"], &cache);
    assert_one_line(&refused, 2, &["/proc/benign-attention-run"]);
    assert_no_features(&cache);

    // Flags past their bounds: sizes that overflow, more threads than a machine has.
    let refused = finetune_trec(&["--pretrain-n", "18446744073709551596"], &cache);
    assert_one_line(&refused, 2, &["--pretrain-n"]);
    let refused = finetune_trec(&["--train-threads", "100000"], &cache);
    assert_one_line(&refused, 2, &["--train-threads", "1024"]);
    assert_no_features(&cache);
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn a_tokenizer_past_the_models_vocabulary_is_refused_at_load() {
    let test = "early_checks::a_tokenizer_past_the_models_vocabulary_is_refused_at_load";
    let Some((_, models)) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let source = models.join("sentence-transformers/all-MiniLM-L6-v2");
    let backbone = dir.path().join("minilm");
    std::fs::create_dir_all(&backbone).unwrap();
    for entry in std::fs::read_dir(&source).unwrap().flatten() {
        let name = entry.file_name();
        if name != "tokenizer.json" {
            std::os::unix::fs::symlink(entry.path(), backbone.join(&name)).unwrap();
        }
    }
    // The same tokenizer with one more token: its id falls past the word embeddings' 30 522 rows.
    let mut tokenizer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(source.join("tokenizer.json")).unwrap()).unwrap();
    tokenizer["added_tokens"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "id": 99999, "content": "[FAR]", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }));
    let file = backbone.join("tokenizer.json");
    std::fs::write(&file, serde_json::to_vec(&tokenizer).unwrap()).unwrap();
    let refused = finetune_trec(&["--backbone", backbone.to_str().unwrap()], &cache);
    assert_one_line(
        &refused,
        2,
        &[file.to_str().unwrap(), "30523 token ids", "30522 rows"],
    );
    // Nothing in the cache, not even a folder holding a lock.
    assert!(files_under(&cache).is_empty(), "{:?}", files_under(&cache));
}

#[test]
fn an_empty_data_dir_variable_leaves_no_folder_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args([
            "finetune",
            "--dataset",
            "trec",
            "--eta",
            "0.2",
            "--out",
            "run",
        ])
        .env("BENIGN_DATA_DIR", "")
        .env("BENIGN_CACHE_DIR", dir.path().join("cache"))
        .env("BENIGN_DATA_MIRROR", "http://127.0.0.1:9")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // The cache folder is the test's own; the working directory must gain no `datasets/` or `run/`.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| !p.ends_with("cache"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_second_reproduce_on_one_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("grid");
    std::fs::create_dir_all(&out).unwrap();
    let _first = benign_attention::io::FileLock::try_take(&out.join(".reproduce.lock"))
        .unwrap()
        .unwrap();
    let second = benign(
        &[
            "reproduce",
            "table2",
            "--budget",
            "quick",
            // A committed CSV, so the check runs without a data root (a catalogue dataset
            // would be left out first, and the grid refused for having no runs).
            "--datasets",
            &format!(
                "csv:{}",
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/own/reviews.csv")
                    .display()
            ),
            "--out",
            out.to_str().unwrap(),
        ],
        &dir.path().join("cache"),
    );
    assert_one_line(&second, 2, &["another reproduce", out.to_str().unwrap()]);
}

/// `dir/runs/<run>` holding a finished run of the committed grid.
fn finished_run(dir: &Path, run: &str) {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("results/table2-offline/runs")
        .join(run);
    let folder = dir.join("runs").join(run);
    std::fs::create_dir_all(&folder).unwrap();
    for file in ["config.json", "summary.json"] {
        std::fs::copy(committed.join(file), folder.join(file)).unwrap();
    }
}

#[test]
fn a_merge_names_a_missing_shard_and_an_unfinished_run() {
    let dir = tempfile::tempdir().unwrap();
    let (done, unfinished) = (
        "breastmnist_last-layer_n20_eta0_seed42_b16d27bf7e",
        "breastmnist_last-layer_n20_eta0.2_seed42_unfinished",
    );
    let shard = dir.path().join("shard-1");
    finished_run(&shard, done);
    std::fs::create_dir_all(shard.join("runs").join(unfinished)).unwrap();
    let record =
        serde_json::json!({"grid": "g", "index": 1, "count": 2, "runs": [done, unfinished]});
    std::fs::write(shard.join("shard.json"), record.to_string()).unwrap();
    let report = dir.path().join("report");
    let args = |extra: &[&str]| {
        let mut args = vec![
            "reproduce",
            "report",
            shard.to_str().unwrap(),
            "--out",
            report.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let refused = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args(&[]))
        .output()
        .unwrap();
    assert_one_line(&refused, 2, &["shard 2/2", unfinished, "--allow-partial"]);
    assert!(!report.join("report.md").exists());
    let partial = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args(&["--allow-partial"]))
        .output()
        .unwrap();
    assert!(partial.status.success(), "{}", stderr(&partial));
    assert!(
        stderr(&partial).contains("shard 2/2"),
        "{}",
        stderr(&partial)
    );
    let markdown = std::fs::read_to_string(report.join("report.md")).unwrap();
    let header = markdown.split("## ").next().unwrap();
    assert!(
        header.contains("Partial report")
            && header.contains("shard 2/2")
            && header.contains(unfinished),
        "the report's header does not say what is missing:\n{header}"
    );
}

#[test]
fn the_printed_slurm_commands_are_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("with space");
    let made = benign(
        &[
            "reproduce",
            "slurm",
            "table2",
            "--shards",
            "2",
            "--budget",
            "quick",
            "--datasets",
            "trec",
            "--out",
            out.to_str().unwrap(),
        ],
        &dir.path().join("cache"),
    );
    assert!(made.status.success(), "{}", stderr(&made));
    let hint = stderr(&made);
    assert!(hint.contains(&format!("'{}'", out.display())), "{hint}");
    assert!(
        hint.contains(&format!("'{}/report'", out.display())),
        "{hint}"
    );
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn a_stopped_grid_counts_its_finished_runs_and_its_files_are_readable_by_others() {
    let test = "early_checks::a_stopped_grid_counts_its_finished_runs_and_its_files_are_readable_by_others";
    let Some(_) = common::data_and_models_roots(test, &["medmnist"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (cache, out) = (dir.path().join("cache"), dir.path().join("grid"));
    // Two runs, each a stack of its own (the smallest budget), one after the other.
    let mut child = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args([
            "reproduce",
            "table2",
            "--budget",
            "quick",
            "--datasets",
            "breastmnist",
            "--ns",
            "20",
            "--seeds",
            "42",
            "--etas",
            "0,0.2",
            "--jobs",
            "1",
            "--stack-memory",
            "0.000001",
            "--out",
        ])
        .arg(&out)
        .env("BENIGN_CACHE_DIR", &cache)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let summaries = || {
        files_under(&out.join("runs"))
            .into_iter()
            .filter(|p| p.ends_with("summary.json"))
            .count()
    };
    while summaries() == 0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the grid ended before it could be stopped"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let ended = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&ended.stderr).into_owned();
    assert_eq!(ended.status.code(), Some(143), "{text}");
    assert!(
        text.lines()
            .last()
            .unwrap_or_default()
            .contains("after 1 of 2 runs"),
        "{text}"
    );

    // Checkpoints, cache shards and phase-1 entries as readable as any file the umask allows.
    use std::os::unix::fs::PermissionsExt;
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let umask = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .map(|m| u32::from_str_radix(m.trim(), 8).unwrap())
        .unwrap();
    let written: Vec<PathBuf> = files_under(&out)
        .into_iter()
        .chain(files_under(&cache))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    assert!(
        written
            .iter()
            .any(|p| p.ends_with("checkpoint.safetensors")),
        "{written:?}"
    );
    assert!(
        written
            .iter()
            .any(|p| p.to_string_lossy().contains("phase1")),
        "{written:?}"
    );
    assert!(
        written
            .iter()
            .any(|p| p.to_string_lossy().contains("shard-")),
        "{written:?}"
    );
    for file in written {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644 & !umask, "{}", file.display());
    }
}
