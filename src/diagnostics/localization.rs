//! The query-key eigenspectrum, attention entropy and the rank-collapse residual, as defined in
//! this module's parent.

use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

/// Eigen-statistics of one query-key matrix.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spectrum {
    // JSON writes NaN (a non-finite matrix) as null.
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub mean_real: f64,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub var_real: f64,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub mean_abs: f64,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub var_abs: f64,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub sym_mean: f64,
    #[serde(deserialize_with = "crate::io::nan_if_null")]
    pub sym_var: f64,
}

/// Eigen-mean and eigen-variance of the symmetric part (W + Wᵀ)/2 alone: exact from three traces,
/// so cheap enough to log at every step of a d = 5000 run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SymmetricSpectrum {
    pub mean: f64,
    pub var: f64,
}

/// tr W, tr W² and ‖W‖_F² of a d × d matrix: all the symmetric part's spectrum needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Traces {
    pub dim: usize,
    pub trace: f64,
    pub trace_square: f64,
    pub frobenius2: f64,
}

impl Traces {
    /// Of a d × d matrix stored row-major.
    pub fn of_row_major(matrix: &[f64], dim: usize) -> Self {
        assert_eq!(matrix.len(), dim * dim, "a square matrix");
        let (mut trace, mut trace_square, mut frobenius2) = (0.0, 0.0, 0.0);
        for r in 0..dim {
            trace += matrix[r * dim + r];
            for c in 0..dim {
                let v = matrix[r * dim + c];
                frobenius2 += v * v;
                trace_square += v * matrix[c * dim + r];
            }
        }
        Self {
            dim,
            trace,
            trace_square,
            frobenius2,
        }
    }

    /// mean = tr W / d; variance = ‖S‖_F² / d − mean² with ‖S‖_F² = (‖W‖_F² + tr W²) / 2.
    pub fn symmetric(&self) -> SymmetricSpectrum {
        let d = self.dim as f64;
        let mean = self.trace / d;
        let var = (self.frobenius2 + self.trace_square) / 2.0 / d - mean * mean;
        SymmetricSpectrum {
            mean,
            // Rounding can leave a tiny negative where the spread is 0 (W = mI).
            var: var.max(0.0),
        }
    }
}

fn mean_var(values: impl Iterator<Item = f64> + Clone, count: usize) -> (f64, f64) {
    let n = count as f64;
    let mean = values.clone().sum::<f64>() / n;
    let var = values.map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var)
}

/// Spectrum statistics from the non-zero eigenvalues of a d × d matrix (the other d − k are 0)
/// and its traces.
fn from_eigenvalues(eigen: &[nalgebra::Complex<f64>], traces: &Traces) -> Spectrum {
    let dim = traces.dim;
    let zeros = dim - eigen.len();
    let real = eigen
        .iter()
        .map(|l| l.re)
        .chain(std::iter::repeat_n(0.0, zeros));
    let modulus = eigen
        .iter()
        .map(|l| l.norm())
        .chain(std::iter::repeat_n(0.0, zeros));
    let (mean_real, var_real) = mean_var(real, dim);
    let (mean_abs, var_abs) = mean_var(modulus, dim);
    let symmetric = traces.symmetric();
    Spectrum {
        mean_real,
        var_real,
        mean_abs,
        var_abs,
        sym_mean: symmetric.mean,
        sym_var: symmetric.var,
    }
}

/// Schur sweeps allowed per row of the matrix: the QR iteration takes a few per eigenvalue when
/// it converges.
const SWEEPS_PER_ROW: usize = 100;

/// The eigenvalues of a square matrix, or None when the Schur (QR) iteration does not converge.
/// nalgebra's `complex_eigenvalues` iterates with no limit to a tolerance of one ulp, and that
/// never ended on a trained 64 × 64 W_k W_qᵀ of CIFAR-10's main run (a hang after the last
/// epoch). Here the sweeps are bounded, and the tolerance is loosened twice before giving up.
pub(super) fn eigenvalues(matrix: &DMatrix<f64>) -> Option<Vec<nalgebra::Complex<f64>>> {
    eigenvalues_within(matrix, SWEEPS_PER_ROW * matrix.nrows().max(1))
}

fn eigenvalues_within(
    matrix: &DMatrix<f64>,
    max_sweeps: usize,
) -> Option<Vec<nalgebra::Complex<f64>>> {
    [f64::EPSILON, 1e-14, 1e-12].into_iter().find_map(|eps| {
        nalgebra::linalg::Schur::try_new(matrix.clone(), eps, max_sweeps)
            .map(|schur| schur.complex_eigenvalues().iter().copied().collect())
    })
}

/// Statistics of a square matrix (any size; O(d³) for the complex eigenvalues). NaN (written
/// null) when the matrix has non-finite entries or its eigenvalues do not converge.
pub fn spectrum(matrix: &DMatrix<f64>) -> Spectrum {
    let dim = matrix.nrows();
    assert_eq!(dim, matrix.ncols(), "a square matrix");
    // The eigenvalue iteration does not terminate on NaN or infinite entries.
    if !matrix.iter().all(|v| v.is_finite()) {
        return Spectrum::undefined();
    }
    let Some(eigen) = eigenvalues(matrix) else {
        return Spectrum::undefined();
    };
    let traces = Traces {
        dim,
        trace: matrix.trace(),
        trace_square: matrix.component_mul(&matrix.transpose()).sum(),
        frobenius2: matrix.norm_squared(),
    };
    from_eigenvalues(&eigen, &traces)
}

/// Statistics of W_QK = scale · W_qᵀ W_k for one head, from its d_h × d query and key rows
/// (row-major), without forming the d × d matrix: the non-zero eigenvalues of W_qᵀ W_k are those
/// of W_k W_qᵀ (d_h × d_h), tr W² and ‖W‖_F² are traces of d_h × d_h products.
pub fn head_spectrum(
    query_rows: &[f32],
    key_rows: &[f32],
    head_dim: usize,
    scale: f64,
) -> Spectrum {
    let dim = query_rows.len() / head_dim;
    let as_matrix = |rows: &[f32]| {
        DMatrix::from_row_iterator(head_dim, dim, rows.iter().map(|&v| f64::from(v)))
    };
    let (wq, wk) = (as_matrix(query_rows), as_matrix(key_rows));
    if !wq.iter().chain(wk.iter()).all(|v| v.is_finite()) {
        return Spectrum::undefined();
    }
    let small = (&wk * wq.transpose()) * scale; // d_h × d_h
    let Some(eigen) = eigenvalues(&small) else {
        return Spectrum::undefined();
    };
    // tr W = tr(W_k W_qᵀ)·scale and tr W² = tr (W_k W_qᵀ)²·scale², both in `small`;
    // ‖W‖_F² = tr(W_q W_qᵀ W_k W_kᵀ)·scale².
    let traces = Traces {
        dim,
        trace: small.trace(),
        trace_square: (&small * &small).trace(),
        frobenius2: ((&wq * wq.transpose()) * (&wk * wk.transpose())).trace() * scale * scale,
    };
    from_eigenvalues(&eigen, &traces)
}

impl Spectrum {
    /// Every statistic NaN: the spectrum of a matrix with non-finite entries.
    pub fn undefined() -> Self {
        Self {
            mean_real: f64::NAN,
            var_real: f64::NAN,
            mean_abs: f64::NAN,
            var_abs: f64::NAN,
            sym_mean: f64::NAN,
            sym_var: f64::NAN,
        }
    }
}

/// Mean over heads of each statistic.
pub fn mean_over_heads(heads: &[Spectrum]) -> Spectrum {
    let n = heads.len().max(1) as f64;
    let avg = |f: fn(&Spectrum) -> f64| heads.iter().map(f).sum::<f64>() / n;
    Spectrum {
        mean_real: avg(|s| s.mean_real),
        var_real: avg(|s| s.var_real),
        mean_abs: avg(|s| s.mean_abs),
        var_abs: avg(|s| s.var_abs),
        sym_mean: avg(|s| s.sym_mean),
        sym_var: avg(|s| s.sym_var),
    }
}

/// −Σ p log p of one attention distribution (0 log 0 = 0).
pub fn entropy<P: Copy + Into<f64>>(probs: &[P]) -> f64 {
    probs
        .iter()
        .map(|&p| p.into())
        .filter(|&p| p > 0.0)
        .map(|p| -p * p.ln())
        .sum()
}

/// ‖Y − 1ȳᵀ‖_F / ‖Y‖_F of `rows` × `cols` outputs (row-major); 0 for a zero Y.
pub fn rank_collapse_residual(y: &[f32], rows: usize, cols: usize) -> f64 {
    assert_eq!(y.len(), rows * cols);
    let mut mean = vec![0f64; cols];
    for row in y.chunks(cols) {
        mean.iter_mut()
            .zip(row)
            .for_each(|(m, &v)| *m += f64::from(v));
    }
    mean.iter_mut().for_each(|m| *m /= rows as f64);
    let (mut residual, mut total) = (0f64, 0f64);
    for row in y.chunks(cols) {
        for (&v, m) in row.iter().zip(&mean) {
            residual += (f64::from(v) - m).powi(2);
            total += f64::from(v).powi(2);
        }
    }
    if total == 0.0 {
        0.0
    } else {
        (residual / total).sqrt()
    }
}

#[cfg(test)]
mod tests {

    /// An eigenvalue iteration that does not converge within its sweeps gives up (None) instead
    /// of running on; a normal one converges within the default budget.
    #[test]
    fn eigenvalues_give_up_after_their_sweeps() {
        // A rotation block has complex eigenvalues, which take the QR iteration several sweeps.
        let m = DMatrix::from_row_slice(
            4,
            4,
            &[
                0.0, -1.0, 0.5, 0.1, 1.0, 0.0, 0.2, 0.3, 0.0, 0.0, 2.0, 1.0, 0.0, 0.0, -1.0, 2.0,
            ],
        );
        assert!(eigenvalues_within(&m, 1).is_none());
        let eigen = eigenvalues(&m).expect("converges");
        let trace: f64 = eigen.iter().map(|l| l.re).sum();
        assert!((trace - m.trace()).abs() < 1e-12);
        assert!(eigen.iter().any(|l| l.im.abs() > 0.5));
    }

    /// A matrix with a NaN (features of a broken backbone) gives NaN statistics at once instead of
    /// an eigenvalue iteration that never ends.
    #[test]
    fn non_finite_matrices_give_nan_statistics() {
        let mut m = DMatrix::<f64>::identity(4, 4);
        m[(1, 2)] = f64::NAN;
        assert!(spectrum(&m).var_real.is_nan());
        let rows = [f32::INFINITY; 8];
        assert!(head_spectrum(&rows, &rows, 2, 1.0).mean_real.is_nan());
    }

    use super::*;

    #[derive(Deserialize)]
    struct Case {
        matrix: Vec<Vec<f64>>,
        mean_real: f64,
        var_real: f64,
        mean_abs: f64,
        var_abs: f64,
        sym_mean: f64,
        sym_var: f64,
    }

    /// numpy's eigvals / eigvalsh statistics (scripts/diagnostics_fixture.py, computed once).
    #[test]
    fn statistics_match_numpy_on_known_matrices() {
        let cases: std::collections::BTreeMap<String, Case> =
            serde_json::from_str(include_str!("../../tests/fixtures/spectrum.json")).unwrap();
        assert_eq!(cases.len(), 4);
        for (name, case) in cases {
            let d = case.matrix.len();
            let m = DMatrix::from_row_iterator(d, d, case.matrix.iter().flatten().copied());
            let s = spectrum(&m);
            let flat: Vec<f64> = case.matrix.iter().flatten().copied().collect();
            let symmetric = Traces::of_row_major(&flat, d).symmetric();
            assert!((symmetric.mean - case.sym_mean).abs() < 1e-9, "{name}");
            assert!((symmetric.var - case.sym_var).abs() < 1e-9, "{name}");
            for (what, ours, numpy) in [
                ("mean_real", s.mean_real, case.mean_real),
                ("var_real", s.var_real, case.var_real),
                ("mean_abs", s.mean_abs, case.mean_abs),
                ("var_abs", s.var_abs, case.var_abs),
                ("sym_mean", s.sym_mean, case.sym_mean),
                ("sym_var", s.sym_var, case.sym_var),
            ] {
                assert!(
                    (ours - numpy).abs() < 1e-9,
                    "{name} {what}: {ours} vs numpy {numpy}"
                );
            }
        }
    }

    /// The d_h × d_h route equals the eigenvalues of the full d × d product, zeros included.
    #[test]
    fn head_spectrum_equals_the_full_matrix() {
        let (dh, d) = (3, 8);
        let wq: Vec<f32> = (0..dh * d)
            .map(|k| ((k * 37 % 17) as f32 - 8.0) / 9.0)
            .collect();
        let wk: Vec<f32> = (0..dh * d)
            .map(|k| ((k * 11 % 13) as f32 - 6.0) / 7.0)
            .collect();
        let scale = 1.0 / (dh as f64).sqrt();
        let ours = head_spectrum(&wq, &wk, dh, scale);
        let as_matrix =
            |rows: &[f32]| DMatrix::from_row_iterator(dh, d, rows.iter().map(|&v| f64::from(v)));
        let full = spectrum(&((as_matrix(&wq).transpose() * as_matrix(&wk)) * scale));
        for (a, b) in [
            (ours.mean_real, full.mean_real),
            (ours.var_real, full.var_real),
            (ours.mean_abs, full.mean_abs),
            (ours.var_abs, full.var_abs),
            (ours.sym_mean, full.sym_mean),
            (ours.sym_var, full.sym_var),
        ] {
            assert!(
                (a - b).abs() < 1e-9 * (1.0 + b.abs()),
                "{ours:?} vs {full:?}"
            );
        }
    }

    #[test]
    fn uniform_attention_has_entropy_log_t_and_identical_tokens_do_not_disperse() {
        let t = 197;
        let uniform = vec![1.0 / t as f32; t];
        assert!((entropy(&uniform) - (t as f64).ln()).abs() < 1e-5);
        assert_eq!(entropy(&[1.0f32, 0.0, 0.0]), 0.0);
        let same: Vec<f32> = (0..5).flat_map(|_| [0.3f32, -1.2, 4.0]).collect();
        assert_eq!(rank_collapse_residual(&same, 5, 3), 0.0);
        // Two rows ±v: the mean is 0, the whole of Y is residual.
        assert!((rank_collapse_residual(&[1.0, 2.0, -1.0, -2.0], 2, 2) - 1.0).abs() < 1e-12);
    }
}
