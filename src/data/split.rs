//! The paper's split (PAPER.md §3): a seeded choice without replacement of pretrain_n + n indices
//! of the training split, pretrain_n for the clean phase-1 set and n for the noisy phase-2 set,
//! taken as the tail and the head of one seeded permutation (so that a grid over n reuses the
//! encoded samples). The test set is the official test split, optionally subsampled (the same
//! subsample for every seed).
//!
//! When a dataset's training split is absent (AG-news offline), `carve_train_from_test` splits the
//! test split into disjoint training and test pools instead, and says so in `deviations`.

use rand::seq::SliceRandom;
use rand::seq::index::sample;
use serde::Serialize;

use super::Dataset;
use super::files::{DataError, Result};
use crate::rng::{Stream, stream};

#[derive(Clone, Debug, PartialEq)]
pub struct SplitPlan {
    pub pretrain_n: usize,
    /// Fine-tune (noisy phase) samples.
    pub n: usize,
    /// Subsample the test pool to this many samples.
    pub test_n: Option<usize>,
    pub seed: u64,
    /// Fraction of the test split that becomes the training pool.
    pub carve_train_from_test: Option<f64>,
}

/// Which split the pretrain and fine-tune indices point into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainSource {
    Train,
    /// Carved out of the test split; disjoint from the test indices.
    Test,
}

#[derive(Clone, Debug, Serialize)]
pub struct Partition {
    pub train_source: TrainSource,
    /// Indices into the training source, phase 1.
    pub pretrain: Vec<usize>,
    /// Indices into the training source, phase 2.
    pub finetune: Vec<usize>,
    /// Indices into the test split.
    pub test: Vec<usize>,
    /// How this split departs from the paper's protocol, one sentence each.
    pub deviations: Vec<String>,
}

/// Seed of the `--test-n` subsample: fixed, so that every seed is scored on the same samples.
pub const TEST_SUBSAMPLE_SEED: u64 = 0;

pub fn partition(dataset: &Dataset, plan: &SplitPlan) -> Result<Partition> {
    let name = dataset.name.to_string();
    let unavailable = |problem: String| DataError::Unavailable {
        dataset: name.clone(),
        problem,
    };
    let test_len = dataset.test.len();
    let mut deviations = Vec::new();

    let (train_source, train_pool, test_pool): (TrainSource, Vec<usize>, Vec<usize>) = match (
        plan.carve_train_from_test,
        &dataset.train,
    ) {
        (Some(fraction), _) => {
            if !(fraction > 0.0 && fraction < 1.0) {
                return Err(unavailable(format!(
                    "--carve-train-from-test must be in (0, 1), got {fraction}"
                )));
            }
            let mut order =
                sample(&mut stream(plan.seed, Stream::Carve), test_len, test_len).into_vec();
            let train_len = (fraction * test_len as f64).round() as usize;
            let test_pool = order.split_off(train_len);
            deviations.push(format!(
                    "training pool carved from the official test split: {train_len} of its {test_len} samples \
                     (fraction {fraction}, seed {}); the test set is drawn from the other {}",
                    plan.seed,
                    test_pool.len()
                ));
            (TrainSource::Test, order, test_pool)
        }
        (None, Some(train)) => (
            TrainSource::Train,
            (0..train.len()).collect(),
            (0..test_len).collect(),
        ),
        (None, None) => {
            return Err(unavailable(
                    "the training split is absent from the data folder; add the official training file, or pass \
                     --carve-train-from-test F to split the test file into disjoint train and test pools (recorded \
                     as a deviation)"
                        .into(),
                ));
        }
    };

    // Phase 1 trains on the pretrain set, phase 2 on the fine-tune set, and both are scored on
    // the test set: none of them may be empty.
    for (flag, value) in [
        ("--pretrain-n", plan.pretrain_n),
        ("--n", plan.n),
        ("--test-n", plan.test_n.unwrap_or(1)),
    ] {
        if value == 0 {
            return Err(unavailable(format!("{flag} must be at least 1, got 0")));
        }
    }
    if test_pool.is_empty() {
        return Err(unavailable("the test pool holds no samples".into()));
    }
    let wanted = plan.pretrain_n + plan.n;
    if wanted > train_pool.len() {
        return Err(unavailable(format!(
            "pretrain_n + n = {} + {} = {wanted} exceeds the {} samples of the training pool",
            plan.pretrain_n,
            plan.n,
            train_pool.len()
        )));
    }
    // One seeded permutation of the pool: the fine-tune set is its head and the pretrain set its
    // tail. So for one seed the fine-tune sets are nested across n (20 ⊂ 200 ⊂ 1000) and the
    // pretrain set does not depend on n: a grid over n encodes each sample once.
    let mut order = train_pool;
    order.shuffle(&mut stream(plan.seed, Stream::Split));
    let finetune = &order[..plan.n];
    let pretrain = &order[order.len() - plan.pretrain_n..];

    let test = match plan.test_n {
        Some(m) if m > test_pool.len() => {
            return Err(unavailable(format!(
                "--test-n {m} exceeds the {} samples of the test pool",
                test_pool.len()
            )));
        }
        Some(m) => {
            // The same subsample whatever the seed, as the full test set would be.
            let mut picked: Vec<usize> = sample(
                &mut stream(TEST_SUBSAMPLE_SEED, Stream::TestSubsample),
                test_pool.len(),
                m,
            )
            .into_iter()
            .map(|k| test_pool[k])
            .collect();
            picked.sort_unstable();
            picked
        }
        None => test_pool,
    };
    Ok(Partition {
        train_source,
        pretrain: pretrain.to_vec(),
        finetune: finetune.to_vec(),
        test,
        deviations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DatasetName, Inputs, Split};

    fn toy(train: Option<usize>, test: usize) -> Dataset {
        let split = |len: usize| Split {
            inputs: Inputs::Texts(vec![String::new(); len]),
            labels: (0..len as u32).map(|k| k % 4).collect(),
            release_index: (0..len).collect(),
        };
        Dataset {
            name: DatasetName::AgNews,
            class_names: vec!["a".into(), "b".into(), "c".into(), "d".into()],
            train: train.map(split),
            val: None,
            test: split(test),
            warnings: vec![],
        }
    }

    fn plan(pretrain_n: usize, n: usize) -> SplitPlan {
        SplitPlan {
            pretrain_n,
            n,
            test_n: None,
            seed: 42,
            carve_train_from_test: None,
        }
    }

    #[test]
    fn fine_tune_sets_nest_across_n_and_pretrain_does_not_move() {
        let data = toy(Some(1000), 100);
        let small = partition(&data, &plan(300, 20)).unwrap();
        let large = partition(&data, &plan(300, 200)).unwrap();
        assert_eq!(small.finetune[..], large.finetune[..20]);
        assert_eq!(small.pretrain, large.pretrain);
        let other_seed = partition(
            &data,
            &SplitPlan {
                seed: 7,
                ..plan(300, 20)
            },
        )
        .unwrap();
        assert_ne!(other_seed.finetune, small.finetune);
    }

    #[test]
    fn choice_is_seeded_without_replacement() {
        let data = toy(Some(1000), 100);
        let a = partition(&data, &plan(300, 200)).unwrap();
        assert_eq!(
            (a.pretrain.len(), a.finetune.len(), a.test.len()),
            (300, 200, 100)
        );
        let mut all: Vec<usize> = a.pretrain.iter().chain(&a.finetune).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 500, "indices repeat");
        assert!(a.deviations.is_empty());
        let b = partition(&data, &plan(300, 200)).unwrap();
        assert_eq!(
            (a.pretrain.clone(), a.finetune.clone()),
            (b.pretrain, b.finetune)
        );
        let c = partition(
            &data,
            &SplitPlan {
                seed: 7,
                ..plan(300, 200)
            },
        )
        .unwrap();
        assert_ne!(a.finetune, c.finetune);
        let err = partition(&data, &plan(900, 200)).unwrap_err().to_string();
        assert!(err.contains("1100 exceeds the 1000"), "{err}");
    }

    #[test]
    fn test_subsample_is_seeded_and_bounded() {
        let data = toy(Some(100), 1000);
        let p = partition(
            &data,
            &SplitPlan {
                test_n: Some(50),
                ..plan(10, 10)
            },
        )
        .unwrap();
        assert_eq!(p.test.len(), 50);
        assert!(p.test.windows(2).all(|w| w[0] < w[1]));
        let err = partition(
            &data,
            &SplitPlan {
                test_n: Some(5000),
                ..plan(10, 10)
            },
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("--test-n 5000"), "{err}");
    }

    #[test]
    fn empty_sets_are_refused_naming_the_flag() {
        let data = toy(Some(100), 10);
        for (plan, flag) in [
            (plan(0, 10), "--pretrain-n"),
            (plan(10, 0), "--n"),
            (
                SplitPlan {
                    test_n: Some(0),
                    ..plan(10, 10)
                },
                "--test-n",
            ),
        ] {
            let err = partition(&data, &plan).unwrap_err().to_string();
            assert!(err.contains(&format!("{flag} must be at least 1")), "{err}");
        }
        // A carve that leaves nothing to test on.
        let err = partition(
            &toy(None, 1),
            &SplitPlan {
                carve_train_from_test: Some(0.9),
                ..plan(0, 1)
            },
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("--pretrain-n"), "{err}");
        let err = partition(
            &toy(None, 2),
            &SplitPlan {
                carve_train_from_test: Some(0.9),
                ..plan(1, 1)
            },
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("the test pool holds no samples"), "{err}");
    }

    #[test]
    fn absent_training_split_needs_an_explicit_carve() {
        let data = toy(None, 7600);
        let err = partition(&data, &plan(100, 20)).unwrap_err().to_string();
        assert!(
            err.contains("ag_news") && err.contains("--carve-train-from-test"),
            "{err}"
        );
        let carved = partition(
            &data,
            &SplitPlan {
                carve_train_from_test: Some(0.5),
                ..plan(3000, 200)
            },
        )
        .unwrap();
        assert_eq!(carved.train_source, TrainSource::Test);
        assert_eq!(carved.test.len(), 3800);
        let train: std::collections::HashSet<_> =
            carved.pretrain.iter().chain(&carved.finetune).collect();
        assert!(
            carved.test.iter().all(|t| !train.contains(t)),
            "train and test pools overlap"
        );
        assert_eq!(carved.deviations.len(), 1);
        assert!(
            carved.deviations[0].contains("3800 of its 7600"),
            "{}",
            carved.deviations[0]
        );
        let err = partition(
            &data,
            &SplitPlan {
                carve_train_from_test: Some(1.5),
                ..plan(1, 1)
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("(0, 1)"));
    }
}
