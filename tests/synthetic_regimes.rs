//! The three named settings of the paper's synthetic experiment (docs/protocol.md §2.4) land in
//! their regimes, and the fast subspace engine follows the plain dense computation.

use benign_attention::synthetic::data::TokenSet;
use benign_attention::synthetic::dense::DenseEngine;
use benign_attention::synthetic::engine::Engine;
use benign_attention::synthetic::{
    EngineKind, Regime, SyntheticConfig, SyntheticRun, Trace, run, run_with_engine,
};
use candle_core::DType;

fn run_setting(embed_dim: usize, signal_norm: f64) -> SyntheticRun {
    let config = SyntheticConfig {
        embed_dim,
        signal_norm,
        ..Default::default()
    };
    run(&config, EngineKind::Subspace, Trace::Full, &mut |_| {}).unwrap()
}

#[test]
fn balanced_setting_overfits_benignly() {
    let run = run_setting(2000, 20.0);
    let s = &run.summary;
    assert_eq!(s.train_acc, 1.0);
    assert!(s.test_acc >= 0.99, "test acc {}", s.test_acc);
    assert!(s.clean_x1_prob >= 0.95, "clean x1 prob {}", s.clean_x1_prob);
    assert_eq!((s.noisy_fitted, s.noisy_total), (4, 4));
    assert_eq!(s.regime, Regime::Benign);
    // The trajectory starts from uniform attention (p = 0) and logs the final step.
    assert!(
        run.metrics[0]
            .clean_token_probs
            .iter()
            .all(|p| (p - 0.125).abs() < 1e-12)
    );
    assert_eq!(run.metrics.last().unwrap().step, 1000);
    assert_eq!(run.metrics.len(), 101);
}

#[test]
fn large_noise_setting_overfits_harmfully() {
    let s = run_setting(4500, 5.0).summary;
    assert_eq!(s.train_acc, 1.0);
    assert!(
        (0.80..=0.92).contains(&s.test_acc),
        "test acc {}",
        s.test_acc
    );
    assert_eq!(s.regime, Regime::Harmful);
}

#[test]
fn large_signal_setting_does_not_overfit() {
    let run = run_setting(1000, 80.0);
    let at_500 = run.metrics.iter().find(|m| m.step == 500).unwrap();
    assert!(
        at_500.train_acc <= 0.85,
        "train acc at step 500: {}",
        at_500.train_acc
    );
    let s = &run.summary;
    assert!(s.test_acc >= 0.99, "test acc {}", s.test_acc);
    assert!(
        s.noisy_fitted < s.noisy_total,
        "{} of {} noisy fitted",
        s.noisy_fitted,
        s.noisy_total
    );
    assert_eq!(s.regime, Regime::NotOverfitting);
}

fn relative_error(a: &[f64], b: &[f64]) -> f64 {
    let diff: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f64>()
        .sqrt();
    diff / b.iter().map(|y| y * y).sum::<f64>().sqrt()
}

/// The subspace engine is an exact reformulation: over 1000 steps in the benign regime (noisy
/// samples memorised late, the sensitive phase) it ends at the same W·p and accuracies as plain
/// dense gradient descent on the d×d matrix, both in f64.
#[test]
fn subspace_engine_matches_dense_gradient_descent() {
    let config = SyntheticConfig {
        embed_dim: 500,
        signal_norm: 10.0,
        test_n: 500,
        ..Default::default()
    };
    let dense_f64 = |train: &TokenSet, w0: &[f32]| -> anyhow::Result<Box<dyn Engine>> {
        Ok(Box::new(DenseEngine::new(
            train,
            config.signal_norm,
            w0,
            config.learning_rate,
            DType::F64,
        )?))
    };
    let dense = run_with_engine(
        &config,
        EngineKind::Dense,
        Trace::Full,
        &mut |_| {},
        dense_f64,
    )
    .unwrap();
    let fast = run(&config, EngineKind::Subspace, Trace::Full, &mut |_| {}).unwrap();
    let err = relative_error(&fast.scoring_direction, &dense.scoring_direction);
    eprintln!("subspace vs dense f64: final W·p relative error {err:e}");
    assert!(err < 1e-4, "final W·p differs by {err:e} (relative)");
    for (a, b) in fast.metrics.iter().zip(&dense.metrics) {
        assert_eq!(a.step, b.step);
        assert!(
            (a.train_acc - b.train_acc).abs() < 1e-4,
            "step {}: train acc {} vs {}",
            a.step,
            a.train_acc,
            b.train_acc
        );
        assert!(
            (a.test_acc - b.test_acc).abs() < 1e-4,
            "step {}: test acc {} vs {}",
            a.step,
            a.test_acc,
            b.test_acc
        );
        assert!((a.train_loss - b.train_loss).abs() < 1e-4 * b.train_loss);
    }
    assert_eq!(fast.summary.noisy_fitted, dense.summary.noisy_fitted);

    // The CLI's dense engine runs in f32 like the authors' torch code; it stays on the same path.
    let dense_f32 = run(&config, EngineKind::Dense, Trace::FinalOnly, &mut |_| {}).unwrap();
    let err = relative_error(&dense_f32.scoring_direction, &dense.scoring_direction);
    eprintln!("dense f32 vs dense f64: final W·p relative error {err:e}");
    assert!(err < 1e-4, "f32 dense W·p differs by {err:e}");
    assert_eq!(dense_f32.summary.regime, dense.summary.regime);
}
