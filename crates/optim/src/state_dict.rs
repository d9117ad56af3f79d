//! What an optimizer's state dict is made of: per-parameter step counts and buffers, group
//! options, and the whole dict ([`StateDict`], serialisable with serde).
//!
//! Invariants: a saved tensor keeps its values as `f64` (exact for every float dtype), and is
//! only turned back into a tensor after its value count, finiteness, shape and dtype are checked
//! against the parameter it belongs to, with a message naming what is wrong and the fix.

use crate::{Error, Result};
use kiln_autograd::Tensor;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A saved tensor: dtype name, shape, and the values as `f64` (exact for every float dtype).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorRecord {
    /// PyTorch's dtype name (`"float32"`).
    pub dtype: String,
    /// The shape.
    pub shape: Vec<usize>,
    /// The values, row-major.
    pub data: Vec<f64>,
}

impl TensorRecord {
    /// Records `t`.
    pub fn from_tensor(t: &Tensor) -> Result<Self> {
        Ok(TensorRecord {
            dtype: t.dtype().as_str().to_string(),
            shape: t.shape().to_vec(),
            data: t.to_vec_f64()?,
        })
    }

    /// The tensor again, in `like`'s dtype and on its device, checked against `like`'s shape;
    /// a value count that does not fit the shape, or a NaN/infinite value, is an error naming
    /// `what` (a moment like that would turn every parameter into NaN at the next step).
    pub fn to_tensor_like(&self, like: &Tensor, what: &str) -> Result<Tensor> {
        let Some(want) = self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) else {
            return Err(Error::StateDict(format!(
                "{what}: saved shape {:?} has more elements than any memory holds (their count \
                 overflows); the state dict is edited or corrupt, load an intact one",
                self.shape
            )));
        };
        if self.data.len() != want {
            return Err(Error::StateDict(format!(
                "{what}: saved shape {:?} needs {want} values but {} are stored; the state dict \
                 is truncated or edited, load an intact one",
                self.shape,
                self.data.len()
            )));
        }
        if let Some(i) = self.data.iter().position(|v| !v.is_finite()) {
            return Err(Error::StateDict(format!(
                "{what}: value {i} is {:?}; a non-finite optimizer state would make the parameters \
                 NaN, load a state dict saved before training diverged",
                self.data[i]
            )));
        }
        if self.shape != like.shape() || self.dtype != like.dtype().as_str() {
            return Err(Error::StateDict(format!(
                "{what}: saved {} {:?} does not match the parameter's {} {:?}; load a state dict \
                 saved from the same model",
                self.dtype,
                self.shape,
                like.dtype(),
                like.shape()
            )));
        }
        let t = Tensor::from_vec(self.data.clone(), &self.shape, kiln_autograd::Device::Cpu)?;
        Ok(t.to_dtype(like.dtype())?.to_device(like.device())?)
    }

    /// Like [`TensorRecord::to_tensor_like`], and also rejects a negative value (a second
    /// moment such as Adam's `exp_avg_sq` is a mean of squares; its square root must exist).
    pub fn to_nonnegative_tensor_like(&self, like: &Tensor, what: &str) -> Result<Tensor> {
        let t = self.to_tensor_like(like, what)?;
        if let Some(i) = self.data.iter().position(|v| *v < 0.0) {
            return Err(Error::StateDict(format!(
                "{what}: value {i} is {:?}, but a second moment is never negative; load a state \
                 dict saved by this optimizer, unedited",
                self.data[i]
            )));
        }
        Ok(t)
    }
}

/// The state of one parameter: its step count and named buffers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamStateRecord {
    /// Steps taken by this parameter.
    pub step: u64,
    /// Buffers (`"exp_avg"`, `"momentum_buffer"`, ...).
    pub buffers: BTreeMap<String, TensorRecord>,
}

/// One group in a state dict: its parameter names and options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// Names of the group's parameters, in order.
    pub params: Vec<String>,
    /// The group's options.
    pub options: serde_json::Value,
    /// The lr recorded by the first scheduler (PyTorch's `initial_lr`); absent in state dicts
    /// written before it was kept, which load as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_lr: Option<f64>,
}

/// A whole optimizer's state (serde: save it with `serde_json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateDict {
    /// The optimizer kind.
    pub optimizer: String,
    /// Groups in order.
    pub groups: Vec<GroupRecord>,
    /// Per-parameter state by position over all groups; `None` for parameters never stepped.
    pub state: Vec<Option<ParamStateRecord>>,
}
