//! `cat` and `stack`: one new buffer, each input copied into its region through `copy_into`;
//! the backward hands each input the matching `narrow` of the gradient.

use crate::error::{arg_err, shape_err};
use crate::tensor::{checked_numel, fmt_shape, resolve_dim, Tensor};
use crate::Result;
use kiln_device::prelude::*;
use kiln_device::{Layout, Storage};

impl Tensor {
    /// Concatenation along `dim`; all other dims must match.
    pub fn cat(tensors: &[Tensor], dim: isize) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("CatBackward");
        let Some(first) = tensors.first() else {
            return Err(arg_err("cat", "expects at least one tensor"));
        };
        if first.rank() == 0 {
            return Err(shape_err(
                "cat",
                "cannot concatenate 0-d tensors; unsqueeze them or use stack",
            ));
        }
        let d = resolve_dim("cat", dim, first.rank())?;
        let mut shape = first.shape().to_vec();
        shape[d] = 0;
        for (i, t) in tensors.iter().enumerate() {
            first.check_same_kind("cat", t)?;
            let same_rank = t.rank() == first.rank();
            if !same_rank
                || t.shape()
                    .iter()
                    .enumerate()
                    .any(|(j, &s)| j != d && s != first.shape()[j])
            {
                return Err(shape_err(
                    "cat",
                    format!(
                        "tensor {i} has shape {} but tensor 0 has {}: all dims except dim {dim} must match",
                        fmt_shape(t.shape()),
                        fmt_shape(first.shape())
                    ),
                ));
            }
            // Saturating: a sum past usize::MAX is refused by checked_numel below.
            shape[d] = shape[d].saturating_add(t.shape()[d]);
        }
        let n = checked_numel("cat", &shape)?;
        let mut out = Storage::full(first.device(), n, 0.0, first.dtype())?;
        let full = Layout::contiguous(&shape);
        let mut sizes = Vec::with_capacity(tensors.len());
        let mut start = 0;
        for t in tensors {
            let len = t.shape()[d];
            t.storage()
                .copy_into(t.layout(), &mut out, &full.narrow(d, start, len))?;
            sizes.push(len);
            start += len;
        }
        let inputs: Vec<&Tensor> = tensors.iter().collect();
        let node = Tensor::grad_node("CatBackward", &inputs, |needs| {
            Box::new(move |g| {
                let mut grads = Vec::with_capacity(sizes.len());
                let mut start = 0;
                for (&len, &need) in sizes.iter().zip(&needs) {
                    grads.push(if need {
                        Some(g.narrow(d as isize, start, len)?)
                    } else {
                        None
                    });
                    start += len;
                }
                Ok(grads)
            })
        });
        Ok(Tensor::from_storage(out, &shape, node))
    }

    /// The tensors (all of one shape) stacked along a new dim `dim`.
    pub fn stack(tensors: &[Tensor], dim: isize) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(arg_err("stack", "expects at least one tensor"));
        };
        for (i, t) in tensors.iter().enumerate() {
            if t.shape() != first.shape() {
                return Err(shape_err(
                    "stack",
                    format!(
                        "tensor {i} has shape {} but tensor 0 has {}: stack needs equal shapes",
                        fmt_shape(t.shape()),
                        fmt_shape(first.shape())
                    ),
                ));
            }
        }
        let d = resolve_dim("stack", dim, first.rank() + 1)? as isize;
        let parts = tensors
            .iter()
            .map(|t| t.unsqueeze(d))
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&parts, d)
    }
}
