//! The authors' printed numbers (configs/paper/*.toml, compiled in), for the report to set beside
//! ours: Table 2 (docs/protocol.md §4.1) and the Fig. 9 end values (§4.3).

use anyhow::{Context, Result};
use serde::Deserialize;

/// A printed "mean ± std".
pub type Printed = [f64; 2];

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table2Cell {
    pub eta: f64,
    pub n: usize,
    pub train_loss: Printed,
    /// Percent.
    pub test_acc: Printed,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table2Dataset {
    pub name: String,
    /// Phase-1 test accuracy, percent.
    pub baseline: Printed,
    pub cells: Vec<Table2Cell>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table2 {
    pub dataset: Vec<Table2Dataset>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fig9Dataset {
    pub name: String,
    pub start: f64,
    pub end: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fig9 {
    pub uniform_vit: f64,
    pub dataset: Vec<Fig9Dataset>,
}

pub fn table2() -> Result<Table2> {
    toml::from_str(include_str!("../../configs/paper/table2.toml"))
        .context("configs/paper/table2.toml")
}

pub fn fig9() -> Result<Fig9> {
    toml::from_str(include_str!("../../configs/paper/fig9.toml")).context("configs/paper/fig9.toml")
}

impl Table2 {
    pub fn dataset(&self, name: &str) -> Option<&Table2Dataset> {
        self.dataset.iter().find(|d| d.name == name)
    }

    pub fn cell(&self, dataset: &str, eta: f64, n: usize) -> Option<&Table2Cell> {
        self.dataset(dataset)?
            .cells
            .iter()
            .find(|c| c.n == n && (c.eta - eta).abs() < 1e-9)
    }
}

impl Fig9 {
    pub fn end(&self, dataset: &str) -> Option<f64> {
        self.dataset
            .iter()
            .find(|d| d.name == dataset)
            .map(|d| d.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_numbers_parse_and_cover_the_six_datasets() {
        let t = table2().unwrap();
        for name in [
            "mnist",
            "cifar10",
            "pneumoniamnist",
            "breastmnist",
            "ag_news",
            "trec",
        ] {
            assert!(t.dataset(name).is_some(), "{name}");
            assert!(fig9().unwrap().end(name).is_some(), "{name}");
        }
        assert_eq!(t.cell("cifar10", 0.2, 200).unwrap().test_acc, [94.3, 0.3]);
        assert!(t.cell("breastmnist", 0.2, 1000).is_none());
        assert_eq!(t.dataset("trec").unwrap().baseline, [82.87, 1.06]);
    }
}
