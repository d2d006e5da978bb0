//! Phase 2 end to end on the tiny fixture ViT: the last layer's re-initialised query/key train on
//! cached inputs through the shared loop, the loss falls, and test scores follow the cadence.

use benign_attention::diagnostics::locater::head_symmetric_variance;
use benign_attention::encoder::Model;
use benign_attention::encoder::layer_rows::LayerRows;
use benign_attention::encoder::vit::{Vit, VitConfig};
use benign_attention::model::{Classifier, LastLayer, QueryKey};
use benign_attention::rng::Shuffle;
use benign_attention::train::last_layer_sets::{LastLayerSets, RESIDENT_TEST_BYTES, TestRows};
use benign_attention::train::look_ahead::LookAhead;
use benign_attention::train::loops::{
    EpochMetrics, Penalty, Phase2Data, Phase2Model, Phase2Schedule, Set, steps_per_epoch,
    train_phase2,
};
use benign_attention::train::optim::{AdamW, OptimizerConfig};
use candle_core::{Device, Tensor};
use rand::SeedableRng;

mod common;

/// What one phase-2 training of the tiny ViT's last layer leaves.
struct Trained {
    log: Vec<EpochMetrics>,
    steps: usize,
    /// v_sym of the query-key matrix, mean over heads, before and after.
    eigen_variance: (f64, f64),
}

/// 30 epochs of phase 2 on 16 noisy samples, with LocAteR's λ = `locater`, the host pass's
/// samples on `sample_threads` threads, in batches of `batch`.
fn train_tiny_last_layer(locater: f64, sample_threads: usize, batch: usize) -> Trained {
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
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let classifier = Classifier::new(config.hidden_size, 3, None, &mut rng, &Device::Cpu).unwrap();
    let layer = LastLayer::new(&model, &classifier).unwrap();
    let rows_of = |start: usize, len: usize| {
        let part = inputs.narrow(0, start, len).unwrap();
        LayerRows::from_padded(&part, vec![part.dim(1).unwrap(); len]).unwrap()
    };
    let (train_rows, test_rows) = (rows_of(0, 16), rows_of(16, 8));
    let train_set = layer.resident(&train_rows, &Device::Cpu).unwrap();
    let qk = QueryKey::reset(config.hidden_size, &mut rng, &Device::Cpu).unwrap();
    let clean: Vec<u32> = (0..16).map(|i| (i % 3) as u32).collect();
    let noisy_mask: Vec<bool> = (0..16).map(|i| i % 5 == 0).collect();
    let labels: Vec<u32> = clean
        .iter()
        .zip(&noisy_mask)
        .map(|(&y, &m)| if m { (y + 1) % 3 } else { y })
        .collect();
    let test_labels = vec![0, 1, 2, 0, 1, 2, 0, 1];
    // As `finetune` trains: the host pass on the CPU, its samples on `sample_threads` threads.
    let sample_pool = rayon::ThreadPoolBuilder::new()
        .num_threads(sample_threads)
        .build()
        .unwrap();
    let sets = LastLayerSets {
        layer: &layer,
        qk: &qk,
        finetune: &train_set,
        test: TestRows::held_if_within(&layer, &test_rows, RESIDENT_TEST_BYTES).unwrap(),
        labels: &labels,
        sample_pool: &sample_pool,
    };
    let forward = |set: Set, rows: &[usize]| sets.evaluate(set, rows);
    let step = |rows: &[usize]| sets.step(rows);
    // The fine-tune set's evaluation during the next epoch's steps, as `finetune` runs it.
    let evaluating_step = |rows: &[usize], earlier: &[Tensor]| sets.step_evaluating(rows, earlier);
    let data = Phase2Data {
        labels: &labels,
        clean_labels: &clean,
        noisy_mask: &noisy_mask,
        test_labels: &test_labels,
    };
    let epochs = 30;
    let (heads, head_dim) = (
        config.num_attention_heads,
        config.hidden_size / config.num_attention_heads,
    );
    let scale = 1.0 / (head_dim as f64).sqrt();
    let named = qk.named();
    let weight = |name: &str| named.iter().find(|(n, _)| n == name).unwrap().1.clone();
    let (query, key) = (weight("query.weight"), weight("key.weight"));
    let eigen_variance = || {
        head_symmetric_variance(query.as_tensor(), key.as_tensor(), heads, scale)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64
    };
    let before = eigen_variance();
    let penalty = || -> anyhow::Result<Tensor> {
        Ok((head_symmetric_variance(query.as_tensor(), key.as_tensor(), heads, scale)? * locater)?)
    };
    let mut opt = AdamW::new(
        qk.named(),
        OptimizerConfig {
            learning_rate: 0.05,
            ..Default::default()
        },
        epochs * steps_per_epoch(16, batch),
    )
    .unwrap();
    let mut log: Vec<EpochMetrics> = Vec::new();
    // The whole loop on the sample pool, as `finetune` runs the host pass's: the optimizer, the
    // metrics and the penalty's autograd on its threads too.
    sample_pool
        .install(|| {
            let look_ahead = LookAhead {
                step: &evaluating_step,
                kept: &|_| false,
            };
            train_phase2(
                &Phase2Model {
                    forward: &forward,
                    step: &step,
                    look_ahead: Some(&look_ahead),
                    penalty: (locater > 0.0).then_some(&penalty as &Penalty),
                },
                &mut opt,
                &data,
                &Phase2Schedule {
                    start_epoch: 0,
                    epochs,
                    batch_size: batch,
                    shuffle: Shuffle::own(1),
                    eval_every: 10,
                    measure_reset: false,
                },
                &mut |m, _| {
                    log.push(m.clone());
                    Ok(())
                },
            )
        })
        .unwrap();
    Trained {
        log,
        steps: opt.step,
        eigen_variance: (before, eigen_variance()),
    }
}

#[test]
fn last_layer_training_lowers_the_loss_on_noisy_labels() {
    let Trained { log, steps, .. } = train_tiny_last_layer(0.0, 1, 4);
    let epochs = 30;
    assert_eq!(log.len(), epochs);
    assert!(
        log[epochs - 1].train_loss < log[0].train_loss,
        "{} → {}",
        log[0].train_loss,
        log[epochs - 1].train_loss
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
    assert_eq!(steps, epochs * 4);
}

/// LocAteR reaches the query and key weights through the shared loop: the eigen-variance of the
/// trained query-key matrix ends lower with it than without it.
#[test]
fn locater_penalty_lowers_the_query_key_eigen_variance() {
    let plain = train_tiny_last_layer(0.0, 1, 4);
    let penalised = train_tiny_last_layer(50.0, 1, 4);
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
/// number is the same bit for bit on one thread or three (batches of 12: chunks of 8 and 4 rows).
#[test]
fn phase_two_numbers_do_not_depend_on_the_sample_threads() {
    let (one, three) = (
        train_tiny_last_layer(0.0, 1, 12),
        train_tiny_last_layer(0.0, 3, 12),
    );
    let json = |log: &[EpochMetrics]| serde_json::to_string(log).unwrap();
    assert_eq!(json(&one.log), json(&three.log));
    assert_eq!(
        one.eigen_variance.1.to_bits(),
        three.eigen_variance.1.to_bits()
    );
}
