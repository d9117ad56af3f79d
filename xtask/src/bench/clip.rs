//! The `clip` benchmark group (issue 5): fused global-norm gradient clipping over three gradient
//! sets (ResNet18's 62 tensors, a GPT-2-small-like 148 tensors, 2,000 tensors of 1,000), when
//! clipping and when not, against (a) a per-tensor loop over the tensor API in the same run and
//! (b) the memory bandwidth measured in the same run (a parallel read pass and a copy pass).
//! With `--vs-torch`, clipping the ResNet-18 set and the 2,000-tensor set also gets rows
//! against PyTorch's `clip_grad_norm_` on the same tensors, measured in the same run
//! (`torch.rs`).
//!
//! Bandwidth limits: not clipping reads every gradient once; clipping reads twice (norm pass,
//! scale pass) and writes once. The limit time is `reads / read_bw + (read + write) / copy_bw`
//! for the scale part, and `ratio = limit / measured` (1.0 = at the bandwidth limit).

use super::harness::{bandwidth_rows, host_array, median_secs, Options, Row};
use super::torch::{Figure, Pairs};
use kiln_autograd::{no_grad, DType, Device, Parameter, Tensor};
use kiln_device::threads::cpu_pool;
use rayon::prelude::*;
use std::hint::black_box;
use std::time::Instant;

const GROUP: &str = "clip";
/// max_norm as a fraction of the current total norm in the clipping cases.
pub(super) const SHRINK: f64 = 0.99;

/// A gradient set: name and tensor lengths.
pub(super) struct GradSet {
    pub name: &'static str,
    pub lens: Vec<usize>,
}

impl GradSet {
    pub fn numel(&self) -> usize {
        self.lens.iter().sum()
    }
}

fn resnet18() -> Vec<usize> {
    let mut v = vec![64 * 3 * 7 * 7, 64, 64];
    let mut c_in = 64;
    for (layer, c) in [64usize, 128, 256, 512].into_iter().enumerate() {
        for block in 0..2 {
            let inc = if block == 0 { c_in } else { c };
            v.extend([c * inc * 9, c, c, c * c * 9, c, c]);
            if block == 0 && layer > 0 {
                v.extend([c * c_in, c, c]);
            }
        }
        c_in = c;
    }
    v.extend([1000 * 512, 1000]);
    v
}

fn gpt2_small() -> Vec<usize> {
    let d = 768;
    let mut v = vec![50_257 * d, 1024 * d];
    for _ in 0..12 {
        v.extend([
            d,
            d,
            d * 3 * d,
            3 * d,
            d * d,
            d,
            d,
            d,
            d * 4 * d,
            4 * d,
            4 * d * d,
            d,
        ]);
    }
    v.extend([d, d]);
    v
}

/// The three gradient sets of issue 5.
pub(super) fn grad_sets() -> Vec<GradSet> {
    vec![
        GradSet {
            name: "resnet18 (62 tensors)",
            lens: resnet18(),
        },
        GradSet {
            name: "gpt2-small (148 tensors)",
            lens: gpt2_small(),
        },
        GradSet {
            name: "2000 x 1000",
            lens: vec![1000; 2000],
        },
    ]
}

/// Parameters of the set's lengths with f32 gradients of deterministic values.
pub(super) fn params_with_grads(set: &GradSet) -> Result<Vec<(String, Parameter)>, String> {
    let err = |e: kiln_autograd::Error| e.to_string();
    set.lens
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let p = Parameter::new(Tensor::full(&[n], 0.01, DType::F32, Device::Cpu).map_err(err)?)
                .map_err(err)?;
            let g: Vec<f32> = (0..n)
                .map(|k| ((k * 7 + i) % 1013) as f32 * 1e-3 - 0.5)
                .collect();
            p.set_grad(Some(Tensor::from_vec(g, &[n], Device::Cpu).map_err(err)?))
                .map_err(err)?;
            Ok((format!("t{i}"), p))
        })
        .collect()
}

/// Sum with 16 independent accumulators, so the read pass is limited by memory, not by a
/// chain of dependent float adds.
fn lane_sum(c: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut blocks = c.chunks_exact(16);
    for b in &mut blocks {
        for i in 0..16 {
            acc[i] += b[i];
        }
    }
    acc.iter().sum::<f32>() + blocks.remainder().iter().sum::<f32>()
}

/// Measured bandwidth in bytes/s, over the allocator's memory ([`host_array`]): (read pass, copy
/// pass counting read + write bytes).
pub(super) fn bandwidth(options: &Options) -> Result<(f64, f64), String> {
    let n = if options.quick { 16 << 20 } else { 64 << 20 };
    let src = host_array(n, |i| (i % 251) as f32)?;
    let mut dst = host_array(n, |_| 0.0)?;
    let bytes = (n * 4) as f64;
    let reps = if options.quick { 2 } else { 5 };
    let (mut read_bw, mut copy_bw) = (0f64, 0f64);
    cpu_pool().install(|| {
        for _ in 0..reps {
            let t = Instant::now();
            let s: f32 = src.par_chunks(1 << 16).map(lane_sum).sum();
            black_box(s);
            read_bw = read_bw.max(bytes / t.elapsed().as_secs_f64());
            let t = Instant::now();
            dst.par_chunks_mut(1 << 16)
                .zip(src.par_chunks(1 << 16))
                .for_each(|(d, s)| d.copy_from_slice(s));
            black_box(&dst);
            copy_bw = copy_bw.max(2.0 * bytes / t.elapsed().as_secs_f64());
        }
    });
    Ok((read_bw, copy_bw))
}

/// The per-tensor loop baseline: one norm op per tensor, then one in-place multiply per tensor.
fn per_tensor_clip(params: &[(String, Parameter)], max_norm: f64) -> Result<f64, String> {
    let err = |e: kiln_autograd::Error| e.to_string();
    no_grad(|| {
        let mut sq = 0.0;
        for (_, p) in params {
            let g = p.grad().ok_or("no grad")?;
            let n = g.norm(2.0, &[], false).map_err(err)?.item().map_err(err)?;
            sq += n * n;
        }
        let total = f64::sqrt(sq);
        let coef = (max_norm / (total + 1e-6)).min(1.0);
        if coef < 1.0 {
            for (_, p) in params {
                p.grad().ok_or("no grad")?.mul_scalar_(coef).map_err(err)?;
            }
        }
        Ok(total)
    })
}

/// The CPU cases of the group (`mod.rs` adds the CUDA ones of `clip_gpu.rs`).
pub(super) fn cpu_cases(options: &Options) -> Result<Vec<Row>, String> {
    let (read_bw, copy_bw) = bandwidth(options)?;
    let mut rows = Vec::from(bandwidth_rows(GROUP, read_bw, copy_bw));
    let reps = if options.quick { 1 } else { 5 };
    let e = |e: kiln_optim::Error| e.to_string();
    let mut pairs = Pairs::new(GROUP, options);
    for set in grad_sets() {
        let params = params_with_grads(&set)?;
        let bytes = (set.numel() * 4) as f64;
        let total0 = kiln_optim::clip_grad_norm_(&params, f64::INFINITY, 2.0, false).map_err(e)?;

        // Not clipping: one read pass.
        let t = median_secs(reps, || {
            kiln_optim::clip_grad_norm_(&params, f64::INFINITY, 2.0, false)
                .map(drop)
                .map_err(e)
        })?;
        let t_loop = median_secs(reps, || per_tensor_clip(&params, f64::INFINITY).map(drop))?;
        let limit = bytes / read_bw;
        rows.push(Row::new(
            GROUP,
            format!("{}: no clip, fused", set.name),
            "ms",
            t * 1e3,
            "bandwidth limit (1 read)",
            limit / t,
        ));
        rows.push(Row::new(
            GROUP,
            format!("{}: no clip, fused vs per-tensor loop", set.name),
            "ms (loop)",
            t_loop * 1e3,
            "per-tensor loop, same run",
            t_loop / t,
        ));

        // Clipping: each run shrinks the norm by 1% (max_norm = 0.99 x the current total), so
        // every run really scales, and values stay far from subnormal over the up to 1,000
        // runs of the timings and the PyTorch rounds (0.99^1000 is about 4e-5).
        // The current total is shared by the fused clip (also run again by the PyTorch pairs)
        // and the loop, which scale the same gradients.
        let total = std::cell::Cell::new(total0);
        let mut clip = || {
            let max_norm = total.get() * SHRINK;
            let got = kiln_optim::clip_grad_norm_(&params, max_norm, 2.0, false).map_err(e)?;
            total.set(got * SHRINK);
            Ok(())
        };
        let t = median_secs(reps, &mut clip)?;
        let t_loop = median_secs(reps, || {
            let got = per_tensor_clip(&params, total.get() * SHRINK)?;
            total.set(got * SHRINK);
            Ok(())
        })?;
        let limit = bytes / read_bw + 2.0 * bytes / copy_bw;
        rows.push(Row::new(
            GROUP,
            format!("{}: clip, fused", set.name),
            "ms",
            t * 1e3,
            "bandwidth limit (2 reads + 1 write)",
            limit / t,
        ));
        rows.push(Row::new(
            GROUP,
            format!("{}: clip, fused vs per-tensor loop", set.name),
            "ms (loop)",
            t_loop * 1e3,
            "per-tensor loop, same run",
            t_loop / t,
        ));
        let id = match set.name {
            n if n.starts_with("resnet18") => Some("clip_resnet18"),
            n if n.starts_with("2000") => Some("clip_2000x1000"),
            _ => None,
        };
        if let Some(id) = id {
            let case = format!("{}: clip, fused", set.name);
            pairs.add(&case, id, Figure::Millis, t * 1e3, || {
                Ok(median_secs(reps, &mut clip)? * 1e3)
            })?;
        }
    }
    rows.extend(pairs.into_rows());
    Ok(rows)
}
