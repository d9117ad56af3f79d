//! Bilinear resize of 8-bit images, equal byte for byte to Pillow's `Image.resize(size,
//! BILINEAR)`, which torchvision's `Resize` calls on PIL images.
//!
//! Invariants (Pillow's convolution resampling, the semantics of its `Resample.c`, written anew):
//! - Each side is resampled on its own, the width first, and only when its size changes. The
//!   width pass writes 8-bit rows, which the height pass reads.
//! - Output sample `i` of a side of `n_in` samples resized to `n_out` is centred at
//!   `(i + 0.5) * scale` with `scale = n_in / n_out`. The triangle filter's support widens
//!   by `max(scale, 1)` when shrinking, so every input sample under it counts (antialiasing);
//!   its weights are cut at the image's edge and renormalised to sum to one.
//! - Weights are rounded to fixed point with 22 fraction bits; a sample is the rounded fixed-point
//!   sum, clamped to 0..=255. Every channel is resampled alone, alpha included (Pillow
//!   premultiplies RGBA and LA; kiln resizes after converting to the model's channels, so
//!   only a model that takes alpha sees the difference).

use crate::error::Result;
use crate::memory;
use std::borrow::Cow;

/// Fraction bits of the fixed-point weights: 32 bits less the 8 of a sample and 2 of headroom.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Where each output sample of one side reads, and with what weights.
struct SideWeights {
    /// `(first input sample, count, offset in weights)` per output sample.
    spans: Vec<(usize, usize, usize)>,
    /// Every output sample's `count` fixed-point weights, one after another: about two per
    /// input sample when shrinking, three per output sample when growing.
    weights: Vec<i32>,
}

impl SideWeights {
    /// Output sample `i`'s first input sample and its weights.
    fn of(&self, i: usize) -> (usize, &[i32]) {
        let (first, count, at) = self.spans[i];
        (first, &self.weights[at..at + count])
    }
}

/// The triangle (bilinear) filter, support 1.
fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

fn side_weights(n_in: usize, n_out: usize, what: &str, fix: &str) -> Result<SideWeights> {
    let scale = n_in as f64 / n_out as f64;
    let filter_scale = scale.max(1.0);
    // the triangle's support (1), widened when shrinking
    let support = filter_scale;
    // multiplied by, not divided by `filter_scale`, as Pillow does (the same rounding)
    let inv = 1.0 / filter_scale;
    let center = |i: usize| (i as f64 + 0.5) * scale;
    // (first input sample, count) of output sample `i`: truncation toward zero, as a C cast,
    // then clamped to the side
    let span = |i: usize| {
        let first = ((center(i) - support + 0.5) as i64).max(0) as usize;
        let end = ((center(i) + support + 0.5) as i64).clamp(0, n_in as i64) as usize;
        (first, end.saturating_sub(first))
    };
    // The spans first: their buffer is checked before any work is done per output sample, so a
    // hostile output size is refused at once.
    let mut spans = memory::filled("resize_bilinear", what, n_out, (0, 0, 0), fix)?;
    let mut total = 0usize;
    for (i, slot) in spans.iter_mut().enumerate() {
        let (first, count) = span(i);
        *slot = (first, count, total);
        total = total
            .checked_add(count)
            .ok_or_else(|| memory::overflow("resize_bilinear", what, fix))?;
    }
    let mut weights = memory::filled("resize_bilinear", what, total, 0i32, fix)?;
    for (i, &(first, count, at)) in spans.iter().enumerate() {
        let center = center(i);
        let raw = |t: usize| triangle(((first + t) as f64 - center + 0.5) * inv);
        let mut sum = 0.0;
        for t in 0..count {
            sum += raw(t);
        }
        for (t, out) in weights[at..at + count].iter_mut().enumerate() {
            let w = if sum != 0.0 { raw(t) / sum } else { raw(t) };
            let fixed = w * f64::from(1u32 << PRECISION_BITS);
            *out = (fixed + if w < 0.0 { -0.5 } else { 0.5 }) as i32;
        }
    }
    Ok(SideWeights { spans, weights })
}

/// The fixed-point sum of one output sample, rounded and clamped to a byte.
fn clamp_sample(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// One output sample: `weights` over `count` inputs read `step` apart from `at`.
fn sample(src: &[u8], at: usize, step: usize, weights: &[i32]) -> u8 {
    let mut sum = 1i64 << (PRECISION_BITS - 1);
    for (t, &w) in weights.iter().enumerate() {
        sum += i64::from(src[at + t * step]) * i64::from(w);
    }
    clamp_sample(sum)
}

/// Resizes CHW bytes of `shape` (`[C, H, W]`) to `size` (`[H', W']`) with Pillow's bilinear
/// filter (see the module docs): the `[C, H', W']` bytes. Errors when `chw` does not hold
/// `C * H * W` bytes, a side is zero, or the result, the width pass's rows or the filter's
/// weights (each output's window only) would not fit in memory.
pub fn resize_bilinear(chw: &[u8], shape: [usize; 3], size: [usize; 2]) -> Result<Vec<u8>> {
    let [c, h, w] = shape;
    let [oh, ow] = size;
    let n = memory::image_len("resize_bilinear", shape)?;
    if chw.len() != n || h == 0 || w == 0 || oh == 0 || ow == 0 || c == 0 {
        return Err(crate::error::arg_err(
            "resize_bilinear",
            format!(
                "{} bytes of a {c}x{h}x{w} image resized to {oh}x{ow}; pass CHW bytes of that \
                 shape (needs {n}) and sides of at least one pixel",
                chw.len()
            ),
        ));
    }
    let what = format!("a {c}x{h}x{w} image resized to {oh}x{ow}");
    let fix = "resize to a smaller size";
    let mid_len = memory::checked_size("resize_bilinear", &what, &[c, h, ow], fix)?;
    let out_len = memory::checked_size("resize_bilinear", &what, &[c, oh, ow], fix)?;
    memory::check_fits(
        "resize_bilinear",
        &what,
        mid_len.saturating_add(out_len),
        fix,
    )?;
    // width pass: [C, H, W] -> [C, H, W']
    // an unchanged width is read in place by the height pass, not copied
    let mid: Cow<[u8]> = if ow == w {
        Cow::Borrowed(chw)
    } else {
        let side = side_weights(w, ow, &what, fix)?;
        let mut mid = memory::filled("resize_bilinear", &what, mid_len, 0u8, fix)?;
        for (row_in, row_out) in chw.chunks_exact(w).zip(mid.chunks_exact_mut(ow)) {
            for (j, out) in row_out.iter_mut().enumerate() {
                let (first, k) = side.of(j);
                *out = sample(row_in, first, 1, k);
            }
        }
        Cow::Owned(mid)
    };
    if oh == h {
        return Ok(mid.into_owned());
    }
    // height pass: [C, H, W'] -> [C, H', W']
    let side = side_weights(h, oh, &what, fix)?;
    let mut out = memory::filled("resize_bilinear", &what, out_len, 0u8, fix)?;
    for (plane_in, plane_out) in mid.chunks_exact(h * ow).zip(out.chunks_exact_mut(oh * ow)) {
        for (i, row_out) in plane_out.chunks_exact_mut(ow).enumerate() {
            let (first, k) = side.of(i);
            for (x, out) in row_out.iter_mut().enumerate() {
                *out = sample(plane_in, first * ow + x, ow, k);
            }
        }
    }
    Ok(out)
}
