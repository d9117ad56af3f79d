//! `cargo xtask memviz SNAPSHOT [-o OUT.svg] [--device N]`: draws kiln's memory picture (allocated
//! bytes over time stacked by category, the peak marked, the largest blocks at the peak listed
//! by module) for any memory snapshot pickle: kiln's `memory_snapshot.pickle`, or one
//! `torch.cuda.memory._dump_snapshot` wrote (its frames' first entry then stands in for the
//! module). The device is the one with the most events unless `--device` names one.

use kiln::alloc::snapshot_read::read_snapshot_file;
use kiln::alloc::timeline::MemoryTimeline;
use kiln::memory_picture::write_memory_svg;
use std::path::PathBuf;

const USAGE: &str = "usage: cargo xtask memviz SNAPSHOT.pickle [-o OUT.svg] [--device N]";

pub fn run(args: &[String]) -> Result<(), String> {
    let mut input = None;
    let mut output = None;
    let mut device = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" | "--output" => {
                output = Some(PathBuf::from(
                    it.next()
                        .ok_or_else(|| format!("{a} needs a path\n{USAGE}"))?,
                ))
            }
            "--device" => {
                let v = it
                    .next()
                    .ok_or_else(|| format!("--device needs an index\n{USAGE}"))?;
                device = Some(
                    v.parse::<usize>()
                        .map_err(|_| format!("--device {v}: not an index\n{USAGE}"))?,
                );
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other if input.is_none() && !other.starts_with('-') => {
                input = Some(PathBuf::from(other))
            }
            other => return Err(format!("unexpected argument `{other}`\n{USAGE}")),
        }
    }
    let input = input.ok_or_else(|| format!("no snapshot given\n{USAGE}"))?;
    let output = output.unwrap_or_else(|| input.with_extension("svg"));
    let summary = render(&input, &output, device)?;
    println!("{summary}");
    Ok(())
}

/// Draws `input` into `output`; returns a one-line summary.
pub fn render(
    input: &std::path::Path,
    output: &std::path::Path,
    device: Option<usize>,
) -> Result<String, String> {
    let snapshot = read_snapshot_file(input).map_err(|e| e.to_string())?;
    let device = device.unwrap_or_else(|| snapshot.busiest_device());
    let events = snapshot.device_traces.get(device).ok_or_else(|| {
        format!(
            "{}: no trace for device {device} (the snapshot has {} device traces)",
            input.display(),
            snapshot.device_traces.len()
        )
    })?;
    let timeline = MemoryTimeline::from_events(events, 0);
    let name = input.file_name().map_or_else(
        || input.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let title = format!("{name}: device {device}, {} events", events.len());
    write_memory_svg(output, Some((&timeline, &title)), &[]).map_err(|e| e.to_string())?;
    Ok(format!(
        "wrote {}: {} events, peak {} bytes allocated, {} categories{}",
        output.display(),
        events.len(),
        timeline.peak_bytes(),
        timeline.by_category.len(),
        if timeline.unexplained > 0 {
            format!(
                ", {} points where the categories miss bytes (dropped events?)",
                timeline.unexplained
            )
        } else {
            String::new()
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memviz_draws_the_committed_snapshot_fixture() {
        let root = crate::paths::workspace_root();
        let input = root.join("crates/alloc-cache/tests/fixtures/memory_viz/kiln_snapshot.pickle");
        let out = std::env::temp_dir().join(format!("kiln-memviz-{}.svg", std::process::id()));
        let summary = render(&input, &out, None).unwrap();
        assert!(
            summary.contains("8 events, peak 3584 bytes allocated, 3 categories"),
            "{summary}"
        );
        let svg = std::fs::read_to_string(&out).unwrap();
        std::fs::remove_file(&out).unwrap();
        assert_eq!(
            svg.matches("<polygon").count(),
            3,
            "parameter, activation, temporary"
        );
        assert!(svg.contains("2.0 KiB (no module) add [temporary]"), "{svg}");
        assert!(svg.contains("kiln_snapshot.pickle: device 1, 8 events"));
        let err = render(&input, &out, Some(5)).unwrap_err();
        assert!(err.contains("no trace for device 5"), "{err}");
    }
}
