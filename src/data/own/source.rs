//! A user's dataset spec (`KIND:LOCATION#key=value#…`): its kind, its keys, its id and string
//! form. What reading it gives is [`super::read`]'s.

use std::fmt;
use std::path::Path;

use crate::data::Modality;

/// What kind of files a source is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OwnKind {
    /// One sub-folder of images per class, or `train/` and `test/` holding such sub-folders.
    Folder,
    /// A CSV file with a header row, or a folder holding train.csv and test.csv.
    Csv,
    /// One JSON object per line, or a folder holding train.jsonl and test.jsonl.
    Jsonl,
    /// A Hugging Face dataset's Parquet files (`<config>/<split>/*.parquet`): a hub id, or a
    /// folder laid out as the hub's Parquet revision.
    Hf,
}

impl OwnKind {
    const ALL: [OwnKind; 4] = [OwnKind::Folder, OwnKind::Csv, OwnKind::Jsonl, OwnKind::Hf];

    pub fn prefix(self) -> &'static str {
        match self {
            OwnKind::Folder => "folder",
            OwnKind::Csv => "csv",
            OwnKind::Jsonl => "jsonl",
            OwnKind::Hf => "hf",
        }
    }
}

/// The column options a spec may carry (`#text=…#label=…`), as keys. Options are set apart by
/// `#`, not by commas, so that a spec stays one item of a comma-separated `--datasets` list.
pub(super) const TEXT_KEY: &str = "text";
pub(super) const LABEL_KEY: &str = "label";
/// `hf:` only: the image column (an `Image` feature), the dataset's configuration and the two
/// splits read.
const IMAGE_KEY: &str = "image";
const CONFIG_KEY: &str = "config";
const TRAIN_KEY: &str = "train";
const TEST_KEY: &str = "test";

/// A dataset given by its files: the kind, where they are, and for tables which columns hold
/// the text and the label. Its string form (`csv:reviews.csv#text=review#label=stars`) is what
/// config.json, grid files and summaries record.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnSource {
    pub kind: OwnKind,
    /// The path as given.
    pub location: String,
    /// A table's text column: a name, or a 0-based index (CSV) [default: `text`].
    pub text_column: Option<String>,
    /// A table's label column: a name, or a 0-based index (CSV) [default: `label`].
    pub label_column: Option<String>,
    /// `hf:` only: the column of encoded images; set, the dataset is one of images.
    pub image_column: Option<String>,
    /// `hf:` only: the dataset's configuration (subset) [default: `default`].
    pub config: Option<String>,
    /// `hf:` only: the split trained on [default: `train`].
    pub train_split: Option<String>,
    /// `hf:` only: the split scored [default: `test`].
    pub test_split: Option<String>,
    /// `<kind>-<the location's last component>`, filesystem-safe: run names and cache folders.
    id: String,
}

impl OwnSource {
    /// The source a `KIND:LOCATION[#key=value…]` spec names; `None` when `spec` starts with no
    /// kind this module reads (so it is some other dataset name).
    pub fn parse(spec: &str) -> Option<std::result::Result<Self, String>> {
        let (prefix, rest) = spec.split_once(':')?;
        let kind = OwnKind::ALL
            .into_iter()
            .find(|k| k.prefix() == prefix.trim().to_ascii_lowercase())?;
        Some(Self::parse_rest(kind, rest))
    }

    fn parse_rest(kind: OwnKind, rest: &str) -> std::result::Result<Self, String> {
        let (location, options) = match rest.split_once('#') {
            Some((location, options)) => (location, Some(options)),
            None => (rest, None),
        };
        if location.is_empty() {
            return Err(format!(
                "{}: expected a path after `{}:`",
                kind.prefix(),
                kind.prefix()
            ));
        }
        let mut source = Self {
            kind,
            location: location.to_string(),
            text_column: None,
            label_column: None,
            image_column: None,
            config: None,
            train_split: None,
            test_split: None,
            id: String::new(),
        };
        for option in options.into_iter().flat_map(|o| o.split('#')) {
            let Some((key, value)) = option.split_once('=').filter(|(_, v)| !v.is_empty()) else {
                return Err(format!(
                    "{}:{location}: option {option:?}: expected key=value (text=COLUMN or label=COLUMN)",
                    kind.prefix()
                ));
            };
            match key {
                TEXT_KEY => source.text_column = Some(value.to_string()),
                LABEL_KEY => source.label_column = Some(value.to_string()),
                IMAGE_KEY if kind == OwnKind::Hf => source.image_column = Some(value.to_string()),
                CONFIG_KEY if kind == OwnKind::Hf => source.config = Some(value.to_string()),
                TRAIN_KEY if kind == OwnKind::Hf => source.train_split = Some(value.to_string()),
                TEST_KEY if kind == OwnKind::Hf => source.test_split = Some(value.to_string()),
                _ => {
                    let known = match kind {
                        OwnKind::Hf => "text, image, label, config, train or test",
                        _ => "text or label",
                    };
                    return Err(format!(
                        "{}:{location}: unknown option {key:?} (expected {known})",
                        kind.prefix()
                    ));
                }
            }
        }
        source.check_columns()?;
        source.id = match kind {
            // `org/name` names a hub dataset: both parts say which.
            OwnKind::Hf if !Path::new(location).is_dir() => {
                format!("hf-{}", slug(&location.replace('/', "-")))
            }
            _ => format!("{}-{}", kind.prefix(), slug(last_component(location))),
        };
        Ok(source)
    }

    /// This source with the columns `--text-column` / `--label-column` name (flags win over the
    /// spec's options); an error for a folder of images, which has no columns.
    pub fn with_columns(
        mut self,
        text: Option<&str>,
        label: Option<&str>,
    ) -> std::result::Result<Self, String> {
        if let Some(text) = text {
            self.text_column = Some(text.to_string());
        }
        if let Some(label) = label {
            self.label_column = Some(label.to_string());
        }
        self.check_columns()?;
        Ok(self)
    }

    fn check_columns(&self) -> std::result::Result<(), String> {
        if self.kind == OwnKind::Folder
            && (self.text_column.is_some() || self.label_column.is_some())
        {
            return Err(format!(
                "folder:{}: a folder of images has no columns (its classes are its sub-folders); \
                 --text-column and --label-column apply to csv:, jsonl: and hf: sources",
                self.location
            ));
        }
        if self.text_column.is_some() && self.image_column.is_some() {
            return Err(format!(
                "{self}: give a text column or an image column, not both"
            ));
        }
        Ok(())
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn path(&self) -> &Path {
        Path::new(&self.location)
    }

    /// An `hf:` source is of images when its image column is named, else of texts.
    pub fn modality(&self) -> Modality {
        match self.kind {
            OwnKind::Folder => Modality::Image,
            OwnKind::Hf if self.image_column.is_some() => Modality::Image,
            OwnKind::Csv | OwnKind::Jsonl | OwnKind::Hf => Modality::Text,
        }
    }
}

impl fmt::Display for OwnSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.prefix(), self.location)?;
        let options: Vec<String> = [
            (TEXT_KEY, &self.text_column),
            (IMAGE_KEY, &self.image_column),
            (LABEL_KEY, &self.label_column),
            (CONFIG_KEY, &self.config),
            (TRAIN_KEY, &self.train_split),
            (TEST_KEY, &self.test_split),
        ]
        .into_iter()
        .filter_map(|(key, value)| value.as_ref().map(|v| format!("{key}={v}")))
        .collect();
        if !options.is_empty() {
            write!(f, "#{}", options.join("#"))?;
        }
        Ok(())
    }
}

/// The last non-empty component of a path, without its extension (`data/reviews.csv` →
/// `reviews`).
fn last_component(location: &str) -> &str {
    let trimmed = location.trim_end_matches(['/', '\\']);
    let name = trimmed.rsplit(['/', '\\']).next().unwrap_or(trimmed);
    match name.rsplit_once('.') {
        Some((stem, _)) if !stem.is_empty() => stem,
        _ => name,
    }
}

/// `text` with anything but ASCII letters, digits, `-` and `.` as `_`; at most 40 characters.
fn slug(text: &str) -> String {
    let slug: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    if slug.is_empty() || slug.chars().all(|c| c == '.') {
        "data".to_string()
    } else {
        slug
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        let source = OwnSource::parse("csv:data/My Reviews.csv#text=review#label=3")
            .unwrap()
            .unwrap();
        assert_eq!(source.kind, OwnKind::Csv);
        assert_eq!(source.location, "data/My Reviews.csv");
        assert_eq!(source.text_column.as_deref(), Some("review"));
        assert_eq!(source.label_column.as_deref(), Some("3"));
        assert_eq!(source.id(), "csv-My_Reviews");
        assert_eq!(
            source.to_string(),
            "csv:data/My Reviews.csv#text=review#label=3"
        );
        let folder = OwnSource::parse("folder:/x/pets/").unwrap().unwrap();
        assert_eq!(
            (folder.id(), folder.to_string().as_str()),
            ("folder-pets", "folder:/x/pets/")
        );
        assert!(OwnSource::parse("mnist").is_none());
        assert!(OwnSource::parse("dermamnist_64").is_none());
    }

    #[test]
    fn the_digest_follows_the_files_within_a_process() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.jsonl");
        std::fs::write(&file, "{\"text\": \"a\", \"label\": 1}\n").unwrap();
        let source = OwnSource::parse(&format!("jsonl:{}", file.display()))
            .unwrap()
            .unwrap();
        let first = source.content_digest().unwrap();
        assert_eq!(source.content_digest().unwrap(), first);
        std::fs::write(&file, "{\"text\": \"b\", \"label\": 22}\n").unwrap();
        let second = source.content_digest().unwrap();
        assert_ne!(second, first);
        // A copy elsewhere with the same name, length and time but other bytes is another
        // source: its digest is its own, not the memo's.
        let other = tempfile::tempdir().unwrap();
        let copy = other.path().join("t.jsonl");
        std::fs::write(&copy, "{\"text\": \"c\", \"label\": 33}\n").unwrap();
        let stamp = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::fs::File::options()
            .write(true)
            .open(&copy)
            .unwrap()
            .set_modified(stamp)
            .unwrap();
        let copied = OwnSource::parse(&format!("jsonl:{}", copy.display()))
            .unwrap()
            .unwrap();
        assert_ne!(copied.content_digest().unwrap(), second);
    }

    #[test]
    fn bad_specs_are_one_line() {
        let err = |spec: &str| OwnSource::parse(spec).unwrap().unwrap_err();
        assert_eq!(err("csv:"), "csv: expected a path after `csv:`");
        assert!(err("csv:a.csv#colour=red").contains("unknown option \"colour\""));
        assert!(err("jsonl:a.jsonl#text").contains("expected key=value"));
        assert!(err("folder:pets#label=x").contains("a folder of images has no columns"));
        let folder = OwnSource::parse("folder:pets").unwrap().unwrap();
        assert!(folder.with_columns(Some("t"), None).is_err());
    }
}
