//! Prints torchinfo's summary of a built-in model, and optionally a training memory plan.
//!
//! ```text
//! cargo run --release --example summary -- resnet18 1x3x224x224
//! cargo run --release --example summary -- resnet50 8x3x224x224 --optimizer adamw --memory 24GiB
//! cargo run --release --example summary -- gpt_tiny 4x16
//! ```
//! Models: see `kiln::models::models::MODEL_NAMES`. `--classes N` sets the classifier width
//! (1000 by default). `--memory` takes bytes, or a number with KB/MB/GB/KiB/MiB/GiB.
//! `--device cuda` (or `cuda:N`) plans a step on a CUDA device, with its convolutions' scratch;
//! no GPU is needed to make the plan.

use kiln::autograd::DType;
use kiln::models::models::{by_name, MODEL_NAMES};
use kiln::models::{parse_memory_size, plan, plan_on, summary_with_dtype, OptimizerKind};
use std::process::ExitCode;

fn parse_shape(s: &str) -> Option<Vec<usize>> {
    s.split('x').map(|d| d.parse().ok()).collect()
}

/// `cpu`, `cuda` (device 0) or `cuda:N`.
fn parse_device(s: &str) -> Option<kiln::device::Device> {
    match s {
        "cpu" => Some(kiln::device::Device::Cpu),
        "cuda" => Some(kiln::device::Device::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")?
            .parse()
            .ok()
            .map(kiln::device::Device::Cuda),
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = format!(
        "usage: summary MODEL SHAPE [--classes N] [--optimizer sgd|sgd-momentum|adam|adamw] \
         [--memory BYTES] [--device cpu|cuda|cuda:N]\n  MODEL: {}\n  SHAPE: like 1x3x224x224 (token models: BxT)",
        MODEL_NAMES.join(", ")
    );
    if args.len() < 2 {
        return Err(usage);
    }
    let shape = parse_shape(&args[1]).ok_or(format!("bad shape {:?}\n{usage}", args[1]))?;
    let (mut classes, mut optimizer, mut memory, mut device) = (1000usize, None, None, None);
    let mut rest = args[2..].iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or(format!("{flag} needs a value\n{usage}"))?;
        match flag.as_str() {
            "--classes" => {
                classes = value
                    .parse()
                    .map_err(|_| format!("bad --classes {value}"))?
            }
            "--optimizer" => {
                optimizer = Some(value.parse::<OptimizerKind>().map_err(|e| e.to_string())?)
            }
            "--memory" => {
                memory = Some(
                    parse_memory_size(value).map_err(|e| format!("bad --memory {value}: {e}"))?,
                )
            }
            "--device" => {
                device = Some(parse_device(value).ok_or(format!(
                    "bad --device {value}; use cpu, cuda or cuda:N\n{usage}"
                ))?)
            }
            other => return Err(format!("unknown flag {other}\n{usage}")),
        }
    }
    let model = by_name(&args[0], classes).map_err(|e| e.to_string())?;
    let dtype = if args[0].starts_with("gpt") {
        DType::I64
    } else {
        DType::F32
    };
    let s = summary_with_dtype(model.as_ref(), &shape, dtype).map_err(|e| e.to_string())?;
    println!("{s}");
    if optimizer.is_some() || memory.is_some() || device.is_some() {
        let opt = optimizer.unwrap_or(OptimizerKind::AdamW);
        let p = match device {
            Some(d) => plan_on(model.as_ref(), &shape[1..], dtype, opt, d),
            None => plan(model.as_ref(), &shape[1..], dtype, opt),
        }
        .map_err(|e| e.to_string())?;
        println!("{p}");
        println!(
            "Predicted peak at batch {} (MB): {:.2}",
            shape[0],
            p.peak_bytes(shape[0]) as f64 / 1e6
        );
        if let Some(bytes) = memory {
            let b = p.max_batch_size(bytes).map_err(|e| e.to_string())?;
            println!(
                "Max batch size in {:.2} GB: {b} (peak {:.2} MB)",
                bytes as f64 / 1e9,
                p.peak_bytes(b) as f64 / 1e6
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
