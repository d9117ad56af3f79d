//! Plain-loop conv2d: the definition, written as directly as possible.
//!
//! Seven nested loops straight from the formula
//! `out[n, o, y, x] = bias[o] + Σ_{c, i, j} in[n, g*Cg + c, y*s - p + i*d, x*s - p + j*d] * w[o, c, i, j]`,
//! no unrolling, no gemm, single-threaded. It is the oracle the im2col kernels are tested
//! against on many random configurations, and the baseline the ops benchmark reports ratios
//! against. Never use it for real work.

use super::Conv2dGeometry;
use crate::ops::kernel_error::{check_len, KernelError};
use crate::ops::KernelFloat;

/// Calls `visit(input_offset, weight_offset, output_offset)` for every multiply-accumulate of
/// the convolution, in loop order `n, o, y, x, c, i, j`.
fn for_each_tap(g: &Conv2dGeometry, mut visit: impl FnMut(usize, usize, usize)) {
    let [batch, in_channels, in_h, in_w] = g.input_shape();
    let [out_channels, group_in, k_h, k_w] = g.weight_shape();
    let [_, _, out_h, out_w] = g.output_shape();
    let group_out = out_channels / g.params.groups;
    for n in 0..batch {
        for o in 0..out_channels {
            let group = o / group_out;
            for y in 0..out_h {
                for x in 0..out_w {
                    let out_offset = ((n * out_channels + o) * out_h + y) * out_w + x;
                    for c in 0..group_in {
                        let channel = group * group_in + c;
                        for i in 0..k_h {
                            let iy = (y * g.params.stride[0] + i * g.params.dilation[0]) as isize
                                - g.params.padding[0] as isize;
                            if iy < 0 || iy >= in_h as isize {
                                continue;
                            }
                            for j in 0..k_w {
                                let ix = (x * g.params.stride[1] + j * g.params.dilation[1])
                                    as isize
                                    - g.params.padding[1] as isize;
                                if ix < 0 || ix >= in_w as isize {
                                    continue;
                                }
                                let in_offset = ((n * in_channels + channel) * in_h + iy as usize)
                                    * in_w
                                    + ix as usize;
                                let w_offset = ((o * group_in + c) * k_h + i) * k_w + j;
                                visit(in_offset, w_offset, out_offset);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Forward convolution by plain loops; same contract as [`super::cpu::conv2d_forward`].
pub fn conv2d_forward<T: KernelFloat>(
    geometry: &Conv2dGeometry,
    input: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    output: &mut [T],
) -> Result<(), KernelError> {
    const OP: &str = "conv2d_reference";
    check_len(OP, "input", input, &geometry.input_shape())?;
    check_len(OP, "weight", weight, &geometry.weight_shape())?;
    if let Some(bias) = bias {
        check_len(OP, "bias", bias, &[geometry.out_channels])?;
    }
    check_len(OP, "output", output, &geometry.output_shape())?;
    let plane = geometry.output_size[0] * geometry.output_size[1];
    for (k, out) in output.iter_mut().enumerate() {
        let channel = (k / plane.max(1)) % geometry.out_channels;
        *out = bias.map_or(T::ZERO, |b| b[channel]);
    }
    for_each_tap(geometry, |i, w, o| output[o] += input[i] * weight[w]);
    Ok(())
}

/// Input gradient by plain loops; same contract as [`super::cpu::conv2d_backward_input`].
pub fn conv2d_backward_input<T: KernelFloat>(
    geometry: &Conv2dGeometry,
    grad_output: &[T],
    weight: &[T],
    grad_input: &mut [T],
) -> Result<(), KernelError> {
    const OP: &str = "conv2d_reference_backward_input";
    check_len(OP, "grad_output", grad_output, &geometry.output_shape())?;
    check_len(OP, "weight", weight, &geometry.weight_shape())?;
    check_len(OP, "grad_input", grad_input, &geometry.input_shape())?;
    grad_input.fill(T::ZERO);
    for_each_tap(geometry, |i, w, o| {
        grad_input[i] += grad_output[o] * weight[w]
    });
    Ok(())
}

/// Weight gradient by plain loops; same contract as [`super::cpu::conv2d_backward_weight`].
pub fn conv2d_backward_weight<T: KernelFloat>(
    geometry: &Conv2dGeometry,
    input: &[T],
    grad_output: &[T],
    grad_weight: &mut [T],
) -> Result<(), KernelError> {
    const OP: &str = "conv2d_reference_backward_weight";
    check_len(OP, "input", input, &geometry.input_shape())?;
    check_len(OP, "grad_output", grad_output, &geometry.output_shape())?;
    check_len(OP, "grad_weight", grad_weight, &geometry.weight_shape())?;
    grad_weight.fill(T::ZERO);
    for_each_tap(geometry, |i, w, o| {
        grad_weight[w] += input[i] * grad_output[o]
    });
    Ok(())
}

/// Deterministic values in [-1, 1) for the CPU paths' tests against these loops.
#[cfg(test)]
pub(super) fn test_values(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f64 / 1001.5 - 1.0)
        .collect()
}

/// A convolution of the padded-row paths' tests: input shape, weight shape, stride, padding,
/// dilation and groups.
#[cfg(test)]
pub(super) type RowsCase = (
    [usize; 4],
    [usize; 4],
    [usize; 2],
    [usize; 2],
    [usize; 2],
    usize,
);

/// Calls `check(threads, pool, geometry)` for every case on pools of 1 and 3 threads.
#[cfg(test)]
pub(super) fn on_pools_of_1_and_3(
    cases: &[RowsCase],
    check: impl Fn(usize, &rayon::ThreadPool, &Conv2dGeometry),
) {
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for &(input_shape, weight_shape, stride, padding, dilation, groups) in cases {
            let params = super::Conv2dParams {
                stride,
                padding,
                dilation,
                groups,
            };
            let g = Conv2dGeometry::new(input_shape, weight_shape, params).unwrap();
            check(threads, &pool, &g);
        }
    }
}

/// A pass of two operands writing a third (`Ok` on success).
#[cfg(test)]
type TestPass<'a> = &'a dyn Fn(&[f64], &[f64], &mut [f64]) -> crate::Result<()>;

/// The forward pass: `((input, bias), weight, output)`.
#[cfg(test)]
type TestForward<'a> = &'a dyn Fn((&[f64], &[f64]), &[f64], &mut [f64]) -> crate::Result<()>;

/// The three passes a CPU path computes, as closures over slices.
#[cfg(test)]
pub(super) struct TestPasses<'a> {
    /// `((input, bias), weight, output)`.
    pub forward: TestForward<'a>,
    /// `(grad_output, weight, grad_input)`.
    pub backward_input: TestPass<'a>,
    /// `(input, grad_output, grad_weight)`.
    pub backward_weight: TestPass<'a>,
}

/// Runs `passes` on deterministic inputs of `g`'s shapes (outputs pre-filled with 9, so a
/// missed element shows) and asserts each equals these loops up to the order of float sums.
#[cfg(test)]
pub(super) fn assert_passes_match_loops(what: &str, g: &Conv2dGeometry, passes: TestPasses<'_>) {
    let close = |pass: &str, got: &[f64], want: &[f64]| {
        kiln_testkit::assert_close_finite(&format!("{what} {pass}"), got, want, (1e-10, 1e-10));
    };
    let n = |s: [usize; 4]| s.iter().product::<usize>();
    let x = test_values(n(g.input_shape()), 1);
    let w = test_values(n(g.weight_shape()), 2);
    let b = test_values(g.out_channels, 3);
    let go = test_values(n(g.output_shape()), 4);
    let (mut out, mut want) = (vec![9.0; go.len()], vec![0.0; go.len()]);
    (passes.forward)((&x, &b), &w, &mut out).unwrap();
    conv2d_forward(g, &x, &w, Some(&b), &mut want).unwrap();
    close("forward", &out, &want);
    let (mut gin, mut want) = (vec![9.0; x.len()], vec![0.0; x.len()]);
    (passes.backward_input)(&go, &w, &mut gin).unwrap();
    conv2d_backward_input(g, &go, &w, &mut want).unwrap();
    close("grad_input", &gin, &want);
    let (mut gw, mut want) = (vec![9.0; w.len()], vec![0.0; w.len()]);
    (passes.backward_weight)(&x, &go, &mut gw).unwrap();
    conv2d_backward_weight(g, &x, &go, &mut want).unwrap();
    close("grad_weight", &gw, &want);
}
