//! The code of README.md's training loop and of docs/GUIDE.md, compiled and run, so the
//! snippets cannot rot. Each test mirrors one section (same order, same names); a change here
//! goes into the document too. Everything runs on the CPU in a few seconds.

use std::error::Error;
use std::sync::Arc;

use kiln::autograd::{manual_seed, no_grad, DType, Device, Module, Tensor};
use kiln::data::{synthetic, DataLoader, DataLoaderConfig, ImageOptions, Normalize};
use kiln::losses::{cross_entropy, mse_loss, one_hot, CrossEntropyOptions, Reduction};
use kiln::models::models::{mlp, BlockKind, ResNet, ResNetConfig};
use kiln::models::{plan, summary, Freeze, Layer, OptimizerKind};
use kiln::optim::{
    clip_coef_for, clip_grad_norm_, AdamOptions, AdamW, GradScaler, GradScalerOptions, Optimizer,
    ParamGroup,
};
use kiln::sched::{
    CosineAnnealingLR, LinearLR, LrGroups, LrScheduler, MetricScheduler, PlateauOptions,
    ReduceLROnPlateau, SequentialLR,
};

type Res = Result<(), Box<dyn Error>>;

/// README.md: "A training loop".
#[test]
fn readme_training_loop() -> Res {
    manual_seed(0);
    let device = Device::best();
    let (train, _val) = synthetic::train_val(0, 512, 128)?;
    let config = DataLoaderConfig {
        batch_size: 64,
        normalize: Some(Normalize::from_dataset(&train)?),
        ..DataLoaderConfig::default()
    };
    let mut loader = DataLoader::new(Arc::new(train), config, device)?;
    let model = mlp(&[3 * 32 * 32, 256, 10], 0.0)?;
    let params = model.named_parameters();
    let mut opt = AdamW::new(
        vec![ParamGroup::new(params.clone())],
        AdamOptions::adamw().lr(1e-3),
    )?;
    let mut losses = Vec::new();
    for _epoch in 0..3 {
        for batch in loader.iter() {
            let batch = batch?;
            let logits = model.forward(&batch.images.flatten(1, -1)?)?;
            let loss = cross_entropy(&logits, &batch.labels, &CrossEntropyOptions::default())?;
            loss.backward()?;
            let norm = clip_grad_norm_(&params, 1.0, 2.0, false)?; // the norm before clipping: log it
            opt.step()?;
            opt.zero_grad(true)?;
            losses.push((loss.item()?, norm));
        }
    }
    // 3 epochs of 8 batches; the loss falls (10 classes: it starts near ln 10 = 2.3).
    assert_eq!(losses.len(), 24);
    let first = losses[0].0;
    let last = losses[losses.len() - 1].0;
    assert!(first > 1.5 && last < first * 0.8, "{first} -> {last}");
    Ok(())
}

/// GUIDE.md: "1. Choosing and masking devices".
#[test]
fn choosing_and_masking_devices() -> Res {
    // Before anything initialises CUDA: use only physical GPU 1 (as CUDA_VISIBLE_DEVICES=1).
    // Afterwards the call is refused with `VisibilityFrozen`.
    match kiln::device::set_visible_devices(&["1"]) {
        Ok(()) | Err(kiln::device::Error::VisibilityFrozen) => {}
        Err(e) => return Err(e.into()),
    }
    let choice = Device::best_with_reason();
    println!("training on {choice}"); // e.g. "cpu (CUDA unavailable: ...)"
    let status = kiln::device::cuda_status();
    if let Some(reason) = status.reason() {
        println!("CUDA unavailable: {reason}");
    }
    for p in status.devices() {
        println!(
            "cuda:{} = physical {:?}: {}",
            p.logical, p.physical_ordinal, p.name
        );
    }
    assert_eq!(Device::best(), choice.device);
    assert_eq!(choice.device.is_cpu(), status.devices().is_empty());
    // Bad entries are refused with the fix in the message.
    let e = kiln::device::set_visible_devices(&["0", "0"]).unwrap_err();
    assert!(
        matches!(
            e,
            kiln::device::Error::InvalidVisibleDevice { .. }
                | kiln::device::Error::VisibilityFrozen
        ),
        "{e}"
    );
    Ok(())
}

/// GUIDE.md: "2. Reading memory stats and planning capacity".
#[test]
fn memory_stats_and_capacity() -> Res {
    use kiln::device::{memory_allocated, memory_reserved, memory_summary};
    let cpu = Device::Cpu;
    let x = Tensor::zeros(&[1024, 1024], DType::F32, cpu)?;
    assert!(memory_allocated(cpu)? >= 4 << 20);
    assert!(memory_reserved(cpu)? >= memory_allocated(cpu)?);
    assert!(memory_summary(cpu)?.contains("llocated"));
    drop(x);

    let model = ResNet::new(ResNetConfig {
        block: BlockKind::Basic,
        layers: [2, 2, 2, 2],
        num_classes: 10,
        small_input: true,
    })?;
    let s = summary(&model, &[32, 3, 32, 32])?;
    println!("{s}");
    assert_eq!(s.total_params, 11_173_962);
    let p = plan(&model, &[3, 32, 32], DType::F32, OptimizerKind::AdamW)?;
    println!("{p}");
    // The largest batch whose predicted peak fits in 8 GiB; peak_bytes is
    // peak_allocated_bytes plus the allocator overhead the plan assumes.
    let batch = p.max_batch_size(8 << 30)?;
    assert!(p.peak_bytes(batch) <= 8 << 30 && p.peak_bytes(batch + 1) > 8 << 30);
    // A budget that cannot hold one sample is an error that says what to change.
    assert!(p.max_batch_size(1 << 20).is_err());
    Ok(())
}

/// GUIDE.md: "2. Reading memory stats and planning capacity", "Seeing where memory goes".
#[test]
fn memory_history_and_snapshot() -> Res {
    use kiln::device::{dump_snapshot, record_memory_history};
    let cpu = Device::Cpu;
    let dir = std::env::temp_dir().join(format!("kiln-guide-history-{}", std::process::id()));
    let path = dir.join("runs/exp/memory_snapshot.pickle");
    record_memory_history(cpu, true, 100_000)?;
    let x = Tensor::zeros(&[256, 256], DType::F32, cpu)?;
    let y = x.add_scalar(1.0)?;
    drop((x, y));
    dump_snapshot(cpu, &path)?;
    record_memory_history(cpu, false, 0)?;
    // The file reads back as a snapshot with this device's events (other tests of this binary
    // may add theirs: the CPU allocator is shared).
    let loaded = kiln::alloc::snapshot_read::read_snapshot_file(&path)?;
    assert_eq!(loaded.device_traces.len(), 1);
    let sizes: Vec<usize> = loaded.device_traces[0].iter().map(|e| e.size).collect();
    assert!(
        sizes.contains(&(256 * 256 * 4)),
        "the 256 KiB allocations are recorded"
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// GUIDE.md: "3. Clipping gradients".
#[test]
fn clipping() -> Res {
    manual_seed(0);
    let model = mlp(&[8, 16, 4], 0.0)?;
    let params = model.named_parameters();
    let mut opt = AdamW::new(vec![ParamGroup::new(params.clone())], AdamOptions::adamw())?;
    let x = Tensor::randn(&[4, 8], DType::F32, Device::Cpu)?;
    let y = Tensor::from_vec(vec![0i64, 1, 2, 3], &[4], Device::Cpu)?;
    let ce = CrossEntropyOptions::default();

    cross_entropy(&model.forward(&x)?, &y, &ce)?.backward()?;
    let total_norm = clip_grad_norm_(&params, 1.0, 2.0, false)?; // the norm before clipping
    assert!(total_norm > 0.0);
    opt.step()?;
    opt.zero_grad(true)?;

    // The same clipping handed to the step: one read pass, no separate scale pass.
    cross_entropy(&model.forward(&x)?, &y, &ce)?.backward()?;
    let info = clip_coef_for(&params, 1.0, 2.0, false)?;
    assert!(info.coef > 0.0 && info.coef <= 1.0);
    opt.step_with_grad_scale(info.coef)?;
    opt.zero_grad(true)?;
    Ok(())
}

/// GUIDE.md: "4. Single-image inference".
#[test]
fn single_image_inference() -> Res {
    let dir = std::env::temp_dir().join(format!("kiln-guide-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("sample.png");
    let (val, _) = synthetic::train_val(1, 1, 1)?;
    kiln::data::save_png(&path, &val.image(0)?, [3, 32, 32])?;

    let mut model = mlp(&[3 * 32 * 32, 64, 10], 0.0)?;
    let normalize = Normalize::cifar10();
    let image = kiln::data::load_image(
        &path,
        [3, 32, 32],
        ImageOptions::default(),
        Some(&normalize),
        Device::Cpu,
    )?; // [3, 32, 32]
    model.eval();
    let probs = no_grad(|| -> kiln::models::Result<Tensor> {
        let batch = image.unsqueeze(0)?; // [1, 3, 32, 32]
        let logits = model.forward(&batch.flatten(1, -1)?)?; // [1, 10]
        Ok(logits.squeeze_dim(0)?.softmax(-1)?) // [10]
    })?;
    let mut ranked: Vec<(usize, f32)> = probs.to_vec::<f32>()?.into_iter().enumerate().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (class, p) in ranked.iter().take(5) {
        println!("{class}: {p:.3}");
    }
    assert_eq!(ranked.len(), 10);
    assert!((ranked.iter().map(|r| r.1).sum::<f32>() - 1.0).abs() < 1e-5);
    assert!(!probs.requires_grad());

    // An image of the wrong size is an error naming both sizes, unless resizing is asked for.
    let e = kiln::data::load_image(
        &path,
        [3, 64, 64],
        ImageOptions::default(),
        None,
        Device::Cpu,
    )
    .unwrap_err();
    assert!(e.to_string().contains("64"), "{e}");
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// GUIDE.md: "5. One-hot targets or class indices".
#[test]
fn one_hot_vs_class_indices() -> Res {
    let logits = Tensor::randn(&[3, 4], DType::F32, Device::Cpu)?;
    let labels = Tensor::from_vec(vec![2i64, 0, 3], &[3], Device::Cpu)?; // class indices
    let ce = CrossEntropyOptions::default();
    let _loss = cross_entropy(&logits, &labels, &ce)?; // indices: right for cross_entropy

    let targets = one_hot(&labels, Some(4))?; // [3, 4] int64
    let _loss = mse_loss(&logits, &targets.to_dtype(DType::F32)?, Reduction::Mean)?;

    // The mix-ups are errors that say how to convert.
    let e = cross_entropy(&logits, &targets, &ce)
        .unwrap_err()
        .to_string();
    assert!(e.contains("argmax(1, false)"), "{e}");
    let e = mse_loss(&logits, &labels, Reduction::Mean)
        .unwrap_err()
        .to_string();
    assert!(e.contains("one_hot("), "{e}");
    Ok(())
}

/// GUIDE.md: "6. Evaluation under no_grad, then empty_cache".
#[test]
fn no_grad_evaluation_and_empty_cache() -> Res {
    let mut model = mlp(&[16, 32, 4], 0.0)?;
    let x = Tensor::randn(&[8, 16], DType::F32, Device::Cpu)?;
    model.eval();
    let logits = no_grad(|| model.forward(&x))?;
    assert!(!logits.requires_grad());
    let predicted = logits.argmax(1, false)?; // [8] int64
    assert_eq!(predicted.shape(), &[8]);
    model.train(true);
    let released = kiln::device::empty_cache(Device::Cpu)?;
    println!("empty_cache released {released} bytes");
    Ok(())
}

/// GUIDE.md: "7. Learning-rate schedules".
#[test]
fn lr_schedules() -> Res {
    let model = mlp(&[4, 4], 0.0)?;
    let mut opt = AdamW::new(
        vec![ParamGroup::from_module(&model)],
        AdamOptions::adamw().lr(1e-3),
    )?;
    // Warm-up for 5 epochs, then cosine decay over the remaining 45; the schedulers drive the
    // optimizer's parameter groups directly.
    let warmup = LinearLR::new(&mut opt, 0.1, 1.0, 5)?;
    let cosine = CosineAnnealingLR::new(&mut opt, 45, 0.0)?;
    let mut sched = SequentialLR::new(&mut opt, vec![Box::new(warmup), Box::new(cosine)], &[5])?;
    let mut seen = Vec::new();
    for _epoch in 0..50 {
        seen.push(opt.lr(0)?);
        // ... one epoch of training ...
        sched.step(&mut opt)?;
    }
    assert!((seen[0] - 1e-4).abs() < 1e-12);
    assert!((seen[5] - 1e-3).abs() < 1e-12);
    assert!(seen[49] < 1e-5);

    // ReduceLROnPlateau: step with the validation loss; the lr drops by `factor` after
    // `patience` epochs without improvement.
    let mut lrs = LrGroups::new(&[0.1]);
    let options = PlateauOptions {
        patience: 2,
        factor: 0.5,
        ..PlateauOptions::default()
    };
    let mut plateau = ReduceLROnPlateau::new(&mut lrs, options)?;
    for val_loss in [1.0, 0.9, 0.9, 0.9, 0.9] {
        plateau.step(&mut lrs, val_loss)?;
    }
    assert_eq!(plateau.get_last_lr(), &[0.05]);
    Ok(())
}

/// GUIDE.md: "8. Freezing a backbone" and "9. Per-group learning rates".
#[test]
fn freezing_and_per_group_learning_rates() -> Res {
    let model = ResNet::new(ResNetConfig {
        block: BlockKind::Basic,
        layers: [1, 1, 1, 1],
        num_classes: 10,
        small_input: true,
    })?;
    let frozen = model.freeze(|name| !name.starts_with("fc."))?;
    assert_eq!(model.trainable_parameters().len(), 2); // fc.weight, fc.bias
    let head_only = plan(&model, &[3, 32, 32], DType::F32, OptimizerKind::AdamW)?;
    model.unfreeze(|_| true)?; // e.g. after the first epoch
    assert_eq!(model.trainable_parameters().len(), frozen + 2);
    let full = plan(&model, &[3, 32, 32], DType::F32, OptimizerKind::AdamW)?;
    assert!(head_only.peak_allocated_bytes(32) < full.peak_allocated_bytes(32) / 2);

    let (head, backbone): (Vec<_>, Vec<_>) = model
        .named_parameters()
        .into_iter()
        .partition(|(name, _)| name.starts_with("fc."));
    let opt = AdamW::new(
        vec![
            ParamGroup::new(backbone).lr(1e-4),
            ParamGroup::new(head).lr(1e-2),
        ],
        AdamOptions::adamw().weight_decay(5e-4),
    )?;
    assert_eq!((opt.lr(0)?, opt.lr(1)?), (1e-4, 1e-2));
    assert_eq!(opt.options(0)?.weight_decay, 5e-4);
    Ok(())
}

/// GUIDE.md: "9. Per-group learning rates", "Your own images".
#[test]
fn your_own_images_in_class_folders() -> Res {
    let root = std::env::temp_dir().join(format!("kiln-guide-pets-{}", std::process::id()));
    let (images, _) = synthetic::train_val(2, 3, 1)?;
    for (i, class) in ["dog", "cat", "cat"].iter().enumerate() {
        let dir = root.join("pets/train").join(class);
        std::fs::create_dir_all(&dir)?;
        kiln::data::save_png(dir.join(format!("{i}.png")), &images.image(i)?, [3, 32, 32])?;
    }
    let pets_train = root.join("pets/train"); // "pets/train" in the guide

    let resize = ImageOptions {
        resize: true,
        ..Default::default()
    };
    let train = kiln::data::image_folder(&pets_train, [3, 224, 224], resize)?;
    // too large for memory: each image is decoded when a batch needs it, as torchvision does
    let big = kiln::data::image_folder_on_disk(&pets_train, [3, 224, 224], resize)?;

    assert_eq!(train.classes(), ["cat", "dog"]); // sorted, as torchvision's
    assert_eq!(train.labels(), [0, 0, 1]);
    assert_eq!(train.sample_shape(), [3, 224, 224]);
    assert!(big.is_on_disk() && !train.is_on_disk());
    assert_eq!(big.image(2)?, train.image(2)?);
    std::fs::remove_dir_all(&root)?;
    Ok(())
}

/// GUIDE.md: "10. Mixed precision".
#[test]
fn mixed_precision_grad_scaler() -> Res {
    manual_seed(0);
    let model = mlp(&[8, 4], 0.0)?;
    let params = model.named_parameters();
    let mut opt = AdamW::new(vec![ParamGroup::new(params.clone())], AdamOptions::adamw())?;
    let mut scaler = GradScaler::new(GradScalerOptions::default())?;
    let x = Tensor::randn(&[2, 8], DType::F32, Device::Cpu)?;
    let y = Tensor::from_vec(vec![1i64, 3], &[2], Device::Cpu)?;
    let loss = cross_entropy(&model.forward(&x)?, &y, &CrossEntropyOptions::default())?;
    scaler.scale(&loss)?.backward()?;
    scaler.unscale_(&mut opt)?; // gradients back to their true size, inf/NaN check
    clip_grad_norm_(&params, 1.0, 2.0, false)?; // clip the true gradients
    let stepped = scaler.step(&mut opt)?; // skipped when an inf/NaN was found
    scaler.update()?;
    opt.zero_grad(true)?;
    assert!(stepped);
    assert_eq!(scaler.get_scale(), 65536.0);
    Ok(())
}
