//! `reproduce slurm` on a real Slurm: the job-array script of a small grid (TREC, n = 20,
//! η ∈ {0, 0.2}, seed 42, the quick budget: two runs, one per array task) is submitted with
//! sbatch, and its two shards, merged by `reproduce report`, give the report and results of the
//! same grid run locally. Needs a Slurm with a node up: scripts/start-slurm.sh starts a
//! single-node one on a Debian machine, and `.ci/run` calls it. Without one the test is skipped
//! with the reason on stderr (a failure under `BENIGN_REQUIRE_DATA=1`, as CI runs it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;

const TEST: &str = "slurm::an_array_of_shards_merges_into_the_report_of_a_local_run";

/// The grid's flags, shared by the script and the local run (the grid of tests/reproduce.rs).
const GRID: [&str; 10] = [
    "--datasets",
    "trec",
    "--ns",
    "20",
    "--etas",
    "0,0.2",
    "--seeds",
    "42",
    "--budget",
    "quick",
];

const SHARDS: usize = 2;

/// How long the array may take. Each task is one run, under a minute on one core of a two-core
/// machine with a cold cache (feature extraction included); the margin is for a slower or busier
/// node, where the tasks may also wait in the queue.
const TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The files of the merged report and of the local run that must be equal byte for byte. No
/// column of results.csv differs legitimately: it holds no time or host of a run (those stay in
/// each run's folder), the folders it names are written as `$BENIGN_DATA_DIR/...`,
/// `$BENIGN_MODELS_DIR/...`, whatever they are, `config.train_threads` is the run's own setting
/// (1), not the cores of where it ran, and every number follows from the seed. (On a cluster of
/// unlike nodes `resolved.float_kernels`, the SIMD kernels picked at run time, and with it the
/// last digits could differ; the test's Slurm has one node, this machine.)
const SAME: [&str; 4] = [
    "results.csv",
    "verdicts.csv",
    "attention_maps.csv",
    "fig9_cls_attention.csv",
];

/// The folders every command of the test is given, as the variables the program reads.
struct Places {
    data: PathBuf,
    models: PathBuf,
    cache: PathBuf,
}

fn benign(args: &[&str], places: &Places) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args)
        .env("BENIGN_DATA_DIR", &places.data)
        .env("BENIGN_MODELS_DIR", &places.models)
        .env("BENIGN_CACHE_DIR", &places.cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Why Slurm cannot take the array here, or `None` when it can: its commands are on PATH and a
/// node answers, idle or partly allocated (sinfo's long state; a node that does not respond shows
/// a `*` suffix, one drained or down another state, and an allocated one might not start the
/// array within the timeout).
fn slurm_unavailable() -> Option<String> {
    const HOW: &str =
        "scripts/start-slurm.sh installs and starts a single-node Slurm (as root, on Debian)";
    for program in ["sbatch", "squeue", "sinfo", "scontrol", "scancel"] {
        if !on_path(program) {
            return Some(format!("{program} is not on PATH; {HOW}"));
        }
    }
    let out = match Command::new("sinfo").args(["-h", "-o", "%T"]).output() {
        Ok(out) => out,
        Err(e) => return Some(format!("sinfo: {e}; {HOW}")),
    };
    let states = String::from_utf8_lossy(&out.stdout);
    if out.status.success()
        && states
            .lines()
            .any(|state| matches!(state.trim(), "idle" | "mixed"))
    {
        return None;
    }
    Some(format!(
        "no idle or mixed Slurm node (sinfo: {:?} {:?}); {HOW}",
        states.trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// A submitted array, cancelled when dropped before it finished (a timeout or a failed
/// assertion), so that a failing test leaves no tasks behind on the cluster.
struct Job {
    id: String,
    finished: bool,
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.finished {
            let _ = Command::new("scancel").arg(&self.id).output();
        }
    }
}

/// One array task as `scontrol show job` lists it.
#[derive(Debug)]
struct Task {
    /// The task's index, or the range of those not started yet ("1-2").
    index: String,
    state: String,
    exit_code: String,
}

impl Task {
    /// Whether the task has ended, in any way.
    fn ended(&self) -> bool {
        matches!(
            self.state.as_str(),
            "COMPLETED"
                | "FAILED"
                | "CANCELLED"
                | "TIMEOUT"
                | "OUT_OF_MEMORY"
                | "NODE_FAIL"
                | "BOOT_FAIL"
                | "DEADLINE"
                | "PREEMPTED"
        )
    }
}

/// The array's tasks, `None` once the controller no longer knows the job (it forgets a finished
/// job MinJobAge, by default 300 s, after its end; there is no accounting to ask instead), and
/// an empty list when scontrol fails otherwise (the controller busy: asked again).
fn tasks(job: &str) -> Option<Vec<Task>> {
    // -o: one line per job record (each started array task is its own record), key=value fields.
    let out = Command::new("scontrol")
        .args(["show", "job", "-o", job])
        .output()
        .unwrap();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return if err.contains("Invalid job id") {
            None
        } else {
            Some(Vec::new())
        };
    }
    let records = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let field = |key: &str| {
                line.split_whitespace()
                    .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
                    .unwrap_or("?")
                    .to_string()
            };
            Task {
                index: field("ArrayTaskId"),
                state: field("JobState"),
                exit_code: field("ExitCode"),
            }
        })
        .collect();
    Some(records)
}

/// The last lines of every task log, for a failure message.
fn log_tails(logs: &Path) -> String {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(logs)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    paths.sort();
    let mut text = String::new();
    for path in paths {
        let log = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        text.push_str(&format!("---- {}\n", path.display()));
        text.push_str(&lines[lines.len().saturating_sub(30)..].join("\n"));
        text.push('\n');
    }
    text
}

/// report.md without its line naming the source folders (the shards, or the local folder).
fn report_body(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("report.md"))
        .unwrap()
        .lines()
        .filter(|l| !l.contains("finished runs from"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn an_array_of_shards_merges_into_the_report_of_a_local_run() {
    let Some((data, models)) = common::data_and_models_roots(TEST, &["trec"]) else {
        return;
    };
    if let Some(why) = slurm_unavailable() {
        let _ = common::skip::<()>(TEST, &why);
        return;
    }
    // The tasks run on a Slurm node, not in this process: every folder they read or write is
    // given as an absolute path, and the working folder lies under the build's target/tmp rather
    // than /tmp, which a cluster's nodes are more likely to share (a single node shares both).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let places = Places {
        data: std::path::absolute(&data).unwrap(),
        models: std::path::absolute(&models).unwrap(),
        // One cold feature cache, shared by the two tasks and then the local run: the tasks
        // start together, so both build it at once, which is part of what is tested.
        cache: dir.path().join("cache"),
    };
    let slurm = dir.path().join("slurm");

    // The script. It exports the three folders of its own environment (`Places`) to the tasks,
    // which do not inherit this process's environment on every cluster.
    let mut args: Vec<String> = ["reproduce", "slurm", "table2", "--shards"]
        .map(String::from)
        .into();
    args.push(SHARDS.to_string());
    args.extend(GRID.map(String::from));
    // One core and a small memory request each, so that the two tasks run side by side on a
    // two-core node; a time limit above this test's timeout.
    args.extend(
        [
            "--cpus-per-task",
            "1",
            "--mem",
            "2G",
            "--time",
            "00:20:00",
            "--out",
        ]
        .map(String::from),
    );
    args.push(slurm.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let script = PathBuf::from(
        String::from_utf8(benign(&args, &places).stdout)
            .unwrap()
            .trim(),
    );
    assert_eq!(script, slurm.join("reproduce-table2.sbatch"));
    let text = std::fs::read_to_string(&script).unwrap();
    assert!(
        text.contains(&format!("#SBATCH --array=1-{SHARDS}\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "export BENIGN_CACHE_DIR={}\n",
            places.cache.display()
        )),
        "{text}"
    );

    // Submitted; --parsable prints "<job id>" or "<job id>;<cluster>".
    let out = Command::new("sbatch")
        .arg("--parsable")
        .arg(&script)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sbatch {}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout)
        .trim()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(
        !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()),
        "sbatch --parsable: {id:?}"
    );
    let mut job = Job {
        id,
        finished: false,
    };

    // Until every task has ended (or the controller forgot the job, having ended it: its states
    // are then the last ones seen, and the shard folders below tell whether the runs finished).
    let started = Instant::now();
    let mut last: Vec<Task> = Vec::new();
    loop {
        match tasks(&job.id) {
            None => break,
            Some(now) if !now.is_empty() => {
                let ended = now.iter().all(Task::ended);
                last = now;
                if ended {
                    break;
                }
            }
            Some(_) => {}
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "job {} not done after {} s: {last:?}\n{}",
            job.id,
            TIMEOUT.as_secs(),
            log_tails(&slurm.join("logs"))
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    job.finished = true;
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "{TEST}: job {} done in {:.0} s: {last:?}\n",
            job.id,
            started.elapsed().as_secs_f64()
        )
        .as_bytes(),
    );
    for task in &last {
        assert!(
            !task.ended() || (task.state == "COMPLETED" && task.exit_code == "0:0"),
            "task {} of job {}: {} (exit {})\n{}",
            task.index,
            job.id,
            task.state,
            task.exit_code,
            log_tails(&slurm.join("logs"))
        );
    }
    // Each task wrote its shard: one finished run (summary.json is written last).
    let mut shards = Vec::new();
    for k in 1..=SHARDS {
        let shard = slurm.join(format!("shard-{k}"));
        let runs: Vec<PathBuf> = std::fs::read_dir(shard.join("runs"))
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(
            runs.len() == 1 && runs[0].join("summary.json").is_file(),
            "{}: {runs:?}\n{}",
            shard.display(),
            log_tails(&slurm.join("logs"))
        );
        shards.push(shard.display().to_string());
    }

    // Merged, as the script's own comment says to.
    let report = slurm.join("report");
    let mut args = vec!["reproduce", "report"];
    args.extend(shards.iter().map(String::as_str));
    args.extend(["--out", report.to_str().unwrap()]);
    benign(&args, &places);

    // The same grid, run here, one run after the other.
    let local = dir.path().join("local");
    let mut args: Vec<String> = ["reproduce", "table2"].map(String::from).into();
    args.extend(GRID.map(String::from));
    args.extend(["--jobs", "1", "--out"].map(String::from));
    args.push(local.display().to_string());
    benign(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &places,
    );

    for file in SAME {
        assert_eq!(
            std::fs::read_to_string(report.join(file)).unwrap(),
            std::fs::read_to_string(local.join(file)).unwrap(),
            "{file}"
        );
    }
    assert_eq!(report_body(&report), report_body(&local));
}
