//! The [`Layer`] trait: a [`Module`] that can run forward on data and forward on shapes.
//!
//! `kiln-autograd`'s `Module` knows parameters, children and train/eval. A `Layer` adds what
//! models need on top:
//! - `forward` on a tensor;
//! - `trace`, the shape-only forward: the same call structure as `forward`, but on [`Act`]
//!   values that carry only a shape and a dtype. Every sub-layer call goes through
//!   [`Tracer::call`], which records the layer tree the way torchinfo's hooks do (one row per
//!   call, in call order) and the activations the layer keeps for backward, so a summary or a
//!   memory plan of ResNet-50 at 224x224 allocates nothing;
//! - buffers (`running_mean`, ...) next to parameters, so state dicts carry PyTorch's names;
//! - typed children (`layers`), so walks over the tree reach buffers and traces.
//!
//! The `Module` impl of each layer is written through [`module_tree!`], which derives
//! `children`/`children_mut` from `layers`/`layers_mut` and the mode flag from a `training`
//! field, so the two trees cannot disagree.

use crate::trace::{Act, Tracer};
use crate::Result;
use kiln_autograd::{Module, Tensor};
use std::sync::Arc;

/// Where a batch norm in training gets the totals of its batch statistics when they must span
/// more than its own input (`SyncBatchNorm`'s all-reduce over every rank of a process group).
pub trait BatchStatsReduce: Send + Sync + std::fmt::Debug {
    /// The sum over every participant of `local` (a 1-d tensor of per-channel sums and the
    /// element count), differentiable: the gradient of `local` is the sum over participants of
    /// the output's gradient. Every participant calls it in the same order.
    fn sum(&self, local: &Tensor) -> Result<Tensor>;
}

/// A module with a forward pass on tensors and a shape-only forward pass.
pub trait Layer: Module + Send + Sync {
    /// PyTorch's class name (`"Conv2d"`, `"BasicBlock"`), shown by summaries.
    fn type_name(&self) -> &'static str;

    /// Runs the layer on `x`.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// [`Layer::forward`] of an input the caller gives up, which an elementwise layer may
    /// overwrite with its result where nothing else can see it (ReLU, as PyTorch's
    /// `inplace=True`). The same values as `forward`, which it calls by default.
    fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
        self.forward(&x)
    }

    /// The shape-only forward: same sub-layer calls as `forward`, each through `tracer.call`.
    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act>;

    /// Child layers with their names, in registration order (PyTorch's `named_children`).
    fn layers(&self) -> Vec<(String, &dyn Layer)> {
        Vec::new()
    }

    /// Child layers, mutable.
    fn layers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        Vec::new()
    }

    /// This layer's own buffers (not its children's): state that is saved but not trained.
    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// This layer as a `Module`.
    fn as_module(&self) -> &dyn Module;

    /// This layer as a mutable `Module`.
    fn as_module_mut(&mut self) -> &mut dyn Module;

    /// The batch-statistics reduction of a batch norm layer (`None` on every other layer): set
    /// it to share its training statistics across processes ([`set_batch_stats_reduce`]).
    fn batch_stats_reduce_mut(&mut self) -> Option<&mut Option<Arc<dyn BatchStatsReduce>>> {
        None
    }
}

/// Sets the batch-statistics reduction of every batch norm layer in `layer`'s tree (`None`
/// restores per-process statistics); returns how many layers it set.
pub fn set_batch_stats_reduce(
    layer: &mut dyn Layer,
    reduce: Option<Arc<dyn BatchStatsReduce>>,
) -> usize {
    let mut count = 0;
    if let Some(slot) = layer.batch_stats_reduce_mut() {
        *slot = reduce.clone();
        count += 1;
    }
    for (_, child) in layer.layers_mut() {
        count += set_batch_stats_reduce(child, reduce.clone());
    }
    count
}

/// True when any of `params` requires grad (for traces: a frozen layer saves nothing for its
/// weight gradient).
pub fn any_trainable<'a>(params: impl IntoIterator<Item = &'a kiln_autograd::Parameter>) -> bool {
    params.into_iter().any(|p| p.requires_grad())
}

/// Tree walks every layer gets: buffers and state dicts with dotted names.
pub trait LayerExt {
    /// Every buffer with its dotted path (`"bn1.running_mean"`), PyTorch's `named_buffers()`.
    fn named_buffers(&self) -> Vec<(String, Tensor)>;

    /// Parameters and buffers with dotted names, in PyTorch's `state_dict()` order (per module:
    /// own parameters, own buffers, then each child).
    fn state_dict(&self) -> Vec<(String, Tensor)>;

    /// Moves every parameter and buffer to `device` in place (PyTorch's `model.to(device)`):
    /// parameters keep their handles, names and `requires_grad`, so an optimizer built before
    /// the move keeps working; gradients move with them. Build the optimizer after moving when
    /// it already holds state (its state stays where it was).
    fn to_device(&self, device: kiln_device::Device) -> Result<()>;
}

impl<L: Layer + ?Sized> LayerExt for L {
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut out = self.own_buffers();
        for (child_name, child) in self.layers() {
            for (name, b) in child.named_buffers() {
                out.push((format!("{child_name}.{name}"), b));
            }
        }
        out
    }

    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = self
            .own_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.tensor().clone()))
            .collect();
        out.extend(self.own_buffers());
        for (child_name, child) in self.layers() {
            for (name, t) in child.state_dict() {
                out.push((format!("{child_name}.{name}"), t));
            }
        }
        out
    }

    fn to_device(&self, device: kiln_device::Device) -> Result<()> {
        let _parameters = crate::scope::parameters();
        for (_, t) in self.state_dict() {
            t.to_device_(device)?;
        }
        Ok(())
    }
}

/// Writes the parts of a `Module` impl that follow from the `Layer` impl and a `training: bool`
/// field: `children`, `children_mut`, `is_training`, `set_training_flag`.
#[macro_export]
macro_rules! module_tree {
    () => {
        fn children(&self) -> Vec<(String, &dyn kiln_autograd::Module)> {
            $crate::Layer::layers(self)
                .into_iter()
                .map(|(n, l)| (n, l.as_module()))
                .collect()
        }
        fn children_mut(&mut self) -> Vec<(String, &mut dyn kiln_autograd::Module)> {
            $crate::Layer::layers_mut(self)
                .into_iter()
                .map(|(n, l)| (n, l.as_module_mut()))
                .collect()
        }
        fn is_training(&self) -> bool {
            self.training
        }
        fn set_training_flag(&mut self, training: bool) {
            self.training = training;
        }
    };
}

/// Writes `as_module` / `as_module_mut` inside a `Layer` impl.
#[macro_export]
macro_rules! layer_casts {
    () => {
        fn as_module(&self) -> &dyn kiln_autograd::Module {
            self
        }
        fn as_module_mut(&mut self) -> &mut dyn kiln_autograd::Module {
            self
        }
    };
}
