//! Replaying a [`Trace`] through the allocator on a [`SimBackend`]: the measurement behind
//! `cargo xtask replay` and the fragmentation figures of `cargo xtask bench alloc`; with
//! [`ReplayPolicy::PyTorch`], through the model of PyTorch's allocator in
//! [`crate::pytorch_policy`] instead, for the same figures under PyTorch's rules.

use crate::allocator::CachingAllocator;
use crate::backend::{SimBackend, StreamId};
use crate::config::AllocatorConfig;
use crate::error::{Error, Result};
use crate::handle::RawAllocation;
use crate::trace::{Trace, TraceEvent};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub use crate::replay_report::{ReplayMode, ReplayReport};

/// Whose allocation policy a replay measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayPolicy {
    /// kiln's [`CachingAllocator`] on a [`SimBackend`].
    Kiln,
    /// The model of PyTorch's CUDA caching allocator ([`crate::pytorch_policy`]).
    PyTorch,
}

impl std::str::FromStr for ReplayPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "kiln" => Ok(ReplayPolicy::Kiln),
            "pytorch" => Ok(ReplayPolicy::PyTorch),
            _ => Err(Error::InvalidConfig(format!(
                "policy `{s}`: use `kiln` or `pytorch`"
            ))),
        }
    }
}

/// Default simulated capacity: 80 GiB, an A100/H100.
pub const DEFAULT_REPLAY_CAPACITY: usize = 80 << 30;

/// Default page of the simulated device: 2 MiB, the CUDA virtual-memory granularity (and the
/// host backend's expandable-segment page).
pub const DEFAULT_REPLAY_PAGE: usize = 2 << 20;

/// An allocator on a simulated device that replays traces, possibly several times.
#[derive(Debug)]
pub struct Replayer {
    sim: Arc<SimBackend>,
    allocator: CachingAllocator,
    live: HashMap<u64, RawAllocation>,
    /// Ids whose allocation ran out of memory and whose free has not come yet (kept across
    /// [`run`](Self::run) calls: a step's batch can be freed in the next step).
    failed: HashSet<u64>,
    live_bytes: usize,
    peak_live: usize,
    events: usize,
}

impl Replayer {
    /// A fresh simulated device of `capacity` bytes with 2 MiB pages, and an allocator in `mode`.
    pub fn new(mode: ReplayMode, capacity: usize) -> Result<Self> {
        let config = match mode {
            ReplayMode::Default => AllocatorConfig::default(),
            ReplayMode::Expandable => AllocatorConfig::expandable(),
        };
        Self::with_config(config, capacity)
    }

    /// Like [`new`](Self::new) with any settings (e.g. expandable segments with
    /// `page_stitching`).
    pub fn with_config(config: AllocatorConfig, capacity: usize) -> Result<Self> {
        Self::with_page(config, capacity, DEFAULT_REPLAY_PAGE)
    }

    /// Like [`with_config`](Self::with_config) on a device whose page (the granularity of
    /// segments and the page of expandable segments) is `page` bytes instead of 2 MiB: how a
    /// trace would fare on a backend with other pages. `page` must be a non-zero multiple of
    /// 512 bytes no larger than `capacity`.
    pub fn with_page(config: AllocatorConfig, capacity: usize, page: usize) -> Result<Self> {
        if page == 0 || !page.is_multiple_of(512) || page > capacity {
            return Err(Error::InvalidConfig(format!(
                "page size {page} bytes: use a non-zero multiple of 512 bytes no larger than the \
                 capacity ({capacity} bytes), e.g. 2MiB (CUDA's granularity) or 64KiB"
            )));
        }
        let sim = Arc::new(SimBackend::new(capacity).with_page_granularity(page));
        let allocator = CachingAllocator::new(Arc::clone(&sim), config)?;
        Ok(Self {
            sim,
            allocator,
            live: HashMap::new(),
            failed: HashSet::new(),
            live_bytes: 0,
            peak_live: 0,
            events: 0,
        })
    }

    /// Replays every event; an allocation that runs out of memory is counted (in `ooms`) and
    /// its later free skipped, in this call or a later one. Fails only if the allocator reports
    /// a non-memory error.
    pub fn run(&mut self, trace: &Trace) -> Result<()> {
        for e in &trace.events {
            self.events += 1;
            match *e {
                TraceEvent::Alloc { id, bytes } => {
                    match self.allocator.allocate_raw(bytes, StreamId::DEFAULT) {
                        Ok(raw) => {
                            if let Some(old) = self.live.insert(id, raw) {
                                self.allocator.free_raw(old)?;
                                return Err(Error::TraceParse {
                                line: 0,
                                message: format!("id {id} allocated twice across replays; free it in the trace"),
                            });
                            }
                            self.live_bytes += bytes;
                            self.peak_live = self.peak_live.max(self.live_bytes);
                        }
                        Err(Error::OutOfMemory(_)) => {
                            self.failed.insert(id);
                        }
                        Err(e) => return Err(e),
                    }
                }
                TraceEvent::Free { id } => {
                    if let Some(raw) = self.live.remove(&id) {
                        self.live_bytes -= raw.size();
                        self.allocator.free_raw(raw)?;
                    } else if !self.failed.remove(&id) {
                        return Err(Error::TraceParse {
                            line: 0,
                            message: format!("free of unknown id {id}"),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Replays the steps of a recorded trace file (split at its `# step` lines by
    /// [`steps_of`](crate::trace::steps_of)), marking the start of each with
    /// [`CachingAllocator::mark_step`] (which plans steady steps when `planned_steps` is on); a
    /// text without such lines is one step.
    pub fn run_steps(&mut self, text: &str) -> Result<()> {
        for step in crate::trace::steps_of(text)? {
            self.allocator.mark_step()?;
            self.run(&step)?;
        }
        Ok(())
    }

    /// The figures so far.
    pub fn report(&self) -> ReplayReport {
        let stats = self.allocator.memory_stats();
        let peak_reserved = stats.reserved_bytes.all.peak as usize;
        ReplayReport {
            events: self.events,
            peak_live_bytes: self.peak_live,
            peak_reserved_bytes: peak_reserved,
            reserved_over_live: if self.peak_live == 0 {
                0.0
            } else {
                peak_reserved as f64 / self.peak_live as f64
            },
            device_allocs: stats.num_device_alloc,
            device_frees: stats.num_device_free,
            alloc_retries: stats.num_alloc_retries,
            ooms: stats.num_ooms,
        }
    }

    /// The simulated device (for call counts).
    pub fn sim(&self) -> &SimBackend {
        &self.sim
    }

    /// The allocator.
    pub fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }
}

impl Drop for Replayer {
    fn drop(&mut self) {
        for (_, raw) in self.live.drain() {
            let _ = self.allocator.free_raw(raw);
        }
    }
}

/// Replays `trace` once on a fresh simulated device.
pub fn replay(trace: &Trace, mode: ReplayMode, capacity: usize) -> Result<ReplayReport> {
    let mut r = Replayer::new(mode, capacity)?;
    r.run(trace)?;
    Ok(r.report())
}

/// Replays `trace` once with expandable segments and `page_stitching` on (kiln's policy only:
/// PyTorch's allocator does not move pages) on a fresh simulated device.
pub fn replay_stitched(trace: &Trace, capacity: usize) -> Result<ReplayReport> {
    let config = AllocatorConfig {
        page_stitching: true,
        ..AllocatorConfig::expandable()
    };
    let mut r = Replayer::with_config(config, capacity)?;
    r.run(trace)?;
    Ok(r.report())
}

/// Replays `trace` once under `policy` in `mode` on a fresh simulated device.
pub fn replay_with(
    trace: &Trace,
    policy: ReplayPolicy,
    mode: ReplayMode,
    capacity: usize,
) -> Result<ReplayReport> {
    match policy {
        ReplayPolicy::Kiln => replay(trace, mode, capacity),
        ReplayPolicy::PyTorch => crate::pytorch_policy::replay_pytorch(trace, mode, capacity),
    }
}
