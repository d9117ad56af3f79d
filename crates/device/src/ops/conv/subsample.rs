//! The strided 1x1 convolutions without padding (ResNet's downsampling shortcuts) read one
//! phase of their stride straight from the image, so they need none of `padded.rs`'s copies:
//! a column row is an input plane read at the stride ([`subsample_plane`]), and the input
//! gradient's plane is that row written back at the stride over zeros ([`unsample_planes`]).
//!
//! Invariants: each input element is read by at most one output (the kernel is 1x1 and the
//! stride at least 1), so the gradient is written, never summed; every element of a column row
//! and of a gradient plane is written; at stride 2, the shortcuts' stride, whole pairs move so
//! the loops vectorise, with the values an element-by-element walk gives.

use super::pieces::for_each_piece;
use super::Conv2dGeometry;
use crate::ops::KernelFloat;

/// Row `c` of a subsampling 1x1 convolution's column matrix (no padding, a stride above 1):
/// plane `c` of `image` read at the stride, into `dst` (`H_out * W_out` elements).
pub(super) fn subsample_plane<T: Copy>(g: &Conv2dGeometry, image: &[T], c: usize, dst: &mut [T]) {
    let ([h, w], [sh, sw]) = (g.input_size, g.params.stride);
    let plane = &image[c * h * w..][..h * w];
    for (y, row) in dst.chunks_mut(g.output_size[1].max(1)).enumerate() {
        let src = &plane[y * sh * w..];
        match row.split_last_mut() {
            // Stride 2, as ResNet's shortcuts: every element but the last from whole pairs
            // (which the compiler turns into vector shuffles), the last one alone (an odd
            // width has no element after it).
            Some((last, head)) if sw == 2 => {
                let pairs = src[..2 * head.len()].chunks_exact(2);
                head.iter_mut()
                    .zip(pairs)
                    .for_each(|(v, pair)| *v = pair[0]);
                *last = src[2 * head.len()];
            }
            _ => row
                .iter_mut()
                .zip(src.iter().step_by(sw))
                .for_each(|(v, &s)| *v = s),
        }
    }
}

/// The input gradient's plane of a subsampling 1x1 convolution from row `c` of its column
/// gradient (`col_row`, `H_out * W_out` elements): zero but where the stride reads, each of
/// those read once (so no sums). `0 + v` as the fold onto a zeroed gradient computes, so a
/// negative zero comes out as the other paths give it.
fn unsample_plane<T: KernelFloat>(g: &Conv2dGeometry, col_row: &[T], plane: &mut [T]) {
    let ([_, w], [sh, sw]) = (g.input_size, g.params.stride);
    plane.fill(T::ZERO);
    for (y, row) in col_row.chunks(g.output_size[1].max(1)).enumerate() {
        let dst = &mut plane[y * sh * w..];
        match row.split_last() {
            // Stride 2: whole pairs (the zero rewritten, so the stores are whole vectors),
            // then the last element alone, as `subsample_plane` reads them.
            Some((&last, head)) if sw == 2 => {
                let pairs = dst[..2 * head.len()].chunks_exact_mut(2);
                head.iter()
                    .zip(pairs)
                    .for_each(|(&v, pair)| pair.copy_from_slice(&[T::ZERO + v, T::ZERO]));
                dst[2 * head.len()] = T::ZERO + last;
            }
            _ => row
                .iter()
                .zip(dst.iter_mut().step_by(sw))
                .for_each(|(&v, d)| *d = T::ZERO + v),
        }
    }
}

/// The input gradient's planes of one image (`planes`: all of them, or one group's) from a
/// column gradient: plane `c` from the `H_out * W_out` values at `col[c * pitch + at..]`
/// ([`unsample_plane`]), the planes on the pool when `split`. What both the per-image path
/// (`pitch` one image's columns) and the chunked one (a chunk's, `at` the image's first) write.
pub(super) fn unsample_planes<T: KernelFloat>(
    g: &Conv2dGeometry,
    col: &[T],
    [pitch, at]: [usize; 2],
    planes: &mut [T],
    split: bool,
) {
    let plane = g.input_size[0] * g.input_size[1];
    let l = g.output_size[0] * g.output_size[1];
    for_each_piece(planes, plane, split, |c, plane| {
        unsample_plane(g, &col[c * pitch + at..][..l], plane)
    });
}
