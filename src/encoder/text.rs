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
/// Bytes of text tokenized first per position kept: far more than a word piece takes.
const TEXT_BYTES_PER_POSITION: usize = 32;

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
pub struct TokenBatch {
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

    pub fn encode(&self, texts: &[String]) -> Result<TokenBatch> {
        let bounded: Vec<String> = texts
            .iter()
            .map(|t| self.bounded(t).map(str::to_string))
            .collect::<Result<_>>()?;
        let encodings = self
            .tokenizer
            .encode_batch(bounded, self.special_tokens)
            .map_err(|e| anyhow!("{}: tokenization failed: {e}", self.path.display()))?;
        Ok(TokenBatch {
            input_ids: encodings.iter().map(|e| e.get_ids().to_vec()).collect(),
            attention_mask: encodings
                .iter()
                .map(|e| e.get_attention_mask().to_vec())
                .collect(),
        })
    }

    /// The prefix of `text` that gives the same ids as the whole of it: a long text is cut
    /// before it is tokenized (a 50 MB cell would otherwise be tokenized whole, at ~85× its
    /// size, then truncated to 128 positions). A cut is taken once its tokens fill every position
    /// and end before the prefix's last whitespace, so that no kept word piece touches the cut;
    /// else the cut grows ×4 (a text of few, long words is tokenized whole at worst).
    fn bounded<'t>(&self, text: &'t str) -> Result<&'t str> {
        let mut cut = self.max_length * TEXT_BYTES_PER_POSITION;
        while cut < text.len() {
            let at = (0..=cut)
                .rev()
                .find(|&k| text.is_char_boundary(k))
                .unwrap_or(0);
            let prefix = &text[..at];
            let encoding = self
                .tokenizer
                .encode(prefix, self.special_tokens)
                .map_err(|e| anyhow!("{}: tokenization failed: {e}", self.path.display()))?;
            let real = encoding
                .get_attention_mask()
                .iter()
                .filter(|&&m| m == 1)
                .count();
            let kept_end = encoding
                .get_offsets()
                .iter()
                .zip(encoding.get_attention_mask())
                .filter(|(_, m)| **m == 1)
                .map(|(o, _)| o.1)
                .max()
                .unwrap_or(0);
            let last_space = prefix.rfind(char::is_whitespace);
            if real >= self.max_length && last_space.is_some_and(|space| kept_end <= space) {
                return Ok(prefix);
            }
            cut = cut.saturating_mul(4);
        }
        Ok(text)
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
