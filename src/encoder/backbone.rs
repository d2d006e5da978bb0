//! A frozen backbone ready to encode dataset inputs: the architecture read from config.json, the
//! weights memory-mapped from safetensors, and the matching preprocessing.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, anyhow, bail};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

use super::bert::{Bert, BertConfig, TextBatch, ids_tensor};
use super::config_json::json_error;
use super::hub::BackboneFiles;
use super::layers::{first_token, masked_mean};
use super::preprocess::ImagePreprocessor;
use super::text::TextPreprocessor;
use super::vit::{Vit, VitConfig};
use crate::data::files::digests;
use crate::data::{ImageSet, Inputs};
use crate::kernels::Precision;

pub enum Model {
    Vit(Vit),
    Bert(Bert),
}

pub enum Preprocessing {
    Image(ImagePreprocessor),
    /// Boxed: a tokenizer is over a kilobyte, an image preprocessor about a hundred bytes.
    Text(Box<TextPreprocessor>),
}

/// Text options the authors fixed (max_length 128, no special tokens), as flags.
#[derive(Clone, Copy, Debug)]
pub struct TextOptions {
    pub max_length: usize,
    pub special_tokens: bool,
}

impl Default for TextOptions {
    fn default() -> Self {
        Self {
            max_length: super::text::MAX_LENGTH,
            special_tokens: false,
        }
    }
}

pub struct Backbone {
    pub files: BackboneFiles,
    pub weights_sha256: String,
    /// sha256 of config.json: the architecture the weights are read into (part of the cache key).
    pub config_sha256: String,
    pub model: Model,
    pub preprocessing: Preprocessing,
    pub device: Device,
    /// What the frozen layers' products compute in during extraction (`--precision`; part of the
    /// cache key when bf16).
    pub(crate) precision: Precision,
    /// Batches run through the network, for tests that assert the cache did the work instead.
    forward_batches: AtomicUsize,
}

/// What a batch of inputs yields for the experiments.
pub struct Encoded {
    /// Hidden states entering the last layer, (B, T, D).
    pub layer_inputs: Tensor,
    /// Padding mask (B, T) for text, u32.
    pub attention_mask: Option<Tensor>,
    /// ViT: final-LayerNorm CLS token; BERT: final hidden state at position 0 (before the
    /// pooler, which phase 1 trains). (B, D).
    pub cls: Tensor,
    /// BERT's pooler output on position 0, when the checkpoint has a pooler. (B, D).
    pub pooled: Option<Tensor>,
    /// Mean of the final tokens over the attended positions, (B, D): what a token-selection head
    /// with uniform attention (p = 0) feeds its classifier.
    pub mean: Tensor,
}

#[derive(Deserialize)]
struct ModelType {
    model_type: Option<String>,
}

/// The weights at `path`: safetensors (mapped), or a PyTorch `pytorch_model.bin` (a zip of
/// tensors and a pickle, read by candle's pickle reader, which runs no pickled code) where a
/// checkpoint has only that.
pub fn weights(path: &Path, device: &Device) -> Result<VarBuilder<'static>> {
    let read = |e: candle_core::Error| anyhow!("{}: cannot read the weights: {e}", path.display());
    // Checked as every input is (a regular file, of a size weights may have) before candle maps
    // or reads it.
    drop(crate::io::open_input(path, crate::io::limits::TENSORS)?);
    if path.extension().is_some_and(|e| e == "bin") {
        return VarBuilder::from_pth(path, DType::F32, device).map_err(read);
    }
    // SAFETY: the weights file is read-only for the life of the map; candle copies tensors out.
    unsafe { VarBuilder::from_mmaped_safetensors(&[path], DType::F32, device) }.map_err(read)
}

/// A config.json error, naming the file.
fn bad_config(files: &BackboneFiles, e: String) -> anyhow::Error {
    anyhow!("{}: {e}", files.config.display())
}

/// A config.json that does not parse as the model's config, naming the file and the place.
fn parse_error(files: &BackboneFiles, config_text: &str, e: &serde_json::Error) -> anyhow::Error {
    bad_config(files, json_error(config_text, e))
}

/// A Hugging Face ViT: its config checked against the preprocessor's image size.
fn hf_vit(
    files: &BackboneFiles,
    config_text: &str,
    vb: VarBuilder<'static>,
) -> Result<(Model, Preprocessing)> {
    let config: VitConfig =
        serde_json::from_str(config_text).map_err(|e| parse_error(files, config_text, &e))?;
    config.check().map_err(|e| bad_config(files, e))?;
    let path = files.preprocessor.as_ref().ok_or_else(|| {
        anyhow!(
            "{}: a ViT backbone needs preprocessor_config.json beside config.json",
            files.id
        )
    })?;
    let preprocessor = ImagePreprocessor::from_file(path)?;
    if let Some((h, w)) = preprocessor.size
        && (h, w) != (config.image_size, config.image_size)
    {
        bail!(
            "{}: size {h}×{w} does not match image_size {} of {}",
            path.display(),
            config.image_size,
            files.config.display()
        );
    }
    let model = Vit::load(vb, &config)
        .with_context(|| format!("{}: weights do not fit config.json", files.id))?;
    Ok((Model::Vit(model), Preprocessing::Image(preprocessor)))
}

/// A Hugging Face BERT: its config checked against the padded length and its tokenizer's vocabulary.
fn hf_bert(
    files: &BackboneFiles,
    config_text: &str,
    vb: VarBuilder<'static>,
    text: TextOptions,
) -> Result<(Model, Preprocessing)> {
    let config: BertConfig =
        serde_json::from_str(config_text).map_err(|e| parse_error(files, config_text, &e))?;
    config.check().map_err(|e| bad_config(files, e))?;
    if text.max_length > config.max_position_embeddings {
        bail!(
            "{}: max_position_embeddings {} is below the {} tokens a sentence is padded to (the authors' max_length); a BERT backbone needs at least {}",
            files.config.display(),
            config.max_position_embeddings,
            text.max_length,
            text.max_length
        );
    }
    let path = files.tokenizer.as_ref().ok_or_else(|| {
        anyhow!(
            "{}: a BERT backbone needs tokenizer.json beside config.json",
            files.id
        )
    })?;
    let model = Bert::load(vb, &config)
        .with_context(|| format!("{}: weights do not fit config.json", files.id))?;
    let tokenizer = TextPreprocessor::from_file(path, text.max_length, text.special_tokens)?;
    // An id past the word embeddings would stop extraction midway, naming neither.
    let ids = tokenizer.vocabulary_size();
    if ids > config.vocab_size {
        bail!(
            "{}: its vocabulary holds {ids} token ids, more than the {} rows of {}'s word embeddings (vocab_size in {}): the tokenizer is not this backbone's",
            path.display(),
            config.vocab_size,
            files.id,
            files.config.display()
        );
    }
    Ok((Model::Bert(model), Preprocessing::Text(Box::new(tokenizer))))
}

impl Backbone {
    pub fn load(files: BackboneFiles, device: &Device, text: TextOptions) -> Result<Self> {
        let config_text = crate::io::read_input_text(&files.config, crate::io::limits::SMALL_TEXT)?;
        let weights_sha256 = digests(&files.weights)?.sha256;
        if super::timm::is_timm(&config_text) {
            let (config, vb, preprocessor) =
                super::timm::load(&config_text, &files.weights, device)
                    .with_context(|| format!("{}: a timm checkpoint", files.id))?;
            let model = Vit::load(vb, &config)
                .with_context(|| format!("{}: weights do not fit their shapes", files.id))?;
            return Ok(Self::assemble(
                files,
                &config_text,
                weights_sha256,
                (Model::Vit(model), Preprocessing::Image(preprocessor)),
                device,
            ));
        }
        let kind: ModelType = serde_json::from_str(&config_text).map_err(|e| {
            bad_config(
                &files,
                format!("not a JSON config: {}", json_error(&config_text, &e)),
            )
        })?;
        let vb = weights(&files.weights, device)?;
        let (model, preprocessing) = match kind.model_type.as_deref() {
            Some("vit") => hf_vit(&files, &config_text, vb)?,
            Some("bert") => hf_bert(&files, &config_text, vb, text)?,
            other => bail!(
                "{}: model_type {other:?} is not supported (vit or bert)",
                files.config.display()
            ),
        };
        Ok(Self::assemble(
            files,
            &config_text,
            weights_sha256,
            (model, preprocessing),
            device,
        ))
    }

    fn assemble(
        files: BackboneFiles,
        config_text: &str,
        weights_sha256: String,
        (model, preprocessing): (Model, Preprocessing),
        device: &Device,
    ) -> Self {
        Self {
            config_sha256: crate::data::files::sha256_hex(config_text.as_bytes()),
            files,
            weights_sha256,
            model,
            preprocessing,
            device: device.clone(),
            precision: Precision::F32,
            forward_batches: AtomicUsize::new(0),
        }
    }

    /// This backbone with its frozen layers' extraction products in `precision`; an error naming
    /// the flag where this CPU cannot compute in it (bf16 without AVX512-BF16), or where the
    /// backbone runs on a GPU (candle's CUDA kernels there are f32).
    pub fn in_precision(mut self, precision: Precision) -> Result<Self> {
        if precision == self.precision {
            return Ok(self);
        }
        if !self.device.is_cpu() {
            bail!(
                "--precision {}: only the CPU backbone computes in bf16; use --precision f32 with --device cuda",
                precision.name()
            );
        }
        precision.check_supported()?;
        self.model = match self.model {
            Model::Vit(mut m) => {
                m.layers = m.layers.iter().map(|l| l.in_precision(precision)).collect();
                Model::Vit(m)
            }
            Model::Bert(mut m) => {
                m.layers = m.layers.iter().map(|l| l.in_precision(precision)).collect();
                Model::Bert(m)
            }
        };
        self.precision = precision;
        Ok(self)
    }

    pub fn hidden_size(&self) -> usize {
        match &self.model {
            Model::Vit(m) => m.config.hidden_size,
            Model::Bert(m) => m.config.hidden_size,
        }
    }

    /// Tokens per sample entering the last layer before padding is cut: the patches plus CLS for
    /// ViT (at the preprocessed size), max_length for text.
    pub fn max_tokens(&self) -> usize {
        match (&self.model, &self.preprocessing) {
            (Model::Vit(m), Preprocessing::Image(p)) => {
                let (h, w) = p.size.unwrap_or((m.config.image_size, m.config.image_size));
                let patch = m.config.patch_size.max(1);
                (h / patch) * (w / patch) + 1
            }
            (Model::Vit(m), _) => {
                let side = m.config.image_size / m.config.patch_size.max(1);
                side * side + 1
            }
            (Model::Bert(_), Preprocessing::Text(t)) => t.max_length,
            (Model::Bert(m), _) => m.config.max_position_embeddings,
        }
    }

    /// Changes whenever the inputs to the network would (part of the feature-cache key).
    pub fn preprocessing_fingerprint(&self) -> String {
        match &self.preprocessing {
            Preprocessing::Image(p) => p.fingerprint(),
            Preprocessing::Text(t) => t.fingerprint(),
        }
    }

    pub fn forward_batches(&self) -> usize {
        self.forward_batches.load(Ordering::Relaxed)
    }

    /// `pixel_values` (B, 3, H, W) for images `indices` of `images`.
    pub fn pixel_values(&self, images: &ImageSet, indices: &[usize]) -> Result<Tensor> {
        let Preprocessing::Image(p) = &self.preprocessing else {
            bail!("{} is not an image backbone", self.files.id)
        };
        let mut values = Vec::new();
        for &i in indices {
            values.extend(p.pixel_values(
                images.image(i),
                images.channels,
                images.height,
                images.width,
            )?);
        }
        let (h, w) = p.size.unwrap_or((images.height, images.width));
        if let Model::Vit(vit) = &self.model
            && (h, w) != (vit.config.image_size, vit.config.image_size)
        {
            bail!(
                "{}: images reach the model at {h}×{w} pixels, its image_size is {} (set size in preprocessor_config.json)",
                self.files.id,
                vit.config.image_size
            );
        }
        Ok(Tensor::from_vec(
            values,
            (indices.len(), 3, h, w),
            &self.device,
        )?)
    }

    /// Token ids, types and mask for `texts`.
    pub fn text_batch(&self, texts: &[String]) -> Result<TextBatch> {
        let Preprocessing::Text(t) = &self.preprocessing else {
            bail!("{} is not a text backbone", self.files.id)
        };
        let encoded = t.encode(texts)?;
        let input_ids = ids_tensor(&encoded.input_ids, &self.device)?;
        Ok(TextBatch {
            token_type_ids: input_ids.zeros_like()?,
            attention_mask: ids_tensor(&encoded.attention_mask, &self.device)?,
            input_ids,
        })
    }

    /// Encodes inputs `indices` of `inputs` (one batch).
    pub fn encode(&self, inputs: &Inputs, indices: &[usize]) -> Result<Encoded> {
        self.forward_batches.fetch_add(1, Ordering::Relaxed);
        match (&self.model, inputs) {
            (Model::Vit(vit), Inputs::Images(images)) => {
                let layer_inputs = vit.last_layer_input(&self.pixel_values(images, indices)?)?;
                let final_tokens = vit.finish(&layer_inputs)?;
                Ok(Encoded {
                    cls: Vit::cls_feature(&final_tokens)?,
                    mean: final_tokens.mean(1)?,
                    layer_inputs,
                    attention_mask: None,
                    pooled: None,
                })
            }
            (Model::Bert(bert), Inputs::Texts(texts)) => {
                let texts: Vec<String> = indices.iter().map(|&i| texts[i].clone()).collect();
                let batch = self.text_batch(&texts)?;
                let layer_inputs = bert.last_layer_input(&batch)?;
                let final_tokens = bert.finish(&layer_inputs, &batch.attention_mask)?;
                Ok(Encoded {
                    cls: first_token(&final_tokens)?,
                    pooled: bert.pooled(&final_tokens)?,
                    mean: masked_mean(&final_tokens, &batch.attention_mask)?,
                    layer_inputs,
                    attention_mask: Some(batch.attention_mask),
                })
            }
            (Model::Vit(_), Inputs::Texts(_)) => bail!(
                "{} is a vision backbone; this dataset is text",
                self.files.id
            ),
            (Model::Bert(_), Inputs::Images(_)) => bail!(
                "{} is a text backbone; this dataset is images",
                self.files.id
            ),
        }
    }
}
