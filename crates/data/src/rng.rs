//! Counter-based random streams for data: Philox4x32-10 (the generator kiln's tensors use, from
//! `kiln_device::ops::random`) keyed by the seed, with the counter naming *what* the numbers are
//! for: `[draw, item lo, item hi, domain | sub]`.
//!
//! A stream for (seed, domain, sub, item) holds no state but its draw count, so sample `i` of a
//! seed renders, augments and shuffles the same way in any order, on any thread count, after any
//! resume. Domains keep the uses apart (synthetic rendering, augmentation, shuffling); `sub` is
//! the split or the epoch (its low 24 bits: epochs repeat their random streams after 16.7 million).

use kiln_device::ops::random::{philox4x32_10, uniform53};

/// What a stream is for (top 8 bits of counter word 3).
#[derive(Debug, Clone, Copy)]
#[repr(u32)]
pub(crate) enum Domain {
    Synthetic = 1,
    Augment = 2,
    Shuffle = 3,
}

/// A sequence of random draws for one item.
pub(crate) struct Stream {
    key: [u32; 2],
    item: u64,
    tag: u32,
    draw: u32,
    buf: [u32; 4],
    used: usize,
    spare_normal: Option<f64>,
}

impl Stream {
    pub(crate) fn new(seed: u64, domain: Domain, sub: u64, item: u64) -> Self {
        Stream {
            key: [seed as u32, (seed >> 32) as u32],
            item,
            tag: ((domain as u32) << 24) | (sub as u32 & 0x00FF_FFFF),
            draw: 0,
            buf: [0; 4],
            used: 4,
            spare_normal: None,
        }
    }

    /// The next Philox block (whole, 128 bits).
    pub(crate) fn block(&mut self) -> [u32; 4] {
        let b = philox4x32_10(
            [
                self.draw,
                self.item as u32,
                (self.item >> 32) as u32,
                self.tag,
            ],
            self.key,
        );
        self.draw = self.draw.wrapping_add(1);
        b
    }

    /// The next 32 random bits.
    pub(crate) fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            self.buf = self.block();
            self.used = 0;
        }
        self.used += 1;
        self.buf[self.used - 1]
    }

    /// A uniform in `[0, 1)` with 53 random bits.
    pub(crate) fn uniform(&mut self) -> f64 {
        let hi = self.next_u32();
        let lo = self.next_u32();
        uniform53(hi, lo)
    }

    /// A uniform in `[low, high)`.
    pub(crate) fn range(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.uniform()
    }

    /// An integer uniform in `0..n` (`n > 0`), by 64-bit multiply-shift (bias below 2^-32).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        let x = ((self.next_u32() as u64) << 32) | self.next_u32() as u64;
        ((x as u128 * n as u128) >> 64) as usize
    }

    /// A standard normal: Box-Muller on one whole block gives two (cosine and sine branch);
    /// the sine one is kept for the next call.
    pub(crate) fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare_normal.take() {
            return z;
        }
        let b = self.block();
        let u1 = 1.0 - uniform53(b[0], b[1]); // (0, 1]: log is finite
        let u2 = uniform53(b[2], b[3]);
        let r = (-2.0 * u1.ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
        self.spare_normal = Some(r * sin);
        r * cos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_depend_only_on_their_coordinates() {
        let a: Vec<u32> = {
            let mut s = Stream::new(7, Domain::Augment, 3, 11);
            (0..9).map(|_| s.next_u32()).collect()
        };
        // Interleaving another stream does not change this one.
        let mut s = Stream::new(7, Domain::Augment, 3, 11);
        let mut other = Stream::new(7, Domain::Augment, 3, 12);
        let b: Vec<u32> = (0..9)
            .map(|_| {
                other.next_u32();
                s.next_u32()
            })
            .collect();
        assert_eq!(a, b);
        // Each coordinate changes the numbers.
        for mut t in [
            Stream::new(8, Domain::Augment, 3, 11),
            Stream::new(7, Domain::Shuffle, 3, 11),
            Stream::new(7, Domain::Augment, 4, 11),
            Stream::new(7, Domain::Augment, 3, 10),
        ] {
            assert_ne!(t.next_u32(), a[0]);
        }
    }

    #[test]
    fn normals_have_unit_moments() {
        let mut s = Stream::new(3, Domain::Synthetic, 0, 9);
        let z: Vec<f64> = (0..20_000).map(|_| s.normal()).collect();
        let mean = z.iter().sum::<f64>() / z.len() as f64;
        let var = z.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / z.len() as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "var {var}");
        // Consecutive pairs are not the same number.
        assert_ne!(z[0], z[1]);
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut s = Stream::new(1, Domain::Shuffle, 0, 0);
        let mut seen = [0usize; 5];
        for _ in 0..1000 {
            seen[s.below(5)] += 1;
        }
        assert!(seen.iter().all(|&c| c > 150), "{seen:?}");
    }
}
