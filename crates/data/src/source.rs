//! [`DataSource`]: the `--data` flag of the training example (`synthetic`, `synthetic:N`,
//! `mnist:DIR`, `cifar10:DIR`) and the per-source defaults that go with it: which split is the
//! validation set, which normalisation constants, which augmentation.

use crate::dataset::{ImageDataset, Split};
use crate::error::{arg_err, Error, Result};
use crate::transforms::{Augment, Normalize};
use crate::{cifar10, mnist, synthetic};
use std::path::PathBuf;
use std::str::FromStr;

/// Where the training and validation images come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSource {
    /// The built-in synthetic shapes: `train_len` training and `val_len` validation samples.
    Synthetic {
        /// Training samples.
        train_len: usize,
        /// Validation samples.
        val_len: usize,
    },
    /// MNIST's IDX files in a folder (train / t10k).
    Mnist(PathBuf),
    /// CIFAR-10's binary batches in a folder (data_batch_1..5 / test_batch).
    Cifar10(PathBuf),
}

impl DataSource {
    /// Synthetic training samples when `synthetic` gives no count.
    pub const SYNTHETIC_TRAIN_LEN: usize = 10_000;

    /// The default: synthetic shapes, 10 000 training and 2 000 validation samples.
    pub fn synthetic() -> Self {
        DataSource::Synthetic {
            train_len: Self::SYNTHETIC_TRAIN_LEN,
            val_len: Self::SYNTHETIC_TRAIN_LEN / 5,
        }
    }

    /// Loads `(train, validation)`; `seed` only matters for the synthetic source.
    pub fn load(&self, seed: u64) -> Result<(ImageDataset, ImageDataset)> {
        Ok(match self {
            DataSource::Synthetic { train_len, val_len } => {
                synthetic::train_val(seed, *train_len, *val_len)?
            }
            DataSource::Mnist(dir) => (
                mnist::load(dir, Split::Train)?,
                mnist::load(dir, Split::Test)?,
            ),
            DataSource::Cifar10(dir) => (
                cifar10::load(dir, Split::Train)?,
                cifar10::load(dir, Split::Test)?,
            ),
        })
    }

    /// The normalisation to use for both splits: the published constants for MNIST and
    /// CIFAR-10, the training split's own statistics for the synthetic set.
    pub fn normalize(&self, train: &ImageDataset) -> Result<Normalize> {
        match self {
            DataSource::Synthetic { .. } => Normalize::from_dataset(train),
            DataSource::Mnist(_) => Ok(Normalize::mnist()),
            DataSource::Cifar10(_) => Ok(Normalize::cifar10()),
        }
    }

    /// The training augmentation: crop (padding 4) and flip for CIFAR-10 and the synthetic set
    /// (their classes survive a mirror), none for MNIST (a mirrored digit is another glyph).
    pub fn augment(&self) -> Augment {
        match self {
            DataSource::Mnist(_) => Augment::default(),
            _ => Augment::cifar(),
        }
    }
}

impl FromStr for DataSource {
    type Err = Error;

    /// `synthetic`, `synthetic:TRAIN_LEN` (validation: a fifth of it), `mnist:DIR` or
    /// `cifar10:DIR`.
    fn from_str(s: &str) -> Result<Self> {
        let usage = "use synthetic, synthetic:TRAIN_LEN, mnist:DIR or cifar10:DIR";
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        match (kind, arg) {
            ("synthetic", None) => Ok(DataSource::synthetic()),
            ("synthetic", Some(n)) => match n.parse::<usize>() {
                Ok(train_len) if train_len >= 5 => Ok(DataSource::Synthetic {
                    train_len,
                    val_len: train_len / 5,
                }),
                _ => Err(arg_err(
                    "DataSource",
                    format!("`{s}`: `{n}` is not a sample count of at least 5; {usage}"),
                )),
            },
            ("mnist" | "cifar10", None | Some("")) => Err(arg_err(
                "DataSource",
                format!("`{s}` names no folder; {usage}"),
            )),
            ("mnist", Some(dir)) => Ok(DataSource::Mnist(dir.into())),
            ("cifar10", Some(dir)) => Ok(DataSource::Cifar10(dir.into())),
            _ => Err(arg_err(
                "DataSource",
                format!("unknown data source `{s}`; {usage}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form_and_rejects_the_rest() {
        assert_eq!(
            "synthetic".parse::<DataSource>().unwrap(),
            DataSource::synthetic()
        );
        assert_eq!(
            "synthetic:500".parse::<DataSource>().unwrap(),
            DataSource::Synthetic {
                train_len: 500,
                val_len: 100
            }
        );
        assert_eq!(
            "mnist:/data/mnist".parse::<DataSource>().unwrap(),
            DataSource::Mnist("/data/mnist".into())
        );
        assert_eq!(
            "cifar10:C:/x".parse::<DataSource>().unwrap(),
            DataSource::Cifar10("C:/x".into())
        );
        for (bad, says) in [
            ("imagenet:/x", "unknown data source `imagenet:/x`"),
            ("mnist", "names no folder"),
            ("synthetic:lots", "`lots` is not a sample count"),
        ] {
            let msg = bad.parse::<DataSource>().unwrap_err().to_string();
            assert!(msg.contains(says) && msg.contains("cifar10:DIR"), "{msg}");
        }
    }

    #[test]
    fn synthetic_loads_with_its_own_statistics() {
        let src: DataSource = "synthetic:50".parse().unwrap();
        let (train, val) = src.load(1).unwrap();
        assert_eq!((train.len(), val.len()), (50, 10));
        let n = src.normalize(&train).unwrap();
        let (mean, _) = train.channel_stats();
        assert!((n.mean()[0] as f64 - mean[0]).abs() < 1e-6);
        assert_eq!(src.augment(), Augment::cifar());
        assert_eq!(DataSource::Mnist("x".into()).augment(), Augment::default());
        assert_eq!(
            DataSource::Cifar10("x".into()).normalize(&train).unwrap(),
            Normalize::cifar10()
        );
    }
}
