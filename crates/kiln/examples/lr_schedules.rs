//! Every learning-rate scheduler of kiln-sched, 300 epochs each from lr 0.1, logged with the
//! scalar logger and drawn into one SVG figure (one panel per scheduler).
//!
//! ```sh
//! cargo run --example lr_schedules            # writes target/lr_schedules.svg
//! cargo run --example lr_schedules -- out/    # writes out/lr_schedules.svg
//! ```
//!
//! Beside the SVG it also writes the same values as `lr_schedules.csv` and a TensorBoard run in
//! `lr_schedules_tb/` (`tensorboard --logdir <folder>/lr_schedules_tb`). The copy in
//! `docs/lr_schedules.svg` was made with this example.

use std::path::PathBuf;

use kiln::sched::log::svg::Figure;
use kiln::sched::log::ScalarLogger;
use kiln::sched::{
    ChainedScheduler, ConstantLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, CyclicLR,
    CyclicMode, CyclicOptions, ExponentialLR, LambdaLR, LinearLR, LrGroups, LrScheduler,
    MetricScheduler, MultiStepLR, MultiplicativeLR, OneCycleLR, OneCycleOptions, PlateauOptions,
    PolynomialLR, ReduceLROnPlateau, Result, SequentialLR, StepLR,
};

const EPOCHS: usize = 300;
const LR: f64 = 0.1;

/// A step-driven scheduler and a one-line description of its settings.
type Entry = (String, Box<dyn LrScheduler>);

fn schedulers(opt: &mut LrGroups, name: &str) -> Result<Entry> {
    let boxed: (&str, Box<dyn LrScheduler>) = match name {
        "StepLR" => (
            "step_size=60, gamma=0.5",
            Box::new(StepLR::new(opt, 60, 0.5)?),
        ),
        "MultiStepLR" => (
            "[100, 200, 250], gamma=0.3",
            Box::new(MultiStepLR::new(opt, &[100, 200, 250], 0.3)?),
        ),
        "ExponentialLR" => ("gamma=0.99", Box::new(ExponentialLR::new(opt, 0.99)?)),
        "CosineAnnealingLR" => (
            "T_max=100, runs past it",
            Box::new(CosineAnnealingLR::new(opt, 100, 0.005)?),
        ),
        "CosineAnnealingWarmRestarts" => (
            "T_0=20, T_mult=2",
            Box::new(CosineAnnealingWarmRestarts::new(opt, 20, 2, 0.001)?),
        ),
        "LinearLR" => (
            "0.1 -> 1.0 over 50",
            Box::new(LinearLR::new(opt, 0.1, 1.0, 50)?),
        ),
        "ConstantLR" => (
            "factor=0.25 for 60",
            Box::new(ConstantLR::new(opt, 0.25, 60)?),
        ),
        "LambdaLR" => (
            "lambda e: 1/(1+0.02e)",
            Box::new(LambdaLR::new(opt, |e| 1.0 / (1.0 + 0.02 * e as f64))?),
        ),
        "MultiplicativeLR" => (
            "lambda e: 0.99",
            Box::new(MultiplicativeLR::new(opt, |_| 0.99)?),
        ),
        "PolynomialLR" => (
            "total_iters=250, power=2",
            Box::new(PolynomialLR::new(opt, 250, 2.0)?),
        ),
        "OneCycleLR" => (
            "max_lr=0.1, cos, total_steps=301",
            Box::new(OneCycleLR::new(
                opt,
                LR,
                EPOCHS + 1,
                OneCycleOptions::default(),
            )?),
        ),
        "OneCycleLR three-phase" => {
            let o = OneCycleOptions {
                three_phase: true,
                anneal_strategy: kiln::sched::Anneal::Linear,
                ..Default::default()
            };
            (
                "linear, three_phase",
                Box::new(OneCycleLR::new(opt, LR, EPOCHS + 1, o)?),
            )
        }
        "CyclicLR" => {
            let o = CyclicOptions {
                step_size_up: 40,
                mode: CyclicMode::Triangular2,
                ..Default::default()
            };
            (
                "triangular2, 0.01..0.1",
                Box::new(CyclicLR::new(opt, 0.01, LR, o)?),
            )
        }
        "SequentialLR" => {
            let warmup = Box::new(LinearLR::new(opt, 0.05, 1.0, 20)?);
            let decay = Box::new(CosineAnnealingLR::new(opt, 280, 0.0)?);
            (
                "LinearLR warm-up 20, then cosine",
                Box::new(SequentialLR::new(opt, vec![warmup, decay], &[20])?),
            )
        }
        "ChainedScheduler" => {
            let a = Box::new(ConstantLR::new(opt, 0.5, 50)?);
            let b = Box::new(ExponentialLR::new(opt, 0.99)?);
            (
                "ConstantLR x ExponentialLR",
                Box::new(ChainedScheduler::new(opt, vec![a, b])?),
            )
        }
        other => unreachable!("{other}"),
    };
    Ok((boxed.0.to_string(), boxed.1))
}

const NAMES: [&str; 15] = [
    "StepLR",
    "MultiStepLR",
    "ExponentialLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "LinearLR",
    "ConstantLR",
    "LambdaLR",
    "MultiplicativeLR",
    "PolynomialLR",
    "OneCycleLR",
    "OneCycleLR three-phase",
    "CyclicLR",
    "SequentialLR",
    "ChainedScheduler",
];

fn main() -> Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "target".into()));
    let svg_path = dir.join("lr_schedules.svg");
    let csv_path = dir.join("lr_schedules.csv");
    let _ = std::fs::remove_file(&csv_path); // a fresh CSV each run (the logger appends)
    let mut log = ScalarLogger::in_memory()
        .tensorboard(dir.join("lr_schedules_tb"))?
        .csv(&csv_path)?
        .flush_every(100);
    let mut notes = Vec::new();

    for name in NAMES {
        let mut opt = LrGroups::with_momentum(&[LR], 0.9);
        let (note, mut sched) = schedulers(&mut opt, name)?;
        let tag = format!("lr/{name}");
        log.log(&tag, 0, sched.get_last_lr()[0])?;
        for epoch in 1..=EPOCHS {
            sched.step(&mut opt)?;
            log.log(&tag, epoch as i64, sched.get_last_lr()[0])?;
        }
        notes.push((name.to_string(), tag, note));
    }

    // ReduceLROnPlateau: driven by a validation loss that improves, then stalls.
    let mut opt = LrGroups::new(&[LR]);
    let options = PlateauOptions {
        patience: 15,
        factor: 0.5,
        ..Default::default()
    };
    let mut plateau = ReduceLROnPlateau::new(&mut opt, options)?;
    log.log("lr/ReduceLROnPlateau", 0, plateau.get_last_lr()[0])?;
    for epoch in 1..=EPOCHS {
        let e = epoch as f64;
        let val_loss = 1.0 / (1.0 + e / 10.0).min(6.0) + 0.01 * (e * 1.7).sin();
        plateau.step(&mut opt, val_loss)?;
        log.log(
            "lr/ReduceLROnPlateau",
            epoch as i64,
            plateau.get_last_lr()[0],
        )?;
    }
    notes.push((
        "ReduceLROnPlateau".into(),
        "lr/ReduceLROnPlateau".into(),
        "patience=15, factor=0.5".into(),
    ));
    log.flush()?;

    let mut figure = Figure::new("kiln-sched: learning rate over 300 epochs, base lr 0.1");
    figure.columns = 4;
    figure.panel_size = (330.0, 230.0);
    for (name, tag, note) in &notes {
        let mut plot = log.plot(name, &[tag.as_str()])?.x_label("epoch");
        plot.series[0].label = note.clone();
        figure.push(plot);
    }
    figure.write(&svg_path)?;
    println!("wrote {} ({} schedulers)", svg_path.display(), notes.len());
    println!("wrote {}", csv_path.display());
    if let Some(tb) = log.event_file() {
        println!("wrote {}", tb.display());
    }
    Ok(())
}
