//! im2col and col2im: the unrolling that turns a convolution into one matrix product per group.
//!
//! For one image and one group, the column matrix has a row per kernel tap `(c, kh, kw)`
//! (`r = (c * kH + kh) * kW + kw`) and a column per output position `(oh, ow)`
//! (`l = oh * W_out + ow`); entry `(r, l)` is the input value under that tap at that position, or
//! zero where the tap falls into the padding. Then forward is `out_g = W_g · col`, the weight
//! gradient is `dout_g · colᵀ` and the input gradient is `col2im(W_gᵀ · dout_g)`, where col2im
//! scatters (adds) each column-matrix entry back onto the input element it was read from.
//!
//! Both loops split each row of the column matrix into a zero prefix, a valid middle computed
//! in closed form (no per-element bounds checks, contiguous copies when the stride is 1) and a
//! zero suffix.

use super::Conv2dGeometry;
use crate::ops::KernelFloat;

/// The output positions `o` in `0..out_len` for which `o * stride + offset` lies in
/// `0..in_len`, as a half-open range.
fn valid_outputs(out_len: usize, stride: usize, offset: isize, in_len: usize) -> (usize, usize) {
    let stride = stride as isize;
    let lo = if offset >= 0 {
        0
    } else {
        ((-offset) + stride - 1) / stride
    };
    let room = in_len as isize - offset;
    let hi = if room <= 0 {
        0
    } else {
        (room + stride - 1) / stride
    };
    let hi = (hi as usize).min(out_len);
    let lo = (lo as usize).min(hi);
    (lo, hi)
}

/// Where one row segment of the column matrix (one output row `oh` of one kernel tap) reads
/// from: the start of its input row and the range of output columns inside the image.
struct InputSpan {
    /// Offset of the input row `(c, ih, 0)` within the group block.
    input_row: usize,
    /// First output column whose tap is inside the image.
    lo: usize,
    /// One past the last such column.
    hi: usize,
    /// `kw * dil_w - pad_w`: input column of output column 0.
    w_offset: isize,
}

impl InputSpan {
    /// Offset of the input element read by output column `lo`.
    fn first(&self, stride_w: usize) -> usize {
        (self.input_row as isize + (self.lo * stride_w) as isize + self.w_offset) as usize
    }
}

/// Calls `visit(segment_start, span)` for every row segment of one group's column matrix;
/// `span` is `None` when the segment's input row lies in the padding.
fn for_each_segment(geometry: &Conv2dGeometry, mut visit: impl FnMut(usize, Option<InputSpan>)) {
    let [in_h, in_w] = geometry.input_size;
    let [k_h, k_w] = geometry.kernel_size;
    let [out_h, out_w] = geometry.output_size;
    let [stride_h, stride_w] = geometry.params.stride;
    let [pad_h, pad_w] = geometry.params.padding;
    let [dil_h, dil_w] = geometry.params.dilation;
    let channels = geometry.in_channels / geometry.params.groups;
    let cols = out_h * out_w;
    for c in 0..channels {
        for kh in 0..k_h {
            let h_offset = (kh * dil_h) as isize - pad_h as isize;
            let (oh_lo, oh_hi) = valid_outputs(out_h, stride_h, h_offset, in_h);
            for kw in 0..k_w {
                let w_offset = (kw * dil_w) as isize - pad_w as isize;
                let (lo, hi) = valid_outputs(out_w, stride_w, w_offset, in_w);
                let row = (c * k_h + kh) * k_w + kw;
                for oh in 0..out_h {
                    let segment = row * cols + oh * out_w;
                    let span = (oh_lo..oh_hi).contains(&oh).then(|| {
                        let ih = ((oh * stride_h) as isize + h_offset) as usize;
                        InputSpan {
                            input_row: (c * in_h + ih) * in_w,
                            lo,
                            hi,
                            w_offset,
                        }
                    });
                    visit(segment, span);
                }
            }
        }
    }
}

/// Fills `col` (`[C_in/groups * kH * kW, H_out * W_out]`) from one group's input block
/// (`[C_in/groups, H, W]`).
pub(super) fn im2col<T: KernelFloat>(geometry: &Conv2dGeometry, input: &[T], col: &mut [T]) {
    let out_w = geometry.output_size[1];
    let stride_w = geometry.params.stride[1];
    for_each_segment(geometry, |segment, span| {
        let seg = &mut col[segment..segment + out_w];
        let Some(span) = span else {
            seg.fill(T::ZERO);
            return;
        };
        seg[..span.lo].fill(T::ZERO);
        seg[span.hi..].fill(T::ZERO);
        if span.lo == span.hi {
            return;
        }
        let first = span.first(stride_w);
        let valid = &mut seg[span.lo..span.hi];
        if stride_w == 1 {
            valid.copy_from_slice(&input[first..first + valid.len()]);
        } else {
            for (j, dst) in valid.iter_mut().enumerate() {
                *dst = input[first + j * stride_w];
            }
        }
    });
}

/// Adds every entry of `col` onto the element of one group's input-gradient block
/// (`[C_in/groups, H, W]`) it was read from by [`im2col`].
pub(super) fn col2im_add<T: KernelFloat>(
    geometry: &Conv2dGeometry,
    col: &[T],
    input_grad: &mut [T],
) {
    let stride_w = geometry.params.stride[1];
    for_each_segment(geometry, |segment, span| {
        let Some(span) = span.filter(|s| s.lo < s.hi) else {
            return;
        };
        let first = span.first(stride_w);
        let valid = &col[segment + span.lo..segment + span.hi];
        if stride_w == 1 {
            for (dst, &v) in input_grad[first..first + valid.len()].iter_mut().zip(valid) {
                *dst += v;
            }
        } else {
            for (j, &v) in valid.iter().enumerate() {
                input_grad[first + j * stride_w] += v;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::valid_outputs;

    #[test]
    fn valid_outputs_matches_brute_force() {
        for out_len in 0..6 {
            for stride in 1..4 {
                for offset in -4isize..4 {
                    for in_len in 0..6 {
                        let inside: Vec<usize> = (0..out_len)
                            .filter(|&o| {
                                let i = (o * stride) as isize + offset;
                                i >= 0 && i < in_len as isize
                            })
                            .collect();
                        let (lo, hi) = valid_outputs(out_len, stride, offset, in_len);
                        assert_eq!((lo..hi).collect::<Vec<_>>(), inside);
                    }
                }
            }
        }
    }
}
