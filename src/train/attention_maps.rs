//! What `attention_maps.png` shows: token selection on a few real fine-tune samples. Owns the
//! choice of samples (the first [`PER_KIND`] clean and the first [`PER_KIND`] flipped ones, in
//! fine-tune order), their selecting attention and prediction at one moment ([`Snapshot`], read
//! through phase 2's forward: right after the reset and at the end), and what the samples look
//! like (the image, or the word pieces). Drawing is `report::attention_maps`'s.

use anyhow::{Context, Result, anyhow, bail};
use candle_core::{D, DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::run::Mode;
use crate::data::Inputs;
use crate::encoder::Backbone;
use crate::encoder::backbone::Preprocessing;

/// Clean samples shown, and as many flipped ones.
pub const PER_KIND: usize = 3;

/// The chosen fine-tune samples: rows of the fine-tune set, clean ones first, in fine-tune order.
#[derive(Clone, Debug, PartialEq)]
pub struct Picks {
    pub rows: Vec<usize>,
    /// Unpadded tokens of each row (what its attention spans).
    pub lengths: Vec<usize>,
}

impl Picks {
    /// The first `per_kind` clean and the first `per_kind` flipped rows of the fine-tune set
    /// (whose rows have `lengths` tokens each); fewer when the set has fewer.
    pub fn choose(noisy_mask: &[bool], lengths: &[usize], per_kind: usize) -> Self {
        let first = |flipped: bool| {
            (0..noisy_mask.len())
                .filter(move |&i| noisy_mask[i] == flipped)
                .take(per_kind)
        };
        let rows: Vec<usize> = first(false).chain(first(true)).collect();
        let lengths = rows.iter().map(|&r| lengths[r]).collect();
        Self { rows, lengths }
    }
}

/// The chosen samples' selecting attention and prediction at one moment of phase 2.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// After this many phase-2 epochs (0: right after the reset).
    pub epoch: usize,
    /// The fine-tune rows, in the order of the picks.
    pub rows: Vec<usize>,
    /// Argmax of each row's logits.
    pub predictions: Vec<u32>,
    /// Each row's attention over its unpadded tokens, mean over heads.
    pub attention: Vec<Vec<f32>>,
}

/// `picks` as `evaluate` gives their rows of the fine-tune set (logits and attention) on the
/// current parameters: one batch of at most 2·[`PER_KIND`] rows, so it costs nothing next to an
/// epoch.
pub fn snapshot(
    picks: &Picks,
    epoch: usize,
    evaluate: impl FnOnce(&[usize]) -> Result<(Tensor, Tensor)>,
) -> Result<Snapshot> {
    if picks.rows.is_empty() {
        return Ok(Snapshot {
            epoch,
            rows: Vec::new(),
            predictions: Vec::new(),
            attention: Vec::new(),
        });
    }
    let (logits, attention) = evaluate(&picks.rows)?;
    let predictions: Vec<u32> = logits.detach().argmax(D::Minus1)?.to_vec1()?;
    // (B, H, T) in last-layer mode, (B, T) from the head: mean over heads, on the host.
    let attention = attention
        .detach()
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?;
    let attention = match attention.rank() {
        2 => attention,
        3 => attention.mean(1)?,
        r => bail!("attention of rank {r}: (B, T) or (B, H, T) expected"),
    };
    let rows: Vec<Vec<f32>> = attention.to_vec2()?;
    let attention = rows
        .into_iter()
        .zip(&picks.lengths)
        .map(|(mut row, &len)| {
            if len > row.len() {
                bail!("attention spans {} tokens, the sample has {len}", row.len());
            }
            row.truncate(len);
            Ok(row)
        })
        .collect::<Result<_>>()?;
    Ok(Snapshot {
        epoch,
        rows: picks.rows.clone(),
        predictions,
        attention,
    })
}

/// What a sample looks like.
#[derive(Clone, Debug, PartialEq)]
pub enum Shown {
    /// The raw image, u8 (channels, height, width) row-major; the attention's position 0 is the
    /// CLS token and positions 1.. the patches, row by row.
    Image {
        channels: usize,
        height: usize,
        width: usize,
        pixels: Vec<u8>,
    },
    /// The word pieces the attention spans, one per position.
    Text { pieces: Vec<String> },
}

#[derive(Clone, Debug, PartialEq)]
pub struct MapSample {
    /// Row of the fine-tune set.
    pub row: usize,
    pub clean_label: u32,
    /// The (possibly flipped) label phase 2 trains on.
    pub given_label: u32,
    pub shown: Shown,
}

impl MapSample {
    pub fn flipped(&self) -> bool {
        self.clean_label != self.given_label
    }
}

/// Everything `attention_maps.png` draws.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionMaps {
    pub dataset: String,
    /// The mode as reports print it (`RunConfig::mode_label`).
    pub mode: String,
    pub n: usize,
    pub eta: f64,
    pub seed: u64,
    pub class_names: Vec<String>,
    /// Which attention is shown, in words ("the last layer's CLS query, mean over 3 heads").
    pub selector: String,
    /// The chosen samples, clean ones first.
    pub samples: Vec<MapSample>,
    /// Right after the reset (epoch 0).
    pub reset: Snapshot,
    /// After the last epoch.
    pub last: Snapshot,
}

impl AttentionMaps {
    /// The label's class name (its number when the dataset names fewer classes).
    pub fn class_name(&self, label: u32) -> String {
        self.class_names
            .get(label as usize)
            .cloned()
            .unwrap_or_else(|| label.to_string())
    }
}

/// The chosen samples as they are shown: the raw images, or the word pieces of the backbone's
/// own tokenization (checked against the tokens their attention spans).
pub fn shown_samples(
    backbone: &Backbone,
    inputs: &Inputs,
    picks: &Picks,
    labels: (&[u32], &[u32]),
) -> Result<Vec<MapSample>> {
    let (clean, given) = labels;
    let shown: Vec<Shown> = match inputs {
        Inputs::Images(set) => picks
            .rows
            .iter()
            .map(|&r| Shown::Image {
                channels: set.channels,
                height: set.height,
                width: set.width,
                pixels: set.image(r).to_vec(),
            })
            .collect(),
        Inputs::Texts(texts) => {
            let texts: Vec<String> = picks.rows.iter().map(|&r| texts[r].clone()).collect();
            word_pieces(backbone, &texts)?
                .into_iter()
                .map(|pieces| Shown::Text { pieces })
                .collect()
        }
    };
    picks
        .rows
        .iter()
        .zip(&picks.lengths)
        .zip(shown)
        .map(|((&row, &len), shown)| {
            if let Shown::Text { pieces } = &shown
                && pieces.len() != len
            {
                bail!(
                    "fine-tune sample {row}: the tokenizer gives {} word pieces, its cached features {len}",
                    pieces.len()
                );
            }
            Ok(MapSample {
                row,
                clean_label: clean[row],
                given_label: given[row],
                shown,
            })
        })
        .collect()
}

/// The unpadded word pieces of `texts`, as the backbone tokenizes them.
fn word_pieces(backbone: &Backbone, texts: &[String]) -> Result<Vec<Vec<String>>> {
    let Preprocessing::Text(preprocessor) = &backbone.preprocessing else {
        bail!("{} is not a text backbone", backbone.files.id);
    };
    let encoded = preprocessor.encode(texts)?;
    // The ids come from the backbone's preprocessor; the vocabulary from its tokenizer.json.
    let path = backbone
        .files
        .tokenizer
        .as_ref()
        .with_context(|| format!("{}: no tokenizer.json", backbone.files.id))?;
    let bytes = crate::io::read_input(path, crate::io::limits::TOKENIZER)?;
    let vocabulary = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| anyhow!("{}: not a tokenizer.json ({e})", path.display()))?;
    encoded
        .input_ids
        .iter()
        .zip(&encoded.attention_mask)
        .map(|(ids, mask)| {
            ids.iter()
                .zip(mask)
                .filter(|(_, m)| **m == 1)
                .map(|(&id, _)| {
                    vocabulary
                        .id_to_token(id)
                        .with_context(|| format!("{}: no token of id {id}", path.display()))
                })
                .collect()
        })
        .collect()
}

/// Which attention the maps show, in words.
pub fn selector(mode: Mode, heads: usize, image: bool, special_tokens: bool) -> String {
    let query = match (image, special_tokens) {
        (true, _) | (false, true) => "CLS query",
        (false, false) => "position-0 query (the first word piece)",
    };
    match mode {
        Mode::LastLayer => format!("the last layer's {query}, mean over {heads} heads"),
        Mode::Head => "the token-selection head (one head) over the final tokens".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    #[test]
    fn picks_are_the_first_clean_then_the_first_flipped_rows() {
        let mask = [false, true, false, false, true, false, true, true];
        let lengths: Vec<usize> = (10..18).collect();
        let picks = Picks::choose(&mask, &lengths, 3);
        assert_eq!(picks.rows, [0, 2, 3, 1, 4, 6]);
        assert_eq!(picks.lengths, [10, 12, 13, 11, 14, 16]);
        // η = 0: clean samples only.
        assert_eq!(Picks::choose(&[false; 2], &[5, 5], 3).rows, [0, 1]);
    }

    /// The snapshot averages the heads, cuts each row's padding and takes the argmax.
    #[test]
    fn snapshot_means_heads_and_cuts_padding() {
        let forward = |rows: &[usize]| -> Result<(Tensor, Tensor)> {
            assert_eq!(rows, [4, 1]);
            let logits = Tensor::new(&[[0f32, 1.0, 0.5], [2.0, 0.0, 1.0]], &Device::Cpu)?;
            // (B 2, H 2, T 3); row 1 has two tokens, its third position is padding.
            let attention = Tensor::new(
                &[
                    [[0.2f32, 0.3, 0.5], [0.4, 0.5, 0.1]],
                    [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
                ],
                &Device::Cpu,
            )?;
            Ok((logits, attention))
        };
        let picks = Picks {
            rows: vec![4, 1],
            lengths: vec![3, 2],
        };
        let snap = snapshot(&picks, 7, forward).unwrap();
        assert_eq!(snap.epoch, 7);
        assert_eq!(snap.predictions, [1, 0]);
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
        assert!(close(&snap.attention[0], &[0.3, 0.4, 0.3]), "{snap:?}");
        assert_eq!(snap.attention[1], [0.5, 0.5]);
    }
}
