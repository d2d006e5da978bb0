//! The SNR dose's analysis (`reproduce dose-report`): the predictions P1–P4 and the answer line
//! exactly as results/dose-pilot/PREREGISTRATION.md fixed them before the numbers, tested on a
//! dose grid's runs (docs/design.md, "The SNR dose").
//!
//! - P1, P2: Jonckheere–Terpstra over the runs of one (dataset, n), groups by dose ascending, ties
//!   counted ½, one-sided (memorisation increasing, paired Δ decreasing), with the exact
//!   permutation null ([`jt_exact_tail`]: every assignment of the values to the groups).
//! - P3: reversals of the verdict's rank as the dose rises.
//! - P4: (1 + k₁₀₀₀)/(1 + k₂₀₀) at the 50 % memorisation crossing, with a seed bootstrap.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::plot::{LinePanel, PALETTE, Series, line_panels};
use super::results::{ResultRow, aggregate};
use super::verdict::{CellOutcome, NOISY_ETA, Verdict, verdict};

/// One-sided significance of P1 and P2.
pub const ALPHA: f64 = 0.05;
/// The memorisation level whose crossing P4 follows.
pub const CROSSING: f64 = 0.5;
/// Bootstrap draws of P4's ratio.
pub const DRAWS: usize = 10_000;
/// The ratio P4 predicts: n 1000 over n 200.
pub const PREDICTED_RATIO: f64 = 5.0;
/// The sizes P4 compares on real data; their ratio is [`PREDICTED_RATIO`].
pub const REAL_SIZES: Sizes = Sizes {
    small: 200,
    large: 1000,
};

/// The two training-set sizes P4 compares (the larger [`PREDICTED_RATIO`] times the smaller).
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub small: usize,
    pub large: usize,
}
const BOOTSTRAP_SEED: u64 = 0xd05e;

/// A run as the analysis reads it.
#[derive(Clone, Debug)]
pub struct DoseRun {
    pub dataset: String,
    pub n: usize,
    pub k: f64,
    pub seed: u64,
    pub eta: f64,
    pub memorization: f64,
    pub test_acc: f64,
}

impl DoseRun {
    fn of(row: &ResultRow) -> Self {
        let c = &row.config;
        Self {
            dataset: row.dataset(),
            n: c.n,
            k: c.token_noise,
            seed: c.seed,
            eta: c.eta,
            memorization: row.memorization(),
            test_acc: row.test_acc(),
        }
    }
}

/// Values in groups (dose ascending), for the trend tests.
pub type Groups = Vec<Vec<f64>>;

/// The Jonckheere–Terpstra statistic in half-units: twice Σ over ordered group pairs g < h of
/// #{a ∈ g, b ∈ h: x_a < x_b} + ½ #{x_a = x_b}.
pub fn jt_statistic(groups: &Groups) -> u64 {
    let mut total = 0;
    for (g, lower) in groups.iter().enumerate() {
        for upper in &groups[g + 1..] {
            for a in lower {
                for b in upper {
                    total += if a < b {
                        2
                    } else if a == b {
                        1
                    } else {
                        0
                    };
                }
            }
        }
    }
    total
}

/// The statistic's mean under no trend, in half-units: Σ_{g<h} s_g s_h.
pub fn jt_null_mean(groups: &Groups) -> f64 {
    let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
    let mut mean = 0;
    for g in 0..sizes.len() {
        for h in g + 1..sizes.len() {
            mean += sizes[g] * sizes[h];
        }
    }
    mean as f64
}

/// The exact null of the statistic: for each value v (half-units), how many assignments of the
/// pooled values to groups of the same sizes give v. At most 20 values (5 groups of 3:
/// 168 168 000 assignments, a few seconds).
pub fn jt_null_counts(groups: &Groups) -> Vec<u64> {
    let values: Vec<f64> = groups.iter().flatten().copied().collect();
    let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
    let m = values.len();
    assert!(m <= 20, "an exact null over {m} values");
    // For each value, the others below it and equal to it, as bit masks.
    let below: Vec<u32> = (0..m)
        .map(|b| {
            (0..m)
                .filter(|&a| values[a] < values[b])
                .fold(0, |s, a| s | 1 << a)
        })
        .collect();
    let equal: Vec<u32> = (0..m)
        .map(|b| {
            (0..m)
                .filter(|&a| a != b && values[a] == values[b])
                .fold(0, |s, a| s | 1 << a)
        })
        .collect();
    let mut counts = vec![0u64; 2 * jt_null_mean(groups) as usize + 1];
    Enumeration {
        below: &below,
        equal: &equal,
        sizes: &sizes,
    }
    .count((1u32 << m) - 1, 0, 0, &mut counts);
    counts
}

/// The exact one-sided tail: the share of all assignments whose statistic is at least the
/// observed one (`increasing`), or at most it.
pub fn jt_exact_tail(groups: &Groups, increasing: bool) -> f64 {
    let null = jt_null_counts(groups);
    tail(&null, jt_statistic(groups) as usize, increasing)
}

fn tail(null: &[u64], observed: usize, increasing: bool) -> f64 {
    let total: u64 = null.iter().sum();
    let extreme: u64 = if increasing {
        null[observed..].iter().sum()
    } else {
        null[..=observed].iter().sum()
    };
    extreme as f64 / total as f64
}

/// The walk over assignments behind [`jt_null_counts`].
struct Enumeration<'a> {
    below: &'a [u32],
    equal: &'a [u32],
    sizes: &'a [usize],
}

impl Enumeration<'_> {
    /// Adds to `counts` the statistic of every assignment with groups from `group` on drawn
    /// from `remaining`, the earlier groups holding the complement with statistic `so_far`.
    fn count(&self, remaining: u32, group: usize, so_far: u64, counts: &mut [u64]) {
        let assigned = !remaining & ((1u32 << self.below.len()) - 1);
        let gain = |b: usize| {
            2 * u64::from((assigned & self.below[b]).count_ones())
                + u64::from((assigned & self.equal[b]).count_ones())
        };
        if group + 1 == self.sizes.len() {
            let total = so_far
                + (0..self.below.len())
                    .filter(|&b| remaining >> b & 1 == 1)
                    .map(gain)
                    .sum::<u64>();
            counts[total as usize] += 1;
            return;
        }
        let members: Vec<usize> = (0..self.below.len())
            .filter(|&b| remaining >> b & 1 == 1)
            .collect();
        for_each_subset(&members, self.sizes[group], &mut |subset: u32| {
            let added: u64 = members
                .iter()
                .filter(|&&b| subset >> b & 1 == 1)
                .map(|&b| gain(b))
                .sum();
            self.count(remaining & !subset, group + 1, so_far + added, counts);
        });
    }
}

/// Calls `f` with every `size`-element subset of `members` as a bit mask.
fn for_each_subset(members: &[usize], size: usize, f: &mut dyn FnMut(u32)) {
    fn walk(members: &[usize], size: usize, start: usize, mask: u32, f: &mut dyn FnMut(u32)) {
        if size == 0 {
            f(mask);
            return;
        }
        for i in start..=members.len().saturating_sub(size) {
            walk(members, size - 1, i + 1, mask | 1 << members[i], f);
        }
    }
    walk(members, size, 0, 0, f);
}

/// One trend test's outcome.
#[derive(Clone, Copy, Debug)]
pub struct Trend {
    pub p: f64,
    /// The statistic lies on the other side of its null mean.
    pub wrong_signed: bool,
}

/// One series of an arm under no trend: the observed statistic and its exact null.
struct TrendNull {
    observed: usize,
    mean: f64,
    counts: Vec<u64>,
}

impl TrendNull {
    /// `None` with fewer than two non-empty groups.
    fn of(groups: &Groups) -> Option<Self> {
        let groups: Groups = groups.iter().filter(|g| !g.is_empty()).cloned().collect();
        (groups.len() >= 2).then(|| Self {
            observed: jt_statistic(&groups) as usize,
            mean: jt_null_mean(&groups),
            counts: jt_null_counts(&groups),
        })
    }

    fn test(&self, increasing: bool) -> Trend {
        Self::pooled(&[self], increasing).expect("one stratum")
    }

    /// The stratified test over `strata` (the mended rule's P1 and P2, pooled over a dataset's
    /// n): the sum of their statistics, its exact null the convolution of theirs, since the
    /// strata are permuted independently. A stratum of ties alone adds a constant.
    fn pooled(strata: &[&TrendNull], increasing: bool) -> Option<Trend> {
        if strata.is_empty() {
            return None;
        }
        let mut law = vec![1.0f64];
        for stratum in strata {
            let total: u64 = stratum.counts.iter().sum();
            let mut next = vec![0.0; law.len() + stratum.counts.len() - 1];
            for (i, p) in law.iter().enumerate() {
                for (j, c) in stratum.counts.iter().enumerate() {
                    next[i + j] += p * *c as f64 / total as f64;
                }
            }
            law = next;
        }
        let observed: usize = strata.iter().map(|s| s.observed).sum();
        let mean: f64 = strata.iter().map(|s| s.mean).sum();
        let p = if increasing {
            law[observed..].iter().sum::<f64>()
        } else {
            law[..=observed].iter().sum::<f64>()
        };
        let statistic = observed as f64;
        Some(Trend {
            p: p.min(1.0),
            wrong_signed: if increasing {
                statistic < mean
            } else {
                statistic > mean
            },
        })
    }
}

/// The rank P3 orders verdicts by (more dose, no lower rank).
fn rank(verdict: Verdict) -> u8 {
    match verdict {
        Verdict::NotOverfitting => 0,
        Verdict::PartlyMemorised => 1,
        Verdict::Benign => 2,
        Verdict::Harmful => 3,
    }
}

/// One (dataset, n) of the grid.
struct Arm {
    dataset: String,
    n: usize,
    doses: Vec<f64>,
    /// Memorisation of the η 0.2 runs and the paired Δ, per dose, by seed.
    memorisation: Vec<BTreeMap<u64, f64>>,
    delta: Vec<BTreeMap<u64, f64>>,
    verdicts: Vec<Option<Verdict>>,
}

impl Arm {
    fn groups(series: &[BTreeMap<u64, f64>]) -> Groups {
        series
            .iter()
            .map(|by_seed| {
                by_seed
                    .values()
                    .copied()
                    .filter(|v| v.is_finite())
                    .collect()
            })
            .collect()
    }

    fn reversals(&self) -> usize {
        let ranks: Vec<u8> = self.verdicts.iter().flatten().map(|&v| rank(v)).collect();
        ranks.windows(2).filter(|w| w[1] < w[0]).count()
    }
}

/// The arms of `runs`: per dataset and n, the doses ascending, the η 0.2 memorisation and the
/// paired Δ per seed, and each dose's verdict from `verdict_of`.
fn arms(runs: &[DoseRun], verdict_of: &dyn Fn(&str, usize, f64) -> Option<Verdict>) -> Vec<Arm> {
    let mut keys: Vec<(String, usize)> = Vec::new();
    for r in runs {
        if !keys.contains(&(r.dataset.clone(), r.n)) {
            keys.push((r.dataset.clone(), r.n));
        }
    }
    keys.into_iter()
        .map(|(dataset, n)| {
            let mine: Vec<&DoseRun> = runs
                .iter()
                .filter(|r| r.dataset == dataset && r.n == n)
                .collect();
            let mut doses: Vec<f64> = mine.iter().map(|r| r.k).collect();
            doses.sort_by(f64::total_cmp);
            doses.dedup();
            let at = |k: f64, eta: f64| -> BTreeMap<u64, &DoseRun> {
                mine.iter()
                    .filter(|r| r.k == k && (r.eta - eta).abs() < 1e-9)
                    .map(|r| (r.seed, *r))
                    .collect()
            };
            let memorisation = doses
                .iter()
                .map(|&k| {
                    at(k, NOISY_ETA)
                        .into_iter()
                        .map(|(s, r)| (s, r.memorization))
                        .collect()
                })
                .collect();
            let delta = doses
                .iter()
                .map(|&k| {
                    let clean = at(k, 0.0);
                    at(k, NOISY_ETA)
                        .into_iter()
                        .filter_map(|(s, r)| clean.get(&s).map(|c| (s, r.test_acc - c.test_acc)))
                        .collect()
                })
                .collect();
            let verdicts = doses.iter().map(|&k| verdict_of(&dataset, n, k)).collect();
            Arm {
                dataset,
                n,
                doses,
                memorisation,
                delta,
                verdicts,
            }
        })
        .collect()
}

/// Where the seed-mean memorisation first crosses [`CROSSING`] upward, in 1 + k, interpolated
/// linearly in log(1 + k); `None` without a crossing.
fn crossing(doses: &[f64], means: &[f64]) -> Option<f64> {
    if means.first().is_some_and(|&m| m >= CROSSING) {
        return Some(1.0 + doses[0]);
    }
    doses.windows(2).zip(means.windows(2)).find_map(|(k, m)| {
        (m[0] < CROSSING && m[1] >= CROSSING).then(|| {
            let (a, b) = ((1.0 + k[0]).ln(), (1.0 + k[1]).ln());
            (a + (CROSSING - m[0]) / (m[1] - m[0]) * (b - a)).exp()
        })
    })
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// P4 of one dataset: the ratio at the seed means and its bootstrap interval, with the share of
/// draws that had no crossing.
struct Ratio {
    point: Option<f64>,
    interval: Option<[f64; 2]>,
    without_crossing: f64,
}

fn ratio(small: &Arm, large: &Arm) -> Ratio {
    let at_means = |arm: &Arm| {
        let means: Vec<f64> = arm
            .memorisation
            .iter()
            .map(|s| mean(&s.values().copied().collect::<Vec<_>>()))
            .collect();
        crossing(&arm.doses, &means)
    };
    let point = at_means(small).zip(at_means(large)).map(|(a, b)| b / a);
    let mut rng = ChaCha8Rng::seed_from_u64(BOOTSTRAP_SEED);
    let mut draw = |arm: &Arm| {
        let means: Vec<f64> = arm
            .memorisation
            .iter()
            .map(|s| {
                let v: Vec<f64> = s.values().copied().collect();
                if v.is_empty() {
                    return f64::NAN;
                }
                mean(
                    &(0..v.len())
                        .map(|_| v[rng.random_range(0..v.len())])
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        crossing(&arm.doses, &means)
    };
    let mut ratios = Vec::with_capacity(DRAWS);
    for _ in 0..DRAWS {
        if let (Some(a), Some(b)) = (draw(small), draw(large)) {
            ratios.push(b / a);
        }
    }
    ratios.sort_by(f64::total_cmp);
    let interval = (!ratios.is_empty()).then(|| {
        let q = |p: f64| ratios[((ratios.len() - 1) as f64 * p).round() as usize];
        [q(0.025), q(0.975)]
    });
    Ratio {
        point,
        interval,
        without_crossing: 1.0 - ratios.len() as f64 / DRAWS as f64,
    }
}

/// One dataset's outcome under the rules.
struct DatasetOutcome {
    dataset: String,
    /// The registered rule's tests, per n: P1 memorisation increasing, P2 Δ decreasing.
    p1: Vec<(usize, Option<Trend>)>,
    p2: Vec<(usize, Option<Trend>)>,
    /// The mended rule's tests, stratified over the dataset's n: P1 memorisation increasing,
    /// P2's falsifier (Δ increasing).
    p1_pooled: Option<Trend>,
    delta_rise: Option<Trend>,
    reversals: usize,
    ratio: Option<Ratio>,
}

/// Which rule an answer is read under (PREREGISTRATION.md): as first registered, or as mended
/// after check 1 showed the first could not say Yes, before the full grid's analysis was read.
/// The mended rule decides the answer line; the registered one is printed beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DoseRule {
    Registered,
    Mended,
}

impl DatasetOutcome {
    fn holds(tests: &[(usize, Option<Trend>)]) -> bool {
        !tests.is_empty() && tests.iter().all(|(_, t)| t.is_some_and(|t| t.p < ALPHA))
    }

    fn wrong_signed(tests: &[(usize, Option<Trend>)]) -> bool {
        tests.iter().any(|(_, t)| t.is_some_and(|t| t.wrong_signed))
    }

    /// P1 and P2 both hold.
    fn trends_hold(&self, rule: DoseRule) -> bool {
        match rule {
            DoseRule::Registered => Self::holds(&self.p1) && Self::holds(&self.p2),
            // M1: P2 ("Δ falls or stays") holds unless Δ rises at p < α; M4: P1 pooled over n.
            DoseRule::Mended => {
                self.p1_pooled.is_some_and(|t| t.p < ALPHA)
                    && self.delta_rise.is_some_and(|t| t.p >= ALPHA)
            }
        }
    }

    /// P1 or P2 runs against the theorem.
    fn trends_wrong(&self, rule: DoseRule) -> bool {
        match rule {
            DoseRule::Registered => Self::wrong_signed(&self.p1) || Self::wrong_signed(&self.p2),
            DoseRule::Mended => {
                self.p1_pooled.is_some_and(|t| t.wrong_signed)
                    || self.delta_rise.is_some_and(|t| t.p < ALPHA)
            }
        }
    }

    /// (P4 holds, P4 holds 1).
    fn p4(&self, rule: DoseRule) -> (bool, bool) {
        let Some(r) = self.ratio.as_ref() else {
            return (false, false);
        };
        let Some([lo, hi]) = r.interval else {
            return (false, false);
        };
        let holds_one = lo <= 1.0 && 1.0 <= hi;
        let near = match rule {
            DoseRule::Registered => lo <= PREDICTED_RATIO && PREDICTED_RATIO <= hi,
            // M3: the point ratio within ×2 of the prediction.
            DoseRule::Mended => r.point.is_some_and(|v| {
                (PREDICTED_RATIO / P4_FACTOR..=PREDICTED_RATIO * P4_FACTOR).contains(&v)
            }),
        };
        (near && !holds_one, holds_one)
    }
}

/// The mended P4's tolerance on the point ratio (M3).
pub const P4_FACTOR: f64 = 2.0;

/// The answer line of the pre-registered rule.
pub fn answer(p1p2_hold: usize, p4_holds: usize, wrong: usize, p4_one: usize) -> &'static str {
    if wrong >= 3 || p4_one >= 4 {
        "No"
    } else if p1p2_hold >= 5 && p4_holds >= 4 {
        "Yes"
    } else {
        "Undecided"
    }
}

/// The analysis of `runs` as markdown, with the answer line; `label` names what was analysed.
fn analyse(
    runs: &[DoseRun],
    verdict_of: &dyn Fn(&str, usize, f64) -> Option<Verdict>,
    label: &str,
    sizes: Sizes,
) -> (String, &'static str) {
    assert_eq!(
        sizes.large as f64,
        PREDICTED_RATIO * sizes.small as f64,
        "P4 predicts the ratio of the sizes"
    );
    let arms = arms(runs, verdict_of);
    let outcomes = outcomes(&arms, sizes);
    let mut md = format!("## {label}\n\n");
    trend_table(&mut md, &outcomes, &arms);
    pooled_table(&mut md, &outcomes);
    ratio_table(&mut md, &outcomes, sizes);
    let said = answer_line(&mut md, &outcomes, label);
    (md, said)
}

/// Each dataset's tests, from its arms.
fn outcomes(arms: &[Arm], sizes: Sizes) -> Vec<DatasetOutcome> {
    let mut datasets: Vec<String> = Vec::new();
    for a in arms {
        if !datasets.contains(&a.dataset) {
            datasets.push(a.dataset.clone());
        }
    }
    datasets
        .iter()
        .map(|dataset| {
            let mine: Vec<&Arm> = arms.iter().filter(|a| a.dataset == *dataset).collect();
            let small = mine.iter().find(|a| a.n == sizes.small);
            let large = mine.iter().find(|a| a.n == sizes.large);
            let memorisation: Vec<(usize, Option<TrendNull>)> = mine
                .iter()
                .map(|a| (a.n, TrendNull::of(&Arm::groups(&a.memorisation))))
                .collect();
            let delta: Vec<(usize, Option<TrendNull>)> = mine
                .iter()
                .map(|a| (a.n, TrendNull::of(&Arm::groups(&a.delta))))
                .collect();
            let per_n = |nulls: &[(usize, Option<TrendNull>)], increasing: bool| {
                nulls
                    .iter()
                    .map(|(n, null)| (*n, null.as_ref().map(|t| t.test(increasing))))
                    .collect()
            };
            let pooled = |nulls: &[(usize, Option<TrendNull>)], increasing: bool| {
                let strata: Vec<&TrendNull> =
                    nulls.iter().filter_map(|(_, t)| t.as_ref()).collect();
                TrendNull::pooled(&strata, increasing)
            };
            DatasetOutcome {
                dataset: dataset.clone(),
                p1: per_n(&memorisation, true),
                p2: per_n(&delta, false),
                p1_pooled: pooled(&memorisation, true),
                delta_rise: pooled(&delta, true),
                reversals: mine.iter().map(|a| a.reversals()).sum(),
                ratio: small.zip(large).map(|(s, l)| ratio(s, l)),
            }
        })
        .collect()
}

/// P1, P2 and P3 per dataset and n.
fn trend_table(md: &mut String, outcomes: &[DatasetOutcome], arms: &[Arm]) {
    let _ = writeln!(
        *md,
        "| dataset | n | P1 p (memorisation ↑) | P2 p (Δ ↓) | verdicts by dose | reversals |\n|---|---|---|---|---|---|"
    );
    for outcome in outcomes {
        for (k, (n, p1)) in outcome.p1.iter().enumerate() {
            let p2 = outcome.p2.get(k).and_then(|(_, t)| *t);
            let show = show_trend;
            let arm = arms
                .iter()
                .find(|a| a.dataset == outcome.dataset && a.n == *n)
                .expect("an arm per test");
            let verdicts: Vec<String> = arm
                .doses
                .iter()
                .zip(&arm.verdicts)
                .map(|(d, v)| format!("k{d}: {}", v.map_or("–", Verdict::name)))
                .collect();
            let _ = writeln!(
                *md,
                "| {} | {n} | {} | {} | {} | {} |",
                outcome.dataset,
                show(*p1),
                show(p2),
                verdicts.join(", "),
                arm.reversals()
            );
        }
    }
}

/// P4 per dataset.
fn ratio_table(md: &mut String, outcomes: &[DatasetOutcome], sizes: Sizes) {
    let Sizes { small, large } = sizes;
    let _ = writeln!(
        *md,
        "\n| dataset | P4 ratio (1 + k at n {large})/(1 + k at n {small}) | 95 % interval | draws without a crossing |\n|---|---|---|---|"
    );
    for outcome in outcomes {
        match &outcome.ratio {
            Some(r) => {
                let _ = writeln!(
                    *md,
                    "| {} | {} | {} | {:.0} % |",
                    outcome.dataset,
                    r.point.map_or("no crossing".into(), |v| format!("{v:.2}")),
                    r.interval
                        .map_or("–".into(), |[a, b]| format!("[{a:.2}, {b:.2}]")),
                    100.0 * r.without_crossing
                );
            }
            None => {
                let _ = writeln!(
                    *md,
                    "| {} | – (needs n {small} and {large}) | – | – |",
                    outcome.dataset
                );
            }
        }
    }
}

/// The mended rule's tests per dataset (pooled over n).
fn pooled_table(md: &mut String, outcomes: &[DatasetOutcome]) {
    let _ = writeln!(
        *md,
        "\n| dataset | P1 p, pooled over n (memorisation ↑) | Δ rise p, pooled over n (P2 fails below {ALPHA}) |\n|---|---|---|"
    );
    for o in outcomes {
        let _ = writeln!(
            *md,
            "| {} | {} | {} |",
            o.dataset,
            show_trend(o.p1_pooled),
            o.delta_rise.map_or("–".into(), |t| show_p(t.p))
        );
    }
}

fn show_p(p: f64) -> String {
    if p < 1e-3 {
        format!("{p:.1e}")
    } else {
        format!("{p:.4}")
    }
}

fn show_trend(t: Option<Trend>) -> String {
    t.map_or("–".to_string(), |t| {
        format!(
            "{}{}",
            show_p(t.p),
            if t.wrong_signed { " (wrong sign)" } else { "" }
        )
    })
}

/// The counts `rule` reads and its answer.
fn counts_under(outcomes: &[DatasetOutcome], rule: DoseRule) -> (String, &'static str) {
    let hold = outcomes.iter().filter(|o| o.trends_hold(rule)).count();
    let wrong = outcomes.iter().filter(|o| o.trends_wrong(rule)).count();
    let p4_holds = outcomes.iter().filter(|o| o.p4(rule).0).count();
    let p4_one = outcomes.iter().filter(|o| o.p4(rule).1).count();
    let said = answer(hold, p4_holds, wrong, p4_one);
    let p4 = match rule {
        DoseRule::Registered => "interval holds 5 and excludes 1",
        DoseRule::Mended => "point within ×2 of 5 and interval excludes 1",
    };
    let counts = format!(
        "P1 and P2 hold in {hold} of {} datasets; wrong-signed in {wrong}; P4's {p4} in \
         {p4_holds}, interval holds 1 in {p4_one}",
        outcomes.len()
    );
    (counts, said)
}

/// The counts each rule reads and the answer line (the mended rule's), written to `md`.
fn answer_line(md: &mut String, outcomes: &[DatasetOutcome], label: &str) -> &'static str {
    let reversals: usize = outcomes.iter().map(|o| o.reversals).sum();
    let (registered, registered_said) = counts_under(outcomes, DoseRule::Registered);
    let (mended, said) = counts_under(outcomes, DoseRule::Mended);
    let _ = writeln!(
        *md,
        "\nAs registered (per n, P2 a significant fall): {registered}: {registered_said}.\n\n\
         As mended after check 1 (P1 pooled over n, P2 fails only on a significant rise, P4 \
         within ×2): {mended}. P3: {reversals} reversal(s).\n\n**Answer ({label}): {said}.**\n"
    );
    said
}

/// The verdict of each (dataset, n, dose) cell from the rows, by the report's rule.
fn verdicts_of(rows: &[ResultRow]) -> impl Fn(&str, usize, f64) -> Option<Verdict> + '_ {
    let cells = aggregate(rows);
    move |dataset: &str, n: usize, k: f64| {
        let label_of = |c: &super::results::Cell| c.mode.clone();
        let wanted = rows
            .iter()
            .find(|r| r.dataset() == dataset && r.config.n == n && r.config.token_noise == k)
            .map(|r| r.mode())?;
        let clean = cells
            .iter()
            .find(|c| c.dataset == dataset && c.n == n && label_of(c) == wanted && c.eta == 0.0)?;
        let noisy = cells.iter().find(|c| {
            c.dataset == dataset
                && c.n == n
                && label_of(c) == wanted
                && (c.eta - NOISY_ETA).abs() < 1e-9
        })?;
        match verdict(clean, noisy) {
            CellOutcome::Called(call) => Some(call.verdict),
            CellOutcome::Missing(_) => None,
        }
    }
}

/// The doses of each (dataset, n) permuted among its runs (each seed's η-siblings kept
/// together, so the pairs stay paired): what the analysis reads where the dose carries nothing.
pub fn shuffled_doses(runs: &[DoseRun], seed: u64) -> Vec<DoseRun> {
    use rand::seq::SliceRandom;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = runs.to_vec();
    let mut keys: Vec<(String, usize)> = Vec::new();
    for r in runs {
        if !keys.contains(&(r.dataset.clone(), r.n)) {
            keys.push((r.dataset.clone(), r.n));
        }
    }
    for (dataset, n) in keys {
        // The (dose, seed) units of this arm, and a permutation of their doses.
        let mut units: Vec<(u64, u64)> = out
            .iter()
            .filter(|r| r.dataset == dataset && r.n == n)
            .map(|r| (r.k.to_bits(), r.seed))
            .collect();
        units.sort();
        units.dedup();
        let mut doses: Vec<u64> = units.iter().map(|u| u.0).collect();
        doses.shuffle(&mut rng);
        for r in out.iter_mut().filter(|r| r.dataset == dataset && r.n == n) {
            let unit = units
                .iter()
                .position(|u| *u == (r.k.to_bits(), r.seed))
                .expect("every run is a unit");
            r.seed = unit as u64;
            r.k = f64::from_bits(doses[unit]);
        }
    }
    out
}

/// dose.md and dose.png in `out` from a dose grid's rows.
pub fn write(out: &Path, rows: &[ResultRow]) -> Result<&'static str> {
    let runs: Vec<DoseRun> = rows.iter().map(DoseRun::of).collect();
    let verdict_of = verdicts_of(rows);
    let analysis = Analysis {
        stem: "dose",
        preface: PREDICTIONS,
        sizes: REAL_SIZES,
    };
    analysis.write(out, &runs, &verdict_of)
}

/// One analysed grid's report: `<stem>.md` (the preface, the analysis, the same with the doses
/// shuffled) and `<stem>.png`.
pub struct Analysis<'a> {
    pub stem: &'a str,
    pub preface: &'a str,
    pub sizes: Sizes,
}

impl Analysis<'_> {
    /// Writes the report of `runs`, each (dataset, n, dose)'s verdict from `verdict_of`; returns
    /// the answer on the unshuffled runs.
    pub fn write(
        &self,
        out: &Path,
        runs: &[DoseRun],
        verdict_of: &dyn Fn(&str, usize, f64) -> Option<Verdict>,
    ) -> Result<&'static str> {
        let mut md = String::from(self.preface);
        let (real, said) = analyse(runs, verdict_of, "the runs", self.sizes);
        md.push_str(&real);
        md.push_str(
            "The same analysis follows with each (dataset, n)'s doses shuffled among its (dose, \
             seed) units, η-siblings kept together: where the dose carries nothing it must not \
             say Yes.\n\n",
        );
        let (shuffled, _) = analyse(
            &shuffled_doses(runs, 1),
            &|_, _, _| None,
            "doses shuffled",
            self.sizes,
        );
        md.push_str(&shuffled);
        let figure_name = format!("{}.png", self.stem);
        let _ = writeln!(md, "![memorisation and Δ against the dose]({figure_name})");
        crate::io::ensure_dir(out)?;
        let md_path = out.join(format!("{}.md", self.stem));
        crate::io::write_atomic(&md_path, |w| Ok(w.write_all(md.as_bytes())?))?;
        figure(runs, &out.join(figure_name))?;
        Ok(said)
    }
}

/// The predictions and rules as PREREGISTRATION.md fixed them, printed before the numbers.
const PREDICTIONS: &str = "# The SNR dose\n\nPredictions and rules fixed before the numbers \
(results/dose-pilot/PREREGISTRATION.md): **P1** memorisation at η 0.2 rises with the dose; **P2** \
the paired Δ (test η 0.2 − test η 0, per seed) falls or stays; **P3** no verdict falls in rank \
(not overfitting < partly memorised < benign < harmful) as the dose rises; **P4** the dose at \
which memorisation crosses 50 % moves with n as n·SNR²/(1 + k) constant: (1 + k₁₀₀₀)/(1 + k₂₀₀) ≈ \
5, with a 95 % seed-bootstrap interval. Tests: one-sided Jonckheere–Terpstra with exact \
permutation nulls. **The rule that answers** (mended after check 1, 2026-12-02, before this \
grid's analysis was read): P1 holds where the test pooled over the dataset's n (stratified, the \
null the convolution of the per-n nulls) has p < 0.05; P2 fails (wrong-signed) only where Δ \
rises at p < 0.05, pooled likewise; P4 holds where the point ratio lies within ×2 of 5 and the \
interval excludes 1. **Yes** if P1 and P2 hold in ≥ 5 of 6 datasets and P4 in ≥ 4; **No** if P1 \
is wrong-signed or P2 fails in ≥ 3, or P4's interval holds 1 in ≥ 4; else **Undecided**. The \
rule as first registered (per n; P2 a significant fall; P4's interval holding 5) is read \
beside it.\n\n";

/// Memorisation (η 0.2) and Δ against 1 + k, seed means, one line per (dataset, n).
fn figure(runs: &[DoseRun], path: &Path) -> Result<()> {
    let arms = arms(runs, &|_, _, _| None);
    // One colour per dataset; its larger n dashed.
    let mut datasets: Vec<&str> = Vec::new();
    for a in &arms {
        if !datasets.contains(&a.dataset.as_str()) {
            datasets.push(&a.dataset);
        }
    }
    let colour = |a: &Arm| {
        let k = datasets.iter().position(|d| *d == a.dataset).unwrap_or(0);
        PALETTE[k % PALETTE.len()]
    };
    let smallest = |a: &Arm| {
        arms.iter()
            .filter(|b| b.dataset == a.dataset)
            .map(|b| b.n)
            .min()
            .unwrap_or(a.n)
    };
    let lines = |series: &dyn Fn(&Arm) -> &Vec<BTreeMap<u64, f64>>| -> Vec<Series> {
        arms.iter()
            .map(|a| Series {
                label: Some(format!("{} n {}", a.dataset, a.n)),
                color: colour(a),
                width: 2,
                dashed: a.n > smallest(a),
                markers: true,
                points: a
                    .doses
                    .iter()
                    .zip(series(a))
                    .filter(|(_, s)| !s.is_empty())
                    .map(|(d, s)| {
                        (
                            (1.0 + d).log10(),
                            mean(&s.values().copied().collect::<Vec<_>>()),
                        )
                    })
                    .collect(),
            })
            .collect()
    };
    let delta_lines = lines(&|a| &a.delta);
    let low = delta_lines
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::min);
    line_panels(
        path,
        "The SNR dose: SNR² / (1 + k)",
        &[
            LinePanel {
                title: "memorisation at η 0.2".into(),
                x_label: "log₁₀(1 + k)".into(),
                y_label: "memorisation".into(),
                y_range: (0.0, 1.05),
                series: lines(&|a| &a.memorisation),
            },
            LinePanel {
                title: "Δ = test accuracy η 0.2 − η 0 (paired by seed)".into(),
                x_label: "log₁₀(1 + k)".into(),
                y_label: "Δ".into(),
                y_range: (low * 1.1 - 0.01, 0.05),
                series: delta_lines,
            },
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exact_null_matches_a_small_enumeration_by_hand() {
        // Two groups of two: 6 assignments of {1, 2, 3, 4}; the statistic (half-units) is twice
        // the Mann–Whitney count. Observed [1, 2] < [3, 4]: the largest (8), reached by 1 of 6.
        let groups = vec![vec![1.0, 2.0], vec![3.0, 4.0]];
        assert_eq!(jt_statistic(&groups), 8);
        assert!((jt_exact_tail(&groups, true) - 1.0 / 6.0).abs() < 1e-12);
        assert!((jt_exact_tail(&groups, false) - 1.0).abs() < 1e-12);
        assert_eq!(jt_null_mean(&groups), 4.0);
        // All tied: every assignment gives the mean, each tail is 1.
        let tied = vec![vec![1.0, 1.0], vec![1.0, 1.0]];
        assert_eq!(jt_statistic(&tied), 4);
        assert_eq!(jt_exact_tail(&tied, true), 1.0);
    }

    #[test]
    fn a_perfect_trend_over_five_doses_is_the_rarest_assignment() {
        let groups: Groups = (0..5)
            .map(|g| (0..3).map(|s| (3 * g + s) as f64).collect())
            .collect();
        // 1 of 15!/(3!)⁵ assignments orders every group above the last; within-group orders
        // do not count.
        let p = jt_exact_tail(&groups, true);
        assert!((p - 1.0 / 168_168_000.0).abs() < 1e-15, "{p}");
        let reversed: Groups = groups.iter().rev().cloned().collect();
        assert!(TrendNull::of(&reversed).unwrap().test(true).wrong_signed);
    }

    #[test]
    fn the_pooled_null_is_the_convolution_of_the_strata() {
        // Two strata of two groups of two: each stratum's statistic is uniform-ish on 6
        // assignments; the pooled tail at the largest sum is (1/6)², and a stratum of ties adds
        // a constant, leaving the other's test unchanged.
        let top = vec![vec![1.0, 2.0], vec![3.0, 4.0]];
        let a = TrendNull::of(&top).unwrap();
        let b = TrendNull::of(&top).unwrap();
        let p = TrendNull::pooled(&[&a, &b], true).unwrap().p;
        assert!((p - 1.0 / 36.0).abs() < 1e-12, "{p}");
        let tied = TrendNull::of(&vec![vec![1.0, 1.0], vec![1.0, 1.0]]).unwrap();
        let alone = a.test(true).p;
        let with_ties = TrendNull::pooled(&[&a, &tied], true).unwrap().p;
        assert!((alone - with_ties).abs() < 1e-12, "{alone} vs {with_ties}");
        // Against a brute-force enumeration of both strata's assignments.
        let mixed = vec![vec![0.3, 0.1], vec![0.2, 0.5]];
        let c = TrendNull::of(&mixed).unwrap();
        let total: u64 = c.counts.iter().sum();
        let mut by_hand = 0.0;
        for (i, x) in a.counts.iter().enumerate() {
            for (j, y) in c.counts.iter().enumerate() {
                if i + j >= a.observed + c.observed {
                    by_hand += (*x as f64 / 6.0) * (*y as f64 / total as f64);
                }
            }
        }
        let pooled = TrendNull::pooled(&[&a, &c], true).unwrap().p;
        assert!((pooled - by_hand).abs() < 1e-12);
    }

    #[test]
    fn the_crossing_is_interpolated_in_log_dose() {
        let doses = [0.0, 1.0, 3.0];
        // 0.4 at 1 + k = 2, 0.6 at 4: the midpoint in log, 1 + k = √8.
        let k = crossing(&doses, &[0.1, 0.4, 0.6]).unwrap();
        assert!((k - 8f64.sqrt()).abs() < 1e-12);
        assert_eq!(crossing(&doses, &[0.1, 0.2, 0.3]), None);
        assert_eq!(crossing(&doses, &[0.7, 0.8, 0.9]), Some(1.0));
    }

    #[test]
    fn the_answer_follows_the_rule() {
        assert_eq!(answer(5, 4, 0, 0), "Yes");
        assert_eq!(answer(6, 3, 0, 0), "Undecided");
        assert_eq!(answer(5, 4, 3, 0), "No");
        assert_eq!(answer(0, 0, 0, 4), "No");
        assert_eq!(answer(4, 6, 2, 0), "Undecided");
    }
}
