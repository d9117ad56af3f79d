//! Scalar logging: event files read back by a pure-Rust reader (CRCs verified) and, when
//! Python's `tensorboard` is importable, by TensorBoard's own EventAccumulator; CSV; flushing.

use std::path::PathBuf;
use std::process::Command;

use kiln_sched::log::tfevents::{read_events, read_log_dir, EventBody, FILE_VERSION};
use kiln_sched::log::ScalarLogger;
use kiln_sched::SchedError;

fn scratch(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir =
        std::env::temp_dir().join(format!("kiln-sched-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn loss(step: i64) -> f64 {
    2.5 / (1.0 + 0.1 * step as f64) + 0.001 * (step % 7) as f64
}

fn write_run(dir: &std::path::Path) -> PathBuf {
    let mut log = ScalarLogger::in_memory().tensorboard(dir).unwrap();
    for step in 0..50 {
        log.log_many(
            step,
            &[
                ("train/loss", loss(step)),
                ("lr", 0.1 * 0.95f64.powi(step as i32)),
            ],
        )
        .unwrap();
    }
    log.log("eval/acc", 49, 0.875).unwrap();
    log.event_file().unwrap().to_path_buf()
}

#[test]
fn event_file_reads_back_with_valid_crcs() {
    let dir = scratch("tb");
    let path = write_run(&dir);
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    let events = read_events(&path).unwrap();
    assert_eq!(events.len(), 52, "version + 50 steps + eval");
    assert_eq!(events[0].body, EventBody::FileVersion(FILE_VERSION.into()));
    for (i, e) in events[1..51].iter().enumerate() {
        let step = i as i64;
        assert_eq!(e.step, step);
        assert!(e.wall_time > 1.6e9, "wall time is Unix seconds");
        let want = vec![
            ("train/loss".to_string(), loss(step) as f32),
            ("lr".to_string(), (0.1 * 0.95f64.powi(step as i32)) as f32),
        ];
        assert_eq!(e.body, EventBody::Scalars(want));
    }
    assert_eq!(events[51].step, 49);
    assert_eq!(
        events[51].body,
        EventBody::Scalars(vec![("eval/acc".into(), 0.875)])
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn corrupt_or_truncated_event_files_are_reported() {
    let dir = scratch("corrupt");
    let path = write_run(&dir);
    let good = std::fs::read(&path).unwrap();
    // Flip one byte inside the third record's data.
    let mut bad = good.clone();
    let first_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let second = 16 + first_len;
    bad[second + 14] ^= 0x40;
    std::fs::write(&path, &bad).unwrap();
    match read_events(&path) {
        Err(SchedError::Corrupt { reason, .. }) => {
            assert!(
                reason.contains(&format!("byte {second}")) && reason.contains("data CRC"),
                "{reason}"
            )
        }
        other => panic!("expected a CRC error, got {other:?}"),
    }
    // A crash mid-write leaves a partial last record: reported, not misread.
    std::fs::write(&path, &good[..good.len() - 3]).unwrap();
    match read_events(&path) {
        Err(SchedError::Corrupt { reason, .. }) => {
            assert!(reason.contains("truncated"), "{reason}")
        }
        other => panic!("expected truncation, got {other:?}"),
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn every_logged_step_is_on_disk_before_the_logger_is_dropped() {
    let dir = scratch("flush");
    let mut log = ScalarLogger::in_memory()
        .tensorboard(&dir)
        .unwrap()
        .csv(dir.join("scalars.csv"))
        .unwrap();
    for step in 0..5 {
        log.log("loss", step, step as f64).unwrap();
        // Read while the logger is alive, as after a crash.
        let events = read_events(log.event_file().unwrap()).unwrap();
        assert_eq!(events.len() as i64, step + 2);
        let csv = std::fs::read_to_string(dir.join("scalars.csv")).unwrap();
        assert_eq!(csv.lines().count() as i64, step + 2);
    }
    // With flush_every(3), the rest arrives at the latest on drop.
    let mut log = ScalarLogger::in_memory()
        .tensorboard(dir.join("b"))
        .unwrap()
        .flush_every(3);
    let path = log.event_file().unwrap().to_path_buf();
    log.log("loss", 0, 1.0).unwrap();
    log.log("loss", 1, 1.0).unwrap();
    assert_eq!(read_events(&path).unwrap().len(), 1, "buffered");
    drop(log);
    assert_eq!(read_events(&path).unwrap().len(), 3, "flushed on drop");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn csv_keeps_full_precision_quotes_tags_and_appends() {
    let dir = scratch("csv");
    let path = dir.join("s.csv");
    {
        let mut log = ScalarLogger::in_memory().csv(&path).unwrap();
        log.log("a,b \"q\"", 3, 0.1 + 0.2).unwrap();
        log.log("lr", 4, 1e-300).unwrap();
    }
    {
        // Reopened by a resumed run: appended, no second header.
        let mut log = ScalarLogger::in_memory().csv(&path).unwrap();
        log.log("lr", 5, f64::NAN).unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.splitn(3, ',').collect()).collect();
    assert_eq!(text.lines().next().unwrap(), "wall_time,step,tag,value");
    assert_eq!(text.lines().count(), 4);
    assert_eq!(rows[1][1], "3");
    assert_eq!(rows[1][2], "\"a,b \"\"q\"\"\",0.30000000000000004");
    assert!(text.lines().nth(2).unwrap().ends_with(",4,lr,1e-300"));
    assert!(text.lines().nth(3).unwrap().ends_with(",5,lr,NaN"));
    let v: f64 = rows[1][2].rsplit(',').next().unwrap().parse().unwrap();
    assert_eq!(v, 0.1 + 0.2);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn logger_keeps_series_and_plots_them() {
    let mut log = ScalarLogger::in_memory();
    for step in 0..10 {
        log.log("lr", step, 0.1 / (step + 1) as f64).unwrap();
    }
    assert_eq!(log.series("lr").unwrap()[3], (3, 0.025));
    assert_eq!(log.tags().collect::<Vec<_>>(), vec!["lr"]);
    let svg = log.plot("lr", &["lr"]).unwrap().to_svg(500.0, 300.0);
    assert_eq!(svg.matches("<polyline").count(), 1);
    assert!(matches!(
        log.plot("x", &["nope"]),
        Err(SchedError::InvalidLog { .. })
    ));
    assert!(matches!(
        log.log(" ", 0, 1.0),
        Err(SchedError::InvalidLog { .. })
    ));
}

/// A run killed after logging steps 0..50 whose checkpoint holds step 29, then resumed: its new
/// file purges from step 30 on (PyTorch's `SummaryWriter(purge_step = 30)`) and logs 30..60
/// with other values. Returns the value the resumed run logs at `step`.
fn write_killed_and_resumed_run(dir: &std::path::Path) -> impl Fn(i64) -> f64 {
    write_run(dir);
    let resumed_loss = |step: i64| loss(step) + 1.0;
    // A new event file never takes the old one's name (same second: a `.1` suffix).
    let mut log = ScalarLogger::in_memory()
        .tensorboard_purging(dir, 30)
        .unwrap();
    for step in 30..60 {
        log.log("train/loss", step, resumed_loss(step)).unwrap();
    }
    let resumed_file = log.event_file().unwrap().to_path_buf();
    drop(log);
    let events = read_events(&resumed_file).unwrap();
    assert_eq!(events[0].body, EventBody::FileVersion(FILE_VERSION.into()));
    assert_eq!(
        (events[1].step, &events[1].body),
        (30, &EventBody::SessionStart)
    );
    resumed_loss
}

#[test]
fn a_resumed_run_purges_the_earlier_files_later_steps() {
    let dir = scratch("tbresume");
    let resumed_loss = write_killed_and_resumed_run(&dir);
    let mut loss_steps = Vec::new();
    let mut lr_steps = Vec::new();
    for e in read_log_dir(&dir).unwrap() {
        if let EventBody::Scalars(values) = &e.body {
            for (tag, value) in values {
                match tag.as_str() {
                    "train/loss" => {
                        let want = if e.step < 30 {
                            loss(e.step)
                        } else {
                            resumed_loss(e.step)
                        };
                        assert_eq!(*value, want as f32, "train/loss at {}", e.step);
                        loss_steps.push(e.step);
                    }
                    "lr" => lr_steps.push(e.step),
                    "eval/acc" => panic!("eval/acc at step 49 belongs to the killed epoch"),
                    other => panic!("unexpected tag {other}"),
                }
            }
        }
    }
    assert_eq!(loss_steps, (0..60).collect::<Vec<_>>(), "each step once");
    assert_eq!(lr_steps, (0..30).collect::<Vec<_>>());
    assert!(matches!(
        ScalarLogger::in_memory().tensorboard_purging(&dir, -1),
        Err(SchedError::InvalidLog { .. })
    ));
    std::fs::remove_dir_all(dir).unwrap();
}

fn python_with_tensorboard(test: &str) -> Option<String> {
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    match Command::new(&python)
        .args(["-c", "import tensorboard"])
        .output()
    {
        Ok(o) if o.status.success() => Some(python),
        Ok(o) => {
            eprintln!(
                "SKIP {test}: `{python} -c \"import tensorboard\"` failed ({}); install it with `python3 -m pip install tensorboard`",
                String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
            );
            None
        }
        Err(e) => {
            eprintln!("SKIP {test}: cannot run {python}: {e}");
            None
        }
    }
}

/// `{tag: [[step, value], ...]}` as TensorBoard's EventAccumulator reads the folder `dir`.
fn tensorboard_scalars(
    python: &str,
    dir: &std::path::Path,
) -> std::collections::BTreeMap<String, Vec<(i64, f64)>> {
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
out = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
print(json.dumps(out))
"#;
    let out = Command::new(python)
        .args(["-c", script])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "EventAccumulator failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

/// TensorBoard's own reader shows a resumed run's steps once, the resumed values from the purge
/// step on. Runs when `python3 -c "import tensorboard"` works (CI installs it).
#[test]
fn tensorboard_event_accumulator_shows_resumed_steps_once() {
    let Some(python) =
        python_with_tensorboard("tensorboard_event_accumulator_shows_resumed_steps_once")
    else {
        return;
    };
    let dir = scratch("tbpyresume");
    let resumed_loss = write_killed_and_resumed_run(&dir);
    let got = tensorboard_scalars(&python, &dir);
    let loss_seen = &got["train/loss"];
    let steps: Vec<i64> = loss_seen.iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, (0..60).collect::<Vec<_>>(), "each step once");
    for (step, value) in loss_seen {
        let want = if *step < 30 {
            loss(*step)
        } else {
            resumed_loss(*step)
        };
        assert_eq!(*value, want as f32 as f64, "train/loss at {step}");
    }
    assert_eq!(got["lr"].len(), 30);
    assert!(
        got.get("eval/acc").is_none_or(Vec::is_empty),
        "{:?}",
        got.get("eval/acc")
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// TensorBoard's own reader must load kiln's files. Runs when `python3 -c "import tensorboard"`
/// works (CI installs it); otherwise prints why it is skipped (the pure-Rust reader test above
/// still checks the format).
#[test]
fn tensorboard_event_accumulator_reads_kiln_files() {
    let Some(python) = python_with_tensorboard("tensorboard_event_accumulator_reads_kiln_files")
    else {
        return;
    };
    let dir = scratch("tbpy");
    write_run(&dir);
    let got = tensorboard_scalars(&python, &dir);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        vec!["eval/acc", "lr", "train/loss"],
        "tags seen by TensorBoard"
    );
    let loss_seen = &got["train/loss"];
    assert_eq!(loss_seen.len(), 50);
    for (step, value) in loss_seen {
        assert_eq!(*value, loss(*step) as f32 as f64, "train/loss at {step}");
    }
    assert_eq!(got["eval/acc"], vec![(49, 0.875)]);
    std::fs::remove_dir_all(dir).unwrap();
}
