//! CPU pooling kernels: one rayon task per `(n, c)` plane, forward and backward.
//!
//! Every plane of the input maps to one plane of the output, and backward writes only the
//! plane it reads indices or windows for, so planes never share an output element and the
//! kernels need no atomics. Backward kernels overwrite the input gradient (zero it, then add
//! each output gradient onto its window), never accumulate into what was there; so every
//! kernel writes its whole output, which is taken unfilled.

use super::{Pool2d, PoolOps};
use crate::ops::cpu_dispatch::{dense, float_kernel, for_overwrite, in_pool, wrap};
use crate::ops::par;
use crate::seam::Strided;
use crate::{CpuStorage, Error, Layout, Result};
use rayon::prelude::*;

use super::{AdaptiveAvgPool2dGeometry, AvgPool2dGeometry, MaxPool2dGeometry, PoolShape};
use crate::ops::kernel_error::{check_len, KernelError};
use crate::ops::KernelFloat;

pub use super::cpu_max::{max_pool2d_forward, max_pool2d_values};

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
    if in_plane == 0 || out_plane == 0 {
        grad_input.fill(T::ZERO);
        return Ok(());
    }
    // Every index is checked before anything is written: in parallel, and (as `u64`, where a
    // negative index is huge) with a branch-free scan of each piece, searched for its first bad
    // index only when it has one.
    let bad = |i: i64| i as u64 >= in_plane as u64;
    const PIECE: usize = 1 << 14;
    let first_bad = indices
        .par_chunks(PIECE)
        .enumerate()
        .filter(|(_, piece)| piece.iter().fold(false, |any, &i| any | bad(i)))
        .filter_map(|(n, piece)| piece.iter().position(|&i| bad(i)).map(|k| n * PIECE + k))
        .min();
    if let Some(k) = first_bad {
        let [_, c, h, w] = shape.output_shape();
        return Err(KernelError::IndexOutOfRange {
            op: OP,
            index: indices[k],
            position: vec![k / (c * h * w), k / (h * w) % c, k / w % h, k % w],
            dim: 2,
            size: in_plane,
        });
    }
    par::chunks_mut(grad_input, in_plane, &|plane, gin| {
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
    par::chunks_mut(output, out_plane, &|plane, out| {
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
    par::chunks_mut(grad_input, in_plane, &|plane, gin| {
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
                Pool2d::MaxValues(g) => {
                    let mut out = for_overwrite::<T>(&g.shape.output_shape())?;
                    in_pool(|| max_pool2d_values(g, &input, &mut out))?;
                    Ok((wrap(out), None))
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
                Pool2d::MaxValues(_) => Err(super::no_values_backward()),
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
    use super::adaptive_range;

    #[test]
    fn adaptive_ranges_cover_the_input() {
        // 5 -> 3: [0, 2), [1, 4), [3, 5) as in PyTorch.
        let ranges: Vec<_> = (0..3).map(|o| adaptive_range(o, 5, 3)).collect();
        assert_eq!(ranges, vec![(0, 2), (1, 4), (3, 5)]);
        // 2 -> 3 (upsampling): [0, 1), [0, 2), [1, 2).
        let ranges: Vec<_> = (0..3).map(|o| adaptive_range(o, 2, 3)).collect();
        assert_eq!(ranges, vec![(0, 1), (0, 2), (1, 2)]);
    }
}
