//! `cargo xtask record-traces [--out DIR] [--only NAME] [--seed N]`: records the allocation
//! traces shipped in `crates/alloc-cache/traces/` from real kiln training runs on the CPU.
//!
//! Every CPU tensor buffer comes from the process-wide caching allocator of `kiln-device`, so a
//! [`TraceRecorder`] attached to it sees every allocation and free of the run: model creation,
//! forward, loss, backward, optimizer state and step, `zero_grad(set_to_none)`. Each run starts
//! with an empty cache, builds its model and trains a few steps; the recording is then made
//! self-contained by [`compact_recording`] (dense ids, frees of older blocks dropped, what is
//! still live freed at the end) and written as `NAME.trace`, with a `# step N ...` comment
//! before each step.
//!
//! The runs (fp32, seeded: the same seed writes the same files, checked by running it twice):
//! - `resnet18_sgd`: torchvision ResNet-18 (ImageNet stem) on 64x64 images, batch 16, SGD with
//!   momentum;
//! - `gpt_varlen_adamw`: a 4-layer GPT (width 256, vocabulary 4096), batch 8, a sequence length
//!   drawn from 32..=256 each step, AdamW;
//! - `finetune_resnet18_varbatch`: ResNet-18 whose backbone is frozen for the first steps (only
//!   `fc` trains) and then unfrozen (added to the optimizer), with the batch drawn from
//!   {8, 12, 16} each step, SGD with momentum;
//! - `vit_adamw`: a 6-layer ViT (width 192, patch 8, 64x64 images), batch 16, AdamW.
//!
//! Those four peak at 123-321 MiB, where one 2 MiB page or 20 MiB segment is a large share of
//! the peak. Their GPU-scale twins train the same way at GPU-training sizes (peaks of 2.4-2.8
//! GiB; 1.5-3.5 min each in release on one thread):
//! - `resnet18_sgd_gpu`: 224x224 images, batch 128;
//! - `gpt_varlen_adamw_gpu`: a 4-layer GPT (width 256, 8 heads, vocabulary 16384), batch 8, a
//!   sequence length drawn from 256..=1024 each step;
//! - `finetune_resnet18_varbatch_gpu`: 224x224 images, the batch drawn from {64, 96, 128};
//! - `vit_adamw_gpu`: ViT-S/16's shape (12 layers, width 384, 6 heads, 224x224 images, 100
//!   classes), batch 32.
//!
//! CPU kernels allocate their own scratch (padded images, column matrices), which stands in for
//! a GPU library's workspace; the traces are kiln's CPU allocations, not a GPU run's.
//!
//! The runs are single-threaded (`KILN_NUM_THREADS=1` is required, so the order of allocations
//! cannot depend on thread scheduling) and use the AVX2 loops (`KILN_CPU_CAPABILITY=avx2` is
//! required: the convolutions' scratch depends on the instruction set, so an AVX-512 machine
//! would record other sizes; a CPU without AVX2 cannot record them).
//!
//! `--check` records the runs again in memory (the four CPU-scale ones, or `--only NAME`) and
//! fails, naming the first line that differs, when a shipped file is not what the code
//! allocates now: a change of the models, autograd or the CPU kernels' scratch has left the
//! traces of record, and the figures quoted from them, behind. CI runs it.
//!
//! `--peaks` trains the same runs without recording, on any number of threads, and prints each
//! run's peak reserved over peak allocated bytes of the CPU allocator and its planned-steps
//! counts instead of writing a trace: every step starts with `kiln_device::mark_step`, so
//! `KILN_ALLOC_CONF=planned_steps:True` measures planned steps in a real run, where the
//! passes run on the CPU pool and the kernels' workers take scratch of their own.

use kiln_alloc_cache::{compact_recording, synth::SplitMix64, TraceRecorder};
use kiln_autograd::{manual_seed, DType, Device, Generator, Module, Tensor};
use kiln_losses::{cross_entropy, CrossEntropyOptions};
use kiln_models::models::{resnet18, Gpt, GptConfig, VisionTransformer, VitConfig};
use kiln_models::{Freeze, Layer};
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup, Sgd, SgdOptions};
use std::path::PathBuf;
use std::time::Instant;

const USAGE: &str =
    "usage: cargo xtask record-traces [--out DIR] [--only NAME] [--seed N] [--check] [--peaks]
  records every run of RUNS (default DIR: crates/alloc-cache/traces; seed 2026), or only NAME;
  needs KILN_NUM_THREADS=1 and KILN_CPU_CAPABILITY=avx2; the GPU-scale runs (*_gpu) take
  minutes each;
  --check: records the CPU-scale runs (or only NAME) in memory and fails where a file in DIR
  differs;
  --peaks: trains them on any number of threads without recording and prints each run's peak
  reserved / peak allocated and planned-steps counts (KILN_ALLOC_CONF applies)";

const CPU: Device = Device::Cpu;

/// GPT of the CPU-scale run: 4 layers, width 256, vocabulary 4096.
const GPT_CPU: GptConfig = GptConfig {
    vocab_size: 4096,
    block_size: 256,
    n_layer: 4,
    n_head: 4,
    n_embd: 256,
    dropout: 0.0,
};

/// GPT of the GPU-scale run: 4 layers, width 256, 8 heads, vocabulary 16384, up to 1024
/// tokens.
const GPT_GPU: GptConfig = GptConfig {
    vocab_size: 16384,
    block_size: 1024,
    n_layer: 4,
    n_head: 8,
    n_embd: 256,
    dropout: 0.0,
};

/// ViT of the CPU-scale run: 6 layers, width 192, patch 8, 64x64 images.
const VIT_CPU: VitConfig = VitConfig {
    image_size: 64,
    patch_size: 8,
    num_layers: 6,
    num_heads: 3,
    hidden_dim: 192,
    mlp_dim: 768,
    dropout: 0.0,
    attention_dropout: 0.0,
    num_classes: 10,
};

/// ViT of the GPU-scale run: ViT-S/16's shape (12 layers, width 384, 6 heads) on 224x224
/// images, 100 classes.
const VIT_GPU: VitConfig = VitConfig {
    image_size: 224,
    patch_size: 16,
    num_layers: 12,
    num_heads: 6,
    hidden_dim: 384,
    mlp_dim: 1536,
    dropout: 0.0,
    attention_dropout: 0.0,
    num_classes: 100,
};

/// The runs, in the order they are recorded: the four CPU-scale runs (peaks of 123-321 MiB),
/// then their GPU-scale twins (`*_gpu`: the same training at GPU-training sizes, peaks of
/// several GiB, so 2 MiB pages and 20 MiB segments are small against the tensors).
const RUNS: [(&str, Kind); 8] = [
    (
        "resnet18_sgd",
        Kind::ResNetSgd {
            side: 64,
            batch: 16,
            steps: 6,
        },
    ),
    (
        "gpt_varlen_adamw",
        Kind::GptVarlen {
            config: GPT_CPU,
            batch: 8,
            lengths: (32, 256),
            steps: 8,
        },
    ),
    (
        "finetune_resnet18_varbatch",
        Kind::Finetune {
            side: 64,
            batches: [8, 12, 16],
            steps: 8,
        },
    ),
    (
        "vit_adamw",
        Kind::Vit {
            config: VIT_CPU,
            batch: 16,
            steps: 6,
        },
    ),
    (
        "resnet18_sgd_gpu",
        Kind::ResNetSgd {
            side: 224,
            batch: 128,
            steps: 6,
        },
    ),
    (
        "gpt_varlen_adamw_gpu",
        Kind::GptVarlen {
            config: GPT_GPU,
            batch: 8,
            lengths: (256, 1024),
            steps: 8,
        },
    ),
    (
        "finetune_resnet18_varbatch_gpu",
        Kind::Finetune {
            side: 224,
            batches: [64, 96, 128],
            steps: 8,
        },
    ),
    (
        "vit_adamw_gpu",
        Kind::Vit {
            config: VIT_GPU,
            batch: 32,
            steps: 6,
        },
    ),
];

type Res<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Runs the subcommand.
pub fn run(args: &[String]) -> Res<()> {
    let mut out = crate::paths::workspace_root().join("crates/alloc-cache/traces");
    let mut only: Option<String> = None;
    let mut seed = 2026u64;
    let mut peaks = false;
    let mut check = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--out" => out = PathBuf::from(value("--out")?),
            "--only" => only = Some(value("--only")?),
            "--seed" => {
                seed = value("--seed")?
                    .parse()
                    .map_err(|_| format!("--seed needs a non-negative integer\n{USAGE}"))?
            }
            "--peaks" => peaks = true,
            "--check" => check = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unexpected argument `{other}`\n{USAGE}")),
        }
    }
    if peaks && check {
        return Err(format!("--peaks and --check do not go together\n{USAGE}"));
    }
    if !peaks {
        if std::env::var("KILN_NUM_THREADS").as_deref() != Ok("1") {
            return Err(format!(
                "set KILN_NUM_THREADS=1 so the allocation order cannot depend on thread scheduling\n{USAGE}"
            ));
        }
        if std::env::var("KILN_CPU_CAPABILITY").as_deref() != Ok("avx2") {
            return Err(format!(
                "set KILN_CPU_CAPABILITY=avx2: the traces of record use the AVX2 loops, whose \
                 convolution scratch differs from AVX-512's and the portable loops'\n{USAGE}"
            ));
        }
        if kiln_device::ops::cpu_capability() != "avx2" {
            let why = "this CPU has no AVX2 with FMA, and the traces of record use the AVX2 \
                       loops (their convolution scratch differs from the portable loops')";
            if check {
                println!("record-traces --check skipped: {why}");
                return Ok(());
            }
            return Err(format!("{why}: record them on an x86-64 CPU with AVX2"));
        }
    }
    if let Some(name) = &only {
        if kind_of(name).is_none() {
            let names: Vec<&str> = RUNS.iter().map(|(n, _)| *n).collect();
            return Err(format!("--only {name}: not a run; runs are {names:?}"));
        }
    }
    if check {
        // The CPU-scale runs, or only the one named.
        let names = RUNS.iter().map(|(n, _)| *n).filter(|n| match &only {
            Some(o) => o == n,
            None => !n.ends_with("_gpu"),
        });
        return crate::trace_check::check_runs(&out, names, |name| record(name, seed, true));
    }
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    for (name, _) in RUNS {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let start = Instant::now();
        let text = record(name, seed, !peaks)?;
        if peaks {
            println!("{name}: {text}");
            continue;
        }
        let path = out.join(format!("{name}.trace"));
        std::fs::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!(
            "record-traces: {} ({} bytes) in {:.1} s",
            path.display(),
            text.len(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The allocator every CPU tensor uses, with a fresh recorder whose first lines say `header`
/// (none when only the peaks are measured).
struct Recording {
    allocator: &'static kiln_alloc_cache::CachingAllocator,
    record: bool,
}

impl Recording {
    fn start(header: &str, record: bool) -> Res<Self> {
        let allocator = kiln_device::allocator(CPU).map_err(err)?;
        allocator.empty_cache().map_err(err)?;
        allocator.reset_peak_stats();
        if record {
            let mut recorder = TraceRecorder::new();
            recorder.comment(header);
            allocator.set_trace_recorder(Some(recorder));
        }
        Ok(Self { allocator, record })
    }

    /// Marks the start of step `text` (`step N ...`) for planned steps and writes `# text` at
    /// this point of the recording.
    fn step(&self, text: &str) -> Res<()> {
        kiln_device::mark_step(CPU).map_err(err)?;
        self.comment(text);
        Ok(())
    }

    /// Writes `# text` at this point of the recording.
    fn comment(&self, text: &str) {
        if let Some(mut r) = self.allocator.take_trace_recorder() {
            r.comment(text);
            self.allocator.set_trace_recorder(Some(r));
        }
    }

    /// Stops recording while the model and optimizer are still alive (the order in which
    /// their tensors would be dropped is not fixed); [`compact_recording`] frees what is live at
    /// the end, in id order.
    /// With `--peaks`, the run's peaks and planned-steps counts instead.
    fn finish(self) -> Res<String> {
        if !self.record {
            // The last step is counted at a marker.
            kiln_device::mark_step(CPU).map_err(err)?;
            let stats = self.allocator.memory_stats();
            let reserved = stats.reserved_bytes.all.peak;
            let allocated = stats.allocated_bytes.all.peak;
            let (counts, _) = self.allocator.plan_counts();
            return Ok(format!(
                "peak reserved {reserved} B / peak allocated {allocated} B = {:.3}; planned \
                 steps {}, fallen back {}, blocks placed {}, scratch blocks lent {}, \
                 displaced {}",
                reserved as f64 / allocated.max(1) as f64,
                counts.planned_steps,
                counts.fallback_steps,
                counts.arena_allocs,
                counts.lent_allocs,
                counts.displaced_allocs
            ));
        }
        self.comment("end of training: what is still live (model, optimizer state) is freed here");
        let r = self
            .allocator
            .take_trace_recorder()
            .ok_or("the trace recorder was detached during the run")?;
        compact_recording(r.as_str()).map_err(err)
    }
}

fn labels(rng: &mut SplitMix64, n: usize, classes: usize) -> Res<Tensor> {
    let v: Vec<i64> = (0..n)
        .map(|_| rng.range(0, classes as u64 - 1) as i64)
        .collect();
    Tensor::from_vec(v, &[n], CPU).map_err(err)
}

fn images(g: &mut Generator, batch: usize, side: usize) -> Res<Tensor> {
    g.normal(&[batch, 3, side, side], 0.0, 1.0, DType::F32, CPU)
        .map_err(err)
}

/// forward -> cross entropy -> backward -> step -> zero_grad(set_to_none).
fn train_step(
    model: &dyn Layer,
    opt: &mut dyn Optimizer,
    x: &Tensor,
    y: &Tensor,
    classes: usize,
) -> Res<()> {
    let logits = model.forward(x).map_err(err)?;
    let logits = logits.reshape(&[-1, classes as isize]).map_err(err)?;
    let loss = cross_entropy(&logits, y, &CrossEntropyOptions::default()).map_err(err)?;
    drop(logits);
    loss.backward().map_err(err)?;
    drop(loss);
    opt.step().map_err(err)?;
    opt.zero_grad(true).map_err(err)
}

/// What a run trains; the sizes are its shapes, so one kind serves the CPU-scale run and its
/// GPU-scale twin.
#[derive(Clone, Copy)]
enum Kind {
    /// ResNet-18 (10 classes) on `side`x`side` images, SGD with momentum.
    ResNetSgd {
        side: usize,
        batch: usize,
        steps: usize,
    },
    /// A GPT with a sequence length drawn from `lengths` each step, AdamW.
    GptVarlen {
        config: GptConfig,
        batch: usize,
        lengths: (u64, u64),
        steps: usize,
    },
    /// ResNet-18 with its backbone frozen for the first 3 steps, then unfrozen into the
    /// optimizer; the batch drawn from `batches` each step.
    Finetune {
        side: usize,
        batches: [usize; 3],
        steps: usize,
    },
    /// A ViT, AdamW.
    Vit {
        config: VitConfig,
        batch: usize,
        steps: usize,
    },
}

/// The kind of run `name`.
fn kind_of(name: &str) -> Option<Kind> {
    RUNS.iter().find(|(n, _)| *n == name).map(|&(_, k)| k)
}

/// Records run `name` (its trace), or with `record` false measures its peaks (a line).
fn record(name: &str, seed: u64, record: bool) -> Res<String> {
    let kind = kind_of(name).ok_or_else(|| format!("no run named {name}"))?;
    manual_seed(seed);
    let mut g = Generator::new(seed);
    let mut rng = SplitMix64(seed);
    let header = format!(
        "kiln training run `{name}` on the CPU, recorded by `KILN_NUM_THREADS=1 \
         KILN_CPU_CAPABILITY=avx2 cargo xtask record-traces --only {name} --seed {seed}`\nrequested bytes per allocation; ids are \
         renumbered (a freed id is reused)"
    );
    let rec = Recording::start(&header, record)?;
    match kind {
        Kind::ResNetSgd { side, batch, steps } => {
            let model = resnet18(10).map_err(err)?;
            let mut opt = Sgd::new(
                vec![ParamGroup::from_module(&model)],
                SgdOptions::default().lr(0.01).momentum(0.9),
            )
            .map_err(err)?;
            for step in 1..=steps {
                rec.step(&format!("step {step} batch {batch}"))?;
                let (x, y) = (images(&mut g, batch, side)?, labels(&mut rng, batch, 10)?);
                train_step(&model, &mut opt, &x, &y, 10)?;
            }
            rec.finish()
        }
        Kind::GptVarlen {
            config,
            batch,
            lengths: (lo, hi),
            steps,
        } => {
            let vocab = config.vocab_size;
            let model = Gpt::new(config).map_err(err)?;
            let mut opt = AdamW::new(
                vec![ParamGroup::from_module(&model)],
                AdamOptions::adamw().lr(3e-4),
            )
            .map_err(err)?;
            for step in 1..=steps {
                let t = rng.range(lo, hi) as usize;
                rec.step(&format!("step {step} batch {batch} seq {t}"))?;
                let ids: Vec<i64> = (0..batch * t)
                    .map(|_| rng.range(0, vocab as u64 - 1) as i64)
                    .collect();
                let x = Tensor::from_vec(ids, &[batch, t], CPU).map_err(err)?;
                let y = labels(&mut rng, batch * t, vocab)?;
                train_step(&model, &mut opt, &x, &y, vocab)?;
            }
            rec.finish()
        }
        Kind::Finetune {
            side,
            batches,
            steps,
        } => {
            let model = resnet18(10).map_err(err)?;
            model.freeze(|n| !n.starts_with("fc.")).map_err(err)?;
            let mut opt = Sgd::new(
                vec![ParamGroup::new(model.trainable_parameters())],
                SgdOptions::default().lr(0.01).momentum(0.9),
            )
            .map_err(err)?;
            for step in 1..=steps {
                if step == 4 {
                    model.unfreeze(|_| true).map_err(err)?;
                    let backbone: Vec<_> = model
                        .named_parameters()
                        .into_iter()
                        .filter(|(n, _)| !n.starts_with("fc."))
                        .collect();
                    opt.add_param_group(ParamGroup::new(backbone).lr(0.001))
                        .map_err(err)?;
                }
                let batch = batches[rng.range(0, 2) as usize];
                let phase = if step < 4 { "frozen" } else { "unfrozen" };
                rec.step(&format!("step {step} batch {batch} backbone {phase}"))?;
                let (x, y) = (images(&mut g, batch, side)?, labels(&mut rng, batch, 10)?);
                train_step(&model, &mut opt, &x, &y, 10)?;
            }
            rec.finish()
        }
        Kind::Vit {
            config,
            batch,
            steps,
        } => {
            let (side, classes) = (config.image_size, config.num_classes);
            let model = VisionTransformer::new(config).map_err(err)?;
            let mut opt = AdamW::new(
                vec![ParamGroup::from_module(&model)],
                AdamOptions::adamw().lr(1e-3),
            )
            .map_err(err)?;
            for step in 1..=steps {
                rec.step(&format!("step {step} batch {batch}"))?;
                let (x, y) = (
                    images(&mut g, batch, side)?,
                    labels(&mut rng, batch, classes)?,
                );
                train_step(&model, &mut opt, &x, &y, classes)?;
            }
            rec.finish()
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn check_and_peaks_do_not_go_together() {
        let args = ["--check".to_string(), "--peaks".to_string()];
        let e = super::run(&args).unwrap_err();
        assert!(
            e.starts_with("--peaks and --check do not go together"),
            "{e}"
        );
    }
}
