//! The CPU max-pooling forward: one rayon task per `(n, c)` plane, a whole plane per tap.
//!
//! Invariants: each plane is first copied into a *frame*, the input surrounded by minus
//! infinity wherever a window reaches past it (padding, and the ragged last window of
//! `ceil_mode`), so every window has all its taps in the frame. The taps are then visited in
//! row-major order, each as one contiguous comparison over every output of the plane; a tap
//! replaces the running maximum only when it is larger or NaN. A minus-infinity tap of the
//! frame never replaces anything, so the maxima, the NaN rule (a later NaN wins) and the tie
//! rule (the earlier tap keeps a tie) are exactly those of visiting only each window's taps
//! inside the input. While comparing, an output records which tap of its window won; a last
//! pass turns that into the input position `h * W + w`, or, when no tap beat minus infinity,
//! the window's first tap inside the input (PyTorch's index for an all minus infinity
//! window). Windows made mostly of padding (a frame more than four times its plane, as a large
//! kernel over a small plane makes) are instead visited tap by tap inside the input, with the
//! same rules, so no geometry the pooling accepts allocates more than a few planes.
//! [`max_pool2d_values`] (no backward will read indices) makes the same comparisons and keeps
//! no winners, so its maxima are those of [`max_pool2d_forward`] bit for bit.

use super::{MaxPool2dGeometry, MaxPool2dParams, PoolShape};
use crate::ops::kernel_error::{check_len, KernelError};
use crate::ops::par;
use crate::ops::simd::{self, simd_dispatch};
use crate::ops::KernelFloat;

/// Where the window of output position `o` starts along `axis` (negative inside the padding).
fn window_start(p: &MaxPool2dParams, axis: usize, o: usize) -> i64 {
    (o * p.stride[axis]) as i64 - p.padding[axis] as i64
}

/// The taps `t` in `0..kernel` for which `start + t * dilation` lies in `0..input`, as a
/// half-open range (empty when none does).
fn tap_range(start: i64, kernel: usize, dilation: usize, input: usize) -> (usize, usize) {
    let d = dilation as i64;
    let lo = if start >= 0 { 0 } else { (-start + d - 1) / d };
    let room = input as i64 - start;
    let hi = if room <= 0 { 0 } else { (room + d - 1) / d };
    let hi = hi.min(kernel as i64).max(0) as usize;
    (lo.min(hi as i64) as usize, hi)
}

simd_dispatch! {
    /// Gathers one tap of every window of a plane into `out`, rows of `out_w`: output row `r`
    /// takes every `stride`-th element of `src` from `r * row_step` (`src` holds every element
    /// read). Compiled for AVX-512F and AVX2 too, where the stride-2 loop (nearly every
    /// strided pooling layer) becomes vector shuffles.
    fn gather_tap[T: Copy](out: &mut [T], out_w: usize, src: &[T], row_step: usize, stride: usize)
        => gather_tap_body[T];
}

#[inline(always)]
fn gather_tap_body<T: Copy>(
    out: &mut [T],
    out_w: usize,
    src: &[T],
    row_step: usize,
    stride: usize,
) {
    for (r, row) in out.chunks_exact_mut(out_w).enumerate() {
        let from = &src[r * row_step..];
        match stride {
            1 => row.copy_from_slice(&from[..out_w]),
            2 => {
                // Pairs of the row's span; the last tap may have no partner.
                let span = &from[..2 * out_w - 1];
                for (t, pair) in row.iter_mut().zip(span.chunks(2)) {
                    *t = pair[0];
                }
            }
            _ => {
                for (t, v) in row.iter_mut().zip(from.iter().step_by(stride)) {
                    *t = *v;
                }
            }
        }
    }
}

simd_dispatch! {
    /// One tap of every window of a plane: `taps[j]` replaces `out[j]` where it is larger or
    /// NaN, and `won[j]` becomes `tap` there. Compiled for AVX-512F and AVX2 too (`simd.rs`;
    /// kiln builds for baseline SSE, where this loop does not vectorise); every path makes the
    /// same comparisons.
    fn max_taps[T: KernelFloat](out: &mut [T], won: &mut [i32], taps: &[T], tap: i32)
        => max_taps_body[T];
}

simd_dispatch! {
    /// [`max_taps`] without the winners: `taps[j]` replaces `out[j]` where it is larger or NaN.
    fn max_values[T: KernelFloat](out: &mut [T], taps: &[T]) => max_values_body[T];
}

#[inline(always)]
fn max_values_body<T: KernelFloat>(out: &mut [T], taps: &[T]) {
    for (out, &v) in out.iter_mut().zip(taps) {
        let better = (v > *out) | v.is_nan();
        *out = if better { v } else { *out };
    }
}

#[inline(always)]
fn max_taps_body<T: KernelFloat>(out: &mut [T], won: &mut [i32], taps: &[T], tap: i32) {
    for ((out, won), &v) in out.iter_mut().zip(won.iter_mut()).zip(taps) {
        // Selected, not branched on: which element is the maximum is data, and branches on
        // it mispredict.
        let better = (v > *out) | v.is_nan();
        *out = if better { v } else { *out };
        *won = if better { tap } else { *won };
    }
}

/// Outputs compared per block of output rows: the block's maxima, winners and gathered tap
/// stay in the first-level cache across the taps.
const BLOCK_OUTPUTS: usize = 1024;

/// The padded copy of a plane that every window of `params` fits in: `rows x cols` elements,
/// input element `(h, w)` at `(h + pad_top) * cols + w + pad_left`.
struct Frame {
    rows: usize,
    cols: usize,
    pad: [usize; 2],
}

impl Frame {
    /// The frame of the windows of `shape` (whose output is not empty); `None` when its size
    /// overflows.
    fn new(p: &MaxPool2dParams, shape: &PoolShape) -> Option<Frame> {
        let span = |axis: usize| {
            (shape.output_size[axis] - 1)
                .checked_mul(p.stride[axis])?
                .checked_add((p.kernel_size[axis] - 1).checked_mul(p.dilation[axis])?)?
                .checked_add(1)
        };
        let (rows, cols) = (span(0)?, span(1)?);
        rows.checked_mul(cols)?;
        Some(Frame {
            rows,
            cols,
            pad: p.padding,
        })
    }

    /// Copies `src` (one input plane of `[in_h, in_w]`) into the frame's interior; the border
    /// keeps the minus infinity it was made with.
    fn fill<T: Copy>(&self, frame: &mut [T], src: &[T], [in_h, in_w]: [usize; 2]) {
        let last_row = in_h.min(self.rows.saturating_sub(self.pad[0]));
        let width = in_w.min(self.cols.saturating_sub(self.pad[1]));
        for h in 0..last_row {
            let at = (h + self.pad[0]) * self.cols + self.pad[1];
            frame[at..at + width].copy_from_slice(&src[h * in_w..][..width]);
        }
    }
}

/// Max pooling: writes each window's maximum to `output` and its position in the input plane
/// (`h * W + w`) to `indices`; NaN wins over numbers, the first maximum wins a tie.
///
/// Shapes: `input` `[N, C, H, W]`, `output` and `indices` `[N, C, H_out, W_out]`.
pub fn max_pool2d_forward<T: KernelFloat>(
    geometry: &MaxPool2dGeometry,
    input: &[T],
    output: &mut [T],
    indices: &mut [i64],
) -> Result<(), KernelError> {
    let shape = geometry.shape.output_shape();
    check_len("max_pool2d", "indices", indices, &shape)?;
    forward(geometry, input, output, Some(indices))
}

/// `max_pool2d` forward without indices, for a pass no backward will follow (`no_grad`, an
/// input that needs no gradient): the maxima of [`max_pool2d_forward`], with no winner kept
/// per output and no `i64` written.
pub fn max_pool2d_values<T: KernelFloat>(
    geometry: &MaxPool2dGeometry,
    input: &[T],
    output: &mut [T],
) -> Result<(), KernelError> {
    forward(geometry, input, output, None)
}

fn forward<T: KernelFloat>(
    geometry: &MaxPool2dGeometry,
    input: &[T],
    output: &mut [T],
    indices: Option<&mut [i64]>,
) -> Result<(), KernelError> {
    const OP: &str = "max_pool2d";
    let shape = &geometry.shape;
    check_len(OP, "input", input, &shape.input_shape())?;
    check_len(OP, "output", output, &shape.output_shape())?;
    let (in_plane, out_plane) = (shape.input_plane(), shape.output_plane());
    if out_plane == 0 || in_plane == 0 {
        return Ok(());
    }
    let p = &geometry.params;
    let taps = p.kernel_size[0].checked_mul(p.kernel_size[1]);
    let frame = Frame::new(p, shape).filter(|f| {
        let small = f.rows * f.cols <= in_plane.saturating_mul(4).saturating_add(FRAME_SLACK);
        small && taps.is_some_and(|t| i32::try_from(t).is_ok())
    });
    match frame {
        Some(frame) => by_frame(geometry, &frame, input, output, indices),
        None => by_window(geometry, input, output, indices),
    }
    Ok(())
}

/// Elements a frame may have beyond four times its plane before [`by_window`] is used instead.
const FRAME_SLACK: usize = 4096;

/// Each output's window, its taps inside the input visited one by one: for windows mostly
/// made of padding (a large kernel over a small plane), whose frame and tap list would
/// dwarf the plane.
fn by_window<T: KernelFloat>(
    geometry: &MaxPool2dGeometry,
    input: &[T],
    output: &mut [T],
    indices: Option<&mut [i64]>,
) {
    let (shape, p) = (&geometry.shape, &geometry.params);
    let ([in_h, in_w], out_w) = (shape.input_size, shape.output_size[1]);
    let (in_plane, out_plane) = (shape.input_plane(), shape.output_plane());
    let each_plane = |_: &mut (), plane: usize, out: &mut [T], mut idx: Option<&mut [i64]>| {
        let src = &input[plane * in_plane..][..in_plane];
        for (o, out) in out.iter_mut().enumerate() {
            let (top, left) = (window_start(p, 0, o / out_w), window_start(p, 1, o % out_w));
            let (h_lo, h_hi) = tap_range(top, p.kernel_size[0], p.dilation[0], in_h);
            let (w_lo, w_hi) = tap_range(left, p.kernel_size[1], p.dilation[1], in_w);
            let at = |th: usize, tw: usize| {
                let h = top + (th * p.dilation[0]) as i64;
                h * in_w as i64 + left + (tw * p.dilation[1]) as i64
            };
            // The geometry guarantees each window a tap inside the input.
            let (mut best, mut best_at) = (T::NEG_INFINITY, at(h_lo, w_lo));
            for th in h_lo..h_hi {
                for tw in w_lo..w_hi {
                    let k = at(th, tw);
                    let v = src[k as usize];
                    if (v > best) | v.is_nan() {
                        (best, best_at) = (v, k);
                    }
                }
            }
            *out = best;
            if let Some(idx) = idx.as_deref_mut() {
                idx[o] = best_at;
            }
        }
    };
    by_plane(output, indices, out_plane, || (), each_plane);
}

/// Runs `each(scratch, plane, out, idx)` for every plane of `output` (and of `indices`, when
/// kept) in parallel, with one `scratch()` per rayon task.
fn by_plane<T: KernelFloat, S>(
    output: &mut [T],
    indices: Option<&mut [i64]>,
    out_plane: usize,
    scratch: impl Fn() -> S + Sync + Send,
    each: impl Fn(&mut S, usize, &mut [T], Option<&mut [i64]>) + Sync + Send,
) {
    match indices {
        Some(indices) => par::chunks_mut_pair_with(
            output,
            out_plane,
            indices,
            out_plane,
            &scratch,
            &|s, plane, out, idx| each(s, plane, out, Some(idx)),
        ),
        None => par::chunks_mut_with(output, out_plane, &scratch, &|s, plane, out| {
            each(s, plane, out, None)
        }),
    }
}

/// Every window inside `frame`, a tap at a time over blocks of outputs (the module's rules).
fn by_frame<T: KernelFloat>(
    geometry: &MaxPool2dGeometry,
    frame: &Frame,
    input: &[T],
    output: &mut [T],
    indices: Option<&mut [i64]>,
) {
    let (shape, p) = (&geometry.shape, &geometry.params);
    let [in_h, in_w] = shape.input_size;
    let [out_h, out_w] = shape.output_size;
    let (in_plane, out_plane) = (shape.input_plane(), shape.output_plane());
    // Each output row's and column's first tap inside the input, for windows no tap won.
    let first = |axis: usize, o: usize, input: usize| {
        let start = window_start(p, axis, o);
        let (lo, _) = tap_range(start, p.kernel_size[axis], p.dilation[axis], input);
        start + (lo * p.dilation[axis]) as i64
    };
    let first_rows: Vec<i64> = (0..out_h).map(|oh| first(0, oh, in_h)).collect();
    let first_cols: Vec<i64> = (0..out_w).map(|ow| first(1, ow, in_w)).collect();
    // Each tap's offset in the frame and in the input plane, in the order the rule visits them.
    let mut taps: Vec<(usize, i64)> = Vec::new();
    for th in 0..p.kernel_size[0] {
        for tw in 0..p.kernel_size[1] {
            let (dh, dw) = (th * p.dilation[0], tw * p.dilation[1]);
            taps.push((dh * frame.cols + dw, (dh * in_w + dw) as i64));
        }
    }
    let block = (BLOCK_OUTPUTS / out_w).max(1) * out_w;
    let row_step = p.stride[0] * frame.cols;
    let isa = simd::isa();
    type Scratch<T> = (Vec<T>, Vec<T>, Vec<i32>);
    let scratch = || -> Scratch<T> {
        let padded = vec![T::NEG_INFINITY; frame.rows * frame.cols];
        (padded, vec![T::NEG_INFINITY; block], vec![-1i32; block])
    };
    let each_plane = |(padded, gathered, won): &mut Scratch<T>,
                      plane: usize,
                      out: &mut [T],
                      mut idx: Option<&mut [i64]>| {
        frame.fill(padded, &input[plane * in_plane..][..in_plane], [in_h, in_w]);
        for (b, out) in out.chunks_mut(block).enumerate() {
            let first_row = b * (block / out_w);
            let (gathered, won) = (&mut gathered[..out.len()], &mut won[..out.len()]);
            out.fill(T::NEG_INFINITY);
            let rows = &padded[first_row * row_step..];
            let Some(idx) = idx.as_deref_mut() else {
                for &(at, _) in &taps {
                    gather_tap(isa, gathered, out_w, &rows[at..], row_step, p.stride[1]);
                    max_values(isa, out, gathered);
                }
                continue;
            };
            won.fill(-1);
            for (t, &(at, _)) in taps.iter().enumerate() {
                gather_tap(isa, gathered, out_w, &rows[at..], row_step, p.stride[1]);
                max_taps(isa, out, won, gathered, t as i32);
            }
            let idx = &mut idx[b * block..][..out.len()];
            let idx_rows = idx.chunks_exact_mut(out_w).zip(won.chunks_exact(out_w));
            for (r, (idx, won)) in idx_rows.enumerate() {
                let oh = first_row + r;
                let top = window_start(p, 0, oh);
                for (ow, (i, &t)) in idx.iter_mut().zip(won).enumerate() {
                    let left = window_start(p, 1, ow);
                    *i = match taps.get(t as usize) {
                        Some(&(_, offset)) if t >= 0 => top * in_w as i64 + left + offset,
                        _ => first_rows[oh] * in_w as i64 + first_cols[ow],
                    };
                }
            }
        }
    };
    by_plane(output, indices, out_plane, scratch, each_plane);
}

#[cfg(test)]
mod tests {
    use super::{
        gather_tap, gather_tap_body, max_pool2d_forward, max_pool2d_values, max_taps,
        max_taps_body, max_values, tap_range,
    };
    use crate::ops::pool::{MaxPool2dGeometry, MaxPool2dParams};
    use crate::ops::simd::{available, isa};

    #[test]
    fn tap_range_matches_brute_force() {
        for start in -4i64..6 {
            for kernel in 1..5 {
                for dilation in 1..4 {
                    for input in 1..6 {
                        let inside: Vec<usize> = (0..kernel)
                            .filter(|&t| {
                                (0..input as i64).contains(&(start + (t * dilation) as i64))
                            })
                            .collect();
                        let (lo, hi) = tap_range(start, kernel, dilation, input);
                        assert_eq!((lo..hi).collect::<Vec<_>>(), inside);
                    }
                }
            }
        }
    }

    /// Every build of the gather (portable, and each instruction set the CPU has) takes the
    /// elements the plain index arithmetic names, for the strides with their own loops and one
    /// without.
    #[test]
    fn gather_tap_takes_every_strideth_element_on_every_instruction_set() {
        let src: Vec<f32> = (0..400).map(|i| i as f32).collect();
        let (out_w, rows, row_step) = (7, 5, 31);
        for stride in [1, 2, 3] {
            let want: Vec<f32> = (0..rows)
                .flat_map(|r| (0..out_w).map(move |j| (r * row_step + j * stride) as f32))
                .collect();
            // The source ends at the last element read.
            let src = &src[..(rows - 1) * row_step + (out_w - 1) * stride + 1];
            let mut got = vec![0f32; rows * out_w];
            gather_tap_body(&mut got, out_w, src, row_step, stride);
            assert_eq!(got, want, "portable, stride {stride}");
            for each in available() {
                let mut got = vec![0f32; rows * out_w];
                gather_tap(Some(each), &mut got, out_w, src, row_step, stride);
                assert_eq!(got, want, "{each:?}, stride {stride}");
            }
        }
    }

    /// Values with ties, NaNs and minus infinities (a xorshift stream).
    fn awkward_values(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                match x % 11 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 => 0.5,
                    _ => (x % 7) as f32,
                }
            })
            .collect()
    }

    /// The tap loop gives the same maxima and winners on every instruction set the CPU has:
    /// NaN wins (the later NaN too, as PyTorch's kernel), a tie keeps the earlier tap.
    #[test]
    fn max_taps_is_the_same_on_every_instruction_set() {
        let n = 203;
        let rows: Vec<Vec<f32>> = (0..9).map(|r| awkward_values(n, 7 + r)).collect();
        type Taps = Box<dyn Fn(&mut [f32], &mut [i32], &[f32], i32)>;
        let mut paths: Vec<(String, Taps)> = vec![
            ("baseline".into(), Box::new(max_taps_body)),
            (
                "dispatched".into(),
                Box::new(|o, w, t, k| max_taps(isa(), o, w, t, k)),
            ),
        ];
        for each in available() {
            paths.push((
                format!("{each:?}"),
                Box::new(move |o, w, t, k| max_taps(Some(each), o, w, t, k)),
            ));
        }
        let results: Vec<(Vec<u32>, Vec<i32>)> = paths
            .iter()
            .map(|(_, taps)| {
                let mut out = vec![f32::NEG_INFINITY; n];
                let mut won = vec![-1i32; n];
                for (r, row) in rows.iter().enumerate() {
                    taps(&mut out, &mut won, row, r as i32);
                }
                (out.iter().map(|v| v.to_bits()).collect(), won)
            })
            .collect();
        for ((name, _), r) in paths.iter().zip(&results) {
            assert_eq!(r, &results[0], "{name}");
        }
        // Without winners, every path keeps the same maxima.
        for each in std::iter::once(None).chain(available().into_iter().map(Some)) {
            let mut out = vec![f32::NEG_INFINITY; n];
            for row in &rows {
                max_values(each, &mut out, row);
            }
            let bits: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
            assert_eq!(bits, results[0].0, "{each:?} without winners");
        }
        // The rules themselves, on the baseline: a column's winner is the last NaN's row, else
        // the first row holding the column's maximum, else (all minus infinity) none.
        let (out, won) = &results[0];
        for j in 0..n {
            let col: Vec<f32> = rows.iter().map(|row| row[j]).collect();
            let want = match col.iter().rposition(|v| v.is_nan()) {
                Some(r) => Some(r),
                None => {
                    let max = col.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    col.iter().position(|&v| v == max && v > f32::NEG_INFINITY)
                }
            };
            assert_eq!(won[j], want.map_or(-1, |r| r as i32), "column {j}");
            let value = want.map_or(f32::NEG_INFINITY, |r| col[r]);
            assert_eq!(out[j], value.to_bits(), "column {j}");
        }
    }

    /// Each window's taps inside the input, visited in row-major order, as the rule reads.
    fn reference(g: &MaxPool2dGeometry, input: &[f32]) -> (Vec<u32>, Vec<i64>) {
        let p = &g.params;
        let ([in_h, in_w], [out_h, out_w]) = (g.shape.input_size, g.shape.output_size);
        let (mut out, mut idx) = (Vec::new(), Vec::new());
        for plane in input.chunks(in_h * in_w) {
            for oh in 0..out_h {
                for ow in 0..out_w {
                    let (mut best, mut at) = (f32::NEG_INFINITY, None);
                    for th in 0..p.kernel_size[0] {
                        for tw in 0..p.kernel_size[1] {
                            let h = (oh * p.stride[0] + th * p.dilation[0]) as i64
                                - p.padding[0] as i64;
                            let w = (ow * p.stride[1] + tw * p.dilation[1]) as i64
                                - p.padding[1] as i64;
                            if h < 0 || w < 0 || h >= in_h as i64 || w >= in_w as i64 {
                                continue;
                            }
                            let k = h * in_w as i64 + w;
                            let v = plane[k as usize];
                            at = at.or(Some(k));
                            if v > best || v.is_nan() {
                                (best, at) = (v, Some(k));
                            }
                        }
                    }
                    out.push(best.to_bits());
                    idx.push(at.expect("every window has a tap inside the input"));
                }
            }
        }
        (out, idx)
    }

    /// The whole-plane kernel gives the reference's maxima and indices, bit for bit, over
    /// padding, strides, dilation, ceil mode and rectangular windows, with NaNs, ties and
    /// windows of minus infinity only.
    #[test]
    fn forward_matches_visiting_each_windows_taps() {
        // Plane size, then kernel, stride, padding and dilation, then ceil mode.
        type Case = (
            [usize; 2],
            [usize; 2],
            [usize; 2],
            [usize; 2],
            [usize; 2],
            bool,
        );
        let cases: [Case; 11] = [
            ([12, 11], [3, 3], [2, 2], [1, 1], [1, 1], false),
            ([12, 11], [3, 3], [2, 2], [1, 1], [1, 1], true),
            ([9, 10], [2, 2], [2, 2], [0, 0], [1, 1], false),
            ([9, 13], [3, 2], [1, 3], [1, 1], [2, 1], true),
            ([7, 7], [3, 3], [3, 3], [1, 1], [1, 2], true),
            ([5, 8], [1, 1], [1, 1], [0, 0], [1, 1], false),
            ([16, 3], [4, 3], [2, 1], [2, 1], [1, 1], false),
            // Windows mostly of padding: the first is visited tap by tap (a frame would be
            // over four times its plane), the second still through a frame.
            ([2, 3], [101, 61], [1, 2], [50, 30], [1, 1], false),
            ([3, 2], [41, 41], [3, 1], [20, 20], [1, 1], true),
            // Output planes of several blocks of `BLOCK_OUTPUTS`: ResNet's stem pooling, and a
            // width that does not divide the block.
            ([112, 112], [3, 3], [2, 2], [1, 1], [1, 1], false),
            ([40, 130], [3, 3], [1, 1], [1, 1], [1, 1], true),
        ];
        for (k, (size, kernel, stride, padding, dilation, ceil_mode)) in cases.iter().enumerate() {
            let params = MaxPool2dParams {
                kernel_size: *kernel,
                stride: *stride,
                padding: *padding,
                dilation: *dilation,
                ceil_mode: *ceil_mode,
            };
            let g = MaxPool2dGeometry::new([2, 3, size[0], size[1]], params).unwrap();
            if k >= 9 {
                assert!(
                    g.shape.output_plane() > 2 * super::BLOCK_OUTPUTS,
                    "case {k} spans blocks"
                );
            }
            let mut input = awkward_values(6 * size[0] * size[1], 11 + k as u32);
            // One plane of minus infinity only: indices are the windows' first taps.
            let plane = size[0] * size[1];
            input[plane..2 * plane].fill(f32::NEG_INFINITY);
            let n = g.shape.output_shape().iter().product();
            let (mut out, mut idx) = (vec![0f32; n], vec![0i64; n]);
            max_pool2d_forward(&g, &input, &mut out, &mut idx).unwrap();
            let got = (out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), idx);
            assert_eq!(got, reference(&g, &input), "case {k}");
            // Without indices: the same maxima, bit for bit.
            let mut values = vec![7.5f32; n];
            max_pool2d_values(&g, &input, &mut values).unwrap();
            let values: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
            assert_eq!(values, got.0, "case {k} without indices");
        }
    }

    /// A window of 40001 x 40001 taps over a one-element plane (valid: padding at most half the
    /// kernel) is that element, at once, without a frame of 1.6e9 elements.
    #[test]
    fn a_huge_window_over_a_tiny_plane_reads_only_the_plane() {
        let params = MaxPool2dParams {
            kernel_size: [40001, 40001],
            stride: [1, 1],
            padding: [20000, 20000],
            dilation: [1, 1],
            ceil_mode: false,
        };
        let g = MaxPool2dGeometry::new([1, 2, 1, 1], params).unwrap();
        assert_eq!(g.shape.output_size, [1, 1]);
        let (mut out, mut idx) = (vec![0f32; 2], vec![7i64; 2]);
        max_pool2d_forward(&g, &[-3.0, f32::NEG_INFINITY], &mut out, &mut idx).unwrap();
        assert_eq!((out, idx), (vec![-3.0, f32::NEG_INFINITY], vec![0, 0]));
    }
}
