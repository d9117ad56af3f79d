//! The weight gradient of the small planes' chunked convolutions (`cpu_chunked.rs`), the
//! default of the two forms (the other: `cpu_weight_taps.rs`).
//!
//! It runs chunks of its own ([`weight_grad_chunk`]) one after another in batch order, each
//! chunk's matrices gathered on the pool and `gemm` splitting each product (the whole weight
//! gradient) over the pool: no per-thread partial gradient (up to 9 MiB each in layer4), and
//! the sum's order does not depend on scheduling. Its column matrix is pixel-major
//! (`[G * L, kH * kW * C_in]`, each row one output position's taps, gathered from a pixel-major
//! copy of the images), which `gemm` packs with contiguous reads; the taps-major gradient this
//! gives is reordered to the weight's layout at the end.
//!
//! Invariants: the gradient is overwritten (the first product writes, the others add); its one
//! set of scratch buffers, taken fallibly from the caching allocator, holds at most what the
//! input gradient's chunks hold on the pool at once (one image's, if that is larger); results
//! equal the per-image path's up to the order of float sums.

use super::cpu_chunked::{gather_planes, Dims};
use super::cpu_gemm::{matmul_into, ScratchFailure, Stored};
use super::padded::{too_large, Padded};
use super::pieces::{evened_chunk, for_each_piece, pool_parallelism};
use super::Conv2dGeometry;
use crate::ops::KernelFloat;
use crate::storage::HostBuffer;
use crate::Result;

/// One chunk's images copied pixel-major with zero borders: the layout of [`Padded`] with a
/// pixel's `C_in` channels in place of each value. Image `i`'s padded pixel `(r, q)` sits at
/// `(i·len + r·P + q)·C_in` (`P = W + pad_w`; reads past a row's end land in the next row's
/// leading zeros, or in the `pad_w` zero pixels after the image's last row), so one tap of one
/// output position is `C_in` contiguous values.
#[derive(Clone, Copy)]
struct PixelMajor {
    /// Row pitch `P = W + pad_w`, in pixels.
    pitch: usize,
    /// Elements of one padded image: `(Hp·P + pad_w)·C_in`.
    image: usize,
}

impl PixelMajor {
    fn new(g: &Conv2dGeometry) -> Result<Self> {
        let [h, w] = g.input_size;
        let [ph, pw] = g.params.padding;
        let sizes = || {
            let pitch = w.checked_add(pw)?;
            let rows = ph.checked_mul(2)?.checked_add(h)?;
            let pixels = rows.checked_mul(pitch)?.checked_add(pw)?;
            Some((pitch, pixels.checked_mul(g.in_channels)?))
        };
        let (pitch, image) = sizes().ok_or_else(too_large)?;
        Ok(Self { pitch, image })
    }

    /// Writes every element of `dst` (one padded image) from `src` (`[C_in, H, W]`).
    fn fill<T: KernelFloat>(&self, g: &Conv2dGeometry, src: &[T], dst: &mut [T]) {
        let (c_in, [h, w]) = (g.in_channels, g.input_size);
        let [ph, pw] = g.params.padding;
        let row = self.pitch * c_in;
        let (top, interior) = dst.split_at_mut(ph * row);
        top.fill(T::ZERO);
        let (interior, bottom) = interior.split_at_mut(h * row);
        bottom.fill(T::ZERO);
        for (y, row) in interior.chunks_mut(row).enumerate() {
            let (zeros, pixels) = row.split_at_mut(pw * c_in);
            zeros.fill(T::ZERO);
            let pixels = pixels.chunks_mut(c_in);
            for (x, pixel) in pixels.enumerate() {
                for (c, v) in pixel.iter_mut().enumerate() {
                    *v = src[(c * h + y) * w + x];
                }
            }
        }
    }

    /// Writes row `pos` (image `pos / L`, output position `pos % L`) of the pixel-major column
    /// matrix into `row`: tap `t = i·kW + j` at `row[t·C_in..][..C_in]`.
    fn gather_row<T: KernelFloat>(
        &self,
        g: &Conv2dGeometry,
        images: &[T],
        pos: usize,
        row: &mut [T],
    ) {
        let c_in = g.in_channels;
        let (l, w_out) = (g.col_cols(), g.output_size[1]);
        let (image, y, x) = (pos / l, pos % l / w_out, pos % l % w_out);
        let image = &images[image * self.image..][..self.image];
        let [kh, kw] = g.kernel_size;
        let ([sh, sw], [dh, dw]) = (g.params.stride, g.params.dilation);
        let taps = (0..kh).flat_map(|i| (0..kw).map(move |j| (i, j)));
        for ((i, j), dst) in taps.zip(row.chunks_mut(c_in)) {
            let pixel = (y * sh + i * dh) * self.pitch + x * sw + j * dw;
            dst.copy_from_slice(&image[pixel * c_in..][..c_in]);
        }
    }
}

/// Images per product of the weight gradient ([`backward_weight`]) when the other passes take
/// chunks of `chunk` images on a pool of `threads`: as many as keep its scratch (columns,
/// pixel-major images and gathered output gradient) within what the input gradient's chunks
/// take on the pool at once (each its column and output-gradient matrices and a padded image),
/// and at least `chunk`, evened out over the batch.
///
/// Its products run one after another, each split over the pool, and each reads and writes the
/// whole gradient (9 MiB in layer4) for a depth of only its chunk's columns, so fewer, deeper
/// products are faster (layer4 at batch 32 on two threads: 8 products of 4 images with the
/// other passes' chunks, 5 of 7 with these). The input gradient's transposed copy of a large
/// weight (`cpu_chunked.rs`) is as large as the weight gradient, so within this budget the
/// weight gradient's pass holds no more memory than the input gradient's before it; and never
/// more products, nor more scratch, than the other passes' chunks would give it.
pub(super) fn weight_grad_chunk(g: &Conv2dGeometry, chunk: usize, threads: usize) -> Result<usize> {
    let d = Dims::new(g);
    let (p, pm) = (Padded::new(g)?, PixelMajor::new(g)?);
    let matrices = d.k.saturating_add(d.c_out).saturating_mul(d.l);
    let at_once = threads.max(1).min(g.batch.div_ceil(chunk.max(1)));
    let budget = chunk
        .saturating_mul(matrices)
        .saturating_add(p.len)
        .saturating_mul(at_once);
    let per_image = matrices.saturating_add(pm.image).max(1);
    Ok(evened_chunk(g.batch, (budget / per_image).max(chunk)))
}

/// Weight gradient (summed over the batch), chunk by chunk in batch order, over a pixel-major
/// column matrix: for each chunk, `grad_weight' [C_out, kH·kW·C_in] (+)= dY [C_out, G·L] ·
/// cols [G·L, kH·kW·C_in]`, `cols` row `p` holding output position `p`'s taps, each `C_in`
/// contiguous values copied from [`PixelMajor`] images; the taps-major gradient is reordered
/// into `[C_out, C_in, kH, kW]` at the end, one output channel's row at a time.
///
/// Why not the column matrix of the other passes (`[K, G·L]`, used transposed): as the right
/// operand, `gemm` packs it across its rows, a strided read per value; the pixel-major matrix
/// is packed along its rows (docs/CPU.md, session 18, has the figures). Each product is split
/// over the pool by `gemm` (its output, the whole gradient, splits well), so no per-thread
/// partial gradient is needed and the sum's order is fixed.
pub(super) fn backward_weight<T: KernelFloat>(
    g: &Conv2dGeometry,
    chunk: usize,
    input: &[T],
    grad_output: &[T],
    grad_weight: &mut [T],
) -> Result<()> {
    let d = Dims::new(g);
    let pm = PixelMajor::new(g)?;
    let cols_len = chunk
        .checked_mul(d.l)
        .and_then(|n| n.checked_mul(d.k))
        .ok_or_else(too_large)?;
    let pixels_len = chunk.checked_mul(pm.image).ok_or_else(too_large)?;
    let mut pixels = HostBuffer::for_overwrite(pixels_len)?;
    let mut cols = HostBuffer::for_overwrite(cols_len)?;
    let gathered_len = d.c_out.checked_mul(chunk).and_then(|n| n.checked_mul(d.l));
    let mut gathered = HostBuffer::for_overwrite(gathered_len.ok_or_else(too_large)?)?;
    let threads = rayon::current_num_threads();
    let parallelism = pool_parallelism();
    let mut start = 0;
    while start < g.batch {
        let count = chunk.min(g.batch - start);
        let width = count * d.l;
        let xs = &input[start * d.in_image..][..count * d.in_image];
        let pixels = &mut pixels.as_mut_slice()[..count * pm.image];
        for_each_piece(pixels, pm.image, true, |i, padded| {
            pm.fill(g, &xs[i * d.in_image..][..d.in_image], padded)
        });
        let (pixels, cols) = (&*pixels, &mut cols.as_mut_slice()[..width * d.k]);
        let rows_per_piece = width.div_ceil(4 * threads.max(1));
        for_each_piece(cols, rows_per_piece * d.k, true, |b, piece| {
            for (j, row) in piece.chunks_mut(d.k).enumerate() {
                pm.gather_row(g, pixels, b * rows_per_piece + j, row);
            }
        });
        let gathered = &mut gathered.as_mut_slice()[..d.c_out * width];
        let planes = &grad_output[start * d.c_out * d.l..][..count * d.c_out * d.l];
        gather_planes(d, planes, gathered, true);
        let dims = [d.c_out, d.k, width];
        // The first chunk overwrites the gradient, the others add to it: no zero-fill pass.
        let (add, asis) = (start > 0, Stored::AsIs);
        matmul_into(
            grad_weight,
            dims,
            gathered,
            asis,
            cols,
            asis,
            add,
            parallelism,
        );
        start += count;
    }
    taps_major_to_weight_order(g, grad_weight)
}

/// Reorders each output channel's row of the weight gradient from taps-major
/// (`[kH·kW][C_in]`) to the weight's order (`[C_in][kH·kW]`), through a per-thread copy.
pub(super) fn taps_major_to_weight_order<T: KernelFloat>(
    g: &Conv2dGeometry,
    grad_weight: &mut [T],
) -> Result<()> {
    let (c_in, taps) = (g.in_channels, g.kernel_size[0] * g.kernel_size[1]);
    if taps == 1 {
        return Ok(());
    }
    let k = c_in * taps;
    let failure = ScratchFailure::new();
    crate::ops::par::chunks_mut_with(grad_weight, k, &|| failure.take::<T>(k), &|copy, _, row| {
        let Some(copy) = copy.as_mut() else {
            return;
        };
        let copy = copy.as_mut_slice();
        copy.copy_from_slice(row);
        for (c, weights) in row.chunks_mut(taps).enumerate() {
            for (t, v) in weights.iter_mut().enumerate() {
                *v = copy[t * c_in + c];
            }
        }
    });
    failure.into_result()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv::Conv2dParams;

    /// The products' sizes on ResNet's small planes (the chunked passes' test checks the
    /// gradient itself, on chunks of any size).
    #[test]
    fn weight_gradient_chunks_fit_what_the_input_gradient_holds() {
        let g = |input| {
            let params = Conv2dParams {
                padding: [1, 1],
                ..Conv2dParams::default()
            };
            let [_, c, _, _] = input;
            Conv2dGeometry::new(input, [c, c, 3, 3], params).unwrap()
        };
        // layer4: an image's column and output matrices are (4608 + 512) x 16 elements, its
        // pixel-major copy 31 pixels of 512 channels, the input gradient's padded one 30 x 512 +
        // 2; the input gradient holds two chunks of 4 at once on two threads, room for 7 images
        // here: 5 products of 7 (the last of 4). One thread: one chunk of 7, room for 6, and
        // never fewer images than the other passes' chunks.
        let deep = g([32, 512, 4, 4]);
        let padded = Padded::new(&deep).unwrap().len;
        let pixel_major = PixelMajor::new(&deep).unwrap().image;
        assert_eq!((padded, pixel_major), (30 * 512 + 2, 31 * 512));
        assert_eq!((2 * (4 * 81_920 + padded)) / (81_920 + pixel_major), 7);
        assert_eq!(weight_grad_chunk(&deep, 4, 2).unwrap(), 7);
        assert_eq!(weight_grad_chunk(&deep, 7, 1).unwrap(), 7);
        // layer3: (2304 + 256) x 64 and 91 x 256 per image, two chunks of 2 at once: room for 3,
        // 11 products.
        assert_eq!(weight_grad_chunk(&g([32, 256, 8, 8]), 2, 2).unwrap(), 3);
        // Six images on four threads run three chunks of 2 at once: room for 5, so 2 products
        // of 3 (a chunk per thread would have room for 7, one product of all 6).
        assert_eq!(weight_grad_chunk(&g([6, 512, 4, 4]), 2, 4).unwrap(), 3);
        // Two images in one chunk: room for one, but never fewer than the chunk's.
        assert_eq!(weight_grad_chunk(&g([2, 512, 4, 4]), 2, 2).unwrap(), 2);
    }
}
