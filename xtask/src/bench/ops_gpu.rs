//! The `--gpu` cases of `cargo xtask bench ops` (issue 10), each next to a reference measured in
//! the same run on the same device:
//! - matmul 4096³ in f32 and bf16 through `Tensor::matmul` (autograd, seam, `CudaStorage`,
//!   cuBLAS) against a raw `cublasGemmEx` on buffers of the same shapes: the ratio shows the
//!   overhead kiln adds (≈ 1 is the goal);
//! - elementwise add and exp, and reductions (whole-tensor sum and max, which split each
//!   output over many blocks; row sums, one block per row; column sums, reduced dim outer and
//!   strided) over 2^28 f32 as GB/s (bytes read + written once), against the device's measured
//!   copy bandwidth (`cuMemcpyDtoD` of the same bytes, read + write counted): the ratio is the
//!   fraction reached (issue 10 asks >= 0.8 for the contiguous cases);
//! - ResNet18 training step at 224x224 (batch 256, quick: 32) under bf16 autocast with SGD
//!   momentum, the model moved with `LayerExt::to_device`: ms per step and TFLOP/s against
//!   kiln's own bf16 matmul 4096³ rate in the same run (see [`resnet18`]); then the same step
//!   with the convolutions' column budget raised to hold the whole batch (time and peak); then
//!   where the step's time goes ([`breakdown`]): its parts, each waited for, and one step under
//!   a synchronized `OpProfile`, by forward op and backward node kind; then each of its
//!   convolution shapes pass by pass (`ops_gpu_conv.rs`).
//!
//! With `--vs-torch`, the matmuls and the ResNet18 step (default column budget) also run in
//! PyTorch on the same device, timed the same way, in rounds alternating with kiln's (rows
//! `... vs PyTorch`, `torch.rs`; PyTorch's step uses cuDNN's convolutions).
//!
//! Timing: one warm-up, then `reps` launches between two stream synchronisations (kiln's ops
//! queue asynchronously; only the synchronisation waits), best of three such rounds.

use super::conv_shapes::RESNET18_224_CONVS;
use super::harness::{err, kinds_line, kinds_ms, per_step, Options, Row};
use super::ops_gpu_conv::{conv_pass_rows, per_call_with};
use super::torch::{Figure, Pairs};
use kiln_alloc_cache::synth::SplitMix64;
use kiln_autograd::{DType, Device, Generator, Tensor};
use kiln_device::cuda::cudarc::cublas::{result as blas, sys, CudaBlas};
use kiln_device::cuda::cudarc::driver::{result as driver, CudaStream, DevicePtr, DevicePtrMut};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

const GROUP: &str = "ops";

/// A timed op producing a tensor.
type Op<'a> = Box<dyn Fn() -> Result<Tensor, String> + 'a>;

/// Runs the `--gpu` cases, or prints why they are skipped.
pub fn run(options: &Options, rows: &mut Vec<Row>) -> Result<(), String> {
    if let Some(reason) = kiln_device::cuda_status().reason() {
        eprintln!("bench ops: --gpu cases skipped: CUDA unavailable: {reason}");
        return Ok(());
    }
    let stream = match kiln_device::cuda_stream(0) {
        Ok(stream) => stream,
        Err(e) => {
            rows.push(Row::failed(GROUP, "gpu cases", &e.to_string()));
            return Ok(());
        }
    };
    let reps = if options.quick { 3 } else { 20 };
    // Each case that fails becomes a failed row (printed, and `bench` exits non-zero after
    // writing the report) while the others still run: the first GPU run must report as much
    // as it can.
    let mut case = |name: &str, result: Result<(), String>| {
        if let Err(e) = result {
            eprintln!("bench ops: {name} failed: {e}");
            rows.push(Row::failed(GROUP, name, &e));
        }
    };
    let mut measured = Vec::new();
    let mut pairs = Pairs::new(GROUP, options);
    for dtype in [DType::F32, DType::BF16] {
        case(
            &format!("gpu_matmul_4096_{dtype}"),
            matmul(&stream, dtype, reps, &mut measured, &mut pairs),
        );
    }
    case("gpu_bandwidth", bandwidth(&stream, reps, &mut measured));
    case(
        "gpu_resnet18_train_step_bf16",
        resnet18(&stream, options, &mut measured, &mut pairs),
    );
    rows.extend(measured);
    rows.extend(pairs.into_rows());
    Ok(())
}

/// Seconds per call of `f`: best of three rounds of `reps` calls between synchronisations.
fn per_call(
    stream: &Arc<CudaStream>,
    reps: usize,
    f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    per_call_with(|| stream.synchronize().map_err(err), reps, f)
}

fn matmul(
    stream: &Arc<CudaStream>,
    dtype: DType,
    reps: usize,
    rows: &mut Vec<Row>,
    pairs: &mut Pairs,
) -> Result<(), String> {
    let n = 4096usize;
    let flops = 2.0 * (n as f64).powi(3);
    let dev = Device::Cuda(0);
    let mut g = Generator::new(7);
    let a = g.normal(&[n, n], 0.0, 1.0, dtype, dev).map_err(err)?;
    let b = g.normal(&[n, n], 0.0, 1.0, dtype, dev).map_err(err)?;
    let time_kiln = || {
        per_call(stream, reps, || {
            std::hint::black_box(a.matmul(&b).map_err(err)?);
            Ok(())
        })
    };
    let kiln = time_kiln()?;
    // Raw cuBLAS on plain buffers of the same sizes, holding random values as kiln's operands
    // do: an H200 multiplies zeros faster than random data (about 894 against 788 TFLOP/s in
    // bf16), so zero-filled operands would make a slower reference look like kiln's overhead.
    let bytes = n * n * if dtype == DType::F32 { 4 } else { 2 };
    let (x, y) = (
        stream
            .clone_htod(&random_operand(n * n, dtype, 1))
            .map_err(err)?,
        stream
            .clone_htod(&random_operand(n * n, dtype, 2))
            .map_err(err)?,
    );
    let mut z = stream.alloc_zeros::<u8>(bytes).map_err(err)?;
    let blas_handle = CudaBlas::new(stream.clone()).map_err(|e| format!("{e:?}"))?;
    let data_type = if dtype == DType::F32 {
        sys::cudaDataType::CUDA_R_32F
    } else {
        sys::cudaDataType::CUDA_R_16BF
    };
    let (one, zero) = (1f32, 0f32);
    let ni = n as i32;
    let raw = {
        let (xp, _gx) = x.device_ptr(stream);
        let (yp, _gy) = y.device_ptr(stream);
        let (zp, _gz) = z.device_ptr_mut(stream);
        per_call(stream, reps, || {
            // SAFETY: three n×n buffers of the data type on `stream`; host scalars.
            unsafe {
                blas::gemm_ex(
                    *blas_handle.handle(),
                    sys::cublasOperation_t::CUBLAS_OP_N,
                    sys::cublasOperation_t::CUBLAS_OP_N,
                    ni,
                    ni,
                    ni,
                    (&one as *const f32).cast::<c_void>(),
                    xp as *const c_void,
                    data_type,
                    ni,
                    yp as *const c_void,
                    data_type,
                    ni,
                    (&zero as *const f32).cast::<c_void>(),
                    zp as *mut c_void,
                    data_type,
                    ni,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                )
            }
            .map_err(|e| format!("{e:?}"))
        })?
    };
    let (kiln_tf, raw_tf) = (flops / kiln / 1e12, flops / raw / 1e12);
    rows.push(Row::new(
        GROUP,
        format!("gpu_matmul_4096_{dtype}"),
        "TFLOP/s",
        kiln_tf,
        format!("raw cublasGemmEx {raw_tf:.1} TFLOP/s"),
        kiln_tf / raw_tf,
    ));
    let short = if dtype == DType::F32 { "f32" } else { "bf16" };
    pairs.add(
        &format!("gpu_matmul_4096_{dtype}"),
        &format!("gpu_matmul_{short}/{n}"),
        Figure::Gflops,
        flops / kiln / 1e9,
        || time_kiln().map(|t| flops / t / 1e9),
    )
}

/// `len` values uniform in [-1, 1) as the bytes of `dtype` (f32, else bf16 by truncation), from
/// a fixed-seed generator: the raw GEMM's operands.
fn random_operand(len: usize, dtype: DType, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64(seed);
    let mut bytes = Vec::with_capacity(len * 4);
    for _ in 0..len {
        let v = (rng.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        if dtype == DType::F32 {
            bytes.extend_from_slice(&v.to_le_bytes());
        } else {
            bytes.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
        }
    }
    bytes
}

/// The device's copy bandwidth in bytes per second, read + write bytes counted: `reps`
/// `cuMemcpyDtoD` copies of `n` f32 between two synchronisations, best of three rounds (the
/// buffers are freed on return). Shared with the `clip` and `optim` groups' `--gpu` cases.
pub(super) fn copy_bandwidth(
    stream: &Arc<CudaStream>,
    n: usize,
    reps: usize,
) -> Result<f64, String> {
    // One device-to-device copy reads and writes every byte.
    let src = stream.alloc_zeros::<f32>(n).map_err(err)?;
    let mut dst = stream.alloc_zeros::<f32>(n).map_err(err)?;
    let copy = {
        let (s, _gs) = src.device_ptr(stream);
        let (d, _gd) = dst.device_ptr_mut(stream);
        per_call(stream, reps, || {
            // SAFETY: both buffers hold n f32 and live on `stream`.
            unsafe { driver::memcpy_dtod_async(d, s, n * 4, stream.cu_stream()) }.map_err(err)
        })?
    };
    Ok(2.0 * (n * 4) as f64 / copy)
}

fn bandwidth(stream: &Arc<CudaStream>, reps: usize, rows: &mut Vec<Row>) -> Result<(), String> {
    let n = 1usize << 28;
    let bytes = (n * 4) as f64;
    let dev = Device::Cuda(0);
    let copy_gbs = copy_bandwidth(stream, n, reps)? / 1e9;
    let mut g = Generator::new(3);
    let a = g.normal(&[n], 0.0, 1.0, DType::F32, dev).map_err(err)?;
    let b = g.normal(&[n], 0.0, 1.0, DType::F32, dev).map_err(err)?;
    let cases: [(&str, f64, Op<'_>); 6] = [
        (
            "gpu_add_f32_2^28",
            3.0 * bytes,
            Box::new(|| a.add(&b).map_err(err)),
        ),
        (
            "gpu_exp_f32_2^28",
            2.0 * bytes,
            Box::new(|| a.exp().map_err(err)),
        ),
        (
            "gpu_sum_rows_f32_2^14x2^14",
            bytes,
            Box::new(|| {
                a.reshape(&[1 << 14, 1 << 14])
                    .and_then(|t| t.sum(&[1], false))
                    .map_err(err)
            }),
        ),
        (
            "gpu_sum_all_f32_2^28",
            bytes,
            Box::new(|| a.sum_all().map_err(err)),
        ),
        (
            "gpu_max_all_f32_2^28",
            bytes,
            Box::new(|| a.max_all().map_err(err)),
        ),
        (
            "gpu_sum_cols_f32_2^24x16",
            bytes,
            Box::new(|| {
                a.reshape(&[1 << 24, 16])
                    .and_then(|t| t.sum(&[0], false))
                    .map_err(err)
            }),
        ),
    ];
    for (case, traffic, f) in cases {
        let t = per_call(stream, reps, || {
            std::hint::black_box(f()?);
            Ok(())
        })?;
        let gbs = traffic / t / 1e9;
        rows.push(Row::new(
            GROUP,
            case,
            "GB/s",
            gbs,
            format!("device copy {copy_gbs:.0} GB/s"),
            gbs / copy_gbs,
        ));
    }
    Ok(())
}

/// ResNet18 training step (torchvision layout, 1000 classes, 224x224) under bf16 autocast:
/// `forward -> cross_entropy -> backward -> SGD momentum step -> zero_grad`, parameters f32 on
/// cuda:0. FLOPs are 3 x 2 x the forward's multiply-adds from `kiln_models::summary`; the
/// reference is kiln's bf16 matmul 4096³ measured here, so the ratio is the fraction of dense
/// GEMM speed a whole step reaches.
fn resnet18(
    stream: &Arc<CudaStream>,
    options: &Options,
    rows: &mut Vec<Row>,
    pairs: &mut Pairs,
) -> Result<(), String> {
    use kiln_losses::{cross_entropy, CrossEntropyOptions};
    use kiln_models::{Layer, LayerExt};
    use kiln_optim::{Optimizer, ParamGroup, Sgd, SgdOptions};
    let dev = Device::Cuda(0);
    let batch = if options.quick { 32 } else { 256 };
    kiln_autograd::manual_seed(0);
    let model = kiln_models::models::resnet18(1000).map_err(err)?;
    let s = kiln_models::summary(&model, &[batch, 3, 224, 224]).map_err(err)?;
    model.to_device(dev).map_err(err)?;
    let mut opt = Sgd::new(
        vec![ParamGroup::from_module(&model)],
        SgdOptions::default().lr(0.01).momentum(0.9),
    )
    .map_err(err)?;
    let x = Generator::new(3)
        .normal(&[batch, 3, 224, 224], 0.0, 1.0, DType::F32, dev)
        .map_err(err)?;
    let labels: Vec<i64> = (0..batch).map(|i| ((i * 7 + 3) % 1000) as i64).collect();
    let y = Tensor::from_vec(labels, &[batch], dev).map_err(err)?;
    let ce = CrossEntropyOptions::default();
    let reps = if options.quick { 2 } else { 10 };
    // Timed with the default column budget (convolutions unfold a few images at a time), then
    // with a budget that holds the whole batch: step time and peak memory of each.
    let mut timed = |budget: usize| -> Result<(f64, usize), String> {
        let default = kiln_device::ops::conv::set_cuda_conv_column_budget(budget).map_err(err)?;
        kiln_device::reset_peak_memory_stats(dev).map_err(err)?;
        let step = per_call(stream, reps, || {
            let loss = kiln_autograd::autocast(DType::BF16, || {
                cross_entropy(&model.forward(&x).map_err(err)?, &y, &ce).map_err(err)
            })
            .map_err(err)??;
            loss.backward().map_err(err)?;
            opt.step().map_err(err)?;
            opt.zero_grad(true).map_err(err)
        });
        kiln_device::ops::conv::set_cuda_conv_column_budget(default).map_err(err)?;
        Ok((step?, kiln_device::max_memory_allocated(dev).map_err(err)?))
    };
    let (step, peak) = timed(kiln_device::ops::conv::DEFAULT_CUDA_CONV_COLUMN_BUDGET)?;
    let (whole_step, whole_peak) = timed(usize::MAX)?;
    let loss = kiln_autograd::no_grad(|| {
        cross_entropy(&model.forward(&x).map_err(err)?, &y, &ce).map_err(err)
    })?
    .item()
    .map_err(err)?;
    if !loss.is_finite() {
        return Err(format!("the loss after the timed steps is {loss}"));
    }
    let n = 4096;
    let mut g = Generator::new(9);
    let a = g.normal(&[n, n], 0.0, 1.0, DType::BF16, dev).map_err(err)?;
    let b = g.normal(&[n, n], 0.0, 1.0, DType::BF16, dev).map_err(err)?;
    let mm = per_call(stream, reps, || {
        std::hint::black_box(a.matmul(&b).map_err(err)?);
        Ok(())
    })?;
    let mm_tf = 2.0 * (n as f64).powi(3) / mm / 1e12;
    let step_tf = 6.0 * s.total_mult_adds as f64 / step / 1e12;
    eprintln!(
        "bench ops: gpu resnet18 bf16 batch {batch}: {:.1} ms/step, {step_tf:.1} TFLOP/s, loss {loss:.3}",
        step * 1e3
    );
    rows.push(Row::new(
        GROUP,
        format!("gpu resnet18 224x224 batch {batch} train step (bf16 autocast, SGD momentum)"),
        "ms",
        step * 1e3,
        format!("step at {step_tf:.1} TFLOP/s vs kiln bf16 matmul 4096³ {mm_tf:.1} TFLOP/s"),
        step_tf / mm_tf,
    ));
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    rows.push(Row::new(
        GROUP,
        format!("gpu resnet18 224x224 batch {batch} train step, whole batch unfolded per conv"),
        "ms",
        whole_step * 1e3,
        format!(
            "column budget {} MiB: {:.1} ms (ratio = whole / budget); peak {:.0} MiB vs {:.0} MiB",
            kiln_device::ops::conv::DEFAULT_CUDA_CONV_COLUMN_BUDGET >> 20,
            step * 1e3,
            mib(whole_peak),
            mib(peak)
        ),
        whole_step / step,
    ));
    pairs.add(
        &format!("gpu resnet18 224x224 batch {batch} train step (bf16 autocast, SGD momentum)"),
        &format!("gpu_resnet18_224_step_bf16/{batch}"),
        Figure::Millis,
        step * 1e3,
        || {
            timed(kiln_device::ops::conv::DEFAULT_CUDA_CONV_COLUMN_BUDGET)
                .map(|(step, _)| step * 1e3)
        },
    )?;
    let case = format!("gpu resnet18 224x224 batch {batch} train step");
    let mut step_once = || -> Result<[Instant; 4], String> {
        let wait = || kiln_device::synchronize(dev).map_err(err);
        wait()?;
        let start = Instant::now();
        let loss = kiln_autograd::autocast(DType::BF16, || {
            cross_entropy(&model.forward(&x).map_err(err)?, &y, &ce).map_err(err)
        })
        .map_err(err)??;
        wait()?;
        let forward = Instant::now();
        loss.backward().map_err(err)?;
        wait()?;
        let backward = Instant::now();
        opt.step().map_err(err)?;
        opt.zero_grad(true).map_err(err)?;
        wait()?;
        Ok([start, forward, backward, Instant::now()])
    };
    breakdown(&case, dev, step, reps.min(3), &mut step_once, rows)?;
    let convs = RESNET18_224_CONVS;
    conv_pass_rows(convs, dev, DType::BF16, batch, reps, mm_tf, rows, pairs)
}

/// Where a GPU step's time goes, as rows: its parts (forward + loss, backward, optimizer), each
/// waited for, medians of `rounds` steps of `step_once` (which returns the instants between
/// them); then one step under a synchronized `OpProfile`, by op and node kind.
fn breakdown(
    case: &str,
    dev: Device,
    step: f64,
    rounds: usize,
    step_once: &mut dyn FnMut() -> Result<[Instant; 4], String>,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    let mut parts = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..rounds.max(1) {
        let t = step_once()?;
        for (i, part) in parts.iter_mut().enumerate() {
            part.push((t[i + 1] - t[i]).as_secs_f64() * 1e3);
        }
    }
    let [forward, backward, optimizer] = parts.map(|mut t| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    });
    let profile = kiln_autograd::OpProfile::start_synchronized(dev).map_err(err)?;
    step_once()?;
    let times = profile.finish();
    rows.push(Row::new(
        GROUP,
        format!("{case}: parts, each waited for"),
        "ms",
        forward + backward + optimizer,
        format!(
            "forward + loss {forward:.1} / backward {backward:.1} / optimizer step + zero_grad \
             {optimizer:.1} ms (medians); ratio = sum / step time {:.1} ms",
            step * 1e3
        ),
        (forward + backward + optimizer) / (step * 1e3),
    ));
    for (what, list, part) in [
        ("forward by op", times.forward, forward),
        ("backward by node", times.backward, backward),
    ] {
        let (line, ms) = by_name_line(list);
        eprintln!("bench ops: {case} {what}: {line}");
        rows.push(Row::new(
            GROUP,
            format!("{case}: {what}, each waited for"),
            "ms",
            ms,
            format!("{line}; ratio = share of the part ({part:.1} ms)"),
            ms / part.max(f64::MIN_POSITIVE),
        ));
    }
    Ok(())
}

/// Op or node kinds listed by name in a breakdown row (the rest are summed as "others").
const TOP_KINDS: usize = 8;

/// The slowest kinds of one profiled step and the rest, one line (`Convolution 41.2 ms (20x),
/// ...`), and the list's total ms.
fn by_name_line(list: Vec<kiln_autograd::NodeTime>) -> (String, f64) {
    let kinds = per_step(list, 1);
    (kinds_line(&kinds, TOP_KINDS), kinds_ms(&kinds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_gemm_operands_are_random_values_in_range() {
        let f = random_operand(1000, DType::F32, 1);
        let values: Vec<f32> = f
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(values.len(), 1000);
        assert!(values.iter().all(|v| (-1.0..1.0).contains(v)));
        // Not constant, and spread over both signs (a zero-filled operand is what this avoids).
        let negative = values.iter().filter(|v| **v < 0.0).count();
        assert!((400..600).contains(&negative), "{negative}");
        // bf16: the same generator's values, truncated to their top 16 bits.
        let h = random_operand(1000, DType::BF16, 1);
        assert_eq!(h.len(), 2000);
        for (v, b) in values.iter().zip(h.chunks_exact(2)) {
            let bits = u16::from_le_bytes(b.try_into().unwrap());
            assert_eq!(bits, (v.to_bits() >> 16) as u16);
        }
        assert_ne!(
            random_operand(4, DType::F32, 2),
            random_operand(4, DType::F32, 1)
        );
    }

    #[test]
    fn a_breakdown_reports_a_steps_parts_ops_and_nodes() {
        // A CPU step stands in for the GPU's: waiting on the CPU is a no-op.
        let x = Tensor::randn(&[2, 3, 8, 8], DType::F32, Device::Cpu).unwrap();
        let w = Tensor::randn(&[4, 3, 3, 3], DType::F32, Device::Cpu).unwrap();
        w.set_requires_grad(true).unwrap();
        let mut step_once = || -> Result<[Instant; 4], String> {
            let start = Instant::now();
            let y = x.conv2d(&w, None, Default::default()).map_err(err)?;
            let loss = y.relu().map_err(err)?.sum(&[], false).map_err(err)?;
            let forward = Instant::now();
            loss.backward().map_err(err)?;
            let backward = Instant::now();
            w.set_grad(None).map_err(err)?;
            Ok([start, forward, backward, Instant::now()])
        };
        let mut rows = Vec::new();
        breakdown("tiny", Device::Cpu, 1.0, 2, &mut step_once, &mut rows).unwrap();
        assert_eq!(rows.len(), 3);
        let json = serde_json::to_string(&rows).unwrap();
        assert!(json.contains("tiny: parts, each waited for"), "{json}");
        // One profiled step: each op and node once.
        assert!(json.contains("Convolution"), "{json}");
        assert!(json.contains("Relu") && json.contains("Sum"), "{json}");
        assert!(json.contains("ConvolutionBackward"), "{json}");
        assert!(json.contains("AccumulateGrad"), "{json}");
    }

    #[test]
    fn a_breakdown_line_lists_the_slowest_kinds_and_sums_the_rest() {
        let names = [
            "Convolution",
            "NativeBatchNorm",
            "Relu",
            "Add",
            "MaxPool2DWithIndices",
            "Mm",
            "ToDtype",
            "Sum",
            "Mean",
            "View",
        ];
        let list: Vec<kiln_autograd::NodeTime> = names
            .iter()
            .enumerate()
            .map(|(i, &name)| kiln_autograd::NodeTime {
                name,
                calls: i as u64 + 1,
                seconds: (10 - i) as f64 * 1e-3,
            })
            .collect();
        let (line, ms) = by_name_line(list);
        assert!((ms - 55.0).abs() < 1e-9, "{ms}");
        assert!(line.starts_with("Convolution 10.0 ms (1x), NativeBatchNorm 9.0 ms (2x)"));
        // The eighth is listed, the last two (2 + 1 ms) are the rest.
        assert!(line.ends_with("Sum 3.0 ms (8x), others 3.0 ms"), "{line}");
        assert_eq!(by_name_line(Vec::new()), (String::new(), 0.0));
    }
}
