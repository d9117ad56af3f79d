//! `kiln-data`: datasets, transforms, a data loader and image input for kiln.
//!
//! - [`synthetic`]: the built-in dataset, coloured shapes and patterns in noise (10 classes,
//!   `3 x 32 x 32`), rendered deterministically from a seed; no download needed.
//! - [`mnist`] and [`cifar10`]: the real datasets from their distribution files (IDX, gz or not;
//!   CIFAR-10 binary batches). A corrupt or truncated file is an error naming the file, the byte
//!   offset and what the format expects there.
//! - [`image_folder`] / [`image_folder_on_disk`]: your own images in torchvision's
//!   `ImageFolder` layout (`root/<class>/<image>.png|jpg`), with torchvision's class indices and
//!   sample order, decoded once into memory or read from disk as they are used.
//! - [`Normalize`] and [`Augment`]: per-channel normalisation (standard constants included) and
//!   seeded random crop / horizontal flip.
//! - [`DataLoader`]: per-epoch shuffling from a seed, batches as `[B, C, H, W]` `F32` images and
//!   `[B]` `I64` labels, `drop_last`, background prefetch, and a [`LoaderState`] to checkpoint
//!   and resume bit-identically.
//! - [`DistributedSampler`]: each rank's equal-length shard for data-parallel training
//!   (PyTorch's padding and `drop_last`), fed to a loader with [`DataLoader::with_sampler`].
//! - [`DataSource`]: the training example's `--data` flag (`synthetic`, `mnist:DIR`,
//!   `cifar10:DIR`, `folder:DIR`) with each source's validation split, normalisation and
//!   augmentation.
//! - [`load_image`] / [`save_png`]: one PNG/JPEG in as a normalised `[C, H, W]` tensor (for
//!   `predict`), samples out as PNG; [`resize_bilinear`]: Pillow's bilinear resize, byte for
//!   byte.
//!
//! ```no_run
//! use kiln_data::{synthetic, DataLoader, DataLoaderConfig, Normalize, Augment};
//! use std::sync::Arc;
//! # fn main() -> kiln_data::Result<()> {
//! let (train, _val) = synthetic::train_val(0, 10_000, 2_000)?;
//! let config = DataLoaderConfig {
//!     batch_size: 128,
//!     shuffle: true,
//!     drop_last: true,
//!     seed: 0,
//!     prefetch_batches: 2,
//!     augment: Augment::cifar(),
//!     normalize: Some(Normalize::from_dataset(&train)?),
//! };
//! let mut loader = DataLoader::new(Arc::new(train), config, kiln_autograd::Device::Cpu)?;
//! for batch in loader.iter() {
//!     let batch = batch?; // batch.images: [128, 3, 32, 32], batch.labels: [128]
//!     # let _ = batch;
//! }
//! # Ok(()) }
//! ```

mod dataset;
mod error;
mod files;
mod image_codec;
mod image_folder;
mod image_io;
mod loader;
mod memory;
mod resize;
mod rng;
mod sampler;
mod source;
mod transforms;

pub mod cifar10;
pub mod mnist;
pub mod synthetic;

pub use dataset::{ImageDataset, Split};
pub use error::{Error, Result};
pub use image_folder::{image_folder, image_folder_on_disk};
pub use image_io::{hwc_to_chw, image_grid, load_image, read_image, save_png, ImageOptions};
pub use loader::{Batch, DataLoader, DataLoaderConfig, EpochIter, LoaderState};
pub use resize::resize_bilinear;
pub use sampler::DistributedSampler;
pub use source::{DataSource, NormalizeChoice};
pub use transforms::{Augment, Normalize};
