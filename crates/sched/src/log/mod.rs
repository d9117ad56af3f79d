//! Scalar logging: TensorBoard event files, CSV, and SVG plots of any logged series.
//!
//! [`ScalarLogger`] keeps every logged `(step, value)` per tag in memory (scalars are small)
//! so it can plot them, and streams each value to the sinks it was given: a TensorBoard event
//! file ([`tfevents`]) and/or a CSV file ([`csv`]). Sinks only append and are flushed after
//! every `flush_every` calls to [`ScalarLogger::log`] (default: every call) and on drop, so a
//! crashed run keeps every step it logged.
//!
//! ```no_run
//! use kiln_sched::log::ScalarLogger;
//! let mut log = ScalarLogger::in_memory().tensorboard("runs/exp1")?.csv("runs/exp1/scalars.csv")?;
//! for step in 0..100 {
//!     log.log("train/loss", step, 1.0 / (1.0 + step as f64))?;
//! }
//! log.plot("loss", &["train/loss"])?.write("runs/exp1/loss.svg")?;
//! # Ok::<(), kiln_sched::SchedError>(())
//! ```

pub mod crc32c;
pub mod csv;
pub mod svg;
mod svg_frame;
pub mod svg_stack;
pub mod tfevents;

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Result, SchedError};
use tfevents::{EventBody, EventWriter};

/// Logs named scalar series; see the [module docs](self).
/// Dropping it flushes every sink (each sink flushes itself on drop).
#[derive(Debug)]
pub struct ScalarLogger {
    series: BTreeMap<String, Vec<(i64, f64)>>,
    tensorboard: Option<EventWriter>,
    csv: Option<csv::CsvWriter>,
    flush_every: usize,
    unflushed: usize,
}

impl Default for ScalarLogger {
    fn default() -> Self {
        Self::in_memory()
    }
}

impl ScalarLogger {
    /// A logger that only keeps values in memory (for plots); add sinks with
    /// [`tensorboard`](Self::tensorboard) and [`csv`](Self::csv).
    pub fn in_memory() -> Self {
        Self {
            series: BTreeMap::new(),
            tensorboard: None,
            csv: None,
            flush_every: 1,
            unflushed: 0,
        }
    }

    /// Also write a new TensorBoard event file in `dir` (`tensorboard --logdir dir` shows it).
    pub fn tensorboard(mut self, dir: impl AsRef<Path>) -> Result<Self> {
        let mut writer = EventWriter::create(dir)?;
        // The logger decides when to flush (see `flush_every`).
        writer.set_flush_every(usize::MAX);
        self.tensorboard = Some(writer);
        Ok(self)
    }

    /// [`tensorboard`](Self::tensorboard) for a resumed run whose first logged step is
    /// `purge_step`, like PyTorch's `SummaryWriter(purge_step = ...)`: TensorBoard then drops the
    /// events of `dir`'s earlier files from that step on, so the steps an interrupted run logged
    /// after its last checkpoint do not show twice ([`EventWriter::create_purging`]).
    pub fn tensorboard_purging(mut self, dir: impl AsRef<Path>, purge_step: i64) -> Result<Self> {
        let mut writer = EventWriter::create_purging(dir, purge_step)?;
        writer.set_flush_every(usize::MAX);
        self.tensorboard = Some(writer);
        Ok(self)
    }

    /// Also append rows to the CSV file at `path`.
    pub fn csv(mut self, path: impl AsRef<Path>) -> Result<Self> {
        self.csv = Some(csv::CsvWriter::open(path)?);
        Ok(self)
    }

    /// Flush the sinks after every `n` calls to `log` / `log_many` (default 1). Larger values
    /// trade crash safety of the last `n - 1` calls for fewer write system calls.
    pub fn flush_every(mut self, n: usize) -> Self {
        self.flush_every = n.max(1);
        self
    }

    /// The event file being written, if any.
    pub fn event_file(&self) -> Option<&Path> {
        self.tensorboard.as_ref().map(|w| w.path())
    }

    /// Log one scalar.
    pub fn log(&mut self, tag: &str, step: i64, value: f64) -> Result<()> {
        self.log_many(step, &[(tag, value)])
    }

    /// Log several scalars of one step (one TensorBoard event). Errors when a tag is empty.
    pub fn log_many(&mut self, step: i64, values: &[(&str, f64)]) -> Result<()> {
        if let Some((tag, _)) = values.iter().find(|(t, _)| t.trim().is_empty()) {
            return Err(SchedError::InvalidLog {
                reason: format!("tag {tag:?} is empty: name the series, e.g. \"train/loss\""),
            });
        }
        let wall = tfevents::now();
        if let Some(tb) = &mut self.tensorboard {
            let scalars = values
                .iter()
                .map(|(t, v)| (t.to_string(), *v as f32))
                .collect();
            tb.write_event(wall, step, &EventBody::Scalars(scalars))?;
        }
        if let Some(csv) = &mut self.csv {
            for (tag, value) in values {
                csv.write_row(wall, step, tag, *value)?;
            }
        }
        for (tag, value) in values {
            self.series
                .entry(tag.to_string())
                .or_default()
                .push((step, *value));
        }
        self.unflushed += 1;
        if self.unflushed >= self.flush_every {
            self.flush()?;
        }
        Ok(())
    }

    /// Hand everything logged so far to the OS.
    pub fn flush(&mut self) -> Result<()> {
        if let Some(tb) = &mut self.tensorboard {
            tb.flush()?;
        }
        if let Some(csv) = &mut self.csv {
            csv.flush()?;
        }
        self.unflushed = 0;
        Ok(())
    }

    /// The logged tags, sorted.
    pub fn tags(&self) -> impl Iterator<Item = &str> {
        self.series.keys().map(String::as_str)
    }

    /// Every `(step, value)` logged under `tag`, in logging order.
    pub fn series(&self, tag: &str) -> Option<&[(i64, f64)]> {
        self.series.get(tag).map(Vec::as_slice)
    }

    /// A plot of the given series against their steps. Errors name a tag that was never logged.
    pub fn plot(&self, title: &str, tags: &[&str]) -> Result<svg::Plot> {
        let mut plot = svg::Plot::new(title).x_label("step");
        for tag in tags {
            let points = self.series(tag).ok_or_else(|| SchedError::InvalidLog {
                reason: format!(
                    "no series {tag:?} to plot: logged tags are {:?}",
                    self.tags().collect::<Vec<_>>()
                ),
            })?;
            plot = plot.series(tag, points.iter().map(|&(s, v)| (s as f64, v)).collect());
        }
        Ok(plot)
    }
}
