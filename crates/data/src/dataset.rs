//! [`ImageDataset`]: a labelled set of same-sized images, one `C x H x W` block of `u8` per
//! sample (CHW, the layout of CIFAR-10's files and of kiln's batches).
//!
//! Invariants:
//! - every sample has the dataset's `[C, H, W]` shape and a label that indexes its classes;
//! - the pixels live either in memory, every sample's bytes one block after another (the
//!   built-in sources, and [`crate::image_folder`]), or on disk, one image file per sample
//!   decoded each time it is read ([`crate::image_folder_on_disk`], torchvision's way), so a
//!   folder larger than memory still trains;
//! - reading a sample from memory never fails; reading one from disk fails with an error
//!   naming its file when the file is gone, corrupt or of another shape.
//!
//! Keeping `u8` rather than `f32` is 4x less memory (CIFAR-10's training set is 150 MB as
//! bytes); conversion, augmentation and normalisation happen per batch in the
//! [`DataLoader`](crate::DataLoader).

use crate::error::{arg_err, Error, Result};
use crate::image_io::{fit_image, ImageOptions};
use crate::transforms::Normalize;
use rayon::prelude::*;
use std::borrow::Cow;
use std::path::PathBuf;

/// Which half of a dataset: the training set or the held-out test/validation set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training set.
    Train,
    /// The held-out set (MNIST's `t10k`, CIFAR-10's `test_batch`, synthetic validation).
    Test,
}

/// One image file per sample, decoded (and converted or resized under `options`) when read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ImageFiles {
    /// Sample `i`'s file.
    pub(crate) paths: Vec<PathBuf>,
    /// What decoding may change to reach the dataset's shape.
    pub(crate) options: ImageOptions,
    /// The shape's words for errors ("a 3x224x224 image") and the fix for one too large.
    pub(crate) what: String,
    /// See `what`.
    pub(crate) fix: String,
    /// The fix an image of the wrong size names instead of `ImageOptions::resize` (the flag of
    /// the program that made the dataset), if any.
    pub(crate) shape_fix: Option<String>,
}

impl ImageFiles {
    /// Sample `index`'s file as CHW bytes of `shape`.
    fn read(&self, index: usize, shape: [usize; 3]) -> Result<Vec<u8>> {
        let read = fit_image(
            &self.paths[index],
            shape,
            self.options,
            &self.what,
            &self.fix,
        );
        match (read, &self.shape_fix) {
            (
                Err(Error::ImageShape {
                    path,
                    found,
                    expected,
                    ..
                }),
                Some(fix),
            ) => Err(Error::ImageShape {
                path,
                found,
                expected,
                fix: fix.clone(),
            }),
            (read, _) => read,
        }
    }
}

/// Where a dataset's pixels live (see the module docs).
#[derive(Debug, Clone, PartialEq)]
enum Pixels {
    Memory(Vec<u8>),
    Disk(ImageFiles),
}

/// Labelled images of one shape `[C, H, W]`, as `u8` in CHW order, in memory or on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageDataset {
    name: String,
    shape: [usize; 3],
    pixels: Pixels,
    labels: Vec<i64>,
    classes: Vec<String>,
}

/// Errors unless `shape` has no zero dimension and fits in memory as one sample.
fn check_shape(op: &'static str, shape: [usize; 3]) -> Result<usize> {
    let per = crate::memory::image_len(op, shape)?;
    if per == 0 {
        return Err(arg_err(
            op,
            format!("sample shape {shape:?} has a zero dimension; every C, H, W must be >= 1"),
        ));
    }
    Ok(per)
}

/// Errors unless every label indexes `classes`.
fn check_labels(op: &'static str, labels: &[i64], classes: &[String]) -> Result<()> {
    if let Some((i, &l)) = labels
        .iter()
        .enumerate()
        .find(|(_, &l)| l < 0 || l as usize >= classes.len())
    {
        return Err(arg_err(
            op,
            format!(
                "label {l} of sample {i} is outside 0..{}; pass one class name per label value",
                classes.len()
            ),
        ));
    }
    Ok(())
}

/// Adds one CHW image's per-channel sums of values and of squared values.
fn add_stats(img: &[u8], plane: usize, sums: &mut [(u64, u64)]) {
    for (p, (sum, sq)) in img.chunks_exact(plane).zip(sums.iter_mut()) {
        for &v in p {
            *sum += v as u64;
            *sq += (v as u64) * (v as u64);
        }
    }
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
        let per = check_shape("ImageDataset::new", shape)?;
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
        check_labels("ImageDataset::new", &labels, &classes)?;
        Ok(ImageDataset {
            name: name.into(),
            shape,
            pixels: Pixels::Memory(pixels),
            labels,
            classes,
        })
    }

    /// A dataset whose sample `i` is the image file `files.paths[i]`, read when it is used.
    pub(crate) fn on_disk(
        name: String,
        shape: [usize; 3],
        files: ImageFiles,
        labels: Vec<i64>,
        classes: Vec<String>,
    ) -> Result<Self> {
        let op = "ImageDataset::on_disk";
        check_shape(op, shape)?;
        if files.paths.len() != labels.len() {
            return Err(arg_err(
                op,
                format!("{} files for {} labels", files.paths.len(), labels.len()),
            ));
        }
        check_labels(op, &labels, &classes)?;
        Ok(ImageDataset {
            name,
            shape,
            pixels: Pixels::Disk(files),
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

    /// Whether the samples are image files decoded when read, rather than bytes in memory.
    pub fn is_on_disk(&self) -> bool {
        matches!(self.pixels, Pixels::Disk(_))
    }

    /// The CHW bytes of sample `index`: borrowed from memory, or decoded from its file. Errors
    /// when `index` is not below [`len`](Self::len), and for a file that can no longer be read
    /// as the dataset's shape (naming it).
    pub fn image(&self, index: usize) -> Result<Cow<'_, [u8]>> {
        if index >= self.len() {
            return Err(arg_err(
                "ImageDataset::image",
                format!(
                    "sample {index} of a dataset of {} samples; pass an index below its len()",
                    self.len()
                ),
            ));
        }
        match &self.pixels {
            Pixels::Memory(bytes) => {
                let per = self.shape.iter().product::<usize>();
                Ok(Cow::Borrowed(&bytes[index * per..(index + 1) * per]))
            }
            Pixels::Disk(f) => Ok(Cow::Owned(f.read(index, self.shape)?)),
        }
    }

    /// The same dataset in memory: a dataset on disk has every image decoded, in parallel,
    /// into one buffer whose size is checked against memory first; the first image in sample
    /// order that cannot be read is the error. One in memory is returned as it is.
    pub fn into_memory(self) -> Result<ImageDataset> {
        let Pixels::Disk(f) = &self.pixels else {
            return Ok(self);
        };
        let op = "ImageDataset::into_memory";
        let per = crate::memory::image_len(op, self.shape)?;
        let [c, h, w] = self.shape;
        let all = format!("{} images of {c}x{h}x{w}", self.len());
        let fix = "the dataset would be held in memory, one byte a value; read it from disk \
                   (image_folder_on_disk, without into_memory), at a smaller size, or fewer \
                   images";
        let len = crate::memory::checked_size(op, &all, &[self.len(), per], fix)?;
        let mut pixels = crate::memory::filled(op, &all, len, 0u8, fix)?;
        let results: Vec<Result<()>> = pixels
            .par_chunks_mut(per)
            .enumerate()
            .map(|(i, slot)| {
                slot.copy_from_slice(&f.read(i, self.shape)?);
                Ok(())
            })
            .collect();
        // the first failing file in sample order, whatever order the pool met them in
        results.into_iter().collect::<Result<()>>()?;
        Ok(ImageDataset {
            pixels: Pixels::Memory(pixels),
            ..self
        })
    }

    /// The samples at `indices`, in order; files are decoded in parallel on rayon's pool, and
    /// the first failing one in `indices`' order is the error.
    pub(crate) fn images(&self, indices: &[usize]) -> Result<Vec<Cow<'_, [u8]>>> {
        match self.pixels {
            Pixels::Memory(_) => indices.iter().map(|&i| self.image(i)).collect(),
            Pixels::Disk(_) => {
                let read: Vec<Result<Cow<[u8]>>> =
                    indices.par_iter().map(|&i| self.image(i)).collect();
                read.into_iter().collect()
            }
        }
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
        match &mut self.pixels {
            Pixels::Memory(bytes) => bytes.truncate(self.labels.len() * per),
            Pixels::Disk(f) => f.paths.truncate(len),
        }
    }

    /// Per-channel mean and standard deviation of the pixels scaled to `[0, 1]` (population
    /// std, as the usual CIFAR/MNIST constants are computed): the numbers for
    /// [`Normalize::new`](crate::Normalize::new). A dataset on disk is read once, in parallel;
    /// a file that cannot be read is the error.
    pub fn channel_stats(&self) -> Result<(Vec<f64>, Vec<f64>)> {
        let [c, h, w] = self.shape;
        let plane = h * w;
        // integer sums: exact, so the order images are added in does not matter
        let zero = || vec![(0u64, 0u64); c];
        let merge = |mut a: Vec<(u64, u64)>, b: Vec<(u64, u64)>| {
            for ((s, q), (bs, bq)) in a.iter_mut().zip(b) {
                *s += bs;
                *q += bq;
            }
            a
        };
        let sums = match &self.pixels {
            Pixels::Memory(bytes) => bytes
                .par_chunks_exact(c * plane)
                .fold(zero, |mut acc, img| {
                    add_stats(img, plane, &mut acc);
                    acc
                })
                .reduce(zero, merge),
            Pixels::Disk(_) => {
                // chunks in order, each read in order: the first unreadable file is the error
                let indices: Vec<usize> = (0..self.len()).collect();
                let per_chunk: Vec<Result<Vec<(u64, u64)>>> = indices
                    .par_chunks(64)
                    .map(|chunk| {
                        let mut acc = zero();
                        for &i in chunk {
                            add_stats(&self.image(i)?, plane, &mut acc);
                        }
                        Ok(acc)
                    })
                    .collect();
                per_chunk
                    .into_iter()
                    .try_fold(zero(), |a, b| b.map(|b| merge(a, b)))?
            }
        };
        let n = (self.len() * plane).max(1) as f64;
        let mean: Vec<f64> = sums.iter().map(|&(s, _)| s as f64 / n / 255.0).collect();
        let std = sums
            .iter()
            .zip(&mean)
            .map(|(&(_, q), m)| (q as f64 / n / (255.0 * 255.0) - m * m).max(0.0).sqrt())
            .collect();
        Ok((mean, std))
    }
}

impl Normalize {
    /// The statistics of `dataset` itself (for the synthetic set: compute them on the training
    /// split and use them for both splits), each standard deviation at least `1e-6`. A dataset
    /// on disk is read once for them; an image that cannot be read is the error.
    pub fn from_dataset(dataset: &ImageDataset) -> Result<Self> {
        let (mean, std) = dataset.channel_stats()?;
        let std: Vec<f64> = std.iter().map(|s| s.max(1e-6)).collect();
        Normalize::new(&mean, &std)
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
        let (mean, std) = ds.channel_stats().unwrap();
        assert!((mean[0] - 0.5).abs() < 1e-12 && (std[0] - 0.5).abs() < 1e-12);
        assert!((mean[1] - 0.2).abs() < 1e-12 && std[1].abs() < 1e-6);
    }
}
