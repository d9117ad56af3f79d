//! `bench ops --gpu`: each convolution shape of ResNet18 at 224x224 pass by pass, at the GPU
//! step's batch and dtype (bf16): which shapes and passes hold the step's convolution time.
//! The step's `breakdown` rows (`ops_gpu.rs`) give its convolutions' total by node kind; these
//! say where inside.
//!
//! Each pass runs alone through the storage seam (forward; the input gradient alone; the
//! weight gradient alone), on random operands, timed as `ops_gpu.rs`' cases are: one warm-up,
//! then best of three rounds of `reps` calls between two waits. A row per shape: its three
//! passes in ms and TFLOP/s (each pass does the forward's multiply-adds), ratio = the shape's
//! rate against kiln's bf16 matmul 4096³ rate in the same run; and a total over the model's
//! convolutions (each shape's time times its uses), which `--vs-torch` also measures in PyTorch
//! (`gpu_conv_passes_bf16` in `torch_bench.py`: `F.conv2d` and `torch.nn.grad`'s input and
//! weight gradients, cuDNN's passes) in rounds alternating with kiln's.

use super::conv_shapes::ConvCase;
use super::harness::{err, Row};
use super::torch::{Figure, Pairs};
use kiln_autograd::{DType, Device, Generator, Tensor};
use kiln_device::ops::conv::{Conv2dGeometry, ConvOps};
use kiln_device::GradMask;
use std::time::Instant;

const GROUP: &str = "ops";

/// Seconds per call of `f`: one warm-up, then best of three rounds of `reps` calls, each
/// round ended by `wait` (which waits for the device's queued work).
pub(super) fn per_call_with(
    wait: impl Fn() -> Result<(), String>,
    reps: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    f()?;
    wait()?;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..reps.max(1) {
            f()?;
        }
        wait()?;
        best = best.min(start.elapsed().as_secs_f64() / reps.max(1) as f64);
    }
    Ok(best)
}

/// Seconds per call of each pass of `g` (forward, input gradient, weight gradient) on `dev`
/// in `dtype`.
fn pass_seconds(
    g: &Conv2dGeometry,
    dev: Device,
    dtype: DType,
    reps: usize,
) -> Result<[f64; 3], String> {
    let mut random = Generator::new(11);
    let mut normal = |shape: [usize; 4]| -> Result<Tensor, String> {
        random.normal(&shape, 0.0, 1.0, dtype, dev).map_err(err)
    };
    let (x, w, grad) = (
        normal(g.input_shape())?,
        normal(g.weight_shape())?,
        normal(g.output_shape())?,
    );
    let (xs, ws, gs) = (x.storage_read(), w.storage_read(), grad.storage_read());
    let (xl, wl, gl) = (x.layout(), w.layout(), grad.layout());
    let backward = |mask: GradMask| -> Result<(), String> {
        let grads = gs
            .conv2d_backward(gl, (&xs, xl), (&ws, wl), g, mask)
            .map_err(err)?;
        std::hint::black_box(grads);
        Ok(())
    };
    let only = |input: bool| GradMask {
        input,
        weight: !input,
        bias: false,
    };
    let per_call = |f: &mut dyn FnMut() -> Result<(), String>| {
        per_call_with(|| kiln_device::synchronize(dev).map_err(err), reps, f)
    };
    Ok([
        per_call(&mut || {
            std::hint::black_box(xs.conv2d(xl, (&ws, wl), None, g).map_err(err)?);
            Ok(())
        })?,
        per_call(&mut || backward(only(true)))?,
        per_call(&mut || backward(only(false)))?,
    ])
}

/// Each pass of each of `cases` at `batch` on `dev` in `dtype`, in seconds.
fn measure(
    cases: &[ConvCase],
    dev: Device,
    dtype: DType,
    batch: usize,
    reps: usize,
) -> Result<Vec<(Conv2dGeometry, [f64; 3])>, String> {
    cases
        .iter()
        .map(|c| {
            let (g, _) = c.geometry(batch)?;
            Ok((g, pass_seconds(&g, dev, dtype, reps)?))
        })
        .collect()
}

/// ms of the model's convolutions: every shape's passes times its uses.
fn model_ms(cases: &[ConvCase], passes: &[(Conv2dGeometry, [f64; 3])]) -> f64 {
    let shapes = cases.iter().zip(passes);
    shapes
        .map(|(c, (_, s))| c.uses as f64 * s.iter().sum::<f64>() * 1e3)
        .sum()
}

/// The rows of `cases` at `batch` on `dev` in `dtype` (see the module doc); `matmul_tflops` is
/// kiln's dense matmul rate in the same run. With `--vs-torch` (`pairs`), the model's total
/// also runs in PyTorch (cuDNN) on the same device, in rounds alternating with kiln's.
#[allow(clippy::too_many_arguments)]
pub(super) fn conv_pass_rows(
    cases: &[ConvCase],
    dev: Device,
    dtype: DType,
    batch: usize,
    reps: usize,
    matmul_tflops: f64,
    rows: &mut Vec<Row>,
    pairs: &mut Pairs,
) -> Result<(), String> {
    let passes = measure(cases, dev, dtype, batch, reps)?;
    let mut total_flops = 0.0;
    for (c, (g, s)) in cases.iter().zip(&passes) {
        let flops = 2.0 * g.forward_macs() as f64;
        let ms = s.iter().sum::<f64>() * 1e3;
        let tflops = |secs: f64| flops / secs / 1e12;
        let shape_tflops = 3.0 * flops / (ms / 1e3) / 1e12;
        total_flops += 3.0 * flops * c.uses as f64;
        rows.push(Row::new(
            GROUP,
            format!("gpu conv2d {dtype} batch {batch} {}: passes alone", c.name),
            "ms",
            ms,
            format!(
                "forward / input gradient / weight gradient {:.3} / {:.3} / {:.3} ms ({:.1} / \
                 {:.1} / {:.1} TFLOP/s); {}x in the model; ratio = {shape_tflops:.1} TFLOP/s vs \
                 kiln bf16 matmul 4096³ {matmul_tflops:.1}",
                s[0] * 1e3,
                s[1] * 1e3,
                s[2] * 1e3,
                tflops(s[0]),
                tflops(s[1]),
                tflops(s[2]),
                c.uses
            ),
            shape_tflops / matmul_tflops,
        ));
    }
    let total_ms = model_ms(cases, &passes);
    let rate = total_flops / (total_ms / 1e3) / 1e12;
    eprintln!(
        "bench ops: gpu conv2d passes alone over ResNet18's convolutions: {total_ms:.1} ms per \
         step, {rate:.1} TFLOP/s"
    );
    let case = format!("gpu conv2d {dtype} batch {batch}: ResNet18's convolutions, passes alone");
    rows.push(Row::new(
        GROUP,
        &case,
        "ms",
        total_ms,
        format!(
            "every shape's three passes times its uses; {rate:.1} TFLOP/s; ratio = vs kiln bf16 \
             matmul 4096³ {matmul_tflops:.1} TFLOP/s"
        ),
        rate / matmul_tflops,
    ));
    if dtype == DType::BF16 {
        pairs.add(
            &case,
            &format!("gpu_conv_passes_bf16/{batch}"),
            Figure::Millis,
            total_ms,
            || Ok(model_ms(cases, &measure(cases, dev, dtype, batch, reps)?)),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::conv_shapes::RESNET18_224_CONVS;
    use super::*;

    #[test]
    fn the_224_shapes_are_resnet18s_twenty_convolutions() {
        let uses: usize = RESNET18_224_CONVS.iter().map(|c| c.uses).sum();
        assert_eq!(uses, 20);
        // The stem maps 224 to 112; each stage's first stride-2 convolution halves the plane.
        let (stem, _) = RESNET18_224_CONVS[0].geometry(1).unwrap();
        assert_eq!(stem.output_shape(), [1, 64, 112, 112]);
        let (last, _) = RESNET18_224_CONVS[9].geometry(2).unwrap();
        assert_eq!(last.output_shape(), [2, 512, 7, 7]);
    }

    #[test]
    fn pytorchs_side_times_the_same_shapes() {
        let script = include_str!("../../torch_bench.py");
        for c in RESNET18_224_CONVS {
            let (g, params) = c.geometry(1).unwrap();
            let [_, cin, size, _] = g.input_shape();
            let [cout, _, k, _] = g.weight_shape();
            let row = format!(
                "({cin}, {cout}, {size}, {k}, {}, {}),",
                params.stride[0], c.uses
            );
            assert!(script.contains(&row), "torch_bench.py lacks {row}");
        }
    }

    #[test]
    fn each_shape_gets_a_row_and_the_model_a_total() {
        // On the CPU at a tiny size: the rows' arithmetic, not a speed.
        let cases = &RESNET18_224_CONVS[6..8];
        let mut rows = Vec::new();
        let mut pairs = Pairs::new(
            GROUP,
            &super::super::harness::Options {
                quick: true,
                ..Default::default()
            },
        );
        conv_pass_rows(
            cases,
            Device::Cpu,
            DType::F32,
            1,
            1,
            1.0,
            &mut rows,
            &mut pairs,
        )
        .unwrap();
        assert!(pairs.into_rows().is_empty());
        assert_eq!(rows.len(), 3);
        assert!(
            rows[0].case.contains("layer3_256to256_3x3_14px"),
            "{}",
            rows[0].case
        );
        assert!(
            rows[0].reference.contains("3x in the model"),
            "{}",
            rows[0].reference
        );
        let total = 3.0 * rows[0].value + rows[1].value;
        assert!(
            (rows[2].value - total).abs() < 1e-9 * total,
            "{} vs {total}",
            rows[2].value
        );
        assert!(rows.iter().all(|r| r.value > 0.0 && r.ratio > 0.0));
    }
}
