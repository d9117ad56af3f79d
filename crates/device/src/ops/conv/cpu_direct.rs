//! The padded-row product of a convolution without a column matrix: an f32 kernel,
//! compiled for AVX-512F and for AVX2 + FMA and chosen at run time, that reads each tap's row
//! straight from the padded image (`cpu_rows.rs` explains the layout).
//!
//! `cpu_rows.rs` multiplies the weight `[C_out/groups, K]` by a column matrix whose row `r` is
//! the padded image from `start(r)` on, `N'` elements: it first copies those rows out, then
//! `gemm` packs them again. Here the product is computed in tiles of [`ROWS`] output channels
//! by [`WIDE`] positions (AVX-512; a strip's last tile as many 16-lane vectors as its positions
//! need) or 16 (AVX2; 8 where at most 8 positions of a strip remain), each tile accumulating
//! `K` rank-1 updates in registers: for tap `r`, consecutive values of the padded image from
//! `start(r) + p0` times the tile's [`ROWS`] weights of column `r`, read in place from the
//! weight's rows ([`WeightRows`]). Nothing is copied besides the padded image itself: neither
//! the input nor the weight.
//! [`forward`] runs it where [`fits`] says (`cpu.rs` tries it after the chunks of small planes
//! and before `cpu_rows.rs`'s column matrix): per image the padded image, per group the product
//! and its copy into the output planes.
//!
//! Layout of the product: strips of [`WIDE`] positions, one after another, each holding its
//! `C_out/groups` rows of [`WIDE`] values (`[strip][channel][WIDE]`), so every strip's block
//! of [`ROWS`] channels is one contiguous piece that one task writes. The last strip's
//! positions past `N'` (up to [`SLACK`] - 1 of them) are junk like the row ends: they read the
//! padded image's slack, which the caller extends by [`SLACK`] zeros, and are never copied
//! out.
//!
//! Invariants: every position `< N'` of every channel is written; each output is the sum over
//! taps in order `r = 0, 1, ..` of fused multiply-adds, so the result does not depend on the
//! thread count, the strip, the tile width or the instruction set (every build compiles the
//! same portable body); the kernel is only chosen where the CPU has AVX-512F or AVX2 with FMA
//! (`simd.rs`; elsewhere `cpu_rows.rs` keeps its column matrix and `gemm`), and only for at least
//! [`ROWS`] output channels per group.

use super::cpu_gemm::ScratchFailure;
#[cfg(doc)]
use super::cpu_rows::rows_fit;
use super::cpu_rows::{copy_out, layout, Rows};
use super::padded::{taps, too_large};
use super::pieces::for_each_image;
use super::Conv2dGeometry;
use crate::ops::simd::{self, simd_dispatch, Isa};
use crate::ops::KernelFloat;
use crate::storage::HostBuffer;
use crate::Result;
use rayon::prelude::*;
use std::any::TypeId;

/// Output channels per tile.
pub(super) const ROWS: usize = 6;
/// Positions per strip (and per full tile): four 16-lane vectors.
pub(super) const WIDE: usize = 64;
/// Positions per tile at the end of a strip: one 16-lane vector.
const NARROW: usize = 16;
/// Positions of the last tile of a strip with AVX2 when at most this many remain: one 8-lane
/// vector, where a [`NARROW`] tile would spend a second vector instruction on junk.
const HALF: usize = 8;
/// Fewest multiply-adds a parallel task of [`product`] takes (a few microseconds' work).
const MIN_TASK_FMAS: usize = 1 << 18;
/// Zeros the caller adds after the padded image's slack, for the last strip's junk reads.
pub(super) const SLACK: usize = NARROW;
/// Most positions the kernel may compute per output it keeps, as `[numerator, denominator]`
/// ([`fits`]).
const MOST_COMPUTED: [usize; 2] = [4, 3];

/// Whether the direct forward serves `g` where no chunk of images does (the caller asks
/// `cpu_chunked.rs` first): the padded-row layout applies ([`layout`]) and the positions the
/// kernel computes (`H_out·P`, rounded up to whole vectors) come to at most [`MOST_COMPUTED`]
/// of the outputs. Looser than the column-matrix path's bound ([`rows_fit`]): here the
/// alternative is the per-image im2col and `gemm`, which copies the column matrix and packs the
/// whole weight on every call, and a deep stage's 7x7 plane at batch 1 (64 positions for 49
/// outputs) measured faster here than there.
pub(super) fn fits(g: &Conv2dGeometry) -> bool {
    let [most, per] = MOST_COMPUTED;
    // A strided 1x1 convolution without padding reads one phase of the stride: the per-image
    // path gathers it straight from the image, where this one would pad every phase first
    // (ResNet's downsampling shortcuts ran twice as long here).
    if g.is_subsampling() {
        return false;
    }
    layout(g).is_some_and(|d| {
        // Sizes past `usize` do not fit.
        let computed = d
            .n_ext
            .checked_next_multiple_of(NARROW)
            .and_then(|c| c.checked_mul(per));
        let allowed = d
            .out_w
            .checked_mul(g.output_size[0])
            .and_then(|o| o.checked_mul(most));
        matches!((computed, allowed), (Some(c), Some(a)) if c <= a)
    })
}

/// One group's weights `[C_out/groups, K]`, read in place: block `b` is the rows of channels
/// `b·ROWS..` (the last row repeated past the last channel; those rows' sums are never stored).
pub(super) struct WeightRows<'a> {
    data: &'a [f32],
    k: usize,
    channels: usize,
}

impl<'a> WeightRows<'a> {
    /// `weight` as `channels` rows of `k` taps.
    pub(super) fn new(weight: &'a [f32], channels: usize, k: usize) -> Self {
        assert!(channels > 0 && weight.len() >= channels * k);
        Self {
            data: weight,
            k,
            channels,
        }
    }

    fn block(&self, b: usize) -> [&'a [f32]; ROWS] {
        let last = self.channels - 1;
        std::array::from_fn(|o| &self.data[(b * ROWS + o).min(last) * self.k..][..self.k])
    }
}

/// Elements of the product buffer for `n` positions of `channels` channels (whole strips).
pub(super) fn product_len(channels: usize, n: usize) -> usize {
    checked_product_len(channels, n).expect("a product buffer that was allocated")
}

/// [`product_len`], or `None` when it overflows `usize` (checked before allocating).
pub(super) fn checked_product_len(channels: usize, n: usize) -> Option<usize> {
    n.div_ceil(WIDE).checked_mul(channels)?.checked_mul(WIDE)
}

/// Where position `p` of channel `o` sits in a product buffer of `channels` channels.
pub(super) fn product_at(channels: usize, o: usize, p: usize) -> usize {
    (p / WIDE * channels + o) * WIDE + p % WIDE
}

/// `product[o][p] = Σ_r weight[o][r] · padded[starts[r] + p]` for `p < n` (see the module doc
/// for the product's layout). `padded` must hold `starts[r] + n + SLACK - 1` elements for
/// every `r`. Strips, in blocks of [`ROWS`] channels, run in parallel on the pool when
/// `parallel`. `isa` (from `simd.rs`) picks the build and the tile widths.
pub(super) fn product(
    isa: Option<Isa>,
    weight: &WeightRows,
    padded: &[f32],
    starts: &[usize],
    n: usize,
    out: &mut [f32],
    parallel: bool,
) {
    assert_eq!(starts.len(), weight.k);
    let channels = weight.channels;
    let reach = starts
        .iter()
        .max()
        .map_or(0, |&s| s + n.div_ceil(NARROW) * NARROW);
    assert!(padded.len() >= reach && out.len() >= product_len(channels, n));
    if starts.is_empty() {
        // No taps (no input channels): every sum is empty.
        out[..product_len(channels, n)].fill(0.0);
        return;
    }
    // One row of tiles: channels `b·ROWS..` of strip `s`, `dst` their `rows · WIDE` values.
    let tiles = |(s, b, dst): (usize, usize, &mut [f32])| {
        let p0 = s * WIDE;
        let width = (n - p0).min(WIDE);
        let rows = dst.len() / WIDE;
        let w = &weight.block(b);
        let src = &padded[p0..];
        if isa == Some(Isa::Avx512) {
            // One tile as wide as the strip's positions, rounded up to whole vectors.
            match width.div_ceil(NARROW) {
                4 => tile::<WIDE>(isa, dst, rows, w, src, starts),
                3 => tile::<{ 3 * NARROW }>(isa, dst, rows, w, src, starts),
                2 => tile::<{ 2 * NARROW }>(isa, dst, rows, w, src, starts),
                _ => tile::<NARROW>(isa, dst, rows, w, src, starts),
            }
        } else {
            for q in (0..width).step_by(NARROW) {
                let (dst, src) = (&mut dst[q..], &src[q..]);
                if width - q <= HALF {
                    tile::<HALF>(isa, dst, rows, w, src, starts);
                } else {
                    tile::<NARROW>(isa, dst, rows, w, src, starts);
                }
            }
        }
    };
    let out = &mut out[..product_len(channels, n)];
    let blocks = out
        .chunks_mut(channels * WIDE)
        .enumerate()
        .flat_map(|(s, strip)| {
            let rows = strip.chunks_mut(ROWS * WIDE).enumerate();
            rows.map(move |(b, dst)| (s, b, dst))
        });
    if parallel {
        // By strip and block of channels, so that a plane of a few strips (a deep stage at
        // batch 1) still fills the pool; each task at least `MIN_TASK_FMAS` multiply-adds.
        let min_len = MIN_TASK_FMAS.div_ceil(ROWS * WIDE * starts.len());
        let blocks: Vec<_> = blocks.collect();
        blocks.into_par_iter().with_min_len(min_len).for_each(tiles);
    } else {
        blocks.for_each(tiles);
    }
}

simd_dispatch! {
    /// One tile: `dst[o·WIDE + l] = Σ_r w[r·ROWS + o] · src[starts[r] + l]` for `o < rows`,
    /// `l < L`, through the build of [`tile_body`] for the instruction set given.
    fn tile[const L: usize](
        dst: &mut [f32],
        rows: usize,
        w: &[&[f32]; ROWS],
        src: &[f32],
        starts: &[usize],
    ) => tile_body[L];
}

/// The tile's loop: `ROWS x L` accumulators that LLVM keeps in registers (24 zmm for `L = 64`
/// with AVX-512, 12 ymm for `L = 16` with AVX2),
/// one fused multiply-add per tap and element.
#[inline(always)]
fn tile_body<const L: usize>(
    dst: &mut [f32],
    rows: usize,
    w: &[&[f32]; ROWS],
    src: &[f32],
    starts: &[usize],
) {
    // The six rows zipped with the taps (not indexed), so the loop carries no bounds checks.
    let [w0, w1, w2, w3, w4, w5] = w;
    let taps = starts
        .iter()
        .zip(*w0)
        .zip(*w1)
        .zip(*w2)
        .zip(*w3)
        .zip(*w4)
        .zip(*w5);
    let mut acc = [[0.0f32; L]; ROWS];
    for ((((((&start, &x0), &x1), &x2), &x3), &x4), &x5) in taps {
        let a: [f32; L] = src[start..start + L].try_into().expect("L elements");
        for (acc_o, w_o) in acc.iter_mut().zip([x0, x1, x2, x3, x4, x5]) {
            for (v, &x) in acc_o.iter_mut().zip(&a) {
                *v = x.mul_add(w_o, *v);
            }
        }
    }
    for (o, acc_o) in acc.iter().enumerate().take(rows) {
        dst[o * WIDE..][..L].copy_from_slice(acc_o);
    }
}

/// The padded-row forward (`cpu_rows.rs`) without a column matrix, where it serves: f32 data,
/// a CPU with AVX-512F or AVX2 + FMA, at least [`ROWS`] output channels per group. `None`
/// elsewhere (the caller then builds the column matrix).
pub(super) fn forward<T: KernelFloat>(
    g: &Conv2dGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> Option<Result<()>> {
    if simd::isa().is_none() || g.out_channels / g.params.groups < ROWS {
        return None;
    }
    let (input, weight, output) = (as_f32(input)?, as_f32(weight)?, as_f32_mut(output)?);
    let bias = match bias {
        Some(b) => Some(as_f32(b)?),
        None => None,
    };
    Some(Rows::new(g).and_then(|d| forward_f32((g, &d), input, weight, bias, output)))
}

/// [`forward`] on f32 slices: per image, the padded image, then per group the product
/// in strips and its copy into the output planes (dropping the junk columns, adding the bias).
fn forward_f32(
    (g, d): (&Conv2dGeometry, &Rows),
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    output: &mut [f32],
) -> Result<()> {
    let group_weight = d.group_out * d.k;
    let rows: Vec<_> = (0..d.groups)
        .map(|group| {
            let w = &weight[group * group_weight..][..group_weight];
            WeightRows::new(w, d.group_out, d.k)
        })
        .collect();
    let starts: Vec<Vec<usize>> = (0..d.groups)
        .map(|group| taps(g, &d.padded, group).collect())
        .collect();
    let padded_len = d.padded.len.checked_add(SLACK).ok_or_else(too_large)?;
    let product_len = checked_product_len(d.group_out, d.n_ext).ok_or_else(too_large)?;
    let in_image = d.padded.image_len();
    let pitch = d.padded.pitch;
    let failure = ScratchFailure::new();
    let one_image =
        |scratch: &mut Option<[HostBuffer<f32>; 2]>, n: usize, out: &mut [f32], split: bool| {
            let Some([padded, strips]) = scratch.as_mut() else {
                return;
            };
            // Also zeroes the extra slack: `fill_on` zeroes everything after the last channel.
            d.padded
                .fill_on(&input[n * in_image..][..in_image], padded, split);
            for group in 0..d.groups {
                product(
                    simd::isa(),
                    &rows[group],
                    padded,
                    &starts[group],
                    d.n_ext,
                    strips,
                    split,
                );
                let strips = &strips[..];
                // A row of outputs may cross from one strip of the product to the next.
                let runs = |o: usize, oh: usize, ow: usize| {
                    let p = oh * pitch + ow;
                    let len = (WIDE - p % WIDE).min(d.out_w - ow);
                    &strips[product_at(d.group_out, o, p)..][..len]
                };
                copy_out(g, d.group_out, group, bias, split, out, runs);
            }
        };
    let scratch = || -> Option<[HostBuffer<f32>; 2]> {
        Some([
            failure.take::<f32>(padded_len)?,
            failure.take::<f32>(product_len)?,
        ])
    };
    for_each_image(output, d.out_image(g), scratch, one_image);
    failure.into_result()
}

/// `s` as f32 when `T` is f32.
fn as_f32<T: KernelFloat>(s: &[T]) -> Option<&[f32]> {
    // SAFETY: `T` is `f32` (same type id), so the slice is reinterpreted as itself.
    (TypeId::of::<T>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
}

/// `s` as f32 when `T` is f32.
fn as_f32_mut<T: KernelFloat>(s: &mut [T]) -> Option<&mut [f32]> {
    // SAFETY: `T` is `f32` (same type id), so the slice is reinterpreted as itself.
    (TypeId::of::<T>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<f32>(), s.len()) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv::cpu::{conv2d_backward_input, conv2d_forward};
    use crate::ops::conv::cpu_rows::rows_fit;
    use crate::ops::conv::reference::{self, on_pools_of_1_and_3, test_values};
    use crate::ops::conv::Conv2dParams;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.5 - 1.0)
            .collect()
    }

    /// The product against sums in f64, with every instruction set this CPU has, for channel
    /// counts that are and are not a multiple of the tile's, and lengths whose last strip ends
    /// inside one, two, three or four vectors, or exactly at one (with AVX2, inside or exactly at
    /// the half tile of 8); taps that read overlapping windows (as a convolution's do); serial
    /// and parallel (strips split by blocks of channels).
    #[test]
    fn product_equals_the_sums_of_its_taps() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let isas = simd::available();
        if isas.is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2 with FMA");
        }
        for (isa, channels) in isas.into_iter().flat_map(|i| [(i, 6), (i, 7), (i, 13)]) {
            for n in [
                1usize, 8, 9, 15, 16, 17, 24, 40, 56, 63, 64, 65, 100, 130, 200, 210,
            ] {
                let starts: Vec<usize> = (0..11).map(|r| (r * 5) % 23 + r / 3).collect();
                let k = starts.len();
                let reach = starts.iter().max().unwrap() + n.div_ceil(NARROW) * NARROW;
                let src = values(reach, channels + n);
                let w = values(channels * k, 7);
                let rows = WeightRows::new(&w, channels, k);
                for parallel in [false, true] {
                    let mut out = vec![f32::NAN; product_len(channels, n)];
                    let isa = Some(isa);
                    pool.install(|| product(isa, &rows, &src, &starts, n, &mut out, parallel));
                    for o in 0..channels {
                        for p in 0..n {
                            let want: f64 = (0..k)
                                .map(|r| w[o * k + r] as f64 * src[starts[r] + p] as f64)
                                .sum();
                            let got = out[product_at(channels, o, p)] as f64;
                            assert!(
                                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                "{isa:?}, channels {channels}, n {n}, parallel {parallel}: \
                                 [{o}][{p}] = {got}, want {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The direct forward takes the padded-row layout where the column-matrix path's bound
    /// does not (ResNet's 7x7 planes, at stride 1 and 2: 64 positions for 49 outputs, 4/3 being
    /// 65.3), but not 3x3 or 4x4 planes (16 positions for 9 outputs, 32 for 16), pointwise
    /// convolutions, strided 1x1 ones without padding (read from the image by the per-image
    /// path), or padding wider than the kernel's reach.
    #[test]
    fn fits_where_the_computed_positions_stay_within_a_third_more() {
        let g = |size: usize, kernel: usize, stride: usize, padding: usize| {
            let params = Conv2dParams {
                stride: [stride; 2],
                padding: [padding; 2],
                ..Conv2dParams::default()
            };
            Conv2dGeometry::new([1, 8, size, size], [8, 8, kernel, kernel], params).unwrap()
        };
        assert!(fits(&g(7, 3, 1, 1)) && !rows_fit(&g(7, 3, 1, 1)));
        assert!(fits(&g(14, 3, 2, 1)) && !rows_fit(&g(14, 3, 2, 1)));
        assert!(fits(&g(14, 3, 1, 1)) && rows_fit(&g(14, 3, 1, 1)));
        assert!(!fits(&g(3, 3, 1, 1)));
        assert!(!fits(&g(4, 3, 1, 1)));
        assert!(!fits(&g(8, 1, 1, 0)));
        assert!(!fits(&g(56, 1, 2, 0)) && !fits(&g(14, 1, 2, 0)));
        assert!(!fits(&g(14, 3, 1, 3)));
    }

    /// Every build of the kernel this CPU runs gives the same bits as the portable loop, in
    /// tiles of one to four vectors: the same fused multiply-adds in the same order
    /// (infinities and NaN included, NaN by class).
    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let isas = simd::available();
        if isas.is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2 with FMA");
        }
        let starts: Vec<usize> = (0..9).map(|r| r * 3 + r % 2).collect();
        let mut src = values(200, 3);
        src[40] = f32::INFINITY;
        src[77] = f32::NAN;
        let k = starts.len();
        let values_w = values(ROWS * k, 4);
        let w: [&[f32]; ROWS] = std::array::from_fn(|o| &values_w[o * k..][..k]);
        // NaN compares by class only: its sign and payload may differ between paths.
        let bits = |v: &[f32]| {
            v.iter()
                .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                .collect::<Vec<_>>()
        };
        let mut portable = vec![1.0f32; ROWS * WIDE];
        tile_body::<WIDE>(&mut portable, ROWS, &w, &src, &starts);
        assert!(portable.iter().any(|v| v.is_nan()) && portable.iter().any(|v| v.is_finite()));
        for isa in isas {
            let mut wide = vec![0.0f32; ROWS * WIDE];
            tile::<WIDE>(Some(isa), &mut wide, ROWS, &w, &src, &starts);
            assert_eq!(bits(&wide), bits(&portable), "{isa:?}, wide tile");
            let mut narrow = vec![0.0f32; ROWS * WIDE];
            for q in (0..WIDE).step_by(NARROW) {
                tile::<NARROW>(Some(isa), &mut narrow[q..], ROWS, &w, &src[q..], &starts);
            }
            assert_eq!(bits(&narrow), bits(&portable), "{isa:?}, narrow tiles");
            let mut halves_of_8 = vec![0.0f32; ROWS * WIDE];
            for q in (0..WIDE).step_by(HALF) {
                tile::<HALF>(
                    Some(isa),
                    &mut halves_of_8[q..],
                    ROWS,
                    &w,
                    &src[q..],
                    &starts,
                );
            }
            assert_eq!(bits(&halves_of_8), bits(&portable), "{isa:?}, tiles of 8");
            // The tiles of two and three vectors that end a strip.
            let mut halves = vec![0.0f32; ROWS * WIDE];
            for q in [0, 2 * NARROW] {
                let (dst, from) = (&mut halves[q..], &src[q..]);
                tile::<{ 2 * NARROW }>(Some(isa), dst, ROWS, &w, from, &starts);
            }
            assert_eq!(
                bits(&halves),
                bits(&portable),
                "{isa:?}, tiles of 2 vectors"
            );
            let mut three = vec![0.0f32; ROWS * WIDE];
            tile::<{ 3 * NARROW }>(Some(isa), &mut three, ROWS, &w, &src, &starts);
            let at = 3 * NARROW;
            tile::<NARROW>(Some(isa), &mut three[at..], ROWS, &w, &src[at..], &starts);
            assert_eq!(
                bits(&three),
                bits(&portable),
                "{isa:?}, tiles of 3 and 1 vectors"
            );
        }
    }

    /// In f32 on a CPU with AVX-512F or AVX2 + FMA, the forward (and the stride-1 input
    /// gradient, itself a forward) runs without a column matrix (`cpu_direct.rs`): ResNet's 3x3
    /// convolution with channels that fill one tile and a partial one, two groups of six with
    /// uneven padding and dilation, with and without bias, batches of one and of several (four
    /// on three threads: one image past the whole round, split over the pool), on 1 and 3
    /// threads, all equal the plain loops (in f64) to f32 precision.
    #[test]
    fn direct_forward_in_f32_equals_the_plain_loops() {
        let cases = [
            ([1, 7, 17, 18], [13, 7, 3, 3], [1, 1], [1, 1], [1, 1], 1),
            ([3, 7, 17, 18], [13, 7, 3, 3], [1, 1], [1, 1], [1, 1], 1),
            ([4, 7, 17, 18], [13, 7, 3, 3], [1, 1], [1, 1], [1, 1], 1),
            // ResNet's deepest stage at batch 1: a 7x7 plane, 64 positions for 49 outputs.
            ([1, 9, 7, 7], [13, 9, 3, 3], [1, 1], [1, 1], [1, 1], 1),
            ([3, 4, 9, 20], [12, 2, 3, 2], [1, 1], [2, 1], [1, 2], 2),
            // Strided, over the padded image's phases.
            ([2, 3, 21, 60], [7, 3, 7, 7], [2, 2], [3, 3], [1, 1], 1),
            ([3, 4, 17, 36], [13, 4, 3, 3], [2, 2], [1, 1], [1, 1], 1),
            ([2, 4, 15, 34], [12, 2, 3, 3], [2, 2], [2, 2], [2, 2], 2),
            // And its first convolution: 14x14 to 7x7.
            ([1, 5, 14, 14], [7, 5, 3, 3], [2, 2], [1, 1], [1, 1], 1),
        ];
        if crate::ops::simd::isa().is_none() {
            eprintln!("the direct forward is not run here: this CPU has neither AVX-512F nor AVX2");
        }
        let f32s = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        on_pools_of_1_and_3(&cases, |threads, pool, g| {
            assert!(fits(g) && g.out_channels / g.params.groups >= ROWS);
            let n = |s: [usize; 4]| s.iter().product::<usize>();
            let (x, w) = (
                test_values(n(g.input_shape()), 1),
                test_values(n(g.weight_shape()), 2),
            );
            let b = test_values(g.out_channels, 3);
            let (xf, wf, bf) = (f32s(x.clone()), f32s(w.clone()), f32s(b.clone()));
            for bias in [None, Some(&b)] {
                let mut want = vec![0.0; n(g.output_shape())];
                reference::conv2d_forward(g, &x, &w, bias.map(|b| &b[..]), &mut want).unwrap();
                let bias_f = bias.map(|_| &bf[..]);
                let what = |path: &str| {
                    let b = bias.is_some();
                    format!("{g:?} forward ({path}), bias {b}, {threads} thread(s)")
                };
                // The direct kernel itself (small strided planes are chunked by the dispatch).
                let mut out = vec![f32::NAN; want.len()];
                let ran = pool.install(|| forward(g, &xf, &wf, bias_f, &mut out));
                assert_eq!(ran.is_some(), crate::ops::simd::isa().is_some());
                if let Some(done) = ran {
                    done.unwrap();
                    let (got, tol) = (f64s(&out), (1e-5, 1e-5));
                    kiln_testkit::assert_close_finite(&what("direct"), &got, &want, tol);
                }
                let mut out = vec![f32::NAN; want.len()];
                pool.install(|| conv2d_forward(g, &xf, &wf, bias_f, &mut out))
                    .unwrap();
                let (got, tol) = (f64s(&out), (1e-5, 1e-5));
                kiln_testkit::assert_close_finite(&what("dispatch"), &got, &want, tol);
            }
            let go = test_values(n(g.output_shape()), 4);
            let mut want = vec![0.0; x.len()];
            reference::conv2d_backward_input(g, &go, &w, &mut want).unwrap();
            let mut gin = vec![f32::NAN; x.len()];
            pool.install(|| conv2d_backward_input(g, &f32s(go.clone()), &wf, &mut gin))
                .unwrap();
            let what = format!("{g:?} grad_input, {threads} thread(s)");
            kiln_testkit::assert_close_finite(&what, &f64s(&gin), &want, (1e-5, 1e-5));
        });
    }
}
