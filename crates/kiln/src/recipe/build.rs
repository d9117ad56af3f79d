//! Everything the recipe's `train` builds before the first step, in the order that keeps a run
//! reproducible: the data, the model (its init drawn right after seeding), the pretrained
//! backbone of a fine-tuning run or the checkpoint of a resumed run read into it on the CPU, the move to the device (before the optimizer exists, so
//! the optimizer's state is created there), the summary, memory plan and batch size, the
//! loaders, then the optimizer and its schedule with any resumed state loaded into them.

use super::checkpoint::{self, ModelInfo, Progress};
use super::config::TrainConfig;
use super::distributed;
use super::epoch::{Steps, Trainer};
use super::error::{Error, Result};
use super::model::{self, is_head, ModelConfig, PretrainedReport};
use super::report::{Observer, Setup};
use super::resume;
use kiln_autograd::{DType, Module};
use kiln_data::{DataLoader, DataLoaderConfig, DistributedSampler, ImageDataset};
use kiln_models::models::ResNet;
use kiln_models::{LayerExt, MemoryPlan, OptimizerKind};
use kiln_optim::{Adam, AdamOptions, AdamW, ParamGroup};
use kiln_sched::{CosineAnnealingLR, LinearLR, SequentialLR};
use std::path::Path;
use std::sync::Arc;

/// Held while a run seeds the default generator and draws its model's init.
static INIT_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Builds the run (resumed from `ckpt_path` when `resuming`) and tells `observer` its setup.
pub(super) fn trainer(
    config: &TrainConfig,
    ckpt_path: &Path,
    resuming: bool,
    observer: &mut dyn Observer,
) -> Result<Trainer> {
    let device = config.device;
    let (train_set, val_set) = config.data.load(config.seed)?;
    let [c, h, w] = train_set.sample_shape();
    // A pretrained file fixes the width (read it on resume too: the checkpoint has that width).
    let pretrained = match &config.pretrained {
        Some(path) => Some((path, model::read_pretrained(path)?)),
        None => None,
    };
    let width = match &pretrained {
        Some((path, tensors)) => {
            let dims = model::pretrained_dims(tensors, config.model, path)?;
            if dims.in_channels != c {
                return Err(Error::Pretrained(format!(
                    "{}: conv1 takes {} input channels but the data's images have {c}; \
                     fine-tune on data with {} channels",
                    path.display(),
                    dims.in_channels,
                    dims.in_channels
                )));
            }
            dims.width
        }
        None => config.width,
    };
    let info = ModelInfo {
        config: ModelConfig {
            in_channels: c,
            image_size: [h, w],
            num_classes: train_set.num_classes(),
            width,
            blocks: config.model.torchvision_blocks().unwrap_or(config.blocks),
            arch: config.model,
        },
        classes: train_set.classes().to_vec(),
        normalize: config.normalize.resolve(
            &config.data,
            &train_set,
            config.pretrained.is_some(),
        )?,
    };
    let saved_normalize = if resuming {
        let saved = checkpoint::read_info(ckpt_path)?;
        resume::check_model(&info.config, &saved.config, ckpt_path)?;
        Some(saved.normalize)
    } else {
        None
    };
    // Recording starts before the model exists, so its parameters are attributed.
    let memory = super::memory::MemoryPicture::start(config)?;
    let mut model = {
        // The default generator is process-wide: ranks that are threads of one process
        // (`ThreadGroup`) take turns, so each draws the seed's init uninterrupted.
        let _turn = INIT_TURN.lock().unwrap_or_else(|p| p.into_inner());
        kiln_autograd::manual_seed(config.seed);
        info.config.build()?
    };
    let mut pretrained_report: Option<PretrainedReport> = None;
    if let (Some((path, tensors)), false) = (&pretrained, resuming) {
        pretrained_report = Some(model::load_pretrained(&model, tensors, config.model, path)?);
    }
    drop(pretrained);
    let resumed = if resuming {
        let resumed = checkpoint::resume(&model, ckpt_path)?;
        resume::check_settings(config, &resumed, ckpt_path)?;
        // after the seed: another seed's synthetic set has other statistics, and the seed is
        // what to name then
        if let Some(saved) = &saved_normalize {
            resume::check_normalize(&info.normalize, saved, ckpt_path)?;
        }
        Some(resumed)
    } else {
        None
    };
    distributed::convert_batch_norms(config, &mut model);
    // Layers are built on the CPU; move them before the optimizer exists, so its state (and a
    // resumed one) is created on the device.
    model.to_device(device)?;

    let summary = kiln_models::summary(&model, &[1, c, h, w])?.to_string();
    // On the device the step runs on: its convolutions' scratch is part of the peak.
    let plan = kiln_models::plan_on(&model, &[c, h, w], DType::F32, OptimizerKind::AdamW, device)?;
    let resumed_batch = resumed.as_ref().map(|r| r.progress.batch_size);
    let (batch_size, budget, plan_max) = batch_size(config, resumed_batch, &plan)?;
    let batch_size = distributed::agree_on_batch_size(config, batch_size)?;
    let (mut train_loader, val_loader) = loaders(config, &info, train_set, val_set, batch_size)?;
    let batches = train_loader.len();
    let (mut opt, mut sched) = optimizer(config, &model, batches)?;
    let mut progress = Progress {
        epochs_done: 0,
        global_step: 0,
        batch_size,
        seed: config.seed,
        world_size: distributed::world_size(config),
        history: Vec::new(),
    };
    let mut resumed_scaler = None;
    if let Some(r) = resumed {
        let (p, scaler) = resume::apply(r, &mut opt, &mut sched, &mut train_loader)?;
        progress = p;
        resumed_scaler = scaler;
    }
    let zero1 = distributed::zero1_saving(config, &model, &plan);
    observer.setup(&Setup {
        summary,
        plan,
        budget_bytes: budget,
        batch_size,
        plan_max_batch: plan_max,
        batches_per_epoch: batches,
        resumed_epochs: progress.epochs_done,
        resume_missing: (config.resume && !resuming).then(|| ckpt_path.to_path_buf()),
        samples: (train_loader.dataset().len(), val_loader.dataset().len()),
        data_on_disk: train_loader.dataset().is_on_disk(),
        pretrained: pretrained_report,
        zero1,
    });

    let logger = resume::logger(config, progress.global_step)?;
    let scaler = resume::grad_scaler(config, resumed_scaler.as_ref())?;
    Ok(Trainer {
        memory,
        model,
        info,
        train_loader,
        val_loader,
        steps: Steps { opt, sched, scaler },
        logger,
        progress,
        batch_losses: Vec::new(),
    })
}

/// The batch size and, when it was chosen automatically, the memory budget it was planned
/// against and the largest batch the plan allows in it. A resumed run keeps its batch size.
fn batch_size(
    config: &TrainConfig,
    resumed: Option<usize>,
    plan: &MemoryPlan,
) -> Result<(usize, Option<usize>, Option<usize>)> {
    let chosen = match (resumed, config.batch_size) {
        (Some(b), _) => (b, None, None),
        (None, Some(b)) => (b, None, None),
        (None, None) => {
            // Plan against half of what the device has free: the rest is for the data, the
            // validation pass and whatever else runs on the machine.
            let budget = (config.device.memory_info()?.free / 2) as usize;
            let max = plan.max_batch_size(budget)?;
            (max.min(config.max_auto_batch), Some(budget), Some(max))
        }
    };
    if chosen.0 == 0 {
        return Err(Error::Config("batch size 0; pass at least 1".into()));
    }
    Ok(chosen)
}

/// The training loader (shuffled, augmented, last partial batch dropped) and the validation
/// loader (in order, batches of at least 256), both normalising and delivering to the device.
/// A data-parallel run's training loader reads this rank's shard ([`DistributedSampler`],
/// shuffled by the seed, padded to equal shards), `batch_size` per rank; every rank validates
/// on the whole validation set (the models are identical, so are the figures).
fn loaders(
    config: &TrainConfig,
    info: &ModelInfo,
    train_set: ImageDataset,
    val_set: ImageDataset,
    batch_size: usize,
) -> Result<(DataLoader, DataLoader)> {
    let augment = if config.augment {
        config.data.augment()
    } else {
        Default::default()
    };
    let train_len = train_set.len();
    let mut train_loader = DataLoader::new(
        Arc::new(train_set),
        DataLoaderConfig {
            batch_size,
            shuffle: config.distributed.is_none(),
            drop_last: true,
            seed: config.seed,
            prefetch_batches: config.prefetch_batches,
            augment,
            normalize: Some(info.normalize.clone()),
        },
        config.device,
    )?;
    if let Some(d) = &config.distributed {
        let sampler = DistributedSampler::new(train_len, d.0.world_size(), d.0.rank())?;
        train_loader = train_loader.with_sampler(sampler.seed(config.seed))?;
    }
    let val_loader = DataLoader::new(
        Arc::new(val_set),
        DataLoaderConfig {
            batch_size: batch_size.max(256),
            normalize: Some(info.normalize.clone()),
            ..Default::default()
        },
        config.device,
    )?;
    Ok((train_loader, val_loader))
}

/// AdamW over two parameter groups and its warm-up + cosine schedule over every optimizer step
/// of the run (`batches` per epoch, `accum_steps` batches a step).
fn optimizer(config: &TrainConfig, model: &ResNet, batches: usize) -> Result<(Adam, SequentialLR)> {
    let steps_per_epoch = batches.div_ceil(config.accum_steps);
    let total_steps = steps_per_epoch.checked_mul(config.epochs).ok_or_else(|| {
        Error::Config(format!(
            "--epochs {} of {steps_per_epoch} optimizer steps each is more steps than the \
             schedule can count; pass fewer --epochs",
            config.epochs
        ))
    })?;

    // Two parameter groups from the start: backbone (small lr) and head (large lr), one weight
    // decay. While the backbone is frozen its parameters get no gradient, so AdamW skips them
    // and keeps no state for them; unfreezing is then only `unfreeze`, and the optimizer and the
    // warm-up + cosine schedule (which is tied to the number of groups) run on unchanged. The
    // alternative, `add_param_group` at the unfreeze, would need a new scheduler mid-run.
    let (head, backbone): (Vec<_>, Vec<_>) = model
        .named_parameters()
        .into_iter()
        .partition(|(n, _)| is_head(n));
    let mut opt = AdamW::new(
        vec![
            ParamGroup::new(backbone).lr(config.lr * config.backbone_lr_factor),
            ParamGroup::new(head).lr(config.lr),
        ],
        AdamOptions::adamw().weight_decay(config.weight_decay),
    )?;
    let warmup_steps = ((total_steps as f64 * config.warmup_fraction) as usize).max(1);
    let warmup = LinearLR::new(&mut opt, 0.1, 1.0, warmup_steps)?;
    // A run of one optimizer step is all warm-up; the cosine (which never starts) still needs a
    // length of at least 1.
    let decay_steps = total_steps.saturating_sub(warmup_steps).max(1);
    let cosine = CosineAnnealingLR::new(&mut opt, decay_steps, 0.0)?;
    let sched = SequentialLR::new(
        &mut opt,
        vec![Box::new(warmup), Box::new(cosine)],
        &[warmup_steps],
    )?;
    Ok((opt, sched))
}
