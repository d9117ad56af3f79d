//! The shape-only forward pass: [`Act`] values and the [`Tracer`] that records layer calls.
//!
//! A trace runs a model's call structure on shapes alone. Each sub-layer call goes through
//! [`Tracer::call`], which appends one [`LayerRecord`] per call, in call order, exactly as
//! torchinfo's forward pre-hooks do: depth in the tree, parameter counts (trainable or not),
//! output shape and bytes, and mult-adds counted torchinfo's way (below). A module called twice
//! (ResNet's shared `relu`) gets two rows, the second marked recursive, as in torchinfo.
//!
//! Leaf layers also tell the tracer what they keep for backward ([`Tracer::save`]): every
//! activation value has an id, so a tensor saved by two ops (a ReLU's output that the next
//! convolution also saves as its input) counts once. That set is the "activations saved for
//! backward" term of the training memory plan (`crate::plan`).
//!
//! Mult-adds follow torchinfo 1.8 (`LayerInfo.calculate_macs`), so the totals match it: for a
//! leaf layer, each parameter named `weight` or `bias` adds `numel * out[0] * prod(out[2..])` in
//! a convolution and `numel * out[0]` elsewhere (so a `Linear` applied to `[N, L, D]` counts `N`,
//! not `N * L`, rows: torchinfo's figure, not the true FLOP count); other parameters whose name
//! contains `weight`/`bias` (`in_proj_weight`) add `numel * out[0] * out[1]`.
//!
//! Sizes never wrap: element and byte counts saturate at `usize::MAX`, and the first shape or
//! mult-add count that does not fit in `usize` is kept ([`Tracer::overflow`]), so a summary or
//! plan of a 2^62 batch is an error instead of a table of wrapped numbers.

use crate::layer::Layer;
use crate::Result;
use kiln_autograd::DType;
use std::collections::{BTreeMap, HashSet};

/// A value in a shape-only forward: a shape, a dtype and an identity (no data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Act {
    shape: Vec<usize>,
    dtype: DType,
    id: usize,
    requires_grad: bool,
}

impl Act {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements (`usize::MAX` when that does not fit in `usize`).
    pub fn numel(&self) -> usize {
        checked_numel(&self.shape).unwrap_or(usize::MAX)
    }

    /// True when gradients flow through this value (it depends on a trainable parameter or on
    /// a value that does); ops record saved tensors only then, as autograd does.
    pub fn requires_grad(&self) -> bool {
        self.requires_grad
    }

    /// Size of the data this value would hold (`usize::MAX` when that does not fit).
    pub fn bytes(&self) -> usize {
        checked_bytes(&self.shape, self.dtype).unwrap_or(usize::MAX)
    }
}

/// Elements of `shape`, or `None` when the product overflows `usize`.
pub(crate) fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// Bytes of a `shape` tensor of `dtype`, or `None` when that overflows `usize`.
pub(crate) fn checked_bytes(shape: &[usize], dtype: DType) -> Option<usize> {
    checked_numel(shape)?.checked_mul(dtype.size_in_bytes())
}

/// One layer call seen by a trace (one row of a torchinfo table).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerRecord {
    /// PyTorch class name (`"Conv2d"`).
    pub type_name: &'static str,
    /// Dotted path of the layer in the model (`"layer1.0.conv1"`; empty for the model itself).
    pub path: String,
    /// Depth in the tree: 0 for the model, 1 for its children, ...
    pub depth: usize,
    /// Position among all rows of the same depth, from 1 (torchinfo's `depth-idx`).
    pub depth_index: usize,
    /// Parameters of the layer and its descendants.
    pub num_params: usize,
    /// The part of `num_params` that requires grad.
    pub trainable_params: usize,
    /// Bytes of those parameters.
    pub param_bytes: usize,
    /// Output shape of this call.
    pub output_shape: Vec<usize>,
    /// Bytes of the output of this call.
    pub output_bytes: usize,
    /// Mult-adds of this call, torchinfo's way (leaf layers only; 0 for containers).
    pub macs: usize,
    /// True when the layer has no child layers.
    pub is_leaf: bool,
    /// True when this layer object was already called earlier in the trace.
    pub is_recursive: bool,
}

/// One leaf-layer call, as the backward pass will meet it (for the memory plan's timeline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackwardEvent {
    /// Bytes of the call's input (its input gradient is produced here).
    pub input_bytes: usize,
    /// Bytes of the call's output (its output gradient arrives here).
    pub output_bytes: usize,
    /// Bytes of the layer's trainable parameters (their gradients are produced here).
    pub grad_bytes: usize,
    /// True when backward runs through this call (its output requires grad).
    pub recorded: bool,
    /// Bytes of a temporary tensor the forward holds next to its output (Linear with a bias:
    /// the matmul result the bias is added to).
    pub forward_temp_bytes: usize,
    /// Bytes of kernel scratch the forward holds next to its output (a convolution's columns on
    /// a traced device, see `kiln_device::ops::conv::ConvWorkspace`).
    pub forward_scratch_bytes: usize,
    /// Bytes of kernel scratch the backward of the call holds beyond its gradients at each
    /// moment that can be its peak; empty when it holds none.
    pub backward_scratch_bytes: Vec<i64>,
    /// The batch size from which the kernel scratch stops growing (kernels that work through
    /// the batch in chunks of this many samples); `usize::MAX` when it grows with every sample.
    pub scratch_batch_limit: usize,
    /// True when the call's input is among the values saved for backward by then (by this call
    /// or an earlier one): the forward's live bytes count it once, as saved.
    pub input_saved: bool,
    /// True when the call's output is saved for backward by the call itself (ReLU keeps its
    /// output): counted once, as saved.
    pub output_saved: bool,
    /// True when the call's backward writes its input gradient over the output gradient it
    /// reads (the activations: kiln-autograd's elementwise rules take a gradient no one else
    /// holds), so one tensor of that size is in flight, not two.
    pub input_grad_in_place: bool,
}

/// Records layer calls and saved activations during a shape-only forward.
#[derive(Debug, Default)]
pub struct Tracer {
    records: Vec<LayerRecord>,
    path: Vec<String>,
    depth: usize,
    next_id: usize,
    saved: BTreeMap<usize, usize>,
    /// Per saved value: the first leaf call that saved it (backward frees it there).
    first_saver: BTreeMap<usize, usize>,
    events: Vec<BackwardEvent>,
    seen: HashSet<(usize, &'static str)>,
    /// The first size that overflowed `usize` (see the module docs).
    overflow: Option<String>,
    /// Set by the leaf layer being traced: its [`BackwardEvent::forward_temp_bytes`].
    forward_temp_bytes: usize,
    /// Set by the leaf layer being traced: its [`BackwardEvent::forward_scratch_bytes`].
    forward_scratch_bytes: usize,
    /// Set by the leaf layer being traced: its [`BackwardEvent::backward_scratch_bytes`].
    backward_scratch_bytes: Vec<i64>,
    /// Set by the leaf layer being traced: its [`BackwardEvent::scratch_batch_limit`].
    scratch_batch_limit: usize,
    /// Set by the leaf layer being traced: its [`BackwardEvent::input_grad_in_place`].
    input_grad_in_place: bool,
    /// The device whose kernels' scratch layers report; `None` for tensors only.
    device: Option<kiln_device::Device>,
}

impl Tracer {
    /// An empty trace of tensors only: no kernel scratch (the same on every device).
    pub fn new() -> Self {
        Tracer::default()
    }

    /// An empty trace for `device`: layers whose kernels there need scratch beyond their
    /// results report it ([`Tracer::kernel_scratch`]).
    pub fn on_device(device: kiln_device::Device) -> Self {
        Tracer {
            device: Some(device),
            ..Tracer::default()
        }
    }

    /// The device this trace describes, if any (see [`Tracer::on_device`]).
    pub fn device(&self) -> Option<kiln_device::Device> {
        self.device
    }

    /// A model input of `shape` and `dtype` (no gradient flows into it).
    pub fn input(&mut self, shape: &[usize], dtype: DType) -> Act {
        self.fresh(shape, dtype, false)
    }

    /// The first size of this trace that did not fit in `usize` (a shape's bytes or a layer's
    /// mult-adds), described with the layer it belongs to; `None` when every size fits.
    pub fn overflow(&self) -> Option<&str> {
        self.overflow.as_deref()
    }

    fn note_overflow(&mut self, what: impl FnOnce() -> String) {
        if self.overflow.is_none() {
            self.overflow = Some(what());
        }
    }

    fn check_shape(&mut self, shape: &[usize], dtype: DType) {
        if checked_bytes(shape, dtype).is_none() {
            let at = self.path.join(".");
            self.note_overflow(|| {
                format!(
                    "a {dtype:?} value of shape {shape:?} (at layer {at:?}) holds more than \
                     usize::MAX bytes"
                )
            });
        }
    }

    /// The output of an op on `inputs`: it requires grad when an input does or when the op has
    /// a trainable parameter (`trainable`).
    pub fn output(
        &mut self,
        inputs: &[&Act],
        shape: &[usize],
        dtype: DType,
        trainable: bool,
    ) -> Act {
        let rg = trainable || inputs.iter().any(|a| a.requires_grad);
        self.fresh(shape, dtype, rg)
    }

    /// A view of `x` with another shape (same storage, so saving it counts `x` once).
    pub fn view(&mut self, x: &Act, shape: &[usize]) -> Act {
        self.check_shape(shape, x.dtype);
        Act {
            shape: shape.to_vec(),
            ..x.clone()
        }
    }

    fn fresh(&mut self, shape: &[usize], dtype: DType, requires_grad: bool) -> Act {
        self.check_shape(shape, dtype);
        self.next_id += 1;
        Act {
            shape: shape.to_vec(),
            dtype,
            id: self.next_id,
            requires_grad,
        }
    }

    /// Notes that the leaf layer being traced holds a temporary of `bytes` next to its output
    /// during its forward (see [`BackwardEvent::forward_temp_bytes`]).
    pub fn forward_temporary(&mut self, bytes: usize) {
        self.forward_temp_bytes = self.forward_temp_bytes.saturating_add(bytes);
    }

    /// Notes the kernel scratch of the leaf layer being traced: `forward` bytes next to its
    /// output, `backward` bytes beyond its gradients at the moments that can be its backward's
    /// peak (pass `&[]` when backward does not run through it), both growing with the batch
    /// up to `batch_limit` samples and constant beyond (see
    /// [`BackwardEvent::scratch_batch_limit`]).
    pub fn kernel_scratch(&mut self, forward: usize, backward: &[i64], batch_limit: usize) {
        self.forward_scratch_bytes = self.forward_scratch_bytes.saturating_add(forward);
        self.backward_scratch_bytes.extend_from_slice(backward);
        self.scratch_batch_limit = self.scratch_batch_limit.min(batch_limit);
    }

    /// Notes that the backward of the leaf layer being traced writes its input gradient over its
    /// output gradient (see [`BackwardEvent::input_grad_in_place`]).
    pub fn input_grad_in_place(&mut self) {
        self.input_grad_in_place = true;
    }

    /// Marks `act` as kept alive for backward (counted once however many ops keep it).
    pub fn save(&mut self, act: &Act) {
        self.saved.insert(act.id, act.bytes());
        let event = self.events.len();
        self.first_saver.entry(act.id).or_insert(event);
    }

    /// A fresh value that is kept for backward (statistics, pooling indices, dropout masks).
    pub fn save_new(&mut self, shape: &[usize], dtype: DType) -> Act {
        let a = self.fresh(shape, dtype, false);
        self.save(&a);
        a
    }

    /// Calls `layer` (registered as `name` in the current parent) on `x`, recording one row.
    /// The outermost call is the model itself (depth 0); its name is ignored.
    pub fn call(&mut self, name: &str, layer: &dyn Layer, x: &Act) -> Result<Act> {
        let params = layer.named_parameters();
        let mut num_params = 0;
        let mut trainable_params = 0;
        let mut param_bytes = 0;
        for (_, p) in &params {
            num_params += p.numel();
            param_bytes += p.numel() * p.dtype().size_in_bytes();
            if p.requires_grad() {
                trainable_params += p.numel();
            }
        }
        let key = (
            layer as *const dyn Layer as *const () as usize,
            layer.type_name(),
        );
        let is_recursive = !self.seen.insert(key);
        let depth = self.depth;
        if depth > 0 {
            self.path.push(name.to_string());
        }
        let path = self.path.join(".");
        let row = self.records.len();
        self.records.push(LayerRecord {
            type_name: layer.type_name(),
            path,
            depth,
            depth_index: 0,
            num_params,
            trainable_params,
            param_bytes,
            output_shape: Vec::new(),
            output_bytes: 0,
            macs: 0,
            is_leaf: layer.layers().is_empty(),
            is_recursive,
        });
        let is_leaf = layer.layers().is_empty();
        self.depth += 1;
        self.forward_temp_bytes = 0;
        self.forward_scratch_bytes = 0;
        self.backward_scratch_bytes.clear();
        self.scratch_batch_limit = usize::MAX;
        self.input_grad_in_place = false;
        let out = layer.trace(self, x);
        let forward_temp_bytes = std::mem::take(&mut self.forward_temp_bytes);
        let forward_scratch_bytes = std::mem::take(&mut self.forward_scratch_bytes);
        let backward_scratch_bytes = std::mem::take(&mut self.backward_scratch_bytes);
        let scratch_batch_limit = std::mem::replace(&mut self.scratch_batch_limit, usize::MAX);
        let input_grad_in_place = std::mem::take(&mut self.input_grad_in_place);
        self.depth -= 1;
        if let (true, Ok(o)) = (is_leaf, &out) {
            let grad_bytes = layer
                .own_parameters()
                .iter()
                .filter(|(_, p)| p.requires_grad())
                .map(|(_, p)| p.numel() * p.dtype().size_in_bytes())
                .sum();
            self.events.push(BackwardEvent {
                input_bytes: x.bytes(),
                output_bytes: o.bytes(),
                grad_bytes,
                recorded: o.requires_grad(),
                forward_temp_bytes,
                forward_scratch_bytes,
                backward_scratch_bytes,
                scratch_batch_limit,
                input_saved: self.saved.contains_key(&x.id),
                output_saved: self.saved.contains_key(&o.id),
                input_grad_in_place,
            });
        }
        if depth > 0 {
            self.path.pop();
        }
        let out = out?;
        let rec = &mut self.records[row];
        rec.output_shape = out.shape.clone();
        rec.output_bytes = out.bytes();
        if rec.is_leaf {
            match torchinfo_macs(rec.type_name, &out.shape, &params) {
                Some(macs) => rec.macs = macs,
                None => {
                    rec.macs = usize::MAX;
                    let (layer, shape) = (rec.path.clone(), out.shape.clone());
                    self.note_overflow(|| {
                        format!(
                            "the mult-adds of layer {layer:?} (output {shape:?}) exceed \
                             usize::MAX"
                        )
                    });
                }
            }
        }
        Ok(out)
    }

    /// The rows recorded so far, with depth indices filled in.
    pub fn records(&self) -> Vec<LayerRecord> {
        let mut counters: BTreeMap<usize, usize> = BTreeMap::new();
        self.records
            .iter()
            .map(|r| {
                let c = counters.entry(r.depth).or_insert(0);
                *c += 1;
                LayerRecord {
                    depth_index: *c,
                    ..r.clone()
                }
            })
            .collect()
    }

    /// Bytes of all distinct values saved for backward so far.
    pub fn saved_bytes(&self) -> usize {
        self.saved
            .values()
            .fold(0usize, |sum, &b| sum.saturating_add(b))
    }

    /// Leaf-layer calls in forward order (backward meets them in reverse).
    pub fn events(&self) -> &[BackwardEvent] {
        &self.events
    }

    /// Bytes of saved values still alive while backward processes leaf call `event`: those
    /// whose first saver is `event` or earlier.
    pub fn saved_bytes_alive_at(&self, event: usize) -> usize {
        self.saved
            .iter()
            .filter(|(id, _)| {
                // Values saved after the last leaf call live until backward starts freeing.
                self.first_saver
                    .get(id)
                    .is_some_and(|&e| e <= event || e >= self.events.len())
            })
            .fold(0usize, |sum, (_, &b)| sum.saturating_add(b))
    }

    /// Number of distinct values saved for backward so far.
    pub fn saved_count(&self) -> usize {
        self.saved.len()
    }
}

/// torchinfo's mult-adds of one leaf call; `None` when the count overflows `usize`.
fn torchinfo_macs(
    type_name: &str,
    out: &[usize],
    params: &[(String, kiln_autograd::Parameter)],
) -> Option<usize> {
    let mut macs = 0usize;
    let first = out.first().copied().unwrap_or(1);
    for (name, p) in params {
        let local = name.rsplit('.').next().unwrap_or(name);
        let term = if local == "weight" || local == "bias" {
            if type_name.contains("Conv") {
                p.numel()
                    .checked_mul(first)?
                    .checked_mul(checked_numel(out.get(2..).unwrap_or(&[]))?)?
            } else {
                p.numel().checked_mul(first)?
            }
        } else if local.contains("weight") || local.contains("bias") {
            p.numel()
                .checked_mul(checked_numel(&out[..out.len().min(2)])?)?
        } else {
            0
        };
        macs = macs.checked_add(term)?;
    }
    Some(macs)
}
