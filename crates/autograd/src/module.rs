//! [`Parameter`] and the [`Module`] trait.
//!
//! A `Parameter` is a leaf tensor that requires grad, shared by handle: the module, the optimizer
//! and the caller all see the same data and the same `.grad()`. A `Module` lists its own
//! parameters and its child modules; names are dotted paths (`"encoder.0.weight"`), as in
//! PyTorch's `named_parameters()`, so state dicts line up with PyTorch checkpoints. Layers live
//! in `kiln-models`.

use crate::tensor::Tensor;
use crate::Result;
use std::ops::Deref;

/// A trainable tensor: a leaf with `requires_grad = true` (until frozen).
#[derive(Clone, Debug)]
pub struct Parameter(Tensor);

impl Parameter {
    /// Wraps `tensor` (detached from any history) as a parameter that requires grad.
    pub fn new(tensor: Tensor) -> Result<Self> {
        let t = tensor.detach();
        t.set_requires_grad(true)?;
        Ok(Parameter(t))
    }

    /// The tensor handle (shares data and grad with the parameter).
    pub fn tensor(&self) -> &Tensor {
        &self.0
    }
}

impl Deref for Parameter {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.0
    }
}

/// A layer or model: parameters, children, and a train/eval mode.
pub trait Module {
    /// This module's own parameters (not its children's), with local names like `"weight"`.
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        Vec::new()
    }

    /// Child modules with their names (`"0"`, `"encoder"`, ...).
    fn children(&self) -> Vec<(String, &dyn Module)> {
        Vec::new()
    }

    /// Child modules, mutable (for `train`/`eval`).
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        Vec::new()
    }

    /// True in training mode (the default for new modules).
    fn is_training(&self) -> bool;

    /// Sets this module's own mode flag (not the children's; `train` recurses).
    fn set_training_flag(&mut self, training: bool);

    /// Every parameter with its dotted path, parents' own parameters first, then children in order.
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut out = self.own_parameters();
        for (child_name, child) in self.children() {
            for (name, p) in child.named_parameters() {
                out.push((format!("{child_name}.{name}"), p));
            }
        }
        out
    }

    /// Every parameter, in `named_parameters` order.
    fn parameters(&self) -> Vec<Parameter> {
        self.named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    /// Sets training mode on this module and every descendant.
    fn train(&mut self, training: bool) {
        self.set_training_flag(training);
        for (_, child) in self.children_mut() {
            child.train(training);
        }
    }

    /// Evaluation mode (`train(false)`).
    fn eval(&mut self) {
        self.train(false);
    }

    /// Clears every parameter's gradient: dropped when `set_to_none` (PyTorch's default), else
    /// replaced by zeros.
    fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        for p in self.parameters() {
            if set_to_none {
                p.set_grad(None)?;
            } else if let Some(g) = p.grad() {
                p.set_grad(Some(g.zeros_like()?))?;
            }
        }
        Ok(())
    }

    /// Freezes (`false`) or unfreezes every parameter.
    fn set_requires_grad(&self, requires_grad: bool) -> Result<()> {
        for p in self.parameters() {
            p.set_requires_grad(requires_grad)?;
        }
        Ok(())
    }
}
