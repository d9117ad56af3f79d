//! CPU softmax over rows of the last dim, rows split across the pool.

use super::SoftmaxOps;
use crate::layout::Layout;
use crate::ops::cpu_dispatch::float_op;
use crate::ops::strided::copy_contiguous_into;
use crate::ops::KernelFloat;
use crate::threads::PARALLEL_THRESHOLD;
use crate::{CpuStorage, Result};
use rayon::prelude::*;

/// Softmax (`log = false`) or log-softmax over the last dim of `layout`, written contiguously
/// into `out` (`layout.numel()` elements).
pub fn softmax_last_dim<F: KernelFloat>(src: &[F], layout: &Layout, log: bool, out: &mut [F]) {
    let d = layout.shape().last().copied().unwrap_or(1);
    copy_contiguous_into(src, layout, out);
    if d == 0 {
        return;
    }
    let row = |r: &mut [F]| {
        let mut max = r[0];
        for &v in r.iter() {
            if v > max || v.is_nan() {
                max = v;
            }
        }
        let mut sum = 0.0f64;
        for &v in r.iter() {
            sum += (v - max).exp().to_f64();
        }
        if log {
            let lse = F::c(sum.ln());
            r.iter_mut().for_each(|v| *v = *v - max - lse);
        } else {
            let inv = F::c(1.0 / sum);
            r.iter_mut().for_each(|v| *v = (*v - max).exp() * inv);
        }
    };
    if out.len() > PARALLEL_THRESHOLD {
        crate::threads::install(|| out.par_chunks_mut(d).for_each(row));
    } else {
        out.chunks_mut(d).for_each(row);
    }
}

impl SoftmaxOps for CpuStorage {
    fn softmax_last_dim(&self, layout: &Layout, log: bool) -> Result<Self> {
        float_op!(self, layout, "softmax", |s, l, out| {
            softmax_last_dim(s, l, log, out)
        })
    }
}
