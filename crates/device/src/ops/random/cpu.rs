//! CPU fill of uniform and normal draws (parallel: each element depends only on its index).

use super::RandomOps;
use super::{block, normal, uniform24, uniform53};
use crate::dtype::{DType, Element};
use crate::ops::cpu_dispatch::output;
use crate::ops::simd::{self, simd_dispatch};
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

/// Normals with `mean` and `std` into `out` (element `i` from draw `offset + i`): in parallel
/// blocks of [`NORMAL_CHUNK`] draws, each through [`normals_into`].
pub fn normals<T: Element>(out: &mut [T], mean: f64, std: f64, seed: u64, offset: u64) {
    let isa = simd::isa();
    let part = |(c, part): (usize, &mut [T])| {
        let first = offset.wrapping_add((c * NORMAL_CHUNK) as u64);
        normals_into(isa, part, mean, std, seed, first);
    };
    if out.len() > PARALLEL_THRESHOLD {
        crate::threads::install(|| out.par_chunks_mut(NORMAL_CHUNK).enumerate().for_each(part));
    } else {
        out.chunks_mut(NORMAL_CHUNK).enumerate().for_each(part);
    }
}

/// Draws per parallel task of [`normals`].
const NORMAL_CHUNK: usize = 4096;

/// Draws computed together: a vector of them per instruction where the build allows.
const LANES: usize = 8;

simd_dispatch! {
    /// Normals `first + i` of `seed` into `out[i]`, [`LANES`] draws at a time (the same bits
    /// on every instruction set: `normal_math.rs`).
    fn normals_into[T: Element](out: &mut [T], mean: f64, std: f64, seed: u64, first: u64)
        => normals_body[T];
}

#[inline(always)]
fn normals_body<T: Element>(out: &mut [T], mean: f64, std: f64, seed: u64, first: u64) {
    for (c, chunk) in out.chunks_mut(LANES).enumerate() {
        let start = first.wrapping_add((c * LANES) as u64);
        let mut z = [0f64; LANES];
        for (j, z) in z.iter_mut().enumerate() {
            *z = normal(block(seed, start, j as u64));
        }
        for (o, z) in chunk.iter_mut().zip(z) {
            *o = T::from_f64(mean + std * z);
        }
    }
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
    use crate::ops::random::uniform53;

    /// The vectorised normals are libm's Box-Muller values once rounded to `f32` (a million
    /// draws), and every instruction set computes the same bits.
    #[test]
    fn normals_are_libm_box_muller_in_f32_and_equal_on_every_instruction_set() {
        let n = 1 << 20;
        let mut v = vec![0f32; n];
        normals(&mut v, 0.0, 1.0, 11, 5);
        for (i, &x) in v.iter().enumerate() {
            let b = block(11, 5, i as u64);
            let (u1, u2) = (1.0 - uniform53(b[0], b[1]), uniform53(b[2], b[3]));
            let libm = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            assert_eq!(x, libm as f32, "draw {i}");
        }
        let mut portable = vec![0f64; 1001];
        normals_into(None, &mut portable, 0.5, 2.0, 3, u64::MAX - 500);
        for each in simd::available() {
            let mut got = vec![0f64; 1001];
            normals_into(Some(each), &mut got, 0.5, 2.0, 3, u64::MAX - 500);
            assert_eq!(got, portable, "{each:?}");
        }
    }

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
