//! The built-in dataset: coloured shapes and patterns in noise, 10 classes, `3 x 32 x 32`.
//!
//! Sample `i` of split `s` under seed `k` is a pure function of `(k, s, i)`: every random number
//! it uses comes from the Philox stream at those coordinates (see `rng.rs`), so the set renders
//! the same on any machine, thread count and order, and train and validation differ because
//! their split tags differ. Labels cycle `i % 10`, so every split is balanced to within one.
//!
//! Each image: a background colour with a faint linear gradient; one figure drawn with
//! antialiased edges (coverage from a signed distance); per-pixel Gaussian noise. The figure's
//! colour contrasts the background by at least 0.3 in luma, its position, size, rotation (±15°,
//! any angle for the triangle) and the patterns' period and phase are random, and the noise level
//! varies per image. That is learnable by a small CNN (translation-invariant local features) and
//! hard for a linear model (the same class lands on different pixels in different colours).
//! Horizontal flips keep every class (the diagonal stripes come in both directions), so the
//! flip augmentation is label-preserving.

use crate::dataset::{ImageDataset, Split};
use crate::error::Result;
use crate::memory;
use crate::rng::{Domain, Stream};
use rayon::prelude::*;

/// The class names, indexed by label.
pub const CLASSES: [&str; 10] = [
    "circle",
    "square",
    "triangle",
    "cross",
    "ring",
    "horizontal bars",
    "vertical bars",
    "diagonal stripes",
    "checker",
    "dot grid",
];

/// Image side in pixels.
pub const SIZE: usize = 32;

/// Channels (RGB).
pub const CHANNELS: usize = 3;

fn split_tag(split: Split) -> u64 {
    match split {
        Split::Train => 0,
        Split::Test => 1,
    }
}

/// Pixel coverage of a point at signed distance `sd` (negative inside), 1 px antialiasing.
fn coverage(sd: f64) -> f64 {
    (0.5 - sd).clamp(0.0, 1.0)
}

/// Coverage of stripes of period `p` (half of each period filled) along coordinate `t`.
fn stripe(t: f64, p: f64, phase: f64) -> f64 {
    let q = (t + phase).rem_euclid(p);
    coverage((q - p / 2.0).abs() - p / 4.0)
}

fn luma(c: [f64; 3]) -> f64 {
    0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]
}

/// Renders sample `index` of `split` under `seed`: `3 * 32 * 32` CHW bytes and the label.
pub fn render(seed: u64, split: Split, index: u64) -> (Vec<u8>, i64) {
    let mut s = Stream::new(seed, Domain::Synthetic, split_tag(split), index);
    let label = (index % CLASSES.len() as u64) as usize;

    // Colours: figure and background at least 0.3 apart in luma.
    let mut fg = [0.0; 3];
    let mut bg = [0.0; 3];
    for attempt in 0..32 {
        fg = [s.uniform(), s.uniform(), s.uniform()];
        bg = [s.uniform(), s.uniform(), s.uniform()];
        if (luma(fg) - luma(bg)).abs() >= 0.3 {
            break;
        }
        if attempt == 31 {
            fg = bg.map(|v| {
                if luma(bg) > 0.5 {
                    v * 0.2
                } else {
                    0.8 + 0.2 * v
                }
            });
        }
    }
    let grad = s.range(0.0, 0.12);
    let grad_dir = s.range(0.0, std::f64::consts::TAU);
    let noise = s.range(0.02, 0.10);

    // Geometry.
    let pattern = label >= 5;
    let r = if pattern {
        s.range(8.0, 13.0)
    } else {
        s.range(7.0, 11.0)
    };
    let side = SIZE as f64;
    let cx = s.range(r + 1.0, side - r - 1.0);
    let cy = s.range(r + 1.0, side - r - 1.0);
    let theta = if label == 2 {
        s.range(0.0, std::f64::consts::TAU)
    } else {
        s.range(-15f64.to_radians(), 15f64.to_radians())
    };
    let (sin, cos) = theta.sin_cos();
    let period = s.range(4.0, 7.0);
    let phase_u = s.range(0.0, period);
    let phase_v = s.range(0.0, period);
    let arm = r * s.range(0.25, 0.38); // cross arm half-width
    let ring = r * s.range(0.18, 0.28); // ring half-thickness
    let dot = period * s.range(0.22, 0.30); // dot radius
    let diag_sign = if s.uniform() < 0.5 { 1.0 } else { -1.0 };
    let tri_normals: [(f64, f64); 3] = std::array::from_fn(|k| {
        let a = std::f64::consts::FRAC_PI_2 + k as f64 * std::f64::consts::TAU / 3.0;
        (a.cos(), a.sin())
    });

    let figure = |u: f64, v: f64| -> f64 {
        let patch = coverage(u.abs().max(v.abs()) - r);
        match label {
            0 => coverage(u.hypot(v) - r),
            1 => coverage(u.abs().max(v.abs()) - 0.85 * r),
            2 => {
                let big = 1.15 * r;
                let d = tri_normals
                    .iter()
                    .map(|(nx, ny)| nx * u + ny * v)
                    .fold(f64::MIN, f64::max);
                coverage(d - big / 2.0)
            }
            3 => {
                let h = (u.abs() - r).max(v.abs() - arm);
                let w = (u.abs() - arm).max(v.abs() - r);
                coverage(h.min(w))
            }
            4 => coverage((u.hypot(v) - (r - ring)).abs() - ring),
            5 => patch * stripe(v, period, phase_v),
            6 => patch * stripe(u, period, phase_u),
            7 => {
                let t = (u + diag_sign * v) * std::f64::consts::FRAC_1_SQRT_2;
                patch * stripe(t, period, phase_u)
            }
            8 => {
                let a = stripe(u, period, phase_u);
                let b = stripe(v, period, phase_v);
                patch * (a + b - 2.0 * a * b)
            }
            _ => {
                let qu = (u + phase_u).rem_euclid(period) - period / 2.0;
                let qv = (v + phase_v).rem_euclid(period) - period / 2.0;
                patch * coverage(qu.hypot(qv) - dot)
            }
        }
    };

    let plane = SIZE * SIZE;
    let mut out = vec![0u8; CHANNELS * plane];
    let (gs, gc) = grad_dir.sin_cos();
    for y in 0..SIZE {
        for x in 0..SIZE {
            let dx = x as f64 + 0.5 - cx;
            let dy = y as f64 + 0.5 - cy;
            let u = dx * cos + dy * sin;
            let v = -dx * sin + dy * cos;
            let m = figure(u, v);
            let g = grad * ((x as f64 - 15.5) * gc + (y as f64 - 15.5) * gs) / 16.0;
            for c in 0..CHANNELS {
                let base = bg[c] + g;
                let value = base * (1.0 - m) + fg[c] * m + noise * s.normal();
                out[c * plane + y * SIZE + x] = (value.clamp(0.0, 1.0) * 255.0).round() as u8;
            }
        }
    }
    (out, label as i64)
}

/// `len` samples of `split` under `seed` (rendered in parallel; the result does not depend on
/// the thread count). Errors, before allocating, when `len` samples (3,072 bytes each) do not
/// fit in this machine's memory.
pub fn generate(seed: u64, split: Split, len: usize) -> Result<ImageDataset> {
    let per = CHANNELS * SIZE * SIZE;
    let what = format!("{len} synthetic samples of {per} bytes");
    let fix = "ask for fewer samples (e.g. --data synthetic:50000)";
    // Labels take 8 bytes per sample beside the pixels.
    let total = memory::checked_size("synthetic::generate", &what, &[len, per + 8], fix)?;
    memory::check_fits("synthetic::generate", &what, total, fix)?;
    let mut pixels = memory::filled("synthetic::generate", &what, len * per, 0u8, fix)?;
    let labels: Vec<i64> = pixels
        .par_chunks_mut(per)
        .enumerate()
        .map(|(i, dst)| {
            let (img, label) = render(seed, split, i as u64);
            dst.copy_from_slice(&img);
            label
        })
        .collect();
    let name = match split {
        Split::Train => "synthetic/train",
        Split::Test => "synthetic/val",
    };
    ImageDataset::new(
        name,
        [CHANNELS, SIZE, SIZE],
        pixels,
        labels,
        CLASSES.iter().map(|c| c.to_string()).collect(),
    )
}

/// The training and validation sets: `train_len` samples of [`Split::Train`] and `val_len` of
/// [`Split::Test`] under `seed`. Errors when they do not fit in memory together.
pub fn train_val(
    seed: u64,
    train_len: usize,
    val_len: usize,
) -> Result<(ImageDataset, ImageDataset)> {
    let per = CHANNELS * SIZE * SIZE + 8;
    let what = format!("{train_len} training and {val_len} validation synthetic samples");
    let fix = "ask for fewer samples (e.g. --data synthetic:50000)";
    let op = "synthetic::train_val";
    let bytes = memory::checked_size(op, &what, &[train_len, per], fix)?
        .checked_add(memory::checked_size(op, &what, &[val_len, per], fix)?)
        .ok_or_else(|| memory::overflow(op, &what, fix))?;
    memory::check_fits(op, &what, bytes, fix)?;
    Ok((
        generate(seed, Split::Train, train_len)?,
        generate(seed, Split::Test, val_len)?,
    ))
}
