//! [`DataSource`]: the `--data` flag of the training example (`synthetic`, `synthetic:N`,
//! `mnist:DIR`, `cifar10:DIR`, `folder:DIR`, `folder:HxW:DIR`) and the per-source defaults that
//! go with it: which split is the validation set, which normalisation constants, which
//! augmentation.

use crate::dataset::{ImageDataset, Split};
use crate::error::{arg_err, Error, Result};
use crate::image_folder::FolderFiles;
use crate::image_io::{check_target, read_image, ImageOptions};
use crate::transforms::{Augment, Normalize};
use crate::{cifar10, mnist, synthetic};
use std::path::{Path, PathBuf};
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
    /// Your own images: `DIR/train` and `DIR/val`, each in torchvision's `ImageFolder` layout
    /// ([`crate::image_folder`]), as RGB (torchvision's loader converts every image to RGB), at
    /// `size` (`[H, W]`, each image resized with Pillow's bilinear filter) or, without it, at
    /// the size of the first training image, which every image must then have. The images are
    /// decoded into memory once when both splits take at most a quarter of the machine's
    /// memory, and otherwise read from disk as they are used
    /// ([`crate::image_folder_on_disk`]).
    Folder {
        /// The folder holding `train/` and `val/`.
        dir: PathBuf,
        /// The size every image is resized to, if any.
        size: Option<[usize; 2]>,
    },
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
            DataSource::Folder { dir, size } => {
                load_folders(dir, *size, crate::memory::physical_memory())?
            }
        })
    }

    /// The normalisation to use for both splits: the published constants for MNIST and
    /// CIFAR-10, the training split's own statistics for the synthetic set, and for folders
    /// either their own statistics or, when the run starts from `pretrained` weights,
    /// ImageNet's ([`Normalize::imagenet`]), which torchvision's pretrained weights expect.
    pub fn normalize(&self, train: &ImageDataset, pretrained: bool) -> Result<Normalize> {
        match self {
            DataSource::Folder { .. } if pretrained => Ok(Normalize::imagenet()),
            DataSource::Synthetic { .. } | DataSource::Folder { .. } => {
                Normalize::from_dataset(train)
            }
            DataSource::Mnist(_) => Ok(Normalize::mnist()),
            DataSource::Cifar10(_) => Ok(Normalize::cifar10()),
        }
    }

    /// The training augmentation: crop (padding 4) and flip for CIFAR-10, the synthetic set and
    /// folders of photos (their classes survive a mirror), none for MNIST (a mirrored digit is
    /// another glyph).
    pub fn augment(&self) -> Augment {
        match self {
            DataSource::Mnist(_) => Augment::default(),
            _ => Augment::cifar(),
        }
    }
}

impl FromStr for DataSource {
    type Err = Error;

    /// `synthetic`, `synthetic:TRAIN_LEN` (validation: a fifth of it), `mnist:DIR`,
    /// `cifar10:DIR`, `folder:DIR` or `folder:HxW:DIR`.
    fn from_str(s: &str) -> Result<Self> {
        let usage =
            "use synthetic, synthetic:TRAIN_LEN, mnist:DIR, cifar10:DIR, folder:DIR or folder:HxW:DIR";
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
            ("mnist" | "cifar10" | "folder", None | Some("")) => Err(arg_err(
                "DataSource",
                format!("`{s}` names no folder; {usage}"),
            )),
            ("mnist", Some(dir)) => Ok(DataSource::Mnist(dir.into())),
            ("cifar10", Some(dir)) => Ok(DataSource::Cifar10(dir.into())),
            ("folder", Some(arg)) => folder_source(s, arg, usage),
            _ => Err(arg_err(
                "DataSource",
                format!("unknown data source `{s}`; {usage}"),
            )),
        }
    }
}

/// Which per-channel normalisation a training run uses (the `train` example's `--normalize`).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum NormalizeChoice {
    /// The data source's rule ([`DataSource::normalize`]): `source`.
    #[default]
    Source,
    /// The training split's own statistics ([`Normalize::from_dataset`]): `dataset`.
    Dataset,
    /// These constants: `imagenet`, `cifar10` or `mnist`.
    Constants(Normalize),
}

impl NormalizeChoice {
    /// The normalisation for a run on `source` whose training split is `train`, starting from
    /// `pretrained` weights or not. Constants with another channel count than the images are
    /// an error naming the choices that fit.
    pub fn resolve(
        &self,
        source: &DataSource,
        train: &ImageDataset,
        pretrained: bool,
    ) -> Result<Normalize> {
        let normalize = match self {
            NormalizeChoice::Source => source.normalize(train, pretrained)?,
            NormalizeChoice::Dataset => Normalize::from_dataset(train)?,
            NormalizeChoice::Constants(n) => n.clone(),
        };
        let c = train.channels();
        if normalize.channels() != c {
            let fits = if c == 1 {
                "mnist"
            } else {
                "imagenet or cifar10"
            };
            return Err(arg_err(
                "--normalize",
                format!(
                    "the constants have {} channel(s) but {}'s images have {c}; use source, \
                     dataset or {fits}",
                    normalize.channels(),
                    train.name()
                ),
            ));
        }
        Ok(normalize)
    }
}

impl FromStr for NormalizeChoice {
    type Err = Error;

    /// `source`, `dataset`, `imagenet`, `cifar10` or `mnist`.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "source" => NormalizeChoice::Source,
            "dataset" => NormalizeChoice::Dataset,
            "imagenet" => NormalizeChoice::Constants(Normalize::imagenet()),
            "cifar10" => NormalizeChoice::Constants(Normalize::cifar10()),
            "mnist" => NormalizeChoice::Constants(Normalize::mnist()),
            _ => {
                return Err(arg_err(
                    "--normalize",
                    format!(
                        "unknown normalisation `{s}`; use source (the data's default), dataset \
                         (the training split's statistics), imagenet, cifar10 or mnist"
                    ),
                ))
            }
        })
    }
}

/// `folder:`'s argument: `DIR`, or `HxW:DIR` when what precedes the first `:` reads as a size.
fn folder_source(s: &str, arg: &str, usage: &str) -> Result<DataSource> {
    let side = |v: &str| v.parse::<usize>().ok().filter(|&n| n > 0);
    if let Some((first, dir)) = arg.split_once(':') {
        if let Some((h, w)) = first.split_once('x') {
            let (Some(h), Some(w)) = (side(h), side(w)) else {
                return Err(arg_err(
                    "DataSource",
                    format!("`{s}`: `{first}` is not a size of whole pixels above 0; {usage}"),
                ));
            };
            if dir.is_empty() {
                return Err(arg_err(
                    "DataSource",
                    format!("`{s}` names no folder; {usage}"),
                ));
            }
            return Ok(DataSource::Folder {
                dir: dir.into(),
                size: Some([h, w]),
            });
        }
    }
    Ok(DataSource::Folder {
        dir: arg.into(),
        size: None,
    })
}

/// `dir/train` and `dir/val` as RGB image folders at `size`, or at the first training image's
/// size; the two must have the same classes, or the labels would not mean the same classes.
/// `memory` is the machine's (see [`fits_in_memory`]).
fn load_folders(
    dir: &Path,
    size: Option<[usize; 2]>,
    memory: Option<usize>,
) -> Result<(ImageDataset, ImageDataset)> {
    let (train_dir, val_dir) = (dir.join("train"), dir.join("val"));
    for split in [&train_dir, &val_dir] {
        if !split.is_dir() {
            return Err(arg_err(
                "DataSource",
                format!(
                    "{} is not a folder; folder:{} needs train/ and val/ in it, each holding \
                     one folder of images per class (train/<class>/<image>.png)",
                    split.display(),
                    dir.display()
                ),
            ));
        }
    }
    // both splits listed first, so differing classes are refused before any image is decoded
    let (train, val) = (FolderFiles::list(&train_dir)?, FolderFiles::list(&val_dir)?);
    if train.classes != val.classes {
        return Err(arg_err(
            "DataSource",
            format!(
                "{} has the classes {:?} but {} has {:?}; give both splits the same class \
                 folders (an empty one is an error, so move at least one image into it)",
                train_dir.display(),
                train.classes,
                val_dir.display(),
                val.classes,
            ),
        ));
    }
    let (options, [h, w]) = match size {
        Some(size) => (
            ImageOptions {
                convert_channels: true,
                resize: true,
            },
            size,
        ),
        None => {
            // a listed split holds at least one image (an empty class is an error)
            let (_, [_, h, w]) = read_image(&train.paths[0])?;
            let options = ImageOptions {
                convert_channels: true,
                resize: false,
            };
            (options, [h, w])
        }
    };
    let shape = [3, h, w];
    let target = check_target("DataSource", shape)?;
    // an image of another size names the flag that resizes, not the library option
    let fix = format!(
        "pass folder:{h}x{w}:{} to resize every image to the first one's size",
        dir.display()
    );
    let train = train.on_disk(shape, options, target.clone(), Some(fix.clone()))?;
    let val = val.on_disk(shape, options, target, Some(fix))?;
    let samples = train.len().saturating_add(val.len());
    if !fits_in_memory(samples, shape, memory) {
        return Ok((train, val));
    }
    Ok((train.into_memory()?, val.into_memory()?))
}

/// Whether a folder source's splits, `samples` images of `shape` in all, are decoded into
/// memory: when their bytes take at most a quarter of `memory` (the machine's; the model, its
/// gradients and the batches need the rest) or the machine's memory is unknown. Larger ones
/// stay on disk, each image decoded when it is used, as torchvision reads an `ImageFolder`.
fn fits_in_memory(samples: usize, shape: [usize; 3], memory: Option<usize>) -> bool {
    let bytes = shape.into_iter().try_fold(samples, usize::checked_mul);
    match (bytes, memory) {
        (_, None) => true,
        (Some(bytes), Some(memory)) => bytes <= memory / 4,
        (None, Some(_)) => false,
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
        assert_eq!(
            "folder:/data/pets".parse::<DataSource>().unwrap(),
            DataSource::Folder {
                dir: "/data/pets".into(),
                size: None
            }
        );
        assert_eq!(
            "folder:224x160:C:/pets".parse::<DataSource>().unwrap(),
            DataSource::Folder {
                dir: "C:/pets".into(),
                size: Some([224, 160])
            }
        );
        assert_eq!(
            "folder:C:/pets".parse::<DataSource>().unwrap(),
            DataSource::Folder {
                dir: "C:/pets".into(),
                size: None
            }
        );
        for (bad, says) in [
            ("imagenet:/x", "unknown data source `imagenet:/x`"),
            ("mnist", "names no folder"),
            ("synthetic:lots", "`lots` is not a sample count"),
            ("folder:", "names no folder"),
            ("folder:32x32:", "names no folder"),
            ("folder:0x32:/x", "`0x32` is not a size of whole pixels"),
            ("folder:32xbig:/x", "`32xbig` is not a size"),
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
        let n = src.normalize(&train, false).unwrap();
        let (mean, _) = train.channel_stats().unwrap();
        assert!((n.mean()[0] as f64 - mean[0]).abs() < 1e-6);
        assert_eq!(src.augment(), Augment::cifar());
        assert_eq!(DataSource::Mnist("x".into()).augment(), Augment::default());
        assert_eq!(
            DataSource::Cifar10("x".into())
                .normalize(&train, true)
                .unwrap(),
            Normalize::cifar10()
        );
    }

    #[test]
    fn normalize_follows_the_flag_the_source_and_the_weights() {
        let (train, _) = synthetic::train_val(1, 20, 5).unwrap();
        let folder = DataSource::Folder {
            dir: "x".into(),
            size: None,
        };
        let own = Normalize::from_dataset(&train).unwrap();
        let pick = |choice: &str, source: &DataSource, pretrained| {
            let choice: NormalizeChoice = choice.parse().unwrap();
            choice.resolve(source, &train, pretrained)
        };
        assert_eq!(pick("source", &folder, false).unwrap(), own);
        assert_eq!(
            pick("source", &folder, true).unwrap(),
            Normalize::imagenet()
        );
        assert_eq!(pick("source", &DataSource::synthetic(), true).unwrap(), own);
        assert_eq!(pick("dataset", &folder, true).unwrap(), own);
        assert_eq!(
            pick("cifar10", &folder, true).unwrap(),
            Normalize::cifar10()
        );
        let msg = pick("mnist", &folder, false).unwrap_err().to_string();
        assert!(
            msg.contains("1 channel(s) but") && msg.contains("dataset or imagenet or cifar10"),
            "{msg}"
        );
        assert!(!msg.contains("  "), "{msg}");
        let msg = "imagnet"
            .parse::<NormalizeChoice>()
            .unwrap_err()
            .to_string();
        assert!(msg.contains("unknown normalisation `imagnet`"), "{msg}");
        assert!(!msg.contains("  "), "{msg}");
    }

    /// Writes `dir/{train,val}/{a,b}/k.png`, 4x6 RGB, with `odd` (a 5x6 image) as train/b/9.png.
    fn folder_source(dir: &Path, odd: bool) {
        let _ = std::fs::remove_dir_all(dir);
        for (split, class, k) in [
            ("train", "a", 0),
            ("train", "b", 1),
            ("val", "a", 2),
            ("val", "b", 3),
        ] {
            let path = dir.join(split).join(class);
            std::fs::create_dir_all(&path).unwrap();
            let px: Vec<u8> = (0..72).map(|i| (i * 7 + k * 31) as u8).collect();
            crate::save_png(path.join(format!("{k}.png")), &px, [3, 4, 6]).unwrap();
        }
        if odd {
            crate::save_png(dir.join("train/b/9.png"), &[9; 90], [3, 5, 6]).unwrap();
        }
    }

    #[test]
    fn a_folder_is_held_in_memory_up_to_a_quarter_of_the_machine() {
        let dir = std::env::temp_dir().join(format!("kiln-source-{}", std::process::id()));
        folder_source(&dir, false);
        // two splits of two 3x4x6 images: 288 bytes
        for (memory, on_disk) in [(None, false), (Some(1152), false), (Some(1151), true)] {
            let (train, val) = load_folders(&dir, None, memory).unwrap();
            assert_eq!((train.is_on_disk(), val.is_on_disk()), (on_disk, on_disk));
            assert_eq!((train.len(), val.len()), (2, 2));
            assert_eq!(train.classes(), ["a", "b"]);
        }
        assert!(!fits_in_memory(
            1 << 30,
            [3, 1 << 20, 1 << 20],
            Some(usize::MAX)
        ));
        assert!(fits_in_memory(usize::MAX, [3, 1 << 20, 1 << 20], None));
        // an image of another size names the flag that resizes it, in memory and on disk
        folder_source(&dir, true);
        let err = load_folders(&dir, None, None).unwrap_err().to_string();
        let fix = format!("pass folder:4x6:{} to resize", dir.display());
        assert!(err.contains("9.png") && err.contains(&fix), "{err}");
        let (train, _) = load_folders(&dir, None, Some(0)).unwrap();
        let err = train.image(2).unwrap_err().to_string();
        assert!(err.contains("9.png") && err.contains(&fix), "{err}");
        let (train, _) = load_folders(&dir, Some([4, 6]), Some(0)).unwrap();
        assert_eq!(train.image(2).unwrap().len(), 72);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
