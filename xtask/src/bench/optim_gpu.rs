//! The `--gpu` cases of `cargo xtask bench optim` (issues 5 and 10): one fused optimizer step
//! (one launch per parameter group) over the `clip` group's three gradient sets as f32
//! parameters with f32 gradients on cuda:0, for AdamW (lr 1e-4, weight decay 0.01) and SGD with
//! momentum 0.9, each against the bandwidth limit measured in the same run.
//!
//! The limit is `traffic / copy_bw` with `copy_bw` the device's `cuMemcpyDtoD` bandwidth (read +
//! write bytes per second) and the traffic from [`super::clip_gpu::traffic_bytes`]: AdamW reads
//! param, grad, exp_avg and exp_avg_sq and writes param, exp_avg and exp_avg_sq (`7·N·4` bytes
//! over `N` f32 elements); SGD with momentum, past its first step, reads param, grad and the
//! momentum buffer and writes param and buffer (`5·N·4`). The ratio is `limit / measured` (1.0 =
//! at the limit). The time includes what a step costs on the host (building and uploading the
//! step's table of buffer addresses), as a training loop pays it. Timing as in `clip_gpu`:
//! warm-up steps (which also create the optimizer state), then rounds of steps between two
//! synchronisations. A failing case prints why and adds a [`Row::failed`] row; the others still
//! run. With `--vs-torch`, each AdamW step also against PyTorch's `AdamW(fused=True)` on the same
//! device and sets, timed the same way (rows `... vs PyTorch`, `torch.rs`).

use super::clip::{grad_sets, GradSet};
use super::clip_gpu::{
    device_bandwidth, device_params, per_call, torch_set_name, traffic_bytes, Pass,
};
use super::harness::{gpu_cases, Options, Row};
use super::torch::{Figure, Pairs};
use kiln_autograd::{DType, Device};
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup, Sgd, SgdOptions};

const GROUP: &str = "optim";

/// Runs the `--gpu` cases into `rows`, or prints why they are skipped. An error that stops
/// them (no bandwidth figure) becomes a [`Row::failed`] row, so the rows of every group are
/// still written.
pub fn run(options: &Options, rows: &mut Vec<Row>) {
    gpu_cases(GROUP, options, rows, run_cases);
}

fn run_cases(options: &Options, rows: &mut Vec<Row>) -> Result<(), String> {
    let Some(copy_bw) = device_bandwidth(GROUP, options, rows)? else {
        return Ok(());
    };
    let copy_gbs = copy_bw / 1e9;
    let dev = Device::Cuda(0);
    let mut pairs = Pairs::new(GROUP, options);
    for set in grad_sets() {
        let numel = set.numel() as u64;
        for pass in [Pass::AdamW, Pass::SgdMomentum] {
            let (name, limit_name) = match pass {
                Pass::AdamW => ("AdamW", "4 reads + 3 writes"),
                _ => ("SGD momentum", "3 reads + 2 writes"),
            };
            let case = format!("gpu {}: {name} step, fused", set.name);
            let timed = optimizer(&set, pass, dev).and_then(|mut opt| {
                let t = step_time(opt.as_mut(), dev, options)?;
                Ok((opt, t))
            });
            match timed {
                Ok((mut opt, t)) => {
                    let limit = traffic_bytes(pass, numel, 4) as f64 / copy_bw;
                    rows.push(Row::new(
                        GROUP,
                        case.clone(),
                        "ms",
                        t * 1e3,
                        format!("bandwidth limit ({limit_name}) at device copy {copy_gbs:.0} GB/s"),
                        limit / t,
                    ));
                    if let (Pass::AdamW, Some(name)) = (pass, torch_set_name(&set)) {
                        pairs.add(
                            &case,
                            &format!("gpu_adamw_{name}"),
                            Figure::Millis,
                            t * 1e3,
                            || step_time(opt.as_mut(), dev, options).map(|t| t * 1e3),
                        )?;
                    }
                }
                Err(err) => {
                    eprintln!("bench optim: {case} failed: {err}");
                    rows.push(Row::failed(GROUP, case, &err));
                }
            }
        }
    }
    rows.extend(pairs.into_rows());
    Ok(())
}

/// The fused optimizer of `pass` (AdamW or SGD momentum) over `set` as f32 parameters and
/// gradients on `device` (cuda:0 in the benchmark; the unit test runs it on the CPU).
fn optimizer(set: &GradSet, pass: Pass, device: Device) -> Result<Box<dyn Optimizer>, String> {
    let e = |e: kiln_optim::Error| e.to_string();
    let group = vec![ParamGroup::new(device_params(set, DType::F32, device)?)];
    Ok(match pass {
        Pass::AdamW => Box::new(
            AdamW::new(group, AdamOptions::adamw().lr(1e-4).weight_decay(0.01)).map_err(e)?,
        ),
        _ => Box::new(Sgd::new(group, SgdOptions::default().lr(1e-4).momentum(0.9)).map_err(e)?),
    })
}

/// Seconds per step of `opt` on `device`.
fn step_time(opt: &mut dyn Optimizer, device: Device, options: &Options) -> Result<f64, String> {
    per_call(device, options, || {
        opt.step().map_err(|e: kiln_optim::Error| e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_steps_run_and_time_on_the_cpu() {
        let set = GradSet {
            name: "tiny",
            lens: vec![3, 1000],
        };
        let options = Options {
            quick: true,
            ..Options::default()
        };
        for pass in [Pass::AdamW, Pass::SgdMomentum] {
            let mut opt = optimizer(&set, pass, Device::Cpu).unwrap();
            let t = step_time(opt.as_mut(), Device::Cpu, &options).unwrap();
            assert!(t > 0.0 && t < 1.0, "{pass:?}: {t} s");
        }
    }
}
