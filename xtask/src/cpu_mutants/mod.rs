//! `cargo xtask cpu-mutants [--only TEXT]... [--list]`: plants known bugs in copies of
//! kiln-device's CPU kernels (and of the caching allocator's free-block index and the `.pth`
//! reader), in the paths taken only above a size or for a kind of input (parallel chunks,
//! strided walks, blocks and chunks of long tensors, size classes shared by several sizes, zip64
//! records), and in rules that only some settings or inputs reach (`rules.rs`: parameter groups,
//! the allocator's boundaries, the data loader, the backward engine, DDP and ZeRO, freezing and
//! checkpoint files, the schedulers' and losses' edges; `planned.rs`: the allocator's planned
//! steps) or only a case sized
//! to an exact boundary reaches (`boundaries.rs`: the model of PyTorch's allocator, the sum of
//! the weight gradient's partials), and shows that the test meant to cover each fails.
//!
//! A test whose input is too small or too plain for the path it means to test passes whatever
//! that path computes; only planting a bug there shows the test can fail.
//!
//! Invariants: the source tree is never written: the workspace is mirrored into
//! `target/cpu-mutants/src/` (unchanged files keep their times, so builds stay incremental)
//! and built into `target/cpu-mutants/target/`; a replacement whose text does not occur exactly
//! once in the real file is an error of the harness; every mutant's test must first pass on the
//! unmutated copy (else a failure proves nothing); the task fails unless every planted bug made
//! its test fail.

mod backward;
mod boundaries;
mod list;
mod planned;
mod rules;

use list::Mutant;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Every planted bug, in the order they run.
fn all() -> impl Iterator<Item = &'static Mutant> {
    list::MUTANTS
        .iter()
        .chain(rules::MUTANTS)
        .chain(backward::MUTANTS)
        .chain(planned::MUTANTS)
        .chain(boundaries::MUTANTS)
}

/// The harness's error when `m`'s text does not occur exactly once in its file.
fn check_anchor(root: &Path, m: &Mutant) -> Result<(), String> {
    let n = read(&root.join(m.file))?.matches(m.find).count();
    if n != 1 {
        return Err(format!(
            "cpu-mutants: `{}` occurs {n} times in {} (bug: {}): the list must name text that \
             occurs exactly once; update the list in xtask/src/cpu_mutants/",
            m.find, m.file, m.bug
        ));
    }
    Ok(())
}

/// Runs the task.
pub fn run(argv: &[String]) -> Result<(), String> {
    let mut only: Vec<String> = Vec::new();
    let mut list_only = false;
    let mut args = argv.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--only" => only.push(args.next().cloned().ok_or("`--only` needs a value")?),
            "--list" => list_only = true,
            other => return Err(format!("cpu-mutants: unknown argument `{other}`")),
        }
    }
    let chosen: Vec<&Mutant> = all()
        .filter(|m| only.is_empty() || only.iter().any(|o| m.bug.contains(o.as_str())))
        .collect();
    if chosen.is_empty() {
        return Err(format!("cpu-mutants: no bug matches {only:?} (see --list)"));
    }
    if list_only {
        for m in &chosen {
            println!("{}  [{} -> {}]", m.bug, m.file, m.test);
        }
        return Ok(());
    }
    let root = crate::paths::workspace_root();
    let work = crate::paths::target_dir(&root).join("cpu-mutants");
    let copy = work.join("src");
    for m in &chosen {
        check_anchor(&root, m)?;
    }
    let started = Instant::now();
    for part in ["Cargo.toml", "Cargo.lock", "crates", "xtask"] {
        mirror(&root.join(part), &copy.join(part))?;
    }
    let target = work.join("target");
    eprintln!("cpu-mutants: every test on the unmutated copy first");
    let mut tests: Vec<(&str, &[&str], &str)> = chosen
        .iter()
        .map(|m| (m.package, m.target, m.test))
        .collect();
    tests.sort();
    tests.dedup();
    for (package, t, test) in &tests {
        let (ok, log) = cargo_test(&copy, &target, package, t, test)?;
        if !ok || !log.contains(&format!("test {test} ... ok")) {
            return Err(format!(
                "cpu-mutants: `{test}` ({}) did not pass on the unmutated copy:\n{}",
                t.join(" "),
                tail(&log, 30)
            ));
        }
    }
    let mut failures = Vec::new();
    println!("| # | planted bug | file | caught by |");
    println!("|---|---|---|---|");
    for (i, m) in chosen.iter().enumerate() {
        eprintln!("cpu-mutants: [{}/{}] {}", i + 1, chosen.len(), m.bug);
        let file = copy.join(m.file);
        let clean = read(&root.join(m.file))?;
        write(&file, &clean.replacen(m.find, m.replace, 1))?;
        let outcome = cargo_test(&copy, &target, m.package, m.target, m.test);
        write(&file, &clean)?;
        let (_, log) = outcome?;
        let verdict = if log.contains(&format!("test {} ... FAILED", m.test)) {
            format!("`{}`", m.test)
        } else if log.contains("error: could not compile") {
            failures.push(m.bug);
            "NOT CAUGHT: the planted copy did not compile".to_string()
        } else {
            failures.push(m.bug);
            "NOT CAUGHT".to_string()
        };
        println!("| {} | {} | {} | {verdict} |", i + 1, m.bug, m.file);
    }
    println!(
        "\ncpu-mutants: {} of {} planted bugs caught (each test passed unmutated first); {:.0} s",
        chosen.len() - failures.len(),
        chosen.len(),
        started.elapsed().as_secs_f64()
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "cpu-mutants: {} planted bugs no test caught:\n  {}",
            failures.len(),
            failures.join("\n  ")
        ))
    }
}

/// `cargo test -p <package> <target> -- <test> --exact` in the copy: (passed, output).
fn cargo_test(
    copy: &Path,
    target: &Path,
    package: &str,
    t: &[&str],
    test: &str,
) -> Result<(bool, String), String> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(copy)
        .env("CARGO_TARGET_DIR", target)
        .args(["test", "-p", package])
        .args(t)
        .args(["--", test, "--exact"])
        .output()
        .map_err(|e| format!("cpu-mutants: could not run cargo: {e}"))?;
    let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
    log.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), log))
}

/// Makes `dst` hold exactly `src`'s files (a file or a folder), skipping `target` folders;
/// files whose bytes are already equal are left alone, so their times do not change.
fn mirror(src: &Path, dst: &Path) -> Result<(), String> {
    if src.is_file() {
        let bytes = std::fs::read(src).map_err(|e| format!("read {}: {e}", src.display()))?;
        if std::fs::read(dst).ok().as_deref() != Some(&bytes[..]) {
            if let Some(parent) = dst.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("create {}: {e}", parent.display()))?;
            }
            std::fs::write(dst, bytes).map_err(|e| format!("write {}: {e}", dst.display()))?;
        }
        return Ok(());
    }
    let names = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    for stale in names(dst) {
        let name = stale.file_name().unwrap_or_default();
        if !src.join(name).exists() {
            let _ = std::fs::remove_dir_all(&stale).or_else(|_| std::fs::remove_file(&stale));
        }
    }
    for entry in names(src) {
        let name = entry.file_name().unwrap_or_default();
        if name != "target" {
            mirror(&entry, &dst.join(name))?;
        }
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cpu-mutants: read {}: {e}", path.display()))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cpu-mutants: write {}: {e}", path.display()))
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change to a file can leave a planted bug's text behind; the list is checked here, in
    /// CI's tests, rather than only when someone runs the task.
    #[test]
    fn every_planted_bug_names_text_that_occurs_once() {
        let root = crate::paths::workspace_root();
        let stale: Vec<String> = all().filter_map(|m| check_anchor(&root, m).err()).collect();
        assert!(stale.is_empty(), "{}", stale.join("\n"));
    }
}
