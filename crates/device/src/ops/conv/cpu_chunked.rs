//! CPU conv2d over chunks of images: one GEMM per chunk of `G` images instead of one per image,
//! for convolutions whose output planes are small (ResNet's deep stages: 8x8 down to 4x4 on
//! CIFAR-sized images, 7x7 at 224x224; issue 16).
//!
//! Per image, such a convolution is a GEMM with only `H_out * W_out` (16..64) columns in the
//! forward and input-gradient passes, and of that depth in the weight gradient: `gemm` packs the
//! whole weight again for every image, and the weight gradient (up to 512 x 4608) is read and
//! written once per image. Over a chunk the same products have `G * H_out * W_out` columns.
//!
//! A chunk's matrices: the column matrix is `[K, G * L]` (`K = C_in * kH * kW`, `L = H_out *
//! W_out`), column `i * L + l` being column `l` of image `i`'s im2col matrix; the output (and
//! output-gradient) matrix is `[C_out, G * L]`, scattered to (gathered from) the images' NCHW
//! planes. The copies move `K * L` and `C_out * L` elements per image, small next to the GEMMs'
//! `C_out * K * L` multiply-adds.
//!
//! Invariants: only `groups == 1`; every output element is overwritten; results equal the
//! per-image path's up to the order of float sums; scratch comes from the caching allocator,
//! taken fallibly (an allocation failure is returned, never a panic), and a chunk's column
//! buffer holds at most [`MAX_COL_ELEMS`] elements, so chunking takes at most that (plus the
//! chunk's output-sized matrix) per thread, and the input gradient of a large weight one
//! transposed copy of it per call ([`TRANSPOSE_ONCE_ELEMS`]). Chunks run in parallel, one per
//! pool thread at a time, in the forward and input-gradient passes, each GEMM single-threaded
//! when the chunks fill the pool and split over each chunk's share of it when they do not.
//! The weight gradient has chunks and a column matrix of its own (`cpu_chunked_weight.rs`).

use super::cpu_gemm::{matmul_into, ScratchFailure, Stored};
use super::padded::{copy_rows, fold_add_on, unfold_on, zero_on, Padded};
use super::pieces::{chunked_images_in_parallel, for_each_chunk, for_each_piece, is_split};
use super::subsample::{subsample_plane, unsample_planes};
use super::Conv2dGeometry;
use crate::ops::simd::prefetch_read;
use crate::ops::KernelFloat;
use crate::storage::HostBuffer;
use crate::Result;

/// A chunk's GEMMs aim at this many columns.
const TARGET_COLS: usize = 256;
/// Most elements of one chunk's column matrix (2 MiB of f32), per thread.
pub(super) const MAX_COL_ELEMS: usize = 1 << 19;

/// Images per chunk for `g` on a pool of `threads`, or `None` when one image per GEMM is as
/// good (large planes, grouped convolutions, a batch of one, no input channels, or a column
/// matrix too large).
///
/// Up to [`TARGET_COLS`] columns and [`MAX_COL_ELEMS`] column-matrix elements per chunk, the
/// chunk size is the one whose busiest thread gets the fewest images (chunks go to the threads
/// whole: 32 images in chunks of 7 leave one thread 21 images and the other 11, chunks of 4
/// give both 16); among equally balanced sizes, the largest. The images counted are those the
/// forward and input gradient run one chunk per task ([`chunked_images_in_parallel`]; the
/// images past the pool's whole rounds are split over it): 33 images on two threads count as
/// 32.
pub(super) fn chunk_images(g: &Conv2dGeometry, threads: usize) -> Option<usize> {
    let l = g.col_cols();
    // No input channels: nothing to gather (and no image size to count a chunk's images by).
    if g.params.groups != 1 || l == 0 || l >= TARGET_COLS || g.batch < 2 || g.in_channels == 0 {
        return None;
    }
    let threads = threads.max(1);
    let batch = chunked_images_in_parallel(g.batch, threads);
    let by_memory = MAX_COL_ELEMS / (g.col_rows() * l).max(1);
    let cap = TARGET_COLS.div_ceil(l).min(by_memory).min(batch);
    let busiest = |chunk: usize| (batch.div_ceil(chunk).div_ceil(threads) * chunk).min(batch);
    (2..=cap).rev().min_by_key(|&chunk| busiest(chunk))
}

/// Sizes shared by the three passes.
#[derive(Clone, Copy)]
pub(super) struct Dims {
    /// Column-matrix rows `C_in * kH * kW`.
    pub k: usize,
    /// Output positions per image.
    pub l: usize,
    pub c_out: usize,
    /// Elements of one input image.
    pub in_image: usize,
    pointwise: bool,
    /// See [`Conv2dGeometry::is_subsampling`]: the column rows are the input planes read at
    /// the stride, gathered without a padded copy.
    subsampled: bool,
}

impl Dims {
    pub(super) fn new(g: &Conv2dGeometry) -> Self {
        Self {
            k: g.col_rows(),
            l: g.col_cols(),
            c_out: g.out_channels,
            in_image: g.in_channels * g.input_size[0] * g.input_size[1],
            pointwise: g.is_pointwise(),
            subsampled: g.is_subsampling(),
        }
    }
}

/// Writes the chunk's column matrix `[K, images * L]` of `images` (`images.len() / in_image`
/// images) into `col`: each image in turn is copied into its padded form in `padded` (one
/// padded image), then unfolded into its columns; the copies by channel and by block of rows
/// on the pool when `split` (the chunk runs alone, [`unfold_on`]). A pointwise convolution's
/// rows are the image's planes, and a subsampling one's those planes at its stride, copied
/// straight from the image (the padded copy would hold every phase of the stride, of which
/// the kernel reads one).
fn gather_columns<T: KernelFloat>(
    (g, d, p): (&Conv2dGeometry, Dims, &Padded),
    images: &[T],
    padded: &mut [T],
    col: &mut [T],
    split: bool,
) {
    let count = images.len() / d.in_image;
    let width = count * d.l;
    let col = &mut col[..d.k * width];
    // Blocks of rows: four per thread when split, so that uneven rows still balance.
    let rows = match split {
        true => d.k.div_ceil(4 * rayon::current_num_threads()).max(1),
        false => d.k.max(1),
    };
    for i in 0..count {
        let image = &images[i * d.in_image..][..d.in_image];
        if d.pointwise {
            // K = C_in and L = H * W: the image's rows are the column rows.
            for_each_piece(col, rows * width, split, |b, block| {
                for (j, dst) in block.chunks_mut(width).enumerate() {
                    let r = b * rows + j;
                    copy_rows((&mut dst[i * d.l..], d.l), (&image[r * d.l..], d.l), d.l, 1);
                }
            });
        } else if d.subsampled {
            // K = C_in: row r is plane r read at the stride.
            for_each_piece(col, rows * width, split, |b, block| {
                for (j, dst) in block.chunks_mut(width).enumerate() {
                    subsample_plane(g, image, b * rows + j, &mut dst[i * d.l..][..d.l]);
                }
            });
        } else {
            let padded = &mut padded[..p.len];
            p.fill_on(image, padded, split);
            unfold_on((g, p), padded, 0, col, [width, i * d.l], split);
        }
    }
}

/// Gathers `planes` (`count` images of `[C_out, L]`) into `[C_out, count * L]`, output channels
/// in parallel when `parallel`.
pub(super) fn gather_planes<T: KernelFloat>(d: Dims, planes: &[T], out: &mut [T], parallel: bool) {
    let width = planes.len() / d.c_out;
    let count = width / d.l.max(1);
    for_each_piece(&mut out[..d.c_out * width], width, parallel, |o, row| {
        let stride = d.c_out * d.l;
        copy_rows((row, d.l), (&planes[o * d.l..], stride), d.l, count);
    });
}

/// Forward convolution over chunks of `chunk` images (see [`chunk_images`]).
pub(super) fn forward<T: KernelFloat>(
    g: &Conv2dGeometry,
    chunk: usize,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> Result<()> {
    let d = Dims::new(g);
    let p = Padded::new(g)?;
    let failure = ScratchFailure::new();
    let padded_len = if d.pointwise || d.subsampled {
        0
    } else {
        p.len
    };
    let scratch = || {
        let col = failure.take::<T>(d.k * chunk * d.l)?;
        let padded = failure.take::<T>(padded_len)?;
        let product = failure.take::<T>(d.c_out * chunk * d.l)?;
        Some((col, padded, product))
    };
    let image = d.c_out * d.l;
    for_each_chunk(
        output,
        image,
        chunk,
        scratch,
        |scratch, first, out, parallelism| {
            let Some((col, padded, product)) = scratch.as_mut() else {
                return;
            };
            // A chunk that runs alone, or beside fewer chunks than threads: its copies go on the
            // pool too.
            let split = is_split(parallelism);
            let count = out.len() / image;
            let images = &input[first * d.in_image..][..count * d.in_image];
            let width = count * d.l;
            let col = &mut col.as_mut_slice()[..d.k * width];
            gather_columns((g, d, &p), images, padded, col, split);
            let product = &mut product.as_mut_slice()[..d.c_out * width];
            let dims = [d.c_out, width, d.k];
            let (w, asis) = (Stored::AsIs, Stored::AsIs);
            matmul_into(product, dims, weight, w, col, asis, false, parallelism);
            let product = &*product;
            for_each_piece(out, d.l, split, |plane_index, plane| {
                let (i, o) = (plane_index / d.c_out, plane_index % d.c_out);
                let src = &product[o * width + i * d.l..][..d.l];
                match bias {
                    Some(b) => plane.iter_mut().zip(src).for_each(|(p, &s)| *p = s + b[o]),
                    None => copy_rows((plane, d.l), (src, d.l), d.l, 1),
                }
            });
        },
    );
    failure.into_result()
}

/// Weights of at least this many elements (1 MiB of `f32`, past a core's L2 cache) are
/// transposed once per input-gradient call. Each chunk's product reads the weight transposed,
/// and `gemm` packs a transposed operand with strided reads, once per chunk: a weight that
/// does not stay in cache is then read from memory line by line once per chunk (layer4's
/// 9 MiB weight, several times per pass at batch 32). A contiguous transposed copy, made once,
/// is packed with contiguous reads. Below this size the copy costs about what it saves.
const TRANSPOSE_ONCE_ELEMS: usize = 1 << 18;

/// Input gradient over chunks of `chunk` images: each chunk's column-matrix gradient is folded
/// back onto each image's padded gradient, whose interior is the image's input gradient.
/// Small planes of any stride come here (`cpu.rs` tries the chunks before the transposed
/// forward that wide stride-1 planes take).
pub(super) fn backward_input<T: KernelFloat>(
    g: &Conv2dGeometry,
    chunk: usize,
    grad_output: &[T],
    weight: &[T],
    grad_input: &mut [T],
) -> Result<()> {
    let transpose_once = weight.len() >= TRANSPOSE_ONCE_ELEMS;
    backward_input_with(g, chunk, grad_output, weight, grad_input, transpose_once)
}

/// `weight` (`[C_out, K]`) transposed into a new `[K, C_out]` buffer from the allocator, on the
/// pool: each task writes a band of `BAND` rows, reading `BAND` contiguous values of each
/// weight row in turn. Not the strided copy of a transposed layout
/// (`strided::copy_contiguous_into`): it reads each destination row at a stride of `K`, one
/// cache line per value, and made layer4's whole input gradient 17 -> 22 ms (like
/// `cpu_input_grad.rs`'s `rotate_weight`, which tiles its reads for the same reason).
fn transposed_weight<T: KernelFloat>(d: Dims, weight: &[T]) -> Result<HostBuffer<T>> {
    const BAND: usize = 16;
    // How many rows ahead each row's values are prefetched: 8 measured best on Zen 2, against
    // 16 and 32 (layer4's whole input gradient took 17.3 ms without the prefetch, 15.8 with).
    const PREFETCH_ROWS: usize = 8;
    let mut out = HostBuffer::<T>::for_overwrite(weight.len())?;
    // Past `usize` only for a weight larger than memory; a chunk past the end is the whole.
    let rows_len = BAND.saturating_mul(d.c_out);
    crate::ops::par::chunks_mut(out.as_mut_slice(), rows_len, &|band, rows| {
        let first = band * BAND;
        let width = rows.len() / d.c_out;
        for (c, w_row) in weight.chunks_exact(d.k).enumerate() {
            // Rows lie `K` apart (18 KiB in layer4), too far for the CPU's prefetchers.
            if let Some(ahead) = weight.get((c + PREFETCH_ROWS) * d.k + first) {
                prefetch_read(ahead);
            }
            for (i, &v) in w_row[first..first + width].iter().enumerate() {
                rows[i * d.c_out + c] = v;
            }
        }
    });
    Ok(out)
}

/// [`backward_input`], with the weight transposed once up front or read transposed by each
/// chunk's product.
fn backward_input_with<T: KernelFloat>(
    g: &Conv2dGeometry,
    chunk: usize,
    grad_output: &[T],
    weight: &[T],
    grad_input: &mut [T],
    transpose_once: bool,
) -> Result<()> {
    let d = Dims::new(g);
    let weight_t = if transpose_once && d.c_out > 0 && d.k > 0 {
        Some(transposed_weight(d, weight)?)
    } else {
        None
    };
    let (a, a_stored) = match &weight_t {
        Some(w) => (w.as_slice(), Stored::AsIs),
        None => (weight, Stored::Transposed),
    };
    let p = Padded::new(g)?;
    let failure = ScratchFailure::new();
    let scratch = || {
        let gathered = failure.take::<T>(d.c_out * chunk * d.l)?;
        let col = failure.take::<T>(d.k * chunk * d.l)?;
        let padded_grad = failure.take::<T>(if d.subsampled { 0 } else { p.len })?;
        Some((gathered, col, padded_grad))
    };
    let image = d.in_image;
    for_each_chunk(
        grad_input,
        image,
        chunk,
        scratch,
        |scratch, first, gin, parallelism| {
            let Some((gathered, col, padded_grad)) = scratch.as_mut() else {
                return;
            };
            // A chunk that runs alone, or beside fewer chunks than threads: its copies and sums go
            // on the pool too.
            let split = is_split(parallelism);
            let count = gin.len() / image;
            let width = count * d.l;
            let planes = &grad_output[first * d.c_out * d.l..][..count * d.c_out * d.l];
            let gathered = &mut gathered.as_mut_slice()[..d.c_out * width];
            gather_planes(d, planes, gathered, split);
            let col = &mut col.as_mut_slice()[..d.k * width];
            let dims = [d.k, width, d.c_out];
            matmul_into(
                col,
                dims,
                a,
                a_stored,
                gathered,
                Stored::AsIs,
                false,
                parallelism,
            );
            for (i, gin_image) in gin.chunks_mut(image).enumerate() {
                if d.subsampled {
                    unsample_planes(g, col, [width, i * d.l], gin_image, split);
                    continue;
                }
                zero_on(padded_grad, split);
                fold_add_on((g, &p), col, 0, [width, i * d.l], padded_grad, split);
                p.unpad_on(padded_grad, gin_image, split);
            }
        },
    );
    failure.into_result()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv::cpu_chunked_weight::backward_weight;
    use crate::ops::conv::reference::{assert_passes_match_loops, TestPasses};
    use crate::ops::conv::Conv2dParams;

    /// ResNet's small-plane shapes (3x3 stride 1 and 2, the 1x1 stride-2 downsample, a 1x1
    /// stride-1 pointwise one), on 1, 2 and 4 threads, with batches of 3 to 7: chunks of
    /// different lengths, an image past the pool's whole rounds (5 and 7 images on 2 threads,
    /// 5 on 4; split over the pool, copies included), fewer chunks than threads (3 images on
    /// 4: their products split): every pass equals the plain loops, the input gradient with and
    /// without the weight transposed once.
    #[test]
    fn chunked_passes_equal_the_plain_loops_on_small_planes() {
        let cases = [
            ([5, 6, 4, 4], [7, 6, 3, 3], 1, 1),
            ([5, 6, 8, 8], [4, 6, 3, 3], 2, 1),
            ([7, 6, 8, 8], [5, 6, 1, 1], 2, 0),
            ([3, 6, 5, 3], [4, 6, 1, 1], 1, 0),
            // Rows 8 and 7 wide at stride 1 (the fixed-width row copies of `padded.rs`).
            ([5, 4, 8, 8], [5, 4, 3, 3], 1, 1),
            ([5, 4, 7, 7], [3, 4, 3, 3], 1, 1),
        ];
        // (dilation, padding): a dilated, unevenly padded 3x2 kernel, whose taps the
        // pixel-major weight gradient indexes differently from the column matrix.
        let spread = [([4, 5, 6, 5], [3, 5, 3, 2], 1, [2, 1], [2, 1])];
        let cases = cases
            .map(|(x, w, s, p)| (x, w, s, [1, 1], [p, p]))
            .into_iter()
            .chain(spread);
        for threads in [1, 2, 4] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for (input_shape, weight_shape, stride, dilation, padding) in cases.clone() {
                let params = Conv2dParams {
                    stride: [stride; 2],
                    dilation,
                    padding,
                    ..Conv2dParams::default()
                };
                let g = Conv2dGeometry::new(input_shape, weight_shape, params).unwrap();
                let chunk = chunk_images(&g, threads).expect("small planes are chunked");
                // On 2 and 4 threads the chunks are smaller than the batch.
                assert!(chunk >= 2 && (threads == 1 || chunk < g.batch), "{chunk}");
                // The input gradient both with the weight transposed once and read transposed
                // by each chunk's product (the size rule picks the second for these weights).
                for transpose_once in [false, true] {
                    let what = format!("{g:?} on {threads} thread(s), {transpose_once}");
                    let passes = TestPasses {
                        forward: &|(x, b), w, out| {
                            pool.install(|| forward(&g, chunk, x, w, Some(b), out))
                        },
                        backward_input: &|go, w, gin| {
                            pool.install(|| {
                                backward_input_with(&g, chunk, go, w, gin, transpose_once)
                            })
                        },
                        backward_weight: &|x, go, gw| {
                            pool.install(|| backward_weight(&g, chunk, x, go, gw))
                        },
                    };
                    assert_passes_match_loops(&what, &g, passes);
                }
            }
        }
    }

    #[test]
    fn large_planes_grouped_convolutions_and_single_images_stay_per_image() {
        let g = |input, weight, groups| {
            let params = Conv2dParams {
                groups,
                padding: [1, 1],
                ..Conv2dParams::default()
            };
            Conv2dGeometry::new(input, weight, params).unwrap()
        };
        assert_eq!(chunk_images(&g([8, 4, 32, 32], [4, 4, 3, 3], 1), 2), None);
        assert_eq!(chunk_images(&g([8, 4, 4, 4], [4, 2, 3, 3], 2), 2), None);
        assert_eq!(chunk_images(&g([1, 4, 4, 4], [4, 4, 3, 3], 1), 2), None);
        // 4x4 planes: 16 images make 256 columns, and 32 images split evenly in chunks of 16
        // on 2 threads, 8 on 4.
        assert_eq!(
            chunk_images(&g([32, 4, 4, 4], [4, 4, 3, 3], 1), 2),
            Some(16)
        );
        assert_eq!(chunk_images(&g([32, 4, 4, 4], [4, 4, 3, 3], 1), 4), Some(8));
        // ResNet's layer4 on CIFAR: 4608 x 16 per image, 7 images fit the column cap, but
        // chunks of 7 leave one of 2 threads 21 of the 32 images; chunks of 4 give each 16.
        let deep = g([32, 512, 4, 4], [512, 512, 3, 3], 1);
        assert_eq!(MAX_COL_ELEMS / (4608 * 16), 7);
        assert_eq!(chunk_images(&deep, 2), Some(4));
        // On one thread there is nothing to balance: the largest chunk.
        assert_eq!(chunk_images(&deep, 1), Some(7));
        // layer3 (2304 x 64 per image, cap 3): chunks of 2 give each thread 16 images, 3 give
        // one of them 18.
        let mid = g([32, 256, 8, 8], [256, 256, 3, 3], 1);
        assert_eq!(chunk_images(&mid, 2), Some(2));
        // 33 images: the 32 of the whole rounds balance in chunks of 2 (3 would give one thread
        // 18 of them), the last is split over the pool.
        let odd = g([33, 256, 8, 8], [256, 256, 3, 3], 1);
        assert_eq!(chunk_images(&odd, 2), Some(2));
        // Two images on two threads make one chunk (whose products then take both threads,
        // `pieces.rs`).
        let pair = g([2, 512, 4, 4], [512, 512, 3, 3], 1);
        assert_eq!(chunk_images(&pair, 2), Some(2));
    }
}
