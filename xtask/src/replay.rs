//! `cargo xtask replay FILE [--mode default|expandable] [--policy kiln|pytorch]
//! [--page-stitching] [--capacity BYTES] [--page-size BYTES]`: replays an allocation trace
//! through the caching allocator (or the model of PyTorch's allocator) on a simulated device
//! and prints one JSON object (events, peak_live_bytes, peak_reserved_bytes,
//! reserved_over_live, device_allocs, device_frees, alloc_retries, ooms).

use kiln_alloc_cache::replay::DEFAULT_REPLAY_PAGE;
use kiln_alloc_cache::{replay_with, AllocatorConfig, ReplayMode, ReplayPolicy, Replayer, Trace};

const USAGE: &str = "usage: cargo xtask replay FILE [--mode default|expandable] [--policy kiln|pytorch] [--page-stitching] [--capacity BYTES] [--page-size BYTES]
  --policy pytorch replays under a model of PyTorch's CUDA caching allocator (default kiln)
  --page-stitching replays kiln's expandable segments with page_stitching on (needs --mode
    expandable and the kiln policy)
  --capacity accepts bytes or a KiB/MiB/GiB suffix (default 80GiB)
  --page-size is the simulated device's page, a multiple of 512 bytes (default 2MiB, CUDA's;
    kiln's policy only)";

/// Parses `123`, `16MiB`, `80GiB`, `512KiB`.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let shift = match unit {
        "" | "B" => 0,
        "KiB" | "K" => 10,
        "MiB" | "M" => 20,
        "GiB" | "G" => 30,
        "TiB" | "T" => 40,
        _ => {
            return Err(format!(
                "`{text}`: unknown unit `{unit}`; use bytes or KiB/MiB/GiB/TiB"
            ))
        }
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a byte count like 80GiB"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` overflows"))
}

/// Runs the subcommand.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut file = None;
    let mut mode = ReplayMode::Default;
    let mut policy = ReplayPolicy::Kiln;
    let mut capacity = kiln_alloc_cache::replay::DEFAULT_REPLAY_CAPACITY;
    let mut stitching = false;
    let mut page = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--mode" => mode = value("--mode")?.parse().map_err(|e| format!("{e}"))?,
            "--policy" => policy = value("--policy")?.parse().map_err(|e| format!("{e}"))?,
            "--capacity" => capacity = parse_bytes(&value("--capacity")?)?,
            "--page-stitching" => stitching = true,
            "--page-size" => page = Some(parse_bytes(&value("--page-size")?)?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            flag if flag.starts_with("--") => {
                return Err(format!("unknown flag `{flag}`\n{USAGE}"))
            }
            path if file.is_none() => file = Some(path.to_string()),
            extra => return Err(format!("unexpected argument `{extra}`\n{USAGE}")),
        }
    }
    let file = file.ok_or_else(|| format!("no trace file given\n{USAGE}"))?;
    let trace = Trace::read(&file).map_err(|e| format!("{file}: {e}"))?;
    let config = match mode {
        ReplayMode::Default if stitching => {
            return Err(format!(
                "--page-stitching moves pages of kiln's expandable segments: add --mode \
                 expandable\n{USAGE}"
            ))
        }
        ReplayMode::Default => AllocatorConfig::default(),
        ReplayMode::Expandable => AllocatorConfig {
            page_stitching: stitching,
            ..AllocatorConfig::expandable()
        },
    };
    let report = match policy {
        ReplayPolicy::Kiln => {
            let page = page.unwrap_or(DEFAULT_REPLAY_PAGE);
            Replayer::with_page(config, capacity, page).and_then(|mut r| {
                r.run(&trace)?;
                Ok(r.report())
            })
        }
        ReplayPolicy::PyTorch if stitching || page.is_some() => {
            return Err(format!(
                "--page-stitching and --page-size apply to kiln's allocator: drop --policy \
                 pytorch (the model of PyTorch's allocator has no stitching and maps its own \
                 2 MiB / 20 MiB chunks)\n{USAGE}"
            ))
        }
        ReplayPolicy::PyTorch => replay_with(&trace, policy, mode, capacity),
    }
    .map_err(|e| format!("{file}: {e}"))?;
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_bytes, run};

    #[test]
    fn flags_that_do_not_go_together_are_refused_with_the_reason() {
        let path = std::env::temp_dir().join(format!("kiln-replay-{}.trace", std::process::id()));
        std::fs::write(&path, "a 1 3000000\na 2 100\nf 1\nf 2\n").unwrap();
        let file = path.display().to_string();
        let args = |extra: &[&str]| -> Vec<String> {
            std::iter::once(file.as_str())
                .chain(extra.iter().copied())
                .map(String::from)
                .collect()
        };
        let cases: [(&[&str], &str); 4] = [
            (
                &["--policy", "pytorch", "--page-size", "64KiB"],
                "apply to kiln's allocator",
            ),
            (&["--page-stitching"], "add --mode expandable"),
            (&["--page-size", "1000"], "multiple of 512"),
            (&["--page-size"], "--page-size needs a value"),
        ];
        for (extra, needle) in cases {
            let e = run(&args(extra)).unwrap_err();
            assert!(e.contains(needle), "{extra:?}: {e}");
        }
        for extra in [
            &[
                "--mode",
                "expandable",
                "--page-stitching",
                "--page-size",
                "64KiB",
            ][..],
            &["--policy", "pytorch", "--mode", "expandable"][..],
        ] {
            run(&args(extra)).unwrap();
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn byte_counts_with_and_without_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(parse_bytes("80GiB"), Ok(80 << 30));
        assert_eq!(parse_bytes("2K"), Ok(2048));
        assert!(parse_bytes("3 GB").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("GiB").unwrap_err().contains("not a byte count"));
    }
}
