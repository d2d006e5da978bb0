//! The SNR estimator (src/diagnostics/snr.rs) against ground truth: on the synthetic model's own
//! data, where SNR = ‖μ‖ / √d is known, at ten (d, ‖μ‖) points of the Fig. 5 grid, with each
//! sample's relevant token found by the rule (the head's highest score for the sample's class),
//! not given.

use benign_attention::diagnostics::snr::{Tokens, estimate};
use benign_attention::rng::{Stream, stream};
use benign_attention::synthetic::data::generate;
use benign_attention::synthetic::sweep::Grid;

/// Samples per estimate: enough that the estimate's own scatter (a few per cent at d 5000,
/// ‖μ‖ 5) stays well inside the 10 % the test allows.
const SAMPLES: usize = 400;

#[test]
fn the_estimate_recovers_the_true_snr_across_the_fig5_grid() {
    let dims = Grid::Full.embed_dims();
    let norms = Grid::Full.signal_norms();
    // (index into d, index into ‖μ‖): the four corners, the paper's named settings' neighbourhood
    // and points between.
    let points = [
        (0, 0),
        (0, 38),
        (38, 0),
        (38, 38),
        (14, 6),
        (6, 30),
        (22, 18),
        (30, 2),
        (10, 12),
        (34, 26),
    ];
    let mut report = Vec::new();
    for (seed, &(i, j)) in points.iter().enumerate() {
        let (d, mu) = (dims[i], norms[j]);
        let mut rng = stream(seed as u64, Stream::SyntheticTest);
        let set = generate(SAMPLES, 8, d, 0.1, mu, 0.2, &mut rng);
        // The fixed head ν is the synthetic model's classifier (phase 1's, on real data): each
        // token's score for the sample's clean class is y νᵀx.
        let head = set.head_values(mu);
        let scores: Vec<f32> = head
            .chunks_exact(8)
            .zip(&set.clean_labels)
            .flat_map(|(values, &y)| values.iter().map(move |v| (y * v) as f32))
            .collect();
        let labels: Vec<usize> = set
            .clean_labels
            .iter()
            .map(|&y| usize::from(y < 0.0))
            .collect();
        let found = estimate(
            Tokens {
                values: &set.tokens,
                num_samples: SAMPLES,
                seq_len: 8,
                embed_dim: d,
            },
            &labels,
            &scores,
        )
        .unwrap();
        let truth = mu / (d as f64).sqrt();
        let error = found.snr / truth - 1.0;
        report.push(format!(
            "d {d} ‖μ‖ {mu}: SNR {:.4} against {truth:.4} ({:+.1} %), x₁ relevant for {:.1} %",
            found.snr,
            100.0 * error,
            100.0 * found.modal_share
        ));
        assert_eq!(found.modal_position, 0, "{}", report.join("\n"));
        assert!(error.abs() < 0.10, "{}", report.join("\n"));
        // The noise tokens' spread is the relevant token's: both are N(0, I_d) around their mean.
        assert!((found.other_noise_norm / found.noise_norm - 1.0).abs() < 0.05);
    }
    eprintln!("{}", report.join("\n"));
}
