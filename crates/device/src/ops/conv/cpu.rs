//! CPU conv2d kernels: im2col + `gemm`, parallel over the batch with rayon.
//!
//! Which path runs:
//! - small output planes (ResNet's deep stages): chunks of images, one GEMM per chunk
//!   (`cpu_chunked.rs`);
//! - stride 1 on wide planes: the column matrix over padded rows (`cpu_rows.rs`), or in f32
//!   on a CPU with AVX-512F or AVX2, the same product without a column matrix
//!   (`cpu_direct.rs`), which also runs strided forwards over the padded image's phases;
//! - anything else: one GEMM per image and group (this file); 1x1 convolutions with stride 1
//!   and no padding use the input block as the column matrix, and strided ones without padding
//!   (ResNet's downsampling shortcuts) gather their columns straight from the image, here and
//!   in chunks, with no padded copy of every phase of the stride.
//!
//! The input gradient of a stride-1 convolution on a wide plane is itself a forward convolution
//! (of the output gradient with the rotated weight), so it takes the same paths; small planes
//! (chunks) and strided ones fold the column-matrix gradient back onto a padded gradient
//! (`cpu_input_grad.rs`; `padded.rs` also gives every path its bounds-free unfold), but for
//! the strided 1x1 ones without padding, which write it straight into the image. The
//! small-plane weight gradient has a second form, one kernel tap per product
//! (`cpu_weight_taps.rs`, `KILN_CONV_WEIGHT_GRAD=taps`), until many cores decide. Each
//! image is independent in the forward and input-gradient passes, so those run one rayon task
//! per image (or chunk), as far as the images fill whole rounds of the pool; the images left (a
//! batch smaller than the pool, or a few past its whole rounds) run one after the other with
//! `gemm` itself parallelised instead (`pieces.rs`). The weight gradient sums over the batch:
//! the batch is cut into one contiguous slice per thread (and one split slice for the images
//! left), every slice accumulates into a private partial gradient (stored
//! transposed, the orientation `gemm` runs fastest), and the partials are transposed and added
//! in slice order, so the result does not depend on scheduling.
//!
//! All outputs are overwritten, never accumulated into, so they are taken unfilled
//! (`HostBuffer::for_overwrite`), as are the scratch buffers the passes rewrite; the partial
//! weight gradients they accumulate into are zeroed. All are blocks of the CPU caching
//! allocator, so `max_memory_allocated` includes them while the kernel runs. Their sizes follow
//! from the input, so they are taken fallibly: a column buffer larger than memory (or whose size
//! overflows) makes the kernel return the allocator's out-of-memory error, never abort.

use super::ConvOps;
use crate::ops::cpu_dispatch::{dense, dense_opt, float_kernel, for_overwrite, in_pool, wrap};
use crate::ops::gemm::Parallelism;
use crate::seam::{GradMask, InputGrads, Strided};
use crate::{CpuStorage, Layout, Result};

use super::cpu_chunked::{self as chunked, chunk_images};
use super::cpu_chunked_weight as chunked_weight;
use super::cpu_direct as direct;
use super::cpu_gemm::{
    matmul_into, sum_transposed_partials, Blocks, ScratchFailure, Stored, TaskContext,
};
use super::cpu_input_grad as input_grad;
use super::cpu_rows as rows;
use super::cpu_weight_taps::{self as taps, weight_grad_path, WeightGradPath};
use super::padded::Padded;
use super::pieces::{for_each_image, image_parallelism, is_split, weight_grad_partials};
use super::Conv2dGeometry;
use crate::ops::kernel_error::{check_len, KernelError};
use crate::ops::KernelFloat;
use crate::storage::HostBuffer;

/// Forward convolution: `output = conv2d(input, weight) + bias`.
///
/// Shapes: `input` [`Conv2dGeometry::input_shape`], `weight`
/// [`Conv2dGeometry::weight_shape`], `bias` `[C_out]`, `output`
/// [`Conv2dGeometry::output_shape`].
pub fn conv2d_forward<T: KernelFloat>(
    geometry: &Conv2dGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> Result<()> {
    const OP: &str = "conv2d";
    check_len(OP, "input", input, &geometry.input_shape())?;
    check_len(OP, "weight", weight, &geometry.weight_shape())?;
    if let Some(bias) = bias {
        check_len(OP, "bias", bias, &[geometry.out_channels])?;
    }
    check_len(OP, "output", output, &geometry.output_shape())?;
    if output.is_empty() {
        return Ok(());
    }
    if let Some(chunk) = chunk_images(geometry, rayon::current_num_threads()) {
        return chunked::forward(geometry, chunk, input, weight, bias, output);
    }
    if direct::fits(geometry) {
        if let Some(done) = direct::forward(geometry, input, weight, bias, output) {
            return done;
        }
    }
    if rows::use_rows(geometry) {
        return rows::forward(geometry, input, weight, bias, output);
    }
    let b = Blocks::new(geometry);
    let col_len = b.col_len()?;
    let p = Padded::new(geometry)?;
    let padded_len = if b.pointwise || b.subsampled {
        0
    } else {
        p.len
    };
    let failure = ScratchFailure::new();
    let dims = [b.out_channels, b.col_cols, b.col_rows];
    for_each_image(
        output,
        b.groups * b.out_group,
        || Some((failure.take::<T>(col_len)?, failure.take::<T>(padded_len)?)),
        |scratch, n, out_image, split| {
            let Some((col, padded)) = scratch.as_mut() else {
                return;
            };
            let parallelism = image_parallelism(split);
            let in_image = &input[n * b.groups * b.in_group..][..b.groups * b.in_group];
            if !b.pointwise && !b.subsampled {
                p.fill_on(in_image, padded, split);
            }
            for g in 0..b.groups {
                let col = b.columns((&p, parallelism), in_image, padded, g, col);
                let w = &weight[g * b.weight_group..][..b.weight_group];
                let out = &mut out_image[g * b.out_group..][..b.out_group];
                matmul_into(
                    out,
                    dims,
                    w,
                    Stored::AsIs,
                    col,
                    Stored::AsIs,
                    false,
                    parallelism,
                );
            }
            if let Some(bias) = bias {
                for (plane, &bias) in out_image.chunks_mut(b.col_cols).zip(bias) {
                    plane.iter_mut().for_each(|v| *v += bias);
                }
            }
        },
    );
    failure.into_result()
}

/// Gradient of the convolution with respect to its input.
///
/// Shapes: `grad_output` [`Conv2dGeometry::output_shape`], `weight`
/// [`Conv2dGeometry::weight_shape`], `grad_input` [`Conv2dGeometry::input_shape`].
pub fn conv2d_backward_input<T: KernelFloat>(
    geometry: &Conv2dGeometry,
    grad_output: &[T],
    weight: &[T],
    grad_input: &mut [T],
) -> Result<()> {
    const OP: &str = "conv2d_backward_input";
    check_len(OP, "grad_output", grad_output, &geometry.output_shape())?;
    check_len(OP, "weight", weight, &geometry.weight_shape())?;
    check_len(OP, "grad_input", grad_input, &geometry.input_shape())?;
    if grad_input.is_empty() {
        return Ok(());
    }
    if grad_output.is_empty() {
        // No output channels (or no output positions): nothing flows back.
        grad_input.fill(T::ZERO);
        return Ok(());
    }
    // Small planes: a GEMM per chunk, folded back per image (faster than the transposed forward).
    if let Some(chunk) = chunk_images(geometry, rayon::current_num_threads()) {
        return chunked::backward_input(geometry, chunk, grad_output, weight, grad_input);
    }
    if let Some(transposed) = input_grad::transposed_geometry(geometry) {
        let rotated = input_grad::rotate_weight(geometry, weight)?;
        return conv2d_forward(&transposed, grad_output, &rotated, None, grad_input);
    }
    // Strided, or padded beyond the kernel's reach.
    input_grad::by_columns(geometry, grad_output, weight, grad_input)
}
/// Adds image `n`'s contribution to `grad_weight_t`, the weight gradient with each group's
/// block transposed (`[C_in/groups * kH * kW, C_out/groups]`, groups one after another), or
/// writes it there when `add` is false (a slice's first image: its partial needs no zero-fill).
///
/// This orientation, `col · doutᵀ` into a transposed block, is the one `gemm` runs fastest:
/// `dout · colᵀ` makes it repack the wide column matrix transposed for every image (a third of
/// the speed on ResNet's 32x32 layers).
#[allow(clippy::too_many_arguments)]
fn accumulate_weight_grad_t<T: KernelFloat>(
    b: &Blocks,
    p: &Padded,
    n: usize,
    input: &[T],
    grad_output: &[T],
    [col, padded]: [&mut [T]; 2],
    grad_weight_t: &mut [T],
    (add, parallelism): (bool, Parallelism),
) {
    let dims = [b.col_rows, b.out_channels, b.col_cols];
    let in_image = &input[n * b.groups * b.in_group..][..b.groups * b.in_group];
    let gout_image = &grad_output[n * b.groups * b.out_group..][..b.groups * b.out_group];
    if !b.pointwise && !b.subsampled {
        p.fill_on(in_image, padded, is_split(parallelism));
    }
    for g in 0..b.groups {
        let col = b.columns((p, parallelism), in_image, padded, g, col);
        let gout = &gout_image[g * b.out_group..][..b.out_group];
        let gw_t = &mut grad_weight_t[g * b.weight_group..][..b.weight_group];
        matmul_into(
            gw_t,
            dims,
            col,
            Stored::AsIs,
            gout,
            Stored::Transposed,
            add,
            parallelism,
        );
    }
}

/// Gradient of the convolution with respect to its weight (summed over the batch).
///
/// Shapes: `input` [`Conv2dGeometry::input_shape`], `grad_output`
/// [`Conv2dGeometry::output_shape`], `grad_weight` [`Conv2dGeometry::weight_shape`].
///
/// The batch is cut into one contiguous slice per thread; each slice sums its images into a
/// private transposed partial (`accumulate_weight_grad_t`) and the partials are transposed
/// and added in slice order, so the result does not depend on scheduling.
pub fn conv2d_backward_weight<T: KernelFloat>(
    geometry: &Conv2dGeometry,
    input: &[T],
    grad_output: &[T],
    grad_weight: &mut [T],
) -> Result<()> {
    const OP: &str = "conv2d_backward_weight";
    check_len(OP, "input", input, &geometry.input_shape())?;
    check_len(OP, "grad_output", grad_output, &geometry.output_shape())?;
    check_len(OP, "grad_weight", grad_weight, &geometry.weight_shape())?;
    if grad_weight.is_empty() {
        return Ok(());
    }
    if grad_output.is_empty() || input.is_empty() {
        // No output positions or no images: every sum is empty.
        grad_weight.fill(T::ZERO);
        return Ok(());
    }
    let threads = rayon::current_num_threads();
    if let Some(chunk) = chunk_images(geometry, threads) {
        return match weight_grad_path() {
            WeightGradPath::Chunks => {
                let chunk = chunked_weight::weight_grad_chunk(geometry, chunk, threads)?;
                chunked_weight::backward_weight(geometry, chunk, input, grad_output, grad_weight)
            }
            WeightGradPath::Taps => {
                taps::backward_weight(geometry, input, grad_output, grad_weight)
            }
        };
    }
    if rows::use_rows(geometry) {
        return rows::backward_weight(geometry, input, grad_output, grad_weight);
    }
    let b = Blocks::new(geometry);
    let col_len = b.col_len()?;
    let p = Padded::new(geometry)?;
    let padded_len = if b.pointwise || b.subsampled {
        0
    } else {
        p.len
    };
    let batch = geometry.batch;
    let context = TaskContext::of_caller();
    let partials = weight_grad_partials(batch, |images, parallelism| -> Result<HostBuffer<T>> {
        let _context = context.enter();
        // Written by the slice's first image, added to by the others.
        let mut partial = HostBuffer::for_overwrite(grad_weight.len())?;
        let mut col = HostBuffer::for_overwrite(col_len)?;
        let mut padded = HostBuffer::for_overwrite(padded_len)?;
        let first = images.start;
        for n in images {
            accumulate_weight_grad_t(
                &b,
                &p,
                n,
                input,
                grad_output,
                [col.as_mut_slice(), padded.as_mut_slice()],
                partial.as_mut_slice(),
                (n > first, parallelism),
            );
        }
        Ok(partial)
    })?;
    sum_transposed_partials(&partials, b.col_rows, b.out_channels, grad_weight);
    Ok(())
}

/// Gradient of the convolution with respect to its bias: `grad_output` summed over batch and
/// space, per output channel.
pub fn conv2d_backward_bias<T: KernelFloat>(
    geometry: &Conv2dGeometry,
    grad_output: &[T],
    grad_bias: &mut [T],
) -> Result<(), KernelError> {
    const OP: &str = "conv2d_backward_bias";
    check_len(OP, "grad_output", grad_output, &geometry.output_shape())?;
    check_len(OP, "grad_bias", grad_bias, &[geometry.out_channels])?;
    let plane = geometry.output_size[0] * geometry.output_size[1];
    let channels = geometry.out_channels;
    crate::ops::par::chunks_mut(grad_bias, 1, &|o, gb| {
        let sum: f64 = (0..geometry.batch)
            .map(|n| {
                let start = (n * channels + o) * plane;
                grad_output[start..start + plane]
                    .iter()
                    .map(|v| v.to_f64())
                    .sum::<f64>()
            })
            .sum();
        gb[0] = T::from_f64(sum);
    });
    Ok(())
}

impl ConvOps for CpuStorage {
    fn conv2d(
        &self,
        layout: &Layout,
        weight: Strided<'_, Self>,
        bias: Option<Strided<'_, Self>>,
        geometry: &Conv2dGeometry,
    ) -> Result<Self> {
        const OP: &str = "conv2d";
        float_kernel!(OP, self.dtype(), T => {
            let input = dense::<T>(OP, (self, layout))?;
            let (w, b) = (dense::<T>(OP, weight)?, dense_opt::<T>(OP, bias)?);
            let mut out = for_overwrite::<T>(&geometry.output_shape())?;
            in_pool(|| conv2d_forward(geometry, &input, &w, b.as_deref(), &mut out))?;
            Ok(wrap(out))
        })
    }

    fn conv2d_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        weight: Strided<'_, Self>,
        geometry: &Conv2dGeometry,
        mask: GradMask,
    ) -> Result<InputGrads<Self>> {
        const OP: &str = "conv2d_backward";
        let g = geometry;
        float_kernel!(OP, self.dtype(), T => {
            let go = dense::<T>(OP, (self, layout))?;
            let mut out = InputGrads::default();
            if mask.input {
                let w = dense::<T>(OP, weight)?;
                let mut gi = for_overwrite::<T>(&g.input_shape())?;
                in_pool(|| conv2d_backward_input(g, &go, &w, &mut gi))?;
                out.input = Some(wrap(gi));
            }
            if mask.weight {
                let x = dense::<T>(OP, input)?;
                let mut gw = for_overwrite::<T>(&g.weight_shape())?;
                in_pool(|| conv2d_backward_weight(g, &x, &go, &mut gw))?;
                out.weight = Some(wrap(gw));
            }
            if mask.bias {
                let mut gb = for_overwrite::<T>(&[g.out_channels])?;
                in_pool(|| conv2d_backward_bias(g, &go, &mut gb))?;
                out.bias = Some(wrap(gb));
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::conv::Conv2dParams;
    use crate::Error;

    /// Issue 18: a small input whose im2col columns would take terabytes (a 1024x1024 kernel
    /// over a 2048x2048 image) gets the allocator's out-of-memory error from every pass that
    /// unfolds, instead of aborting the process.
    #[test]
    fn columns_larger_than_memory_are_an_oom_error() {
        let g = Conv2dGeometry::new(
            [1, 1, 2048, 2048],
            [1, 1, 1024, 1024],
            Conv2dParams::default(),
        )
        .unwrap();
        let input = vec![0.0f32; 2048 * 2048];
        let weight = vec![0.0f32; 1024 * 1024];
        let mut output = vec![0.0f32; 1025 * 1025];
        let is_oom = |r: Result<()>| {
            let e = r.expect_err("terabytes of columns");
            assert!(
                matches!(e, Error::Alloc(kiln_alloc_cache::Error::OutOfMemory(_))),
                "{e}"
            );
        };
        is_oom(conv2d_forward(&g, &input, &weight, None, &mut output));
        let mut grad_input = vec![0.0f32; input.len()];
        is_oom(conv2d_backward_input(&g, &output, &weight, &mut grad_input));
        let mut grad_weight = vec![0.0f32; weight.len()];
        is_oom(conv2d_backward_weight(
            &g,
            &input,
            &output,
            &mut grad_weight,
        ));
    }
}
