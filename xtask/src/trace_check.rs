//! `cargo xtask record-traces --check`: records the traces of record again in memory and
//! compares them with the shipped files line by line, so a change of the models, autograd or
//! the CPU kernels' scratch cannot leave the traces (and the figures quoted from them) behind
//! unnoticed. The CPU-scale runs take seconds each; the GPU-scale ones are checked only when
//! named with `--only`, since they take minutes.

use std::path::Path;
use std::time::Instant;

/// `--check`: records each run of `names` again with `record` and compares it with its file
/// in `dir` (`NAME.trace`), line by line.
pub(crate) fn check_runs<'a>(
    dir: &Path,
    names: impl IntoIterator<Item = &'a str>,
    record: impl Fn(&str) -> Result<String, String>,
) -> Result<(), String> {
    let mut stale = Vec::new();
    for name in names {
        let path = dir.join(format!("{name}.trace"));
        let shipped = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "{}: {e}; record it with `KILN_NUM_THREADS=1 KILN_CPU_CAPABILITY=avx2 cargo \
                 xtask record-traces --only {name}`",
                path.display()
            )
        })?;
        let start = Instant::now();
        let now = record(name)?;
        match first_difference(&shipped, &now) {
            None => println!(
                "record-traces --check: {name} is what the code allocates ({:.1} s)",
                start.elapsed().as_secs_f64()
            ),
            Some(line) => stale.push(format!("{}: {line}", path.display())),
        }
    }
    if stale.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the traces of record no longer match what the code allocates:\n  {}\nRecord all of them \
         again (`KILN_NUM_THREADS=1 KILN_CPU_CAPABILITY=avx2 cargo xtask record-traces`; the \
         GPU-scale runs take minutes) and update the figures quoted from them (docs/ARCHITECTURE.md, \
         crates/alloc-cache/tests)",
        stale.join("\n  ")
    ))
}

/// Where two recordings first differ (`line N: file `...`, now `...``), or `None` if equal.
fn first_difference(shipped: &str, now: &str) -> Option<String> {
    let mut a = shipped.lines();
    let mut b = now.lines();
    let mut n = 0usize;
    loop {
        n += 1;
        match (a.next(), b.next()) {
            (None, None) => return None,
            (x, y) if x == y => continue,
            (x, y) => {
                let shown =
                    |l: Option<&str>| l.map_or("(end of file)".to_string(), |l| format!("`{l}`"));
                return Some(format!("line {n}: file {}, now {}", shown(x), shown(y)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_runs_names_every_stale_file_and_passes_equal_ones() {
        let dir = std::env::temp_dir().join(format!("kiln-trace-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.trace"), "# a\na 1 8\nf 1\n").unwrap();
        std::fs::write(dir.join("b.trace"), "# b\na 1 8\nf 1\n").unwrap();
        let same = |name: &str| Ok(format!("# {name}\na 1 8\nf 1\n"));
        assert_eq!(check_runs(&dir, ["a", "b"], same), Ok(()));
        let b_grew = |name: &str| {
            Ok(match name {
                "b" => "# b\na 1 16\nf 1\n".to_string(),
                _ => format!("# {name}\na 1 8\nf 1\n"),
            })
        };
        let e = check_runs(&dir, ["a", "b"], b_grew).unwrap_err();
        assert!(
            e.contains("b.trace: line 2: file `a 1 8`, now `a 1 16`"),
            "{e}"
        );
        assert!(!e.contains("a.trace"), "{e}");
        assert!(e.contains("cargo xtask record-traces"), "{e}");
        // A run without a shipped file, and a recording that fails, are errors too.
        let e = check_runs(&dir, ["c"], same).unwrap_err();
        assert!(
            e.contains("c.trace") && e.contains("record-traces --only c"),
            "{e}"
        );
        let e = check_runs(&dir, ["a"], |_| Err("no allocator".to_string())).unwrap_err();
        assert_eq!(e, "no allocator");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn first_difference_names_the_line_and_both_texts() {
        assert_eq!(first_difference("# h\na 1 8\n", "# h\na 1 8\n"), None);
        assert_eq!(
            first_difference("# h\na 1 8\nf 1\n", "# h\na 1 16\nf 1\n").as_deref(),
            Some("line 2: file `a 1 8`, now `a 1 16`")
        );
        assert_eq!(
            first_difference("a 1 8\n", "a 1 8\nf 1\n").as_deref(),
            Some("line 2: file (end of file), now `f 1`")
        );
    }
}
