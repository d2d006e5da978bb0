//! The paper's split (docs/protocol.md §3): a seeded choice without replacement of pretrain_n + n indices
//! of the training split, pretrain_n for the clean phase-1 set and n for the noisy phase-2 set,
//! taken as the tail and the head of one seeded permutation (so that a grid over n reuses the
//! encoded samples). The test set is the official test split, optionally subsampled (the same
//! subsample for every seed).
//!
//! When a dataset's training split is absent (AG-news offline), `carve_train_from_test` splits the
//! test split into disjoint training and test pools instead, and says so in `deviations`.
//!
//! With `--rng authors` the split is the authors' own draw (docs/protocol.md §3.1): numpy
//! `default_rng(seed).choice(N, pretrain_n + n, replace=False)` over the N rows of the official
//! training split, pretrain = the first pretrain_n draws, fine-tune = the next n, in draw order.
//! Its indices are release indices: a partial local copy is refused unless it holds every drawn
//! row. The test subsample and the carve stay ours.

use rand::seq::SliceRandom;
use rand::seq::index::sample;
use serde::Serialize;

use super::catalog;
use super::catalog::Dataset;
use super::files::{DataError, Result};
use super::name::DatasetName;
use super::samples::Split;
use crate::rng::{RngChoice, Stream, numpy, stream};

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
    /// Whose draw picks the pretrain and fine-tune samples (the carve and the test subsample are
    /// always ours).
    pub rng: RngChoice,
}

/// A dataset's split, e.g. the one the pretrain and fine-tune indices point into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitName {
    Train,
    /// The test split; as a training source, carved out of it and disjoint from the test indices.
    Test,
}

impl SplitName {
    /// The name the feature cache files the split under.
    pub fn name(self) -> &'static str {
        match self {
            Self::Train => "train",
            Self::Test => "test",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Partition {
    pub train_source: SplitName,
    /// Indices into the training source, phase 1 (with `--rng authors`, in draw order).
    pub pretrain: Vec<usize>,
    /// Indices into the training source, phase 2 (with `--rng authors`, in draw order).
    pub finetune: Vec<usize>,
    /// Indices into the test split.
    pub test: Vec<usize>,
    /// How this split departs from the paper's protocol, one sentence each.
    pub deviations: Vec<String>,
}

/// Seed of the `--test-n` subsample: fixed, so that every seed is scored on the same samples.
pub const TEST_SUBSAMPLE_SEED: u64 = 0;

/// The pretrain, fine-tune and test samples of `plan`: the pools, the sizes checked, then the
/// training sets drawn and the test set (sub)sampled. Errors name the flag.
pub fn partition(dataset: &Dataset, plan: &SplitPlan) -> Result<Partition> {
    let unavailable = |problem: String| DataError::Unavailable {
        dataset: dataset.name.to_string(),
        problem,
    };
    let mut deviations = Vec::new();
    let (train_source, train_pool, test_pool) =
        pools(dataset, plan, &mut deviations).map_err(unavailable)?;
    check_sizes(plan, test_pool.len()).map_err(unavailable)?;
    let (pretrain, finetune) =
        training_sets(dataset, plan, train_source, train_pool, &mut deviations)
            .map_err(unavailable)?;
    let test = test_set(plan, test_pool, &mut deviations).map_err(unavailable)?;
    Ok(Partition {
        train_source,
        pretrain,
        finetune,
        test,
        deviations,
    })
}

/// Where the training samples come from, the training pool and the test pool: the official
/// splits, or with --carve-train-from-test both pools carved from the test split.
fn pools(
    dataset: &Dataset,
    plan: &SplitPlan,
    deviations: &mut Vec<String>,
) -> std::result::Result<(SplitName, Vec<usize>, Vec<usize>), String> {
    let test_len = dataset.test.len();
    match (plan.carve_train_from_test, &dataset.train) {
        (Some(fraction), _) => {
            if !(fraction > 0.0 && fraction < 1.0) {
                return Err(format!(
                    "--carve-train-from-test must be in (0, 1), got {fraction}"
                ));
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
            Ok((SplitName::Test, order, test_pool))
        }
        (None, Some(train)) => Ok((
            SplitName::Train,
            (0..train.len()).collect(),
            (0..test_len).collect(),
        )),
        (None, None) => {
            let authors = match plan.rng {
                RngChoice::Own => String::new(),
                RngChoice::Authors => format!(
                    "--rng authors: all {} training rows the authors' split draws are missing: ",
                    plan.pretrain_n.saturating_add(plan.n)
                ),
            };
            Err(format!(
                "{authors}the training split is absent from the data folder; add the official training file, \
                 or pass --carve-train-from-test F to split the test file into disjoint train and test pools \
                 (recorded as a deviation)"
            ))
        }
    }
}

/// Phase 1 trains on the pretrain set, phase 2 on the fine-tune set, and both are scored on the
/// test set: none of them may be empty.
fn check_sizes(plan: &SplitPlan, test_pool: usize) -> std::result::Result<(), String> {
    for (flag, value) in [
        ("--pretrain-n", plan.pretrain_n),
        ("--n", plan.n),
        ("--test-n", plan.test_n.unwrap_or(1)),
    ] {
        if value == 0 {
            return Err(format!("{flag} must be at least 1, got 0"));
        }
    }
    if test_pool == 0 {
        return Err("the test pool holds no samples".into());
    }
    Ok(())
}

/// The pretrain and fine-tune sets, drawn from the training pool by our stream or the authors'.
fn training_sets(
    dataset: &Dataset,
    plan: &SplitPlan,
    train_source: SplitName,
    train_pool: Vec<usize>,
    deviations: &mut Vec<String>,
) -> std::result::Result<(Vec<usize>, Vec<usize>), String> {
    let wanted = plan.pretrain_n.checked_add(plan.n).ok_or_else(|| {
        format!(
            "--pretrain-n {} and --n {} add up past any number of samples",
            plan.pretrain_n, plan.n
        )
    })?;
    let exceeds = |pool: usize| {
        format!(
            "pretrain_n + n = {} + {} = {wanted} exceeds the {pool} samples of the training pool",
            plan.pretrain_n, plan.n
        )
    };
    match (plan.rng, &dataset.train, train_source) {
        (RngChoice::Own, _, _) => {
            if wanted > train_pool.len() {
                return Err(exceeds(train_pool.len()));
            }
            // One seeded permutation of the pool: the fine-tune set is its head and the pretrain
            // set its tail. So for one seed the fine-tune sets are nested across n
            // (20 ⊂ 200 ⊂ 1000) and the pretrain set does not depend on n: a grid over n encodes
            // each sample once.
            let mut order = train_pool;
            order.shuffle(&mut stream(plan.seed, Stream::Split));
            let finetune = order[..plan.n].to_vec();
            let pretrain = order[order.len() - plan.pretrain_n..].to_vec();
            Ok((pretrain, finetune))
        }
        (RngChoice::Authors, Some(train), SplitName::Train) => {
            let drawn = authors_rows(dataset, train, plan, deviations)
                .map_err(|problem| format!("--rng authors: {problem}"))?;
            Ok((
                drawn[..plan.pretrain_n].to_vec(),
                drawn[plan.pretrain_n..].to_vec(),
            ))
        }
        (RngChoice::Authors, _, _) => {
            if wanted > train_pool.len() {
                return Err(exceeds(train_pool.len()));
            }
            let drawn = numpy::choice(plan.seed, train_pool.len(), wanted)
                .map_err(|e| format!("--rng authors: {e}"))?;
            deviations.push(
                "--rng authors with --carve-train-from-test: the training pool is carved from the \
                 test split with this crate's own stream and the authors' numpy draw picks from that \
                 pool, so the pretrain and fine-tune samples are not the authors' rows"
                    .into(),
            );
            let rows: Vec<usize> = drawn.iter().map(|&k| train_pool[k]).collect();
            Ok((
                rows[..plan.pretrain_n].to_vec(),
                rows[plan.pretrain_n..].to_vec(),
            ))
        }
    }
}

/// The test set: the whole test pool, or a --test-n subsample that is the same whatever the
/// seed, as the full test set would be.
fn test_set(
    plan: &SplitPlan,
    test_pool: Vec<usize>,
    deviations: &mut Vec<String>,
) -> std::result::Result<Vec<usize>, String> {
    if plan.rng == RngChoice::Authors && plan.test_n.is_some() {
        deviations.push(
            "--rng authors with --test-n: the test subsample is drawn with this crate's own stream \
             (the authors score the whole test split)"
                .into(),
        );
    }
    match plan.test_n {
        Some(m) if m > test_pool.len() => Err(format!(
            "--test-n {m} exceeds the {} samples of the test pool",
            test_pool.len()
        )),
        Some(m) => {
            let mut picked: Vec<usize> = sample(
                &mut stream(TEST_SUBSAMPLE_SEED, Stream::TestSubsample),
                test_pool.len(),
                m,
            )
            .into_iter()
            .map(|k| test_pool[k])
            .collect();
            picked.sort_unstable();
            Ok(picked)
        }
        None => Ok(test_pool),
    }
}

/// The authors' draw of pretrain_n + n rows of the official training split, as positions in the
/// local `train` (which must hold every drawn row), in draw order. Errors are the reason alone.
fn authors_rows(
    dataset: &Dataset,
    train: &Split,
    plan: &SplitPlan,
    deviations: &mut Vec<String>,
) -> std::result::Result<Vec<usize>, String> {
    let wanted = plan.pretrain_n.checked_add(plan.n).ok_or_else(|| {
        format!(
            "--pretrain-n {} and --n {} add up past any number of samples",
            plan.pretrain_n, plan.n
        )
    })?;
    if let Some(copy) = match dataset.name {
        DatasetName::Stl10 => Some("tanganke/stl10"),
        DatasetName::Sst2 => Some("nyu-mll/glue sst2"),
        _ => None,
    } {
        // The authors' draw picks row numbers of the hub copy they loaded; that its rows are in
        // the official files' order has not been checked against the copy itself here.
        return Err(format!(
            "{}: the authors drew row numbers of the hub copy {copy}, whose row order is not checked against the official files here; use --rng own",
            dataset.name
        ));
    }
    if plan.seed > u64::from(u32::MAX) {
        return Err(format!(
            "--seed {} is not below 2^32, the only seeds numpy's draw is replicated for",
            plan.seed
        ));
    }
    let official = catalog::official_train_size(dataset).map_err(|why| {
        format!("the {wanted} training rows the authors' split draws cannot be found: {why}")
    })?;
    if wanted > official {
        return Err(format!(
            "pretrain_n + n = {} + {} = {wanted} exceeds the {official} rows of the official training split",
            plan.pretrain_n, plan.n
        ));
    }
    let drawn = numpy::choice(plan.seed, official, wanted)?;
    let mut position = vec![None; official];
    for (p, &r) in train.release_index.iter().enumerate() {
        if let Some(slot) = position.get_mut(r) {
            *slot = Some(p);
        }
    }
    let rows: Vec<Option<usize>> = drawn.iter().map(|&r| position[r]).collect();
    let missing = rows.iter().filter(|p| p.is_none()).count();
    if missing > 0 {
        return Err(format!(
            "{missing} of the {wanted} training rows the authors' split draws are missing from the local \
             copy, which holds {} of the {official} rows of the official training split; add the complete \
             training split, or use --rng own",
            train.len()
        ));
    }
    if train.len() < official {
        deviations.push(format!(
            "--rng authors on a partial training split ({} of its {official} rows): all {wanted} rows \
             the authors' split draws are present, so the split is theirs",
            train.len()
        ));
    }
    Ok(rows.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DatasetName;
    use crate::data::samples::{Inputs, Split};

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
            rng: RngChoice::Own,
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

    /// A training split holding the official rows `release` (ag_news: 120000 official rows).
    fn partial(release: Vec<usize>) -> Dataset {
        let len = release.len();
        Dataset {
            train: Some(Split {
                inputs: Inputs::Texts(vec![String::new(); len]),
                labels: vec![0; len],
                release_index: release,
            }),
            ..toy(None, 100)
        }
    }

    fn authors(pretrain_n: usize, n: usize, seed: u64) -> SplitPlan {
        SplitPlan {
            seed,
            rng: RngChoice::Authors,
            ..plan(pretrain_n, n)
        }
    }

    #[test]
    fn authors_split_is_numpy_choice_in_draw_order_by_release_index() {
        let drawn = numpy::choice(3, 120_000, 30).unwrap();
        // The local copy holds the drawn rows and others, in another order.
        let mut release: Vec<usize> = drawn.iter().rev().copied().collect();
        release.extend([5, 6, 7].iter().filter(|r| !drawn.contains(r)));
        let data = partial(release.clone());
        let p = partition(&data, &authors(10, 20, 3)).unwrap();
        let to_release = |rows: &[usize]| rows.iter().map(|&k| release[k]).collect::<Vec<_>>();
        assert_eq!(to_release(&p.pretrain), drawn[..10]);
        assert_eq!(to_release(&p.finetune), drawn[10..]);
        assert_eq!(p.train_source, SplitName::Train);
        assert_eq!(p.deviations.len(), 1, "{:?}", p.deviations);
        assert!(
            p.deviations[0].contains("all 30 rows"),
            "{}",
            p.deviations[0]
        );
        // Our own split of the same data is another draw.
        assert_ne!(
            partition(&data, &plan(10, 20)).unwrap().finetune,
            p.finetune
        );
    }

    #[test]
    fn authors_split_refuses_partial_data_naming_the_missing_rows() {
        let drawn = numpy::choice(3, 120_000, 30).unwrap();
        let data = partial(drawn[3..].to_vec());
        let err = partition(&data, &authors(10, 20, 3))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("ag_news: --rng authors: 3 of the 30 training rows")
                && err.contains("27 of the 120000 rows"),
            "{err}"
        );
        let err = partition(&toy(None, 100), &authors(10, 20, 3))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("all 30 training rows the authors' split draws are missing")
                && err.contains("--carve-train-from-test"),
            "{err}"
        );
        let err = partition(&partial(drawn.clone()), &authors(10, 20, 1 << 32))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--seed 4294967296"), "{err}");
        let err = partition(&partial(drawn), &authors(100_000, 20_001, 3))
            .unwrap_err()
            .to_string();
        assert!(err.contains("exceeds the 120000 rows"), "{err}");
    }

    #[test]
    fn authors_split_refuses_files_that_are_not_the_release() {
        // A MedMNIST archive of another size (the mirror's PneumoniaMNIST has 3882 of 4708).
        let data = Dataset {
            name: DatasetName::PneumoniaMnist,
            ..toy(Some(3882), 100)
        };
        let err = partition(&data, &authors(3000, 200, 42))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the 3200 training rows the authors' split draws cannot be found")
                && err.contains("3882 training images, not the official 4708"),
            "{err}"
        );
        // A task of the MedMNIST family: its official size is the catalog's.
        let data = Dataset {
            name: DatasetName::OtherMedMnist("dermamnist".into()),
            ..toy(Some(100), 10)
        };
        let err = partition(&data, &authors(10, 10, 42))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("100 training images, not the official 7007"),
            "{err}"
        );
    }

    #[test]
    fn authors_split_with_a_carve_or_a_test_subsample_says_what_stays_ours() {
        let carved = partition(
            &toy(None, 1000),
            &SplitPlan {
                carve_train_from_test: Some(0.5),
                test_n: Some(100),
                ..authors(100, 20, 7)
            },
        )
        .unwrap();
        assert_eq!((carved.pretrain.len(), carved.finetune.len()), (100, 20));
        assert_eq!(carved.deviations.len(), 3, "{:?}", carved.deviations);
        assert!(carved.deviations[1].contains("--carve-train-from-test"));
        assert!(carved.deviations[2].contains("--test-n"));
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
        assert_eq!(carved.train_source, SplitName::Test);
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
