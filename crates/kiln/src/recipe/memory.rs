//! The run folder's memory files: `memory.svg` on every run (one training step's allocated
//! bytes stacked by category, the peak and its largest blocks, and the per-epoch allocated /
//! reserved / peak curves), and with `memory_history` also `memory_snapshot.pickle` (the
//! allocation history in the format PyTorch's memory_viz opens).
//!
//! Invariants:
//! - The history is recorded from before the model is built (so parameters and optimizer
//!   state are attributed), through the pictured step: the second batch (the first when an
//!   epoch has one) of the first epoch this call trains with the backbone unfrozen, or of its
//!   last epoch when every epoch it trains is frozen. Without `memory_history`,
//!   recording stops right after that step; with it, it runs to the end, in a ring of that
//!   many events.
//! - The pictured step's events are found by their position in the whole history (events
//!   dropped from the ring counted), never by time, so a full ring cannot shift the window.
//! - Both files are rewritten after every epoch, so a stopped run still has them.
//! - The history belongs to the device's allocator, which is process-wide: runs on the same
//!   device at the same time (threads of one test binary) see each other's events, and the
//!   first to finish its pictured step stops the recording of the others.

use super::config::TrainConfig;
use super::error::Result;
use super::report::EpochReport;
use crate::memory_picture::{write_memory_svg, EpochMemory};
use kiln_alloc_cache::timeline::MemoryTimeline;

/// Events kept while recording only for the picture (one step of the example's models needs a
/// few thousand).
pub const PICTURE_EVENTS: usize = 1 << 18;

/// File names in the run folder.
pub const MEMORY_SVG: &str = "memory.svg";
/// The snapshot written with `memory_history`.
pub const MEMORY_SNAPSHOT: &str = "memory_snapshot.pickle";

/// The pictured step, as the run goes.
pub(super) struct MemoryPicture {
    /// Global index (dropped events counted) of the first event of the pictured step, while it
    /// runs.
    started_at: Option<u64>,
    /// The finished step's timeline and title.
    step: Option<(MemoryTimeline, String)>,
    /// Whether this call still has a step to picture.
    waiting: bool,
    /// Whether this process writes the run folder (rank 0, or the only process): the others
    /// record nothing and write nothing.
    enabled: bool,
}

fn recorded_so_far(config: &TrainConfig) -> Result<(u64, kiln_alloc_cache::MemoryHistory)> {
    let h = kiln_device::allocator(config.device)?.memory_history();
    Ok((h.dropped + h.events.len() as u64, h))
}

fn record(config: &TrainConfig, on: bool, max_entries: usize) -> Result<()> {
    kiln_device::allocator(config.device)?
        .record_memory_history(on, max_entries)
        .map_err(kiln_device::Error::from)?;
    Ok(())
}

impl MemoryPicture {
    /// Starts recording (call before the model is built).
    pub fn start(config: &TrainConfig) -> Result<Self> {
        if !config.is_writer() {
            return Ok(MemoryPicture {
                started_at: None,
                step: None,
                waiting: false,
                enabled: false,
            });
        }
        let max = config.memory_history.unwrap_or(PICTURE_EVENTS);
        record(config, true, max)?;
        Ok(MemoryPicture {
            started_at: None,
            step: None,
            waiting: true,
            enabled: true,
        })
    }

    /// Which batch of an epoch of `batches` is pictured.
    fn pictured_batch(batches: usize) -> usize {
        if batches > 1 {
            1
        } else {
            0
        }
    }

    /// Before batch `batch` of `batches` of epoch `epoch` (from 0).
    pub fn before_batch(
        &mut self,
        config: &TrainConfig,
        epoch: usize,
        batch: usize,
        batches: usize,
    ) -> Result<()> {
        let last = config
            .stop_after
            .unwrap_or(config.epochs)
            .min(config.epochs);
        let this_epoch = epoch >= config.freeze_epochs || epoch + 1 >= last;
        if self.waiting && this_epoch && batch == Self::pictured_batch(batches) {
            self.started_at = Some(recorded_so_far(config)?.0);
        }
        Ok(())
    }

    /// After batch `batch` (and its optimizer step, if it ended a group) of epoch `epoch`
    /// (from 0).
    pub fn after_batch(&mut self, config: &TrainConfig, epoch: usize, batch: usize) -> Result<()> {
        let Some(start) = self.started_at.take() else {
            return Ok(());
        };
        let (_, history) = recorded_so_far(config)?;
        if config.memory_history.is_none() {
            record(config, false, 0)?;
        }
        // Events before the step (still in the ring) are replayed for the state it starts from.
        let first = start
            .saturating_sub(history.dropped)
            .min(history.events.len() as u64) as usize;
        let timeline = MemoryTimeline::from_history(&history, first);
        let title = format!(
            "one training step (epoch {}, batch {}): allocated bytes by category",
            epoch + 1,
            batch + 1
        );
        self.step = Some((timeline, title));
        self.waiting = false;
        Ok(())
    }

    /// Writes `memory.svg` (and the snapshot with `memory_history`) into the run folder.
    pub fn write(&self, config: &TrainConfig, history: &[EpochReport]) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let epochs: Vec<EpochMemory> = history
            .iter()
            .map(|r| EpochMemory {
                epoch: r.epoch,
                allocated: r.memory[0],
                reserved: r.memory[1],
                peak: r.memory[2],
            })
            .collect();
        let step = self.step.as_ref().map(|(t, title)| (t, title.as_str()));
        write_memory_svg(&config.run_dir.join(MEMORY_SVG), step, &epochs)?;
        if config.memory_history.is_some() {
            kiln_device::dump_snapshot(config.device, config.run_dir.join(MEMORY_SNAPSHOT))?;
        }
        Ok(())
    }
}
