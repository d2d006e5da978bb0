//! The event file of a `finetune` run, read by TensorBoard's own reader (the `tensorboard` Python
//! package's `EventAccumulator`), for a run killed (SIGKILL) after epochs it logged past its last
//! checkpoint and then resumed: every tag holds exactly one value per epoch, equal to
//! metrics.jsonl and pretrain.jsonl; the configuration is there as text and as hparams, and the
//! attention maps as an image at the last epoch.
//!
//! The reader's Python is `BENIGN_TENSORBOARD_PYTHON` (`.ci/run` makes a venv with tensorboard
//! from PyPI); without it the test is skipped, saying why (a failure under BENIGN_REQUIRE_DATA=1).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use benign_attention::train::checkpoint;
use candle_core::Device;

mod common;

const PYTHON_ENV: &str = "BENIGN_TENSORBOARD_PYTHON";

/// Prints, as JSON, what TensorBoard reads from the run folder argv[1]: every scalar tag's
/// (step, value) pairs, the hparams of the session start, the config text, the images' steps.
const READER: &str = r#"
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.plugins.hparams import plugin_data_pb2
from google.protobuf import json_format
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0, ea.IMAGES: 0, ea.TENSORS: 0})
acc.Reload()
tags = acc.Tags()
content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
print(json.dumps({
    "scalars": {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]},
    "hparams": json_format.MessageToDict(start)["hparams"],
    "config": acc.Tensors("config")[0].tensor_proto.string_val[0].decode(),
    "images": {t: [[e.step, e.width, e.height] for e in acc.Images(t)] for t in tags["images"]},
}))
"#;

fn args(out: &Path, resume: bool) -> Vec<String> {
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
        "3",
        "--test-n",
        "60",
        "--eval-every",
        "7",
        "--checkpoint-every",
        "10",
        "--epochs",
        "150",
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

/// Every finite number of a JSON object, by its flattened key (as the event file names them).
fn numbers(line: &serde_json::Value) -> Vec<(String, f64)> {
    benign_attention::io::flatten_json(line)
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.as_f64().filter(|v| v.is_finite())?)))
        .collect()
}

/// What TensorBoard must hold: tag → step → value, from the run's JSON lines files.
fn expected(dir: &Path) -> BTreeMap<String, BTreeMap<i64, f64>> {
    let mut want: BTreeMap<String, BTreeMap<i64, f64>> = BTreeMap::new();
    for (file, prefix) in [("pretrain.jsonl", "phase1"), ("metrics.jsonl", "phase2")] {
        for line in std::fs::read_to_string(dir.join(file)).unwrap().lines() {
            let line: serde_json::Value = serde_json::from_str(line).unwrap();
            let step = line["epoch"].as_i64().unwrap();
            for (key, value) in numbers(&line) {
                if key != "epoch" {
                    let slot = want.entry(format!("{prefix}/{key}")).or_default();
                    assert!(
                        slot.insert(step, value).is_none(),
                        "{file}: epoch {step} twice"
                    );
                }
            }
        }
    }
    want
}

#[test]
#[cfg_attr(
    any(benign_no_data, benign_no_models),
    ignore = "needs real data and checkpoints: BENIGN_DATA_DIR (or ./datasets) and BENIGN_MODELS_DIR"
)]
fn a_killed_and_resumed_run_has_one_value_per_tag_and_epoch_as_tensorboard_reads_it() {
    let test = "tensorboard::a_killed_and_resumed_run_has_one_value_per_tag_and_epoch_as_tensorboard_reads_it";
    let Some(_) = common::data_and_models_roots(test, &["trec"]) else {
        return;
    };
    let Some(python) = std::env::var_os(PYTHON_ENV).filter(|p| !p.is_empty()) else {
        return common::skip(
            test,
            &format!(
                "{PYTHON_ENV} is not set (a Python with the tensorboard package; .ci/run makes one)"
            ),
        )
        .unwrap_or(());
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let run = dir.path().join("run");

    // Killed a few epochs after its first phase-2 checkpoint: those epochs are in the event file
    // and will be run, and logged, again.
    let mut child = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args(&run, false))
        .env("BENIGN_CACHE_DIR", &cache)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let checkpointed = loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it was killed"
        );
        assert!(started.elapsed() < Duration::from_secs(300));
        if let Ok(Some(saved)) = checkpoint::load(&run, &Device::Cpu)
            && saved.state.epochs_done >= 10
        {
            break saved.state.epochs_done;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let events = run.join("events.out.tfevents.benign-attention");
    let at_checkpoint = std::fs::metadata(&events).unwrap().len();
    while std::fs::metadata(&events).unwrap().len() < at_checkpoint + 2_000 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let saved = checkpoint::load(&run, &Device::Cpu).unwrap().unwrap();
    assert!(saved.state.epochs_done < 150, "killed after the last epoch");

    let out = Command::new(env!("CARGO_BIN_EXE_benign-attention"))
        .args(args(&run, true))
        .env("BENIGN_CACHE_DIR", &cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let read = Command::new(&python)
        .args(["-c", READER, run.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        read.status.success(),
        "tensorboard's reader: {}",
        String::from_utf8_lossy(&read.stderr)
    );
    let read: serde_json::Value = serde_json::from_slice(&read.stdout).unwrap();

    let want = expected(&run);
    let got = read["scalars"].as_object().unwrap();
    assert_eq!(
        got.keys().cloned().collect::<Vec<_>>(),
        want.keys().cloned().collect::<Vec<_>>(),
        "tags"
    );
    for (tag, values) in &want {
        let pairs = got[tag].as_array().unwrap();
        let steps: Vec<i64> = pairs.iter().map(|p| p[0].as_i64().unwrap()).collect();
        assert_eq!(
            steps,
            values.keys().copied().collect::<Vec<_>>(),
            "{tag}: steps (killed after checkpoint epoch {checkpointed}, resumed from {})",
            saved.state.epochs_done
        );
        for (pair, (step, value)) in pairs.iter().zip(values) {
            // Scalars are float32 in the event file.
            let value = f64::from(*value as f32);
            assert_eq!(pair[1].as_f64().unwrap(), value, "{tag} at epoch {step}");
        }
    }

    let hparams = &read["hparams"];
    assert_eq!(hparams["dataset"], "trec");
    assert_eq!(hparams["mode"], "last-layer");
    assert_eq!(hparams["eta"], 0.2);
    assert_eq!(hparams["n"], 30.0);
    assert_eq!(hparams["seed"], 42.0);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("config.json")).unwrap()).unwrap();
    let text = read["config"].as_str().unwrap();
    let shown: serde_json::Value =
        serde_json::from_str(text.trim_start_matches("```json").trim_end_matches("```")).unwrap();
    assert_eq!(shown, config, "the config text");
    let images = read["images"]["attention_maps"].as_array().unwrap();
    assert_eq!(images.len(), 1, "{images:?}");
    assert_eq!(images[0][0], 150);
}
