//! kiln's memory picture, `memory.svg`: (top) one training step's allocated bytes over time,
//! stacked by category, the peak marked and the largest blocks live at the peak listed with
//! their module; (bottom) the allocated / reserved / peak bytes of every epoch. Drawn with
//! kiln-sched's SVG helpers (the plotter behind `metrics.svg`), from kiln-alloc-cache's
//! [`MemoryTimeline`]; no browser needed. `cargo xtask memviz` draws the top half for any
//! snapshot pickle.
//!
//! Invariants: every category keeps one colour in every picture; byte axes use one binary
//! unit (B, KiB, MiB, GiB) chosen from the largest value drawn; an empty history draws the
//! panel's frame with a note saying so, never nothing.

use kiln_alloc_cache::snapshot_pickle::category_name;
use kiln_alloc_cache::timeline::MemoryTimeline;
use kiln_alloc_cache::MemoryCategory;
use kiln_sched::log::svg::{escape, svg_document, write_svg, Plot, Series};
use kiln_sched::log::svg_stack::{Layer, Marker, StackedPlot};
use std::fmt::Write as _;
use std::path::Path;

/// Fill colour of each category.
pub fn category_colour(category: MemoryCategory) -> &'static str {
    match category {
        MemoryCategory::Parameter => "#1f77b4",
        MemoryCategory::Gradient => "#ff7f0e",
        MemoryCategory::OptimizerState => "#2ca02c",
        MemoryCategory::Data => "#8c564b",
        MemoryCategory::Activation => "#d62728",
        MemoryCategory::Temporary => "#9467bd",
        MemoryCategory::Unknown => "#9a9a9a",
    }
}

/// Blocks listed at the peak.
pub const LABELLED_BLOCKS: usize = 6;

/// One epoch's memory figures (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochMemory {
    /// Epoch number, from 1.
    pub epoch: usize,
    /// Allocated after the epoch.
    pub allocated: usize,
    /// Reserved after the epoch.
    pub reserved: usize,
    /// The epoch's peak allocated.
    pub peak: usize,
}

/// The binary unit for byte values up to `max`: (divisor, name).
pub fn byte_unit(max: f64) -> (f64, &'static str) {
    let mut unit = (1.0, "B");
    for (i, name) in ["KiB", "MiB", "GiB", "TiB"].into_iter().enumerate() {
        let d = 1024f64.powi(i as i32 + 1);
        if max >= d {
            unit = (d, name);
        }
    }
    unit
}

fn bytes_text(v: usize) -> String {
    let (d, name) = byte_unit(v as f64);
    if d == 1.0 {
        format!("{v} B")
    } else {
        format!("{:.1} {name}", v as f64 / d)
    }
}

/// The stacked timeline panel of `timeline`, titled `title`.
pub fn step_plot(timeline: &MemoryTimeline, title: &str) -> StackedPlot {
    let max = timeline
        .reserved
        .iter()
        .chain(&timeline.allocated)
        .copied()
        .max()
        .unwrap_or(0);
    let (div, unit) = byte_unit(max as f64);
    let t0 = timeline.times_us.first().copied().unwrap_or(0);
    let x: Vec<f64> = timeline
        .times_us
        .iter()
        .map(|&t| t.saturating_sub(t0) as f64 / 1000.0)
        .collect();
    let layers = timeline
        .by_category
        .iter()
        .map(|(c, values)| Layer {
            label: category_name(*c).replace('_', " "),
            colour: category_colour(*c).to_owned(),
            values: values.iter().map(|&v| v as f64 / div).collect(),
        })
        .collect();
    let reserved = Series {
        label: "reserved".into(),
        points: x
            .iter()
            .zip(&timeline.reserved)
            .map(|(&x, &r)| (x, r as f64 / div))
            .collect(),
    };
    let marker = x.get(timeline.peak).map(|&px| Marker {
        x: px,
        y: timeline.peak_bytes() as f64 / div,
        label: format!("peak {} at {px:.1} ms", bytes_text(timeline.peak_bytes())),
    });
    let notes = timeline
        .live_at_peak
        .iter()
        .take(LABELLED_BLOCKS)
        .map(|b| {
            let a = &b.attribution;
            let module = a.module.as_deref().unwrap_or("(no module)");
            let op = a.op.as_deref().map(|o| format!(" {o}")).unwrap_or_default();
            let cat = category_name(a.category.unwrap_or(MemoryCategory::Unknown));
            format!("{} {module}{op} [{cat}]", bytes_text(b.size))
        })
        .collect();
    StackedPlot {
        title: title.to_owned(),
        x_label: "time in the step (ms)".into(),
        y_label: format!("allocated ({unit})"),
        x,
        layers,
        lines: vec![reserved],
        marker,
        notes_title: "largest blocks at the peak".into(),
        notes,
    }
}

/// The per-epoch panel: allocated, reserved and peak bytes.
pub fn epoch_plot(epochs: &[EpochMemory]) -> Plot {
    let max = epochs
        .iter()
        .map(|e| e.reserved.max(e.peak))
        .max()
        .unwrap_or(0);
    let (div, unit) = byte_unit(max as f64);
    let series = |f: fn(&EpochMemory) -> usize| {
        epochs
            .iter()
            .map(|e| (e.epoch as f64, f(e) as f64 / div))
            .collect()
    };
    Plot::new("memory per epoch")
        .x_label("epoch")
        .y_label(&format!("bytes ({unit})"))
        .series("allocated", series(|e| e.allocated))
        .series("reserved", series(|e| e.reserved))
        .series("peak", series(|e| e.peak))
}

/// Width of the picture in pixels.
pub const WIDTH: f64 = 960.0;
const STEP_HEIGHT: f64 = 420.0;
const EPOCH_HEIGHT: f64 = 280.0;

/// The SVG text of `memory.svg`: the step panel (`None` or an empty timeline: a note), then the
/// epoch panel when `epochs` is not empty.
pub fn memory_svg(step: Option<(&MemoryTimeline, &str)>, epochs: &[EpochMemory]) -> String {
    let mut body = String::new();
    match step {
        Some((t, title)) if !t.times_us.is_empty() => {
            step_plot(t, title).render_into(&mut body, 0.0, 0.0, WIDTH, STEP_HEIGHT)
        }
        other => {
            let title = other.map_or("one training step", |(_, title)| title);
            let _ = writeln!(
                body,
                r##"<g font-family="sans-serif"><text x="{:.0}" y="17" text-anchor="middle" font-size="13" font-weight="bold">{}</text><text x="{:.0}" y="{:.0}" text-anchor="middle" font-size="12" fill="#555555">no allocation history was recorded</text></g>"##,
                WIDTH / 2.0,
                escape(title),
                WIDTH / 2.0,
                STEP_HEIGHT / 2.0
            );
        }
    }
    let mut height = STEP_HEIGHT;
    if !epochs.is_empty() {
        epoch_plot(epochs).render_into(&mut body, 0.0, STEP_HEIGHT, WIDTH, EPOCH_HEIGHT);
        height += EPOCH_HEIGHT;
    }
    svg_document(WIDTH, height, &body)
}

/// Writes [`memory_svg`] to `path`, creating its folder.
pub fn write_memory_svg(
    path: &Path,
    step: Option<(&MemoryTimeline, &str)>,
    epochs: &[EpochMemory],
) -> kiln_sched::Result<()> {
    write_svg(path, &memory_svg(step, epochs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_alloc_cache::{Attribution, MemoryEvent, MemoryEventKind, StreamId};
    use std::sync::Arc;

    fn event(
        kind: MemoryEventKind,
        address: u64,
        size: usize,
        cat: MemoryCategory,
        module: &str,
        after: usize,
    ) -> MemoryEvent {
        MemoryEvent {
            kind,
            address,
            size,
            stream: StreamId::DEFAULT,
            time_us: address * 1000,
            attribution: Attribution {
                category: Some(cat),
                op: Some(Arc::from("conv2d")),
                module: Some(Arc::from(module)),
            },
            allocated_after: after,
            reserved_after: 8 << 20,
        }
    }

    #[test]
    fn the_picture_stacks_categories_marks_the_peak_and_names_the_largest_block() {
        use MemoryCategory::*;
        use MemoryEventKind::*;
        let mib = 1 << 20;
        let events = [
            event(Alloc, 1, mib, Parameter, "fc", mib),
            event(Alloc, 2, 3 * mib, Activation, "layer3.1.conv2", 4 * mib),
            event(FreeCompleted, 2, 3 * mib, Activation, "layer3.1.conv2", mib),
        ];
        let t = MemoryTimeline::from_events(&events, 0);
        let epochs = [
            EpochMemory {
                epoch: 1,
                allocated: mib,
                reserved: 8 * mib,
                peak: 4 * mib,
            },
            EpochMemory {
                epoch: 2,
                allocated: mib,
                reserved: 8 * mib,
                peak: 4 * mib,
            },
        ];
        let svg = memory_svg(Some((&t, "step 2")), &epochs);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<polygon").count(),
            2,
            "parameter and activation"
        );
        assert!(svg.contains("peak 4.0 MiB at 1.0 ms"), "{svg}");
        assert!(svg.contains("3.0 MiB layer3.1.conv2 conv2d [activation]"));
        assert!(svg.contains("allocated (MiB)") && svg.contains("memory per epoch"));
        // Three epoch lines plus the dashed reserved line.
        assert_eq!(svg.matches("<polyline").count(), 4);
        let empty = memory_svg(None, &[]);
        assert!(empty.contains("no allocation history was recorded"));
        assert_eq!(byte_unit(1023.0).1, "B");
        assert_eq!(byte_unit(5.0 * 1024.0 * 1024.0 * 1024.0).1, "GiB");
    }
}
