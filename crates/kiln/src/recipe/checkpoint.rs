//! Training checkpoints: one safetensors file per run (`ckpt.safetensors`), written atomically
//! after every epoch, holding everything a resumed run needs to continue bit for bit and
//! everything `predict` needs to rebuild the model:
//!
//! - tensors `model.*`: the model's state dict (parameters and BatchNorm buffers);
//! - tensors `optimizer.{i}.{buffer}`: AdamW's moment buffers of the `i`-th parameter (in the
//!   optimizer's order), stored as `F64` so the values round-trip exactly whatever their dtype;
//! - metadata (JSON strings): `kiln.model_config`, `kiln.classes`, `kiln.normalize` (mean and
//!   std), and the training state: `kiln.optimizer` (groups, options, `initial_lr`, step counts;
//!   the buffers emptied), `kiln.scheduler`, `kiln.loader`, `kiln.rng`, `kiln.progress`, and
//!   `kiln.grad_scaler` (scale and growth tracker) when the run uses f16 loss scaling.
//!
//! The random state is the seed: the model's init is overwritten by the checkpoint, the network
//! draws nothing at training time (no dropout), and the data loader's shuffling and augmentation
//! are counter-based streams keyed by `(seed, epoch, sample)`, so `kiln.loader` (the epoch) and
//! the seed are the whole random state of a run.

use super::error::{Error, Result};
use super::model::ModelConfig;
use super::report::EpochReport;
use kiln_autograd::{Device, Tensor};
use kiln_data::{LoaderState, Normalize};
use kiln_models::checkpoint::{
    load_tensors, load_training_checkpoint, save_training_checkpoint, TrainingState,
};
use kiln_models::models::ResNet;
use kiln_optim::{GradScalerState, StateDict};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The checkpoint file of a run folder.
pub fn checkpoint_path(run_dir: &Path) -> PathBuf {
    run_dir.join("ckpt.safetensors")
}

/// Where a run stands after an epoch (stored as `kiln.progress`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Epochs completed.
    pub epochs_done: usize,
    /// Optimizer steps taken.
    pub global_step: usize,
    /// The batch size the run uses (fixed at its start, so a resumed run keeps it).
    pub batch_size: usize,
    /// The seed.
    pub seed: u64,
    /// The number of ranks that trained it (1 without `distributed`; checkpoints written before
    /// it was recorded read as 1): a resume needs the same number.
    #[serde(default = "one_rank")]
    pub world_size: usize,
    /// One record per completed epoch.
    pub history: Vec<EpochReport>,
}

fn one_rank() -> usize {
    1
}

/// What `predict` needs from a checkpoint.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The network's configuration.
    pub config: ModelConfig,
    /// Class names, by label.
    pub classes: Vec<String>,
    /// The normalisation the model was trained with.
    pub normalize: Normalize,
}

/// Everything [`save`] writes besides the model.
pub struct Saved<'a> {
    /// Model configuration, classes, normalisation.
    pub info: &'a ModelInfo,
    /// The optimizer's state dict.
    pub optimizer: &'a StateDict,
    /// The scheduler's state dict.
    pub scheduler: &'a serde_json::Value,
    /// The training loader's state.
    pub loader: LoaderState,
    /// Progress and history.
    pub progress: &'a Progress,
    /// The loss scaler's state (f16 mixed precision only).
    pub grad_scaler: Option<GradScalerState>,
}

#[derive(Serialize, Deserialize)]
struct NormalizeRecord {
    mean: Vec<f32>,
    std: Vec<f32>,
}

fn json<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Checkpoint(format!("cannot serialise: {e}")))
}

fn field<T: DeserializeOwned>(meta: &HashMap<String, String>, key: &str, path: &Path) -> Result<T> {
    let text = meta.get(key).ok_or_else(|| {
        Error::Checkpoint(format!(
            "{} has no {key:?} metadata; pass a checkpoint written by kiln's training recipe",
            path.display()
        ))
    })?;
    serde_json::from_str(text)
        .map_err(|e| Error::Checkpoint(format!("{}: {key:?} is malformed: {e}", path.display())))
}

/// Writes the checkpoint atomically (temporary file, fsync, rename).
pub fn save(model: &ResNet, saved: &Saved<'_>, path: &Path) -> Result<()> {
    let mut optimizer = saved.optimizer.clone();
    let mut tensors = Vec::new();
    for (i, rec) in optimizer.state.iter_mut().enumerate() {
        if let Some(rec) = rec {
            for (name, buf) in rec.buffers.iter_mut() {
                let data = std::mem::take(&mut buf.data);
                tensors.push((
                    format!("{i}.{name}"),
                    Tensor::from_vec(data, &buf.shape, Device::Cpu)?,
                ));
            }
        }
    }
    let info = saved.info;
    let mut metadata = HashMap::new();
    metadata.insert("kiln.model_config".into(), json(&info.config)?);
    metadata.insert("kiln.classes".into(), json(&info.classes)?);
    let norm = NormalizeRecord {
        mean: info.normalize.mean().to_vec(),
        std: info.normalize.std().to_vec(),
    };
    metadata.insert("kiln.normalize".into(), json(&norm)?);
    metadata.insert("kiln.optimizer".into(), json(&optimizer)?);
    metadata.insert("kiln.scheduler".into(), json(saved.scheduler)?);
    metadata.insert("kiln.loader".into(), json(&saved.loader)?);
    metadata.insert(
        "kiln.rng".into(),
        json(&serde_json::json!({ "seed": saved.progress.seed }))?,
    );
    metadata.insert("kiln.progress".into(), json(saved.progress)?);
    if let Some(scaler) = &saved.grad_scaler {
        metadata.insert("kiln.grad_scaler".into(), json(scaler)?);
    }
    let state = TrainingState {
        optimizer_tensors: tensors,
        metadata,
    };
    Ok(save_training_checkpoint(model, &state, path)?)
}

fn info_from(meta: &HashMap<String, String>, path: &Path) -> Result<ModelInfo> {
    let norm: NormalizeRecord = field(meta, "kiln.normalize", path)?;
    let mean: Vec<f64> = norm.mean.iter().map(|&v| v as f64).collect();
    let std: Vec<f64> = norm.std.iter().map(|&v| v as f64).collect();
    let info = ModelInfo {
        config: field(meta, "kiln.model_config", path)?,
        classes: field(meta, "kiln.classes", path)?,
        normalize: Normalize::new(&mean, &std)?,
    };
    if info.classes.len() != info.config.num_classes {
        return Err(Error::Checkpoint(format!(
            "{}: `kiln.classes` names {} classes but the model has {} outputs \
             (`kiln.model_config.num_classes`); the metadata was edited or mixed from two runs, \
             use the checkpoint the training run wrote",
            path.display(),
            info.classes.len(),
            info.config.num_classes
        )));
    }
    Ok(info)
}

/// Reads the model's configuration, classes and normalisation without loading any weights;
/// a `kiln.model_config` that the file's own tensors contradict (stem or head shape, blocks
/// per stage) is an error here, before anything builds the network it describes.
pub fn read_info(path: &Path) -> Result<ModelInfo> {
    let (tensors, meta) = load_tensors(path)?;
    let info = info_from(&meta, path)?;
    check_config_fits(&info.config, &tensors, path)?;
    Ok(info)
}

/// Compares `config` with the shapes of the model tensors the file holds (a tensor that is
/// absent is left to the strict load, which names every missing key).
fn check_config_fits(
    config: &ModelConfig,
    tensors: &[(String, Tensor)],
    path: &Path,
) -> Result<()> {
    let shape = |name: &str| {
        tensors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.shape().to_vec())
    };
    let mut wrong = Vec::new();
    let k = config.arch.stem_kernel();
    let stem = vec![config.width, config.in_channels, k, k];
    if let Some(found) = shape("model.conv1.weight").filter(|s| *s != stem) {
        wrong.push(format!(
            "conv1.weight is {found:?}, the config needs {stem:?}"
        ));
    }
    match config.features() {
        Some(features) => {
            let head = vec![config.num_classes, features];
            if let Some(found) = shape("model.fc.weight").filter(|s| *s != head) {
                wrong.push(format!("fc.weight is {found:?}, the config needs {head:?}"));
            }
        }
        None => wrong.push(format!(
            "width {} is past any network's size (fc's input, 8 x width x the block's \
             expansion, overflows)",
            config.width
        )),
    }
    for (stage, &want) in config.blocks.iter().enumerate() {
        let prefix = format!("model.layer{}.", stage + 1);
        let found = tensors
            .iter()
            .filter_map(|(n, _)| {
                n.strip_prefix(&prefix)?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .max()
            .map_or(0, |last| last + 1);
        if found != want {
            wrong.push(format!(
                "layer{} has {found} blocks, the config {want}",
                stage + 1
            ));
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    Err(Error::Checkpoint(format!(
        "{}: `kiln.model_config` does not describe the weights in the file ({}); the metadata \
         was edited or mixed from two runs, use the checkpoint the training run wrote",
        path.display(),
        wrong.join("; ")
    )))
}

/// Builds the model a checkpoint describes and loads its weights (strictly), in eval mode:
/// what `predict` runs.
pub fn load_model(path: &Path) -> Result<(ResNet, ModelInfo)> {
    let info = read_info(path)?;
    let mut model = info.config.build()?;
    load_training_checkpoint(&model, path, true)?;
    kiln_autograd::Module::eval(&mut model);
    Ok((model, info))
}

/// The settings a run was started with, as its checkpoint records them: what a resume compares
/// with its flags, and takes for the flags not given.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSettings {
    /// The head's peak lr (`initial_lr` of the optimizer's last group; `None` if not recorded).
    pub lr: Option<f64>,
    /// The seed.
    pub seed: u64,
    /// The network's width.
    pub width: usize,
    /// The batch size.
    pub batch_size: usize,
    /// The inputs' normalisation.
    pub normalize: Normalize,
}

/// Reads [`RunSettings`] from a training checkpoint's metadata, building nothing.
pub fn read_settings(path: &Path) -> Result<RunSettings> {
    let (_, meta) = load_tensors(path)?;
    let optimizer: StateDict = field(&meta, "kiln.optimizer", path)?;
    let progress: Progress = field(&meta, "kiln.progress", path)?;
    let info = info_from(&meta, path)?;
    Ok(RunSettings {
        lr: optimizer.groups.last().and_then(|g| g.initial_lr),
        seed: progress.seed,
        width: info.config.width,
        batch_size: progress.batch_size,
        normalize: info.normalize,
    })
}

/// The training state of a checkpoint, loaded into `model` (strictly).
pub struct Resumed {
    /// The optimizer state dict, buffers restored.
    pub optimizer: StateDict,
    /// The scheduler state dict.
    pub scheduler: serde_json::Value,
    /// The training loader's state.
    pub loader: LoaderState,
    /// Progress and history.
    pub progress: Progress,
    /// The loss scaler's state, when the run saved one (f16 mixed precision).
    pub grad_scaler: Option<GradScalerState>,
}

/// Loads `path` into `model` and returns the rest of the training state.
pub fn resume(model: &ResNet, path: &Path) -> Result<Resumed> {
    let (_, state) = load_training_checkpoint(model, path, true)?;
    let meta = &state.metadata;
    let mut optimizer: StateDict = field(meta, "kiln.optimizer", path)?;
    let tensors: HashMap<&str, &Tensor> = state
        .optimizer_tensors
        .iter()
        .map(|(n, t)| (n.as_str(), t))
        .collect();
    for (i, rec) in optimizer.state.iter_mut().enumerate() {
        if let Some(rec) = rec {
            for (name, buf) in rec.buffers.iter_mut() {
                let key = format!("{i}.{name}");
                let t = tensors.get(key.as_str()).ok_or_else(|| {
                    Error::Checkpoint(format!(
                        "{}: optimizer tensor {key:?} is missing; the file is not a complete \
                         training checkpoint",
                        path.display()
                    ))
                })?;
                buf.data = t.to_vec::<f64>()?;
            }
        }
    }
    Ok(Resumed {
        optimizer,
        scheduler: field(meta, "kiln.scheduler", path)?,
        loader: field(meta, "kiln.loader", path)?,
        progress: field(meta, "kiln.progress", path)?,
        grad_scaler: match meta.contains_key("kiln.grad_scaler") {
            true => Some(field(meta, "kiln.grad_scaler", path)?),
            false => None,
        },
    })
}
