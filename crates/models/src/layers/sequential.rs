//! `Sequential`: named layers applied in order.

use crate::error::config_err;
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{Module, Tensor};

/// Layers run one after another (`torch.nn.Sequential`). Children are named `"0"`, `"1"`, ...
/// unless pushed with a name (as torchvision's ViT does: `encoder_layer_0`, `head`).
pub struct Sequential {
    items: Vec<(String, Box<dyn Layer>)>,
    type_name: &'static str,
    training: bool,
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .items
            .iter()
            .map(|(n, l)| format!("{n}: {}", l.type_name()))
            .collect();
        write!(f, "Sequential({})", names.join(", "))
    }
}

impl Sequential {
    /// An empty sequence.
    pub fn new() -> Self {
        Sequential {
            items: Vec::new(),
            type_name: "Sequential",
            training: true,
        }
    }

    /// The same sequence shown under another class name in summaries (torchvision's `MLPBlock`
    /// is an `nn.Sequential` subclass).
    pub fn with_type_name(mut self, type_name: &'static str) -> Self {
        self.type_name = type_name;
        self
    }

    /// Appends `layer` named by its position.
    pub fn push(mut self, layer: impl Layer + 'static) -> Self {
        let name = self.items.len().to_string();
        self.items.push((name, Box::new(layer)));
        self
    }

    /// Appends `layer` under `name` (names must be unique).
    pub fn push_named(mut self, name: &str, layer: impl Layer + 'static) -> Result<Self> {
        if name.is_empty() || name.contains('.') || self.items.iter().any(|(n, _)| n == name) {
            return Err(config_err(
                "Sequential",
                format!("child name {name:?} must be non-empty, without '.', and unique"),
            ));
        }
        self.items.push((name.to_string(), Box::new(layer)));
        Ok(self)
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The layer at position `i`.
    pub fn get(&self, i: usize) -> Option<&dyn Layer> {
        self.items.get(i).map(|(_, l)| l.as_ref())
    }
}

impl Default for Sequential {
    fn default() -> Self {
        Sequential::new()
    }
}

impl Module for Sequential {
    module_tree!();
}

impl Layer for Sequential {
    fn type_name(&self) -> &'static str {
        self.type_name
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_owned(x.clone())
    }

    /// Each layer is handed the previous one's output, which it may write over
    /// ([`Layer::forward_owned`]); the first gets `x`, which stays the caller's if it kept a
    /// handle.
    fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
        // The whole pass on kiln's CPU pool, not op by op.
        kiln_autograd::on_cpu_pool(x.device(), || {
            let mut h = x;
            for (name, l) in &self.items {
                h = crate::scope::forward_owned_in(name, l.as_ref(), h)?;
            }
            Ok(h)
        })
    }

    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        let mut h = x.clone();
        for (name, l) in &self.items {
            h = tracer.call(name, l.as_ref(), &h)?;
        }
        Ok(h)
    }

    fn layers(&self) -> Vec<(String, &dyn Layer)> {
        self.items
            .iter()
            .map(|(n, l)| (n.clone(), l.as_ref()))
            .collect()
    }

    fn layers_mut(&mut self) -> Vec<(String, &mut dyn Layer)> {
        self.items
            .iter_mut()
            .map(|(n, l)| (n.clone(), l.as_mut() as &mut dyn Layer))
            .collect()
    }

    layer_casts!();
}
