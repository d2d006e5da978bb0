//! Image preprocessing identical to Hugging Face's `ViTImageProcessor`: grayscale replicated to 3
//! channels, a PIL resize in 8 bits, rescale by 1/255, normalise with the checkpoint's mean/std.
//!
//! The resize reimplements Pillow's separable convolution (`libImaging/Resample.c`): filter
//! weights computed in f64, normalised, converted to fixed point with 22 fractional bits, a
//! horizontal pass to an 8-bit intermediate, then a vertical pass, each rounding and clipping like
//! Pillow does. The output is therefore the same uint8 image PIL produces, not an approximation.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::config_json::json_error;

/// PIL's resampling filters (the integer codes of `PIL.Image.Resampling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resample {
    Lanczos = 1,
    Bilinear = 2,
    Bicubic = 3,
    Box = 4,
    Hamming = 5,
}

impl Resample {
    pub fn from_pil_code(code: u32) -> Result<Self> {
        Ok(match code {
            1 => Resample::Lanczos,
            2 => Resample::Bilinear,
            3 => Resample::Bicubic,
            4 => Resample::Box,
            5 => Resample::Hamming,
            0 => bail!("resample 0 (nearest) is not supported"),
            other => bail!("unknown PIL resample code {other}"),
        })
    }

    fn support(self) -> f64 {
        match self {
            Resample::Box => 0.5,
            Resample::Bilinear | Resample::Hamming => 1.0,
            Resample::Bicubic => 2.0,
            Resample::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let sinc = |x: f64| {
            if x == 0.0 {
                1.0
            } else {
                let px = x * std::f64::consts::PI;
                px.sin() / px
            }
        };
        match self {
            Resample::Box => {
                if (-0.5..0.5).contains(&x) {
                    1.0
                } else {
                    0.0
                }
            }
            Resample::Bilinear => (1.0 - x.abs()).max(0.0),
            Resample::Hamming => {
                let x = x.abs();
                if x >= 1.0 {
                    0.0
                } else if x == 0.0 {
                    1.0
                } else {
                    sinc(x) * (0.54 + 0.46 * (x * std::f64::consts::PI).cos())
                }
            }
            Resample::Bicubic => {
                // Keys' cubic with a = −0.5, as Pillow.
                let a = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * a
                } else {
                    0.0
                }
            }
            Resample::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Pillow's `precompute_coeffs` + `normalize_coeffs_8bpc`: for each output pixel, the first input
/// pixel and its fixed-point weights.
struct Coefficients {
    starts: Vec<usize>,
    /// Row-major (out_size × ksize); entries past a pixel's window are 0.
    weights: Vec<i32>,
    counts: Vec<usize>,
    ksize: usize,
}

fn coefficients(in_size: usize, out_size: usize, filter: Resample) -> Coefficients {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let mut starts = Vec::with_capacity(out_size);
    let mut counts = Vec::with_capacity(out_size);
    let mut weights = vec![0i32; out_size * ksize];
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        let ss = 1.0 / filterscale;
        // Pillow truncates toward zero after adding 0.5 (C's (int) cast).
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize - xmin;
        let k: Vec<f64> = (0..xmax)
            .map(|x| filter.weight((x as f64 + xmin as f64 - center + 0.5) * ss))
            .collect();
        let total: f64 = k.iter().sum();
        for (x, w) in k.iter().enumerate() {
            let w = if total != 0.0 { w / total } else { *w };
            let fixed = w * f64::from(1u32 << PRECISION_BITS);
            weights[xx * ksize + x] = if w < 0.0 {
                (fixed - 0.5) as i32
            } else {
                (fixed + 0.5) as i32
            };
        }
        starts.push(xmin);
        counts.push(xmax);
    }
    Coefficients {
        starts,
        weights,
        counts,
        ksize,
    }
}

fn clip8(acc: i32) -> u8 {
    if acc >= (1 << PRECISION_BITS << 8) {
        255
    } else if acc <= 0 {
        0
    } else {
        (acc >> PRECISION_BITS) as u8
    }
}

/// Resizes one 8-bit plane (height × width, row-major) as `PIL.Image.resize` does.
pub fn resize_plane(
    plane: &[u8],
    (height, width): (usize, usize),
    (out_h, out_w): (usize, usize),
    filter: Resample,
) -> Vec<u8> {
    let horizontal = coefficients(width, out_w, filter);
    let vertical = coefficients(height, out_h, filter);
    // Pillow's horizontal pass only computes the source rows the vertical pass reads.
    let first_row = vertical.starts[0];
    let last_row = vertical.starts[out_h - 1] + vertical.counts[out_h - 1];
    let rows = last_row - first_row;
    let mut temp = vec![0u8; rows * out_w];
    if out_w != width {
        for y in 0..rows {
            let src = &plane[(y + first_row) * width..(y + first_row + 1) * width];
            for xx in 0..out_w {
                let k = &horizontal.weights[xx * horizontal.ksize..];
                let start = horizontal.starts[xx];
                let mut acc: i32 = 1 << (PRECISION_BITS - 1);
                for x in 0..horizontal.counts[xx] {
                    acc += i32::from(src[start + x]) * k[x];
                }
                temp[y * out_w + xx] = clip8(acc);
            }
        }
    } else {
        temp.copy_from_slice(&plane[first_row * width..last_row * width]);
    }
    if out_h == height && first_row == 0 {
        return temp;
    }
    let mut out = vec![0u8; out_h * out_w];
    for yy in 0..out_h {
        let k = &vertical.weights[yy * vertical.ksize..];
        let start = vertical.starts[yy] - first_row;
        for xx in 0..out_w {
            let mut acc: i32 = 1 << (PRECISION_BITS - 1);
            for y in 0..vertical.counts[yy] {
                acc += i32::from(temp[(start + y) * out_w + xx]) * k[y];
            }
            out[yy * out_w + xx] = clip8(acc);
        }
    }
    out
}

/// `preprocessor_config.json` of a ViT checkpoint; missing keys take ViTImageProcessor's defaults.
#[derive(Clone, Debug, Deserialize)]
pub struct ImageProcessorConfig {
    #[serde(default = "yes")]
    pub do_resize: bool,
    #[serde(default)]
    pub size: Option<Size>,
    #[serde(default = "bilinear_code")]
    pub resample: u32,
    #[serde(default = "yes")]
    pub do_rescale: bool,
    #[serde(default = "one_over_255")]
    pub rescale_factor: f64,
    #[serde(default = "yes")]
    pub do_normalize: bool,
    #[serde(default = "half3")]
    pub image_mean: Vec<f64>,
    #[serde(default = "half3")]
    pub image_std: Vec<f64>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Size {
    HeightWidth { height: usize, width: usize },
    Shortest { shortest_edge: usize },
    Square(usize),
}

fn yes() -> bool {
    true
}
fn bilinear_code() -> u32 {
    2
}
fn one_over_255() -> f64 {
    1.0 / 255.0
}
fn half3() -> Vec<f64> {
    vec![0.5; 3]
}

/// A validated image pipeline for one backbone.
#[derive(Clone, Debug, PartialEq)]
pub struct ImagePreprocessor {
    /// (height, width) after resizing, or `None` to keep the size.
    pub size: Option<(usize, usize)>,
    pub resample: Resample,
    pub rescale_factor: Option<f64>,
    /// Per-channel (mean, std), or `None` to skip normalisation.
    pub normalize: Option<([f64; 3], [f64; 3])>,
}

impl ImagePreprocessor {
    pub fn from_config(config: &ImageProcessorConfig) -> Result<Self> {
        let size = match (&config.do_resize, &config.size) {
            (false, _) => None,
            (true, None) => Some((224, 224)),
            (true, Some(Size::HeightWidth { height, width })) => Some((*height, *width)),
            (true, Some(Size::Square(s))) => Some((*s, *s)),
            (true, Some(Size::Shortest { .. })) => {
                bail!(
                    "size.shortest_edge: shortest_edge resizing is not a ViTImageProcessor setting"
                )
            }
        };
        if let Some((h, w)) = size
            && (h == 0 || w == 0)
        {
            bail!("size is {h}×{w}, expected a height and width of at least 1");
        }
        if config.do_rescale && !config.rescale_factor.is_finite() {
            bail!(
                "rescale_factor is {}, expected a finite number",
                config.rescale_factor
            );
        }
        let three = |v: &[f64], what: &str| -> Result<[f64; 3]> {
            let values: [f64; 3] = v
                .try_into()
                .map_err(|_| anyhow::anyhow!("{what} must have 3 values, found {}", v.len()))?;
            if let Some(bad) = values.iter().find(|x| !x.is_finite()) {
                bail!("{what} holds {bad}, expected finite numbers");
            }
            Ok(values)
        };
        let normalize = if config.do_normalize {
            let std = three(&config.image_std, "image_std")?;
            if std.contains(&0.0) {
                bail!("image_std {std:?} holds 0: normalising would divide by zero");
            }
            Some((three(&config.image_mean, "image_mean")?, std))
        } else {
            None
        };
        Ok(Self {
            size,
            resample: Resample::from_pil_code(config.resample)?,
            rescale_factor: config.do_rescale.then_some(config.rescale_factor),
            normalize,
        })
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::io::read_input_text(path, crate::io::limits::SMALL_TEXT)?;
        let config: ImageProcessorConfig = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "{}: not a ViT preprocessor config: {}",
                path.display(),
                json_error(&text, &e)
            )
        })?;
        Self::from_config(&config).with_context(|| path.display().to_string())
    }

    /// A string that changes whenever the pipeline's output would (part of the cache key).
    pub fn fingerprint(&self) -> String {
        format!(
            "vit-image-v1 size={:?} resample={:?} rescale={:?} normalize={:?}",
            self.size, self.resample, self.rescale_factor, self.normalize
        )
    }

    /// The resized 8-bit image, (3, H, W), from a u8 (C, H, W) image with 1 or 3 channels.
    pub fn resize_u8(
        &self,
        image: &[u8],
        channels: usize,
        height: usize,
        width: usize,
    ) -> Result<Vec<u8>> {
        if channels != 1 && channels != 3 {
            bail!("{channels} channels: expected 1 (grayscale) or 3 (RGB)");
        }
        let plane = height * width;
        let mut out = Vec::new();
        for c in 0..3 {
            // Grayscale is replicated to RGB before the processor, as the authors do.
            let src = if channels == 1 {
                &image[..plane]
            } else {
                &image[c * plane..(c + 1) * plane]
            };
            match self.size {
                Some((h, w)) if (h, w) != (height, width) => {
                    out.extend(resize_plane(src, (height, width), (h, w), self.resample))
                }
                _ => out.extend_from_slice(src),
            }
        }
        Ok(out)
    }

    /// `pixel_values` for one image: (3, H, W) f32, rescaled and normalised as HF does (rescale in
    /// f64 then cast to f32, normalise in f32).
    pub fn pixel_values(
        &self,
        image: &[u8],
        channels: usize,
        height: usize,
        width: usize,
    ) -> Result<Vec<f32>> {
        let resized = self.resize_u8(image, channels, height, width)?;
        let plane = resized.len() / 3;
        let mut out = Vec::with_capacity(resized.len());
        for (k, &v) in resized.iter().enumerate() {
            let mut x = match self.rescale_factor {
                Some(f) => (f64::from(v) * f) as f32,
                None => f32::from(v),
            };
            if let Some((mean, std)) = &self.normalize {
                let c = k / plane;
                x = (x - mean[c] as f32) / std[c] as f32;
            }
            out.push(x);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_size_is_a_copy_and_constant_images_stay_constant() {
        let plane = vec![77u8; 28 * 28];
        for filter in [
            Resample::Bilinear,
            Resample::Bicubic,
            Resample::Lanczos,
            Resample::Box,
            Resample::Hamming,
        ] {
            assert!(
                resize_plane(&plane, (28, 28), (224, 224), filter)
                    .iter()
                    .all(|&v| v == 77),
                "{filter:?}"
            );
            assert!(
                resize_plane(&plane, (28, 28), (7, 9), filter)
                    .iter()
                    .all(|&v| v == 77),
                "{filter:?}"
            );
        }
    }

    #[test]
    fn processor_config_defaults_and_parsing() {
        let config: ImageProcessorConfig =
            serde_json::from_str(r#"{"size": {"height": 224, "width": 224}, "resample": 3, "image_mean": [0.5,0.5,0.5], "image_std": [0.5,0.5,0.5]}"#).unwrap();
        let p = ImagePreprocessor::from_config(&config).unwrap();
        assert_eq!((p.size, p.resample), (Some((224, 224)), Resample::Bicubic));
        let gray = vec![255u8; 4];
        let values = p.pixel_values(&gray, 1, 2, 2).unwrap();
        assert_eq!(values.len(), 3 * 224 * 224);
        assert!(values.iter().all(|&v| v == 1.0));
        assert!(
            ImagePreprocessor::from_config(&serde_json::from_str(r#"{"resample": 0}"#).unwrap())
                .is_err()
        );
    }

    #[test]
    fn sizes_of_zero_and_a_zero_or_non_finite_std_are_errors_naming_the_field() {
        for (json, field) in [
            (r#"{"size": {"height": 0, "width": 224}}"#, "size is 0×224"),
            (r#"{"size": 0}"#, "size is 0×0"),
            (r#"{"size": {"shortest_edge": 0}}"#, "size.shortest_edge"),
            (r#"{"image_std": [0.5, 0.0, 0.5]}"#, "image_std"),
        ] {
            let config: ImageProcessorConfig = serde_json::from_str(json).unwrap();
            let err = ImagePreprocessor::from_config(&config)
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{json}: {err}");
        }
        // JSON has no non-finite numbers: they come from code, or fail to parse (`from_file`).
        let base: ImageProcessorConfig = serde_json::from_str("{}").unwrap();
        for (config, field) in [
            (
                ImageProcessorConfig {
                    image_std: vec![0.5, f64::INFINITY, 0.5],
                    ..base.clone()
                },
                "image_std holds inf",
            ),
            (
                ImageProcessorConfig {
                    image_mean: vec![0.5, f64::NAN, 0.5],
                    ..base.clone()
                },
                "image_mean holds NaN",
            ),
            (
                ImageProcessorConfig {
                    rescale_factor: f64::NEG_INFINITY,
                    ..base.clone()
                },
                "rescale_factor",
            ),
        ] {
            let err = ImagePreprocessor::from_config(&config)
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("preprocessor_config.json");
        std::fs::write(&path, "{\"image_std\": [0.5, NaN, 0.5]}").unwrap();
        let err = format!("{:#}", ImagePreprocessor::from_file(&path).unwrap_err());
        assert!(
            err.contains("preprocessor_config.json")
                && err.contains("\"image_std\": expected value"),
            "{err}"
        );
        // Skipped steps are not checked.
        let config: ImageProcessorConfig =
            serde_json::from_str(r#"{"do_normalize": false, "image_std": [0, 0, 0]}"#).unwrap();
        assert!(ImagePreprocessor::from_config(&config).is_ok());
    }
}
