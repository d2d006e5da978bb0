//! `folder:PATH`: images, one sub-folder per class (`PATH/cat/*.png`), or `PATH/train/<class>/`
//! and `PATH/test/<class>/`. Any file the `image` crate decodes (PNG, JPEG, BMP, GIF, TIFF,
//! WebP); names starting with `.` are skipped, anything else that does not decode is refused.
//!
//! Documented order: classes as [`super::classes`] orders their folder names; samples class by
//! class, each class's files in byte order of their names. Images stay 8-bit; a folder whose
//! images are all grayscale stays one channel, any colour image makes every image RGB (alpha
//! dropped), decoded under a memory budget ([`super::images`]: its rule for sizes).

use std::path::{Path, PathBuf};

use super::classes::{self, Label};
use super::images::{EncodedImage, decode_set};
use super::pool::Loaded;
use super::pool::Splits;
use crate::data::files::{DataError, Result};
use crate::data::samples::{Inputs, Split};

pub use super::images::COMMON_SIZE;

/// Every file a folder source reads (train's, then test's, or the pool's), in the documented order.
pub fn files(root: &Path) -> Result<Vec<PathBuf>> {
    Ok(layout(root)?
        .into_iter()
        .flat_map(|(_, classes)| classes.into_iter().flat_map(|(_, files)| files))
        .collect())
}

/// The class folders of each part (`train`, `test`, or the pool `""`) and their image files.
type ClassFolders = (&'static str, Vec<(String, Vec<PathBuf>)>);

fn layout(root: &Path) -> Result<Vec<ClassFolders>> {
    if !root.is_dir() {
        return Err(DataError::format(
            root,
            "no such folder (folder: expects one sub-folder of images per class)",
        ));
    }
    let (train, test) = (root.join("train"), root.join("test"));
    match (train.is_dir(), test.is_dir()) {
        (true, true) => {
            // Anything else beside train/ and test/ (a val/ folder, a stray file) would be
            // ignored without a word, as the pool layout refuses it: refused here too.
            if let Some((name, path)) = visible_entries(root)?
                .into_iter()
                .find(|(name, _)| name != "train" && name != "test")
            {
                return Err(DataError::format(
                    &path,
                    format!(
                        "{} beside train/ and test/: a split folder dataset holds those two only (move {} out, or merge it into one of them)",
                        if path.is_dir() { "a folder" } else { "a file" },
                        crate::excerpt::quote(&name)
                    ),
                ));
            }
            Ok(vec![
                ("train", class_folders(&train)?),
                ("test", class_folders(&test)?),
            ])
        }
        (true, false) | (false, true) => Err(DataError::format(
            root,
            "holds one of train/ and test/ without the other: give both, or one sub-folder per class",
        )),
        (false, false) => Ok(vec![("", class_folders(root)?)]),
    }
}

/// The sub-folders of `dir` (the classes) and the image files of each, in the documented order.
fn class_folders(dir: &Path) -> Result<Vec<(String, Vec<PathBuf>)>> {
    let mut classes = Vec::new();
    for (name, path) in visible_entries(dir)? {
        if !path.is_dir() {
            return Err(DataError::format(
                &path,
                "a file beside the class folders: every entry of a folder dataset is one class's sub-folder",
            ));
        }
        let files = class_files(&path)?;
        if files.is_empty() {
            return Err(DataError::format(&path, "an empty class folder"));
        }
        classes.push((name, files));
    }
    if classes.is_empty() {
        return Err(DataError::format(
            dir,
            "no class sub-folders (expected one sub-folder of images per class)",
        ));
    }
    let names: Vec<(Label, String)> = classes
        .iter()
        .map(|(name, _)| (Label::of_text(name), format!("folder {name:?}")))
        .collect();
    let (order, _) = classes::assign(&names)
        .map_err(|why| DataError::format(dir, format!("class folder names: {why}")))?;
    classes.sort_by_key(|(name, _)| order.iter().position(|o| o == name));
    Ok(classes)
}

fn class_files(dir: &Path) -> Result<Vec<PathBuf>> {
    visible_entries(dir)?
        .into_iter()
        .map(|(_, path)| {
            if path.is_dir() {
                Err(DataError::format(
                    &path,
                    "a folder inside a class folder: a class folder holds image files only",
                ))
            } else {
                Ok(path)
            }
        })
        .collect()
}

/// The entries of `dir` whose names do not start with `.`, sorted by name (bytes); names must be
/// UTF-8 (they become class names and are shown in errors).
fn visible_entries(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| DataError::io(dir, e))? {
        let entry = entry.map_err(|e| DataError::io(dir, e))?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            return Err(DataError::format(&path, "a name that is not UTF-8"));
        };
        if !name.starts_with('.') {
            entries.push((name, path));
        }
    }
    entries.sort_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
    Ok(entries)
}

/// The folder's images and classes.
pub fn load(root: &Path) -> Result<Loaded> {
    let parts = layout(root)?;
    let class_names: Vec<String> = parts[0].1.iter().map(|(name, _)| name.clone()).collect();
    if let Some((_, test)) = parts.get(1)
        && let Some((stray, _)) = test.iter().find(|(name, _)| !class_names.contains(name))
    {
        return Err(DataError::format(
            &root.join("test").join(stray),
            format!(
                "a test class with no train/ folder of its own (train/ has {})",
                crate::excerpt::list(&class_names)
            ),
        ));
    }
    let mut samples = Vec::new();
    for (part, classes) in &parts {
        for (name, files) in classes {
            let class = class_names.iter().position(|c| c == name).ok_or_else(|| {
                DataError::format(
                    root,
                    format!("class folder {name:?} is not one of train/'s"),
                )
            })? as u32;
            samples.extend(files.iter().map(|f| (*part, class, f.clone())));
        }
    }
    let sources: Vec<EncodedImage> = samples
        .iter()
        .map(|(_, _, path)| EncodedImage::File(path.clone()))
        .collect();
    let (images, warnings) = decode_set(&sources, root)?;
    let split_of = |part: &str| -> Split {
        let indices: Vec<usize> = (0..samples.len())
            .filter(|&k| samples[k].0 == part)
            .collect();
        let labels = indices.iter().map(|&k| samples[k].1).collect();
        Split::complete(Inputs::Images(images.subset(&indices)), labels)
    };
    let splits = match parts.len() {
        1 => Splits::Pool(split_of("")),
        _ => Splits::Given {
            train: split_of("train"),
            test: split_of("test"),
        },
    };
    Ok(Loaded {
        class_names,
        splits,
        warnings,
    })
}
