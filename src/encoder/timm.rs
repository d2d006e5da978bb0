//! ViT checkpoints in timm's own format, as timm pushes them to the hub (`timm/<model>`):
//! config.json with `architecture` and `pretrained_cfg` instead of Hugging Face's `model_type`,
//! and timm's tensor names (`blocks.N.attn.qkv` holding query, key and value in one matrix). They
//! load natively: the tensors are renamed to Hugging Face's ViT layout at load time (the fused
//! qkv split into its three thirds, in timm's order q, k, v), and the dimensions are read from
//! the tensors themselves. Preprocessing is ViTImageProcessor's, as the paper's protocol has it:
//! a resize to `input_size` and timm's mean and std (timm's own eval crop, `crop_pct`, is not
//! applied).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use candle_core::{DType, Device, Tensor};
use candle_nn::{Activation, VarBuilder};
use serde::Deserialize;

use super::config_json::json_error;
use super::preprocess::{ImagePreprocessor, Resample};
use super::vit::VitConfig;

/// The parts of timm's config.json this loader reads.
#[derive(Deserialize)]
struct TimmConfig {
    architecture: String,
    #[serde(default)]
    model_args: HashMap<String, serde_json::Value>,
    pretrained_cfg: PretrainedCfg,
}

#[derive(Deserialize)]
struct PretrainedCfg {
    input_size: [usize; 3],
    #[serde(default = "bicubic")]
    interpolation: String,
    mean: [f64; 3],
    std: [f64; 3],
}

fn bicubic() -> String {
    "bicubic".into()
}

/// Whether `config_text` is timm's format: an `architecture` and no `model_type`.
pub fn is_timm(config_text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(config_text).is_ok_and(|v| {
        v.get("architecture").is_some_and(|a| a.is_string()) && v.get("model_type").is_none()
    })
}

/// Heads of timm's named ViT sizes, when `model_args` does not say.
fn heads_of(architecture: &str) -> Option<usize> {
    let size = architecture.strip_prefix("vit_")?.split('_').next()?;
    Some(match size {
        "tiny" => 3,
        "small" => 6,
        "base" => 12,
        "large" | "huge" => 16,
        _ => return None,
    })
}

/// A timm ViT: its configuration in Hugging Face's terms, its tensors renamed to Hugging Face's
/// layout (on `device`), and its preprocessing.
pub fn load(
    config_text: &str,
    weights: &Path,
    device: &Device,
) -> Result<(VitConfig, VarBuilder<'static>, ImagePreprocessor)> {
    let timm: TimmConfig = serde_json::from_str(config_text)
        .map_err(|e| anyhow!("not a timm config: {}", json_error(config_text, &e)))?;
    if !timm.architecture.starts_with("vit_") {
        bail!(
            "timm architecture {:?} is not a ViT (vit_*)",
            timm.architecture
        );
    }
    drop(crate::io::open_input(weights, crate::io::limits::TENSORS)?);
    let tensors: HashMap<String, Tensor> = if weights.extension().is_some_and(|e| e == "bin") {
        candle_core::pickle::read_all(weights).map(|all| all.into_iter().collect())
    } else {
        candle_core::safetensors::load(weights, &Device::Cpu)
    }
    .with_context(|| format!("{}: cannot read the weights", weights.display()))?;
    let get = |name: &str| {
        tensors.get(name).with_context(|| {
            format!(
                "{}: no tensor {name} (a timm ViT has one)",
                weights.display()
            )
        })
    };
    let (_, _, hidden) = get("cls_token")?.dims3()?;
    let (_, tokens, _) = get("pos_embed")?.dims3()?;
    let (_, channels, patch, _) = get("patch_embed.proj.weight")?.dims4()?;
    let (intermediate, _) = get("blocks.0.mlp.fc1.weight")?.dims2()?;
    let layers = (0..)
        .take_while(|i| tensors.contains_key(&format!("blocks.{i}.norm1.weight")))
        .count();
    let heads = match timm.model_args.get("num_heads").and_then(|v| v.as_u64()) {
        Some(h) => h as usize,
        None => heads_of(&timm.architecture).with_context(|| {
            format!(
                "{}: no model_args.num_heads and an unknown size",
                timm.architecture
            )
        })?,
    };
    let side = timm.pretrained_cfg.input_size[1];
    if (side / patch) * (side / patch) + 1 != tokens {
        bail!("pos_embed has {tokens} positions, not 1 + ({side}/{patch})² for input_size {side}");
    }
    let config = VitConfig {
        hidden_size: hidden,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        intermediate_size: intermediate,
        hidden_act: Activation::Gelu,
        // timm's ViT LayerNorms.
        layer_norm_eps: 1e-6,
        image_size: side,
        patch_size: patch,
        num_channels: channels,
        qkv_bias: tensors.contains_key("blocks.0.attn.qkv.bias"),
    };
    config.check().map_err(|e| anyhow!("{e}"))?;
    let renamed = hf_names(&tensors, layers)?;
    let vb = VarBuilder::from_tensors(renamed, DType::F32, device);
    let resample = match timm.pretrained_cfg.interpolation.as_str() {
        "bicubic" => Resample::Bicubic,
        "bilinear" => Resample::Bilinear,
        other => bail!("pretrained_cfg.interpolation {other:?}: bicubic or bilinear expected"),
    };
    let preprocessor = ImagePreprocessor {
        size: Some((side, timm.pretrained_cfg.input_size[2])),
        resample,
        rescale_factor: Some(1.0 / 255.0),
        normalize: Some((timm.pretrained_cfg.mean, timm.pretrained_cfg.std)),
    };
    Ok((config, vb, preprocessor))
}

/// timm's tensors under Hugging Face ViT names (no prefix; the head as `classifier`).
fn hf_names(tensors: &HashMap<String, Tensor>, layers: usize) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    let mut put = |from: &str, to: &str| -> Result<()> {
        let tensor = tensors
            .get(from)
            .with_context(|| format!("no tensor {from}"))?;
        out.insert(to.to_string(), tensor.clone());
        Ok(())
    };
    put("cls_token", "embeddings.cls_token")?;
    put("pos_embed", "embeddings.position_embeddings")?;
    for p in ["weight", "bias"] {
        put(
            &format!("patch_embed.proj.{p}"),
            &format!("embeddings.patch_embeddings.projection.{p}"),
        )?;
        put(&format!("norm.{p}"), &format!("layernorm.{p}"))?;
        for i in 0..layers {
            let (timm, hf) = (format!("blocks.{i}"), format!("encoder.layer.{i}"));
            for (from, to) in [
                ("norm1", "layernorm_before"),
                ("attn.proj", "attention.output.dense"),
                ("norm2", "layernorm_after"),
                ("mlp.fc1", "intermediate.dense"),
                ("mlp.fc2", "output.dense"),
            ] {
                put(&format!("{timm}.{from}.{p}"), &format!("{hf}.{to}.{p}"))?;
            }
        }
    }
    for i in 0..layers {
        for p in ["weight", "bias"] {
            let Some(qkv) = tensors.get(&format!("blocks.{i}.attn.qkv.{p}")) else {
                continue;
            };
            let third = qkv.dim(0)? / 3;
            for (k, name) in ["query", "key", "value"].iter().enumerate() {
                out.insert(
                    format!("encoder.layer.{i}.attention.attention.{name}.{p}"),
                    qkv.narrow(0, k * third, third)?.contiguous()?,
                );
            }
        }
    }
    for p in ["weight", "bias"] {
        if let Some(head) = tensors.get(&format!("head.{p}")) {
            out.insert(format!("classifier.{p}"), head.clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timm_configs_are_told_from_hugging_faces() {
        assert!(is_timm(
            r#"{"architecture": "vit_tiny_patch16_224", "num_classes": 1000}"#
        ));
        assert!(!is_timm(
            r#"{"model_type": "vit", "architectures": ["ViTModel"]}"#
        ));
        assert!(!is_timm("not json"));
        assert_eq!(heads_of("vit_base_patch16_224"), Some(12));
        assert_eq!(heads_of("vit_tiny_patch16_224"), Some(3));
        assert_eq!(heads_of("vit_gigantic_patch14"), None);
    }
}
