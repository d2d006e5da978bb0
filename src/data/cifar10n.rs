//! CIFAR-10N (Wei et al., ICLR 2022): real human re-annotations of the 50000 CIFAR-10 training
//! images, in the release's train order (data_batch_1..5). Read from `CIFAR-10_human.npz`, the
//! arrays of the released `CIFAR-10_human.pt` (a pickled dict of numpy arrays) saved with
//! `numpy.savez`.

use std::path::Path;
use std::str::FromStr;

use super::files::{DataError, Result};

use super::npz::read_array;

pub const TRAIN_IMAGES: usize = 50_000;
pub const FILE_NAME: &str = "CIFAR-10_human.npz";

/// Which annotation replaces the label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HumanLabels {
    /// Majority vote of three annotators (9.0 % disagreement with the clean label).
    Aggre,
    Random1,
    Random2,
    Random3,
    /// A wrong annotation whenever one of the three is wrong (40.2 %).
    Worse,
}

impl HumanLabels {
    pub const ALL: [HumanLabels; 5] = [
        HumanLabels::Aggre,
        HumanLabels::Random1,
        HumanLabels::Random2,
        HumanLabels::Random3,
        HumanLabels::Worse,
    ];

    pub fn name(self) -> &'static str {
        match self {
            HumanLabels::Aggre => "aggre",
            HumanLabels::Random1 => "random1",
            HumanLabels::Random2 => "random2",
            HumanLabels::Random3 => "random3",
            HumanLabels::Worse => "worse",
        }
    }

    /// The array holding this annotation in the release.
    fn array(self) -> &'static str {
        match self {
            HumanLabels::Aggre => "aggre_label",
            HumanLabels::Random1 => "random_label1",
            HumanLabels::Random2 => "random_label2",
            HumanLabels::Random3 => "random_label3",
            HumanLabels::Worse => "worse_label",
        }
    }
}

impl FromStr for HumanLabels {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        HumanLabels::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown CIFAR-10N annotation {s:?}, expected aggre, random1, random2, random3 or worse"))
    }
}

/// One annotation of every training image plus the clean label, indexed by release position.
#[derive(Clone, Debug)]
pub struct Annotations {
    pub kind: HumanLabels,
    pub clean: Vec<u32>,
    pub human: Vec<u32>,
}

pub fn load(path: &Path, kind: HumanLabels) -> Result<Annotations> {
    let read = |name: &str| -> Result<Vec<u32>> {
        let (shape, values) = read_array::<i64>(path, name)?;
        if shape != [TRAIN_IMAGES] {
            return Err(DataError::format(
                path,
                format!("array {name} has shape {shape:?}, expected [{TRAIN_IMAGES}]"),
            ));
        }
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                u32::try_from(v).ok().filter(|&v| v < 10).ok_or_else(|| {
                    DataError::format(
                        path,
                        format!("array {name}[{i}] = {v}, expected a class 0..9"),
                    )
                })
            })
            .collect()
    };
    Ok(Annotations {
        kind,
        clean: read("clean_label")?,
        human: read(kind.array())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::npz::tests::{array, write_npz};

    #[test]
    fn names_round_trip_and_unknown_kinds_are_refused() {
        for kind in HumanLabels::ALL {
            assert_eq!(kind.name().parse::<HumanLabels>().unwrap(), kind);
        }
        assert!("best".parse::<HumanLabels>().unwrap_err().contains("aggre"));
    }

    #[test]
    fn short_arrays_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        write_npz(
            &path,
            &[
                ("clean_label", array::<i64>(&[3], &[0, 1, 2])),
                ("aggre_label", array::<i64>(&[3], &[0, 1, 2])),
            ],
        );
        let err = load(&path, HumanLabels::Aggre).unwrap_err().to_string();
        assert!(
            err.contains(FILE_NAME) && err.contains("expected [50000]"),
            "{err}"
        );
    }
}
