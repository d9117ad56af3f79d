//! The zero-bordered image every CPU conv path unfolds from and folds back into, so the column
//! matrix is built (and scattered back) with plain copies and adds, without a bounds check per
//! element.
//!
//! Layout: per channel, `Hp = H + 2·pad_h` rows of pitch `P = W + pad_w`; an interior row holds
//! `pad_w` zeros, then the `W` values; the `pad_h` rows above and below are zero; after the last
//! channel come `max(pad_w, dil_w·(kW - 1))` zeros of slack. One zero run serves as a row's
//! right padding and as the next row's left padding: padded column `x` (`0 <= x < W + 2·pad_w`)
//! of padded row `r` sits at `r·P + x` whether or not `x >= P`, since a read past a row's end
//! lands in the next row's (or channel's, or the slack's) leading zeros. So tap `(c, i, j)` at
//! output `(oh, ow)` reads `c·Hp·P + (oh·stride_h + i·dil_h)·P + ow·stride_w + j·dil_w`.
//!
//! Invariants: [`Padded::fill`] writes every element of the buffer; [`unfold`] writes every
//! entry of its column-matrix rows; [`fold_add`] only adds, so the padded gradient must start
//! at zero, and [`Padded::unpad`] then reads its interior (what lands on padding is dropped).

use super::Conv2dGeometry;
use crate::ops::KernelFloat;
use crate::{Error, Result};
use rayon::prelude::*;
use std::ops::Range;

/// The padded-image sizes of one convolution.
#[derive(Clone, Copy)]
pub(super) struct Padded {
    channels: usize,
    h: usize,
    w: usize,
    pad: [usize; 2],
    /// Row pitch `W + pad_w`.
    pub(super) pitch: usize,
    /// Elements of one channel: `Hp · P`.
    pub(super) plane: usize,
    /// Elements of the buffer, slack included.
    pub(super) len: usize,
}

impl Padded {
    /// The sizes for `g`, or the allocator's size error when they overflow `usize`.
    pub(super) fn new(g: &Conv2dGeometry) -> Result<Self> {
        let [h, w] = g.input_size;
        let pad = g.params.padding;
        let slack = pad[1].max(g.params.dilation[1] * (g.kernel_size[1] - 1));
        let sizes = || {
            let pitch = w.checked_add(pad[1])?;
            let plane = pad[0].checked_mul(2)?.checked_add(h)?.checked_mul(pitch)?;
            let len = g.in_channels.checked_mul(plane)?.checked_add(slack)?;
            Some((pitch, plane, len))
        };
        let (pitch, plane, len) = sizes().ok_or_else(too_large)?;
        Ok(Self {
            channels: g.in_channels,
            h,
            w,
            pad,
            pitch,
            plane,
            len,
        })
    }

    /// Elements of one unpadded image `[C_in, H, W]`.
    pub(super) fn image_len(&self) -> usize {
        self.channels * self.h * self.w
    }

    /// Copies one image `[C_in, H, W]` into `padded` (`len` elements), zeros around it.
    pub(super) fn fill<T: KernelFloat>(&self, image: &[T], padded: &mut [T]) {
        if self.h * self.w == 0 {
            padded[..self.len].fill(T::ZERO);
            return;
        }
        let [ph, pw] = self.pad;
        let interior = ph * self.pitch..(ph + self.h) * self.pitch;
        for (c, dst) in padded[..self.channels * self.plane]
            .chunks_mut(self.plane)
            .enumerate()
        {
            dst[..interior.start].fill(T::ZERO);
            dst[interior.end..].fill(T::ZERO);
            let rows = dst[interior.clone()].chunks_mut(self.pitch);
            for (row, src) in rows.zip(image[c * self.h * self.w..].chunks(self.w)) {
                row[..pw].fill(T::ZERO);
                row[pw..].copy_from_slice(src);
            }
        }
        padded[self.channels * self.plane..].fill(T::ZERO);
    }

    /// Copies the interior of a padded buffer back into one image `[C_in, H, W]`.
    pub(super) fn unpad<T: KernelFloat>(&self, padded: &[T], image: &mut [T]) {
        if self.h * self.w == 0 {
            return;
        }
        let [ph, pw] = self.pad;
        for (c, dst) in image.chunks_mut(self.h * self.w).enumerate() {
            let src = &padded[c * self.plane + ph * self.pitch..];
            for (row, from) in dst.chunks_mut(self.w).zip(src.chunks(self.pitch)) {
                row.copy_from_slice(&from[pw..pw + self.w]);
            }
        }
    }
}

/// Where tap `(c, i, j)` of `group` starts reading (output `(0, 0)`), for each row of the
/// group's column matrix in order (`r = (c·kH + i)·kW + j`).
pub(super) fn taps(g: &Conv2dGeometry, p: &Padded, group: usize) -> impl Iterator<Item = usize> {
    let [kh, kw] = g.kernel_size;
    let [dh, dw] = g.params.dilation;
    let channels = g.in_channels / g.params.groups;
    let (pitch, plane) = (p.pitch, p.plane);
    (group * channels..(group + 1) * channels).flat_map(move |c| {
        (0..kh).flat_map(move |i| (0..kw).map(move |j| c * plane + i * dh * pitch + j * dw))
    })
}

/// Writes rows `rows` of `group`'s column matrix (`C_in/groups · kH · kW` rows of
/// `H_out · W_out` entries) from a padded image into `col`: row `r` at
/// `col[(r - rows.start)·stride + offset..]` (a chunk's matrix holds several images' columns
/// side by side, and may be built a block of rows at a time).
pub(super) fn unfold<T: KernelFloat>(
    g: &Conv2dGeometry,
    p: &Padded,
    padded: &[T],
    (group, rows): (usize, Range<usize>),
    col: &mut [T],
    [stride, offset]: [usize; 2],
) {
    let [out_h, out_w] = g.output_size;
    let [sh, sw] = g.params.stride;
    let taps = taps(g, p, group).skip(rows.start).take(rows.len());
    for (r, start) in taps.enumerate() {
        let dst = &mut col[r * stride + offset..][..out_h * out_w];
        for (oh, dst) in dst.chunks_mut(out_w).enumerate() {
            let src = &padded[start + oh * sh * p.pitch..];
            if sw == 1 {
                dst.copy_from_slice(&src[..out_w]);
            } else {
                for (d, s) in dst.iter_mut().zip(src.iter().step_by(sw)) {
                    *d = *s;
                }
            }
        }
    }
}

/// All of `group`'s column matrix of one image into `col` (rows of `H_out · W_out`, [`unfold`]
/// with offset 0), in blocks of rows on the pool when `parallel` (a batch too small to fill the
/// pool, whose images run one after another).
pub(super) fn unfold_image<T: KernelFloat>(
    g: &Conv2dGeometry,
    p: &Padded,
    padded: &[T],
    group: usize,
    col: &mut [T],
    parallel: bool,
) {
    let k = g.in_channels / g.params.groups * g.kernel_size[0] * g.kernel_size[1];
    let l = g.output_size[0] * g.output_size[1];
    if !parallel || k == 0 || l == 0 {
        return unfold(g, p, padded, (group, 0..k), col, [l, 0]);
    }
    let block = k.div_ceil(4 * rayon::current_num_threads());
    col[..k * l]
        .par_chunks_mut(block * l)
        .enumerate()
        .for_each(|(b, rows)| {
            let range = b * block..b * block + rows.len() / l;
            unfold(g, p, padded, (group, range), rows, [l, 0]);
        });
}

/// Adds every entry of `group`'s column matrix (laid out as [`unfold`] writes it) onto the
/// padded-gradient element it was read from.
pub(super) fn fold_add<T: KernelFloat>(
    g: &Conv2dGeometry,
    p: &Padded,
    col: &[T],
    group: usize,
    [stride, offset]: [usize; 2],
    padded_grad: &mut [T],
) {
    let [out_h, out_w] = g.output_size;
    let [sh, sw] = g.params.stride;
    for (r, start) in taps(g, p, group).enumerate() {
        let src = &col[r * stride + offset..][..out_h * out_w];
        for (oh, src) in src.chunks(out_w).enumerate() {
            let dst = &mut padded_grad[start + oh * sh * p.pitch..];
            if sw == 1 {
                dst[..out_w].iter_mut().zip(src).for_each(|(d, &s)| *d += s);
            } else {
                for (d, &s) in dst.iter_mut().step_by(sw).zip(src) {
                    *d += s;
                }
            }
        }
    }
}

/// The allocator's size error for a column matrix whose element count overflows `usize`.
pub(super) fn too_large() -> Error {
    Error::Alloc(kiln_alloc_cache::Error::InvalidSize {
        requested: usize::MAX,
        reason: "conv2d's im2col buffer (in_channels/groups * kernel area * output area \
                 elements, or the padded input) overflows usize; use a smaller input or kernel",
    })
}
