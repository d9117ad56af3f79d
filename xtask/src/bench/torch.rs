//! PyTorch's side of `--vs-torch` (issue 16): runs a group's cases in PyTorch in the same run,
//! through `xtask/torch_bench.py` (embedded in the binary and passed to the interpreter with
//! `-c`), and turns each pair of figures into a row.
//!
//! The interpreter is `$KILN_TORCH_PYTHON`, else `python3`. Nothing here is needed by a test or
//! CI: without `--vs-torch` nothing is run; with it and no PyTorch, every comparison row still
//! appears, with kiln's figure, a `null` ratio and the reason PyTorch's figure is missing.
//!
//! The two sides alternate ([`Pairs::add`]): one interpreter per case sets the case up once,
//! then each round measures kiln's figure and, right after it, PyTorch's. On a shared machine
//! whose speed and memory bandwidth drift by tens of percent within seconds, a ratio of figures
//! taken minutes (or even one setup) apart measures the drift as much as the two libraries; the
//! median of per-round ratios measures them side by side.
//!
//! Invariants: a case id (`NAME` or `NAME/ARG`) means the same model, batch and optimizer on
//! both sides; `ratio >= 1` means kiln is better (PyTorch's time over kiln's, or kiln's rate over
//! PyTorch's); a missing PyTorch figure never fails the run, and a PyTorch interpreter never
//! outlives its case.

use super::harness::{Options, Row};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

/// The script, embedded so the bench runs from any directory.
const SCRIPT: &str = include_str!("../../torch_bench.py");
/// The variable naming the Python interpreter with `torch`.
pub const PYTHON_VAR: &str = "KILN_TORCH_PYTHON";
/// glibc's settings for `--torch-steady-malloc`. PyTorch's CPU tensors come from `malloc`, and
/// glibc serves a block above its mmap threshold with a fresh mapping that it unmaps on free;
/// the threshold grows only as such blocks are freed, and the heap's top is trimmed back to the
/// system. A training loop then pays page faults for its activations step after step
/// (docs/CPU.md, "Session 39"). Fixed thresholds (32 MiB, glibc's most for the mmap threshold
/// on 64-bit; 1 GiB) keep the freed memory for the next step, which is what PyTorch's
/// performance guide gets from jemalloc or tcmalloc.
pub const TORCH_STEADY_MALLOC: [(&str, &str); 2] = [
    ("MALLOC_MMAP_THRESHOLD_", "33554432"),
    ("MALLOC_TRIM_THRESHOLD_", "1073741824"),
];
/// Rounds of a pair outside `--quick` (one with it): each is one kiln figure and one PyTorch
/// figure, and the row's ratio is their median.
const ROUNDS: usize = 3;
/// The longest the bench waits for one line of the interpreter (its setup, or one round's
/// figure) before it ends the interpreter and reports the case as missing: a hung interpreter
/// never hangs the bench. The slowest case (the contended step) answers in seconds.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(600);

/// What a kiln figure is, which orients the ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    /// A time (lower is better): ratio = PyTorch's / kiln's.
    Millis,
    /// A rate (higher is better): ratio = kiln's / PyTorch's.
    Gflops,
}

impl Figure {
    fn metric(self) -> &'static str {
        match self {
            Figure::Millis => "ms",
            Figure::Gflops => "GFLOP/s",
        }
    }

    /// kiln's `kiln` against PyTorch's `torch`, `>= 1` when kiln is better.
    fn ratio(self, kiln: f64, torch: f64) -> f64 {
        match self {
            Figure::Millis => torch / kiln,
            Figure::Gflops => kiln / torch,
        }
    }
}

/// The interpreter to run: `$KILN_TORCH_PYTHON` when set and not empty, else `python3`.
fn python() -> String {
    std::env::var(PYTHON_VAR)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_string())
}

/// A PyTorch interpreter holding one case set up, measuring it a round at a time (the protocol
/// is at the top of `torch_bench.py`). Dropping it ends the interpreter.
struct TorchCase {
    python: String,
    child: Child,
    stdin: Option<ChildStdin>,
    /// The interpreter's output lines, read on a thread so a wait for one can time out.
    lines: Receiver<String>,
    /// See [`ANSWER_TIMEOUT`].
    timeout: Duration,
    /// Everything the interpreter writes on standard error, read on a thread so a chatty
    /// interpreter never blocks on a full pipe.
    stderr: Option<JoinHandle<String>>,
    /// `torch` version and thread count, for the reference column.
    about: String,
}

impl TorchCase {
    /// Starts `python` on case `id` and waits until it is set up; with `steady_malloc`, glibc
    /// set as [`TORCH_STEADY_MALLOC`] says.
    fn start(
        python: &str,
        id: &str,
        (quick, steady_malloc): (bool, bool),
        timeout: Duration,
    ) -> Result<Self, String> {
        let mut cmd = Command::new(python);
        cmd.arg("-c").arg(SCRIPT);
        if quick {
            cmd.arg("--quick");
        }
        if steady_malloc {
            cmd.envs(TORCH_STEADY_MALLOC);
        }
        let mut child = cmd
            .arg(id)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                format!("cannot run `{python}` ({e}); set {PYTHON_VAR} to a Python with torch")
            })?;
        let (stdin, stdout, mut stderr) =
            match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (Some(i), Some(o), Some(e)) => (i, o, e),
                _ => return Err(format!("`{python}` started without its pipes")),
            };
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut case = TorchCase {
            python: python.to_string(),
            child,
            stdin: Some(stdin),
            lines,
            timeout,
            stderr: Some(stderr),
            about: String::new(),
        };
        let ready = case.answer()?;
        let version = ready["torch"].as_str().unwrap_or("?");
        case.about = match ready["device"].as_str() {
            Some(gpu) => format!("PyTorch {version} on {gpu}"),
            None => format!(
                "PyTorch {version} CPU, {} threads{}",
                ready["threads"].as_u64().unwrap_or(0),
                if steady_malloc {
                    ", glibc keeping freed memory"
                } else {
                    ""
                }
            ),
        };
        Ok(case)
    }

    /// PyTorch's figure of one more round.
    fn round(&mut self) -> Result<f64, String> {
        let asked = self
            .stdin
            .as_mut()
            .map(|stdin| stdin.write_all(b"run\n").and_then(|()| stdin.flush()));
        if let Some(Err(e)) = asked {
            return Err(format!("asking `{}` for a figure: {e}", self.python));
        }
        let answer = self.answer()?;
        match answer["value"].as_f64() {
            Some(v) if v.is_finite() && v > 0.0 => Ok(v),
            _ => Err(format!("no figure in {answer}")),
        }
    }

    /// The interpreter's next JSON line; its `error`, or why there is no line (the last line of
    /// its standard error once it has ended, which names a missing `torch`; or the timeout).
    fn answer(&mut self) -> Result<serde_json::Value, String> {
        match self.lines.recv_timeout(self.timeout) {
            Ok(line) => {
                let v: serde_json::Value = serde_json::from_str(line.trim())
                    .map_err(|e| format!("the PyTorch script printed no JSON ({e}): {line}"))?;
                return match v["error"].as_str() {
                    Some(e) => Err(e.to_string()),
                    None => Ok(v),
                };
            }
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.child.kill();
                return Err(format!(
                    "`{}` gave no answer within {} s and was ended",
                    self.python,
                    self.timeout.as_secs_f64()
                ));
            }
            Err(RecvTimeoutError::Disconnected) => {}
        }
        self.stdin = None;
        let status = self.child.wait();
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let last = stderr.lines().last().unwrap_or("").trim();
        let python = &self.python;
        Err(if last.contains("No module named 'torch'") {
            format!("`{python}` has no torch module; set {PYTHON_VAR} to a Python with torch")
        } else {
            let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            format!("`{python}` ended without a figure ({status}): {last}")
        })
    }
}

impl Drop for TorchCase {
    fn drop(&mut self) {
        // Closing its input ends the interpreter's loop; killing covers one still measuring.
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The row of one pair: kiln's figure, and PyTorch's or why it is missing.
fn pair_row(
    group: &str,
    case: &str,
    figure: Figure,
    kiln: &[f64],
    torch: Result<(&[f64], &str), String>,
) -> Row {
    let case = format!("{case} vs PyTorch");
    let kiln_median = median(kiln);
    match torch {
        Ok((torch, about)) => {
            let mut ratios: Vec<f64> = kiln
                .iter()
                .zip(torch)
                .map(|(&k, &t)| figure.ratio(k, t))
                .collect();
            ratios.sort_by(f64::total_cmp);
            let unit = figure.metric();
            let spread = match ratios.as_slice() {
                [lo, .., hi] => format!(", round ratios {lo:.3}-{hi:.3}"),
                _ => String::new(),
            };
            // The medians' ratio too: with an outlying round it differs from the median
            // round ratio, and a reader dividing the row's two figures should find it printed.
            let torch_median = median(torch);
            let of_medians = figure.ratio(kiln_median, torch_median);
            Row::new(
                group,
                case,
                unit,
                kiln_median,
                format!(
                    "{about}: {torch_median:.3} {unit}, {} round(s) alternating with kiln's \
                     (same run; ratio = median round ratio{spread}; ratio of the medians \
                     {of_medians:.3})",
                    ratios.len()
                ),
                median(&ratios),
            )
        }
        Err(why) => Row::new(
            group,
            case,
            figure.metric(),
            kiln_median,
            format!("PyTorch figure missing: {why}"),
            f64::NAN,
        ),
    }
}

/// The median of `values` (the upper one of an even count; NaN when empty).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Rows comparing kiln with PyTorch, case by case (nothing when `--vs-torch` is off).
pub struct Pairs {
    group: &'static str,
    enabled: bool,
    quick: bool,
    /// `--torch-steady-malloc`.
    steady_malloc: bool,
    python: String,
    /// See [`ANSWER_TIMEOUT`].
    timeout: Duration,
    rows: Vec<Row>,
}

impl Pairs {
    /// Pairs for `group`, run when `--vs-torch` is on; `--quick` picks the script's short
    /// timings and one round per pair.
    pub fn new(group: &'static str, options: &Options) -> Self {
        Self {
            group,
            enabled: options.vs_torch,
            quick: options.quick,
            steady_malloc: options.torch_steady_malloc,
            python: python(),
            timeout: ANSWER_TIMEOUT,
            rows: Vec::new(),
        }
    }

    /// Measures case `id` on both sides in alternation and keeps its row. `first` is kiln's
    /// figure as measured for the group's own rows; `again` measures it afresh (the same
    /// figure, the same way) for each round, right before PyTorch's. Without a PyTorch figure
    /// the row keeps `first` and says why. An error of kiln's is returned.
    pub fn add(
        &mut self,
        case: &str,
        id: &str,
        figure: Figure,
        first: f64,
        mut again: impl FnMut() -> Result<f64, String>,
    ) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        let rounds = if self.quick { 1 } else { ROUNDS };
        eprintln!(
            "bench: PyTorch side of `{id}`: {} ({rounds} round(s))",
            self.python
        );
        let mut kiln = Vec::new();
        let torch = match TorchCase::start(
            &self.python,
            id,
            (self.quick, self.steady_malloc),
            self.timeout,
        ) {
            Err(why) => Err(why),
            Ok(mut t) => {
                let mut figures = Vec::new();
                let mut failed = None;
                for _ in 0..rounds {
                    kiln.push(again()?);
                    match t.round() {
                        Ok(v) => figures.push(v),
                        Err(why) => {
                            failed = Some(why);
                            break;
                        }
                    }
                }
                failed.map_or_else(|| Ok((figures, t.about.clone())), Err)
            }
        };
        let row = match torch {
            Ok((figures, about)) => {
                pair_row(self.group, case, figure, &kiln, Ok((&figures, &about)))
            }
            Err(why) => {
                eprintln!("bench: PyTorch side missing: {why}");
                pair_row(self.group, case, figure, &[first], Err(why))
            }
        };
        self.rows.push(row);
        Ok(())
    }

    /// The rows, in the order the cases were added.
    pub fn into_rows(self) -> Vec<Row> {
        self.rows
    }
}

/// A busy competing process for the contention cases: a shell loop spinning on one core,
/// killed when dropped (the PyTorch script starts the same loop for its side).
pub struct Spinner(Child);

impl Spinner {
    /// Starts the loop.
    pub fn start() -> Result<Self, String> {
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .stdin(Stdio::null())
            .spawn()
            .map(Spinner)
            .map_err(|e| format!("cannot start the competing process (sh): {e}"))
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options of a `--quick` run, with `--vs-torch` when `vs_torch`.
    fn quick(vs_torch: bool) -> Options {
        Options {
            quick: true,
            vs_torch,
            ..Options::default()
        }
    }

    #[test]
    fn ratios_favour_kiln_above_one_and_are_the_median_of_rounds() {
        let about = "PyTorch 2.5 CPU, 2 threads";
        // Times: rounds of 10/30, 20/20, 40/20 ms -> ratios 3, 1, 0.5; median ratio 1.
        let r = pair_row(
            "train",
            "step a",
            Figure::Millis,
            &[10.0, 20.0, 40.0],
            Ok((&[30.0, 20.0, 20.0], about)),
        );
        assert_eq!(
            (r.ratio, r.value, r.case.as_str(), r.metric.as_str()),
            (1.0, 20.0, "step a vs PyTorch", "ms")
        );
        assert!(
            r.reference
                .contains("PyTorch 2.5 CPU, 2 threads: 20.000 ms, 3 round(s)")
                && r.reference.contains("round ratios 0.500-3.000")
                && r.reference.contains("ratio of the medians 1.000"),
            "{}",
            r.reference
        );
        // An outlying round: ratios 1.2, 1.2 and 0.4 (median 1.2), while the medians (kiln
        // 30 ms, PyTorch 12 ms) give 0.4; the row keeps the first and prints the second.
        let r = pair_row(
            "train",
            "step b",
            Figure::Millis,
            &[10.0, 30.0, 30.0],
            Ok((&[12.0, 36.0, 12.0], about)),
        );
        assert_eq!((r.ratio, r.value), (1.2, 30.0));
        assert!(
            r.reference.contains("ratio of the medians 0.400"),
            "{}",
            r.reference
        );
        // Rates: kiln 100 against 200 GFLOP/s is 0.5.
        let r = pair_row("ops", "mm", Figure::Gflops, &[100.0], Ok((&[200.0], about)));
        assert_eq!(r.ratio, 0.5);
        assert!(!r.reference.contains("round ratios"), "{}", r.reference);
    }

    /// Without `--vs-torch` the pairs run nothing (neither an interpreter nor kiln's `again`)
    /// and add no row.
    #[test]
    fn pairs_without_vs_torch_add_no_rows() {
        let mut pairs = Pairs::new("train", &quick(false));
        let never = || -> Result<f64, String> { panic!("measured without --vs-torch") };
        pairs
            .add("step", "resnet18_cifar_step/4", Figure::Millis, 5.0, never)
            .unwrap();
        pairs
            .add("matmul", "matmul/512", Figure::Gflops, 100.0, never)
            .unwrap();
        assert!(pairs.into_rows().is_empty());
    }

    #[test]
    fn without_python_every_row_says_why_and_keeps_kilns_figure() {
        let mut pairs = Pairs::new("train", &quick(true));
        pairs.python = "/nonexistent/python-for-kiln".into();
        pairs
            .add("step", "a", Figure::Millis, 5.0, || Ok(7.0))
            .unwrap();
        let rows = pairs.into_rows();
        let r = &rows[0];
        assert_eq!(r.value, 5.0);
        assert!(r.ratio.is_nan());
        assert!(
            r.reference
                .contains("cannot run `/nonexistent/python-for-kiln`")
                && r.reference.contains(PYTHON_VAR),
            "{}",
            r.reference
        );
        assert_eq!(
            serde_json::to_value(r).unwrap()["ratio"],
            serde_json::Value::Null
        );
    }

    /// An interpreter that ends without answering, or answers with no JSON, gives a reason, not
    /// a hang or a panic (`sh -c SCRIPT ... id` runs the script text as a shell command).
    #[test]
    fn an_interpreter_without_an_answer_is_a_reason() {
        let err = TorchCase::start("true", "a", (true, false), ANSWER_TIMEOUT)
            .err()
            .unwrap();
        assert!(err.contains("ended without a figure"), "{err}");
        let mut pairs = Pairs::new("train", &quick(true));
        pairs.python = "echo".into();
        pairs
            .add("step", "a", Figure::Millis, 5.0, || Ok(7.0))
            .unwrap();
        let rows = pairs.into_rows();
        assert!(
            rows[0].reference.contains("printed no JSON"),
            "{}",
            rows[0].reference
        );
    }

    /// A stand-in interpreter: a shell script of `body` in a fresh directory (removed by the
    /// caller); the directory and the script's path.
    #[cfg(unix)]
    fn stand_in(name: &str, body: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("kiln-torch-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("python");
        std::fs::write(&script, format!("#!/bin/sh\n{body}")).unwrap();
        let mut perms = std::fs::metadata(&script).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&script, perms).unwrap();
        (dir, script)
    }

    /// `--torch-steady-malloc` reaches the interpreter's environment, and the row says so (the
    /// stand-in reports the two variables as its torch version, then answers 14 ms a round).
    #[cfg(unix)]
    #[test]
    fn steady_malloc_sets_the_interpreters_glibc_and_says_so() {
        let body = concat!(
            r#"echo "{\"torch\": \"$MALLOC_MMAP_THRESHOLD_/$MALLOC_TRIM_THRESHOLD_\", \"threads\": 2}""#,
            "\nwhile read line; do echo '{\"value\": 14.0}'; done\n",
        );
        let (dir, script) = stand_in("malloc", body);
        for steady in [false, true] {
            let options = Options {
                torch_steady_malloc: steady,
                ..quick(true)
            };
            let mut pairs = Pairs::new("train", &options);
            pairs.python = script.display().to_string();
            pairs
                .add("step", "a", Figure::Millis, 5.0, || Ok(7.0))
                .unwrap();
            let rows = pairs.into_rows();
            let r = &rows[0];
            assert_eq!(r.ratio, 2.0, "{}", r.reference);
            let values = "PyTorch 33554432/1073741824 CPU, 2 threads, glibc keeping freed memory";
            assert_eq!(r.reference.contains(values), steady, "{}", r.reference);
            assert_eq!(r.reference.contains("glibc"), steady, "{}", r.reference);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An interpreter that never answers is ended after the timeout, and its row says so (`sh
    /// -c SCRIPT ...` fails on the Python text, so the stand-in is a script that just waits).
    #[cfg(unix)]
    #[test]
    fn an_interpreter_that_never_answers_is_ended() {
        let (dir, script) = stand_in("hang", "exec sleep 30\n");
        let started = std::time::Instant::now();
        let mut pairs = Pairs::new("train", &quick(true));
        pairs.python = script.display().to_string();
        pairs.timeout = Duration::from_millis(300);
        pairs
            .add("step", "a", Figure::Millis, 5.0, || Ok(7.0))
            .unwrap();
        let rows = pairs.into_rows();
        assert!(
            rows[0].reference.contains("gave no answer within 0.3 s")
                && rows[0].ratio.is_nan()
                && rows[0].value == 5.0,
            "{}",
            rows[0].reference
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the wait was bounded"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
