//! The `--gpu` cases of `cargo xtask bench clip` (issues 5 and 10): fused global-norm clipping of
//! the `clip` group's three gradient sets as the gradients of f32 parameters on cuda:0 (and the
//! GPT-2 set once more with bf16 gradients), when not clipping and when clipping, next to two
//! references measured in the same run on the same device:
//!
//! - the device's copy bandwidth `copy_bw` (`cuMemcpyDtoD` of 256 MiB, read + write bytes per
//!   second, [`super::ops_gpu::copy_bandwidth`]). A pass that moves `B` bytes (reads + writes)
//!   cannot beat `limit = B / copy_bw`; the row's ratio is `limit / measured` (1.0 = at the
//!   limit). `B` is [`traffic_bytes`]: `N·e` not clipping (one read of the `N` gradient elements
//!   of `e` bytes), `3·N·e` clipping (norm read, then scale read + write). Honest caveat: the
//!   read-only pass is charged at the copy's mixed read/write rate, and HBM streams pure reads
//!   somewhat faster than a copy, so a no-clip ratio up to ~1.1 still means "at the limit";
//! - a per-tensor loop of kiln tensor ops, PyTorch's `clip_grad_norm_(foreach=False)`: one
//!   `norm` per gradient, `stack`, the norm of the norms, `max_norm / (total + 1e-6)` clamped to
//!   1, one in-place `mul_` per gradient, with no host wait. Like PyTorch's, that loop cannot
//!   know on the host whether the coefficient is 1, so it multiplies when not clipping too. Its
//!   ratio is `loop time / fused time`, the fused time being the norm-on-device variant (neither
//!   waits for the device);
//! - with `--vs-torch`, PyTorch's `clip_grad_norm_` on the same device and gradients (its CUDA
//!   default: foreach kernels, the norm a device tensor), timed the same way, against the f32
//!   clipping case with the norm on the device (rows `... vs PyTorch`, `torch.rs`).
//!
//! Each fused case is timed twice: `clip_grad_norm_` (returns the total as `f64`, so every call
//! waits for the device) and `clip_grad_norm_on_device` (returns a 0-d device tensor; calls
//! queue work and return). In the clipping cases `max_norm` is 0.999 x the norm the gradients
//! have when the call runs (tracked on the host: after a clip the norm is `max_norm`), so every
//! call really scales, with gradients ~N(0, 0.1) staying far from subnormal.
//!
//! Timing ([`per_call`]): two warm-up calls, then three rounds of `reps` calls between two
//! `kiln_device::synchronize` calls, best round; `reps` is sized from the second warm-up so a
//! round takes about 50 ms (10 ms with `--quick`); very slow calls get fewer rounds. A failing
//! case prints why and adds a [`Row::failed`] row; the other cases still run, and `bench` exits
//! with an error after writing the report.

use super::clip::{grad_sets, GradSet};
use super::harness::{err, gpu_cases, Options, Row};
use super::torch::{Figure, Pairs};
use kiln_autograd::{no_grad, DType, Device, Generator, Parameter, Tensor};
use std::time::Instant;

const GROUP: &str = "clip";
/// The clipping cases' `max_norm` as a fraction of the norm the gradients have at the call.
const SHRINK: f64 = 0.999;

/// A pass over a gradient set whose memory traffic [`traffic_bytes`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    /// `clip_grad_norm_` when not clipping: one read of every gradient.
    ClipNoScale,
    /// `clip_grad_norm_` when clipping: norm read, then scale read + write.
    ClipAndScale,
    /// AdamW step, all f32: read param, grad, exp_avg, exp_avg_sq; write param and both moments.
    AdamW,
    /// SGD step with momentum (steady state), all f32: read param, grad, momentum buffer; write
    /// param and buffer.
    SgdMomentum,
}

/// Bytes a pass reads plus bytes it writes, over `numel` elements whose gradients take
/// `grad_bytes` bytes each (optimizer passes are all f32).
pub(super) fn traffic_bytes(pass: Pass, numel: u64, grad_bytes: u64) -> u64 {
    match pass {
        Pass::ClipNoScale => numel * grad_bytes,
        Pass::ClipAndScale => 3 * numel * grad_bytes,
        Pass::AdamW => 7 * numel * 4,
        Pass::SgdMomentum => 5 * numel * 4,
    }
}

/// Copy bandwidth in bytes/s on cuda:0 measured now, and its row for `group`; `None` (after a
/// one-line reason on stderr) when CUDA is unusable.
pub(super) fn device_bandwidth(
    group: &str,
    options: &Options,
    rows: &mut Vec<Row>,
) -> Result<Option<f64>, String> {
    if let Some(reason) = kiln_device::cuda_status().reason() {
        eprintln!("bench {group}: --gpu cases skipped: CUDA unavailable: {reason}");
        return Ok(None);
    }
    let stream = kiln_device::cuda_stream(0).map_err(err)?;
    let reps = if options.quick { 5 } else { 20 };
    let copy_bw = super::ops_gpu::copy_bandwidth(&stream, 1 << 26, reps)?;
    rows.push(Row::new(
        group,
        "gpu device copy bandwidth (cuMemcpyDtoD 256 MiB, R+W)",
        "GB/s",
        copy_bw / 1e9,
        "measured this run",
        1.0,
    ));
    Ok(Some(copy_bw))
}

/// Seconds per call of `f`: two warm-up calls, then the best of three rounds of `reps` calls
/// between two synchronisations of `device` (`reps` from the second, timed, warm-up: a round of
/// about 50 ms, 10 ms with `--quick`, 1 to 200 calls); a call slower than four rounds gets one
/// timed call after the warm-ups instead, and the better of it and the timed warm-up counts.
pub(super) fn per_call(
    device: Device,
    options: &Options,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let sync = || kiln_device::synchronize(device).map_err(err);
    f()?;
    sync()?;
    let start = Instant::now();
    f()?;
    sync()?;
    let warm = start.elapsed().as_secs_f64().max(1e-7);
    let round = if options.quick { 0.01 } else { 0.05 };
    let reps = ((round / warm) as usize).clamp(1, 200);
    // A slow call (the per-tensor loop over 2,000 tensors) gets one more timed call, not three.
    let rounds = if warm > 4.0 * round { 1 } else { 3 };
    let mut best = if rounds == 1 { warm } else { f64::INFINITY };
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..reps {
            f()?;
        }
        sync()?;
        best = best.min(start.elapsed().as_secs_f64() / reps as f64);
    }
    Ok(best)
}

/// Parameters on `device` with the set's lengths (values 0.01) and gradients ~N(0, 0.1), all of
/// `dtype`, generated on the device.
pub(super) fn device_params(
    set: &GradSet,
    dtype: DType,
    device: Device,
) -> Result<Vec<(String, Parameter)>, String> {
    let mut g = Generator::new(5);
    set.lens
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let p = Parameter::new(Tensor::full(&[n], 0.01, dtype, device).map_err(err)?)
                .map_err(err)?;
            p.set_grad(Some(g.normal(&[n], 0.0, 0.1, dtype, device).map_err(err)?))
                .map_err(err)?;
            Ok((format!("t{i}"), p))
        })
        .collect()
}

/// The PyTorch script's name of one of [`grad_sets`]' sets (its `gpu_clip_<name>` and
/// `gpu_adamw_<name>` cases); `None` for a set of a test's own.
pub(super) fn torch_set_name(set: &GradSet) -> Option<&'static str> {
    match set.name {
        n if n.starts_with("resnet18 ") => Some("resnet18"),
        n if n.starts_with("gpt2-small ") => Some("gpt2"),
        "2000 x 1000" => Some("2000x1000"),
        _ => None,
    }
}

/// PyTorch's `clip_grad_norm_(foreach=False)` in kiln tensor ops; never waits for the device.
fn per_tensor_loop(params: &[(String, Parameter)], max_norm: f64) -> Result<(), String> {
    no_grad(|| {
        let grads: Vec<Tensor> = params.iter().filter_map(|(_, p)| p.grad()).collect();
        let norms = grads
            .iter()
            .map(|g| g.norm(2.0, &[], false))
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        let total = Tensor::stack(&norms, 0)
            .and_then(|s| s.norm(2.0, &[], false))
            .map_err(err)?;
        let coef = Tensor::scalar(max_norm, DType::F32, total.device())
            .and_then(|m| m.div(&total.add_scalar(1e-6)?))
            .and_then(|c| c.minimum_scalar(1.0))
            .map_err(err)?;
        for g in &grads {
            g.mul_(&coef).map_err(err)?;
        }
        Ok(())
    })
}

/// Runs the `--gpu` cases into `rows`, or prints why they are skipped. An error that stops
/// them (no bandwidth figure, a failed synchronisation) becomes a [`Row::failed`] row, so the
/// rows of every group are still written.
pub fn run(options: &Options, rows: &mut Vec<Row>) {
    gpu_cases(GROUP, options, rows, run_cases);
}

fn run_cases(options: &Options, rows: &mut Vec<Row>) -> Result<(), String> {
    let Some(copy_bw) = device_bandwidth(GROUP, options, rows)? else {
        return Ok(());
    };
    let dev = Device::Cuda(0);
    let mut pairs = Pairs::new(GROUP, options);
    for set in grad_sets() {
        let mut cases = vec![(DType::F32, true)];
        if set.name.starts_with("gpt2") {
            cases.push((DType::BF16, false));
        }
        for (dtype, with_loop) in cases {
            let label = format!("gpu {} {dtype} grads", set.name);
            let cases = SetCases {
                dtype,
                with_loop,
                copy_bw,
                device: dev,
            };
            if let Err(e) = one_set(&set, &cases, &label, options, rows, &mut pairs) {
                eprintln!("bench clip: {label} failed: {e}");
                rows.push(Row::failed(GROUP, label, &e));
            }
        }
        kiln_device::synchronize(dev).map_err(err)?;
    }
    rows.extend(pairs.into_rows());
    Ok(())
}

/// What [`one_set`] measures: gradients of `dtype` on `device` (cuda:0 in the benchmark; the
/// unit tests run the same code on the CPU), the per-tensor loop only when `with_loop`.
struct SetCases {
    dtype: DType,
    with_loop: bool,
    copy_bw: f64,
    device: Device,
}

/// The cases of one gradient set and dtype, as rows labelled `label`; with `--vs-torch`, the
/// f32 clip with the norm on the device also against PyTorch's `clip_grad_norm_` on the same
/// device (its CUDA default: foreach, the norm a device tensor), into `pairs`.
fn one_set(
    set: &GradSet,
    cases: &SetCases,
    label: &str,
    options: &Options,
    rows: &mut Vec<Row>,
    pairs: &mut Pairs,
) -> Result<(), String> {
    let &SetCases {
        dtype,
        with_loop,
        copy_bw,
        device: dev,
    } = cases;
    let params = device_params(set, dtype, dev)?;
    let e = |e: kiln_optim::Error| e.to_string();
    let numel = set.numel() as u64;
    let elem = dtype.size_in_bytes() as u64;
    let copy_gbs = copy_bw / 1e9;
    let total0 = kiln_optim::clip_grad_norm_(&params, f64::INFINITY, 2.0, false).map_err(e)?;
    if !total0.is_finite() || total0 <= 0.0 {
        return Err(format!("the gradients' total norm is {total0}"));
    }
    // Host-tracked bound for the clipping cases: the norm is `max_norm` after each clip.
    let mut max_norm = total0 * SHRINK;
    for clipping in [false, true] {
        let (pass, what, limit_name) = if clipping {
            (Pass::ClipAndScale, "clip", "2 reads + 1 write")
        } else {
            (Pass::ClipNoScale, "no clip", "1 read")
        };
        let limit = traffic_bytes(pass, numel, elem) as f64 / copy_bw;
        let reference = format!("bandwidth limit ({limit_name}) at device copy {copy_gbs:.0} GB/s");
        let mut next_bound = || {
            if clipping {
                let m = max_norm;
                max_norm *= SHRINK;
                m
            } else {
                f64::INFINITY
            }
        };
        // Each case is recorded on its own: a failure becomes its row and the others still run.
        let mut record = |case: &str, timed: Result<f64, String>| {
            let case = format!("{label}: {what}, {case}");
            match timed {
                Ok(t) => rows.push(Row::new(GROUP, case, "ms", t * 1e3, &reference, limit / t)),
                Err(e) => {
                    eprintln!("bench clip: {case} failed: {e}");
                    rows.push(Row::failed(GROUP, case, &e));
                }
            }
        };
        let t_wait = per_call(dev, options, || {
            kiln_optim::clip_grad_norm_(&params, next_bound(), 2.0, false)
                .map(drop)
                .map_err(e)
        });
        record("fused (f64 norm: waits each call)", t_wait.clone());
        let t_dev = per_call(dev, options, || {
            kiln_optim::clip_grad_norm_on_device(&params, next_bound(), 2.0, false)
                .map(drop)
                .map_err(e)
        });
        record("fused (norm stays on device)", t_dev.clone());
        if let (true, DType::F32, Some(name), Ok(t)) =
            (clipping, dtype, torch_set_name(set), &t_dev)
        {
            pairs.add(
                &format!("{label}: clip, fused (norm stays on device)"),
                &format!("gpu_clip_{name}"),
                Figure::Millis,
                t * 1e3,
                || {
                    per_call(dev, options, || {
                        kiln_optim::clip_grad_norm_on_device(&params, next_bound(), 2.0, false)
                            .map(drop)
                            .map_err(e)
                    })
                    .map(|t| t * 1e3)
                },
            )?;
        }
        if with_loop {
            // The loop's row: its time; ratio loop time / fused time (norm on device, else f64).
            let fused = t_dev.or(t_wait);
            let t_loop = per_call(dev, options, || per_tensor_loop(&params, next_bound()));
            let case = format!("{label}: {what}, fused (norm on device) vs per-tensor loop");
            match (t_loop, fused) {
                (Ok(t_loop), Ok(fused)) => rows.push(Row::new(
                    GROUP,
                    case,
                    "ms (loop)",
                    t_loop * 1e3,
                    "kiln-op loop as PyTorch foreach=False (always mul_), same run",
                    t_loop / fused,
                )),
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("bench clip: {case} failed: {e}");
                    rows.push(Row::failed(GROUP, case, &e));
                }
            }
        }
    }
    // The gradients must still be finite and clipped as tracked (a wrong bound would make the
    // clipping rows time a scale pass that never wrote).
    let last = kiln_optim::clip_grad_norm_(&params, f64::INFINITY, 2.0, false).map_err(e)?;
    let bound = max_norm / SHRINK;
    if !last.is_finite() || last > bound * 1.01 {
        return Err(format!(
            "after the clipping cases the norm is {last}, expected at most {bound}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_counts_each_read_and_write_once() {
        // Two gradients of 3 and 5 elements: 8 elements.
        let set = GradSet {
            name: "tiny",
            lens: vec![3, 5],
        };
        let n = set.numel() as u64;
        assert_eq!(traffic_bytes(Pass::ClipNoScale, n, 4), 32);
        assert_eq!(traffic_bytes(Pass::ClipAndScale, n, 4), 96);
        assert_eq!(traffic_bytes(Pass::ClipNoScale, n, 2), 16);
        assert_eq!(traffic_bytes(Pass::ClipAndScale, n, 2), 48);
        assert_eq!(traffic_bytes(Pass::AdamW, n, 4), 224);
        assert_eq!(traffic_bytes(Pass::SgdMomentum, n, 4), 160);
    }

    fn tiny_set() -> GradSet {
        GradSet {
            name: "tiny",
            lens: vec![3, 1000, 70],
        }
    }

    #[test]
    fn the_per_tensor_loop_clips_like_clip_grad_norm_() {
        let set = tiny_set();
        let (a, b) = (
            device_params(&set, DType::F32, Device::Cpu).unwrap(),
            device_params(&set, DType::F32, Device::Cpu).unwrap(),
        );
        let total = kiln_optim::clip_grad_norm_(&a, 1.0, 2.0, false).unwrap();
        // N(0, 0.1) over 1,073 elements: a total near 3.3, so max_norm 1 clips.
        assert!(total > 2.0 && total < 5.0, "{total}");
        per_tensor_loop(&b, 1.0).unwrap();
        for ((_, pa), (_, pb)) in a.iter().zip(&b) {
            let ga = pa.grad().unwrap().to_vec::<f32>().unwrap();
            let gb = pb.grad().unwrap().to_vec::<f32>().unwrap();
            for (x, y) in ga.iter().zip(&gb) {
                assert!((x - y).abs() <= 1e-6, "{x} vs {y}");
            }
        }
        // Not clipping: the loop multiplies by exactly 1.
        let before = b[1].1.grad().unwrap().to_vec::<f32>().unwrap();
        per_tensor_loop(&b, f64::INFINITY).unwrap();
        assert_eq!(b[1].1.grad().unwrap().to_vec::<f32>().unwrap(), before);
    }

    #[test]
    fn the_cases_of_a_set_run_on_the_cpu_and_report_every_row() {
        let options = Options {
            quick: true,
            ..Options::default()
        };
        for (dtype, with_loop, want) in [(DType::F32, true, 6), (DType::BF16, false, 4)] {
            let cases = SetCases {
                dtype,
                with_loop,
                copy_bw: 1e9,
                device: Device::Cpu,
            };
            let mut rows = Vec::new();
            let mut pairs = Pairs::new(GROUP, &options);
            one_set(&tiny_set(), &cases, "tiny", &options, &mut rows, &mut pairs).unwrap();
            assert!(pairs.into_rows().is_empty());
            assert_eq!(rows.len(), want, "{dtype}");
            for r in &rows {
                assert!(r.value > 0.0 && r.value.is_finite(), "{r:?}");
                assert!(r.ratio > 0.0 && r.ratio.is_finite(), "{r:?}");
            }
            // The clipping rows' limit counts 3 passes of the set's 1,073 elements.
            let clip = &rows[want / 2];
            assert!(clip.case.contains(": clip, fused (f64"), "{}", clip.case);
            let limit = (3 * 1073 * dtype.size_in_bytes()) as f64 / 1e9;
            let ratio = limit / (clip.value / 1e3);
            assert!((clip.ratio - ratio).abs() <= 1e-9 * ratio);
        }
    }

    #[test]
    fn traffic_of_the_benchmark_sets() {
        let sets = grad_sets();
        let numel: Vec<u64> = sets.iter().map(|s| s.numel() as u64).collect();
        let tensors: Vec<usize> = sets.iter().map(|s| s.lens.len()).collect();
        // torchvision's ResNet18 and GPT-2 small (wte + wpe + 12 blocks + ln_f).
        assert_eq!(numel, [11_689_512, 124_439_808, 2_000_000]);
        assert_eq!(tensors, [62, 148, 2000]);
        // Each set has its name in the PyTorch script's table of GPU sets.
        let script = include_str!("../../torch_bench.py");
        for set in &sets {
            let name = torch_set_name(set).unwrap();
            assert!(script.contains(&format!("\"{name}\": ")), "{name}");
        }
        assert_eq!(traffic_bytes(Pass::ClipNoScale, numel[0], 4), 46_758_048);
        assert_eq!(
            traffic_bytes(Pass::ClipAndScale, numel[1], 4),
            1_493_277_696
        );
        assert_eq!(traffic_bytes(Pass::ClipAndScale, numel[1], 2), 746_638_848);
        assert_eq!(traffic_bytes(Pass::AdamW, numel[1], 4), 3_484_314_624);
        assert_eq!(traffic_bytes(Pass::SgdMomentum, numel[2], 4), 40_000_000);
    }
}
