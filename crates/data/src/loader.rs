//! [`DataLoader`]: shuffled, batched, augmented and normalised samples as `Tensor`s, with an
//! optional prefetch worker, resumable mid-epoch.
//!
//! Order. Epoch `e`'s order is a Fisher-Yates permutation drawn from the Philox stream at
//! `(seed, shuffle, e)` (or `0..len` unshuffled). It depends on nothing else, so the loader's
//! whole state is [`LoaderState`] `{ epoch, batches_done }`: a checkpoint that saves it (each
//! [`Batch`] carries the state *after* it) and calls [`DataLoader::set_state`] on resume gets the
//! same remaining batches, bit for bit (augmentation is keyed by epoch and sample index too).
//!
//! Prefetch. With `prefetch_batches = N > 0` each epoch spawns one worker thread that builds the
//! host buffers of the remaining batches in order and sends them through a bounded channel of
//! `N` slots, fewer when the epoch has fewer batches left (so it runs at most `N` batches, plus
//! the one it is building, ahead of the consumer). The consuming thread wraps each buffer in tensors on the loader's device, so the
//! worker never touches a device. Dropping the [`EpochIter`] (or ending the epoch) sets a stop
//! flag, drops the receiver (a blocked `send` then fails) and joins the worker: no thread
//! outlives its iterator. Batches are the same with and without prefetch, since each is a pure
//! function of (dataset, config, epoch, batch index).

use crate::dataset::ImageDataset;
use crate::error::{arg_err, Error, Result};
use crate::rng::{Domain, Stream};
use crate::sampler::DistributedSampler;
use crate::transforms::{push_f32, Augment, Normalize};
use kiln_autograd::{Device, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

/// How a [`DataLoader`] batches, shuffles and transforms.
#[derive(Debug, Clone, PartialEq)]
pub struct DataLoaderConfig {
    /// Samples per batch (>= 1).
    pub batch_size: usize,
    /// Reshuffle every epoch (PyTorch's `shuffle=True`); otherwise dataset order.
    pub shuffle: bool,
    /// Drop the last batch when it is smaller than `batch_size` (PyTorch's `drop_last`).
    pub drop_last: bool,
    /// Seed of the shuffle and augmentation streams.
    pub seed: u64,
    /// Batches a worker thread prepares ahead (0: build each batch on the calling thread).
    pub prefetch_batches: usize,
    /// Random augmentation (default: none).
    pub augment: Augment,
    /// Per-channel normalisation (default: none, pixels in `[0, 1]`).
    pub normalize: Option<Normalize>,
}

impl Default for DataLoaderConfig {
    fn default() -> Self {
        DataLoaderConfig {
            batch_size: 1,
            shuffle: false,
            drop_last: false,
            seed: 0,
            prefetch_batches: 0,
            augment: Augment::default(),
            normalize: None,
        }
    }
}

/// Where a loader is: the epoch and how many of its batches were handed out. Save it with a
/// checkpoint (it derives serde's traits); [`DataLoader::set_state`] resumes from it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct LoaderState {
    /// The current epoch (0-based).
    pub epoch: u64,
    /// Batches of `epoch` already yielded.
    pub batches_done: usize,
}

/// One batch: images `[B, C, H, W]` (`F32`), labels `[B]` (`I64`).
#[derive(Debug, Clone)]
pub struct Batch {
    /// The images, augmented and normalised.
    pub images: Tensor,
    /// The class indices.
    pub labels: Tensor,
    /// Dataset indices of the samples, in batch order.
    pub indices: Vec<usize>,
    /// The epoch this batch belongs to.
    pub epoch: u64,
    /// Position of this batch in its epoch.
    pub batch_index: usize,
    /// The loader's state after this batch: what to checkpoint.
    pub state_after: LoaderState,
}

/// A batch's host buffers, built by [`build`] on either thread.
struct HostBatch {
    images: Vec<f32>,
    labels: Vec<i64>,
    indices: Vec<usize>,
}

/// Everything needed to build a batch, shared with the worker.
struct Plan {
    dataset: Arc<ImageDataset>,
    config: DataLoaderConfig,
    /// This rank's shard ([`DataLoader::with_sampler`]); `None`: the whole dataset.
    sampler: Option<DistributedSampler>,
}

impl Plan {
    fn build(&self, epoch: u64, indices: &[usize]) -> Result<HostBatch> {
        let shape = self.dataset.sample_shape();
        let per: usize = shape.iter().product();
        let mut images = Vec::with_capacity(indices.len() * per);
        let mut scratch = vec![0u8; per];
        let aug = &self.config.augment;
        let samples = self.dataset.images(indices)?;
        for (&i, src) in indices.iter().zip(&samples) {
            let pixels: &[u8] = if aug.is_identity() {
                src
            } else {
                aug.apply(src, shape, self.config.seed, epoch, i, &mut scratch)
                    .expect("dataset samples and scratch have the dataset's sample shape");
                &scratch
            };
            push_f32(
                pixels,
                shape[0],
                self.config.normalize.as_ref(),
                &mut images,
            );
        }
        Ok(HostBatch {
            images,
            labels: indices.iter().map(|&i| self.dataset.label(i)).collect(),
            indices: indices.to_vec(),
        })
    }
}

/// Batches of an [`ImageDataset`], epoch after epoch (see the module docs).
pub struct DataLoader {
    plan: Arc<Plan>,
    device: Device,
    state: LoaderState,
}

impl DataLoader {
    /// A loader over `dataset` putting batches on `device`.
    pub fn new(
        dataset: Arc<ImageDataset>,
        config: DataLoaderConfig,
        device: Device,
    ) -> Result<Self> {
        if config.batch_size == 0 {
            return Err(arg_err(
                "DataLoader::new",
                "batch_size is 0; pass at least 1",
            ));
        }
        config.augment.validate()?;
        if let Some(n) = &config.normalize {
            if n.channels() != dataset.channels() {
                return Err(arg_err(
                    "DataLoader::new",
                    format!(
                        "normalize has {} channel(s) but {} images have {}; use matching \
                         statistics (Normalize::mnist() for 1 channel, Normalize::cifar10() or \
                         Normalize::from_dataset for 3)",
                        n.channels(),
                        dataset.name(),
                        dataset.channels()
                    ),
                ));
            }
        }
        if dataset.is_empty() || (config.drop_last && dataset.len() < config.batch_size) {
            return Err(arg_err(
                "DataLoader::new",
                format!(
                    "{} has {} samples, so batch_size {}{} gives no batches; use a smaller \
                     batch size{}",
                    dataset.name(),
                    dataset.len(),
                    config.batch_size,
                    if config.drop_last {
                        " with drop_last"
                    } else {
                        ""
                    },
                    if config.drop_last {
                        " or drop_last: false"
                    } else {
                        ""
                    },
                ),
            ));
        }
        Ok(DataLoader {
            plan: Arc::new(Plan {
                dataset,
                config,
                sampler: None,
            }),
            device,
            state: LoaderState::default(),
        })
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<ImageDataset> {
        &self.plan.dataset
    }

    /// The configuration.
    pub fn config(&self) -> &DataLoaderConfig {
        &self.plan.config
    }

    /// Reads only `sampler`'s shard of the dataset (PyTorch's `DataLoader(sampler=...)`), for
    /// data-parallel training: epoch `e` takes `sampler.indices_for_epoch(e)` in that order, so
    /// the loader's own epoch plays the role of `set_epoch` (every rank's loader at the same
    /// state reads the same epoch's shards) and resuming stays bit-identical. Refused with
    /// `shuffle` (the sampler shuffles), for a sampler of another dataset size, or when the
    /// shard gives no batch.
    pub fn with_sampler(self, sampler: DistributedSampler) -> Result<Self> {
        let plan = &self.plan;
        let op = "DataLoader::with_sampler";
        if plan.config.shuffle {
            return Err(arg_err(
                op,
                "the config shuffles, but with a sampler the sampler decides the order; set \
                  shuffle: false in the config and shuffle in the sampler",
            ));
        }
        if sampler.dataset_len() != plan.dataset.len() {
            return Err(arg_err(
                op,
                format!(
                    "the sampler was made for {} samples but {} has {}; build it with \
                      DistributedSampler::new(dataset.len(), world_size, rank)",
                    sampler.dataset_len(),
                    plan.dataset.name(),
                    plan.dataset.len()
                ),
            ));
        }
        let shard = sampler.num_samples();
        if shard == 0 || (plan.config.drop_last && shard < plan.config.batch_size) {
            return Err(arg_err(
                op,
                format!(
                    "rank {}'s shard has {shard} samples, so batch_size {} gives no batches; use \
                      a smaller batch size or fewer ranks",
                    sampler.rank(),
                    plan.config.batch_size
                ),
            ));
        }
        Ok(DataLoader {
            plan: Arc::new(Plan {
                dataset: plan.dataset.clone(),
                config: plan.config.clone(),
                sampler: Some(sampler),
            }),
            device: self.device,
            state: self.state,
        })
    }

    /// The sampler given to [`with_sampler`](Self::with_sampler).
    pub fn sampler(&self) -> Option<&DistributedSampler> {
        self.plan.sampler.as_ref()
    }

    /// Batches per epoch (PyTorch's `len(loader)`).
    pub fn len(&self) -> usize {
        let n = match &self.plan.sampler {
            Some(s) => s.num_samples(),
            None => self.plan.dataset.len(),
        };
        let b = self.plan.config.batch_size;
        if self.plan.config.drop_last {
            n / b
        } else {
            n.div_ceil(b)
        }
    }

    /// Always false: [`new`](Self::new) refuses a loader with no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the loader is.
    pub fn state(&self) -> LoaderState {
        self.state
    }

    /// Continues from `state` (as saved from [`Batch::state_after`]); `batches_done` may equal
    /// [`len`](Self::len), meaning the start of the next epoch.
    pub fn set_state(&mut self, state: LoaderState) -> Result<()> {
        let len = self.len();
        if state.batches_done > len {
            return Err(arg_err(
                "DataLoader::set_state",
                format!(
                    "batches_done {} is past the {len} batches of an epoch; the state comes from \
                     a loader with another dataset size, batch size or drop_last",
                    state.batches_done
                ),
            ));
        }
        if state.epoch == u64::MAX {
            return Err(arg_err(
                "DataLoader::set_state",
                format!(
                    "epoch {} is the last u64, so the loader could not move on to the next epoch; \
                     the state is corrupt: pass a state saved by Batch::state_after",
                    state.epoch
                ),
            ));
        }
        self.state = if state.batches_done == len {
            LoaderState {
                epoch: state.epoch + 1,
                batches_done: 0,
            }
        } else {
            state
        };
        Ok(())
    }

    /// The sample order of `epoch`.
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        if let Some(sampler) = &self.plan.sampler {
            return sampler.indices_for_epoch(epoch);
        }
        let n = self.plan.dataset.len();
        let mut order: Vec<usize> = (0..n).collect();
        if self.plan.config.shuffle {
            let mut s = Stream::new(self.plan.config.seed, Domain::Shuffle, epoch, 0);
            for i in (1..n).rev() {
                order.swap(i, s.below(i + 1));
            }
        }
        order
    }

    /// The remaining batches of the current epoch; when they run out the loader moves on to
    /// the next epoch. Each call to `iter` after that gives the next epoch.
    pub fn iter(&mut self) -> EpochIter<'_> {
        let epoch = self.state.epoch;
        let start = self.state.batches_done;
        let order = self.epoch_order(epoch);
        let len = self.len();
        let b = self.plan.config.batch_size;
        let chunks: Vec<Vec<usize>> = (start..len)
            .map(|k| order[k * b..((k + 1) * b).min(order.len())].to_vec())
            .collect();
        let source = if self.plan.config.prefetch_batches == 0 {
            Source::Inline {
                chunks: chunks.into_iter(),
            }
        } else {
            Source::spawn(
                self.plan.clone(),
                epoch,
                chunks,
                self.plan.config.prefetch_batches,
            )
        };
        EpochIter {
            loader: self,
            source,
            epoch,
            ended: false,
        }
    }
}

/// Where an epoch's host batches come from.
enum Source {
    Inline {
        chunks: std::vec::IntoIter<Vec<usize>>,
    },
    Worker {
        rx: Option<Receiver<Result<HostBatch>>>,
        handle: Option<JoinHandle<()>>,
        stop: Arc<AtomicBool>,
        remaining: usize,
    },
}

impl Source {
    fn spawn(plan: Arc<Plan>, epoch: u64, chunks: Vec<Vec<usize>>, ahead: usize) -> Source {
        // The channel never holds more than the epoch's batches; its buffer is allocated up
        // front, so a huge `prefetch_batches` must not size it.
        let (tx, rx) = sync_channel(ahead.min(chunks.len()));
        let stop = Arc::new(AtomicBool::new(false));
        let stop_worker = stop.clone();
        let remaining = chunks.len();
        let fallback = chunks.clone();
        let handle = std::thread::Builder::new()
            .name("kiln-data-prefetch".into())
            .spawn(move || {
                for chunk in chunks {
                    if stop_worker.load(Ordering::Relaxed) {
                        return;
                    }
                    let built = plan.build(epoch, &chunk);
                    let failed = built.is_err();
                    if tx.send(built).is_err() || failed {
                        return; // the iterator was dropped, or met the error and stops
                    }
                }
            });
        match handle {
            Ok(handle) => Source::Worker {
                rx: Some(rx),
                handle: Some(handle),
                stop,
                remaining,
            },
            // No thread to be had: build on the caller's thread instead (same batches).
            Err(_) => Source::Inline {
                chunks: fallback.into_iter(),
            },
        }
    }

    fn stop(&mut self) -> Option<String> {
        if let Source::Worker {
            rx, handle, stop, ..
        } = self
        {
            stop.store(true, Ordering::Relaxed);
            drop(rx.take());
            if let Some(h) = handle.take() {
                if let Err(panic) = h.join() {
                    return Some(
                        panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a panic without a message".into()),
                    );
                }
            }
        }
        None
    }
}

/// The remaining batches of one epoch (from [`DataLoader::iter`]). Dropping it stops and joins
/// its prefetch worker.
pub struct EpochIter<'a> {
    loader: &'a mut DataLoader,
    source: Source,
    epoch: u64,
    /// An error was yielded: the iterator is over (see [`Iterator::next`]).
    ended: bool,
}

impl EpochIter<'_> {
    /// The loader's state now (after the batches yielded so far).
    pub fn state(&self) -> LoaderState {
        self.loader.state
    }

    fn next_host(&mut self) -> Option<Result<HostBatch>> {
        match &mut self.source {
            Source::Inline { chunks } => {
                let chunk = chunks.next()?;
                Some(self.loader.plan.build(self.epoch, &chunk))
            }
            Source::Worker { rx, remaining, .. } => {
                if *remaining == 0 {
                    return None;
                }
                match rx.as_ref()?.recv() {
                    Ok(batch) => {
                        *remaining -= 1;
                        Some(batch)
                    }
                    Err(_) => {
                        let why = self
                            .source
                            .stop()
                            .unwrap_or_else(|| "it stopped before the end of the epoch".into());
                        Some(Err(Error::Worker(why)))
                    }
                }
            }
        }
    }

    fn next_batch(&mut self) -> Option<Result<Batch>> {
        let host = match self.next_host()? {
            Ok(h) => h,
            Err(e) => return Some(Err(e)),
        };
        let [c, h, w] = self.loader.plan.dataset.sample_shape();
        let b = host.labels.len();
        let device = self.loader.device;
        // The allocation history counts the batch's tensors as data.
        let _data = kiln_device::AllocContext::category(kiln_device::MemoryCategory::Data);
        let images = match Tensor::from_vec(host.images, &[b, c, h, w], device) {
            Ok(t) => t,
            Err(e) => return Some(Err(e.into())),
        };
        let labels = match Tensor::from_vec(host.labels, &[b], device) {
            Ok(t) => t,
            Err(e) => return Some(Err(e.into())),
        };
        let batch_index = self.loader.state.batches_done;
        let mut after = LoaderState {
            epoch: self.epoch,
            batches_done: batch_index + 1,
        };
        if after.batches_done == self.loader.len() {
            // `set_state` refuses epoch u64::MAX, so only 2^64 epochs could get here.
            let Some(next) = self.epoch.checked_add(1) else {
                return Some(Err(arg_err(
                    "DataLoader::iter",
                    "epoch u64::MAX is the last one: there is no next epoch to move on to",
                )));
            };
            after = LoaderState {
                epoch: next,
                batches_done: 0,
            };
        }
        self.loader.state = after;
        Some(Ok(Batch {
            images,
            labels,
            indices: host.indices,
            epoch: self.epoch,
            batch_index,
            state_after: after,
        }))
    }
}

impl Iterator for EpochIter<'_> {
    type Item = Result<Batch>;

    /// The next batch. An error (an image file that cannot be read, a failed worker) ends the
    /// iterator: the loader's state stays after the last batch yielded, so once the cause is
    /// fixed the next [`DataLoader::iter`] builds the failed batch again.
    fn next(&mut self) -> Option<Result<Batch>> {
        if self.ended {
            return None;
        }
        let batch = self.next_batch();
        self.ended = matches!(batch, Some(Err(_)));
        batch
    }
}

impl Drop for EpochIter<'_> {
    fn drop(&mut self) {
        self.source.stop();
    }
}
