//! CPU fill of uniform and normal draws: each element depends only on its index, so parts of the
//! output are filled in parallel, eight draws at a time (vectorised under `simd_dispatch!`).

use super::RandomOps;
use super::{block, normal, uniform24, uniform53};
use crate::dtype::{DType, Element};
use crate::ops::cpu_dispatch::output;
use crate::ops::simd::{self, simd_dispatch};
use crate::storage::by_dtype;
use crate::threads::PARALLEL_THRESHOLD;
use crate::{CpuStorage, Device, Result};

/// Uniforms in `[low, high)` into `out` (element `i` is draw `offset + i` of `seed`'s stream).
pub fn uniform<T: Element>(out: &mut [T], low: f64, high: f64, seed: u64, offset: u64) {
    let isa = simd::isa();
    in_parts(out, offset, |part, first| {
        uniforms_into(isa, part, low, high, seed, first)
    });
}

/// Normals with `mean` and `std` into `out` (element `i` from draw `offset + i`).
pub fn normals<T: Element>(out: &mut [T], mean: f64, std: f64, seed: u64, offset: u64) {
    let isa = simd::isa();
    in_parts(out, offset, |part, first| {
        normals_into(isa, part, mean, std, seed, first)
    });
}

/// Draws per parallel task.
const CHUNK: usize = 4096;

/// Draws computed together: a vector of them per instruction where the build allows.
const LANES: usize = 8;

/// Runs `fill(part, counter of its first element)` over `out` in parts of [`CHUNK`] draws, in
/// parallel when `out` is large.
fn in_parts<T: Element>(out: &mut [T], offset: u64, fill: impl Fn(&mut [T], u64) + Sync) {
    let each = |c: usize, part: &mut [T]| fill(part, offset.wrapping_add((c * CHUNK) as u64));
    let parallel = out.len() > PARALLEL_THRESHOLD;
    crate::ops::par::chunks_mut_if(parallel, out, CHUNK, &each);
}

/// A distribution drawn from one Philox block: its value is always inlined, so a block of
/// [`LANES`] draws compiles to vector instructions (a closure here was not inlined, and ran
/// ten times slower).
trait Draw {
    fn value(&self, b: [u32; 4]) -> f64;
}

/// Uniforms in `[low, high)`: 24 bits of the block (53 when `wide`).
struct Uniform {
    low: f64,
    high: f64,
    wide: bool,
}

impl Draw for Uniform {
    #[inline(always)]
    fn value(&self, b: [u32; 4]) -> f64 {
        let u = if self.wide {
            uniform53(b[0], b[1])
        } else {
            uniform24(b[0])
        };
        self.low + (self.high - self.low) * u
    }
}

/// Normals with `mean` and `std`.
struct Normal {
    mean: f64,
    std: f64,
}

impl Draw for Normal {
    #[inline(always)]
    fn value(&self, b: [u32; 4]) -> f64 {
        self.mean + self.std * normal(b)
    }
}

/// `out[i] = draw.value(block first + i)`, [`LANES`] blocks at a time.
#[inline(always)]
fn by_lanes<T: Element, D: Draw>(out: &mut [T], seed: u64, first: u64, draw: &D) {
    for (c, chunk) in out.chunks_mut(LANES).enumerate() {
        let start = first.wrapping_add((c * LANES) as u64);
        let mut values = [0f64; LANES];
        for (j, v) in values.iter_mut().enumerate() {
            *v = draw.value(block(seed, start, j as u64));
        }
        for (o, v) in chunk.iter_mut().zip(values) {
            *o = T::from_f64(v);
        }
    }
}

simd_dispatch! {
    /// Uniforms `first + i` of `seed` into `out[i]`: 24 bits of the block (53 for `f64`).
    fn uniforms_into[T: Element](out: &mut [T], low: f64, high: f64, seed: u64, first: u64)
        => uniforms_body[T];
}

#[inline(always)]
fn uniforms_body<T: Element>(out: &mut [T], low: f64, high: f64, seed: u64, first: u64) {
    let wide = T::DTYPE == DType::F64;
    by_lanes(out, seed, first, &Uniform { low, high, wide });
}

simd_dispatch! {
    /// Normals `first + i` of `seed` into `out[i]` (the same bits on every instruction set:
    /// `normal_math.rs`).
    fn normals_into[T: Element](out: &mut [T], mean: f64, std: f64, seed: u64, first: u64)
        => normals_body[T];
}

#[inline(always)]
fn normals_body<T: Element>(out: &mut [T], mean: f64, std: f64, seed: u64, first: u64) {
    by_lanes(out, seed, first, &Normal { mean, std });
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
    /// draws), and every instruction set computes the same bits, for normals and uniforms.
    #[test]
    fn normals_are_libm_box_muller_in_f32_and_draws_equal_on_every_instruction_set() {
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
        let mut uniforms = vec![0f32; 1001];
        uniforms_into(None, &mut uniforms, -1.0, 3.0, 3, u64::MAX - 500);
        for each in simd::available() {
            let mut got = vec![0f64; 1001];
            normals_into(Some(each), &mut got, 0.5, 2.0, 3, u64::MAX - 500);
            assert_eq!(got, portable, "{each:?}");
            let mut got = vec![0f32; 1001];
            uniforms_into(Some(each), &mut got, -1.0, 3.0, 3, u64::MAX - 500);
            assert_eq!(got, uniforms, "{each:?} uniforms");
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
