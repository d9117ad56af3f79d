//! Per-sample transforms, in torchvision's order: augmentation on the `u8` image
//! (`RandomCrop(size, padding)`, `RandomHorizontalFlip`), then `ToTensor` (bytes / 255) and
//! `Normalize(mean, std)` per channel.
//!
//! Augmentation is random but reproducible: the draws for sample `index` in epoch `epoch` come
//! from the Philox stream at `(seed, augment, epoch, index)`, so a resumed run, a prefetching
//! loader and a single-threaded one all augment each sample the same way.

use crate::error::{arg_err, Result};
use crate::rng::{Domain, Stream};

/// `(x / 255 - mean[c]) / std[c]` per channel, as torchvision's `ToTensor` + `Normalize`.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    mean: Vec<f32>,
    std: Vec<f32>,
}

impl Normalize {
    /// Per-channel `mean` and `std` (of pixels scaled to `[0, 1]`); one entry per channel, every
    /// `std` finite and positive.
    pub fn new(mean: &[f64], std: &[f64]) -> Result<Self> {
        if mean.len() != std.len() || mean.is_empty() {
            return Err(arg_err(
                "Normalize::new",
                format!(
                    "{} means and {} stds; pass one of each per channel",
                    mean.len(),
                    std.len()
                ),
            ));
        }
        if let Some(s) = std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(arg_err(
                "Normalize::new",
                format!("std {s} would divide by zero or give NaN; every std must be > 0"),
            ));
        }
        if let Some(m) = mean.iter().find(|m| !m.is_finite()) {
            return Err(arg_err("Normalize::new", format!("mean {m} is not finite")));
        }
        // Stored as f32: a std below f32's normal range reads as 0 (or a subnormal whose
        // reciprocal is infinite), a mean beyond f32's range as infinity.
        if let Some(s) = std.iter().find(|&&s| {
            let s32 = s as f32;
            !(s32.is_normal() && (1.0 / s32).is_finite())
        }) {
            return Err(arg_err(
                "Normalize::new",
                format!(
                    "std {s} is too small for f32 pixels (it would store 0 or an infinite \
                     scale); every std must be at least {:e}; for a constant channel pass std 1",
                    f32::MIN_POSITIVE
                ),
            ));
        }
        if let Some(m) = mean.iter().find(|&&m| !(m as f32).is_finite()) {
            return Err(arg_err(
                "Normalize::new",
                format!("mean {m} does not fit in f32; pixel means lie in [0, 1]"),
            ));
        }
        Ok(Normalize {
            mean: mean.iter().map(|&m| m as f32).collect(),
            std: std.iter().map(|&s| s as f32).collect(),
        })
    }

    /// CIFAR-10's training-set statistics (mean 0.4914, 0.4822, 0.4465; std 0.2470, 0.2435,
    /// 0.2616).
    pub fn cifar10() -> Self {
        Normalize {
            mean: vec![0.4914, 0.4822, 0.4465],
            std: vec![0.2470, 0.2435, 0.2616],
        }
    }

    /// ImageNet's training-set statistics (mean 0.485, 0.456, 0.406; std 0.229, 0.224, 0.225):
    /// the inputs torchvision's pretrained weights were trained on (their `weights.transforms()`
    /// normalises with these).
    pub fn imagenet() -> Self {
        Normalize {
            mean: vec![0.485, 0.456, 0.406],
            std: vec![0.229, 0.224, 0.225],
        }
    }

    /// MNIST's training-set statistics (mean 0.1307, std 0.3081), as in PyTorch's MNIST example.
    pub fn mnist() -> Self {
        Normalize {
            mean: vec![0.1307],
            std: vec![0.3081],
        }
    }

    /// The per-channel means.
    pub fn mean(&self) -> &[f32] {
        &self.mean
    }

    /// The per-channel standard deviations.
    pub fn std(&self) -> &[f32] {
        &self.std
    }

    /// Channels this normalisation is for.
    pub fn channels(&self) -> usize {
        self.mean.len()
    }
}

/// Appends CHW `pixels` (`channels` planes) to `out` as `f32`: `x / 255`, normalised when
/// `normalize` is given (its channel count must match; callers check).
pub(crate) fn push_f32(
    pixels: &[u8],
    channels: usize,
    normalize: Option<&Normalize>,
    out: &mut Vec<f32>,
) {
    let plane = pixels.len() / channels;
    for (c, p) in pixels.chunks_exact(plane).enumerate() {
        match normalize {
            Some(n) => {
                let (m, s) = (n.mean[c], n.std[c]);
                out.extend(p.iter().map(|&v| (v as f32 / 255.0 - m) / s));
            }
            None => out.extend(p.iter().map(|&v| v as f32 / 255.0)),
        }
    }
}

/// Random augmentation: `RandomCrop(H x W, padding)` with zero padding, then a horizontal flip
/// with probability `flip_prob`. The default does nothing.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Augment {
    /// Zero padding on each side before cropping back to the original size (0: no crop; the
    /// CIFAR recipe uses 4).
    pub crop_padding: usize,
    /// Probability of a horizontal flip (0: never; the CIFAR recipe uses 0.5).
    pub flip_prob: f64,
}

impl Augment {
    /// The standard CIFAR-10 recipe: crop with padding 4, flip with probability 0.5.
    pub fn cifar() -> Self {
        Augment {
            crop_padding: 4,
            flip_prob: 0.5,
        }
    }

    /// Whether this changes anything.
    pub fn is_identity(&self) -> bool {
        self.crop_padding == 0 && self.flip_prob <= 0.0
    }

    /// The largest `crop_padding` accepted: far beyond any image side, and small enough that
    /// the crop offsets (`0..=2 * padding` plus a side) never overflow.
    pub const MAX_CROP_PADDING: usize = 1 << 20;

    pub(crate) fn validate(&self) -> Result<()> {
        if self.crop_padding > Self::MAX_CROP_PADDING {
            return Err(arg_err(
                "Augment",
                format!(
                    "crop_padding {} is beyond the {} pixels kiln accepts; pad by a few pixels \
                     (the CIFAR recipe uses 4)",
                    self.crop_padding,
                    Self::MAX_CROP_PADDING
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.flip_prob) {
            return Err(arg_err(
                "Augment",
                format!(
                    "flip_prob {:?} is not a probability; pass a value in [0, 1]",
                    self.flip_prob
                ),
            ));
        }
        Ok(())
    }

    /// Augments CHW `src` of `shape` into `dst` (same size) for sample `index` of `epoch`.
    pub fn apply(
        &self,
        src: &[u8],
        shape: [usize; 3],
        seed: u64,
        epoch: u64,
        index: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        self.validate()?;
        let [c, h, w] = shape;
        let n = crate::memory::image_len("Augment::apply", shape)?;
        if src.len() != n || dst.len() != n {
            return Err(arg_err(
                "Augment::apply",
                format!(
                    "src has {} bytes and dst {} for a {c}x{h}x{w} image; pass two buffers of \
                     {n} bytes",
                    src.len(),
                    dst.len()
                ),
            ));
        }
        let mut s = Stream::new(seed, Domain::Augment, epoch, index as u64);
        let p = self.crop_padding;
        // Offsets into the padded image: 0..=2p each; `p` means no shift.
        let (top, left) = if p > 0 {
            (s.below(2 * p + 1), s.below(2 * p + 1))
        } else {
            (p, p)
        };
        let flip = self.flip_prob > 0.0 && s.uniform() < self.flip_prob;
        for ch in 0..c {
            for y in 0..h {
                let sy = (y + top).checked_sub(p).filter(|&v| v < h);
                for x in 0..w {
                    let xo = if flip { w - 1 - x } else { x };
                    let sx = (xo + left).checked_sub(p).filter(|&v| v < w);
                    dst[(ch * h + y) * w + x] = match (sy, sx) {
                        (Some(sy), Some(sx)) => src[(ch * h + sy) * w + sx],
                        _ => 0,
                    };
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_matches_the_formula() {
        let n = Normalize::new(&[0.5, 0.25], &[0.5, 0.125]).unwrap();
        let mut out = Vec::new();
        push_f32(&[0, 255, 51, 102], 2, Some(&n), &mut out);
        let want = [-1.0, 1.0, (0.2 - 0.25) / 0.125, (0.4 - 0.25) / 0.125];
        for (a, b) in out.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{out:?}");
        }
        assert!(Normalize::new(&[0.5], &[0.0])
            .unwrap_err()
            .to_string()
            .contains("every std must be > 0"));
        for tiny in [1e-50, 1e-39, f64::MIN_POSITIVE] {
            let msg = Normalize::new(&[0.5], &[tiny]).unwrap_err().to_string();
            assert!(msg.contains("too small for f32"), "{tiny}: {msg}");
        }
        assert!(Normalize::new(&[1e300], &[1.0])
            .unwrap_err()
            .to_string()
            .contains("does not fit in f32"));
        assert!(Normalize::new(&[0.5, 0.5], &[1.0])
            .unwrap_err()
            .to_string()
            .contains("2 means and 1 stds"));
    }

    #[test]
    fn augment_crops_with_zero_padding_and_flips() {
        // 1x3x3 image 1..=9.
        let src: Vec<u8> = (1..=9).collect();
        let mut seen_shift = false;
        let mut seen_flip = false;
        for index in 0..64 {
            let mut dst = vec![0; 9];
            Augment {
                crop_padding: 1,
                flip_prob: 0.5,
            }
            .apply(&src, [1, 3, 3], 5, 0, index, &mut dst)
            .unwrap();
            // Every output pixel is 0 (padding) or a source pixel; the centre pixel is a
            // source pixel at most one step from the centre, so never padding.
            assert_ne!(dst[4], 0);
            assert!(dst.iter().all(|&v| v <= 9));
            seen_shift |= dst.contains(&0);
            seen_flip |= dst == [3, 2, 1, 6, 5, 4, 9, 8, 7];
        }
        assert!(seen_shift && seen_flip);
        // Flip only, always: an exact mirror.
        let mut dst = vec![0; 9];
        Augment {
            crop_padding: 0,
            flip_prob: 1.0,
        }
        .apply(&src, [1, 3, 3], 5, 0, 0, &mut dst)
        .unwrap();
        assert_eq!(dst, [3, 2, 1, 6, 5, 4, 9, 8, 7]);
        // Identity: unchanged.
        Augment::default()
            .apply(&src, [1, 3, 3], 5, 0, 0, &mut dst)
            .unwrap();
        assert_eq!(dst, src);
    }

    #[test]
    fn crops_reach_every_offset_of_the_padded_image() {
        // 1x4x4 image 1..=16 padded by 1: the output's pixel (1, 1) is the source's
        // (top, left), each offset in 0..=2 as torchvision's RandomCrop draws them.
        let src: Vec<u8> = (1..=16).collect();
        let mut offsets = std::collections::BTreeSet::new();
        for index in 0..200 {
            let mut dst = vec![0; 16];
            Augment {
                crop_padding: 1,
                flip_prob: 0.0,
            }
            .apply(&src, [1, 4, 4], 9, 0, index, &mut dst)
            .unwrap();
            let v = usize::from(dst[5]) - 1;
            offsets.insert((v / 4, v % 4));
        }
        let all: std::collections::BTreeSet<_> =
            (0..3).flat_map(|t| (0..3).map(move |l| (t, l))).collect();
        assert_eq!(offsets, all);
    }

    #[test]
    fn a_constant_channel_normalises_to_zero() {
        // Channel 1 is 200 in every pixel: its std is 0, which `from_dataset` raises to 1e-6.
        let pixels: Vec<u8> = (0..4u8)
            .flat_map(|i| [i * 50, i * 50 + 10, 200, 200])
            .collect();
        let ds = crate::ImageDataset::new("flat", [2, 1, 2], pixels, vec![0; 4], vec!["a".into()])
            .unwrap();
        let n = Normalize::from_dataset(&ds).unwrap();
        assert_eq!(n.std()[1], 1e-6);
        assert!((n.mean()[1] - 200.0 / 255.0).abs() < 1e-6);
        let mut out = Vec::new();
        push_f32(&[0, 10, 200, 200], 2, Some(&n), &mut out);
        assert_eq!(out[2..], [0.0, 0.0]);
    }

    #[test]
    fn augment_is_a_function_of_seed_epoch_and_index() {
        let src: Vec<u8> = (0..48).collect();
        let run = |seed, epoch, index| {
            let mut dst = vec![0; 48];
            Augment::cifar()
                .apply(&src, [3, 4, 4], seed, epoch, index, &mut dst)
                .unwrap();
            dst
        };
        assert_eq!(run(1, 2, 3), run(1, 2, 3));
        let variants = [run(1, 2, 3), run(2, 2, 3), run(1, 3, 3), run(1, 2, 4)];
        let distinct = variants.iter().filter(|v| **v != variants[0]).count();
        assert!(distinct >= 2, "augmentation ignores its coordinates");
    }
}
