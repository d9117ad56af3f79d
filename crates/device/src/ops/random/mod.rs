//! Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
//! as 1, 2, 3", SC 2011), the generator cuRAND and PyTorch's CUDA backend use.
//!
//! Element `i` of a draw takes counter `offset + i` and key `seed` and keeps nothing else, so any
//! device, any thread count and any split of the work give the same numbers: the CUDA kernel
//! computes the same function per thread. Uniforms take 24 bits (f32 and smaller) or 53 bits
//! (f64) of the block; normals use Box-Muller in f64 over two 53-bit uniforms.
//!
//! The seam trait is [`RandomOps`]. The scalar functions of this module ([`philox4x32_10`],
//! [`block`], [`uniform53`], [`uniform24`], [`normal`]) are public helpers for crates that draw
//! the same numbers on the host without a tensor (kiln-data's shuffles and augmentations).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod normal_math;

use crate::ops::buffer::BufferOps;
use crate::seam::seam_trait;
use crate::{DType, Result};

seam_trait! {
    /// Random buffers from Philox4x32-10 counters (the same numbers on every device).
    pub trait RandomOps: BufferOps {
        /// `n` uniform samples in `[low, high)` from Philox4x32-10 with `seed`, counters from
        /// `offset`.
        fn rand_uniform(
            device: Device,
            n: usize,
            low: f64,
            high: f64,
            seed: u64,
            offset: u64,
            dtype: DType,
        ) -> Result<Self>;
        /// `n` normal samples (Box-Muller over Philox4x32-10), counters from `offset`.
        fn rand_normal(
            device: Device,
            n: usize,
            mean: f64,
            std: f64,
            seed: u64,
            offset: u64,
            dtype: DType,
        ) -> Result<Self>;
    }
}

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// One Philox4x32-10 block for a 128-bit counter and 64-bit key.
#[inline(always)]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The block for element `index` of a draw with `seed` starting at counter `offset`.
#[inline(always)]
pub fn block(seed: u64, offset: u64, index: u64) -> [u32; 4] {
    let ctr = offset.wrapping_add(index);
    philox4x32_10(
        [ctr as u32, (ctr >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// A uniform in `[0, 1)` with 53 random bits from two words.
#[inline]
pub fn uniform53(hi: u32, lo: u32) -> f64 {
    (((hi as u64) << 21) ^ ((lo as u64) >> 11)) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A uniform in `[0, 1)` with 24 random bits.
#[inline]
pub fn uniform24(w: u32) -> f64 {
    (w >> 8) as f64 * (1.0 / (1u32 << 24) as f64)
}

/// A standard normal from one block (Box-Muller, cosine branch), with `ln` and `cos(2 pi u)`
/// of `normal_math.rs` (within a few units in the last place of libm's, and branch-free, so a
/// block of draws vectorises).
#[inline(always)]
pub fn normal(b: [u32; 4]) -> f64 {
    let u1 = 1.0 - uniform53(b[0], b[1]); // (0, 1]: log is finite
    let u2 = uniform53(b[2], b[3]);
    (-2.0 * normal_math::ln_unit(u1)).sqrt() * normal_math::cos_turns(u2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answer() {
        // Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32_10).
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
    }
}
