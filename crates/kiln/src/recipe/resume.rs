//! Continuing a run: the state read from its checkpoint ([`super::checkpoint::resume`]) loaded
//! into the freshly built optimizer, schedule and loader, and the loss scaler restored. With
//! the model's weights, these and the seed are the whole state of a run, so a resumed run
//! continues bit for bit.
//!
//! A checkpoint is only resumed with the settings that produced it: the network's shape, the
//! seed (it also draws the synthetic data), the head's lr and a given batch size are compared
//! with the checkpoint's first, and every difference is one error naming the flag to pass.
//! Only settings the user gave are compared: [`take_checkpoint_settings`] first sets the ones
//! not given (the CLI's defaults) to the checkpoint's, so `train --resume` needs no flags.
//! `metrics.csv` is cut back to the checkpoint's last step before a resumed run appends, so
//! the rows of an epoch that was killed before its checkpoint are written once, not twice; the
//! TensorBoard events of such an epoch stay in the earlier event file, and the resumed run's new
//! file starts with a `SessionLog` START at the first step it logs (PyTorch's
//! `SummaryWriter(purge_step)`), so TensorBoard drops them and shows each step once.

use super::checkpoint::{checkpoint_path, read_settings, Progress, Resumed};
use super::config::TrainConfig;
use super::error::{Error, Result};
use super::model::ModelConfig;
use kiln_autograd::DType;
use kiln_data::{DataLoader, Normalize, NormalizeChoice};
use kiln_optim::{Adam, GradScaler, GradScalerState, Optimizer};
use kiln_sched::log::ScalarLogger;
use kiln_sched::{LrScheduler, SequentialLR};
use std::path::Path;

/// Loads `resumed` into the optimizer, the schedule and the training loader; returns the run's
/// progress and the saved loss-scaler state, if any.
pub(super) fn apply(
    resumed: Resumed,
    opt: &mut Adam,
    sched: &mut SequentialLR,
    train_loader: &mut DataLoader,
) -> Result<(Progress, Option<GradScalerState>)> {
    opt.load_state_dict(&resumed.optimizer)?;
    sched.load_state_dict(&resumed.scheduler)?;
    train_loader.set_state(resumed.loader)?;
    Ok((resumed.progress, resumed.grad_scaler))
}

/// The loss scaler of an f16 `amp` run, continuing from `resumed` when given; `None` otherwise.
/// f16 needs loss scaling (its range ends at 65504 and small gradients flush to zero); bf16
/// has f32's exponent range and needs none.
pub(super) fn grad_scaler(
    config: &TrainConfig,
    resumed: Option<&GradScalerState>,
) -> Result<Option<GradScaler>> {
    if !(config.amp && config.amp_dtype == DType::F16) {
        return Ok(None);
    }
    let mut scaler = GradScaler::new(config.grad_scaler)?;
    if let Some(state) = resumed {
        scaler.load_state_dict(state)?;
    }
    Ok(Some(scaler))
}

/// One setting that differs from the checkpoint's: the flag, the value given and the saved one.
struct Diff {
    flag: &'static str,
    given: String,
    saved: String,
}

fn differs<T: PartialEq + std::fmt::Debug>(flag: &'static str, given: T, saved: T) -> Option<Diff> {
    (given != saved).then(|| Diff {
        flag,
        given: format!("{given:?}"),
        saved: format!("{saved:?}"),
    })
}

/// The error for `diffs`, or `Ok` when there are none. Each difference is named with both
/// values, and for a flag the fix is spelled out: pass the checkpoint's value or leave the flag
/// out (a resume takes the checkpoint's settings for the flags not given).
fn refuse(path: &Path, diffs: Vec<Diff>) -> Result<()> {
    if diffs.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = diffs
        .iter()
        .map(|d| format!("{} {} (checkpoint: {})", d.flag, d.given, d.saved))
        .collect();
    let flags: Vec<&Diff> = diffs
        .iter()
        .filter(|d| d.flag.starts_with("--") && !d.flag.contains(' '))
        .collect();
    let fix = if flags.is_empty() {
        "pass the checkpoint's values".to_string()
    } else {
        format!(
            "to continue it pass {} or leave {} out",
            flags
                .iter()
                .map(|d| format!("{} {}", d.flag, d.saved))
                .collect::<Vec<_>>()
                .join(" "),
            if flags.len() == 1 {
                "the flag"
            } else {
                "those flags"
            }
        )
    };
    Err(Error::Config(format!(
        "--resume: {} was written with other settings: {}; {fix}, or drop --resume / choose \
         another --run-dir to start a new run",
        path.display(),
        named.join(", ")
    )))
}

/// Refuses to resume into a network of another shape than the checkpoint's (`--width`, or
/// data with other images or classes), before any weight is read.
pub(super) fn check_model(wanted: &ModelConfig, saved: &ModelConfig, path: &Path) -> Result<()> {
    let diffs = [
        differs("--model", wanted.arch, saved.arch),
        differs("--width", wanted.width, saved.width),
        differs("blocks", wanted.blocks, saved.blocks),
        differs("--data channels", wanted.in_channels, saved.in_channels),
        differs("--data image size", wanted.image_size, saved.image_size),
        differs("--data classes", wanted.num_classes, saved.num_classes),
    ];
    refuse(path, diffs.into_iter().flatten().collect())
}

/// Refuses to resume with another normalisation than the checkpoint's: the continued run would
/// feed the model inputs on another scale than it was trained on.
pub(super) fn check_normalize(wanted: &Normalize, saved: &Normalize, path: &Path) -> Result<()> {
    if wanted == saved {
        return Ok(());
    }
    Err(Error::Config(format!(
        "--resume: {} normalises inputs with mean {:?}, std {:?}, and this run would use mean \
         {:?}, std {:?}; pass the --normalize the run started with, or leave the flag out",
        path.display(),
        saved.mean(),
        saved.std(),
        wanted.mean(),
        wanted.std()
    )))
}

/// Refuses to resume with another seed, head lr or given batch size than the checkpoint's
/// (each would silently change the data, the schedule or the steps of the continued run).
/// Settings the user did not give are taken from the checkpoint first
/// ([`take_checkpoint_settings`]), so only explicit flags can differ here.
pub(super) fn check_settings(config: &TrainConfig, resumed: &Resumed, path: &Path) -> Result<()> {
    let saved = &resumed.progress;
    let world = super::distributed::world_size(config);
    if world != saved.world_size {
        return Err(Error::Config(format!(
            "--resume: {} was written by a run of {} rank(s), and this run has {world}: each \
             rank's shard of the data, the batches per epoch and the learning-rate schedule \
             follow from the number of ranks, so the saved loader position and schedule would \
             not fit; relaunch with {} rank(s) (`mpirun -np {}` or `torchrun \
             --nproc-per-node {}`), or drop --resume / choose another --run-dir to start a new run",
            path.display(),
            saved.world_size,
            saved.world_size,
            saved.world_size,
            saved.world_size
        )));
    }
    let mut diffs = vec![differs("--seed", config.seed, saved.seed)];
    if let Some(b) = config.batch_size {
        diffs.push(differs("--batch-size", b, saved.batch_size));
    }
    let head_lr = resumed.optimizer.groups.last().and_then(|g| g.initial_lr);
    if let Some(lr) = head_lr.filter(|lr| lr.to_bits() != config.lr.to_bits()) {
        diffs.push(Some(Diff {
            flag: "--lr",
            given: config.lr.to_string(),
            saved: lr.to_string(),
        }));
    }
    refuse(path, diffs.into_iter().flatten().collect())
}

/// Which of the settings a resume compares with its checkpoint were given explicitly (on the
/// command line: `--lr`, `--seed`, `--width`, `--normalize`); a default is not a choice the
/// user made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GivenSettings {
    /// `--lr` was passed.
    pub lr: bool,
    /// `--seed` was passed.
    pub seed: bool,
    /// `--width` was passed.
    pub width: bool,
    /// `--normalize` was passed.
    pub normalize: bool,
}

/// For `--resume` with a checkpoint in `config.run_dir`: the head's lr, the seed, the width and
/// the normalisation that were not `given` are set to the checkpoint's, so resuming with the command that started
/// the run, or with fewer flags, just works, while a flag given with another value is still
/// refused by `train`, naming the value to pass. (A batch size not given is the checkpoint's
/// already: `batch_size: None`.) Returns whether a checkpoint was read; without `resume` or
/// without a checkpoint `config` is left as it is.
pub fn take_checkpoint_settings(config: &mut TrainConfig, given: GivenSettings) -> Result<bool> {
    let path = checkpoint_path(&config.run_dir);
    if !config.resume || !path.is_file() {
        return Ok(false);
    }
    let saved = read_settings(&path)?;
    if let Some(lr) = saved.lr.filter(|_| !given.lr) {
        config.lr = lr;
    }
    if !given.seed {
        config.seed = saved.seed;
    }
    if !given.width {
        config.width = saved.width;
    }
    if !given.normalize {
        config.normalize = NormalizeChoice::Constants(saved.normalize);
    }
    Ok(true)
}

/// The run's logger: TensorBoard events in `run_dir/tensorboard`, rows in `run_dir/metrics.csv`.
/// With `--resume` (`last_step` is the checkpoint's, 0 when there was none) the CSV is cut back
/// to `last_step` and the new event file purges every earlier event after it. Ranks other
/// than 0 of a data-parallel run keep their scalars in memory only.
pub(super) fn logger(config: &TrainConfig, last_step: usize) -> Result<ScalarLogger> {
    if !config.is_writer() {
        return Ok(ScalarLogger::in_memory());
    }
    let tensorboard = config.run_dir.join("tensorboard");
    let csv = config.run_dir.join("metrics.csv");
    let logger = if config.resume {
        trim_metrics_csv(&csv, last_step)?;
        let purge_step = last_step
            .checked_add(1)
            .and_then(|s| i64::try_from(s).ok())
            .ok_or_else(|| {
                Error::Checkpoint(format!(
                    "the checkpoint's step {last_step} is beyond TensorBoard's step range (i64); \
                     the checkpoint is damaged, start a new run"
                ))
            })?;
        ScalarLogger::in_memory().tensorboard_purging(tensorboard, purge_step)?
    } else {
        ScalarLogger::in_memory().tensorboard(tensorboard)?
    };
    Ok(logger.csv(csv)?.flush_every(50))
}

/// Drops the rows of `metrics.csv` (`wall_time,step,tag,value`) logged after step `last_step`:
/// they belong to an epoch the checkpoint does not hold, which the resumed run logs again. The
/// header, and any line whose step does not parse, are kept. A missing file is left missing.
pub(super) fn trim_metrics_csv(path: &Path, last_step: usize) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(e)),
    };
    let after_last = |line: &str| {
        let step = line.split(',').nth(1).and_then(|s| s.parse::<usize>().ok());
        step.is_some_and(|s| s > last_step)
    };
    if !text.lines().any(after_last) {
        return Ok(());
    }
    let kept: String = text
        .lines()
        .filter(|l| !after_last(l))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(path, kept).map_err(io)
}
