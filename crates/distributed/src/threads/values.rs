//! The data a threads-backend collective moves: each rank's contribution, the rank-order
//! reduction and the write of a result into the caller's tensor.
//!
//! Invariants: F32 tensors travel as `f32` and every other dtype as `f64`, both exact; a
//! reduction visits ranks in order `0..n` in f32 arithmetic for F32, F16 and BF16 and in f64
//! otherwise, and the result is rounded once to the tensor's dtype.

use crate::ReduceOp;
use kiln_autograd::{no_grad, DType, Device, Tensor};
use std::sync::Arc;

/// A rank's contribution or a result: F32 tensors travel as `f32` (exact, half the bytes), every
/// other dtype as `f64` (exact for F64, F16, BF16 and integers below 2^53).
#[derive(Clone)]
pub(super) enum Values {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Values {
    pub(super) fn of(t: &Tensor) -> kiln_autograd::Result<Values> {
        Ok(if t.dtype() == DType::F32 {
            Values::F32(t.to_vec::<f32>()?)
        } else {
            Values::F64(t.to_vec_f64()?)
        })
    }

    fn f64_at(&self, i: usize) -> f64 {
        match self {
            Values::F32(v) => f64::from(v[i]),
            Values::F64(v) => v[i],
        }
    }

    fn f32_at(&self, i: usize) -> f32 {
        match self {
            Values::F32(v) => v[i],
            Values::F64(v) => v[i] as f32,
        }
    }

    /// Every input one after another (all-gather).
    pub(super) fn concat(inputs: &[Arc<Values>]) -> Values {
        if inputs.iter().all(|v| matches!(**v, Values::F32(_))) {
            Values::F32(
                inputs
                    .iter()
                    .flat_map(|v| match &**v {
                        Values::F32(v) => v.clone(),
                        Values::F64(_) => Vec::new(),
                    })
                    .collect(),
            )
        } else {
            Values::F64(
                inputs
                    .iter()
                    .flat_map(|v| match &**v {
                        Values::F32(v) => v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(),
                        Values::F64(v) => v.clone(),
                    })
                    .collect(),
            )
        }
    }
}

/// Elements `start..start + len` reduced over ranks in rank order.
pub(super) fn reduce_ranks(
    inputs: &[Arc<Values>],
    start: usize,
    len: usize,
    dtype: DType,
    op: ReduceOp,
    world_size: usize,
) -> Values {
    let combine = |acc: f64, x: f64| {
        if op == ReduceOp::Max {
            acc.max(x)
        } else {
            acc + x
        }
    };
    if matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        let combine = |acc: f32, x: f32| {
            if op == ReduceOp::Max {
                acc.max(x)
            } else {
                acc + x
            }
        };
        let out = (start..start + len).map(|i| {
            let mut acc = inputs[0].f32_at(i);
            for input in &inputs[1..] {
                acc = combine(acc, input.f32_at(i));
            }
            if op == ReduceOp::Avg {
                acc /= world_size as f32;
            }
            acc
        });
        if dtype == DType::F32 {
            Values::F32(out.collect())
        } else {
            Values::F64(out.map(f64::from).collect())
        }
    } else {
        Values::F64(
            (start..start + len)
                .map(|i| {
                    let mut acc = inputs[0].f64_at(i);
                    for input in &inputs[1..] {
                        acc = combine(acc, input.f64_at(i));
                    }
                    if op == ReduceOp::Avg {
                        acc /= world_size as f64;
                    }
                    acc
                })
                .collect(),
        )
    }
}

/// Writes `values` into `t` in place (rounded once to its dtype), on its device.
pub(super) fn write(t: &Tensor, values: Values) -> kiln_autograd::Result<()> {
    let host = match values {
        Values::F32(v) => Tensor::from_vec(v, t.shape(), Device::Cpu)?,
        Values::F64(v) => Tensor::from_vec(v, t.shape(), Device::Cpu)?,
    }
    .to_dtype(t.dtype())?;
    let src = host.to_device(t.device())?;
    no_grad(|| t.copy_(&src))
}
