//! The part of the out-of-memory report that says what filled the device: the largest live
//! blocks by category, op and module when the allocation history is recorded (otherwise how to
//! record it), and what the registered memory plan predicted for the step.
//!
//! Invariant: only additive to [`OomReport`]'s text; it prints nothing about memory it does
//! not know (no history: one line saying how to get it).

use crate::allocator::CachingAllocator;
use crate::error::OomReport;
use crate::history::PlanPrediction;
use crate::stats::format_bytes;
use std::fmt;

/// Live blocks the report lists.
pub(crate) const TOP_LIVE: usize = 8;

impl OomReport {
    pub(crate) fn write_what_filled_it(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = |v: usize| format_bytes(v as i64);
        if self.history_recorded {
            writeln!(f, "  largest live blocks (category, op, module):")?;
            for block in &self.top_live {
                let a = &block.attribution;
                writeln!(
                    f,
                    "    {} {} op {} module {}",
                    b(block.size),
                    a.category_or_unknown(),
                    a.op.as_deref().unwrap_or("-"),
                    a.module.as_deref().unwrap_or("-")
                )?;
            }
        } else {
            writeln!(
                f,
                "  what filled it: not known; record the allocation history \
                 (kiln_device::record_memory_history(device, true, 100000), or `train \
                 --memory-history`) to list the largest live tensors by category and module."
            )?;
        }
        if let Some(p) = &self.plan {
            write!(
                f,
                "  the memory plan ({}) predicted a peak of {} allocated",
                p.label,
                b(p.peak_allocated)
            )?;
            for (c, bytes) in &p.by_category {
                write!(f, ", {c} {}", b(*bytes))?;
            }
            writeln!(
                f,
                "; allocated at the failure is {} (plus this request).",
                b(self.allocated)
            )?;
        }
        Ok(())
    }
}

impl CachingAllocator {
    /// Registers (or clears) what a memory plan predicted for the coming steps; the
    /// out-of-memory report prints it.
    pub fn set_plan_prediction(&self, prediction: Option<PlanPrediction>) {
        self.lock().plan_prediction = prediction.map(Box::new);
    }

    /// The registered plan prediction.
    pub fn plan_prediction(&self) -> Option<PlanPrediction> {
        self.lock().plan_prediction.as_deref().cloned()
    }
}
