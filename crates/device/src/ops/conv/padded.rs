//! The zero-bordered image every CPU conv path unfolds from and folds back into, so the column
//! matrix is built (and scattered back) with plain copies and adds, without a bounds check per
//! element.
//!
//! Layout, stride 1: per channel, `Hp = H + 2·pad_h` rows of pitch `P = W + pad_w`; an interior
//! row holds `pad_w` zeros, then the `W` values; the `pad_h` rows above and below are zero; after
//! the last channel come `max(pad_w, dil_w·(kW - 1))` zeros of slack. One zero run serves as a
//! row's right padding and as the next row's left padding: padded column `x` (`0 <= x < W +
//! 2·pad_w`) of padded row `r` sits at `r·P + x` whether or not `x >= P`, since a read past a
//! row's end lands in the next row's (or channel's, or the slack's) leading zeros. So tap
//! `(c, i, j)` at output `(oh, ow)` reads `c·Hp·P + (oh + i·dil_h)·P + ow + j·dil_w`.
//!
//! Layout, stride `(s_h, s_w)` other than 1: the padded image split into its `s_h·s_w` phases
//! (polyphase form). Per channel, phase `(a, b)` is a plane of `ceil(Hp / s_h)` rows of pitch
//! `P = ceil((W + 2·pad_w) / s_w)` whose element `(y, x)` is padded pixel `(y·s_h + a, x·s_w +
//! b)` (zero outside the image and past the padded edge); the phases follow each other in
//! order `a·s_w + b`, and the same slack closes the buffer. Tap `(c, i, j)` at output `(oh, ow)`
//! reads padded pixel `(oh·s_h + i·dil_h, ow·s_w + j·dil_w)`, which is element `(oh + i·dil_h /
//! s_h, ow + j·dil_w / s_w)` of phase `(i·dil_h % s_h, j·dil_w % s_w)`: in either layout an
//! output row of one tap is `W_out` consecutive elements, and output rows are `P` apart.
//!
//! Invariants: [`Padded::fill_on`] writes every element of the buffer; [`unfold`] writes every
//! entry of its column-matrix rows; [`fold_add_on`] only adds, so the padded gradient must start
//! at zero, and [`Padded::unpad_on`] then reads its interior (what lands on padding is dropped).
//! [`taps`] plus `oh·P + ow` is the only addressing any path uses.

use super::pieces::for_each_piece;
use super::Conv2dGeometry;
use crate::ops::KernelFloat;
use crate::{Error, Result};
use std::ops::Range;

/// The padded-image sizes of one convolution.
#[derive(Clone, Copy)]
pub(super) struct Padded {
    channels: usize,
    h: usize,
    w: usize,
    pad: [usize; 2],
    /// The convolution's stride: `[1, 1]` is the plain layout, anything else the phases.
    stride: [usize; 2],
    /// Row pitch: `W + pad_w` (stride 1) or `ceil((W + 2·pad_w) / s_w)` (phases).
    pub(super) pitch: usize,
    /// Elements of one phase plane (the whole channel at stride 1).
    phase_plane: usize,
    /// Elements of one channel: every phase plane.
    plane: usize,
    /// Elements of the buffer, slack included.
    pub(super) len: usize,
}

impl Padded {
    /// The sizes for `g`, or the allocator's size error when they overflow `usize`.
    pub(super) fn new(g: &Conv2dGeometry) -> Result<Self> {
        let [h, w] = g.input_size;
        let pad = g.params.padding;
        let stride = g.params.stride;
        let slack = pad[1].max(g.params.dilation[1] * (g.kernel_size[1] - 1));
        let sizes = || {
            let padded_h = pad[0].checked_mul(2)?.checked_add(h)?;
            let (rows, pitch) = if stride == [1, 1] {
                (padded_h, w.checked_add(pad[1])?)
            } else {
                let padded_w = pad[1].checked_mul(2)?.checked_add(w)?;
                (padded_h.div_ceil(stride[0]), padded_w.div_ceil(stride[1]))
            };
            let phase_plane = rows.checked_mul(pitch)?;
            let plane = phase_plane.checked_mul(stride[0].checked_mul(stride[1])?)?;
            let len = g.in_channels.checked_mul(plane)?.checked_add(slack)?;
            Some((pitch, phase_plane, plane, len))
        };
        let (pitch, phase_plane, plane, len) = sizes().ok_or_else(too_large)?;
        Ok(Self {
            channels: g.in_channels,
            h,
            w,
            pad,
            stride,
            pitch,
            phase_plane,
            plane,
            len,
        })
    }

    /// Elements of one unpadded image `[C_in, H, W]`.
    pub(super) fn image_len(&self) -> usize {
        self.channels * self.h * self.w
    }

    /// Which elements `x0..x1` of a row of column phase `b` hold values (image columns
    /// `x·s_w + b - pad_w`), and the image column of the first (meaningless when none do).
    fn phase_span(&self, b: usize) -> (Range<usize>, usize) {
        let (sw, pw) = (self.stride[1], self.pad[1]);
        // Elements x with pw <= x·sw + b < pw + W.
        let x1 = (pw + self.w).saturating_sub(b).div_ceil(sw).min(self.pitch);
        let x0 = pw.saturating_sub(b).div_ceil(sw).min(x1);
        (x0..x1, (x0 * sw + b).saturating_sub(pw))
    }

    /// Calls `row(values, image_row, at)` for every row of every phase plane of one channel, in
    /// layout order: `at` is where the row starts in the channel's plane, `values` which of its
    /// elements hold image values ([`Self::phase_span`]) and `image_row` where the first of them
    /// is in the channel's image plane (`None` for a row of zeros).
    fn each_phase_row(&self, mut row: impl FnMut(Range<usize>, Option<usize>, usize)) {
        let ([sh, sw], ph) = (self.stride, self.pad[0]);
        let rows = self.phase_plane / self.pitch.max(1);
        let mut at = 0;
        for phase in 0..sh * sw {
            let (a, b) = (phase / sw, phase % sw);
            let (values, first) = self.phase_span(b);
            for y in 0..rows {
                let padded_row = y * sh + a;
                let shown = padded_row >= ph && padded_row - ph < self.h && !values.is_empty();
                let image_row = shown.then(|| (padded_row - ph) * self.w + first);
                row(values.clone(), image_row, at);
                at += self.pitch;
            }
        }
    }

    /// Copies one image `[C_in, H, W]` into `padded` (`len` elements), zeros around it; its
    /// channels on the pool when `parallel` (an image or chunk whose other work is spread over
    /// the pool too).
    pub(super) fn fill_on<T: KernelFloat>(&self, image: &[T], padded: &mut [T], parallel: bool) {
        let body = self.channels * self.plane;
        let (planes, slack) = padded[..self.len].split_at_mut(body);
        slack.fill(T::ZERO);
        if self.h * self.w == 0 {
            planes.fill(T::ZERO);
        } else {
            for_each_piece(planes, self.plane, parallel, |c, plane| {
                self.fill_channel(c, image, plane)
            });
        }
    }

    /// Channel `c` of [`Self::fill_on`]: its `plane` elements (every phase plane) from the image.
    fn fill_channel<T: KernelFloat>(&self, c: usize, image: &[T], dst: &mut [T]) {
        let source = &image[c * self.h * self.w..][..self.h * self.w];
        if self.stride == [1, 1] {
            let [ph, pw] = self.pad;
            let interior = ph * self.pitch..(ph + self.h) * self.pitch;
            dst[..interior.start].fill(T::ZERO);
            dst[interior.end..].fill(T::ZERO);
            let rows = &mut dst[interior];
            for row in rows.chunks_mut(self.pitch) {
                row[..pw].fill(T::ZERO);
            }
            copy_rows(
                (&mut rows[pw..], self.pitch),
                (source, self.w),
                self.w,
                self.h,
            );
            return;
        }
        let sw = self.stride[1];
        self.each_phase_row(|values, image_row, at| {
            let row = &mut dst[at..][..self.pitch];
            let Some(start) = image_row else {
                row.fill(T::ZERO);
                return;
            };
            row[..values.start].fill(T::ZERO);
            row[values.end..].fill(T::ZERO);
            let src = &source[start..];
            for (k, d) in row[values].iter_mut().enumerate() {
                *d = src[k * sw];
            }
        });
    }

    /// Copies the interior of a padded buffer back into one image `[C_in, H, W]`, its channels
    /// on the pool when `parallel` (as [`Self::fill_on`]).
    pub(super) fn unpad_on<T: KernelFloat>(&self, padded: &[T], image: &mut [T], parallel: bool) {
        let plane_len = self.h * self.w;
        if plane_len == 0 {
            return;
        }
        let image = &mut image[..self.channels * plane_len];
        for_each_piece(image, plane_len, parallel, |c, dst| {
            self.unpad_channel(&padded[c * self.plane..][..self.plane], dst)
        });
    }

    /// One channel of [`Self::unpad_on`]: its padded `plane` into its image plane `dst`.
    fn unpad_channel<T: KernelFloat>(&self, plane: &[T], dst: &mut [T]) {
        if self.stride == [1, 1] {
            let [ph, pw] = self.pad;
            let src = &plane[ph * self.pitch + pw..];
            copy_rows((dst, self.w), (src, self.pitch), self.w, self.h);
            return;
        }
        let sw = self.stride[1];
        self.each_phase_row(|values, image_row, at| {
            if let Some(start) = image_row {
                let dst = &mut dst[start..];
                for (k, &s) in plane[at + values.start..at + values.end].iter().enumerate() {
                    dst[k * sw] = s;
                }
            }
        });
    }
}

/// Where tap `(c, i, j)` of `group` starts reading (output `(0, 0)`), for each row of the
/// group's column matrix in order (`r = (c·kH + i)·kW + j`). Output `(oh, ow)` of the tap is
/// `oh·P + ow` further on.
pub(super) fn taps(g: &Conv2dGeometry, p: &Padded, group: usize) -> impl Iterator<Item = usize> {
    let [kh, kw] = g.kernel_size;
    let [dh, dw] = g.params.dilation;
    let [sh, sw] = p.stride;
    let channels = g.in_channels / g.params.groups;
    let (pitch, phase_plane, plane) = (p.pitch, p.phase_plane, p.plane);
    (group * channels..(group + 1) * channels).flat_map(move |c| {
        (0..kh).flat_map(move |i| {
            let (a, y) = ((i * dh) % sh, (i * dh) / sh);
            (0..kw).map(move |j| {
                let (b, x) = ((j * dw) % sw, (j * dw) / sw);
                c * plane + (a * sw + b) * phase_plane + y * pitch + x
            })
        })
    })
}

/// Writes rows `rows` of `group`'s column matrix (`C_in/groups · kH · kW` rows of
/// `H_out · W_out` entries) from a padded image into `col`: row `r` at
/// `col[(r - rows.start)·stride + offset..]` (a chunk's matrix holds several images' columns
/// side by side, and may be built a block of rows at a time). Each output row is one copy.
pub(super) fn unfold<T: KernelFloat>(
    g: &Conv2dGeometry,
    p: &Padded,
    padded: &[T],
    (group, rows): (usize, Range<usize>),
    col: &mut [T],
    [stride, offset]: [usize; 2],
) {
    let [out_h, out_w] = g.output_size;
    let taps = taps(g, p, group).skip(rows.start).take(rows.len());
    for (r, start) in taps.enumerate() {
        let dst = &mut col[r * stride + offset..][..out_h * out_w];
        copy_rows((dst, out_w), (&padded[start..], p.pitch), out_w, out_h);
    }
}

/// All of `group`'s column matrix of one image into `col` ([`unfold`]: row `r` starts at
/// `r · stride + offset`), in blocks of rows on the pool when `parallel` (an image or chunk
/// that runs alone: a batch too small to fill the pool, or the images past its whole rounds;
/// four blocks per thread, so that uneven rows still balance).
pub(super) fn unfold_on<T: KernelFloat>(
    (g, p): (&Conv2dGeometry, &Padded),
    padded: &[T],
    group: usize,
    col: &mut [T],
    [stride, offset]: [usize; 2],
    parallel: bool,
) {
    let k = g.in_channels / g.params.groups * g.kernel_size[0] * g.kernel_size[1];
    if k == 0 || stride == 0 {
        return;
    }
    let block = match parallel {
        true => k.div_ceil(4 * rayon::current_num_threads()),
        false => k,
    };
    for_each_piece(
        &mut col[..k * stride],
        block * stride,
        parallel,
        |b, rows| {
            let range = b * block..b * block + rows.len() / stride;
            unfold(g, p, padded, (group, range), rows, [stride, offset]);
        },
    );
}

/// Adds every entry of `group`'s column matrix (laid out as [`unfold`] writes it) onto the
/// padded-gradient element it was read from, the group's channels on the pool when `parallel`
/// (a batch smaller than the pool, whose images run one after another). A tap's row of outputs
/// can run past its channel's plane only onto the next channel's padding (the zero runs the
/// layout shares between rows), which [`Padded::unpad_on`] drops: each channel leaves those
/// adds out, so the channels' planes are disjoint, and every element `unpad_on` reads gets the
/// adds of its channel's taps in order.
pub(super) fn fold_add_on<T: KernelFloat>(
    (g, p): (&Conv2dGeometry, &Padded),
    col: &[T],
    group: usize,
    [stride, offset]: [usize; 2],
    padded_grad: &mut [T],
    parallel: bool,
) {
    let [out_h, out_w] = g.output_size;
    let channels = g.in_channels / g.params.groups;
    let per_channel = g.kernel_size[0] * g.kernel_size[1];
    let first = group * channels * p.plane;
    // Where each tap of a channel starts inside the channel's plane: the same for every channel.
    let starts: Vec<usize> = taps(g, p, group)
        .take(per_channel)
        .map(|start| start - first)
        .collect();
    let planes = &mut padded_grad[first..][..channels * p.plane];
    for_each_piece(planes, p.plane, parallel, |c, plane| {
        for (j, &start) in starts.iter().enumerate() {
            let r = c * per_channel + j;
            let src = &col[r * stride + offset..][..out_h * out_w];
            for (oh, src) in src.chunks(out_w.max(1)).enumerate() {
                let len = plane.len();
                let at = (start + oh * p.pitch).min(len);
                add_row(&mut plane[at..][..src.len().min(len - at)], src);
            }
        }
    });
}

/// `dst += src` element by element (`dst` may be the shorter). The rows of ResNet's deep
/// stages on small images (4 and 8 outputs wide) take fixed-size forms that compile to a few
/// whole-vector adds; a general loop runs them as scalar adds.
#[inline(always)]
fn add_row<T: KernelFloat>(dst: &mut [T], src: &[T]) {
    #[inline(always)]
    fn fixed<T: KernelFloat, const N: usize>(dst: &mut [T], src: &[T]) -> bool {
        let (Ok(dst), Ok(src)) = (<&mut [T; N]>::try_from(dst), <&[T; N]>::try_from(src)) else {
            return false;
        };
        let mut sum = *dst;
        for i in 0..N {
            sum[i] += src[i];
        }
        *dst = sum;
        true
    }
    if !(fixed::<T, 4>(dst, src) || fixed::<T, 8>(dst, src)) {
        dst.iter_mut().zip(src).for_each(|(d, &s)| *d += s);
    }
}

/// Copies `rows` rows of `width` elements, row `i` from `src[i * src_pitch..]` to
/// `dst[i * dst_pitch..]`. Rows of ResNet's deep stages (4, 7, 8, 14 and 16 elements wide) run
/// in loops of fixed-size copies that compile to a few whole-vector moves; `copy_from_slice`
/// calls `memcpy` for a length known only at run time, and for rows this short the call costs
/// more than the move (it was a fifth of a 64-channel 8x8 convolution's forward at batch 128).
/// One loop per width: a single loop choosing among fixed sizes per row was compiled back into
/// one `memcpy` of a chosen length.
#[inline(always)]
pub(super) fn copy_rows<T: Copy>(
    (dst, dst_pitch): (&mut [T], usize),
    (src, src_pitch): (&[T], usize),
    width: usize,
    rows: usize,
) {
    #[inline(always)]
    fn fixed<T: Copy, const W: usize>(
        (dst, dst_pitch): (&mut [T], usize),
        (src, src_pitch): (&[T], usize),
        rows: usize,
    ) {
        for i in 0..rows {
            let d = <&mut [T; W]>::try_from(&mut dst[i * dst_pitch..][..W]);
            let s = <&[T; W]>::try_from(&src[i * src_pitch..][..W]);
            // Both are exactly `W` long (sliced so): the conversions cannot fail.
            if let (Ok(d), Ok(s)) = (d, s) {
                *d = *s;
            }
        }
    }
    let (d, s) = ((dst, dst_pitch), (src, src_pitch));
    match width {
        4 => fixed::<T, 4>(d, s, rows),
        7 => fixed::<T, 7>(d, s, rows),
        8 => fixed::<T, 8>(d, s, rows),
        14 => fixed::<T, 14>(d, s, rows),
        16 => fixed::<T, 16>(d, s, rows),
        _ => {
            for i in 0..rows {
                d.0[i * dst_pitch..][..width].copy_from_slice(&s.0[i * src_pitch..][..width]);
            }
        }
    }
}

/// Zeroes `buffer` (a padded gradient before [`fold_add_on`]), in parallel pieces when
/// `parallel`.
pub(super) fn zero_on<T: KernelFloat>(buffer: &mut [T], parallel: bool) {
    let piece = match parallel {
        true => buffer.len().div_ceil(rayon::current_num_threads().max(1)),
        false => buffer.len(),
    };
    for_each_piece(buffer, piece, parallel, |_, b| b.fill(T::ZERO));
}

/// The allocator's size error for a column matrix whose element count overflows `usize`.
pub(super) fn too_large() -> Error {
    Error::Alloc(kiln_alloc_cache::Error::InvalidSize {
        requested: usize::MAX,
        reason: "conv2d's im2col buffer (in_channels/groups * kernel area * output area \
                 elements, or the padded input) overflows usize; use a smaller input or kernel",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv::Conv2dParams;

    /// Every element of the layout, at stride 1 and over phases (strides up to 3, uneven ones,
    /// padding wider than a phase, an image narrower than the stride): `fill` writes the padded
    /// pixel the module doc's addressing names (the image value, or zero), zeros the rest and
    /// the slack, and `unpad` gives the image back; filled channel by channel on a pool of three
    /// threads (`fill_on`, as a batch smaller than the pool does), the same.
    #[test]
    fn fill_writes_every_padded_pixel_where_taps_read_it() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let cases = [
            ([2, 5, 7], [3, 3], [1, 1], [1, 1]),
            ([2, 5, 7], [3, 3], [2, 2], [1, 1]),
            ([3, 9, 11], [7, 7], [2, 2], [3, 3]),
            ([1, 8, 10], [3, 5], [3, 2], [0, 2]),
            ([2, 4, 1], [3, 3], [2, 3], [2, 1]),
            ([1, 6, 6], [1, 1], [2, 2], [0, 0]),
        ];
        let each_fill = cases.iter().flat_map(|case| [(case, false), (case, true)]);
        for (&([c_in, h, w], kernel, stride, padding), parallel) in each_fill {
            let params = Conv2dParams {
                stride,
                padding,
                ..Conv2dParams::default()
            };
            let g = Conv2dGeometry::new([1, c_in, h, w], [1, c_in, kernel[0], kernel[1]], params)
                .unwrap();
            let p = Padded::new(&g).unwrap();
            let image: Vec<f64> = (0..p.image_len()).map(|i| i as f64 + 1.0).collect();
            let mut padded = vec![f64::NAN; p.len];
            pool.install(|| p.fill_on(&image, &mut padded, parallel));
            let mut seen = vec![false; p.len];
            let [sh, sw] = stride;
            let [ph, pw] = padding;
            for c in 0..c_in {
                for y in 0..h + 2 * ph {
                    for x in 0..w + 2 * pw {
                        let at = if stride == [1, 1] {
                            c * p.plane + y * p.pitch + x
                        } else {
                            let phase = (y % sh) * sw + x % sw;
                            c * p.plane + phase * p.phase_plane + y / sh * p.pitch + x / sw
                        };
                        let inside = (ph..ph + h).contains(&y) && (pw..pw + w).contains(&x);
                        let want = if inside {
                            image[(c * h + y - ph) * w + x - pw]
                        } else {
                            0.0
                        };
                        let what =
                            format!("{g:?} ({parallel}): channel {c}, padded pixel ({y}, {x})");
                        assert_eq!(padded[at], want, "{what}");
                        seen[at] = true;
                    }
                }
            }
            for (i, v) in padded.iter().enumerate() {
                assert!(seen[i] || *v == 0.0, "{g:?}: element {i} is {v}, not zero");
            }
            let mut back = vec![f64::NAN; image.len()];
            pool.install(|| p.unpad_on(&padded, &mut back, parallel));
            assert_eq!(
                back, image,
                "{g:?} ({parallel}): unpad gives the image back"
            );
        }
    }

    /// Folded channel by channel (`fold_add_on`), in order and on a pool of three (as a batch
    /// smaller than the pool does), every element `unpad` reads gets the plain fold's bits:
    /// stride 1 with rows that run past their channel's plane, phases, an uneven stride and
    /// padding, two groups, a 1x1 stride-2 kernel.
    #[test]
    fn a_fold_on_the_pool_gives_unpad_the_serial_folds_bits() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let cases = [
            ([2, 5, 7], [3, 3], [1, 1], [1, 1], 1),
            ([2, 5, 7], [3, 3], [2, 2], [1, 1], 1),
            ([3, 9, 11], [7, 7], [2, 2], [3, 3], 1),
            ([1, 8, 10], [3, 5], [3, 2], [0, 2], 1),
            ([4, 6, 6], [3, 3], [1, 1], [2, 2], 2),
            ([4, 8, 8], [1, 1], [2, 2], [0, 0], 2),
        ];
        for ([c_in, h, w], kernel, stride, padding, groups) in cases {
            let params = Conv2dParams {
                stride,
                padding,
                groups,
                ..Conv2dParams::default()
            };
            let weight = [groups, c_in / groups, kernel[0], kernel[1]];
            let g = Conv2dGeometry::new([1, c_in, h, w], weight, params).unwrap();
            let p = Padded::new(&g).unwrap();
            let (rows, cols) = (g.col_rows(), g.col_cols());
            // Sums of these in another order would round differently.
            let col: Vec<f32> = (0..rows * cols)
                .map(|i| (i * 7919 % 1000) as f32 * 1.37e-3 - 0.5)
                .collect();
            let mut serial = vec![0.0f32; p.len];
            let mut by_channel = [vec![0.0f32; p.len], vec![0.0f32; p.len]];
            for group in 0..groups {
                // The plain fold: every tap's rows added in order, spills onto the next
                // channel's padding included.
                for (r, start) in taps(&g, &p, group).enumerate() {
                    let src = &col[r * cols..][..cols];
                    for (oh, src) in src.chunks(g.output_size[1]).enumerate() {
                        let dst = &mut serial[start + oh * p.pitch..][..src.len()];
                        dst.iter_mut().zip(src).for_each(|(d, &s)| *d += s);
                    }
                }
                for (folded, parallel) in by_channel.iter_mut().zip([false, true]) {
                    let at = [cols, 0];
                    pool.install(|| fold_add_on((&g, &p), &col, group, at, folded, parallel));
                }
            }
            let mut want = vec![f32::NAN; p.image_len()];
            p.unpad_on(&serial, &mut want, false);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for (folded, parallel) in by_channel.iter().zip([false, true]) {
                let mut got = vec![0.0; p.image_len()];
                p.unpad_on(folded, &mut got, false);
                assert_eq!(bits(&got), bits(&want), "{g:?}, on the pool: {parallel}");
            }
            assert!(want.iter().all(|x| x.is_finite()) && want.iter().any(|&x| x != 0.0));
        }
    }

    /// Every width with a fixed-size loop (4, 7, 8, 14, 16), its neighbours and the general
    /// loop, with pitches wider than the row on either side: each row lands at its place and
    /// nothing between rows is written.
    #[test]
    fn copy_rows_moves_each_row_and_nothing_between() {
        for width in 0..=18 {
            for (dst_pitch, src_pitch, rows) in [(width, width + 3, 5), (width + 2, width, 4)] {
                let src: Vec<f32> = (0..src_pitch * rows + width).map(|i| i as f32).collect();
                let mut dst = vec![-1.0f32; dst_pitch * rows + width];
                copy_rows((&mut dst, dst_pitch), (&src, src_pitch), width, rows);
                for (i, &d) in dst.iter().enumerate() {
                    let (row, x) = (i / dst_pitch.max(1), i % dst_pitch.max(1));
                    let want = match row < rows && x < width {
                        true => src[row * src_pitch + x],
                        false => -1.0,
                    };
                    assert_eq!(
                        d, want,
                        "width {width}, pitches {dst_pitch}/{src_pitch}, at {i}"
                    );
                }
            }
        }
    }
}
