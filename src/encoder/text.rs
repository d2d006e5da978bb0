//! Text preprocessing as the authors did (docs/protocol.md §3): the backbone's `tokenizer.json` through
//! Hugging Face `tokenizers`, padding to max_length 128, truncation at 128, special tokens OFF
//! (no [CLS]/[SEP]: position 0 is the first word piece). Padding and truncation are set here,
//! whatever the file says.

use std::path::Path;

use anyhow::{Result, anyhow};
use tokenizers::{
    PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer, TruncationDirection,
    TruncationParams, TruncationStrategy,
};

use crate::data::files::sha256_hex;

/// The authors' `max_length`.
pub const MAX_LENGTH: usize = 128;

pub struct TextPreprocessor {
    tokenizer: Tokenizer,
    pub max_length: usize,
    pub special_tokens: bool,
    tokenizer_sha256: String,
    /// The `tokenizer.json` it was read from, named by a failure to tokenize.
    path: std::path::PathBuf,
}

/// Token ids and padding masks of a batch, each row `max_length` long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    pub input_ids: Vec<Vec<u32>>,
    pub attention_mask: Vec<Vec<u32>>,
}

impl TextPreprocessor {
    /// One past the largest token id the tokenizer can give (its vocabulary with the added
    /// tokens).
    pub fn vocabulary_size(&self) -> usize {
        let vocabulary = self.tokenizer.get_vocab(true);
        vocabulary.values().max().map_or(0, |&id| id as usize + 1)
    }

    pub fn from_file(path: &Path, max_length: usize, special_tokens: bool) -> Result<Self> {
        let bytes = crate::io::read_input(path, crate::io::limits::TOKENIZER)?;
        let mut tokenizer = Tokenizer::from_bytes(&bytes)
            .map_err(|e| anyhow!("{}: not a tokenizer.json ({e})", path.display()))?;
        let pad_token = "[PAD]";
        let pad_id = tokenizer.token_to_id(pad_token).ok_or_else(|| {
            anyhow!(
                "{}: the vocabulary has no {pad_token} token",
                path.display()
            )
        })?;
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(max_length),
            direction: PaddingDirection::Right,
            pad_to_multiple_of: None,
            pad_id,
            pad_type_id: 0,
            pad_token: pad_token.into(),
        }));
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| anyhow!("{}: cannot truncate at {max_length} ({e})", path.display()))?;
        let preprocessor = Self {
            tokenizer,
            max_length,
            special_tokens,
            tokenizer_sha256: sha256_hex(&bytes),
            path: path.to_path_buf(),
        };
        // A tokenizer that parses but cannot tokenize (no [UNK], a broken model) fails here, at
        // load, not at the first batch of extraction.
        preprocessor.encode(&["What is a question ?".to_string()])?;
        Ok(preprocessor)
    }

    pub fn encode(&self, texts: &[String]) -> Result<Encoded> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), self.special_tokens)
            .map_err(|e| anyhow!("{}: tokenization failed: {e}", self.path.display()))?;
        Ok(Encoded {
            input_ids: encodings.iter().map(|e| e.get_ids().to_vec()).collect(),
            attention_mask: encodings
                .iter()
                .map(|e| e.get_attention_mask().to_vec())
                .collect(),
        })
    }

    /// Changes whenever the ids would (part of the feature-cache key).
    pub fn fingerprint(&self) -> String {
        format!(
            "bert-text-v1 tokenizer={} max_length={} special_tokens={}",
            &self.tokenizer_sha256[..16],
            self.max_length,
            self.special_tokens
        )
    }
}
