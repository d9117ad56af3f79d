//! `cat` and `stack`: one new buffer, each input copied into its region through `copy_into`;
//! the backward hands each input the matching `narrow` of the gradient.

use crate::error::{arg_err, shape_err};
use crate::tensor::{checked_numel, fmt_shape, resolve_dim, Tensor};
use crate::Result;
use kiln_device::prelude::*;
use kiln_device::{Layout, Storage};

impl Tensor {
    /// Concatenation along `dim`; all other dims must match. As in PyTorch, 1-D empty tensors
    /// (shape `[0]`, the legacy `torch.tensor([])`) are skipped, whatever the others' rank, so a
    /// running concatenation may start from one; when every tensor is one, the result is one.
    pub fn cat(tensors: &[Tensor], dim: isize) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("CatBackward");
        let Some(first) = tensors.first() else {
            return Err(arg_err("cat", "expects at least one tensor"));
        };
        if let Some(i) = tensors.iter().position(|t| t.rank() == 0) {
            return Err(shape_err(
                "cat",
                format!("tensor {i} is 0-d and cannot be concatenated; unsqueeze it or use stack"),
            ));
        }
        for t in tensors {
            first.check_same_kind("cat", t)?;
        }
        let skipped = |t: &Tensor| t.shape() == [0];
        // The tensor the others are measured against: the first one not skipped (any of them
        // when all are skipped, with `dim` then unused, as in PyTorch).
        let (lead, d, all_skipped) = match tensors.iter().position(|t| !skipped(t)) {
            Some(i) => (i, resolve_dim("cat", dim, tensors[i].rank())?, false),
            None => (0, 0, true),
        };
        let lead_shape = tensors[lead].shape();
        let kept = |t: &Tensor| all_skipped || !skipped(t);
        let mut shape = lead_shape.to_vec();
        shape[d] = 0;
        for (i, t) in tensors.iter().enumerate().filter(|(_, t)| kept(t)) {
            let same_rank = t.rank() == lead_shape.len();
            if !same_rank
                || t.shape()
                    .iter()
                    .enumerate()
                    .any(|(j, &s)| j != d && s != lead_shape[j])
            {
                return Err(shape_err(
                    "cat",
                    format!(
                        "tensor {i} has shape {} but tensor {lead} has {}: all dims except dim \
                         {dim} must match",
                        fmt_shape(t.shape()),
                        fmt_shape(lead_shape)
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
            let len = if kept(t) { t.shape()[d] } else { 0 };
            if kept(t) {
                t.storage()
                    .copy_into(t.layout(), &mut out, &full.narrow(d, start, len))?;
            }
            sizes.push(kept(t).then_some(len));
            start += len;
        }
        let inputs: Vec<&Tensor> = tensors.iter().collect();
        let node = Tensor::grad_node("CatBackward", &inputs, |needs| {
            Box::new(move |g| {
                let mut grads = Vec::with_capacity(sizes.len());
                let mut start = 0;
                for (&len, &need) in sizes.iter().zip(&needs) {
                    grads.push(match len {
                        Some(len) if need => Some(g.narrow(d as isize, start, len)?),
                        _ => None,
                    });
                    start += len.unwrap_or(0);
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
