//! Two ways to the CPU input gradient of conv2d (`cpu.rs`'s `conv2d_backward_input` chooses,
//! after the chunked path of small planes):
//! - stride 1 with padding within the kernel's reach: the forward convolution of the output
//!   gradient with the rotated weight ([`transposed_geometry`], [`rotate_weight`]), which takes
//!   the forward's own paths;
//! - any geometry ([`by_columns`]): a GEMM per image and group into the column matrix, folded
//!   back onto a padded gradient whose interior is copied out; a strided 1x1 convolution
//!   without padding (ResNet's downsampling shortcuts) writes its column rows straight into
//!   the image's zeroed planes at the stride instead, with no padded gradient.
//!
//! Every image is independent, so the images run one rayon task each (those past the pool's
//! whole rounds split over it instead, `pieces.rs`); the output is overwritten, never
//! accumulated into.

use super::cpu_gemm::{matmul_into, Blocks, ScratchFailure, Stored};
use super::padded::{fold_add_on, too_large, zero_on, Padded};
use super::pieces::{for_each_image, image_parallelism};
use super::subsample::unsample_planes;
use super::Conv2dGeometry;
use crate::ops::KernelFloat;
use crate::storage::HostBuffer;
use crate::Result;

/// The input gradient by columns: for each image and group, the GEMM of the weight
/// (transposed) with the output gradient into the column matrix, folded back onto a padded
/// gradient whose interior is copied out. Any geometry; [`super::cpu::conv2d_backward_input`]
/// sends it the strided ones and those padded beyond the kernel's reach. The lengths are
/// checked by the caller.
pub(super) fn by_columns<T: KernelFloat>(
    geometry: &Conv2dGeometry,
    grad_output: &[T],
    weight: &[T],
    grad_input: &mut [T],
) -> Result<()> {
    let b = Blocks::new(geometry);
    let col_len = b.col_rows.checked_mul(b.col_cols).ok_or_else(too_large)?;
    let p = Padded::new(geometry)?;
    // A subsampling convolution's column rows are its input planes read at the stride.
    let padded_len = if b.subsampled { 0 } else { p.len };
    let failure = ScratchFailure::new();
    let dims = [b.col_rows, b.col_cols, b.out_channels];
    for_each_image(
        grad_input,
        b.groups * b.in_group,
        || Some((failure.take::<T>(col_len)?, failure.take::<T>(padded_len)?)),
        |scratch, n, gin_image, split| {
            let Some((col, padded_grad)) = scratch.as_mut() else {
                return;
            };
            // An image split over the pool: its copies and sums go on the pool too.
            let parallelism = image_parallelism(split);
            let gout_image = &grad_output[n * b.groups * b.out_group..][..b.groups * b.out_group];
            if !b.subsampled {
                zero_on(padded_grad, split);
            }
            for g in 0..b.groups {
                let w = &weight[g * b.weight_group..][..b.weight_group];
                let gout = &gout_image[g * b.out_group..][..b.out_group];
                matmul_into(
                    col,
                    dims,
                    w,
                    Stored::Transposed,
                    gout,
                    Stored::AsIs,
                    false,
                    parallelism,
                );
                if b.subsampled {
                    // Each input element is read by at most one output: no sums.
                    let planes = &mut gin_image[g * b.in_group..][..b.in_group];
                    unsample_planes(geometry, col, [b.col_cols, 0], planes, split);
                    continue;
                }
                let at = [b.col_cols, 0];
                fold_add_on((geometry, &p), col, g, at, padded_grad, split);
            }
            if !b.subsampled {
                p.unpad_on(padded_grad, gin_image, split);
            }
        },
    );
    failure.into_result()
}

/// The geometry of the input gradient of a stride-1 convolution as a forward convolution of
/// the output gradient (`[N, C_out, H_out, W_out]`) with the rotated weight
/// ([`rotate_weight`], `[C_in, C_out/groups, kH, kW]`): same dilation and groups, padding
/// `dil·(k - 1) - pad` per axis. `None` for strided convolutions or padding wider than the
/// kernel's reach (the input gradient then goes through col2im).
pub(super) fn transposed_geometry(g: &Conv2dGeometry) -> Option<Conv2dGeometry> {
    let p = g.params;
    if p.stride != [1, 1] {
        return None;
    }
    let reach = |axis: usize| p.dilation[axis] * (g.kernel_size[axis] - 1);
    let padding = [
        reach(0).checked_sub(p.padding[0])?,
        reach(1).checked_sub(p.padding[1])?,
    ];
    let groups = p.groups;
    let t = Conv2dGeometry::new(
        [g.batch, g.out_channels, g.output_size[0], g.output_size[1]],
        [
            g.in_channels,
            g.out_channels / groups,
            g.kernel_size[0],
            g.kernel_size[1],
        ],
        super::Conv2dParams { padding, ..p },
    )
    .ok()?;
    (t.output_size == g.input_size).then_some(t)
}

/// The weight of [`transposed_geometry`]: `rot[gi·C_in/g + ci][co][i][j] =
/// weight[gi·C_out/g + co][ci][kH-1-i][kW-1-j]`.
pub(super) fn rotate_weight<T: KernelFloat>(
    g: &Conv2dGeometry,
    weight: &[T],
) -> Result<HostBuffer<T>> {
    let groups = g.params.groups;
    let (cin, cout) = (g.in_channels / groups, g.out_channels / groups);
    let [kh, kw] = g.kernel_size;
    let taps = kh * kw;
    let mut rotated = HostBuffer::for_overwrite(weight.len())?;
    let row = cout * taps;
    if row == 0 {
        return Ok(rotated);
    }
    // A transpose of (co, ci) blocks of taps: row by row, the source is read at a stride of
    // `C_in·taps` values, which maps a layer4 weight's reads onto two L1 sets. In tiles of
    // ROWS destination rows by COLS output channels, the reads of a tile are COLS contiguous
    // runs, revisited by each of its rows while they are still cached.
    const ROWS: usize = 32;
    const COLS: usize = 8;
    crate::ops::par::chunks_mut(rotated.as_mut_slice(), ROWS * row, &|b, rows| {
        for co0 in (0..cout).step_by(COLS) {
            for (r, dst_row) in rows.chunks_mut(row).enumerate() {
                let (gi, ci) = ((b * ROWS + r) / cin, (b * ROWS + r) % cin);
                for co in co0..(co0 + COLS).min(cout) {
                    let src = &weight[((gi * cout + co) * cin + ci) * taps..][..taps];
                    let dst = &mut dst_row[co * taps..][..taps];
                    for (t, v) in dst.iter_mut().enumerate() {
                        *v = src[taps - 1 - t];
                    }
                }
            }
        }
    });
    Ok(rotated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv::Conv2dParams;

    /// The tiled rotation equals its definition, with channel counts that leave partial tiles
    /// (70 destination rows in tiles of 32, 11 output channels in tiles of 8), two groups and a
    /// 3x2 kernel, on two threads.
    #[test]
    fn rotated_weight_equals_its_definition() {
        let params = Conv2dParams {
            groups: 2,
            padding: [1, 1],
            ..Conv2dParams::default()
        };
        let g = Conv2dGeometry::new([1, 70, 5, 5], [22, 35, 3, 2], params).unwrap();
        let weight: Vec<f32> = (0..22 * 35 * 6).map(|i| i as f32).collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let rotated = pool.install(|| rotate_weight(&g, &weight)).unwrap();
        let (cin, cout, taps) = (35, 11, 6);
        let mut checked = 0;
        for gi in 0..2 {
            for ci in 0..cin {
                for co in 0..cout {
                    for t in 0..taps {
                        let want = weight[((gi * cout + co) * cin + ci) * taps + taps - 1 - t];
                        let at = (((gi * cin + ci) * cout) + co) * taps + t;
                        assert_eq!(
                            rotated.as_slice()[at],
                            want,
                            "gi {gi} ci {ci} co {co} t {t}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, rotated.as_slice().len());
    }
}
