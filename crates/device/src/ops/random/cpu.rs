//! CPU fill of uniform and normal draws (parallel: each element depends only on its index).

use super::RandomOps;
use super::{block, normal, uniform24, uniform53};
use crate::dtype::{DType, Element};
use crate::ops::cpu_dispatch::output;
use crate::storage::by_dtype;
use crate::threads::PARALLEL_THRESHOLD;
use crate::{CpuStorage, Device, Result};
use rayon::prelude::*;

fn fill<T: Element>(out: &mut [T], f: impl Fn(u64) -> f64 + Sync) {
    let n = out.len();
    let body = |(i, o): (usize, &mut T)| *o = T::from_f64(f(i as u64));
    if n > PARALLEL_THRESHOLD {
        crate::threads::install(|| out.par_iter_mut().enumerate().for_each(body));
    } else {
        out.iter_mut().enumerate().for_each(body);
    }
}

/// Uniforms in `[low, high)` into `out` (element `i` is draw `offset + i` of `seed`'s stream).
pub fn uniform<T: Element>(out: &mut [T], low: f64, high: f64, seed: u64, offset: u64) {
    let wide = T::DTYPE == DType::F64;
    fill(out, |i| {
        let b = block(seed, offset, i);
        let u = if wide {
            uniform53(b[0], b[1])
        } else {
            uniform24(b[0])
        };
        low + (high - low) * u
    })
}

/// Normals with `mean` and `std` into `out` (element `i` from draw `offset + i`).
pub fn normals<T: Element>(out: &mut [T], mean: f64, std: f64, seed: u64, offset: u64) {
    fill(out, |i| mean + std * normal(block(seed, offset, i)))
}

impl RandomOps for CpuStorage {
    fn rand_uniform(
        _device: Device,
        n: usize,
        low: f64,
        high: f64,
        seed: u64,
        offset: u64,
        dtype: DType,
    ) -> Result<Self> {
        by_dtype!(dtype, E => output::<E>(n, |out| uniform(out, low, high, seed, offset)))
    }

    fn rand_normal(
        _device: Device,
        n: usize,
        mean: f64,
        std: f64,
        seed: u64,
        offset: u64,
        dtype: DType,
    ) -> Result<Self> {
        by_dtype!(dtype, E => output::<E>(n, |out| normals(out, mean, std, seed, offset)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parallel_fill_gives_element_i_draw_offset_plus_i() {
        let (n, seed, offset) = (40_000usize, 17, 1_000);
        assert!(n > PARALLEL_THRESHOLD, "the fill must run in parallel");
        let (mut u, mut g) = (vec![0f32; n], vec![0f64; n]);
        uniform(&mut u, -1.0, 3.0, seed, offset);
        normals(&mut g, 0.5, 2.0, seed, offset);
        for i in (0..n).step_by(997).chain([1, n / 2 + 1, n - 1]) {
            let (mut one_u, mut one_g) = ([0f32], [0f64]);
            uniform(&mut one_u, -1.0, 3.0, seed, offset + i as u64);
            normals(&mut one_g, 0.5, 2.0, seed, offset + i as u64);
            assert_eq!(u[i], one_u[0], "uniform draw {i}");
            assert_eq!(g[i], one_g[0], "normal draw {i}");
        }
    }
}
