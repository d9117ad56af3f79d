//! The allocation history of real CPU training steps: the categories add up to
//! `memory_allocated` at every event, parameters / gradients / optimizer state / data are
//! attributed exactly, activations carry their module path, and the memory plan's predictions
//! hold against the recorded history category by category (an AdamW MLP, a small ResNet), and
//! at small batches against kiln-optim's SGD-momentum step, which needs no temporaries. The
//! CPU allocator is process-wide: the tests take turns, and nothing else runs in this binary.

mod common;

use kiln_autograd::{manual_seed, DType, Device, Module, Tensor};
use kiln_device::{
    memory_allocated, memory_history, record_memory_history, AllocContext, MemoryCategory,
    MemoryHistory,
};
use kiln_models::models::mlp;
use kiln_models::{plan, Layer, OptimizerKind};
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup};

const CPU: Device = Device::Cpu;

/// Bytes of the allocator block of `t` (512-byte multiples, as `memory_allocated` counts).
fn block(t: &Tensor) -> usize {
    (t.numel() * t.dtype().size_in_bytes()).div_ceil(512) * 512
}

fn step(model: &dyn Layer, opt: &mut dyn Optimizer, x: &Tensor) {
    opt.zero_grad(true).unwrap();
    let loss = model
        .forward(x)
        .unwrap()
        .square()
        .unwrap()
        .mean_all()
        .unwrap();
    loss.backward().unwrap();
    drop(loss);
    opt.step().unwrap();
}

/// The history of a step recorded after a step that is not: the first creates the
/// optimizer's state (and warms the allocator), as a training loop's later steps find them.
fn recorded_step(model: &dyn Layer, opt: &mut dyn Optimizer, x: &Tensor) -> MemoryHistory {
    step(model, opt, x);
    record_memory_history(CPU, true, 1_000_000).unwrap();
    step(model, opt, x);
    let h = memory_history(CPU).unwrap();
    record_memory_history(CPU, false, 1).unwrap();
    h
}

fn assert_sums_exact(h: &MemoryHistory) {
    for (i, (e, c)) in h.events.iter().zip(h.category_bytes()).enumerate() {
        assert_eq!(c.total(), e.allocated_after, "event {i}: {e:?}");
    }
}

/// The tests of this binary record the process-wide CPU allocator: one at a time.
static CPU_HISTORY: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_training_step_is_attributed_and_matches_the_plan() {
    let _only = CPU_HISTORY.lock().unwrap_or_else(|e| e.into_inner());
    manual_seed(0);
    record_memory_history(CPU, true, 1_000_000).unwrap();
    let model = mlp(&[128, 512, 512, 10], 0.0).unwrap();
    let params = model.parameters();
    let param_blocks: usize = params.iter().map(|p| block(p.tensor())).sum();
    let mut opt = AdamW::new(vec![ParamGroup::from_module(&model)], AdamOptions::adamw()).unwrap();
    let batch = 256;
    let x = {
        let _data = AllocContext::category(MemoryCategory::Data);
        Tensor::randn(&[batch, 128], DType::F32, CPU).unwrap()
    };
    step(&model, &mut opt, &x); // creates the optimizer state
    let start = memory_history(CPU).unwrap().events.len();
    step(&model, &mut opt, &x);
    let h = memory_history(CPU).unwrap();
    record_memory_history(CPU, false, 1).unwrap();
    assert_eq!(h.dropped, 0);
    assert_sums_exact(&h);

    // After the step: what lives is parameters, their gradients, AdamW's two moments and the
    // batch, each exactly.
    let now = *h.category_bytes().last().unwrap();
    assert_eq!(now.get(MemoryCategory::Parameter), param_blocks);
    assert_eq!(now.get(MemoryCategory::Gradient), param_blocks);
    assert_eq!(now.get(MemoryCategory::OptimizerState), 2 * param_blocks);
    assert_eq!(now.get(MemoryCategory::Data), block(&x));
    assert_eq!(now.get(MemoryCategory::Activation), 0);
    assert_eq!(now.get(MemoryCategory::Temporary), 0);
    assert_eq!(
        now.total(),
        memory_allocated(CPU).unwrap() - (now.get(MemoryCategory::Unknown))
    );

    // The second step alone: its peak, and what forward left for backward, by module.
    let step2 = h.since(start);
    assert_sums_exact(&step2);
    let (at, peak) = step2.peak().unwrap();
    let top = step2.live_at(at);
    // Every layer's forward outputs are activations under its module path.
    let activation_modules: std::collections::BTreeSet<String> = step2
        .events
        .iter()
        .filter(|e| e.kind == kiln_device::MemoryEventKind::Alloc)
        .filter(|e| e.attribution.category == Some(MemoryCategory::Activation))
        .filter_map(|e| e.attribution.module.as_deref().map(str::to_string))
        .collect();
    let expected: std::collections::BTreeSet<String> = ["0", "1", "2", "3", "4"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(activation_modules, expected);
    for b in top.iter().take(12) {
        let a = &b.attribution;
        println!(
            "  live at the peak: {} B {} op {:?} module {:?}",
            b.size,
            a.category_or_unknown(),
            a.op.as_deref(),
            a.module.as_deref()
        );
    }
    println!("  peak at event {at} of the step: {:?}", step2.events[at]);

    // The plan against the measured step, category by category.
    let p = plan(&model, &[128], DType::F32, OptimizerKind::AdamW).unwrap();
    let base = peak.get(MemoryCategory::Unknown);
    let measured_peak = peak.total() - base;
    let predicted_peak = p.peak_allocated_bytes(batch);
    println!(
        "AdamW MLP at batch {batch}: predicted peak {predicted_peak} B, measured {measured_peak} B \
         (ratio {:.3})",
        predicted_peak as f64 / measured_peak as f64
    );
    for (c, b) in peak.iter() {
        println!("  at the peak: {c}: {b} B");
    }
    println!("{p}");
    let ratio = predicted_peak as f64 / measured_peak as f64;
    assert!((0.95..=1.05).contains(&ratio), "ratio {ratio:.3}");
    let prediction = p.prediction(batch);
    assert_eq!(prediction.peak_allocated, predicted_peak);
    assert_eq!(prediction.label, "AdamW step, batch 256");
    assert_eq!(
        prediction.category_bytes(MemoryCategory::OptimizerState),
        Some(p.optimizer_state_bytes)
    );

    // Category by category over the step: parameters, gradients and optimizer state within
    // the allocator's 512-byte rounding (1%), the activations forward keeps (their largest
    // live bytes, plus the input batch the plan counts among them) within 5%.
    let max = step2.max_by_category();
    let within = |what: &str, predicted: usize, measured: usize, tol: f64| {
        let r = predicted as f64 / measured as f64;
        println!("  {what}: predicted {predicted} B, measured {measured} B, ratio {r:.3}");
        assert!((1.0 - tol..=1.0 + tol).contains(&r), "{what}: ratio {r:.3}");
    };
    within(
        "parameters",
        p.param_bytes + p.buffer_bytes,
        max.get(MemoryCategory::Parameter),
        0.01,
    );
    within(
        "gradients",
        p.grad_bytes,
        max.get(MemoryCategory::Gradient),
        0.01,
    );
    within(
        "optimizer state",
        p.optimizer_state_bytes,
        max.get(MemoryCategory::OptimizerState),
        0.01,
    );
    // Saved activations: what forward left live when backward starts (the model's output and
    // the loss count too: a few KiB), plus the batch the plan counts among them.
    let backward_starts = step2
        .events
        .iter()
        .position(|e| {
            e.kind == kiln_device::MemoryEventKind::Alloc
                && e.attribution
                    .op
                    .as_deref()
                    .is_some_and(|o| o.ends_with("Backward"))
        })
        .unwrap();
    let kept = step2.category_bytes()[backward_starts - 1].get(MemoryCategory::Activation);
    within(
        "saved activations",
        batch * p.saved_activation_bytes_per_sample + p.saved_activation_bytes_fixed,
        kept + block(&x),
        0.05,
    );
    assert!(
        max.get(MemoryCategory::Activation) > kept,
        "transients count while they live"
    );

    // The peak at other batch sizes: before the fix (no step workspace for the fused AdamW
    // step, the transposed weight gradient's copy in backward) the plan said 1.18x at batch 8
    // and 1.14x at batch 64.
    for batch in [8usize, 64, 2048] {
        let x = Tensor::randn(&[batch, 128], DType::F32, CPU).unwrap();
        let h = recorded_step(&model, &mut opt, &x);
        let (_, peak) = h.peak().unwrap();
        // All of it: the plan counts the input batch too.
        within(
            &format!("peak at batch {batch}"),
            p.peak_allocated_bytes(batch),
            peak.total(),
            0.05,
        );
    }
}

#[test]
fn a_resnet_step_matches_the_plan_by_category() {
    let _only = CPU_HISTORY.lock().unwrap_or_else(|e| e.into_inner());
    manual_seed(0);
    record_memory_history(CPU, true, 1_000_000).unwrap();
    let model = common::tiny_resnet(10, true);
    let mut opt = AdamW::new(vec![ParamGroup::from_module(&model)], AdamOptions::adamw()).unwrap();
    let batch = 8;
    let x = {
        let _data = AllocContext::category(MemoryCategory::Data);
        Tensor::randn(&[batch, 3, 32, 32], DType::F32, CPU).unwrap()
    };
    step(&model, &mut opt, &x);
    let start = memory_history(CPU).unwrap().events.len();
    step(&model, &mut opt, &x);
    let h = memory_history(CPU).unwrap();
    record_memory_history(CPU, false, 1).unwrap();
    assert_sums_exact(&h);
    let step2 = h.since(start);
    let max = step2.max_by_category();
    let p = plan(&model, &[3, 32, 32], DType::F32, OptimizerKind::AdamW).unwrap();
    let ratio = |what: &str, predicted: usize, measured: usize| {
        let r = predicted as f64 / measured as f64;
        println!("  {what}: predicted {predicted} B, measured {measured} B, ratio {r:.3}");
        r
    };
    // Parameters and BatchNorm buffers, gradients, AdamW's moments: the plan counts tensor
    // bytes, the history block bytes, which are larger by the 512-byte rounding and, for
    // tensors over 1 MiB, by the tail of a cached block the large pool does not split off (up
    // to 1 MiB each; the convolution weights of layer3 / layer4): 0.90 for the gradients,
    // which reuse cached blocks, so the bound is 0.85.
    let tight = [
        ratio(
            "parameters + buffers",
            p.param_bytes + p.buffer_bytes,
            max.get(MemoryCategory::Parameter),
        ),
        ratio("gradients", p.grad_bytes, max.get(MemoryCategory::Gradient)),
        ratio(
            "optimizer state",
            p.optimizer_state_bytes,
            max.get(MemoryCategory::OptimizerState),
        ),
    ];
    for r in tight {
        assert!((0.85..=1.0).contains(&r), "{r:.3}");
    }
    // Convolution activations by module path: every stage's blocks keep something.
    let modules: std::collections::BTreeSet<String> = step2
        .events
        .iter()
        .filter(|e| e.attribution.category == Some(MemoryCategory::Activation))
        .filter_map(|e| e.attribution.module.as_deref().map(str::to_string))
        .collect();
    for m in [
        "conv1",
        "bn1",
        "layer1.0.conv1",
        "layer3.0.conv2",
        "layer4.0.downsample.0",
        "fc",
    ] {
        assert!(modules.contains(m), "{m} not in {modules:?}");
    }
    // The peak, all of it (the plan counts the batch): within 10%, as tests/memory_plan*.rs.
    let (_, peak) = step2.peak().unwrap();
    let r = ratio("peak", p.peak_allocated_bytes(batch), peak.total());
    assert!((0.9..=1.1).contains(&r), "{r:.3}");
}

/// A weight-heavy MLP at batches 1-64, where the optimizer step rather than the activations
/// sets the peak: the plan equals the measured peak within 5 % (it said 1.33x while it gave
/// SGD two temporaries the size of the largest weight).
#[test]
fn an_sgd_momentum_step_matches_the_plan_at_small_batches() {
    let _only = CPU_HISTORY.lock().unwrap_or_else(|e| e.into_inner());
    manual_seed(0);
    // Weight-heavy: at small batches the step, not the activations, sets the peak.
    let model = mlp(&[1024, 1024, 1024, 10], 0.0).unwrap();
    let mut opt = kiln_optim::Sgd::new(
        vec![ParamGroup::from_module(&model)],
        kiln_optim::SgdOptions::default().lr(0.01).momentum(0.9),
    )
    .unwrap();
    let p = plan(&model, &[1024], DType::F32, OptimizerKind::SgdMomentum).unwrap();
    for batch in [1usize, 8, 64] {
        let x = Tensor::randn(&[batch, 1024], DType::F32, CPU).unwrap();
        // The momentum buffers exist from the unrecorded step on.
        let h = recorded_step(&model, &mut opt, &x);
        let (_, peak) = h.peak().unwrap();
        let (predicted, measured) = (p.peak_allocated_bytes(batch), peak.total());
        let r = predicted as f64 / measured as f64;
        println!("SGD momentum MLP at batch {batch}: predicted {predicted} B, measured {measured} B, ratio {r:.3}");
        assert!((0.95..=1.05).contains(&r), "batch {batch}: ratio {r:.3}");
    }
}

/// Sigmoid, tanh and SiLU layers, whose backward rules write over the gradient they read as
/// ReLU's does: the plan (one gradient in flight at each) equals the measured peak within 5 %
/// at a batch where activations dominate. A plan holding two gradients there said 1.15x; rules
/// making new buffers (sigmoid's and tanh's did, through two temporaries) measure 0.73x.
#[test]
fn an_mlp_of_sigmoid_tanh_and_silu_matches_the_plan() {
    let _only = CPU_HISTORY.lock().unwrap_or_else(|e| e.into_inner());
    manual_seed(0);
    let model = common::activations_mlp();
    let mut opt = kiln_optim::Sgd::new(
        vec![ParamGroup::from_module(&model)],
        kiln_optim::SgdOptions::default().lr(0.01).momentum(0.9),
    )
    .unwrap();
    let p = plan(&model, &[128], DType::F32, OptimizerKind::SgdMomentum).unwrap();
    let batch = 2048;
    let x = Tensor::randn(&[batch, 128], DType::F32, CPU).unwrap();
    let h = recorded_step(&model, &mut opt, &x);
    assert_sums_exact(&h);
    let (_, peak) = h.peak().unwrap();
    let (predicted, measured) = (p.peak_allocated_bytes(batch), peak.total());
    let r = predicted as f64 / measured as f64;
    println!("sigmoid/tanh/SiLU MLP at batch {batch}: predicted {predicted} B, measured {measured} B, ratio {r:.3}");
    assert!((0.95..=1.05).contains(&r), "ratio {r:.3}");
}
