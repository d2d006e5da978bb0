//! Pure statistics, with no knowledge of cells: Spearman's ρ and its permutation tests (plain and
//! within strata), Cohen's κ and a bootstrap's percentile interval.

use std::collections::BTreeMap;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// Ranks with ties given their mean rank (1-based).
fn ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut ranks = vec![0.0; values.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && values[order[j + 1]] == values[order[i]] {
            j += 1;
        }
        let mean_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            ranks[k] = mean_rank;
        }
        i = j + 1;
    }
    ranks
}

/// Spearman's rank correlation (Pearson's on tie-averaged ranks); NaN under three pairs or when
/// one side is constant.
pub fn spearman(xs: &[f64], ys: &[f64]) -> f64 {
    if xs.len() != ys.len() || xs.len() < 3 {
        return f64::NAN;
    }
    let (rx, ry) = (ranks(xs), ranks(ys));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (mx, my) = (mean(&rx), mean(&ry));
    let cov: f64 = rx.iter().zip(&ry).map(|(a, b)| (a - mx) * (b - my)).sum();
    let vx: f64 = rx.iter().map(|a| (a - mx).powi(2)).sum();
    let vy: f64 = ry.iter().map(|b| (b - my).powi(2)).sum();
    cov / (vx * vy).sqrt()
}

/// Cohen's κ of two labellings of the same items, with the agreement observed and the agreement
/// chance alone gives from the two margins.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Kappa {
    pub kappa: f64,
    pub observed: f64,
    pub chance: f64,
    pub items: usize,
}

/// κ = (p_o − p_e) / (1 − p_e) over `pairs` (first labelling, second); NaN without items or
/// where one labelling is constant (one label throughout): κ is then 0 by construction, whatever
/// the other says (p_o = p_e), and is not a measure of agreement.
pub fn cohen_kappa(pairs: &[(String, String)]) -> Kappa {
    let items = pairs.len();
    let total = items as f64;
    let observed = pairs.iter().filter(|(a, b)| a == b).count() as f64 / total;
    let mut rows: BTreeMap<&str, f64> = BTreeMap::new();
    let mut columns: BTreeMap<&str, f64> = BTreeMap::new();
    for (a, b) in pairs {
        *rows.entry(a).or_default() += 1.0;
        *columns.entry(b).or_default() += 1.0;
    }
    let chance: f64 = rows
        .iter()
        .map(|(label, count)| count / total * columns.get(label).copied().unwrap_or(0.0) / total)
        .sum();
    let constant = rows.len() < 2 || columns.len() < 2;
    Kappa {
        kappa: if constant {
            f64::NAN
        } else {
            (observed - chance) / (1.0 - chance)
        },
        observed,
        chance,
        items,
    }
}

/// Two-sided permutation p-value of Spearman's ρ(xs, ys): the share of `permutations` shuffles of
/// `ys` whose |ρ| reaches the observed one, the observed pairing counted as one of them.
pub fn permutation_p(xs: &[f64], ys: &[f64], permutations: usize, seed: u64) -> f64 {
    let strata = vec![0; xs.len()];
    stratified_permutation_p(xs, ys, &strata, permutations, seed)
}

/// The cell-weighted mean over strata of Spearman's ρ within each stratum (strata whose ρ is
/// undefined left out): a correlation that a difference between strata cannot make.
pub fn pooled_rho(xs: &[f64], ys: &[f64], strata: &[usize]) -> f64 {
    let mut labels: Vec<usize> = strata.to_vec();
    labels.sort_unstable();
    labels.dedup();
    let (mut sum, mut weight) = (0.0, 0.0);
    for label in labels {
        let (sx, sy): (Vec<f64>, Vec<f64>) = (0..xs.len())
            .filter(|&i| strata[i] == label)
            .map(|i| (xs[i], ys[i]))
            .unzip();
        let rho = spearman(&sx, &sy);
        if rho.is_finite() {
            sum += rho * sx.len() as f64;
            weight += sx.len() as f64;
        }
    }
    if weight > 0.0 { sum / weight } else { f64::NAN }
}

/// Shuffles `values` among the positions of each stratum only: every value stays in its stratum.
fn permute_within(values: &mut [f64], strata: &[usize], rng: &mut ChaCha8Rng) {
    let mut labels: Vec<usize> = strata.to_vec();
    labels.sort_unstable();
    labels.dedup();
    for label in labels {
        let at: Vec<usize> = (0..strata.len()).filter(|&i| strata[i] == label).collect();
        let mut taken: Vec<f64> = at.iter().map(|&i| values[i]).collect();
        taken.shuffle(rng);
        for (&i, v) in at.iter().zip(taken) {
            values[i] = v;
        }
    }
}

/// Two-sided permutation p-value of [`pooled_rho`], `ys` shuffled within strata only, so that
/// what the strata differ by (n) cannot carry it; (1 + reaching) / (1 + permutations).
pub fn stratified_permutation_p(
    xs: &[f64],
    ys: &[f64],
    strata: &[usize],
    permutations: usize,
    seed: u64,
) -> f64 {
    let statistic = |ys: &[f64]| pooled_rho(xs, ys, strata);
    permutation_p_of(&statistic, ys, strata, permutations, seed)
}

/// Two-sided permutation p-value of any `statistic` of `ys` (its |value|), `ys` shuffled within
/// strata only; NaN where the observed value is undefined.
pub(super) fn permutation_p_of(
    statistic: &dyn Fn(&[f64]) -> f64,
    ys: &[f64],
    strata: &[usize],
    permutations: usize,
    seed: u64,
) -> f64 {
    let observed = statistic(ys).abs();
    if !observed.is_finite() {
        return f64::NAN;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut shuffled = ys.to_vec();
    let reaching = (0..permutations)
        .filter(|_| {
            permute_within(&mut shuffled, strata, &mut rng);
            // A tolerance, so that a permutation giving the same value counts despite rounding.
            statistic(&shuffled).abs() >= observed - 1e-12
        })
        .count();
    (1 + reaching) as f64 / (1 + permutations) as f64
}

/// 2.5 % and 97.5 % percentiles of the finite `draws`.
pub fn percentile_interval(mut draws: Vec<f64>) -> (f64, f64) {
    draws.retain(|r| r.is_finite());
    draws.sort_by(f64::total_cmp);
    let at = |q: f64| {
        draws
            .get(((draws.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    (at(0.025), at(0.975))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_is_one_for_monotone_pairs_and_handles_ties() {
        assert!((spearman(&[1.0, 2.0, 3.0, 4.0], &[10.0, 20.0, 25.0, 100.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        assert_eq!(ranks(&[5.0, 1.0, 5.0, 2.0]), vec![3.5, 1.0, 3.5, 2.0]);
        // scipy.stats.spearmanr([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) = 0.8
        assert!(
            (spearman(&[1.0, 2.0, 3.0, 4.0, 5.0], &[2.0, 1.0, 4.0, 3.0, 5.0]) - 0.8).abs() < 1e-12
        );
        // scipy.stats.spearmanr, ties on both sides: -0.9705882352941178
        let tied = spearman(
            &[0.5, 1.0, 1.0, 3.0, 2.0, 7.0],
            &[0.9, 0.8, 0.85, 0.3, 0.3, 0.1],
        );
        assert!((tied + 0.9705882352941178).abs() < 1e-12, "{tied}");
        assert!(spearman(&[1.0, 2.0], &[1.0, 2.0]).is_nan());
        assert!(spearman(&[1.0, 2.0, 3.0], &[1.0, 1.0, 1.0]).is_nan());
    }

    #[test]
    fn kappa_matches_a_hand_computation() {
        // 2×2 table: (a, a) 20, (a, b) 5, (b, a) 10, (b, b) 15; N 50.
        // p_o = 35/50 = 0.7; rows a 25, b 25; columns a 30, b 20;
        // p_e = 0.5·0.6 + 0.5·0.4 = 0.5; κ = (0.7 − 0.5) / 0.5 = 0.4.
        let mut pairs = Vec::new();
        for (a, b, count) in [
            ("a", "a", 20),
            ("a", "b", 5),
            ("b", "a", 10),
            ("b", "b", 15),
        ] {
            pairs.extend(std::iter::repeat_n((a.to_string(), b.to_string()), count));
        }
        let k = cohen_kappa(&pairs);
        assert_eq!(k.items, 50);
        assert!((k.observed - 0.7).abs() < 1e-12 && (k.chance - 0.5).abs() < 1e-12);
        assert!((k.kappa - 0.4).abs() < 1e-12, "{k:?}");
        // One rater always saying the same: κ would be 0 whatever the other says; none is given.
        let constant: Vec<(String, String)> = ["x", "y", "x"]
            .iter()
            .map(|s| ("harmful".to_string(), s.to_string()))
            .collect();
        assert!(cohen_kappa(&constant).kappa.is_nan());
        // A label only one side uses adds nothing to chance; full agreement is κ 1.
        let same: Vec<(String, String)> = ["x", "y", "x"]
            .iter()
            .map(|s| (s.to_string(), s.to_string()))
            .collect();
        assert!((cohen_kappa(&same).kappa - 1.0).abs() < 1e-12);
        assert!(cohen_kappa(&[]).kappa.is_nan());
    }

    #[test]
    fn the_permutation_p_value_is_small_for_a_monotone_relation_and_large_for_noise() {
        let xs: Vec<f64> = (0..12).map(f64::from).collect();
        let monotone: Vec<f64> = xs.iter().map(|x| x * x).collect();
        // The smallest p 2000 permutations can give is 1/2001; none of 12! orders but the
        // observed one (and its mirror, for |ρ|) reaches ρ = 1.
        let p = permutation_p(&xs, &monotone, 2000, 7);
        assert!(p < 0.002, "{p}");
        // Outcomes unrelated to x: a fixed shuffle with ρ near 0.
        let noise = [5.0, 11.0, 0.0, 8.0, 3.0, 9.0, 1.0, 6.0, 10.0, 2.0, 7.0, 4.0];
        let rho = spearman(&xs, &noise);
        let p = permutation_p(&xs, &noise, 2000, 7);
        assert!(rho.abs() < 0.15 && p > 0.6, "ρ {rho}, p {p}");
    }

    #[test]
    fn the_stratified_permutation_keeps_each_value_in_its_stratum() {
        let strata = [20, 20, 20, 200, 200, 200, 1000, 1000];
        let values = [1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 100.0, 200.0];
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut moved = values;
        let mut changed = false;
        for _ in 0..50 {
            permute_within(&mut moved, &strata, &mut rng);
            changed |= moved != values;
            for (label, range) in [(20, 0..3), (200, 3..6), (1000, 6..8)] {
                let mut inside: Vec<f64> = moved[range.clone()].to_vec();
                inside.sort_by(f64::total_cmp);
                assert_eq!(inside, values[range].to_vec(), "stratum {label}");
            }
        }
        assert!(changed, "the permutation never moved anything");
        // y rises with n only and falls with x inside every stratum: pooled ρ is −1, and
        // permuting within strata finds that rare; a plain permutation (strata ignored) would
        // credit the rise across n.
        let xs = [3.0, 2.0, 1.0, 3.0, 2.0, 1.0, 3.0, 2.0, 1.0];
        let ys = [1.0, 2.0, 3.0, 11.0, 12.0, 13.0, 21.0, 22.0, 23.0];
        let strata = [0, 0, 0, 1, 1, 1, 2, 2, 2];
        assert!((pooled_rho(&xs, &ys, &strata) + 1.0).abs() < 1e-12);
        let p = stratified_permutation_p(&xs, &ys, &strata, 4000, 5);
        // Exactly: 2 of the 6³ orders reach |ρ| = 1 in every stratum, 2/216 ≈ 0.009.
        assert!(p < 0.03, "{p}");
        assert!(spearman(&xs, &ys).abs() < 0.5);
    }
}
