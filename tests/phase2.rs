//! Phase 2 end to end on the tiny fixture ViT, through the trainees and the loop `finetune` runs:
//! the last layer's re-initialised query/key (or the head) train on cached inputs, the loss
//! falls, test scores follow the cadence, and a run trained in a stack ends where it ends alone,
//! bit for bit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use benign_attention::data::DatasetName;
use benign_attention::data::split::SplitName;
use benign_attention::diagnostics::locater::head_symmetric_variance;
use benign_attention::encoder::Model;
use benign_attention::encoder::layer_rows::LayerRows;
use benign_attention::encoder::vit::{Vit, VitConfig};
use benign_attention::model::{Classifier, QueryKey};
use benign_attention::rng::Shuffle;
use benign_attention::train::metrics::EpochMetrics;
use benign_attention::train::optim::OptimizerConfig;
use benign_attention::train::phase2::epochs::{EpochPlan, train};
use benign_attention::train::phase2::head::HeadTrainee;
use benign_attention::train::phase2::query_key::LastLayerTrainee;
use benign_attention::train::phase2::record::MetricsLog;
use benign_attention::train::phase2::runs::{Labels, RunData, Samples, Shared};
use benign_attention::train::phase2::trainee::Trainee;
use benign_attention::train::run::{HeadClassifier, Mode, RunConfig};
use candle_core::{Device, Tensor};
use rand::SeedableRng;

mod common;

/// One run of a tiny stack: which of the 24 cached samples it fine-tunes on (the rest of the
/// first 24 are never its test set: samples 16..24 are every run's), which labels it flips, and
/// the seed of its classifier, reset and batch order.
#[derive(Clone)]
struct Spec {
    finetune: Vec<usize>,
    /// Every `flip_every`-th sample's label is flipped (0: none).
    flip_every: usize,
    seed: u64,
}

impl Spec {
    fn first16(flip_every: usize, seed: u64) -> Self {
        Self {
            finetune: (0..16).collect(),
            flip_every,
            seed,
        }
    }
}

/// What one run of a tiny phase 2 leaves.
struct Trained {
    log: Vec<EpochMetrics>,
    /// Its parameters and moments as its checkpoint keeps them.
    state: HashMap<String, Tensor>,
    steps: usize,
    /// v_sym of the query-key matrix, mean over heads, before and after (last-layer mode).
    eigen_variance: (f64, f64),
}

/// How a tiny stack trains.
struct Setting {
    mode: Mode,
    locater: f64,
    sample_threads: usize,
    batch: usize,
    /// Every epoch's end kept (no look-ahead deferral) when set.
    keep_every_epoch: bool,
}

impl Default for Setting {
    fn default() -> Self {
        Self {
            mode: Mode::LastLayer,
            locater: 0.0,
            sample_threads: 1,
            batch: 4,
            keep_every_epoch: false,
        }
    }
}

const EPOCHS: usize = 30;

/// 30 epochs of phase 2 of the runs `specs` together, on 16 noisy samples each.
fn train_tiny(setting: &Setting, specs: &[Spec]) -> Vec<Trained> {
    let config: VitConfig = common::config("tiny_vit");
    let vit = Vit::load(common::model_vb("tiny_vit", &Device::Cpu), &config).unwrap();
    // Seeded, so that two trainings see the same images.
    let mut pixel_rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let values: Vec<f32> = (0..24 * 3 * 32 * 32)
        .map(|_| rand::RngExt::random_range(&mut pixel_rng, -1.0f32..1.0))
        .collect();
    let pixels = Tensor::from_vec(values, (24, 3, 32, 32), &Device::Cpu).unwrap();
    let inputs = vit.last_layer_input(&pixels).unwrap();
    let model = Model::Vit(vit);
    let hidden = config.hidden_size;
    let rows_of = |which: &[usize]| {
        let index = Tensor::new(
            which
                .iter()
                .map(|&i| i as u32)
                .collect::<Vec<_>>()
                .as_slice(),
            &Device::Cpu,
        )
        .unwrap();
        let part = inputs.index_select(&index, 0).unwrap();
        LayerRows::from_padded(&part, vec![part.dim(1).unwrap(); which.len()]).unwrap()
    };
    let test_positions: Vec<usize> = (16..24).collect();
    let test_rows = rows_of(&test_positions);
    let test_labels = vec![0, 1, 2, 0, 1, 2, 0, 1];
    let finetune_rows: Vec<LayerRows> = specs.iter().map(|s| rows_of(&s.finetune)).collect();
    let clean: Vec<Vec<u32>> = specs
        .iter()
        .map(|s| s.finetune.iter().map(|&i| (i % 3) as u32).collect())
        .collect();
    let masks: Vec<Vec<bool>> = specs
        .iter()
        .map(|s| {
            (0..16)
                .map(|i| s.flip_every > 0 && i % s.flip_every == 0)
                .collect()
        })
        .collect();
    let noisy: Vec<Vec<u32>> = clean
        .iter()
        .zip(&masks)
        .map(|(c, m)| {
            c.iter()
                .zip(m)
                .map(|(&y, &f)| if f { (y + 1) % 3 } else { y })
                .collect()
        })
        .collect();
    let run_configs: Vec<RunConfig> = specs
        .iter()
        .map(|s| RunConfig {
            mode: setting.mode,
            head_classifier: HeadClassifier::for_mode(setting.mode, None),
            n: 16,
            epochs: EPOCHS,
            batch_size: setting.batch,
            eval_every: 10,
            locater: setting.locater,
            seed: s.seed,
            optimizer: OptimizerConfig {
                learning_rate: 0.05,
                ..Default::default()
            },
            ..RunConfig::paper(&DatasetName::Cifar10).unwrap()
        })
        .collect();
    // Each run's classifier and reset from its own stream, as phase 1 leaves it.
    let mut rngs: Vec<rand_chacha::ChaCha8Rng> = specs
        .iter()
        .map(|s| rand_chacha::ChaCha8Rng::seed_from_u64(s.seed))
        .collect();
    let classifiers: Vec<Classifier> = rngs
        .iter_mut()
        .map(|rng| Classifier::new(hidden, 3, None, rng, &Device::Cpu).unwrap())
        .collect();
    let data: Vec<RunData> = (0..specs.len())
        .map(|k| RunData {
            config: &run_configs[k],
            classifier: &classifiers[k],
            labels: Labels {
                labels: &noisy[k],
                clean_labels: &clean[k],
                noisy_mask: &masks[k],
                test_labels: &test_labels,
            },
            finetune: &finetune_rows[k],
            test: &test_rows,
            finetune_samples: Samples {
                split: SplitName::Train,
                positions: &specs[k].finetune,
            },
            test_samples: Samples {
                split: SplitName::Test,
                positions: &test_positions,
            },
            init_rng: Mutex::new(rngs[k].clone()),
        })
        .collect();
    let refs: Vec<&RunData> = data.iter().collect();
    let cache = tempfile::tempdir().unwrap();
    let shared = Shared {
        model: &model,
        device: &Device::Cpu,
        hidden,
        spill_dir: cache.path(),
    };
    // As `finetune` trains: the host pass on the CPU, its samples on `sample_threads` threads.
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(setting.sample_threads)
            .build()
            .unwrap(),
    );
    let mut trainee: Box<dyn Trainee> = match setting.mode {
        Mode::LastLayer => {
            Box::new(LastLayerTrainee::new(&shared, &refs, Arc::clone(&pool)).unwrap())
        }
        Mode::Head => Box::new(HeadTrainee::new(&shared, &refs).unwrap()),
    };
    let (heads, head_dim) = (
        config.num_attention_heads,
        config.hidden_size / config.num_attention_heads,
    );
    let eigen_variance = |trainee: &dyn Trainee, run: usize| -> f64 {
        if setting.mode != Mode::LastLayer {
            return 0.0;
        }
        let opt = trainee.optimizer();
        let (q, k) = (
            opt.param_of_run("query.weight", run).unwrap(),
            opt.param_of_run("key.weight", run).unwrap(),
        );
        let scale = 1.0 / (head_dim as f64).sqrt();
        head_symmetric_variance(&q, &k, heads, scale)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64
    };
    let before: Vec<f64> = (0..specs.len())
        .map(|k| eigen_variance(&*trainee, k))
        .collect();
    let keep = setting.keep_every_epoch;
    let kept = move |_: usize| keep;
    let plan = EpochPlan {
        start_epoch: 0,
        epochs: EPOCHS,
        batch_size: setting.batch,
        n: 16,
        shuffles: specs.iter().map(|s| Shuffle::own(s.seed)).collect(),
        eval_every: 10,
        measure_reset: false,
        kept: &kept,
    };
    let labels = data.iter().map(|d| d.labels).collect();
    let mut log = MetricsLog::new(labels, vec![Vec::new(); specs.len()]);
    // The whole loop on the sample pool, as `finetune` runs the host pass's.
    pool.install(|| train(trainee.as_mut(), &plan, &mut log))
        .unwrap();
    (0..specs.len())
        .map(|k| Trained {
            log: log.logs[k].clone(),
            state: trainee.optimizer().run_state(k).unwrap(),
            steps: trainee.optimizer().step,
            eigen_variance: (before[k], eigen_variance(&*trainee, k)),
        })
        .collect()
}

/// The one run of a stack of one.
fn alone(setting: &Setting, spec: &Spec) -> Trained {
    train_tiny(setting, std::slice::from_ref(spec))
        .pop()
        .unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    let values: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    values.iter().map(|v| v.to_bits()).collect()
}

/// A run's every logged number and every checkpointed tensor are those of the same run alone.
fn assert_same(stacked: &Trained, alone: &Trained, what: &str) {
    let json = |log: &[EpochMetrics]| serde_json::to_string(log).unwrap();
    assert_eq!(json(&stacked.log), json(&alone.log), "{what}: metrics");
    let mut names: Vec<&String> = alone.state.keys().collect();
    names.sort();
    assert_eq!(stacked.state.len(), alone.state.len(), "{what}: tensors");
    for name in names {
        assert_eq!(
            bits(&stacked.state[name]),
            bits(&alone.state[name]),
            "{what}: {name}"
        );
    }
}

#[test]
fn last_layer_training_lowers_the_loss_on_noisy_labels() {
    let Trained { log, steps, .. } = alone(&Setting::default(), &Spec::first16(5, 5));
    assert_eq!(log.len(), EPOCHS);
    assert!(
        log[EPOCHS - 1].train_loss < log[0].train_loss,
        "{} → {}",
        log[0].train_loss,
        log[EPOCHS - 1].train_loss
    );
    let scored: Vec<usize> = log
        .iter()
        .filter(|m| m.test_acc.is_some())
        .map(|m| m.epoch)
        .collect();
    assert_eq!(scored, vec![10, 20, 30]);
    for m in &log {
        assert!((0.0..=1.0).contains(&m.train_acc) && (0.0..=1.0).contains(&m.memorization));
        assert!(m.max_cls_attention >= 1.0 / 17.0 - 1e-6 && m.max_cls_attention <= 1.0);
        assert!(m.attention_entropy <= 17f64.ln() + 1e-6);
    }
    assert_eq!(steps, EPOCHS * 4);
}

/// LocAteR reaches the query and key weights through the loop: the eigen-variance of the trained
/// query-key matrix ends lower with it than without it.
#[test]
fn locater_penalty_lowers_the_query_key_eigen_variance() {
    let plain = alone(&Setting::default(), &Spec::first16(5, 5));
    let penalised = alone(
        &Setting {
            locater: 50.0,
            ..Setting::default()
        },
        &Spec::first16(5, 5),
    );
    assert_eq!(
        plain.eigen_variance.0, penalised.eigen_variance.0,
        "same initialisation"
    );
    assert!(
        penalised.eigen_variance.1 < 0.5 * plain.eigen_variance.1,
        "{:?} vs {:?}",
        penalised.eigen_variance,
        plain.eigen_variance
    );
    // The logged loss is the data loss alone.
    assert!(penalised.log.iter().all(|m| m.train_loss.is_finite()));
}

/// The host pass spreads samples over threads and sums nothing across them: a run's every logged
/// number is the same bit for bit on one thread or three (batches of 12: parts of 8 and 4 rows).
#[test]
fn phase_two_numbers_do_not_depend_on_the_sample_threads() {
    let spec = Spec::first16(5, 5);
    let one = alone(
        &Setting {
            batch: 12,
            ..Setting::default()
        },
        &spec,
    );
    let three = alone(
        &Setting {
            batch: 12,
            sample_threads: 3,
            ..Setting::default()
        },
        &spec,
    );
    assert_same(&three, &one, "three threads");
}

/// The look-ahead evaluates an epoch during the next one's steps; every epoch's metrics are those
/// measured at its end, in the same order, and the parameters end the same.
#[test]
fn the_look_ahead_changes_no_number() {
    let spec = Spec::first16(5, 5);
    let deferred = alone(&Setting::default(), &spec);
    let at_each_end = alone(
        &Setting {
            keep_every_epoch: true,
            ..Setting::default()
        },
        &spec,
    );
    assert_same(&deferred, &at_each_end, "look-ahead");
}

/// The specs of a stack with η-siblings (the same samples, other labels) and seed-siblings
/// (other samples, classifier, reset and batch order).
fn siblings() -> Vec<Spec> {
    vec![
        Spec::first16(5, 5),
        Spec::first16(3, 5),
        Spec::first16(0, 5),
        Spec {
            finetune: (0..16).rev().collect(),
            flip_every: 4,
            seed: 9,
        },
        Spec {
            finetune: (2..18).filter(|i| *i != 16).chain([0]).collect(),
            flip_every: 5,
            seed: 13,
        },
    ]
}

/// Every run of a stack of η- and seed-siblings ends where it ends alone, bit for bit, in
/// last-layer mode: on one thread and on two, in either spread of the host pass's rows.
#[test]
fn a_last_layer_stack_ends_where_its_runs_end_alone() {
    for sample_threads in [1, 2] {
        let setting = Setting {
            sample_threads,
            batch: 12,
            ..Setting::default()
        };
        let specs = siblings();
        let stacked = train_tiny(&setting, &specs);
        for (k, (run, spec)) in stacked.iter().zip(&specs).enumerate() {
            assert_same(
                run,
                &alone(&setting, spec),
                &format!("run {k}, {sample_threads} threads"),
            );
        }
        // The η-siblings differ: the stack did not train one run five times.
        assert_ne!(
            bits(&stacked[0].state["param.query.weight"]),
            bits(&stacked[1].state["param.query.weight"])
        );
    }
}

/// The same in head mode.
#[test]
fn a_head_stack_ends_where_its_runs_end_alone() {
    let setting = Setting {
        mode: Mode::Head,
        ..Setting::default()
    };
    let specs = siblings();
    let stacked = train_tiny(&setting, &specs);
    for (k, (run, spec)) in stacked.iter().zip(&specs).enumerate() {
        assert_same(run, &alone(&setting, spec), &format!("head run {k}"));
    }
    assert!(stacked[0].log[EPOCHS - 1].train_loss < stacked[0].log[0].train_loss);
    assert_ne!(
        bits(&stacked[0].state["param.head.w"]),
        bits(&stacked[2].state["param.head.w"])
    );
}

/// A checkpointed run resumes as the stack's optimizer state of that run alone: the stacked
/// state of a run equals the state an optimizer of it alone keeps (same names and shapes).
#[test]
fn a_stacked_runs_state_has_its_own_shapes() {
    let trained = &train_tiny(&Setting::default(), &siblings()[..2])[1];
    let hidden = QueryKey::reset(
        8,
        &mut rand_chacha::ChaCha8Rng::seed_from_u64(0),
        &Device::Cpu,
    )
    .unwrap()
    .wq
    .dims()
    .to_vec();
    assert_eq!(hidden.len(), 2);
    for name in ["query.weight", "key.weight"] {
        let t = &trained.state[&format!("param.{name}")];
        assert_eq!(t.rank(), 2, "{name}: {:?}", t.dims());
        assert_eq!(t.dims()[0], t.dims()[1]);
    }
}
