//! Trains a small ResNet (CIFAR stem) on the built-in synthetic shapes (or MNIST / CIFAR-10) and
//! shows the whole recipe: device report, model summary, memory plan and the batch size it
//! allows, a frozen backbone first, per-group learning rates, AdamW, clipping, warm-up + cosine,
//! gradient accumulation, validation under `no_grad`, memory figures, TensorBoard / CSV / SVG
//! logs and a resumable checkpoint per epoch. The loop itself is `kiln::recipe::train`.
//!
//! ```text
//! cargo run --release --example train                       # synthetic data, defaults
//! cargo run --release --example train -- --help
//! cargo run --release --example train -- --resume           # continue runs/train
//! cargo run --release --example train -- --device cuda --amp # cuda:0, bf16 autocast
//! cargo run --release --example train -- --model resnet18 --pretrained resnet18.pth
//! cargo run --release --example predict -- --checkpoint runs/train/ckpt.safetensors x.png
//! cargo build --release --features mpi --example train && \
//!     mpirun -np 2 target/release/examples/train --distributed   # 2 CPU ranks over MPI
//! mpirun -np 2 target/release/examples/train --distributed --sync-bn  # BatchNorm over both
//! ```

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kiln::data::{DataSource, NormalizeChoice};
use kiln::device::{cuda_status, format_bytes, DType, Device};
use kiln::recipe::{self, EpochReport, Observer, Setup, TrainConfig};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

/// Train a small ResNet with every practice of the kiln guide.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Epochs of the whole schedule.
    #[arg(long, default_value_t = TrainConfig::default().epochs)]
    epochs: usize,
    /// Batch size [default: the largest the memory plan allows, capped at 128].
    #[arg(long)]
    batch_size: Option<usize>,
    /// Peak learning rate of the head (the backbone gets --backbone-lr-factor times it).
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    lr: f64,
    /// Device: cpu, cuda, cuda:N or best.
    #[arg(long, default_value = "best")]
    device: String,
    /// Seed of the init, the synthetic data, the shuffle and the augmentation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Run folder: checkpoint, TensorBoard events, metrics.csv, metrics.svg, memory.svg.
    #[arg(long, default_value = "runs/train")]
    run_dir: PathBuf,
    /// Data: synthetic, synthetic:N, mnist:DIR, cifar10:DIR, or folder:DIR / folder:HxW:DIR
    /// (DIR/train/<class>/*.png|jpg and DIR/val/<class>/, torchvision's ImageFolder layout;
    /// read from disk as used when both splits take over a quarter of memory).
    #[arg(long, default_value = "synthetic", value_parser = parse_data)]
    data: DataSource,
    /// Input normalisation: source (the data's default: MNIST's or CIFAR-10's constants, the
    /// training split's statistics for synthetic data and folders, ImageNet's for a folder
    /// with --pretrained), dataset, imagenet, cifar10 or mnist.
    #[arg(long, default_value = "source", value_parser = parse_normalize)]
    normalize: NormalizeChoice,
    /// Epochs with the backbone frozen (only the head trains).
    #[arg(long, default_value_t = TrainConfig::default().freeze_epochs)]
    freeze_epochs: usize,
    /// Batches accumulated into one optimizer step.
    #[arg(long, default_value_t = 1)]
    accum_steps: usize,
    /// Clip gradients to this global L2 norm.
    #[arg(long, default_value_t = TrainConfig::default().max_grad_norm)]
    max_grad_norm: f64,
    /// Mixed precision: forward and loss under autocast (works on the CPU too, slowly).
    #[arg(long)]
    amp: bool,
    /// The autocast dtype of --amp: bf16 (no loss scaling) or f16 (with a GradScaler).
    #[arg(long, default_value = "bf16", value_parser = parse_amp_dtype)]
    amp_dtype: DType,
    /// Continue from RUN_DIR/ckpt.safetensors.
    #[arg(long)]
    resume: bool,
    /// Planes of the first stage (doubled per stage); a --pretrained file sets its own.
    #[arg(long, default_value_t = TrainConfig::default().width)]
    width: usize,
    /// The network: cifar-resnet (small-input stem), resnet18, resnet34 or resnet50.
    #[arg(long, default_value_t = TrainConfig::default().model)]
    model: recipe::Arch,
    /// Fine-tune from these torchvision weights (.pth or .safetensors); the head is replaced.
    #[arg(long)]
    pretrained: Option<PathBuf>,
    /// The backbone's learning rate relative to the head's.
    #[arg(long, default_value_t = TrainConfig::default().backbone_lr_factor)]
    backbone_lr_factor: f64,
    /// Record every allocation of the run (a ring of N events, 100000 when no N is given) and
    /// write RUN_DIR/memory_snapshot.pickle, which PyTorch's memory_viz opens.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "100000")]
    memory_history: Option<usize>,
    /// Data-parallel: one process per device, launched by `mpirun -np N` (CPU, a build with the
    /// `mpi` feature) or torchrun / srun (CUDA, NCCL: each rank on cuda:LOCAL_RANK);
    /// --batch-size is per rank, and rank 0 alone prints and writes RUN_DIR.
    #[arg(long)]
    distributed: bool,
    /// With --distributed: BatchNorm's batch statistics over every rank (SyncBatchNorm), so N
    /// ranks of --batch-size B train as one process of batch N * B would.
    #[arg(long)]
    sync_bn: bool,
}

fn parse_data(s: &str) -> Result<DataSource, String> {
    s.parse().map_err(|e: kiln::data::Error| e.to_string())
}

fn parse_normalize(s: &str) -> Result<NormalizeChoice, String> {
    s.parse().map_err(|e: kiln::data::Error| e.to_string())
}

fn parse_amp_dtype(s: &str) -> Result<DType, String> {
    match s {
        "bf16" => Ok(DType::BF16),
        "f16" => Ok(DType::F16),
        _ => Err(format!("unknown --amp-dtype {s:?}; use bf16 or f16")),
    }
}

fn parse_device(s: &str) -> Result<Device, String> {
    match s {
        "best" => Ok(Device::best()),
        "cpu" => Ok(Device::Cpu),
        "cuda" => Device::cuda(0).map_err(|e| e.to_string()),
        _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(i)) => Device::cuda(i).map_err(|e| e.to_string()),
            _ => Err(format!(
                "unknown device {s:?}; use cpu, cuda, cuda:N or best"
            )),
        },
    }
}

/// The device report: what is visible, what was chosen, and why.
fn report_devices(requested: &str, device: Device) {
    let status = cuda_status();
    println!("== devices");
    println!("  CUDA devices visible: {}", status.devices().len());
    for d in status.devices() {
        println!(
            "    cuda:{}: {}, {}",
            d.logical,
            d.name,
            format_bytes(d.total_memory)
        );
    }
    if let Some(reason) = status.reason() {
        println!("  CUDA unavailable: {reason}");
    }
    let why = if requested == "best" {
        Device::best_with_reason().reason
    } else {
        format!("--device {requested}")
    };
    println!("  training on {device} ({why})");
}

/// Progress bar (hidden when stdout is not a terminal) and the per-epoch lines.
struct Display {
    bar: Option<ProgressBar>,
    started: Instant,
}

impl Observer for Display {
    fn setup(&mut self, s: &Setup) {
        if let Some(p) = &s.pretrained {
            let head: Vec<String> = p
                .dropped_head
                .iter()
                .map(|(n, shape)| format!("{n} {shape:?}"))
                .collect();
            println!(
                "== pretrained: {} backbone tensors from {}; new head (the file's {} dropped)",
                p.loaded,
                p.path.display(),
                head.join(", ")
            );
        }
        println!("== model\n{}", s.summary);
        let p = &s.plan;
        println!("== memory plan (AdamW, f32)");
        println!(
            "  fixed {} (params {}, grads {}, optimizer state {}) + {} per sample",
            format_bytes(p.fixed_bytes() as u64),
            format_bytes(p.param_bytes as u64),
            format_bytes(p.grad_bytes as u64),
            format_bytes(p.optimizer_state_bytes as u64),
            format_bytes(p.per_sample_bytes() as u64)
        );
        if let Some(z) = &s.zero1 {
            println!(
                "  ZeRO-1 over the ranks would keep {} of optimizer state per rank instead of {} \
                 (fixed {} per rank)",
                format_bytes(z.sharded_state_bytes as u64),
                format_bytes(z.unsharded_state_bytes as u64),
                format_bytes(z.fixed_bytes as u64)
            );
        }
        match (s.budget_bytes, s.plan_max_batch) {
            (Some(budget), Some(max)) => println!(
                "  budget {} (half the free memory) fits batch {max}; using {} (capped), \
                 planned peak {}",
                format_bytes(budget as u64),
                s.batch_size,
                format_bytes(p.peak_bytes(s.batch_size) as u64)
            ),
            _ => println!(
                "  batch size {} (given or resumed), planned peak {}",
                s.batch_size,
                format_bytes(p.peak_bytes(s.batch_size) as u64)
            ),
        }
        println!(
            "== data: {} training / {} validation samples, {} batches per epoch{}",
            s.samples.0,
            s.samples.1,
            s.batches_per_epoch,
            if s.data_on_disk {
                " (images read from disk as they are used: more than a quarter of memory)"
            } else {
                ""
            }
        );
        if let Some(path) = &s.resume_missing {
            println!(
                "== --resume: no checkpoint at {}, so this is a new run from epoch 0",
                path.display()
            );
        }
        if s.resumed_epochs > 0 {
            println!("== resumed after epoch {}", s.resumed_epochs);
        }
    }

    fn epoch_start(&mut self, epoch: usize, batches: usize) {
        if std::io::stdout().is_terminal() {
            let bar =
                ProgressBar::with_draw_target(Some(batches as u64), ProgressDrawTarget::stdout());
            bar.set_style(
                ProgressStyle::with_template(
                    "epoch {prefix} [{bar:30}] {pos}/{len} batches, {msg}, ETA {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(epoch.to_string());
            self.bar = Some(bar);
        }
    }

    fn batch(&mut self, samples: usize, loss: f64) {
        if let Some(bar) = &self.bar {
            let per_sec = bar.per_sec() * samples as f64;
            bar.set_message(format!("loss {loss:.3}, {per_sec:.0} img/s"));
            bar.inc(1);
        }
    }

    fn epoch_end(&mut self, r: &EpochReport) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let [alloc, reserved, peak] = r.memory.map(|b| format_bytes(b as u64));
        println!(
            "epoch {:>2}{} train loss {:.4} | val loss {:.4} acc {:5.2}% | lr {:.2e}/{:.2e} | \
             grad norm {:.2} | mem alloc {alloc} reserved {reserved} peak {peak} | {:.0} img/s, \
             {:.1}s (total {:.0}s)",
            r.epoch,
            if r.frozen { " (backbone frozen)" } else { "" },
            r.train_loss,
            r.val_loss,
            100.0 * r.val_accuracy,
            r.lr[0],
            r.lr[1],
            r.grad_norm,
            r.samples_per_sec,
            r.seconds,
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Writes the first ten validation images of the synthetic set as PNGs into
/// `RUN_DIR/samples/` (one per class), ready for the `predict` example.
fn write_samples(config: &TrainConfig) -> Result<PathBuf, kiln::data::Error> {
    use kiln::data::{save_png, synthetic, Split};
    let dir = config.run_dir.join("samples");
    std::fs::create_dir_all(&dir).map_err(|source| kiln::data::Error::Io {
        path: dir.clone(),
        source,
    })?;
    for i in 0..10u64 {
        let (pixels, label) = synthetic::render(config.seed, Split::Test, i);
        let name = synthetic::CLASSES[label as usize].replace(' ', "_");
        save_png(dir.join(format!("{i}_{name}.png")), &pixels, [3, 32, 32])?;
    }
    Ok(dir)
}

fn main() {
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // A resume compares only the flags given with the checkpoint's; the rest are its values.
    let given = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    let given = recipe::GivenSettings {
        lr: given("lr"),
        seed: given("seed"),
        width: given("width"),
        normalize: given("normalize"),
    };
    let device = match parse_device(&args.device) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let (device, distributed) = match args.distributed {
        false => (device, None),
        true => match join_process_group(device) {
            Ok((device, group)) => (device, Some(group)),
            Err(e) => {
                eprintln!("error: --distributed: {e}");
                std::process::exit(2);
            }
        },
    };
    let writer = distributed.as_ref().is_none_or(|d| d.0.rank() == 0);
    if writer {
        report_devices(&args.device, device);
    }
    let mut config = TrainConfig {
        epochs: args.epochs,
        batch_size: args.batch_size,
        lr: args.lr,
        device,
        seed: args.seed,
        run_dir: args.run_dir,
        data: args.data,
        normalize: args.normalize,
        freeze_epochs: args.freeze_epochs,
        accum_steps: args.accum_steps,
        max_grad_norm: args.max_grad_norm,
        amp: args.amp,
        amp_dtype: args.amp_dtype,
        resume: args.resume,
        width: args.width,
        model: args.model,
        pretrained: args.pretrained,
        backbone_lr_factor: args.backbone_lr_factor,
        memory_history: args.memory_history,
        distributed,
        sync_bn: args.sync_bn,
        ..TrainConfig::default()
    };
    if let Err(e) = recipe::take_checkpoint_settings(&mut config, given) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    let mut display = Display {
        bar: None,
        started: Instant::now(),
    };
    let result = match writer {
        true => recipe::train(&config, &mut display),
        false => recipe::train(&config, &mut recipe::Quiet),
    };
    match result {
        Ok(_) if !writer => {}
        Ok(outcome) => {
            let last = outcome.history.last();
            println!(
                "done in {:.0}s: validation accuracy {:.2}%; checkpoint {}, logs in {} \
                 (metrics.csv, metrics.svg, memory.svg, tensorboard/)",
                display.started.elapsed().as_secs_f64(),
                last.map_or(0.0, |r| 100.0 * r.val_accuracy),
                outcome.checkpoint.display(),
                config.run_dir.display()
            );
            if matches!(config.data, DataSource::Synthetic { .. }) {
                match write_samples(&config) {
                    Ok(dir) => println!(
                        "validation samples as PNG in {}; try: cargo run --release --example \
                         predict -- --checkpoint {} {}/2_triangle.png",
                        dir.display(),
                        outcome.checkpoint.display(),
                        dir.display()
                    ),
                    Err(e) => eprintln!("could not write sample images: {e}"),
                }
            }
        }
        Err(e) => {
            // A data-parallel rank exits non-zero too, so mpirun / torchrun stop the others.
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

/// This process's device and process group under a launcher: the CPU over MPI, or
/// `cuda:LOCAL_RANK` over NCCL when `--device` chose CUDA.
fn join_process_group(
    device: Device,
) -> Result<(Device, recipe::Distributed), kiln::distributed::Error> {
    let env = kiln::distributed::LaunchEnv::from_process_env()?;
    let device = match device {
        Device::Cuda(_) => Device::cuda(env.local_rank).map_err(|e| {
            kiln::distributed::Error::Environment(format!(
                "LOCAL_RANK {} has no CUDA device ({e}); start one process per GPU, or \
                         pass --device cpu to train on the CPU over MPI",
                env.local_rank
            ))
        })?,
        Device::Cpu => Device::Cpu,
    };
    let group = kiln::distributed::init_process_group(device)?;
    Ok((device, recipe::Distributed(group)))
}
