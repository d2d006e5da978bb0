//! A source without a test split of its own is one pool, split here the same way for every run:
//! within each class, in the source's documented sample order, every fifth sample (the 5th, 10th,
//! …) is the test split and the rest the training split. The rule needs no seed, so every seed
//! and every η of a grid sees the same test set, as with a released split; the seeded draw of the
//! phase-1 and phase-2 samples then happens inside the training split, as for any dataset.

use super::super::Split;

/// One sample in this many of each class is held out for the test split.
pub const HOLD_OUT_EVERY: usize = 5;

/// Said in a run's deviations when a pool was split.
pub const HOLD_OUT_NOTE: &str = "one pool of samples: within each class, every fifth sample in the source's order is the test split, the rest the training split (docs/data.md)";

/// A source's samples as its files give them.
pub enum Splits {
    /// `train/` and `test/` folders, or train and test files.
    Given { train: Split, test: Split },
    /// One pool, to be split by [`hold_out`].
    Pool(Split),
}

impl Splits {
    /// The splits a loader read, in file order: one is a pool, two are the training and test
    /// splits.
    pub fn of(mut parts: Vec<Split>) -> Splits {
        match parts.len() {
            1 => Splits::Pool(parts.remove(0)),
            _ => {
                let test = parts.pop().expect("two splits");
                let train = parts.pop().expect("two splits");
                Splits::Given { train, test }
            }
        }
    }
}

/// The training and test splits of `pool`, each in the pool's order; each split's own positions
/// are its release indices (the documented order is the release's).
pub fn hold_out(pool: &Split, num_classes: usize) -> (Split, Split) {
    let mut seen = vec![0usize; num_classes];
    let (mut train, mut test) = (Vec::new(), Vec::new());
    for (k, &label) in pool.labels.iter().enumerate() {
        let rank = &mut seen[label as usize];
        *rank += 1;
        if rank.is_multiple_of(HOLD_OUT_EVERY) {
            test.push(k);
        } else {
            train.push(k);
        }
    }
    let renumbered = |indices: &[usize]| {
        let subset = pool.subset(indices);
        Split::complete(subset.inputs, subset.labels)
    };
    (renumbered(&train), renumbered(&test))
}

/// What a loader read: the classes in order and the samples, split or as one pool.
pub struct Loaded {
    pub class_names: Vec<String>,
    pub splits: Splits,
    pub warnings: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::samples::Inputs;

    #[test]
    fn every_fifth_of_each_class_is_held_out() {
        let labels: Vec<u32> = (0..23).map(|k| u32::from(k % 3 == 0)).collect();
        let texts = (0..23).map(|k| k.to_string()).collect();
        let pool = Split::complete(Inputs::Texts(texts), labels);
        let (train, test) = hold_out(&pool, 2);
        assert_eq!(train.len() + test.len(), 23);
        let Inputs::Texts(held) = &test.inputs else {
            unreachable!()
        };
        // Class 1 is 0, 3, 6, …, 21 (8 samples): its fifth is 12. Class 0 is the other 15:
        // its fifth, tenth and fifteenth are 7, 14, 22.
        assert_eq!(held, &["7", "12", "14", "22"]);
        assert_eq!(test.release_index, [0, 1, 2, 3]);
        assert_eq!(train.release_index, (0..19).collect::<Vec<_>>());
    }
}
