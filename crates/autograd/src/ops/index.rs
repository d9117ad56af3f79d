//! Indexing ops: `embedding`, `index_select`, `gather`, and the functional (out-of-place)
//! `scatter` / `scatter_add`. Indices are `I64` tensors on the data's device; the kernels check
//! every index value and report the first bad one with its position in the index tensor: at the
//! op on the CPU; on CUDA at the next synchronisation (`to_vec`, `item`, a copy to the CPU,
//! `kiln_device::synchronize`) as `kiln_device::Error::DeferredCheck`, or at the op with
//! `KILN_CUDA_EAGER_CHECKS=1` / `kiln_device::set_eager_checks(true)`.
//!
//! Backward rules: `embedding` and `index_select` add output-gradient rows back at their
//! indices (seam `*_backward`); `gather`'s gradient is a `scatter_add` of the output gradient
//! into zeros; `scatter_add` passes the gradient to `self` unchanged and gives `src`
//! `gather(grad, dim, index)`; `scatter` does the same but zeroes the overwritten positions in
//! `self`'s gradient. When `src` is larger than the index, its uncovered part gets zeros.

use crate::error::{arg_err, dtype_err, shape_err};
use crate::ops::conv_pool::grad_tensor;
use crate::tensor::{fmt_shape, resolve_dim, Tensor};
use crate::{DType, Result};
use kiln_device::prelude::*;

impl Tensor {
    /// Requires `index` to be an `I64` tensor on this tensor's device.
    fn check_index(&self, op: &'static str, index: &Tensor) -> Result<()> {
        if index.dtype() != DType::I64 {
            return Err(dtype_err(
                op,
                format!(
                    "indices must be int64, got {}; convert with to_dtype(DType::I64)",
                    index.dtype()
                ),
            ));
        }
        if index.device() != self.device() {
            return Err(crate::Error::Device(kiln_device::Error::DeviceMismatch {
                op,
                lhs: self.device(),
                rhs: index.device(),
            }));
        }
        Ok(())
    }

    /// Embedding lookup (PyTorch's `F.embedding(indices, weight, padding_idx)`): rows of
    /// `weight` `[num_embeddings, embedding_dim]` picked by `indices` (any shape); the output is
    /// `[..indices.shape, embedding_dim]`. Rows at `padding_idx` get no gradient.
    pub fn embedding(
        indices: &Tensor,
        weight: &Tensor,
        padding_idx: Option<i64>,
    ) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("EmbeddingBackward");
        const OP: &str = "embedding";
        weight.check_index(OP, indices)?;
        if weight.rank() != 2 {
            return Err(shape_err(
                OP,
                format!(
                    "weight {} must be 2-D [num_embeddings, embedding_dim]",
                    fmt_shape(weight.shape())
                ),
            ));
        }
        let (num, dim) = (weight.shape()[0], weight.shape()[1]);
        let padding = match padding_idx {
            None => None,
            Some(p) => {
                let q = if p < 0 { p + num as i64 } else { p };
                if !(0..num as i64).contains(&q) {
                    return Err(arg_err(
                        OP,
                        format!(
                            "padding_idx {p} is out of range for {num} embeddings; use \
                             -{num} <= padding_idx < {num} or None"
                        ),
                    ));
                }
                Some(q)
            }
        };
        let storage = {
            let (w, i) = (weight.storage(), indices.storage());
            w.embedding(weight.layout(), (&i, indices.layout()))?
        };
        let shape: Vec<usize> = indices.shape().iter().copied().chain([dim]).collect();
        let out = Tensor::from_storage(storage, &shape, None);
        let node = Tensor::grad_node("EmbeddingBackward", &[weight], |_| {
            let idx = indices.saved();
            Box::new(move |g| {
                let gw = {
                    let (gs, is) = (g.storage(), idx.storage());
                    gs.embedding_backward(g.layout(), (&is, idx.layout()), num, padding)?
                };
                Ok(vec![Some(grad_tensor(gw, &[num, dim]))])
            })
        });
        Ok(Tensor::with_node(&out, node))
    }

    /// `index_select(dim, index)`: the slices of `dim` named by the 1-D `index`, in its order.
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("IndexSelectBackward");
        const OP: &str = "index_select";
        self.check_index(OP, index)?;
        let d = resolve_dim(OP, dim, self.rank())?;
        if index.rank() > 1 {
            return Err(shape_err(
                OP,
                format!(
                    "index {} must be 1-D (or a scalar); flatten it first",
                    fmt_shape(index.shape())
                ),
            ));
        }
        if self.rank() == 0 {
            return self.unsqueeze(0)?.index_select(0, index)?.squeeze_dim(0);
        }
        let index = index.reshape_to(&[index.numel()])?;
        let storage = {
            let (x, i) = (self.storage(), index.storage());
            x.index_select(self.layout(), d, (&i, index.layout()))?
        };
        let mut shape = self.shape().to_vec();
        shape[d] = index.numel();
        let out = Tensor::from_storage(storage, &shape, None);
        let input_shape = self.shape().to_vec();
        let node = Tensor::grad_node("IndexSelectBackward", &[self], |_| {
            let idx = index.saved();
            Box::new(move |g| {
                let gi = {
                    let (gs, is) = (g.storage(), idx.storage());
                    gs.index_select_backward(g.layout(), &input_shape, d, (&is, idx.layout()))?
                };
                Ok(vec![Some(grad_tensor(gi, &input_shape))])
            })
        });
        Ok(Tensor::with_node(&out, node))
    }

    /// `gather(dim, index)`: `out[i][j][k] = self[i][index[i][j][k]][k]` (for `dim = 1`); the
    /// output has the index's shape.
    ///
    /// As in PyTorch, a 0-d tensor or index counts as one element of rank 1, and an empty index
    /// gives an empty output without the shape checks.
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("GatherBackward");
        const OP: &str = "gather";
        self.check_index(OP, index)?;
        let d = resolve_dim(OP, dim, self.rank())?;
        if index.numel() == 0 {
            let out = Tensor::zeros(index.shape(), self.dtype(), self.device())?;
            return Ok(Tensor::with_node(&out, zero_gradient(self)));
        }
        if let Some([x, i]) = as_rank_one(&[self, index]) {
            return x.gather(0, &i)?.reshape_to(index.shape());
        }
        let storage = {
            let (x, i) = (self.storage(), index.storage());
            x.gather(self.layout(), d, (&i, index.layout()))?
        };
        let out = Tensor::from_storage(storage, index.shape(), None);
        let node = Tensor::grad_node("GatherBackward", &[self], |_| {
            let idx = index.saved();
            let zeros_shape = self.shape().to_vec();
            let (dtype, device) = (self.dtype(), self.device());
            Box::new(move |g| {
                let zeros = Tensor::zeros(&zeros_shape, dtype, device)?;
                Ok(vec![Some(zeros.scatter_raw(d, &idx, g, true)?)])
            })
        });
        Ok(Tensor::with_node(&out, node))
    }

    /// Functional `scatter(dim, index, src)`: a copy of `self` with
    /// `out[i][index[i][j][k]][k] = src[i][j][k]` (for `dim = 1`); with repeated indices the
    /// last write (row-major order) wins.
    ///
    /// As in PyTorch (and [`Tensor::gather`]), a 0-d tensor, index or `src` counts as one
    /// element of rank 1, and an empty index gives a copy of `self` without the shape checks.
    pub fn scatter(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.scatter_impl("scatter", dim, index, src, false)
    }

    /// Functional `scatter_add(dim, index, src)`: a copy of `self` with `src` added at `index`
    /// (shapes as in [`Tensor::scatter`]).
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.scatter_impl("scatter_add", dim, index, src, true)
    }

    /// The seam call of a scatter, without graph recording.
    fn scatter_raw(
        &self,
        dim: usize,
        index: &Tensor,
        src: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor> {
        let storage = {
            let (x, i, s) = (self.storage(), index.storage(), src.storage());
            x.scatter(
                self.layout(),
                dim,
                (&i, index.layout()),
                (&s, src.layout()),
                accumulate,
            )?
        };
        Ok(Tensor::from_storage(storage, self.shape(), None))
    }

    fn scatter_impl(
        &self,
        op: &'static str,
        dim: isize,
        index: &Tensor,
        src: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op(op);
        self.check_index(op, index)?;
        self.check_same_kind(op, src)?;
        let d = resolve_dim(op, dim, self.rank())?;
        if index.numel() == 0 {
            // Nothing written: a copy of `self`, whatever `src`'s and the index's shapes.
            return self.copy_data();
        }
        if let Some([x, i, s]) = as_rank_one(&[self, index, src]) {
            return x
                .scatter_impl(op, 0, &i, &s, accumulate)?
                .reshape_to(self.shape());
        }
        let out = self.scatter_raw(d, index, src, accumulate)?;
        let name = if accumulate {
            "ScatterAddBackward"
        } else {
            "ScatterBackward"
        };
        let node = Tensor::grad_node(name, &[self, src], |needs| {
            let idx = index.saved();
            let src_shape = src.shape().to_vec();
            Box::new(move |g| {
                let g_self = if !needs[0] {
                    None
                } else if accumulate {
                    Some(g.clone())
                } else {
                    let zeros = Tensor::zeros(idx.shape(), g.dtype(), g.device())?;
                    Some(g.scatter_raw(d, &idx, &zeros, false)?)
                };
                let g_src = if needs[1] {
                    Some(pad_to(g.gather(d as isize, &idx)?, &src_shape)?)
                } else {
                    None
                };
                Ok(vec![g_self, g_src])
            })
        });
        Ok(Tensor::with_node(&out, node))
    }
}

/// The tensors reshaped to `[1]` where 0-d, when at least one is 0-d and the others are 1-D or
/// 0-d (PyTorch's rank rule for `gather` and `scatter`); `None` otherwise.
fn as_rank_one<const N: usize>(tensors: &[&Tensor; N]) -> Option<[Tensor; N]> {
    let scalar = tensors.iter().any(|t| t.rank() == 0);
    if !scalar || tensors.iter().any(|t| t.rank() > 1) {
        return None;
    }
    let one = |t: &Tensor| match t.rank() {
        0 => t.reshape_to(&[1]).ok(),
        _ => Some(t.clone()),
    };
    let out: Option<Vec<Tensor>> = tensors.iter().map(|t| one(t)).collect();
    out?.try_into().ok()
}

/// A graph node that hands `input` a zero gradient (an output that reads none of it).
fn zero_gradient(input: &Tensor) -> Option<std::sync::Arc<crate::autograd::graph::Node>> {
    Tensor::grad_node("GatherBackward", &[input], |_| {
        let (shape, dtype, device) = (input.shape().to_vec(), input.dtype(), input.device());
        Box::new(move |_| Ok(vec![Some(Tensor::zeros(&shape, dtype, device)?)]))
    })
}

/// `t` extended with zeros at the end of each dim to `shape` (every dim of `t` <= `shape`).
fn pad_to(mut t: Tensor, shape: &[usize]) -> Result<Tensor> {
    for (d, &want) in shape.iter().enumerate() {
        let have = t.shape()[d];
        if have < want {
            let mut zshape = t.shape().to_vec();
            zshape[d] = want - have;
            let zeros = Tensor::zeros(&zshape, t.dtype(), t.device())?;
            t = Tensor::cat(&[t, zeros], d as isize)?;
        }
    }
    Ok(t)
}
