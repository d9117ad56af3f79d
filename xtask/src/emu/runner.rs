//! Runs one built binary under the emulator: its own log file, a time limit, and the libtest
//! counts read back from its output.
//!
//! Invariants: a run never outlives its limit (the child is killed and the run counts as
//! failed); stdout and stderr go, interleaved, to one log file, which is the only record of
//! the run; counts come only from libtest's `test result:` lines, so a binary that printed none
//! (it crashed, or it is an example) has none.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::build::Built;
use super::Emulator;

/// One run: what to run and how.
pub struct Run<'a> {
    /// The binary.
    pub built: &'a Built,
    /// Its arguments (test filters, `--exact`, example flags).
    pub args: Vec<String>,
    /// Extra variables (on top of the emulator's and `KILN_REQUIRE_CUDA=1`).
    pub env: Vec<(String, String)>,
    /// The log file.
    pub log: PathBuf,
    /// The time limit.
    pub limit: Duration,
}

/// What came of a run.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Exit code (128 + signal when killed; `None` when the limit was hit).
    pub code: Option<i32>,
    /// Wall time.
    pub seconds: f64,
    /// Tests passed, over every `test result:` line.
    pub passed: usize,
    /// Tests failed, over every `test result:` line.
    pub failed: usize,
    /// The log's text.
    pub log: String,
}

impl Outcome {
    /// True when the binary exited 0 in time.
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// The last `lines` lines of the log.
    pub fn tail(&self, lines: usize) -> String {
        let all: Vec<&str> = self.log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// Runs `run` under `emulator` with `KILN_REQUIRE_CUDA=1`, from the binary's package folder.
pub fn run(emulator: &Emulator, run: &Run) -> Result<Outcome, String> {
    if let Some(dir) = run.log.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let log = std::fs::File::create(&run.log)
        .map_err(|e| format!("cannot create {}: {e}", run.log.display()))?;
    let log_err = log
        .try_clone()
        .map_err(|e| format!("cannot reopen {}: {e}", run.log.display()))?;
    let mut command = emulator.command(&run.built.path);
    command
        .args(&run.args)
        .current_dir(&run.built.package_dir)
        .env("CARGO_MANIFEST_DIR", &run.built.package_dir)
        .env("KILN_REQUIRE_CUDA", "1")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    for (key, value) in &run.env {
        command.env(key, value);
    }
    let start = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", run.built.path.display()))?;
    let code = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(super::exit_code(status)),
            Ok(None) if start.elapsed() >= run.limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("cannot wait for {}: {e}", run.built.name())),
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    let mut text = std::fs::read_to_string(&run.log).unwrap_or_default();
    if code.is_none() {
        text.push_str(&format!(
            "\nxtask: killed after {:.0} s (the limit)\n",
            run.limit.as_secs_f64()
        ));
        let _ = std::fs::write(&run.log, &text);
    }
    let (passed, failed) = test_counts(&text);
    Ok(Outcome {
        code,
        seconds,
        passed,
        failed,
        log: text,
    })
}

/// Passed and failed counts summed over libtest's `test result: ... N passed; M failed; ...`.
pub fn test_counts(log: &str) -> (usize, usize) {
    let mut totals = (0, 0);
    for line in log.lines().filter(|l| l.starts_with("test result:")) {
        let count = |word: &str| -> usize {
            line.split(';')
                .filter_map(|part| part.trim().rsplit_once(' '))
                .find(|(_, w)| *w == word)
                .and_then(|(n, _)| n.rsplit(' ').next()?.parse().ok())
                .unwrap_or(0)
        };
        totals.0 += count("passed");
        totals.1 += count("failed");
    }
    totals
}

/// The time limit per binary: `$KILN_EMU_TIMEOUT_S` seconds, else `default_s`.
pub fn limit(default_s: u64) -> Duration {
    let seconds = std::env::var("KILN_EMU_TIMEOUT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_s);
    Duration::from_secs(seconds)
}

/// `target/cuda-emu/<what>/` under the workspace's target folder.
pub fn out_dir(what: &str) -> PathBuf {
    let root = crate::paths::workspace_root();
    crate::paths::target_dir(&root).join("cuda-emu").join(what)
}

/// A log path `<dir>/<name>.log` with characters a file name should not hold replaced.
pub fn log_path(dir: &Path, name: &str) -> PathBuf {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("{clean}.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_over_result_lines() {
        let log = "running 3 tests\n\
                   test a ... ok\n\
                   test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.1s\n\
                   test result: FAILED. 5 passed; 2 failed; 0 ignored; 0 measured; 4 filtered out; finished in 2s\n";
        assert_eq!(test_counts(log), (8, 2));
        assert_eq!(test_counts("Segmentation fault"), (0, 0));
    }

    #[test]
    fn log_names_are_plain() {
        assert_eq!(
            log_path(Path::new("/l"), "kiln-device--test-cuda_ops/x y"),
            PathBuf::from("/l/kiln-device--test-cuda_ops_x_y.log")
        );
    }
}
