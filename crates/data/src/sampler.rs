//! [`DistributedSampler`]: each rank's shard of a dataset's indices (PyTorch's
//! `torch.utils.data.DistributedSampler`).
//!
//! Invariants: every rank gets `num_samples` indices, the same count on every rank. The epoch's
//! order is `0..len` (no shuffle) or a Fisher-Yates permutation from kiln's Philox stream keyed
//! by `seed + epoch` (so it is the same on every rank for the same epoch and changes with
//! [`DistributedSampler::set_epoch`]); it is padded to `num_samples * num_replicas` by repeating
//! its first indices (as many times as needed), or, with `drop_last`, cut to that size; rank `r`
//! takes positions `r, r + num_replicas, r + 2 num_replicas, ..`. Without padding the shards are
//! disjoint and together cover the order; with it, only the repeated indices appear twice.
//! Without shuffle the indices equal PyTorch's exactly; with shuffle the permutation is kiln's
//! own (PyTorch's comes from its own generator).

use crate::error::{arg_err, Result};
use crate::rng::{Domain, Stream};

/// One rank's view of a dataset split across `num_replicas` ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
}

impl DistributedSampler {
    /// Rank `rank`'s shard of a dataset of `len` samples over `num_replicas` ranks, with
    /// PyTorch's defaults: shuffled, seed 0, no `drop_last`, epoch 0.
    pub fn new(len: usize, num_replicas: usize, rank: usize) -> Result<Self> {
        if num_replicas == 0 || rank >= num_replicas {
            return Err(arg_err(
                "DistributedSampler::new",
                format!(
                    "rank {rank} with num_replicas {num_replicas}: the rank must be in \
                     0..num_replicas (pass the process group's rank and world size)"
                ),
            ));
        }
        Ok(DistributedSampler {
            len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            epoch: 0,
        })
    }

    /// Sets whether each epoch's order is shuffled.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// Sets the shuffle seed (the same on every rank).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drops the tail that does not divide evenly over the ranks instead of padding.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Sets the epoch whose order [`indices`](Self::indices) gives (call it every epoch, on
    /// every rank, with the same value, as PyTorch requires). A [`crate::DataLoader`] given a
    /// sampler passes its own epoch instead.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// The epoch set last.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The number of ranks.
    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The dataset size.
    pub fn dataset_len(&self) -> usize {
        self.len
    }

    /// Indices per rank per epoch (PyTorch's `num_samples`).
    pub fn num_samples(&self) -> usize {
        if self.drop_last && !self.len.is_multiple_of(self.num_replicas) {
            // The largest count every rank can get without repeating an index.
            self.len / self.num_replicas
        } else {
            self.len.div_ceil(self.num_replicas)
        }
    }

    /// Indices over all ranks per epoch (`num_samples * num_replicas`).
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.num_replicas
    }

    /// This rank's indices for the epoch set last.
    pub fn indices(&self) -> Vec<usize> {
        self.indices_for_epoch(self.epoch)
    }

    /// This rank's indices for `epoch`.
    pub fn indices_for_epoch(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut s = Stream::new(self.seed.wrapping_add(epoch), Domain::Shuffle, 0, 1);
            for i in (1..self.len).rev() {
                order.swap(i, s.below(i + 1));
            }
        }
        let total = self.total_size();
        if order.len() < total {
            // Pad with the order's first indices, repeating the whole order when the padding is
            // longer than it (only when len < num_replicas - 1).
            let mut k = 0;
            while order.len() < total {
                order.push(order[k % self.len]);
                k += 1;
            }
        } else {
            order.truncate(total);
        }
        order
            .into_iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .collect()
    }
}
