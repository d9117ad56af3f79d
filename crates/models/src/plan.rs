//! The training memory plan: what one training step needs at batch size `B`, and the largest
//! `B` that fits a device.
//!
//! torchinfo's "Forward/backward pass size" is a rough proxy (twice the outputs of layers with
//! parameters). A step's peak is reached during backward, when all of these are alive at once:
//! - parameters and buffers;
//! - gradients of the trainable parameters (accumulated as backward reaches each layer, all of
//!   them at the end);
//! - optimizer state from earlier steps: none for SGD, one buffer per trainable parameter for
//!   SGD with momentum, two for Adam/AdamW (`exp_avg`, `exp_avg_sq`);
//! - the activations saved for backward, from a shape-only trace: each leaf layer names what its
//!   backward reads (`Tracer::save`), a tensor kept by two ops counts once, and frozen layers
//!   keep nothing for their weight gradient. Traces at batch 1 and 2 split this into a
//!   per-sample part and a batch-independent part (BatchNorm statistics);
//! - the input batch, and the gradients in flight at the layer being differentiated: its output
//!   gradient and its input gradient (one tensor for the activations, ReLU, GELU, SiLU, sigmoid
//!   and tanh, whose backward writes the input gradient over the output gradient it reads).
//!
//! These are not all at their largest at once: backward meets the layers in reverse, producing
//! each layer's weight gradients and freeing what it saved as it goes. The plan replays the
//! forward pass (what is saved so far, plus each call's input, output and one temporary: for
//! frozen layers, which save nothing, that is the peak) and then backward over the traced
//! leaf-layer calls, takes the largest moment, and compares it with the optimizer step (all
//! gradients alive, activations freed). The step itself adds nothing: kiln-optim's SGD and
//! Adam/AdamW steps are fused multi-tensor passes that update parameters and state in place,
//! with no temporaries (measured against the allocation history at small batches, where the
//! step sets the peak of weight-heavy models, `tests/memory_history.rs`). The plan once gave
//! SGD two temporaries the size of the largest parameter, what the memory tests' hand-written
//! step held while kiln's in-place tensor ops still computed each result before writing it back
//! (they update in place now); against kiln-optim's SGD that over-predicted a weight-heavy MLP's
//! step by a third.
//! - kernel scratch, with [`plan_on`] for a CUDA device: each convolution's column matrices,
//!   which grow with the batch up to the images a pass unfolds at a time (the column budget,
//!   `kiln_device::ops::conv::cuda_conv_column_budget`) and stay constant beyond
//!   (`tests/memory_plan_cuda.rs` measures both plans against a real step;
//!   `kiln_device::ops::conv::cuda_conv2d_workspace` lists each pass's buffers, checked against
//!   the allocator in kiln-device's tests). Backward's scratch
//!   enters the timeline moment by moment, since which moment is a layer's peak changes with
//!   the batch. Not modelled: the CPU convolution backward's scratch (per-thread partial weight
//!   gradients, column and padded buffers), which a ResNet at batch 2 holds late in backward
//!   (5-8 MB, depending on the thread count): the plan is 5-9 % under there
//!   (`tests/memory_plan_resnet.rs`);
//! - allocator overhead: the caching allocator rounds blocks up and keeps freed blocks cached,
//!   so the device must hold more than the tensors do; modelled as a fraction of everything
//!   above (`allocator_overhead`, 10% by default). `peak_allocated_bytes` (without it) is
//!   what the caching allocator's `max_memory_allocated` reports; `tests/memory_plan.rs`
//!   checks the two agree within 10% on real CPU training steps.
//!
//! Sizes are checked: a peak that does not fit in `usize` does not fit any device, so
//! [`MemoryPlan::max_batch_size`] terminates for every budget (up to `usize::MAX`), and
//! [`parse_memory_size`] refuses negative, NaN, infinite or overflowing budgets by name.

use crate::error::Error;
use crate::trace::Tracer;
use crate::{Layer, Result};
use kiln_autograd::DType;
use std::fmt;
use std::str::FromStr;

/// The optimizer whose state the plan reserves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerKind {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum: one momentum buffer per parameter.
    SgdMomentum,
    /// Adam: `exp_avg` and `exp_avg_sq` per parameter.
    Adam,
    /// AdamW: as Adam.
    AdamW,
}

impl OptimizerKind {
    /// State buffers kept per trainable parameter element.
    pub fn state_buffers(self) -> usize {
        match self {
            OptimizerKind::Sgd => 0,
            OptimizerKind::SgdMomentum => 1,
            OptimizerKind::Adam | OptimizerKind::AdamW => 2,
        }
    }
}

impl FromStr for OptimizerKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sgd" => OptimizerKind::Sgd,
            "sgd-momentum" | "momentum" => OptimizerKind::SgdMomentum,
            "adam" => OptimizerKind::Adam,
            "adamw" => OptimizerKind::AdamW,
            other => {
                return Err(crate::error::config_err(
                    "optimizer",
                    format!("unknown optimizer {other:?}; use sgd, sgd-momentum, adam or adamw"),
                ))
            }
        })
    }
}

/// Memory needed by a training step, split by what holds it. Bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// The optimizer planned for.
    pub optimizer: OptimizerKind,
    /// All parameters.
    pub param_bytes: usize,
    /// Buffers (BatchNorm running statistics, ...).
    pub buffer_bytes: usize,
    /// Gradients of the trainable parameters.
    pub grad_bytes: usize,
    /// Optimizer state.
    pub optimizer_state_bytes: usize,
    /// Activations saved for backward, per sample.
    pub saved_activation_bytes_per_sample: usize,
    /// Activations saved for backward that do not grow with the batch.
    pub saved_activation_bytes_fixed: usize,
    /// The input, per sample.
    pub input_bytes_per_sample: usize,
    /// Gradients in flight during backward at the largest layer, per sample.
    pub gradient_in_flight_bytes_per_sample: usize,
    /// Fraction added for allocator rounding and caching.
    pub allocator_overhead: f64,
    /// The device whose kernels' scratch is included ([`plan_on`]); `None` for tensors only
    /// ([`plan`]).
    pub device: Option<kiln_device::Device>,
    /// Live bytes beyond parameters, buffers and optimizer state at each moment of the step.
    timeline: Vec<Moment>,
}

/// One moment of the step: tensors linear in the batch size, plus kernel scratch that is linear
/// up to `scratch_limit` samples and constant beyond (kernels that work in chunks of the batch).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Moment {
    per_sample: i64,
    fixed: i64,
    scratch_per_sample: i64,
    scratch_fixed: i64,
    scratch_limit: usize,
}

impl Moment {
    /// Live bytes at `batch` samples, or `None` when that does not fit in `i128`.
    fn at(&self, batch: i128) -> Option<i128> {
        let limited = batch.min(i128::try_from(self.scratch_limit).ok()?);
        let tensors =
            i128::from(self.fixed).checked_add(i128::from(self.per_sample).checked_mul(batch)?)?;
        let scratch = i128::from(self.scratch_fixed)
            .checked_add(i128::from(self.scratch_per_sample).checked_mul(limited)?)?;
        tensors.checked_add(scratch)
    }
}

impl MemoryPlan {
    /// Bytes alive through the whole step: parameters, buffers, gradients, optimizer state.
    pub fn fixed_bytes(&self) -> usize {
        self.param_bytes + self.buffer_bytes + self.grad_bytes + self.optimizer_state_bytes
    }

    /// Bytes per sample of the batch (before allocator overhead).
    pub fn per_sample_bytes(&self) -> usize {
        self.saved_activation_bytes_per_sample
            + self.input_bytes_per_sample
            + self.gradient_in_flight_bytes_per_sample
    }

    /// [`Self::peak_allocated_bytes`], or `None` when it does not fit in `usize`.
    fn checked_peak_allocated_bytes(&self, batch_size: usize) -> Option<usize> {
        let b = i128::try_from(batch_size).ok()?;
        let mut backward: i128 = 0;
        for m in &self.timeline {
            backward = backward.max(m.at(b)?);
        }
        let backward = usize::try_from(backward).ok()?;
        let step = self.grad_bytes;
        self.param_bytes
            .checked_add(self.buffer_bytes)?
            .checked_add(self.optimizer_state_bytes)?
            .checked_add(batch_size.checked_mul(self.input_bytes_per_sample)?)?
            .checked_add(backward.max(step))
    }

    /// [`Self::peak_bytes`], or `None` when it does not fit in `usize`.
    fn checked_peak_bytes(&self, batch_size: usize) -> Option<usize> {
        let raw = self.checked_peak_allocated_bytes(batch_size)?;
        let with_overhead = (raw as f64 * (1.0 + self.allocator_overhead)).ceil();
        // `usize::MAX as f64` rounds up to 2^64, which does not fit.
        (with_overhead < usize::MAX as f64).then_some(with_overhead as usize)
    }

    /// Predicted peak of bytes handed to tensors during one training step at `batch_size`
    /// (what `max_memory_allocated` measures); `usize::MAX` when it does not fit in `usize`.
    pub fn peak_allocated_bytes(&self, batch_size: usize) -> usize {
        self.checked_peak_allocated_bytes(batch_size)
            .unwrap_or(usize::MAX)
    }

    /// Predicted peak the device must provide: [`Self::peak_allocated_bytes`] plus the
    /// allocator overhead (rounding, cached blocks, fragmentation); `usize::MAX` when it does
    /// not fit in `usize`.
    pub fn peak_bytes(&self, batch_size: usize) -> usize {
        self.checked_peak_bytes(batch_size).unwrap_or(usize::MAX)
    }

    /// What this plan predicts for one step at `batch_size`, in the form the out-of-memory
    /// report prints (`kiln_device::set_memory_plan(device, Some(plan.prediction(b)))`):
    /// the peak of allocated bytes, and parameters (with buffers), gradients, optimizer state
    /// and the activations saved for backward (the input batch among them when the first
    /// layer keeps it, as the history counts it under `Data`).
    pub fn prediction(&self, batch_size: usize) -> kiln_device::PlanPrediction {
        use kiln_device::MemoryCategory as C;
        let saved = batch_size
            .saturating_mul(self.saved_activation_bytes_per_sample)
            .saturating_add(self.saved_activation_bytes_fixed);
        kiln_device::PlanPrediction {
            label: format!("{:?} step, batch {batch_size}", self.optimizer),
            peak_allocated: self.peak_allocated_bytes(batch_size),
            by_category: vec![
                (
                    C::Parameter,
                    self.param_bytes.saturating_add(self.buffer_bytes),
                ),
                (C::Gradient, self.grad_bytes),
                (C::OptimizerState, self.optimizer_state_bytes),
                (C::Activation, saved),
            ],
        }
    }

    /// The largest batch whose predicted peak fits in `device_memory_bytes` (any budget up to
    /// `usize::MAX`). Errors when not even one sample fits, or when every batch size fits
    /// (samples that take no memory, so there is no largest batch).
    pub fn max_batch_size(&self, device_memory_bytes: usize) -> Result<usize> {
        let fits = |b: usize| {
            self.checked_peak_bytes(b)
                .is_some_and(|peak| peak <= device_memory_bytes)
        };
        if !fits(1) {
            return Err(Error::Memory(format!(
                "{device_memory_bytes} bytes cannot hold even one sample: parameters, gradients \
                 and {:?} state need {} bytes and one sample {} more (plus {:.0}% allocator \
                 overhead); freeze layers, choose an optimizer with less state, or use a smaller \
                 model",
                self.optimizer,
                self.fixed_bytes(),
                self.per_sample_bytes(),
                self.allocator_overhead * 100.0
            )));
        }
        // The peak grows with the batch: find a batch that does not fit, then bisect.
        let (mut lo, mut hi) = (1usize, 2usize);
        while fits(hi) {
            lo = hi;
            hi = match hi.checked_mul(2) {
                Some(next) => next,
                None if fits(usize::MAX) => {
                    return Err(Error::Memory(format!(
                        "every batch size fits in {device_memory_bytes} bytes: one sample adds \
                         {} bytes; check the sample shape (a zero-sized dimension?)",
                        self.per_sample_bytes()
                    )))
                }
                None => usize::MAX,
            };
        }
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }
}

/// Plans a training step of `model` on inputs of one sample's shape `sample_shape` (without the
/// batch dim) and `dtype`, with `optimizer`: the tensors only, the same on every device (no
/// kernel's scratch; [`plan_on`] adds the scratch of the device that will run the step).
pub fn plan(
    model: &dyn Layer,
    sample_shape: &[usize],
    dtype: DType,
    optimizer: OptimizerKind,
) -> Result<MemoryPlan> {
    plan_traced(model, sample_shape, dtype, optimizer, None)
}

/// [`plan`] for a step on `device`, adding what its kernels allocate beyond their results at
/// the moment they run: on CUDA, the convolutions' column matrices, which grow with the batch
/// and can be the largest buffers of a convolutional network's step
/// (`kiln_device::ops::conv::cuda_conv2d_workspace`). The CPU convolutions' scratch depends on
/// the thread count and is not modelled, so on the CPU this equals [`plan`].
pub fn plan_on(
    model: &dyn Layer,
    sample_shape: &[usize],
    dtype: DType,
    optimizer: OptimizerKind,
    device: kiln_device::Device,
) -> Result<MemoryPlan> {
    plan_traced(model, sample_shape, dtype, optimizer, Some(device))
}

/// One moment of a trace at one batch size: (tensors, kernel scratch, the batch from which the
/// scratch stops growing).
type TracedMoment = (i64, i64, usize);

fn plan_traced(
    model: &dyn Layer,
    sample_shape: &[usize],
    dtype: DType,
    optimizer: OptimizerKind,
    device: Option<kiln_device::Device>,
) -> Result<MemoryPlan> {
    let too_big = |what: String| {
        Error::Memory(format!(
            "a sample of shape {sample_shape:?}: {what}; no device holds that, use a smaller \
             input"
        ))
    };
    let bytes_of = |p: &kiln_autograd::Parameter| {
        p.numel()
            .checked_mul(p.dtype().size_in_bytes())
            .ok_or_else(|| too_big("a parameter holds more than usize::MAX bytes".into()))
    };
    let sum = |a: usize, b: usize| {
        a.checked_add(b)
            .ok_or_else(|| too_big("the step needs more than usize::MAX bytes".into()))
    };
    let mut trainable = 0usize;
    for p in model.parameters().iter().filter(|p| p.requires_grad()) {
        trainable = sum(trainable, bytes_of(p)?)?;
    }
    // Live bytes at each leaf call of the forward pass (saved so far, input, output), then at
    // each one backward runs through, last first (saved still alive, gradients so far,
    // gradients in flight); and the largest in-flight figure.
    let trace_at = |batch: usize| -> Result<(usize, Vec<TracedMoment>, usize)> {
        let mut shape = vec![batch];
        shape.extend_from_slice(sample_shape);
        let mut t = match device {
            Some(d) => Tracer::on_device(d),
            None => Tracer::new(),
        };
        let x = t.input(&shape, dtype);
        t.call("", model, &x)?;
        if let Some(what) = t.overflow() {
            return Err(too_big(what.to_string()));
        }
        let events = t.events();
        let mut leaf_grads = 0usize;
        for e in events {
            leaf_grads = sum(leaf_grads, e.grad_bytes)?;
        }
        let mut grads = trainable.saturating_sub(leaf_grads);
        let mut live = Vec::with_capacity(events.len());
        let mut largest_in_flight = 0;
        let as_i64 = |b: usize| {
            i64::try_from(b).map_err(|_| too_big("the step needs more than i64::MAX bytes".into()))
        };
        for (i, e) in events.iter().enumerate() {
            // Forward: what is saved so far, the call's input and its output (each unless it
            // is among the saved values already) and the temporary it holds next to them
            // (Linear's matmul result before the bias is added), with its kernels' scratch.
            let unsaved = |bytes: usize, saved: bool| if saved { 0 } else { bytes };
            live.push((
                as_i64(sum(
                    sum(
                        t.saved_bytes_alive_at(i),
                        unsaved(e.input_bytes, e.input_saved),
                    )?,
                    sum(
                        unsaved(e.output_bytes, e.output_saved),
                        e.forward_temp_bytes,
                    )?,
                )?)?,
                as_i64(e.forward_scratch_bytes)?,
                e.scratch_batch_limit,
            ));
        }
        for (i, e) in events.iter().enumerate().rev() {
            if !e.recorded {
                continue;
            }
            grads = sum(grads, e.grad_bytes)?;
            // Backward: the output gradient arriving and the input gradient made from it (the
            // activation backwards are one fused op: no third tensor of that size, and they
            // write over the arriving gradient: one tensor).
            let in_flight = match e.input_grad_in_place {
                true => e.output_bytes.max(e.input_bytes),
                false => sum(e.output_bytes, e.input_bytes)?,
            };
            largest_in_flight = largest_in_flight.max(in_flight);
            let tensors = as_i64(sum(sum(t.saved_bytes_alive_at(i), grads)?, in_flight)?)?;
            live.push((tensors, 0, usize::MAX));
            // Each moment of the kernels' scratch is its own entry: each is linear in the
            // batch (up to the kernel's chunk), their maximum is not.
            for &scratch in &e.backward_scratch_bytes {
                live.push((tensors, scratch, e.scratch_batch_limit));
            }
        }
        Ok((t.saved_bytes(), live, largest_in_flight))
    };
    let (saved1, live1, in_flight1) = trace_at(1)?;
    let (saved2, live2, _) = trace_at(2)?;
    // Fitted through batch 1 and 2; a scratch that stops growing at 1 sample is constant.
    let timeline = live1
        .iter()
        .zip(&live2)
        .map(|(&(a, sa, limit), &(b, sb, _))| {
            let scratch_per_sample = if limit < 2 { 0 } else { sb.checked_sub(sa)? };
            Some(Moment {
                per_sample: b.checked_sub(a)?,
                fixed: a.checked_mul(2)?.checked_sub(b)?,
                scratch_per_sample,
                scratch_fixed: sa.checked_sub(scratch_per_sample)?,
                scratch_limit: limit,
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| too_big("the step needs more than i64::MAX bytes".into()))?;
    let per_sample = saved2.saturating_sub(saved1);
    let fixed = saved1.saturating_sub(per_sample);
    let (mut param_bytes, mut grad_bytes) = (0, 0);
    for p in model.parameters() {
        let b = p.numel() * p.dtype().size_in_bytes();
        param_bytes += b;
        if p.requires_grad() {
            grad_bytes += b;
        }
    }
    let buffer_bytes = crate::LayerExt::named_buffers(model)
        .iter()
        .map(|(_, b)| b.numel() * b.dtype().size_in_bytes())
        .sum();
    Ok(MemoryPlan {
        optimizer,
        param_bytes,
        buffer_bytes,
        grad_bytes,
        optimizer_state_bytes: grad_bytes * optimizer.state_buffers(),
        saved_activation_bytes_per_sample: per_sample,
        saved_activation_bytes_fixed: fixed,
        input_bytes_per_sample: crate::trace::checked_bytes(sample_shape, dtype)
            .ok_or_else(|| too_big("it holds more than usize::MAX bytes".into()))?,
        gradient_in_flight_bytes_per_sample: in_flight1,
        allocator_overhead: 0.10,
        device,
        timeline,
    })
}

/// Parses a memory budget: bytes (`25769803776`), or a number with a unit, `KB`/`MB`/`GB`/`TB`
/// (powers of 1000) or `KiB`/`MiB`/`GiB`/`TiB` (powers of 1024), e.g. `24GiB` or `1.5 GB`.
/// Errors name the problem and the fix: no number, an unknown unit, a negative, NaN or
/// infinite number, or a size beyond `usize::MAX` bytes.
pub fn parse_memory_size(text: &str) -> Result<usize> {
    let t = text.trim();
    let bad = |why: String| {
        crate::error::config_err(
            "memory size",
            format!("{text:?}: {why}; pass bytes or a number with KB/MB/GB/TB/KiB/MiB/GiB/TiB, e.g. 24GiB"),
        )
    };
    let split = t
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E' || c.is_whitespace())
        .unwrap_or(t.len());
    let (number, unit) = (t[..split].trim(), t[split..].trim());
    if number.is_empty() {
        return Err(bad("there is no number".into()));
    }
    let scale: f64 = match unit {
        "" | "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => return Err(bad(format!("unknown unit {other:?}"))),
    };
    if unit.is_empty() || unit == "B" {
        if let Ok(bytes) = number.parse::<usize>() {
            return Ok(bytes);
        }
    }
    let value: f64 = number
        .parse()
        .map_err(|_| bad(format!("{number:?} is not a number")))?;
    if value.is_nan() {
        return Err(bad("NaN is not a size".into()));
    }
    if value < 0.0 {
        return Err(bad("a memory size cannot be negative".into()));
    }
    let bytes = (value * scale).floor();
    // `usize::MAX as f64` is 2^64 (rounded up), the first size that does not fit.
    if bytes >= usize::MAX as f64 {
        let size = match unit {
            "" => format!("{value:?}"),
            _ => format!("{value:?} {unit}"),
        };
        return Err(bad(format!(
            "{size} is more than the {} bytes a usize can count",
            usize::MAX
        )));
    }
    Ok(bytes as usize)
}

/// The largest batch of `sample_shape` inputs a training step of `model` with `optimizer` fits
/// in `device_memory_bytes`, by the plan above.
pub fn max_batch_size(
    model: &dyn Layer,
    sample_shape: &[usize],
    optimizer: OptimizerKind,
    device_memory_bytes: usize,
) -> Result<usize> {
    plan(model, sample_shape, DType::F32, optimizer)?.max_batch_size(device_memory_bytes)
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mb = |b: usize| b as f64 / 1e6;
        writeln!(f, "Training memory plan ({:?})", self.optimizer)?;
        writeln!(f, "Parameters (MB): {:.2}", mb(self.param_bytes))?;
        writeln!(f, "Buffers (MB): {:.2}", mb(self.buffer_bytes))?;
        writeln!(f, "Gradients (MB): {:.2}", mb(self.grad_bytes))?;
        writeln!(
            f,
            "Optimizer state (MB): {:.2}",
            mb(self.optimizer_state_bytes)
        )?;
        writeln!(
            f,
            "Saved activations per sample (MB): {:.2} (+ {:.2} fixed)",
            mb(self.saved_activation_bytes_per_sample),
            mb(self.saved_activation_bytes_fixed)
        )?;
        writeln!(
            f,
            "Input + gradients in flight per sample (MB): {:.2}",
            mb(self.input_bytes_per_sample + self.gradient_in_flight_bytes_per_sample)
        )?;
        match self.device {
            Some(d) if d.is_cuda() => writeln!(f, "Kernel scratch: {d} convolutions included")?,
            Some(d) => writeln!(f, "Kernel scratch: not modelled on {d}")?,
            None => writeln!(f, "Kernel scratch: not included (tensors only)")?,
        }
        write!(
            f,
            "Allocator overhead: {:.0}%",
            self.allocator_overhead * 100.0
        )
    }
}
