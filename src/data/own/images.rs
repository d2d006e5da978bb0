//! EncodedImage images (a `folder:` source's files, an `hf:` Image column's bytes) decoded into one
//! [`ImageSet`] under a memory budget that no input can exceed:
//!
//! 1. every image's dimensions are read from its header first (nothing decoded), and the set's
//!    size after resizing is checked against the memory this process may still take
//!    ([`crate::limits::Available`]);
//! 2. each image is then decoded with the `image` crate's allocation limit set to its share of
//!    that memory, and resized (when the set is resized) as soon as it is decoded, so at most one
//!    full-size image per decoding thread is alive — a folder of decompression bombs costs one
//!    bomb, not all of them; images too large to decode one at a time are refused by name.
//!
//! Documented rule: images stay 8-bit; a set whose images are all grayscale stays one channel,
//! any colour image makes every image RGB (alpha dropped). Images of one size, at most
//! [`MAX_KEPT_SIDE`] on a side, are kept as they are; otherwise every image is resized to
//! [`COMMON_SIZE`]² (the backbones' input) with a bilinear filter, said in the run's deviations.

use std::io::{BufReader, Cursor, Seek};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use image::DynamicImage;
use rayon::prelude::*;

use crate::data::files::{DataError, Result};
use crate::data::samples::ImageSet;

/// The side images of differing (or very large) sizes are resized to.
pub const COMMON_SIZE: u32 = 224;
/// The largest side a set of one size keeps: beyond it the backbones' 224² input is all that is
/// used anyway, and keeping the full images would only take memory.
pub const MAX_KEPT_SIDE: u32 = 1024;
/// Bytes a decoder may take per pixel (RGBA at 16 bits: the widest the formats read here give).
const DECODED_BYTES_PER_PIXEL: u64 = 8;
/// Share of the memory left that one image's decoding may take (the rest is the kept set, the
/// other decoding thread, the tokens to come).
const DECODE_SHARE: f64 = 0.25;
/// An image whose decoding takes more than this is decoded alone, not beside another.
const DECODED_ALONE: u64 = 64 << 20;

/// One encoded image: a file, or bytes read from one (named in errors as `at`).
pub enum EncodedImage {
    File(PathBuf),
    Bytes { at: PathBuf, bytes: Vec<u8> },
}

impl EncodedImage {
    fn at(&self) -> &Path {
        match self {
            EncodedImage::File(path) => path,
            EncodedImage::Bytes { at, .. } => at,
        }
    }

    /// A reader of the encoded bytes with the format guessed from them.
    fn reader(&self) -> Result<image::io::Reader<Box<dyn BufReadSeek + '_>>> {
        let inner: Box<dyn BufReadSeek> = match self {
            EncodedImage::File(path) => {
                Box::new(BufReader::new(crate::data::files::open_data(path)?))
            }
            EncodedImage::Bytes { bytes, .. } => Box::new(Cursor::new(&bytes[..])),
        };
        image::io::Reader::new(inner)
            .with_guessed_format()
            .map_err(|e| DataError::io(self.at(), e))
    }
}

/// A buffered, seekable reader (a file's or a byte slice's).
trait BufReadSeek: std::io::BufRead + Seek {}
impl<T: std::io::BufRead + Seek> BufReadSeek for T {}

fn not_an_image(at: &Path, e: impl std::fmt::Display) -> DataError {
    DataError::format(
        at,
        format!(
            "not an image this program decodes (PNG, JPEG, BMP, GIF, TIFF, WebP): {}",
            crate::excerpt::line(&e.to_string(), crate::excerpt::SHOWN * 2)
        ),
    )
}

/// The images of `sources` as one [`ImageSet`] and the deviations to say; `what` (the folder or
/// file they come from) is named when the set as a whole is over the budget.
pub fn decode_set(sources: &[EncodedImage], what: &Path) -> Result<(ImageSet, Vec<String>)> {
    let sizes: Vec<(u32, u32)> = sources
        .par_iter()
        .map(|source| {
            source
                .reader()?
                .into_dimensions()
                .map_err(|e| not_an_image(source.at(), e))
        })
        .collect::<Result<_>>()?;
    let first = sizes.first().copied().unwrap_or((1, 1));
    let keep = sizes.iter().all(|&s| s == first) && first.0.max(first.1) <= MAX_KEPT_SIDE;
    let (width, height) = if keep {
        first
    } else {
        (COMMON_SIZE, COMMON_SIZE)
    };
    let room = crate::limits::Available::now();
    // The kept set at three bytes a pixel (its size when any image has colour).
    let kept = sources.len() as u64 * u64::from(width) * u64::from(height) * 3;
    if kept as f64 > room.bytes / 2.0 {
        return Err(DataError::format(
            what,
            format!(
                "its {} images take {kept} bytes at {width}×{height}, more than half the {:.0} this process may still take ({})",
                sources.len(),
                room.bytes,
                room.source
            ),
        ));
    }
    let per_image = (room.bytes * DECODE_SHARE) as u64;
    let alone = Mutex::new(());
    let decoded: Vec<DynamicImage> = sources
        .par_iter()
        .zip(&sizes)
        .map(|(source, &(w, h))| {
            let need = u64::from(w) * u64::from(h) * DECODED_BYTES_PER_PIXEL;
            if need > per_image {
                return Err(DataError::format(
                    source.at(),
                    format!(
                        "a {w}×{h} image: decoding it may take {need} bytes, more than the {per_image} one image may take here ({} left: {})",
                        room.bytes as u64, room.source
                    ),
                ));
            }
            let _guard = (need > DECODED_ALONE).then(|| alone.lock().unwrap_or_else(|e| e.into_inner()));
            let mut reader = source.reader()?;
            let mut limits = image::io::Limits::default();
            limits.max_alloc = Some(per_image);
            reader.limits(limits);
            let image = reader.decode().map_err(|e| not_an_image(source.at(), e))?;
            Ok(compact(image, keep, width, height))
        })
        .collect::<Result<_>>()?;
    let warnings = if keep {
        Vec::new()
    } else {
        vec![format!(
            "the images have several sizes or sides over {MAX_KEPT_SIDE}: each was resized to {COMMON_SIZE}×{COMMON_SIZE} (bilinear) when read"
        )]
    };
    Ok((planes(&decoded, width, height), warnings))
}

/// `image` resized to the set's size (unless kept) and reduced to 8-bit luma or RGB, so that
/// only the kept pixels stay alive.
fn compact(image: DynamicImage, keep: bool, width: u32, height: u32) -> DynamicImage {
    let image = if keep {
        image
    } else {
        image.resize_exact(width, height, image::imageops::FilterType::Triangle)
    };
    if image.color().has_color() {
        DynamicImage::ImageRgb8(image.to_rgb8())
    } else {
        DynamicImage::ImageLuma8(image.to_luma8())
    }
}

/// The compact images as (channels, height, width) planes: one channel when all are grayscale.
fn planes(images: &[DynamicImage], width: u32, height: u32) -> ImageSet {
    let gray = images.iter().all(|i| !i.color().has_color());
    let channels = if gray { 1 } else { 3 };
    let mut pixels = Vec::with_capacity(images.len() * channels * (width * height) as usize);
    for image in images {
        let interleaved = if gray {
            image.to_luma8().into_raw()
        } else {
            image.to_rgb8().into_raw()
        };
        for c in 0..channels {
            pixels.extend(interleaved.iter().skip(c).step_by(channels));
        }
    }
    ImageSet {
        count: images.len(),
        channels,
        height: height as usize,
        width: width as usize,
        pixels,
    }
}
