//! [`ImageDataset`]: a labelled set of same-sized images held in memory as `u8`, one `C x H x W`
//! block per sample (CHW, the layout of CIFAR-10's files and of kiln's batches).
//!
//! Every source in this crate (synthetic shapes, MNIST, CIFAR-10) produces one. Keeping `u8`
//! rather than `f32` is 4x less memory (CIFAR-10's training set is 150 MB as bytes); conversion,
//! augmentation and normalisation happen per batch in the [`DataLoader`](crate::DataLoader).

use crate::error::{arg_err, Result};

/// Which half of a dataset: the training set or the held-out test/validation set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training set.
    Train,
    /// The held-out set (MNIST's `t10k`, CIFAR-10's `test_batch`, synthetic validation).
    Test,
}

/// Labelled images of one shape `[C, H, W]`, stored as `u8` in CHW order.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageDataset {
    name: String,
    shape: [usize; 3],
    pixels: Vec<u8>,
    labels: Vec<i64>,
    classes: Vec<String>,
}

impl ImageDataset {
    /// A dataset from raw CHW bytes (`labels.len()` samples of `shape`) and class names.
    /// Every label must index `classes`.
    pub fn new(
        name: impl Into<String>,
        shape: [usize; 3],
        pixels: Vec<u8>,
        labels: Vec<i64>,
        classes: Vec<String>,
    ) -> Result<Self> {
        let per = crate::memory::image_len("ImageDataset::new", shape)?;
        if per == 0 {
            return Err(arg_err(
                "ImageDataset::new",
                format!("sample shape {shape:?} has a zero dimension; every C, H, W must be >= 1"),
            ));
        }
        let needed = per.checked_mul(labels.len());
        if needed != Some(pixels.len()) {
            let needs = needed.map_or("more than can be addressed".to_string(), |n| n.to_string());
            return Err(arg_err(
                "ImageDataset::new",
                format!(
                    "{} pixel bytes for {} labels of shape {shape:?} (needs {needs}); pass one \
                     C*H*W block per label",
                    pixels.len(),
                    labels.len()
                ),
            ));
        }
        if let Some((i, &l)) = labels
            .iter()
            .enumerate()
            .find(|(_, &l)| l < 0 || l as usize >= classes.len())
        {
            return Err(arg_err(
                "ImageDataset::new",
                format!(
                    "label {l} of sample {i} is outside 0..{}; pass one class name per label value",
                    classes.len()
                ),
            ));
        }
        Ok(ImageDataset {
            name: name.into(),
            shape,
            pixels,
            labels,
            classes,
        })
    }

    /// The dataset's name, e.g. `mnist/train`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The shape of one sample, `[C, H, W]`.
    pub fn sample_shape(&self) -> [usize; 3] {
        self.shape
    }

    /// Channels per sample.
    pub fn channels(&self) -> usize {
        self.shape[0]
    }

    /// The CHW bytes of sample `index` (panics when out of range, like slice indexing; the loader
    /// only asks for indices below [`len`](Self::len)).
    pub fn image(&self, index: usize) -> &[u8] {
        let per = self.shape.iter().product::<usize>();
        &self.pixels[index * per..(index + 1) * per]
    }

    /// The class index of sample `index`.
    pub fn label(&self, index: usize) -> i64 {
        self.labels[index]
    }

    /// All labels in order.
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// The class names, indexed by label.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Number of classes.
    pub fn num_classes(&self) -> usize {
        self.classes.len()
    }

    /// Keeps only the first `len` samples (a quick run on part of a dataset).
    pub fn truncate(&mut self, len: usize) {
        let per = self.shape.iter().product::<usize>();
        self.labels.truncate(len);
        self.pixels.truncate(len * per);
    }

    /// Per-channel mean and standard deviation of the pixels scaled to `[0, 1]` (population
    /// std, as the usual CIFAR/MNIST constants are computed): the numbers for
    /// [`Normalize::new`](crate::Normalize::new).
    pub fn channel_stats(&self) -> (Vec<f64>, Vec<f64>) {
        let [c, h, w] = self.shape;
        let plane = h * w;
        let mut sum = vec![0u64; c];
        let mut sq = vec![0u64; c];
        for img in self.pixels.chunks_exact(c * plane) {
            for (ch, p) in img.chunks_exact(plane).enumerate() {
                for &v in p {
                    sum[ch] += v as u64;
                    sq[ch] += (v as u64) * (v as u64);
                }
            }
        }
        let n = (self.len() * plane).max(1) as f64;
        let mean: Vec<f64> = sum.iter().map(|&s| s as f64 / n / 255.0).collect();
        let std = sq
            .iter()
            .zip(&mean)
            .map(|(&q, m)| (q as f64 / n / (255.0 * 255.0) - m * m).max(0.0).sqrt())
            .collect();
        (mean, std)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_checks_sizes_and_labels() {
        let classes = vec!["a".to_string(), "b".to_string()];
        let ok = ImageDataset::new("t", [1, 2, 2], vec![0; 8], vec![0, 1], classes.clone());
        assert_eq!(ok.unwrap().len(), 2);
        let short = ImageDataset::new("t", [1, 2, 2], vec![0; 7], vec![0, 1], classes.clone());
        assert!(short
            .unwrap_err()
            .to_string()
            .contains("7 pixel bytes for 2 labels"));
        let bad = ImageDataset::new("t", [1, 2, 2], vec![0; 8], vec![0, 2], classes);
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("label 2 of sample 1 is outside 0..2"));
    }

    #[test]
    fn channel_stats_are_exact() {
        // Channel 0 holds 0 and 255 (mean 0.5, std 0.5); channel 1 is all 51 (0.2, std 0).
        let ds = ImageDataset::new(
            "t",
            [2, 1, 2],
            vec![0, 255, 51, 51],
            vec![0],
            vec!["a".into()],
        )
        .unwrap();
        let (mean, std) = ds.channel_stats();
        assert!((mean[0] - 0.5).abs() < 1e-12 && (std[0] - 0.5).abs() < 1e-12);
        assert!((mean[1] - 0.2).abs() < 1e-12 && std[1].abs() < 1e-6);
    }
}
