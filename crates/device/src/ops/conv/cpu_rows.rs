//! CPU conv2d over padded rows: the column matrix is built with one contiguous copy per row
//! instead of one per output row and tap.
//!
//! Each image is first copied into its padded form (`padded.rs`: at stride 1, per channel
//! `H + 2·pad_h` rows of pitch `P = W + pad_w`, zeros around the values; at other strides the
//! padded image's phases, whose rows are `P` apart too). Tap `(c, i, j)` at output `(oh, ow)`
//! reads the padded buffer at `start(c, i, j) + oh·P + ow`: numbering output positions
//! `p = oh·P + ow` over rows of `P` (not `W_out`) columns, every row of the column matrix is the
//! padded buffer from `start(c, i, j)` on, `N' = H_out·P` elements long: one `copy_from_slice`
//! per row. The `P - W_out` extra positions of each output row are junk: the forward drops
//! their columns when it copies the product out, and the weight gradient zeroes them in the
//! column matrix (they can read real inputs past a row's end) and multiplies them by output
//! gradients set to zero there. The padded buffer's slack (at least `dil_w·(kW - 1)` zeros)
//! keeps the last row's junk reads inside it.
//!
//! In f32, on a CPU with AVX-512F or AVX2 and FMA, the forward does not build the column matrix
//! at all: `cpu.rs` sends it to `cpu_direct.rs`, which reads its rows straight from the padded
//! image with this file's [`Rows`] sizes.
//! The weight gradient keeps the column matrix: its reduction runs along the rows, which `gemm`
//! packs well, and a direct kernel measured slower there.
//!
//! The layout fits where the junk costs at most an eighth more GEMM work and, at stride 1, the
//! padding is no wider than the kernel's reach (`pad_w <= dil_w·(kW - 1)`, so no output reads
//! two padding runs at once) ([`rows_fit`]). This file's passes serve stride 1 ([`use_rows`]);
//! strided convolutions take the layout only for the direct forward. Small planes go through
//! `cpu_chunked.rs`, the rest through the per-image im2col.
//!
//! Invariants: every output element (forward) and every weight-gradient element is written;
//! results equal the per-image path's up to the order of float sums (the junk columns add exact
//! zeros); scratch comes from the caching allocator, taken fallibly; images run in parallel (one
//! task per image in the forward, one contiguous slice of images per thread in the weight
//! gradient, slices summed in order) as far as they fill whole rounds of the pool, and the
//! images left (a batch smaller than the pool, or a few past its whole rounds) one after
//! another with `gemm` splitting each product instead (`pieces.rs`).

use super::cpu_gemm::{matmul_into, sum_transposed_partials, ScratchFailure, Stored, TaskContext};
use super::padded::{taps, too_large, Padded};
use super::pieces::{
    for_each_image, for_each_piece, image_parallelism, is_split, weight_grad_partials,
};
use super::Conv2dGeometry;
use crate::ops::KernelFloat;
use crate::storage::HostBuffer;
use crate::Result;
use rayon::prelude::*;

/// Whether the padded-row layout fits `g`: [`layout`] applies and junk columns add at most an
/// eighth to the products. Where it fits, the f32 forward runs without a column matrix
/// (`cpu_direct.rs`, whose own bound, [`super::cpu_direct::fits`], is looser).
pub(super) fn rows_fit(g: &Conv2dGeometry) -> bool {
    layout(g).is_some_and(|d| d.padded.pitch * 8 <= d.out_w * 9)
}

/// The padded-row sizes of `g` where the layout applies at all, whatever its junk costs: a
/// kernel wider than one tap or some padding (a pointwise convolution needs no column matrix),
/// at stride 1 padding no wider than the kernel's reach (the shared zero run), and some output.
pub(super) fn layout(g: &Conv2dGeometry) -> Option<Rows> {
    let reach = g.params.dilation[1] * (g.kernel_size[1] - 1);
    let one_zero_run = g.params.stride != [1, 1] || g.params.padding[1] <= reach;
    if g.is_pointwise() || !one_zero_run {
        return None;
    }
    Rows::new(g).ok().filter(|d| d.out_w > 0)
}

/// Whether this file's column-matrix passes serve `g`: stride 1 where the layout fits. A
/// strided convolution's weight gradient measured slower over the phases' padded rows than
/// through the per-image im2col (which reads the same phases), so only its direct forward
/// takes them.
pub(super) fn use_rows(g: &Conv2dGeometry) -> bool {
    g.params.stride == [1, 1] && rows_fit(g)
}

/// The padded-row sizes of one convolution.
#[derive(Clone, Copy)]
pub(super) struct Rows {
    /// The padded image (`padded.rs`), whose pitch `P` the column matrix's rows follow.
    pub(super) padded: Padded,
    pub(super) out_w: usize,
    /// Columns `H_out · P` of the column matrix and of the products.
    pub(super) n_ext: usize,
    pub(super) groups: usize,
    /// Column-matrix rows per group: `C_in/groups · kH · kW`.
    pub(super) k: usize,
    /// Output channels per group.
    pub(super) group_out: usize,
}

impl Rows {
    pub(super) fn new(g: &Conv2dGeometry) -> Result<Self> {
        let padded = Padded::new(g)?;
        let groups = g.params.groups;
        Ok(Self {
            padded,
            out_w: g.output_size[1],
            n_ext: g.output_size[0]
                .checked_mul(padded.pitch)
                .ok_or_else(too_large)?,
            groups,
            k: g.in_channels / groups * g.kernel_size[0] * g.kernel_size[1],
            group_out: g.out_channels / groups,
        })
    }

    /// Elements of one image's output planes.
    pub(super) fn out_image(&self, g: &Conv2dGeometry) -> usize {
        g.out_channels * g.output_size[0] * g.output_size[1]
    }
}

/// Writes group `group`'s column matrix `[K, N']` from a padded image: row `r` is the padded
/// buffer from where tap `r` reads output `(0, 0)` on, `N'` elements, with its junk columns
/// (`W_out..P` of every output row) zeroed when `zero_junk` (each row while it is in cache).
/// The rows are copied on the pool when `parallel` (a batch too small to fill the pool, whose
/// images run one after another).
fn unfold<T: KernelFloat>(
    (g, d): (&Conv2dGeometry, &Rows),
    padded: &[T],
    group: usize,
    col: &mut [T],
    [parallel, zero_junk]: [bool; 2],
) {
    let col = &mut col[..d.k * d.n_ext];
    let junk = d.padded.pitch - d.out_w;
    let copy = |(row, start): (&mut [T], usize)| {
        row.copy_from_slice(&padded[start..][..d.n_ext]);
        if !zero_junk {
            return;
        }
        let output_rows = row.chunks_exact_mut(d.padded.pitch);
        if junk == 1 {
            // A 3x3 kernel with padding 1: a store per output row, where `fill` would make a
            // `memset` call per row (5 % of layer1's weight gradient).
            output_rows.for_each(|r| r[d.out_w] = T::ZERO);
        } else {
            output_rows.for_each(|r| r[d.out_w..].fill(T::ZERO));
        }
    };
    if parallel {
        let starts: Vec<usize> = taps(g, &d.padded, group).collect();
        col.par_chunks_mut(d.n_ext)
            .zip(starts.into_par_iter())
            .for_each(copy);
    } else {
        col.chunks_mut(d.n_ext)
            .zip(taps(g, &d.padded, group))
            .for_each(copy);
    }
}

/// Forward convolution ([`use_rows`]).
pub(super) fn forward<T: KernelFloat>(
    g: &Conv2dGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> Result<()> {
    let d = Rows::new(g)?;
    let in_image = d.padded.image_len();
    let out_w = d.out_w;
    let failure = ScratchFailure::new();
    let one_image = |scratch: &mut Option<[HostBuffer<T>; 3]>, n: usize, out: &mut [T], split| {
        let Some([padded, col, product]) = scratch.as_mut() else {
            return;
        };
        let parallelism = image_parallelism(split);
        d.padded
            .fill_on(&input[n * in_image..][..in_image], padded, split);
        for group in 0..d.groups {
            unfold((g, &d), padded, group, col, [split, false]);
            let w = &weight[group * d.group_out * d.k..][..d.group_out * d.k];
            let dims = [d.group_out, d.n_ext, d.k];
            let asis = Stored::AsIs;
            matmul_into(product, dims, w, asis, col, asis, false, parallelism);
            let product = &product[..];
            let rows = |o: usize, oh: usize, ow: usize| {
                &product[o * d.n_ext + oh * d.padded.pitch + ow..][..out_w - ow]
            };
            copy_out(g, d.group_out, group, bias, split, out, rows);
        }
    };
    let scratch = || -> Option<[HostBuffer<T>; 3]> {
        Some([
            failure.take::<T>(d.padded.len)?,
            failure.take::<T>(d.k * d.n_ext)?,
            failure.take::<T>(d.group_out * d.n_ext)?,
        ])
    };
    for_each_image(output, d.out_image(g), scratch, one_image);
    failure.into_result()
}

/// Writes `group`'s output planes of one image (`out` holds all its groups) from a product over
/// padded rows, adding the bias: `source(o, oh, ow)` gives channel `o`'s outputs of row `oh`
/// from column `ow` on, as many as lie contiguously (at least one), and is asked again for the
/// rest. Channels run on the pool when `split` (the image's other work is spread over it too).
pub(super) fn copy_out<'a, T: KernelFloat>(
    g: &Conv2dGeometry,
    group_out: usize,
    group: usize,
    bias: Option<&[T]>,
    split: bool,
    out: &mut [T],
    source: impl Fn(usize, usize, usize) -> &'a [T] + Sync,
) {
    let [out_h, out_w] = g.output_size;
    let plane_len = out_h * out_w;
    let planes = &mut out[group * group_out * plane_len..][..group_out * plane_len];
    let one_plane = |o: usize, plane: &mut [T]| {
        let b = bias.map_or(T::ZERO, |b| b[group * group_out + o]);
        for (oh, row) in plane.chunks_mut(out_w).enumerate() {
            let mut ow = 0;
            while ow < out_w {
                let src = source(o, oh, ow);
                let dst = &mut row[ow..ow + src.len()];
                match bias {
                    Some(_) => dst.iter_mut().zip(src).for_each(|(r, &s)| *r = s + b),
                    None => dst.copy_from_slice(src),
                }
                ow += src.len();
            }
        }
    };
    for_each_piece(planes, plane_len, split, one_plane);
}

/// Weight gradient ([`use_rows`]), summed over the batch into `grad_weight`.
pub(super) fn backward_weight<T: KernelFloat>(
    g: &Conv2dGeometry,
    input: &[T],
    grad_output: &[T],
    grad_weight: &mut [T],
) -> Result<()> {
    let d = Rows::new(g)?;
    let in_image = d.padded.image_len();
    let (out_h, out_w) = (g.output_size[0], d.out_w);
    let out_image = d.out_image(g);
    let group_weight = d.group_out * d.k;
    let context = TaskContext::of_caller();
    let partials = weight_grad_partials(g.batch, |images, parallelism| -> Result<HostBuffer<T>> {
        let _context = context.enter();
        // A slice whose products `gemm` splits: its copies go on the pool too.
        let split = is_split(parallelism);
        // Transposed per group: `[K, C_out/groups]`, written by the slice's first image
        // and added to by the others.
        let mut partial = HostBuffer::for_overwrite(grad_weight.len())?;
        let mut padded = HostBuffer::for_overwrite(d.padded.len)?;
        let mut col = HostBuffer::for_overwrite(d.k * d.n_ext)?;
        // The output gradient on the padded-row grid, zero in the junk columns.
        let mut gout = HostBuffer::try_scratch(g.out_channels * d.n_ext, T::ZERO)?;
        let first = images.start;
        for n in images {
            d.padded
                .fill_on(&input[n * in_image..][..in_image], &mut padded, split);
            let planes = &grad_output[n * out_image..][..out_image];
            let plane_len = out_h * out_w;
            for_each_piece(&mut gout[..], d.n_ext, split, |o, grid| {
                let plane = &planes[o * plane_len..][..plane_len];
                for (row, to) in plane.chunks(out_w).zip(grid.chunks_mut(d.padded.pitch)) {
                    to[..out_w].copy_from_slice(row);
                }
            });
            for group in 0..d.groups {
                // Junk columns can read real inputs (past a row's end); zeroed, an
                // infinite input there cannot turn their zero products into NaN.
                unfold((g, &d), &padded, group, &mut col, [split, true]);
                let go = &gout[group * d.group_out * d.n_ext..][..d.group_out * d.n_ext];
                let part = &mut partial[group * group_weight..][..group_weight];
                let dims = [d.k, d.group_out, d.n_ext];
                let (asis, t) = (Stored::AsIs, Stored::Transposed);
                matmul_into(part, dims, &col, asis, go, t, n > first, parallelism);
            }
        }
        Ok(partial)
    })?;
    sum_transposed_partials(&partials, d.k, d.group_out, grad_weight);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv::cpu::{conv2d_backward_input, conv2d_backward_weight, conv2d_forward};
    use crate::ops::conv::reference::{
        self, assert_passes_match_loops, on_pools_of_1_and_3, test_values as values, TestPasses,
    };
    use crate::ops::conv::Conv2dParams;

    /// Wide planes take the padded-row layout (ResNet's 3x3 "same" convolution, uneven padding
    /// and dilation, two groups, a 2x2 kernel without padding), with batches of one (gemm split
    /// over the pool) and of several images (images in parallel, uneven weight-gradient slices;
    /// four on three threads leave one image past the whole round, split over the pool),
    /// on 1 and 3 threads: forward and weight gradient through the rows, the input gradient
    /// through the transposed forward, all equal the plain loops (every stride-1 case is too
    /// wide, or grouped, or a single image, to be chunked). Strided ones fit the layout over the
    /// padded image's phases: their passes take the direct kernel, the phased im2col and fold,
    /// or the chunks, also equal to the plain loops.
    #[test]
    fn padded_rows_equal_the_plain_loops_on_wide_planes() {
        let cases = [
            ([1, 3, 17, 18], [4, 3, 3, 3], [1, 1], [1, 1], [1, 1], 1),
            ([5, 3, 17, 18], [4, 3, 3, 3], [1, 1], [1, 1], [1, 1], 1),
            ([4, 4, 9, 20], [6, 2, 3, 2], [1, 1], [2, 1], [1, 2], 2),
            ([2, 2, 14, 24], [3, 2, 2, 2], [1, 1], [0, 0], [1, 1], 1),
            // Strided, over the padded image's phases: a 7x7 stem, a 3x3 downsampling
            // convolution, unequal strides, dilation with groups, an uneven kernel and padding.
            ([2, 3, 21, 60], [4, 3, 7, 7], [2, 2], [3, 3], [1, 1], 1),
            ([3, 4, 17, 36], [5, 4, 3, 3], [2, 2], [1, 1], [1, 1], 1),
            ([4, 4, 17, 36], [5, 4, 3, 3], [2, 2], [1, 1], [1, 1], 1),
            ([2, 4, 9, 40], [6, 4, 3, 3], [2, 3], [1, 1], [1, 1], 1),
            ([2, 4, 15, 34], [6, 2, 3, 3], [2, 2], [2, 2], [2, 2], 2),
            ([1, 3, 18, 41], [4, 3, 4, 5], [3, 2], [0, 2], [1, 1], 1),
        ];
        on_pools_of_1_and_3(&cases, |threads, pool, g| {
            let strided = g.params.stride != [1, 1];
            let chunked = crate::ops::conv::cpu_chunked::chunk_images(g, threads).is_some();
            assert!(
                strided || !chunked,
                "{g:?} runs on the padded rows, not in chunks"
            );
            assert!(
                rows_fit(g) && use_rows(g) != strided,
                "{g:?} fits the padded rows"
            );
            let what = format!("{g:?} on {threads} thread(s)");
            let passes = TestPasses {
                forward: &|(x, b), w, out| pool.install(|| conv2d_forward(g, x, w, Some(b), out)),
                backward_input: &|go, w, gin| pool.install(|| conv2d_backward_input(g, go, w, gin)),
                backward_weight: &|x, go, gw| pool.install(|| conv2d_backward_weight(g, x, go, gw)),
            };
            assert_passes_match_loops(&what, g, passes);
        });
    }

    /// Empty convolutions never panic. No input channels (so no taps): the output is the bias
    /// and the weight gradient empty, on a wide plane (the padded rows, and the direct kernel
    /// where the CPU has it) and on a small one (not chunked: there is no image to chunk). No
    /// output channels: an empty output and a zero input gradient. No images: a zero weight
    /// gradient.
    #[test]
    fn empty_convolutions_give_biases_and_zeros() {
        let params = Conv2dParams {
            padding: [1, 1],
            ..Conv2dParams::default()
        };
        for [h, w] in [[17, 18], [5, 6]] {
            let g = Conv2dGeometry::new([2, 0, h, w], [7, 0, 3, 3], params).unwrap();
            assert_eq!(use_rows(&g), h == 17);
            let plane = h * w;
            let bias: Vec<f32> = (0..7).map(|o| o as f32 - 2.5).collect();
            let mut out = vec![f32::NAN; 2 * 7 * plane];
            conv2d_forward(&g, &[], &[], Some(&bias), &mut out).unwrap();
            for (i, v) in out.iter().enumerate() {
                assert_eq!(*v, bias[i / plane % 7], "{h}x{w}: element {i}");
            }
            let go = vec![1.0f32; out.len()];
            conv2d_backward_input(&g, &go, &[], &mut []).unwrap();
            conv2d_backward_weight(&g, &[], &go, &mut []).unwrap();
        }
        // No output channels either way round: empty outputs and gradients, no panic.
        for [h, w] in [[17, 18], [5, 6]] {
            let g = Conv2dGeometry::new([2, 3, h, w], [0, 3, 3, 3], params).unwrap();
            let x = vec![1.0f32; 2 * 3 * h * w];
            conv2d_forward(&g, &x, &[], None, &mut []).unwrap();
            let mut gin = vec![f32::NAN; x.len()];
            conv2d_backward_input(&g, &[], &[], &mut gin).unwrap();
            assert!(
                gin.iter().all(|&v| v == 0.0),
                "{h}x{w}: the input gradient is zero"
            );
            conv2d_backward_weight(&g, &x, &[], &mut []).unwrap();
        }
        // No images: the weight gradient is a sum over nothing.
        let g = Conv2dGeometry::new([0, 3, 17, 18], [4, 3, 3, 3], params).unwrap();
        let mut gw = vec![f32::NAN; 4 * 3 * 9];
        conv2d_backward_weight(&g, &[], &[], &mut gw).unwrap();
        assert!(gw.iter().all(|&v| v == 0.0));
    }

    /// An infinite input at the start of a row (where the junk columns of the row above read)
    /// gives the weight gradient the plain loops give: infinite where a tap really reads it,
    /// finite elsewhere, and no NaN from the junk.
    #[test]
    fn junk_columns_never_reach_the_weight_gradient() {
        let params = Conv2dParams {
            padding: [1, 1],
            ..Conv2dParams::default()
        };
        // 16 rows: a plane too large to be chunked, so the padded rows run.
        let g = Conv2dGeometry::new([2, 2, 16, 18], [3, 2, 3, 3], params).unwrap();
        let chunked = crate::ops::conv::cpu_chunked::chunk_images(&g, 8);
        assert!(use_rows(&g) && chunked.is_none());
        let n = |s: [usize; 4]| s.iter().product::<usize>();
        let mut x = values(n(g.input_shape()), 5);
        x[2 * 18] = f64::INFINITY; // image 0, channel 0, row 2, column 0
        let go: Vec<f64> = values(n(g.output_shape()), 6)
            .iter()
            .map(|v| v.abs() + 0.25)
            .collect();
        let (mut gw, mut want) = (vec![9.0; 3 * 2 * 9], vec![0.0; 3 * 2 * 9]);
        conv2d_backward_weight(&g, &x, &go, &mut gw).unwrap();
        reference::conv2d_backward_weight(&g, &x, &go, &mut want).unwrap();
        assert!(want.iter().any(|v| v.is_finite()) && want.iter().any(|v| v.is_infinite()));
        assert!(!want.iter().any(|v| v.is_nan()));
        // Infinities must match exactly and NaN matches only NaN (there is none to match).
        kiln_testkit::assert_close("grad_weight", &gw, &want, (1e-10, 1e-10));
    }

    #[test]
    fn narrow_strided_and_pointwise_convolutions_do_not_take_the_rows() {
        let g = |input, weight, stride, padding| {
            let params = Conv2dParams {
                stride,
                padding,
                ..Conv2dParams::default()
            };
            Conv2dGeometry::new(input, weight, params).unwrap()
        };
        // ResNet: 32x32 (33 / 32 columns), 16x16 (17 / 16) and 8x8 (9 / 8) take them, 4x4
        // (5 / 4) does not; nor does a pointwise convolution, or padding wider than the
        // kernel's reach at stride 1 (3 past a 3-tap kernel). Stride 2: a 224x224 stem (115 /
        // 112) and a 3x3 on 56x56 (29 / 28) fit them (for the direct forward only), a 3x3 on
        // 14x14 (8 / 7) does not.
        assert!(use_rows(&g([8, 4, 32, 32], [4, 4, 3, 3], [1, 1], [1, 1])));
        assert!(use_rows(&g([8, 4, 16, 16], [4, 4, 3, 3], [1, 1], [1, 1])));
        assert!(use_rows(&g([8, 4, 8, 8], [4, 4, 3, 3], [1, 1], [1, 1])));
        assert!(!use_rows(&g([8, 4, 4, 4], [4, 4, 3, 3], [1, 1], [1, 1])));
        assert!(!use_rows(&g([8, 4, 32, 32], [4, 4, 3, 3], [1, 1], [3, 3])));
        let fit_only = |g: Conv2dGeometry| rows_fit(&g) && !use_rows(&g);
        assert!(fit_only(g([8, 3, 224, 224], [4, 3, 7, 7], [2, 2], [3, 3])));
        assert!(fit_only(g([8, 4, 56, 56], [4, 4, 3, 3], [2, 2], [1, 1])));
        assert!(!rows_fit(&g([8, 4, 14, 14], [4, 4, 3, 3], [2, 2], [1, 1])));
        assert!(!use_rows(&g([8, 4, 32, 32], [4, 4, 1, 1], [1, 1], [0, 0])));
    }
}
