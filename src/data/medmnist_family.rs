//! The MedMNIST 2D family as the official release describes it (`datasets/medmnist.toml`, written
//! from the `medmnist` package's INFO by scripts/medmnist_catalog.py): twelve tasks, each at 28 px
//! (MedMNIST v2) and at MedMNIST+'s 64, 128 and 224 px, with their URLs, md5s, class names and
//! split sizes. A dataset name is a task's (`dermamnist`) or a task's with a size
//! (`dermamnist_224`): the release's own file name, `medmnist/<name>.npz` under the data root.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

use super::manifest::{Manifest, ManifestFile};

/// MedMNIST+'s sizes besides the original 28 px.
pub const SIZES: [usize; 4] = [28, 64, 128, 224];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Family {
    task: Vec<Task>,
}

/// One 2D task of the release.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    pub name: String,
    pub title: String,
    /// MedMNIST's task type: "multi-class", "binary-class", "ordinal-regression" (RetinaMNIST's
    /// five grades, trained as five classes, as MedMNIST's benchmarks do) or
    /// "multi-label, binary-class" (ChestMNIST, refused).
    pub task: String,
    pub channels: usize,
    pub classes: Vec<String>,
    pub samples: BTreeMap<String, usize>,
    size: Vec<ReleaseSize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseSize {
    pixels: usize,
    url: String,
    md5: String,
}

/// A task at one size: one file of the release.
pub struct Release {
    pub task: &'static Task,
    pub pixels: usize,
}

fn family() -> &'static Family {
    static FAMILY: OnceLock<Family> = OnceLock::new();
    FAMILY.get_or_init(|| {
        toml::from_str(include_str!("../../datasets/medmnist.toml"))
            .unwrap_or_else(|e| panic!("datasets/medmnist.toml is invalid: {e}"))
    })
}

/// Every task's name, in the release's order.
pub fn task_names() -> Vec<&'static str> {
    family().task.iter().map(|t| t.name.as_str()).collect()
}

/// The release file a dataset name stands for: `task` (28 px) or `task_64`, `task_128`,
/// `task_224`. An unknown task, an unknown size or a multi-label task is an error that says why.
pub fn release(name: &str) -> Result<Release, String> {
    let (task_name, pixels) = match name.rsplit_once('_') {
        Some((task, size)) if size.chars().all(|c| c.is_ascii_digit()) => {
            let pixels: usize = size.parse().map_err(|_| format!("{name}: bad size"))?;
            if pixels == 28 || !SIZES.contains(&pixels) {
                return Err(format!(
                    "{name}: MedMNIST+ has the sizes 64, 128 and 224 (28 px is the task's own \
                     name, {task})"
                ));
            }
            (task, pixels)
        }
        _ => (name, 28),
    };
    let task = family()
        .task
        .iter()
        .find(|t| t.name == task_name)
        .ok_or_else(|| {
            format!(
                "{name}: not a MedMNIST 2D task; expected one of {}, or one with _64, _128 or \
                 _224 for MedMNIST+'s sizes",
                task_names().join(", ")
            )
        })?;
    if task.task.starts_with("multi-label") {
        return Err(format!(
            "{name}: {} is multi-label ({} binary findings per image, any number of them at \
             once); the token-selection model and its cross-entropy take one class per image",
            task.title,
            task.classes.len()
        ));
    }
    Ok(Release { task, pixels })
}

impl Release {
    /// The release's file name, as the official release names it.
    pub fn file_name(&self) -> String {
        match self.pixels {
            28 => format!("{}.npz", self.task.name),
            pixels => format!("{}_{pixels}.npz", self.task.name),
        }
    }

    /// The file's manifest: where it downloads from, its md5, its classes and split sizes.
    pub fn manifest(&self) -> Manifest {
        let size = self
            .task
            .size
            .iter()
            .find(|s| s.pixels == self.pixels)
            .expect("every task lists every size");
        let name = self.file_name().trim_end_matches(".npz").to_string();
        Manifest {
            title: format!(
                "{} at {} px (MedMNIST{}, {} classes)",
                self.task.title,
                self.pixels,
                if self.pixels == 28 { " v2" } else { "+" },
                self.task.classes.len()
            ),
            name,
            folder: "medmnist".into(),
            homepage: "https://medmnist.com/".into(),
            classes: self.task.classes.clone(),
            expected: self.task.samples.clone(),
            archive: None,
            files: vec![ManifestFile {
                path: self.file_name(),
                urls: vec![size.url.clone()],
                md5: Some(size.md5.clone()),
                sha256: None,
                bytes: None,
                derived: false,
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_family_has_its_twelve_tasks_at_four_sizes() {
        assert_eq!(task_names().len(), 12);
        for task in &family().task {
            let sizes: Vec<usize> = task.size.iter().map(|s| s.pixels).collect();
            assert_eq!(sizes, SIZES, "{}", task.name);
            assert!(task.classes.len() >= 2 && (task.channels == 1 || task.channels == 3));
        }
        let derma = release("dermamnist_224").unwrap();
        assert_eq!(derma.file_name(), "dermamnist_224.npz");
        assert_eq!(derma.manifest().classes.len(), 7);
        assert_eq!(derma.manifest().expected["train"], 7007);
        // The same md5 as the hand-written manifest of the paper's PneumoniaMNIST.
        let pneumonia = release("pneumoniamnist").unwrap().manifest();
        assert_eq!(
            pneumonia.files[0].md5.as_deref(),
            Some("28209eda62fecd6e6a2d98b1501bb15f")
        );
    }

    #[test]
    fn unknown_tasks_sizes_and_multi_label_tasks_are_refused_with_why() {
        let chest = release("chestmnist_64").err().unwrap();
        assert!(chest.contains("multi-label"), "{chest}");
        let size = release("dermamnist_32").err().unwrap();
        assert!(size.contains("64, 128 and 224"), "{size}");
        let task = release("fashionmnist").err().unwrap();
        assert!(task.contains("pathmnist"), "{task}");
        assert!(release("dermamnist_28").is_err());
    }
}
