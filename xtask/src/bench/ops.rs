//! The `ops` benchmark group (issue 4): GFLOP/s of f32 matmul at 256/512/1024 and of conv2d
//! forward+backward on ResNet18's convolution shapes (CIFAR-style stem: 3x3 stride-1 first
//! conv, no max-pool; batch 32, 32x32 input), each next to a plain-loop reference timed in the
//! same run. kiln's side goes through `Tensor` (autograd, backend seam, CPU kernels); the
//! references are kiln-device's plain loops (`matmul_reference`: the i-j-k triple loop;
//! `conv::reference`: seven nested loops straight from the definition), single-threaded and
//! unvectorised by design. `ratio` is kiln's GFLOP/s over the reference's.
//!
//! With `--vs-torch`, matmul at 512 and 1024 also gets a row against PyTorch's `torch.matmul`
//! measured in the same run (best of as many calls; `torch.rs`). Cross-entropy's rows are in
//! `ops_loss.rs`.
//!
//! kiln's figure is the best of a few timed repetitions after one warm-up. The references are
//! slow, so each is timed once, and the conv reference runs on a smaller batch (its rate per
//! FLOP does not depend on the batch: it is the same loop per image).

use super::conv_shapes::RESNET18_CONVS;
use super::harness::{best_of, err, seconds, Options, Row};
use super::torch::{Figure, Pairs};
use kiln_autograd::{DType, Device, Generator};
use kiln_device::ops::conv::{cpu, reference, Conv2dGeometry};
use kiln_device::ops::matmul::matmul_reference;
use kiln_device::Layout;
use std::hint::black_box;

const GROUP: &str = "ops";
/// PyTorch's CPU matmul at 512 on the reference machine (issue 4's target: within 15%).
const PYTORCH_MATMUL_512_GFLOPS: f64 = 120.0;

/// Runs every case of the group.
pub fn run(options: &Options) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    eprintln!(
        "bench ops: {} CPU threads (KILN_NUM_THREADS caps them)",
        kiln_device::threads::num_threads()
    );
    if !options.gpu_only {
        let mut pairs = Pairs::new(GROUP, options);
        matmul(options, &mut rows, &mut pairs)?;
        conv2d(options, &mut rows)?;
        super::ops_loss::rows(options, &mut rows, &mut pairs)?;
        rows.extend(pairs.into_rows());
    }
    if options.gpu {
        super::ops_gpu::run(options, &mut rows)?;
    }
    Ok(rows)
}

/// The matmul rows; at 512 and 1024, PyTorch's rate next to kiln's (the `--vs-torch` cases).
fn matmul(options: &Options, rows: &mut Vec<Row>, pairs: &mut Pairs) -> Result<(), String> {
    let mut generator = Generator::new(1);
    for n in [256usize, 512, 1024] {
        let flops = 2.0 * (n * n * n) as f64;
        let a = generator
            .normal(&[n, n], 0.0, 1.0, DType::F32, Device::Cpu)
            .map_err(err)?;
        let b = generator
            .normal(&[n, n], 0.0, 1.0, DType::F32, Device::Cpu)
            .map_err(err)?;
        let reps = if options.quick { 2 } else { 10 };
        let mut product = || {
            black_box(a.matmul(&b).map_err(err)?);
            Ok(())
        };
        let kiln = best_of(reps, &mut product)?;
        let (av, bv) = (
            a.to_vec::<f32>().map_err(err)?,
            b.to_vec::<f32>().map_err(err)?,
        );
        let layout = Layout::contiguous(&[n, n]);
        let reference = seconds(|| {
            black_box(matmul_reference(&av, &layout, &bv, &layout));
        });
        let (kiln_rate, ref_rate) = (flops / kiln / 1e9, flops / reference / 1e9);
        eprintln!(
            "bench ops: matmul {n}: kiln {kiln_rate:.2} GFLOP/s, triple loop {ref_rate:.3} GFLOP/s"
        );
        rows.push(Row::new(
            GROUP,
            format!("matmul_f32_{n}x{n}x{n}"),
            "GFLOP/s",
            kiln_rate,
            format!("plain i-j-k triple loop, same run: {ref_rate:.3} GFLOP/s"),
            kiln_rate / ref_rate,
        ));
        if n >= 512 {
            let case = format!("matmul_f32_{n}x{n}x{n}");
            let id = format!("matmul/{n}");
            pairs.add(&case, &id, Figure::Gflops, kiln_rate, || {
                Ok(flops / best_of(reps, &mut product)? / 1e9)
            })?;
        }
        if n == 512 {
            rows.push(Row::new(
                GROUP,
                "matmul_f32_512_vs_pytorch_target",
                "GFLOP/s",
                kiln_rate,
                format!(
                    "PyTorch CPU matmul on the reference machine (stated, not measured here): \
                     {PYTORCH_MATMUL_512_GFLOPS} GFLOP/s"
                ),
                kiln_rate / PYTORCH_MATMUL_512_GFLOPS,
            ));
        }
    }
    Ok(())
}

/// Best-of-`reps` ms of each pass of kiln's CPU convolution alone (forward, input gradient,
/// weight gradient), on the input, weight and output gradient's values (`[x, w, grad]`) in
/// kiln's pool: which pass a shape's time goes to.
pub(super) fn pass_times(
    g: &Conv2dGeometry,
    [x, w, grad]: [&[f32]; 3],
    reps: usize,
) -> Result<[f64; 3], String> {
    let mut out = vec![0f32; grad.len()];
    let mut gin = vec![0f32; x.len()];
    let mut gw = vec![0f32; w.len()];
    let time = |pass: &mut (dyn FnMut() -> kiln_device::Result<()> + Send)| {
        best_of(reps, || {
            kiln_device::threads::install(&mut *pass).map_err(err)
        })
        .map(|s| s * 1e3)
    };
    Ok([
        time(&mut || cpu::conv2d_forward(g, x, w, None, &mut out))?,
        time(&mut || cpu::conv2d_backward_input(g, grad, w, &mut gin))?,
        time(&mut || cpu::conv2d_backward_weight(g, x, grad, &mut gw))?,
    ])
}

fn conv2d(options: &Options, rows: &mut Vec<Row>) -> Result<(), String> {
    let batch = 32;
    let reference_batch = if options.quick { 1 } else { 2 };
    let reps = if options.quick { 1 } else { 3 };
    let mut generator = Generator::new(2);
    let (mut kiln_total, mut ref_seconds_total, mut flops_total) = (0.0, 0.0, 0.0);
    for c in RESNET18_CONVS {
        let (geometry, params) = c.geometry(batch)?;
        let (input_shape, weight_shape) = (geometry.input_shape(), geometry.weight_shape());
        // Forward, input gradient and weight gradient each do the forward's multiply-adds.
        let flops = 3.0 * 2.0 * geometry.forward_macs() as f64;
        let x = generator
            .normal(&input_shape, 0.0, 1.0, DType::F32, Device::Cpu)
            .map_err(err)?;
        let w = generator
            .normal(&weight_shape, 0.0, 0.1, DType::F32, Device::Cpu)
            .map_err(err)?;
        let grad = generator
            .normal(&geometry.output_shape(), 0.0, 1.0, DType::F32, Device::Cpu)
            .map_err(err)?;
        x.set_requires_grad(true).map_err(err)?;
        w.set_requires_grad(true).map_err(err)?;
        let kiln = best_of(reps, || {
            x.set_grad(None).map_err(err)?;
            w.set_grad(None).map_err(err)?;
            let out = x.conv2d(&w, None, params).map_err(err)?;
            out.backward_with(Some(&grad), false).map_err(err)?;
            black_box(w.grad());
            Ok(())
        })?;

        let (xv, wv, gv) = (
            x.to_vec::<f32>().map_err(err)?,
            w.to_vec::<f32>().map_err(err)?,
            grad.to_vec::<f32>().map_err(err)?,
        );
        let passes = pass_times(&geometry, [&xv, &wv, &gv], reps)?;

        // The reference on `reference_batch` images.
        let (small, _) = c.geometry(reference_batch)?;
        let small_flops = 3.0 * 2.0 * small.forward_macs() as f64;
        let xv = &xv[..small.input_shape().iter().product::<usize>()];
        let gv = &gv[..small.output_shape().iter().product::<usize>()];
        let mut out = vec![0f32; gv.len()];
        let mut gin = vec![0f32; xv.len()];
        let mut gw = vec![0f32; wv.len()];
        let mut failed = None;
        let reference = seconds(|| {
            let r = reference::conv2d_forward(&small, xv, &wv, None, &mut out)
                .and_then(|_| reference::conv2d_backward_input(&small, gv, &wv, &mut gin))
                .and_then(|_| reference::conv2d_backward_weight(&small, xv, gv, &mut gw));
            failed = r.err();
        });
        if let Some(e) = failed {
            return Err(e.to_string());
        }
        black_box((&out, &gin, &gw));
        let (kiln_rate, ref_rate) = (flops / kiln / 1e9, small_flops / reference / 1e9);
        eprintln!(
            "bench ops: conv2d {}: kiln {kiln_rate:.2} GFLOP/s, plain loops {ref_rate:.3} GFLOP/s",
            c.name
        );
        kiln_total += kiln;
        ref_seconds_total += flops / (ref_rate * 1e9);
        flops_total += flops;
        rows.push(Row::new(
            GROUP,
            format!("conv2d_fwd_bwd_f32_b{batch}_{}", c.name),
            "GFLOP/s",
            kiln_rate,
            format!(
                "plain 7-loop conv fwd+bwd (batch {reference_batch}), same run: {ref_rate:.3} \
                 GFLOP/s; kiln's passes alone: forward / input gradient / weight gradient \
                 {:.2} / {:.2} / {:.2} ms",
                passes[0], passes[1], passes[2]
            ),
            kiln_rate / ref_rate,
        ));
    }
    let (kiln_rate, ref_rate) = (
        flops_total / kiln_total / 1e9,
        flops_total / ref_seconds_total / 1e9,
    );
    rows.push(Row::new(
        GROUP,
        format!("conv2d_fwd_bwd_f32_b{batch}_resnet18_all_shapes"),
        "GFLOP/s",
        kiln_rate,
        format!("plain 7-loop conv over the same shapes: {ref_rate:.3} GFLOP/s"),
        kiln_rate / ref_rate,
    ));
    Ok(())
}
