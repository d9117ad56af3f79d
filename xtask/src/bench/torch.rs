//! PyTorch's side of `--vs-torch` (issue 16): runs the cases of one group in PyTorch, in the
//! same run, through `xtask/torch_bench.py` (embedded in the binary and fed to the interpreter
//! on standard input), and turns each kiln figure into a row against PyTorch's.
//!
//! The interpreter is `$KILN_TORCH_PYTHON`, else `python3`. Nothing here is needed by a test or
//! CI: without `--vs-torch` nothing is run; with it and no PyTorch, every comparison row still
//! appears, with kiln's figure, a `null` ratio and the reason PyTorch's figure is missing.
//!
//! Each PyTorch case runs right after kiln's figure of it ([`Pairs`]), in an interpreter of its
//! own: on a shared machine whose speed drifts by tens of percent within minutes, running every
//! kiln case and then every PyTorch case put minutes between the two figures of a ratio.
//!
//! Invariants: a case id (`NAME` or `NAME/ARG`) means the same model, batch and optimizer on
//! both sides; `ratio >= 1` means kiln is better (PyTorch's time over kiln's, or kiln's rate over
//! PyTorch's); a missing figure never fails the run.

use super::harness::Row;
use std::collections::HashMap;
use std::io::Write as _;
use std::process::{Child, Command, Stdio};

/// The script, embedded so the bench runs from any directory.
const SCRIPT: &str = include_str!("../../torch_bench.py");
/// The variable naming the Python interpreter with `torch`.
pub const PYTHON_VAR: &str = "KILN_TORCH_PYTHON";

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
}

/// PyTorch's figures for one group's cases, or why there are none.
#[derive(Debug)]
pub struct TorchSide {
    /// `torch` version and thread count, for the reference column.
    about: String,
    /// Case id -> PyTorch's figure, or that case's error.
    figures: Result<HashMap<String, Result<f64, String>>, String>,
}

/// The interpreter to run: `$KILN_TORCH_PYTHON` when set and not empty, else `python3`.
fn python() -> String {
    std::env::var(PYTHON_VAR)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_string())
}

/// Runs `cases` in PyTorch (`quick`: the script's short timings).
pub fn measure(cases: &[String], quick: bool) -> TorchSide {
    let python = python();
    eprintln!("bench: PyTorch side: {python} ({} case(s))", cases.len());
    match run_script(&python, cases, quick) {
        Ok(side) => side,
        Err(why) => {
            eprintln!("bench: PyTorch side missing: {why}");
            TorchSide {
                about: String::new(),
                figures: Err(why),
            }
        }
    }
}

fn run_script(python: &str, cases: &[String], quick: bool) -> Result<TorchSide, String> {
    let mut cmd = Command::new(python);
    cmd.arg("-");
    if quick {
        cmd.arg("--quick");
    }
    let mut child = cmd
        .args(cases)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!("cannot run `{python}` ({e}); set {PYTHON_VAR} to a Python with torch")
        })?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(SCRIPT.as_bytes())
        .map_err(|e| format!("writing the script to `{python}`: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for `{python}`: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap_or("").trim();
        return Err(if last.contains("No module named 'torch'") {
            format!("`{python}` has no torch module; set {PYTHON_VAR} to a Python with torch")
        } else {
            format!("`{python}` failed ({}): {last}", out.status)
        });
    }
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// Reads the script's JSON object (see `torch_bench.py`).
fn parse(stdout: &str) -> Result<TorchSide, String> {
    let v: serde_json::Value = serde_json::from_str(stdout.trim())
        .map_err(|e| format!("the PyTorch script printed no JSON ({e})"))?;
    let about = format!(
        "PyTorch {} CPU, {} threads",
        v["torch"].as_str().unwrap_or("?"),
        v["threads"].as_u64().unwrap_or(0)
    );
    let cases = v["cases"]
        .as_object()
        .ok_or("the PyTorch script's JSON has no `cases` object")?;
    let figures = cases
        .iter()
        .map(|(id, c)| {
            let figure = match (c["value"].as_f64(), c["error"].as_str()) {
                (Some(v), _) if v.is_finite() && v > 0.0 => Ok(v),
                (_, Some(e)) => Err(e.to_string()),
                _ => Err(format!("no figure in {c}")),
            };
            (id.clone(), figure)
        })
        .collect();
    Ok(TorchSide {
        about,
        figures: Ok(figures),
    })
}

impl TorchSide {
    /// The row comparing kiln's `value` (a [`Figure`]) of case `id` with PyTorch's.
    pub fn row(&self, group: &str, case: &str, id: &str, value: f64, figure: Figure) -> Row {
        let case = format!("{case} vs PyTorch");
        let torch = match &self.figures {
            Err(why) => Err(why.clone()),
            Ok(map) => map
                .get(id)
                .cloned()
                .unwrap_or_else(|| Err(format!("the PyTorch script did not run case `{id}`"))),
        };
        match torch {
            Ok(t) => {
                let ratio = match figure {
                    Figure::Millis => t / value,
                    Figure::Gflops => value / t,
                };
                Row::new(
                    group,
                    case,
                    figure.metric(),
                    value,
                    format!("{}: {t:.3} {} (same run)", self.about, figure.metric()),
                    ratio,
                )
            }
            Err(why) => Row::new(
                group,
                case,
                figure.metric(),
                value,
                format!("PyTorch figure missing: {why}"),
                f64::NAN,
            ),
        }
    }
}

/// Rows comparing kiln with PyTorch, case by case: [`Pairs::add`] measures PyTorch's side of a
/// case as soon as kiln's figure exists (nothing when `--vs-torch` is off).
pub struct Pairs {
    group: &'static str,
    enabled: bool,
    quick: bool,
    rows: Vec<Row>,
}

impl Pairs {
    /// Pairs for `group`; `enabled` is `--vs-torch`, `quick` picks the script's short timings.
    pub fn new(group: &'static str, enabled: bool, quick: bool) -> Self {
        Self {
            group,
            enabled,
            quick,
            rows: Vec::new(),
        }
    }

    /// Runs case `id` in PyTorch now and keeps the row comparing it with kiln's `value`.
    pub fn add(&mut self, case: &str, id: &str, value: f64, figure: Figure) {
        if self.enabled {
            let side = measure(&[id.to_string()], self.quick);
            self.rows
                .push(side.row(self.group, case, id, value, figure));
        }
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

    fn side(json: &str) -> TorchSide {
        parse(json).unwrap()
    }

    #[test]
    fn ratios_favour_kiln_above_one_for_times_and_rates() {
        let s = side(
            r#"{"torch":"2.5","threads":2,"cases":{"a/1":{"value":30.0,"unit":"ms"},
            "m/512":{"value":200.0,"unit":"GFLOP/s"},"bad":{"error":"RuntimeError: x"}}}"#,
        );
        let r = s.row("train", "step a", "a/1", 10.0, Figure::Millis);
        assert_eq!(
            (r.ratio, r.value, r.case.as_str()),
            (3.0, 10.0, "step a vs PyTorch")
        );
        assert!(
            r.reference
                .contains("PyTorch 2.5 CPU, 2 threads: 30.000 ms"),
            "{}",
            r.reference
        );
        let r = s.row("ops", "mm", "m/512", 100.0, Figure::Gflops);
        assert_eq!(r.ratio, 0.5);
        let r = s.row("ops", "bad", "bad", 1.0, Figure::Millis);
        assert!(
            r.ratio.is_nan() && r.reference.contains("RuntimeError: x"),
            "{}",
            r.reference
        );
        let r = s.row("ops", "absent", "nope", 1.0, Figure::Millis);
        assert!(
            r.reference.contains("did not run case `nope`"),
            "{}",
            r.reference
        );
    }

    /// Without `--vs-torch` the pairs run nothing (no interpreter is started: one would
    /// print `bench: PyTorch side`) and add no row.
    #[test]
    fn pairs_without_vs_torch_add_no_rows() {
        let mut pairs = Pairs::new("train", false, true);
        pairs.add("step", "resnet18_cifar_step/4", 5.0, Figure::Millis);
        pairs.add("matmul", "matmul/512", 100.0, Figure::Gflops);
        assert!(pairs.into_rows().is_empty());
    }

    #[test]
    fn without_python_every_row_says_why_and_keeps_kilns_figure() {
        let why = run_script("/nonexistent/python-for-kiln", &["a".into()], true).unwrap_err();
        let s = TorchSide {
            about: String::new(),
            figures: Err(why),
        };
        let r = s.row("train", "step", "a", 5.0, Figure::Millis);
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
            serde_json::to_value(&r).unwrap()["ratio"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn a_script_without_json_is_an_error_not_a_panic() {
        assert!(parse("Traceback").unwrap_err().contains("no JSON"));
        assert!(parse("{}").unwrap_err().contains("no `cases`"));
    }
}
