//! Localization diagnostics in the synthetic model (docs/protocol.md §5): the spectrum of W is logged, the
//! LocAteR penalty lowers its variance, and the sweep's outputs are written.

use benign_attention::report::synthetic::write_localization;
use benign_attention::synthetic::{
    EngineKind, GridSize, Regime, SweepRow, SyntheticConfig, Trace, run,
};

/// Small enough for the dense engine in a test, large enough to memorise.
fn small_config() -> SyntheticConfig {
    SyntheticConfig {
        embed_dim: 200,
        signal_norm: 6.0,
        test_n: 200,
        num_steps: 300,
        log_interval: 50,
        ..Default::default()
    }
}

#[test]
fn spectrum_and_entropies_are_logged_at_every_logged_step() {
    let config = small_config();
    let result = run(&config, EngineKind::Subspace, Trace::Full, &mut |_| {}).unwrap();
    assert_eq!(result.metrics.len(), 7);
    let log_t = (config.seq_len as f64).ln();
    for m in &result.metrics {
        let symmetric = m.qk_symmetric.expect("logged with Trace::Full");
        assert!(symmetric.var > 0.0 && symmetric.mean.is_finite());
        assert!((0.0..=log_t + 1e-9).contains(&m.clean_entropy));
        assert!((0.0..=log_t + 1e-9).contains(&m.noisy_entropy.unwrap()));
    }
    // p = 0 at step 0: uniform attention.
    assert!((result.metrics[0].clean_entropy - log_t).abs() < 1e-12);
    let s = &result.summary;
    assert_eq!(s.qk_symmetric_init, result.metrics[0].qk_symmetric);
    // The complex spectrum at the end agrees with the traces where they overlap.
    let full = s.qk_spectrum.expect("d ≤ FULL_SPECTRUM_MAX_DIM");
    let symmetric = s.qk_symmetric.unwrap();
    assert!((full.sym_var - symmetric.var).abs() < 1e-9 * symmetric.var);
    assert!((full.mean_real - symmetric.mean).abs() < 1e-9);
    // W₀ ~ U(±1/√d): its symmetric part's eigen-variance is about 1/6.
    let initial = s.qk_symmetric_init.unwrap().var;
    assert!((initial - 1.0 / 6.0).abs() < 0.02, "{initial}");

    let grid_run = run(&config, EngineKind::Subspace, Trace::FinalOnly, &mut |_| {}).unwrap();
    assert!(grid_run.summary.qk_symmetric.is_none() && grid_run.summary.qk_spectrum.is_none());
}

#[test]
fn locater_lowers_the_final_eigen_variance() {
    let plain = small_config();
    let with_locater = SyntheticConfig {
        locater: 100.0,
        ..small_config()
    };
    let final_spectrum = |config: &SyntheticConfig| {
        run(
            config,
            EngineKind::Dense,
            Trace::FinalWithSpectrum,
            &mut |_| {},
        )
        .unwrap()
        .summary
    };
    let (a, b) = (final_spectrum(&plain), final_spectrum(&with_locater));
    let (va, vb) = (a.qk_symmetric.unwrap().var, b.qk_symmetric.unwrap().var);
    assert!(vb < 0.5 * va, "v_sym {vb} with LocAteR vs {va} without");
    // The real parts' spread falls with it.
    let (ra, rb) = (
        a.qk_spectrum.unwrap().var_real,
        b.qk_spectrum.unwrap().var_real,
    );
    assert!(
        rb < ra,
        "real-part variance {rb} with LocAteR vs {ra} without"
    );
}

#[test]
fn locater_needs_the_dense_engine() {
    let config = SyntheticConfig {
        locater: 1.0,
        ..small_config()
    };
    let msg = run(&config, EngineKind::Subspace, Trace::FinalOnly, &mut |_| {})
        .err()
        .expect("the subspace engine cannot carry the penalty")
        .to_string();
    assert!(msg.contains("--locater") && msg.contains("dense"), "{msg}");
    let negative = SyntheticConfig {
        locater: -1.0,
        ..small_config()
    };
    let msg = negative.validate().unwrap_err().to_string();
    assert!(msg.contains("--locater"), "{msg}");
}

#[test]
fn localization_outputs_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let row = |regime, var: f64, entropy: f64| SweepRow {
        embed_dim: 250,
        signal_norm: 5.0,
        snr: 0.3,
        train_loss: 0.4,
        test_loss: 0.5,
        train_acc: 1.0,
        test_acc: 0.9,
        noisy_fitted: 4,
        noisy_total: 4,
        clean_x1_prob: 0.9,
        regime,
        clean_entropy: entropy,
        noisy_entropy: Some(entropy + 0.2),
        qk_sym_mean: Some(0.001),
        qk_sym_var: Some(var),
        qk_sym_var_init: Some(1.0 / 6.0),
    };
    let rows = [
        row(Regime::Benign, 0.17, 0.3),
        row(Regime::Harmful, 0.18, 0.9),
        row(Regime::NotOverfitting, 0.2, 0.1),
    ];
    let out = dir.path().join("loc");
    write_localization(&out, GridSize::Coarse, &SyntheticConfig::default(), &rows).unwrap();
    let csv = std::fs::read_to_string(out.join("localization.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    for column in [
        "regime",
        "clean_entropy",
        "noisy_entropy",
        "qk_sym_var",
        "qk_sym_var_init",
    ] {
        assert!(header.split(',').any(|c| c == column), "{header}");
    }
    assert_eq!(csv.lines().count(), 4);
    let png = std::fs::read(out.join("entropy_vs_eigen_variance.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000);
}
