//! The small-plane weight gradient one kernel tap at a time: an alternative to
//! `cpu_chunked_weight::backward_weight`, chosen with `KILN_CONV_WEIGHT_GRAD=taps` (issue 16:
//! which of the two scales better on many cores is to be measured there; on two cores this one
//! is 1-2 % slower, and slower still on a pool oversubscribing them, docs/CPU.md, session 26).
//!
//! The chunked weight gradient multiplies the output gradient of a chunk of images by the
//! chunk's whole column matrix (`[G·L, kH·kW·C_in]`, nine times the images for a 3x3 kernel),
//! in chunks that fit what the input gradient's chunks hold on the pool, and each chunk reads
//! and writes the whole gradient once (layer4 at batch 32: 5 passes over its 9 MiB gradient on
//! two threads, 2 on 16; 8 and 16 before session 35 sized them on their own). Here a
//! chunk's images are copied pixel-major once (`[G, H, W, C_in]`), and for each tap `t` the
//! column matrix of that tap alone (`[G·L, C_in]`, row `p` the pixel output position `p` meets
//! at that tap: `C_in` contiguous values, or zeros on the padding) is multiplied into the
//! gradient's `t`-th block of columns, taps-major (`[C_out, kH·kW, C_in]`), reordered to the
//! weight's layout at the end. A chunk's scratch is then the images, one tap's columns and the
//! output gradient, so chunks hold several times more images within a fixed budget
//! ([`WEIGHT_CHUNK_ELEMS`], the same whatever the thread count) and each block of the gradient
//! is read and written once per chunk.
//!
//! Invariants: only `groups == 1` (as the chunks); every element of the gradient is written (the
//! first chunk overwrites, the others add); the sum's order depends on the geometry alone, not
//! on the threads; scratch comes from the caching allocator, taken fallibly, sizes checked.

use super::cpu_chunked::{gather_planes, Dims};
use super::cpu_chunked_weight::taps_major_to_weight_order;
use super::cpu_gemm::{matmul_into_at, Stored};
use super::padded::too_large;
use super::pieces::{evened_chunk, for_each_piece, pool_parallelism};
use super::Conv2dGeometry;
use crate::ops::KernelFloat;
use crate::storage::HostBuffer;
use crate::Result;

/// Scratch elements one chunk holds at most (1 MiB of f32), whatever the number of threads.
const WEIGHT_CHUNK_ELEMS: usize = 1 << 18;

/// Which small-plane weight gradient runs (`KILN_CONV_WEIGHT_GRAD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightGradPath {
    /// `cpu_chunked_weight::backward_weight`: the chunk's whole column matrix per product
    /// (default).
    Chunks,
    /// This file's: one tap's column matrix per product.
    Taps,
}

impl WeightGradPath {
    /// The value of `KILN_CONV_WEIGHT_GRAD` that chooses this path.
    pub fn name(self) -> &'static str {
        match self {
            WeightGradPath::Chunks => "chunks",
            WeightGradPath::Taps => "taps",
        }
    }
}

/// The small-plane weight gradient this process runs, from `KILN_CONV_WEIGHT_GRAD` (`chunks`,
/// the default, or `taps`); read once. Another value is ignored with a warning.
pub fn weight_grad_path() -> WeightGradPath {
    use std::sync::OnceLock;
    static CHOSEN: OnceLock<WeightGradPath> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        // Not UTF-8: shown lossily and warned about, never taken as unset.
        let raw =
            std::env::var_os("KILN_CONV_WEIGHT_GRAD").map(|v| v.to_string_lossy().into_owned());
        let (path, warning) = parse_path(raw.as_deref());
        if let Some(w) = warning {
            eprintln!("{w}");
        }
        path
    })
}

/// `(path, warning)` for a raw `KILN_CONV_WEIGHT_GRAD` value.
fn parse_path(raw: Option<&str>) -> (WeightGradPath, Option<String>) {
    match raw.map(|r| r.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("chunks") => (WeightGradPath::Chunks, None),
        Some("taps") => (WeightGradPath::Taps, None),
        Some(_) => {
            let shown: String = raw.unwrap_or_default().chars().take(40).collect();
            let warning = format!(
                "kiln: ignoring KILN_CONV_WEIGHT_GRAD={shown:?}: expected chunks or taps; using \
                 chunks"
            );
            (WeightGradPath::Chunks, Some(warning))
        }
    }
}

/// Images per chunk: as many as keep a chunk's scratch (the images pixel-major, one tap's
/// column matrix `[G·L, C_in]` and the output gradient `[C_out, G·L]`) within
/// [`WEIGHT_CHUNK_ELEMS`], at least one, evened out over the batch.
fn chunk_images(g: &Conv2dGeometry) -> usize {
    let (l, c_in, c_out) = (g.col_cols(), g.in_channels, g.out_channels);
    let pixels = g.input_size[0].saturating_mul(g.input_size[1]);
    let per_image = pixels
        .saturating_add(l)
        .saturating_mul(c_in)
        .saturating_add(l.saturating_mul(c_out));
    evened_chunk(g.batch, WEIGHT_CHUNK_ELEMS / per_image.max(1))
}

/// Copies `images` (`[N, C_in, H, W]`) pixel-major into `nhwc` (`[N, H, W, C_in]`), one rayon
/// task per image.
fn to_pixel_major<T: KernelFloat>(g: &Conv2dGeometry, images: &[T], nhwc: &mut [T]) {
    let (c_in, [h, w]) = (g.in_channels, g.input_size);
    let plane = h * w;
    for_each_piece(nhwc, plane * c_in, true, |n, out| {
        let image = &images[n * plane * c_in..][..plane * c_in];
        for (p, pixel) in out.chunks_mut(c_in).enumerate() {
            for (c, v) in pixel.iter_mut().enumerate() {
                *v = image[c * plane + p];
            }
        }
    });
}

/// Writes tap `[i, j]`'s column matrix of the pixel-major images `nhwc` into `cols`
/// (`[images · L, C_in]`): row `p` is the pixel output position `p % L` of image `p / L` meets
/// at that tap, zeros where the tap falls on the padding. One rayon task per image.
fn gather_tap<T: KernelFloat>(g: &Conv2dGeometry, [i, j]: [usize; 2], nhwc: &[T], cols: &mut [T]) {
    let (c_in, [h, w], [h_out, w_out]) = (g.in_channels, g.input_size, g.output_size);
    let ([sh, sw], [dh, dw], [ph, pw]) = (g.params.stride, g.params.dilation, g.params.padding);
    let image_len = h * w * c_in;
    for_each_piece(cols, h_out * w_out * c_in, true, |n, piece| {
        let image = &nhwc[n * image_len..][..image_len];
        for (y, out_row) in piece.chunks_mut(w_out * c_in).enumerate() {
            let Some(r) = (y * sh + i * dh).checked_sub(ph).filter(|&r| r < h) else {
                out_row.fill(T::ZERO);
                continue;
            };
            for (x, dst) in out_row.chunks_mut(c_in).enumerate() {
                match (x * sw + j * dw).checked_sub(pw).filter(|&q| q < w) {
                    Some(q) => dst.copy_from_slice(&image[(r * w + q) * c_in..][..c_in]),
                    None => dst.fill(T::ZERO),
                }
            }
        }
    });
}

/// Weight gradient (summed over the batch) of a small-plane convolution, one tap at a time, in
/// chunks of [`chunk_images`] images.
pub(super) fn backward_weight<T: KernelFloat>(
    g: &Conv2dGeometry,
    input: &[T],
    grad_output: &[T],
    grad_weight: &mut [T],
) -> Result<()> {
    backward_weight_in_chunks(g, chunk_images(g), input, grad_output, grad_weight)
}

/// [`backward_weight`] in chunks of `chunk` images (at least one).
fn backward_weight_in_chunks<T: KernelFloat>(
    g: &Conv2dGeometry,
    chunk: usize,
    input: &[T],
    grad_output: &[T],
    grad_weight: &mut [T],
) -> Result<()> {
    let (d, c_in, chunk) = (Dims::new(g), g.in_channels, chunk.max(1));
    let len = |a: usize, b: usize| a.checked_mul(b).ok_or_else(too_large);
    let width_most = len(chunk, d.l)?;
    let mut nhwc = HostBuffer::for_overwrite(len(chunk, d.in_image)?)?;
    let mut cols = HostBuffer::for_overwrite(len(width_most, c_in)?)?;
    let mut gathered = HostBuffer::for_overwrite(len(width_most, d.c_out)?)?;
    let parallelism = pool_parallelism();
    let [kh, kw] = g.kernel_size;
    let mut start = 0;
    while start < g.batch {
        let count = chunk.min(g.batch - start);
        let width = count * d.l;
        let xs = &input[start * d.in_image..][..count * d.in_image];
        let nhwc = &mut nhwc.as_mut_slice()[..count * d.in_image];
        to_pixel_major(g, xs, nhwc);
        let planes = &grad_output[start * d.c_out * d.l..][..count * d.c_out * d.l];
        let gathered = &mut gathered.as_mut_slice()[..d.c_out * width];
        gather_planes(d, planes, gathered, true);
        let cols = &mut cols.as_mut_slice()[..width * c_in];
        for t in 0..kh * kw {
            gather_tap(g, [t / kw, t % kw], nhwc, cols);
            // Block `t` of the taps-major gradient: rows `K` apart, columns contiguous. The
            // first chunk overwrites it, the others add to it.
            let operands = (&*gathered, Stored::AsIs, &*cols, Stored::AsIs);
            let dims = [d.c_out, c_in, width];
            let dst = &mut grad_weight[t * c_in..];
            matmul_into_at(dst, [d.k, 1], dims, operands, start > 0, parallelism);
        }
        start += count;
    }
    taps_major_to_weight_order(g, grad_weight)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv::reference::{assert_passes_match_loops, on_pools_of_1_and_3, TestPasses};
    use crate::ops::conv::{cpu, Conv2dParams};

    /// ResNet's small-plane shapes and a dilated, unevenly padded 3x2 kernel, in chunks of
    /// one, two (a short last chunk) and the whole batch, on 1 and 3 threads: the gradient
    /// equals the plain loops (the other passes are `cpu.rs`', for the helper's sake).
    #[test]
    fn tap_by_tap_weight_gradient_equals_the_plain_loops() {
        let cases = [
            ([5, 6, 4, 4], [7, 6, 3, 3], [1, 1], [1, 1], [1, 1], 1),
            ([5, 6, 8, 8], [4, 6, 3, 3], [2, 2], [1, 1], [1, 1], 1),
            ([7, 6, 8, 8], [5, 6, 1, 1], [2, 2], [0, 0], [1, 1], 1),
            ([4, 5, 6, 5], [3, 5, 3, 2], [1, 1], [2, 1], [2, 1], 1),
        ];
        on_pools_of_1_and_3(&cases, |threads, pool, g| {
            for chunk in [1, 2, g.batch] {
                let what = format!("{g:?} in chunks of {chunk} on {threads} thread(s)");
                let passes = TestPasses {
                    forward: &|(x, b), w, out| cpu::conv2d_forward(g, x, w, Some(b), out),
                    backward_input: &|go, w, gin| cpu::conv2d_backward_input(g, go, w, gin),
                    backward_weight: &|x, go, gw| {
                        pool.install(|| backward_weight_in_chunks(g, chunk, x, go, gw))
                    },
                };
                assert_passes_match_loops(&what, g, passes);
            }
        });
    }

    /// The chunks and the order of every sum follow from the geometry: the same bits on 1, 2,
    /// 3 and 8 threads (a layer4-like shape, several chunks, `gemm` split over the pool).
    #[test]
    fn the_gradient_has_the_same_bits_on_any_number_of_threads() {
        let params = Conv2dParams {
            padding: [1, 1],
            ..Conv2dParams::default()
        };
        let g = Conv2dGeometry::new([12, 64, 4, 4], [96, 64, 3, 3], params).unwrap();
        let values = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0)
                .collect()
        };
        let len = |s: [usize; 4]| s.iter().product::<usize>();
        let x = values(len(g.input_shape()), 1);
        let go = values(len(g.output_shape()), 2);
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut gw = vec![f32::NAN; len(g.weight_shape())];
            pool.install(|| backward_weight_in_chunks(&g, 5, &x, &go, &mut gw))
                .unwrap();
            gw
        };
        let one = on(1);
        assert!(one.iter().all(|v| v.is_finite()));
        for threads in [2, 3, 8] {
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&on(threads)), bits(&one), "{threads} threads");
        }
    }

    #[test]
    fn chunks_fill_a_fixed_budget_evened_over_the_batch() {
        let g = |input, weight, stride| {
            let params = Conv2dParams {
                stride: [stride; 2],
                padding: [1, 1],
                ..Conv2dParams::default()
            };
            Conv2dGeometry::new(input, weight, params).unwrap()
        };
        // layer4 (CIFAR): 16 pixels x 512 channels, three times per image: 24,576 elements,
        // 10 images fit 2^18, evened to 4 chunks of 8.
        assert_eq!(chunk_images(&g([32, 512, 4, 4], [512, 512, 3, 3], 1)), 8);
        // layer3: 49,152 per image, 5 fit: 7 chunks (6 of 5 and one of 2).
        assert_eq!(chunk_images(&g([32, 256, 8, 8], [256, 256, 3, 3], 1)), 5);
        // A batch smaller than what fits: one chunk; an image larger than the budget: one.
        assert_eq!(chunk_images(&g([3, 8, 4, 4], [8, 8, 3, 3], 1)), 3);
        assert_eq!(chunk_images(&g([4, 2048, 16, 16], [8, 2048, 3, 3], 2)), 1);
    }

    #[test]
    fn the_environment_picks_the_path_and_other_values_warn() {
        assert_eq!(parse_path(None), (WeightGradPath::Chunks, None));
        assert_eq!(parse_path(Some("taps")), (WeightGradPath::Taps, None));
        assert_eq!(parse_path(Some(" TAPS ")), (WeightGradPath::Taps, None));
        assert_eq!(parse_path(Some("chunks")), (WeightGradPath::Chunks, None));
        for path in [WeightGradPath::Chunks, WeightGradPath::Taps] {
            assert_eq!(parse_path(Some(path.name())), (path, None));
        }
        let (path, warning) = parse_path(Some("tap"));
        assert_eq!(path, WeightGradPath::Chunks);
        let warning = warning.expect("a warning");
        assert!(
            warning.contains("KILN_CONV_WEIGHT_GRAD=\"tap\"") && warning.contains("chunks or taps"),
            "{warning}"
        );
    }
}
