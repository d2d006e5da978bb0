//! attention_maps.png: token selection on a few fine-tune samples, right after the query/key reset
//! and at the end of phase 2 (`train::attention_maps` chooses the samples and measures them).
//! Images: the selecting attention over the patch grid, laid over the image, beside the plain
//! image. Text: the word pieces, each shaded by its weight. One row per sample, clean samples
//! first; each panel names the clean label, the given label, the prediction and the largest weight.

use std::path::Path;

use anyhow::{Result, bail};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::plot::{FONT, PALETTE, plot_err, register_fonts};
use crate::io::produce_atomic;
use crate::train::attention_maps::{AttentionMaps, MapSample, Shown, Snapshot};

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

const MARGIN: i32 = 20;
const GAP: i32 = 28;
/// Side of a drawn image, in pixels: ViT's input size.
const IMAGE: i32 = 224;
/// Line height of the annotations.
const LINE: i32 = 17;
/// Width of a text figure.
const TEXT_WIDTH: i32 = 1240;
/// Word pieces shown per sample at most.
pub const MAX_PIECES: usize = 40;
/// Height of a word-piece line.
const PIECE_LINE: i32 = 25;
/// A word piece's font size.
const PIECE_FONT: u32 = 15;

/// Writes the figure of `maps` to `path`, atomically.
pub fn write(path: &Path, maps: &AttentionMaps) -> Result<()> {
    check(maps)?;
    register_fonts();
    let image = !matches!(
        maps.samples.first().map(|s| &s.shown),
        Some(Shown::Text { .. })
    );
    let width = if image {
        2 * MARGIN + 3 * IMAGE + 2 * GAP
    } else {
        TEXT_WIDTH
    };
    let header = header_lines(maps, image, width);
    let rows = rows(maps);
    let row_height = |row: &FigureRow| match row {
        FigureRow::Section(_) => 34,
        FigureRow::Sample(_) if image => IMAGE + 3 * LINE + 22,
        FigureRow::Sample(k) => text_sample_height(&maps.samples[*k], width),
    };
    let height = header_height(&header) + rows.iter().map(row_height).sum::<i32>() + MARGIN;
    produce_atomic(path, |tmp| {
        let root = BitMapBackend::new(tmp, (width as u32, height as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut y = draw_header(&root, &header)?;
        for row in &rows {
            match row {
                FigureRow::Section(line) => {
                    root.draw(&Text::new(
                        line.clone(),
                        (MARGIN, y + 8),
                        font(17).style(FontStyle::Bold),
                    ))
                    .map_err(plot_err)?;
                }
                FigureRow::Sample(k) if image => draw_image_sample(&root, maps, *k, y)?,
                FigureRow::Sample(k) => draw_text_sample(&root, maps, *k, y, width)?,
            }
            y += row_height(row);
        }
        root.present().map_err(plot_err)?;
        Ok(())
    })
}

/// The two snapshots describe the samples, in their order: a mismatch would draw a wrong picture.
fn check(maps: &AttentionMaps) -> Result<()> {
    let rows: Vec<usize> = maps.samples.iter().map(|s| s.row).collect();
    for snap in [&maps.reset, &maps.last] {
        if snap.rows != rows
            || snap.predictions.len() != rows.len()
            || snap.attention.len() != rows.len()
        {
            bail!(
                "attention maps: the epoch-{} attention is of rows {:?}, the samples are rows {rows:?}",
                snap.epoch,
                snap.rows
            );
        }
    }
    for (k, sample) in maps.samples.iter().enumerate() {
        let tokens = maps.reset.attention[k].len();
        if maps.last.attention[k].len() != tokens {
            bail!(
                "attention maps: fine-tune sample {} spans {tokens} tokens at the reset, {} at the end",
                sample.row,
                maps.last.attention[k].len()
            );
        }
        match &sample.shown {
            Shown::Image { .. } => {
                patch_side(tokens).map_err(|e| {
                    anyhow::anyhow!("attention maps: fine-tune sample {}: {e}", sample.row)
                })?;
            }
            Shown::Text { pieces } if pieces.len() != tokens => bail!(
                "attention maps: fine-tune sample {} has {} word pieces and attention over {tokens}",
                sample.row,
                pieces.len()
            ),
            Shown::Text { .. } => {}
        }
    }
    Ok(())
}

/// The side of the patch grid behind `tokens` positions (CLS, then the patches row by row).
fn patch_side(tokens: usize) -> Result<usize> {
    let patches = tokens.saturating_sub(1);
    let side = (patches as f64).sqrt().round() as usize;
    if side == 0 || side * side != patches {
        bail!("{tokens} tokens are not CLS and a square grid of patches");
    }
    Ok(side)
}

fn font(size: u32) -> FontDesc<'static> {
    (FONT, size).into_font()
}

/// Width of `text` in pixels at `size` (an estimate if the font cannot measure it).
fn text_width(text: &str, size: u32) -> i32 {
    font(size).box_size(text).map_or(
        (text.chars().count() as u32 * size * 3 / 5) as i32,
        |(w, _)| w as i32,
    )
}

/// `text` broken at spaces into lines no wider than `width` at `size`.
fn wrap(text: &str, size: u32, width: i32) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let candidate = if line.is_empty() {
            word.to_string()
        } else {
            format!("{line} {word}")
        };
        if !line.is_empty() && text_width(&candidate, size) > width {
            lines.push(std::mem::replace(&mut line, word.to_string()));
        } else {
            line = candidate;
        }
    }
    lines.push(line);
    lines
}

/// The title (bold) and the wrapped lines under it.
struct Header {
    title: Vec<String>,
    lines: Vec<String>,
}

fn header_lines(maps: &AttentionMaps, image: bool, width: i32) -> Header {
    let title = format!(
        "{} · {} · n {} · η {} · seed {}: token selection",
        maps.dataset, maps.mode, maps.n, maps.eta, maps.seed
    );
    let what = if image {
        let tokens = maps.reset.attention.first().map_or(0, Vec::len);
        let side = patch_side(tokens).unwrap_or(0);
        format!(
            "Attention of {} over the {side}×{side} patches (position 0, CLS, is stated as a number), laid over the image: colour is the weight divided by the row's largest patch weight (viridis, dark = 0, yellow = the largest). Uniform attention would give every position 1/{tokens} = {:.4}.",
            maps.selector,
            1.0 / tokens.max(1) as f64
        )
    } else {
        format!(
            "Attention of {} over each word piece (the first {MAX_PIECES} shown): shade is the weight divided by the sample's largest weight over both moments (white = 0, orange = the largest); uniform is 1/(word pieces).",
            maps.selector
        )
    };
    let moments = format!(
        "Each sample: right after the query/key reset (epoch 0) and after the last epoch ({}); pred is the model's prediction then.",
        maps.last.epoch
    );
    let inner = width - 2 * MARGIN;
    Header {
        title: wrap(&title, 21, inner),
        lines: [what, moments]
            .iter()
            .flat_map(|l| wrap(l, 14, inner))
            .collect(),
    }
}

fn header_height(header: &Header) -> i32 {
    MARGIN + 28 * header.title.len() as i32 + 19 * header.lines.len() as i32 + 8
}

/// Draws the header; returns the y below it.
fn draw_header(root: &Area, header: &Header) -> Result<i32> {
    let mut y = MARGIN;
    for line in &header.title {
        root.draw(&Text::new(
            line.clone(),
            (MARGIN, y),
            font(21).style(FontStyle::Bold),
        ))
        .map_err(plot_err)?;
        y += 28;
    }
    for line in &header.lines {
        root.draw(&Text::new(line.clone(), (MARGIN, y), font(14)))
            .map_err(plot_err)?;
        y += 19;
    }
    Ok(y + 8)
}

/// What the figure lists, top to bottom.
enum FigureRow {
    Section(String),
    /// Index into `maps.samples`.
    Sample(usize),
}

fn rows(maps: &AttentionMaps) -> Vec<FigureRow> {
    let of = |flipped: bool| -> Vec<usize> {
        (0..maps.samples.len())
            .filter(|&k| maps.samples[k].flipped() == flipped)
            .collect()
    };
    let (clean, noisy) = (of(false), of(true));
    let mut rows = vec![FigureRow::Section(format!(
        "Clean samples (label kept): the first {} of the fine-tune set",
        clean.len()
    ))];
    rows.extend(clean.into_iter().map(FigureRow::Sample));
    if noisy.is_empty() {
        rows.push(FigureRow::Section(if maps.eta == 0.0 {
            "No noisy samples: η = 0 flips no label".to_string()
        } else {
            "No noisy samples: no label of the fine-tune set was flipped".to_string()
        }));
    } else {
        rows.push(FigureRow::Section(format!(
            "Noisy samples (label flipped): the first {} of the fine-tune set",
            noisy.len()
        )));
        rows.extend(noisy.into_iter().map(FigureRow::Sample));
    }
    rows
}

/// "clean: A · given: B (flipped)".
fn labels_line(maps: &AttentionMaps, sample: &MapSample) -> String {
    format!(
        "clean: {} · given: {}{}",
        maps.class_name(sample.clean_label),
        maps.class_name(sample.given_label),
        if sample.flipped() { " (flipped)" } else { "" }
    )
}

/// "epoch 0 (reset)" or "epoch E (end)".
fn moment(snap: &Snapshot) -> String {
    if snap.epoch == 0 {
        "epoch 0 (reset)".to_string()
    } else {
        format!("epoch {} (end)", snap.epoch)
    }
}

fn max_of(weights: &[f32]) -> f32 {
    weights.iter().copied().fold(0.0, f32::max)
}

/// One image sample: the plain image, then the attention at the reset and at the end over it.
fn draw_image_sample(root: &Area, maps: &AttentionMaps, k: usize, y: i32) -> Result<()> {
    let sample = &maps.samples[k];
    let Shown::Image {
        channels,
        height,
        width,
        pixels,
    } = &sample.shown
    else {
        bail!("fine-tune sample {} is not an image", sample.row);
    };
    let image = |px: i32, py: i32| -> [f64; 3] {
        let (sy, sx) = (
            py as usize * height / IMAGE as usize,
            px as usize * width / IMAGE as usize,
        );
        let at = |c: usize| f64::from(pixels[(c * height + sy) * width + sx]);
        if *channels >= 3 {
            [at(0), at(1), at(2)]
        } else {
            [at(0); 3]
        }
    };
    let snaps = [&maps.reset, &maps.last];
    // One colour scale for the row: the largest patch weight of both panels.
    let scale = snaps
        .iter()
        .map(|s| max_of(&s.attention[k][1..]))
        .fold(0.0, f32::max)
        .max(f32::MIN_POSITIVE);
    let x0 = MARGIN;
    draw_pixels(root, (x0, y), |px, py| {
        let [r, g, b] = image(px, py);
        RGBColor(r as u8, g as u8, b as u8)
    })?;
    let text_y = y + IMAGE + 6;
    let annotate = |x: i32, lines: [String; 3]| -> Result<()> {
        for (j, line) in lines.into_iter().enumerate() {
            root.draw(&Text::new(line, (x, text_y + LINE * j as i32), font(13)))
                .map_err(plot_err)?;
        }
        Ok(())
    };
    annotate(
        x0,
        [
            format!("fine-tune sample {}", sample.row),
            format!("clean: {}", maps.class_name(sample.clean_label)),
            format!(
                "given: {}{}",
                maps.class_name(sample.given_label),
                if sample.flipped() { " (flipped)" } else { "" }
            ),
        ],
    )?;
    for (j, snap) in snaps.iter().enumerate() {
        let weights = &snap.attention[k];
        let side = patch_side(weights.len())?;
        let x = x0 + (j as i32 + 1) * (IMAGE + GAP);
        draw_pixels(root, (x, y), |px, py| {
            let patch = 1
                + (py as usize * side / IMAGE as usize) * side
                + px as usize * side / IMAGE as usize;
            let heat =
                ViridisRGB::get_color_normalized(f64::from(weights[patch] / scale), 0.0, 1.0);
            let [r, g, b] = image(px, py);
            let mix = |base: f64, over: u8| (0.45 * base + 0.55 * f64::from(over)) as u8;
            RGBColor(mix(r, heat.0), mix(g, heat.1), mix(b, heat.2))
        })?;
        annotate(
            x,
            [
                moment(snap),
                format!("pred: {}", maps.class_name(snap.predictions[k])),
                format!("max {:.4} · CLS {:.4}", max_of(weights), weights[0]),
            ],
        )?;
    }
    Ok(())
}

/// An IMAGE × IMAGE square at `corner`, pixel by pixel, with a thin frame.
fn draw_pixels(
    root: &Area,
    corner: (i32, i32),
    color: impl Fn(i32, i32) -> RGBColor,
) -> Result<()> {
    for py in 0..IMAGE {
        for px in 0..IMAGE {
            root.draw_pixel((corner.0 + px, corner.1 + py), &color(px, py))
                .map_err(plot_err)?;
        }
    }
    root.draw(&Rectangle::new(
        [
            (corner.0 - 1, corner.1 - 1),
            (corner.0 + IMAGE, corner.1 + IMAGE),
        ],
        BLACK.mix(0.5).stroke_width(1),
    ))
    .map_err(plot_err)?;
    Ok(())
}

/// Where each shown word piece goes in a block `width` wide: (x, line, box width, text).
fn piece_layout(pieces: &[String], width: i32) -> Vec<(i32, i32, i32, String)> {
    let mut placed = Vec::new();
    let (mut x, mut line) = (0, 0);
    for (j, piece) in pieces.iter().take(MAX_PIECES).enumerate() {
        // A continuation piece sits against the one before it, without its "##".
        let (text, gap) = match piece.strip_prefix("##") {
            Some(rest) if j > 0 && !rest.is_empty() => (rest.to_string(), 1),
            _ => (piece.clone(), 6),
        };
        let w = text_width(&text, PIECE_FONT) + 6;
        let mut at = if j == 0 { 0 } else { x + gap };
        if at + w > width && at > 0 {
            line += 1;
            at = 0;
        }
        placed.push((at, line, w, text));
        x = at + w;
    }
    if pieces.len() > MAX_PIECES {
        let more = format!("… +{} more", pieces.len() - MAX_PIECES);
        let w = text_width(&more, PIECE_FONT) + 6;
        let mut at = x + 6;
        if at + w > width {
            line += 1;
            at = 0;
        }
        placed.push((at, line, w, more));
    }
    placed
}

/// Width of one of a text sample's two blocks.
fn block_width(width: i32) -> i32 {
    (width - 2 * MARGIN - GAP) / 2
}

fn text_sample_height(sample: &MapSample, width: i32) -> i32 {
    let Shown::Text { pieces } = &sample.shown else {
        return 0;
    };
    let lines = piece_layout(pieces, block_width(width))
        .last()
        .map_or(1, |p| p.1 + 1);
    22 + LINE + 4 + lines * PIECE_LINE + 18
}

/// One text sample: its labels, then its word pieces shaded by the attention at the reset (left)
/// and at the end (right).
fn draw_text_sample(root: &Area, maps: &AttentionMaps, k: usize, y: i32, width: i32) -> Result<()> {
    let sample = &maps.samples[k];
    let Shown::Text { pieces } = &sample.shown else {
        bail!("fine-tune sample {} is not a text", sample.row);
    };
    root.draw(&Text::new(
        format!(
            "fine-tune sample {} · {} · {} word pieces",
            sample.row,
            labels_line(maps, sample),
            pieces.len()
        ),
        (MARGIN, y),
        font(15).style(FontStyle::Bold),
    ))
    .map_err(plot_err)?;
    let snaps = [&maps.reset, &maps.last];
    // One shade scale for the sample: its largest weight over both moments.
    let scale = snaps
        .iter()
        .map(|s| max_of(&s.attention[k]))
        .fold(0.0, f32::max)
        .max(f32::MIN_POSITIVE);
    let layout = piece_layout(pieces, block_width(width));
    let [r1, g1, b1] = [PALETTE[3].0, PALETTE[3].1, PALETTE[3].2].map(f64::from);
    for (j, snap) in snaps.iter().enumerate() {
        let weights = &snap.attention[k];
        let x0 = MARGIN + j as i32 * (block_width(width) + GAP);
        root.draw(&Text::new(
            format!(
                "{}: pred {} · max {:.4} (uniform {:.4})",
                moment(snap),
                maps.class_name(snap.predictions[k]),
                max_of(weights),
                1.0 / weights.len().max(1) as f64
            ),
            (x0, y + 22),
            font(14),
        ))
        .map_err(plot_err)?;
        let top = y + 22 + LINE + 4;
        for (p, (x, line, w, text)) in layout.iter().enumerate() {
            let (bx, by) = (x0 + x, top + line * PIECE_LINE);
            if let Some(&weight) = weights.get(p).filter(|_| p < MAX_PIECES) {
                let t = f64::from(weight / scale).clamp(0.0, 1.0);
                let shade = |to: f64| (255.0 + t * (to - 255.0)) as u8;
                root.draw(&Rectangle::new(
                    [(bx, by), (bx + w, by + PIECE_LINE - 4)],
                    RGBColor(shade(r1), shade(g1), shade(b1)).filled(),
                ))
                .map_err(plot_err)?;
                root.draw(&Rectangle::new(
                    [(bx, by), (bx + w, by + PIECE_LINE - 4)],
                    BLACK.mix(0.15).stroke_width(1),
                ))
                .map_err(plot_err)?;
            }
            root.draw(&Text::new(text.clone(), (bx + 3, by + 2), font(PIECE_FONT)))
                .map_err(plot_err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Width and height from a PNG's IHDR, after checking its signature.
    fn png_size(path: &Path) -> (u32, u32) {
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(
            &bytes[..8],
            b"\x89PNG\r\n\x1a\n",
            "{} is not a PNG",
            path.display()
        );
        assert_eq!(&bytes[12..16], b"IHDR");
        let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        (be(16), be(20))
    }

    fn snapshot(epoch: usize, rows: &[usize], attention: Vec<Vec<f32>>) -> Snapshot {
        Snapshot {
            epoch,
            rows: rows.to_vec(),
            predictions: rows.iter().map(|&r| (r % 2) as u32).collect(),
            attention,
        }
    }

    fn maps(samples: Vec<MapSample>, reset: Snapshot, last: Snapshot, eta: f64) -> AttentionMaps {
        AttentionMaps {
            dataset: "synthetic".into(),
            mode: "last-layer".into(),
            n: 10,
            eta,
            seed: 42,
            class_names: vec!["zero".into(), "one".into()],
            selector: "the last layer's CLS query, mean over 3 heads".into(),
            samples,
            reset,
            last,
        }
    }

    /// A 4×4 patch grid over 8×8 images (one grey, one RGB): three rows (one clean section, one
    /// noisy) of 224-pixel panels in three columns.
    #[test]
    fn an_image_figure_has_the_expected_size() {
        let grey = Shown::Image {
            channels: 1,
            height: 8,
            width: 8,
            pixels: (0..64).map(|v| (v * 4) as u8).collect(),
        };
        let rgb = Shown::Image {
            channels: 3,
            height: 8,
            width: 8,
            pixels: (0..192).map(|v| v as u8).collect(),
        };
        let samples = vec![
            MapSample {
                row: 0,
                clean_label: 0,
                given_label: 0,
                shown: grey.clone(),
            },
            MapSample {
                row: 2,
                clean_label: 1,
                given_label: 1,
                shown: rgb,
            },
            MapSample {
                row: 1,
                clean_label: 1,
                given_label: 0,
                shown: grey,
            },
        ];
        let uniform = vec![vec![1.0 / 17.0; 17]; 3];
        let peaked: Vec<Vec<f32>> = (0..3)
            .map(|k| {
                let mut w = vec![0.01f32; 17];
                w[1 + 5 * k] = 1.0 - 0.16;
                w
            })
            .collect();
        let rows = [0, 2, 1];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attention_maps.png");
        let figure = maps(
            samples,
            snapshot(0, &rows, uniform),
            snapshot(5, &rows, peaked),
            0.2,
        );
        write(&path, &figure).unwrap();
        let header = header_height(&header_lines(&figure, true, 768));
        let sample = IMAGE + 3 * LINE + 22;
        assert_eq!(
            png_size(&path),
            (768, (header + 2 * 34 + 3 * sample + MARGIN) as u32)
        );
        // Nothing but the figure in the folder (the temporary file renamed away).
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// Word pieces (one sample longer than the cap, with a continuation piece), η = 0: one
    /// section of clean samples and the line saying there are no noisy ones.
    #[test]
    fn a_text_figure_has_the_expected_size() {
        let short: Vec<String> = ["what", "is", "play", "##ing", "?"]
            .map(String::from)
            .to_vec();
        let long: Vec<String> = (0..60).map(|k| format!("word{k}")).collect();
        let samples = vec![
            MapSample {
                row: 0,
                clean_label: 1,
                given_label: 1,
                shown: Shown::Text {
                    pieces: short.clone(),
                },
            },
            MapSample {
                row: 1,
                clean_label: 0,
                given_label: 0,
                shown: Shown::Text {
                    pieces: long.clone(),
                },
            },
        ];
        let weights = |len: usize| {
            (0..len)
                .map(|j| (j + 1) as f32 / 2000.0)
                .collect::<Vec<_>>()
        };
        let rows = [0, 1];
        let reset = snapshot(0, &rows, vec![weights(5), weights(60)]);
        let last = snapshot(3, &rows, vec![vec![0.6, 0.1, 0.1, 0.1, 0.1], weights(60)]);
        let figure = maps(samples.clone(), reset.clone(), last, 0.0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attention_maps.png");
        write(&path, &figure).unwrap();
        let header = header_height(&header_lines(&figure, false, TEXT_WIDTH));
        let expected = header
            + 2 * 34
            + samples
                .iter()
                .map(|s| text_sample_height(s, TEXT_WIDTH))
                .sum::<i32>()
            + MARGIN;
        assert_eq!(png_size(&path), (TEXT_WIDTH as u32, expected as u32));
        // 40 pieces and the "more" mark wrap onto several lines; the short sample fits one.
        assert!(
            text_sample_height(&samples[1], TEXT_WIDTH)
                > text_sample_height(&samples[0], TEXT_WIDTH)
        );
        let layout = piece_layout(&short, 500);
        assert_eq!(layout[3].3, "ing");
        assert_eq!(layout[3].0, layout[2].0 + layout[2].2 + 1);
        // Attention that does not describe the samples is refused, not drawn.
        let wrong = maps(
            samples,
            reset.clone(),
            snapshot(3, &[1, 0], reset.attention),
            0.0,
        );
        assert!(write(&path, &wrong).is_err());
    }
}
