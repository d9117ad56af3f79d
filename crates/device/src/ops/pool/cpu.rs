//! CPU pooling kernels: one rayon task per `(n, c)` plane, forward and backward.
//!
//! Every plane of the input maps to one plane of the output, and backward writes only the
//! plane it reads indices or windows for, so planes never share an output element and the
//! kernels need no atomics. Backward kernels overwrite the input gradient (zero it, then add
//! each output gradient onto its window), never accumulate into what was there; so every
//! kernel writes its whole output, which is taken unfilled.

use super::{Pool2d, PoolOps};
use crate::ops::cpu_dispatch::{dense, float_kernel, for_overwrite, in_pool, wrap};
use crate::seam::Strided;
use crate::{CpuStorage, Error, Layout, Result};
use rayon::prelude::*;

use super::{AdaptiveAvgPool2dGeometry, AvgPool2dGeometry, MaxPool2dGeometry, PoolShape};
use crate::ops::kernel_error::{check_len, KernelError};
use crate::ops::simd::{self, simd_dispatch};
use crate::ops::KernelFloat;

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

/// Checks the lengths of the input-side and output-side buffers of a pooling call.
fn check_pool_buffers<T>(
    op: &'static str,
    shape: &PoolShape,
    input_name: &'static str,
    input: &[T],
    output_name: &'static str,
    output: &[T],
) -> Result<(), KernelError> {
    check_len(op, input_name, input, &shape.input_shape())?;
    check_len(op, output_name, output, &shape.output_shape())
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
    const OP: &str = "max_pool2d";
    let shape = &geometry.shape;
    check_pool_buffers(OP, shape, "input", input, "output", output)?;
    check_len(OP, "indices", indices, &shape.output_shape())?;
    let p = &geometry.params;
    let [in_h, in_w] = shape.input_size;
    let [out_h, out_w] = shape.output_size;
    let (in_plane, out_plane) = (shape.input_plane(), shape.output_plane());
    // Each output column's window start and in-image tap range, computed once for every row
    // and plane (no division or clipping per output element).
    let columns: Vec<(i64, usize, usize)> = (0..out_w)
        .map(|ow| {
            let start = (ow * p.stride[1]) as i64 - p.padding[1] as i64;
            let (lo, hi) = tap_range(start, p.kernel_size[1], p.dilation[1], in_w);
            (start, lo, hi)
        })
        .collect();
    // The columns whose window has every tap inside the row: one contiguous range.
    let is_full = |c: &(i64, usize, usize)| c.1 == 0 && c.2 == p.kernel_size[1];
    let full_lo = columns.iter().position(is_full).unwrap_or(out_w);
    let full_len = columns[full_lo..].iter().take_while(|c| is_full(c)).count();
    let full = full_lo..full_lo + full_len;
    let full_start = columns.get(full_lo).map_or(0, |c| c.0);
    let isa = simd::isa();
    output
        .par_chunks_mut(out_plane)
        .zip(indices.par_chunks_mut(out_plane))
        .enumerate()
        .for_each(|(plane, (out, idx))| {
            let src = &input[plane * in_plane..][..in_plane];
            let mut gathered = vec![T::NEG_INFINITY; full.len()];
            for oh in 0..out_h {
                let h_start = (oh * p.stride[0]) as i64 - p.padding[0] as i64;
                let (h_lo, h_hi) = tap_range(h_start, p.kernel_size[0], p.dilation[0], in_h);
                let row_at = |th: usize| (h_start + (th * p.dilation[0]) as i64) as usize * in_w;
                let out_row = &mut out[oh * out_w..][..out_w];
                let idx_row = &mut idx[oh * out_w..][..out_w];
                let col_at =
                    |w_start: i64, tw: usize| (w_start + (tw * p.dilation[1]) as i64) as usize;
                // The geometry guarantees a non-empty window: its first tap is the index
                // until a larger value (or a NaN) is met.
                for ((out, idx), &(w_start, w_lo, _)) in
                    out_row.iter_mut().zip(idx_row.iter_mut()).zip(&columns)
                {
                    *out = T::NEG_INFINITY;
                    *idx = (row_at(h_lo) + col_at(w_start, w_lo)) as i64;
                }
                // Taps outermost (row-major, as the tie rule needs), outputs innermost: the
                // outputs' comparisons do not wait on each other. The columns whose window
                // lies wholly inside the row (`full`) first gather the tap into a contiguous
                // row, so their comparison loop has no bounds test or stride and vectorises;
                // the columns next to the padding test each tap.
                for th in h_lo..h_hi {
                    let row = row_at(th);
                    for tw in 0..p.kernel_size[1] {
                        let first = row + col_at(full_start, tw);
                        let stride = p.stride[1];
                        for (j, t) in gathered.iter_mut().enumerate() {
                            *t = src[first + j * stride];
                        }
                        max_taps(
                            isa,
                            &mut out_row[full.clone()],
                            &mut idx_row[full.clone()],
                            &gathered,
                            (first as i64, stride as i64),
                        );
                        for ow in (0..full.start).chain(full.end..out_w) {
                            let (w_start, w_lo, w_hi) = columns[ow];
                            let (out, idx) = (&mut out_row[ow], &mut idx_row[ow]);
                            if tw < w_lo || tw >= w_hi {
                                continue;
                            }
                            let k = row + col_at(w_start, tw);
                            let v = src[k];
                            // Selected, not branched on: which element is the maximum is
                            // data, and branches on it mispredict.
                            let better = (v > *out) | v.is_nan();
                            *out = if better { v } else { *out };
                            *idx = if better { k as i64 } else { *idx };
                        }
                    }
                }
            }
        });
    Ok(())
}

simd_dispatch! {
    /// One tap of a row of windows: `taps[j]` (input element `k0 + j * dk`) replaces
    /// `out[j]` and `idx[j]` where it is larger or NaN. Compiled for AVX-512F and AVX2 too
    /// (`simd.rs`; kiln builds for baseline SSE, where this loop does not vectorise); every
    /// path makes the same comparisons.
    fn max_taps[T: KernelFloat](out: &mut [T], idx: &mut [i64], taps: &[T], k: (i64, i64))
        => max_taps_body[T];
}

#[inline(always)]
fn max_taps_body<T: KernelFloat>(out: &mut [T], idx: &mut [i64], taps: &[T], (k0, dk): (i64, i64)) {
    let mut k = k0;
    for ((out, idx), &v) in out.iter_mut().zip(idx.iter_mut()).zip(taps) {
        // Selected, not branched on: which element is the maximum is data, and branches on
        // it mispredict.
        let better = (v > *out) | v.is_nan();
        *out = if better { v } else { *out };
        *idx = if better { k } else { *idx };
        k += dk;
    }
}

/// Gradient of max pooling: routes each output gradient to the input element its index
/// names (adding where windows overlap).
///
/// Shapes: `grad_output` and `indices` `[N, C, H_out, W_out]` (indices from
/// [`max_pool2d_forward`]), `grad_input` `[N, C, H, W]`. An index outside the input plane is an
/// [`KernelError::IndexOutOfRange`] naming the first one.
pub fn max_pool2d_backward<T: KernelFloat>(
    geometry: &MaxPool2dGeometry,
    grad_output: &[T],
    indices: &[i64],
    grad_input: &mut [T],
) -> Result<(), KernelError> {
    const OP: &str = "max_pool2d_backward";
    let shape = &geometry.shape;
    check_pool_buffers(
        OP,
        shape,
        "grad_input",
        grad_input,
        "grad_output",
        grad_output,
    )?;
    check_len(OP, "indices", indices, &shape.output_shape())?;
    let (in_plane, out_plane) = (shape.input_plane(), shape.output_plane());
    if let Some(k) = indices.iter().position(|&i| i < 0 || i >= in_plane as i64) {
        let [_, c, h, w] = shape.output_shape();
        return Err(KernelError::IndexOutOfRange {
            op: OP,
            index: indices[k],
            position: vec![k / (c * h * w), k / (h * w) % c, k / w % h, k % w],
            dim: 2,
            size: in_plane,
        });
    }
    grad_input
        .par_chunks_mut(in_plane)
        .enumerate()
        .for_each(|(plane, gin)| {
            gin.fill(T::ZERO);
            let gout = &grad_output[plane * out_plane..][..out_plane];
            let idx = &indices[plane * out_plane..][..out_plane];
            for (&g, &i) in gout.iter().zip(idx) {
                gin[i as usize] += g;
            }
        });
    Ok(())
}

/// The clipped window `[h0, h1) x [w0, w1)` of output cell `(oh, ow)` and its divisor.
struct AvgWindow {
    h: (usize, usize),
    w: (usize, usize),
    divisor: usize,
}

fn avg_window(geometry: &AvgPool2dGeometry, oh: usize, ow: usize) -> AvgWindow {
    let p = &geometry.params;
    let axis = |o: usize, a: usize| {
        let input = geometry.shape.input_size[a] as i64;
        let start = (o * p.stride[a]) as i64 - p.padding[a] as i64;
        let end = (start + p.kernel_size[a] as i64).min(input + p.padding[a] as i64);
        let padded_len = (end - start) as usize;
        let (start, end) = (start.max(0), end.min(input));
        (start as usize, (end.max(start)) as usize, padded_len)
    };
    let (h0, h1, padded_h) = axis(oh, 0);
    let (w0, w1, padded_w) = axis(ow, 1);
    let divisor = match p.divisor_override {
        Some(d) => d,
        None if p.count_include_pad => padded_h * padded_w,
        None => (h1 - h0) * (w1 - w0),
    };
    AvgWindow {
        h: (h0, h1),
        w: (w0, w1),
        divisor,
    }
}

/// Every output cell of every `[H, W]` plane is the sum of its input window divided by the
/// window's divisor, 0 for a window holding no input element; `window(o)` is the window of
/// plane-local output cell `o`. Average and adaptive average pooling differ only in `window`.
fn window_mean_forward<T: KernelFloat>(
    shape: &PoolShape,
    input: &[T],
    output: &mut [T],
    window: impl Fn(usize) -> AvgWindow + Sync,
) {
    let in_w = shape.input_size[1];
    let (in_plane, out_plane) = (shape.input_plane(), shape.output_plane());
    output
        .par_chunks_mut(out_plane)
        .enumerate()
        .for_each(|(plane, out)| {
            let src = &input[plane * in_plane..][..in_plane];
            for (o, out) in out.iter_mut().enumerate() {
                let win = window(o);
                let mut sum = T::ZERO;
                for ih in win.h.0..win.h.1 {
                    for &v in &src[ih * in_w + win.w.0..ih * in_w + win.w.1] {
                        sum += v;
                    }
                }
                let empty = win.h.0 == win.h.1 || win.w.0 == win.w.1;
                *out = if empty {
                    T::ZERO
                } else {
                    sum / T::from_f64(win.divisor as f64)
                };
            }
        });
}

/// The gradient of [`window_mean_forward`]: each output gradient, divided by its window's
/// divisor, is added to every input element of the window.
fn window_mean_backward<T: KernelFloat>(
    shape: &PoolShape,
    grad_output: &[T],
    grad_input: &mut [T],
    window: impl Fn(usize) -> AvgWindow + Sync,
) {
    let in_w = shape.input_size[1];
    let (in_plane, out_plane) = (shape.input_plane(), shape.output_plane());
    grad_input
        .par_chunks_mut(in_plane)
        .enumerate()
        .for_each(|(plane, gin)| {
            gin.fill(T::ZERO);
            let gout = &grad_output[plane * out_plane..][..out_plane];
            for (o, &g) in gout.iter().enumerate() {
                let win = window(o);
                let share = g / T::from_f64(win.divisor as f64);
                for ih in win.h.0..win.h.1 {
                    for v in &mut gin[ih * in_w + win.w.0..ih * in_w + win.w.1] {
                        *v += share;
                    }
                }
            }
        });
}

/// Average pooling (zero padding; divisor per [`super::AvgPool2dParams`]); a window that holds
/// no input element gives 0.
///
/// Shapes: `input` `[N, C, H, W]`, `output` `[N, C, H_out, W_out]`.
pub fn avg_pool2d_forward<T: KernelFloat>(
    geometry: &AvgPool2dGeometry,
    input: &[T],
    output: &mut [T],
) -> Result<(), KernelError> {
    let shape = &geometry.shape;
    check_pool_buffers("avg_pool2d", shape, "input", input, "output", output)?;
    let out_w = shape.output_size[1];
    window_mean_forward(shape, input, output, |o| {
        avg_window(geometry, o / out_w, o % out_w)
    });
    Ok(())
}

/// Gradient of average pooling: spreads each output gradient, divided by its window's divisor,
/// over the window's input elements.
///
/// Shapes: `grad_output` `[N, C, H_out, W_out]`, `grad_input` `[N, C, H, W]`.
pub fn avg_pool2d_backward<T: KernelFloat>(
    geometry: &AvgPool2dGeometry,
    grad_output: &[T],
    grad_input: &mut [T],
) -> Result<(), KernelError> {
    let shape = &geometry.shape;
    check_pool_buffers(
        "avg_pool2d_backward",
        shape,
        "grad_input",
        grad_input,
        "grad_output",
        grad_output,
    )?;
    let out_w = shape.output_size[1];
    window_mean_backward(shape, grad_output, grad_input, |o| {
        avg_window(geometry, o / out_w, o % out_w)
    });
    Ok(())
}

/// PyTorch's adaptive window of output cell `o`: `[floor(o*in/out), ceil((o+1)*in/out))`.
fn adaptive_range(o: usize, input: usize, output: usize) -> (usize, usize) {
    (o * input / output, ((o + 1) * input).div_ceil(output))
}

/// The adaptive window of plane-local output cell `o` (never empty; divisor = its size).
fn adaptive_window(shape: &PoolShape, o: usize) -> AvgWindow {
    let [in_h, in_w] = shape.input_size;
    let [out_h, out_w] = shape.output_size;
    let h = adaptive_range(o / out_w, in_h, out_h);
    let w = adaptive_range(o % out_w, in_w, out_w);
    AvgWindow {
        h,
        w,
        divisor: (h.1 - h.0) * (w.1 - w.0),
    }
}

/// Adaptive average pooling to the geometry's output size.
///
/// Shapes: `input` `[N, C, H, W]`, `output` `[N, C, H_out, W_out]`.
pub fn adaptive_avg_pool2d_forward<T: KernelFloat>(
    geometry: &AdaptiveAvgPool2dGeometry,
    input: &[T],
    output: &mut [T],
) -> Result<(), KernelError> {
    let shape = &geometry.shape;
    check_pool_buffers(
        "adaptive_avg_pool2d",
        shape,
        "input",
        input,
        "output",
        output,
    )?;
    window_mean_forward(shape, input, output, |o| adaptive_window(shape, o));
    Ok(())
}

/// Gradient of adaptive average pooling.
///
/// Shapes: `grad_output` `[N, C, H_out, W_out]`, `grad_input` `[N, C, H, W]`.
pub fn adaptive_avg_pool2d_backward<T: KernelFloat>(
    geometry: &AdaptiveAvgPool2dGeometry,
    grad_output: &[T],
    grad_input: &mut [T],
) -> Result<(), KernelError> {
    let shape = &geometry.shape;
    check_pool_buffers(
        "adaptive_avg_pool2d_backward",
        shape,
        "grad_input",
        grad_input,
        "grad_output",
        grad_output,
    )?;
    window_mean_backward(shape, grad_output, grad_input, |o| {
        adaptive_window(shape, o)
    });
    Ok(())
}

impl PoolOps for CpuStorage {
    fn pool2d(&self, layout: &Layout, pool: &Pool2d) -> Result<(Self, Option<Self>)> {
        const OP: &str = "pool2d";
        float_kernel!(OP, self.dtype(), T => {
            let input = dense::<T>(OP, (self, layout))?;
            match pool {
                Pool2d::Max(g) => {
                    let mut out = for_overwrite::<T>(&g.shape.output_shape())?;
                    let mut idx = for_overwrite::<i64>(&g.shape.output_shape())?;
                    in_pool(|| max_pool2d_forward(g, &input, &mut out, &mut idx))?;
                    Ok((wrap(out), Some(wrap(idx))))
                }
                Pool2d::Avg(g) => {
                    let mut out = for_overwrite::<T>(&g.shape.output_shape())?;
                    in_pool(|| avg_pool2d_forward(g, &input, &mut out))?;
                    Ok((wrap(out), None))
                }
                Pool2d::AdaptiveAvg(g) => {
                    let mut out = for_overwrite::<T>(&g.shape.output_shape())?;
                    in_pool(|| adaptive_avg_pool2d_forward(g, &input, &mut out))?;
                    Ok((wrap(out), None))
                }
            }
        })
    }

    fn pool2d_backward(
        &self,
        layout: &Layout,
        indices: Option<Strided<'_, Self>>,
        pool: &Pool2d,
    ) -> Result<Self> {
        const OP: &str = "pool2d_backward";
        float_kernel!(OP, self.dtype(), T => {
            let go = dense::<T>(OP, (self, layout))?;
            match pool {
                Pool2d::Max(g) => {
                    let Some(indices) = indices else {
                        return Err(Error::LengthMismatch {
                            op: "max_pool2d_backward",
                            what: "got no indices buffer, but max pooling's backward needs the \
                                   indices its forward returned"
                                .into(),
                        });
                    };
                    let idx = dense::<i64>(OP, indices)?;
                    let mut gi = for_overwrite::<T>(&g.shape.input_shape())?;
                    in_pool(|| max_pool2d_backward(g, &go, &idx, &mut gi))?;
                    Ok(wrap(gi))
                }
                Pool2d::Avg(g) => {
                    let mut gi = for_overwrite::<T>(&g.shape.input_shape())?;
                    in_pool(|| avg_pool2d_backward(g, &go, &mut gi))?;
                    Ok(wrap(gi))
                }
                Pool2d::AdaptiveAvg(g) => {
                    let mut gi = for_overwrite::<T>(&g.shape.input_shape())?;
                    in_pool(|| adaptive_avg_pool2d_backward(g, &go, &mut gi))?;
                    Ok(wrap(gi))
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{adaptive_range, max_taps, max_taps_body, tap_range};
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

    #[test]
    fn adaptive_ranges_cover_the_input() {
        // 5 -> 3: [0, 2), [1, 4), [3, 5) as in PyTorch.
        let ranges: Vec<_> = (0..3).map(|o| adaptive_range(o, 5, 3)).collect();
        assert_eq!(ranges, vec![(0, 2), (1, 4), (3, 5)]);
        // 2 -> 3 (upsampling): [0, 1), [0, 2), [1, 2).
        let ranges: Vec<_> = (0..3).map(|o| adaptive_range(o, 2, 3)).collect();
        assert_eq!(ranges, vec![(0, 1), (0, 2), (1, 2)]);
    }

    /// The tap loop gives the same maxima and indices on every instruction set the CPU has:
    /// NaN wins (the later NaN too, as PyTorch's kernel), a tie keeps the earlier index.
    #[test]
    fn max_taps_is_the_same_on_every_instruction_set() {
        let n = 203;
        let mut x = 7u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            match x % 11 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2 => 0.5,
                _ => (x % 7) as f32,
            }
        };
        let rows: Vec<Vec<f32>> = (0..9).map(|_| (0..n).map(|_| next()).collect()).collect();
        type Taps = Box<dyn Fn(&mut [f32], &mut [i64], &[f32], (i64, i64))>;
        let mut paths: Vec<(String, Taps)> = vec![
            ("baseline".into(), Box::new(max_taps_body)),
            (
                "dispatched".into(),
                Box::new(|o, i, t, k| max_taps(isa(), o, i, t, k)),
            ),
        ];
        for each in available() {
            paths.push((
                format!("{each:?}"),
                Box::new(move |o, i, t, k| max_taps(Some(each), o, i, t, k)),
            ));
        }
        let results: Vec<(Vec<u32>, Vec<i64>)> = paths
            .iter()
            .map(|(_, taps)| {
                // As the kernel starts a window: minus infinity at its first tap's index.
                let mut out = vec![f32::NEG_INFINITY; n];
                let mut idx: Vec<i64> = (0..n as i64).map(|j| 3 * j).collect();
                for (r, row) in rows.iter().enumerate() {
                    taps(&mut out, &mut idx, row, (r as i64 * 1000, 3));
                }
                (out.iter().map(|v| v.to_bits()).collect(), idx)
            })
            .collect();
        for ((name, _), r) in paths.iter().zip(&results) {
            assert_eq!(r, &results[0], "{name}");
        }
        // The rules themselves, on the baseline: a column's index is the last NaN's row, else
        // the first row holding the column's maximum.
        let (out, idx) = &results[0];
        for j in 0..n {
            let col: Vec<f32> = rows.iter().map(|row| row[j]).collect();
            let want = match col.iter().rposition(|v| v.is_nan()) {
                Some(r) => r,
                None => {
                    let max = col.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    col.iter().position(|&v| v == max).unwrap()
                }
            };
            assert_eq!(idx[j], want as i64 * 1000 + 3 * j as i64, "column {j}");
            assert_eq!(out[j], col[want].to_bits(), "column {j}");
        }
    }
}
