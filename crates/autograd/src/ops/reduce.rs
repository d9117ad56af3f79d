//! Reductions over dims with `keepdim`: sum, mean, amax/amin, max/min with indices, argmax/argmin,
//! var/std with `correction`, logsumexp, norm.
//!
//! The backend reduces `sum`/`max`/`min`/`argmax`/`argmin` and always returns the keepdim shape;
//! the rest are compositions. Dim lists accept negative dims; an empty list means every dim.

use crate::autograd::grad_mode::no_grad;
use crate::error::arg_err;
use crate::tensor::{resolve_dim, resolve_dims, Tensor};
use crate::Result;
use kiln_device::prelude::*;
use kiln_device::{DType, ReduceOp};

fn keep_shape(shape: &[usize], dims: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .map(|(i, &s)| if dims.contains(&i) { 1 } else { s })
        .collect()
}

fn drop_shape(shape: &[usize], dims: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !dims.contains(i))
        .map(|(_, &s)| s)
        .collect()
}

impl Tensor {
    /// The backend reduction, shaped with or without the reduced dims.
    fn reduce_raw(&self, dims: &[usize], op: ReduceOp, keepdim: bool) -> Result<Tensor> {
        let storage = self.storage().reduce(self.layout(), dims, op)?;
        let shape = if keepdim {
            keep_shape(self.shape(), dims)
        } else {
            drop_shape(self.shape(), dims)
        };
        Ok(Tensor::from_storage(storage, &shape, None))
    }

    /// Sum over `dims` (empty: all). Integer and bool tensors sum to `I64`.
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("SumBackward");
        if let Some(wide) = crate::autocast::to_f32(self)? {
            return wide.sum(dims, keepdim);
        }
        let d = resolve_dims("sum", dims, self.rank())?;
        let out = self.reduce_raw(&d, ReduceOp::Sum, keepdim)?;
        let node = Tensor::grad_node("SumBackward", &[self], |_| {
            let (from, kept) = (self.shape().to_vec(), keep_shape(self.shape(), &d));
            Box::new(move |g| Ok(vec![Some(g.reshape_to(&kept)?.expand(&from)?)]))
        });
        Ok(Tensor::with_node(&out, node))
    }

    /// Sum of every element, as a 0-d tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// Mean over `dims` (empty: all); floats only.
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.check_float("mean")?;
        let d = resolve_dims("mean", dims, self.rank())?;
        let n: usize = d.iter().map(|&i| self.shape()[i]).product();
        self.sum(dims, keepdim)?.div_scalar(n as f64)
    }

    /// Mean of every element, as a 0-d tensor.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&[], false)
    }

    /// Sums this gradient down to `shape` (the inverse of broadcasting `shape` to `self.shape()`).
    pub(crate) fn sum_to(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let lead = self.rank() - shape.len();
        let dims: Vec<isize> = (0..self.rank())
            .filter(|&i| i < lead || (shape[i - lead] == 1 && self.shape()[i] != 1))
            .map(|i| i as isize)
            .collect();
        let summed = if dims.is_empty() {
            self.clone()
        } else {
            self.sum(&dims, true)?
        };
        summed.reshape_to(shape)
    }

    fn extreme(
        &self,
        op_name: &'static str,
        dims: &[isize],
        keepdim: bool,
        largest: bool,
    ) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op(op_name);
        let d = resolve_dims(op_name, dims, self.rank())?;
        // PyTorch's rule: only a reduced dim of size 0 has no max/min (an empty tensor reduced
        // over non-empty dims gives an empty result).
        let empty_dim = d.iter().find(|&&i| self.shape()[i] == 0);
        if let Some(i) = empty_dim.or((self.numel() == 0 && d.is_empty()).then_some(&0)) {
            return Err(arg_err(
                op_name,
                format!(
                    "cannot reduce dim {i} of shape {:?}: it has size 0, and max/min of no \
                     elements is undefined; reduce other dims or check the input",
                    self.shape()
                ),
            ));
        }
        let op = if largest {
            ReduceOp::Max
        } else {
            ReduceOp::Min
        };
        let out = self.reduce_raw(&d, op, keepdim)?;
        let kept = keep_shape(self.shape(), &d);
        let y = out.detach().reshape_to(&kept)?;
        let node = Tensor::grad_node(
            if largest {
                "AmaxBackward"
            } else {
                "AminBackward"
            },
            &[self],
            |_| {
                let (x, y) = (self.saved(), y.saved());
                let dims: Vec<isize> = d.iter().map(|&i| i as isize).collect();
                Box::new(move |g| {
                    // The gradient is shared evenly among the elements equal to the extreme.
                    let mask = x.eq(&y)?.to_dtype(x.dtype())?;
                    let count = mask.sum(&dims, true)?;
                    Ok(vec![Some(g.reshape_to(&kept)?.mul(&mask)?.div(&count)?)])
                })
            },
        );
        Ok(Tensor::with_node(&out, node))
    }

    /// Maximum over `dims` (empty: all); ties share the gradient evenly (PyTorch's `amax`).
    pub fn amax(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.extreme("amax", dims, keepdim, true)
    }

    /// Minimum over `dims` (empty: all); ties share the gradient evenly (PyTorch's `amin`).
    pub fn amin(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.extreme("amin", dims, keepdim, false)
    }

    /// Maximum of every element, as a 0-d tensor (PyTorch's `max()`): NaN if any element is;
    /// the gradient is shared evenly by the elements equal to it, the NaNs when it is NaN
    /// (`amax` over every dim gives NaN gradients there, as PyTorch's `amax`).
    pub fn max_all(&self) -> Result<Tensor> {
        self.extreme_all("MaxBackward", true)
    }

    /// Minimum of every element, as a 0-d tensor (PyTorch's `min()`; see [`Tensor::max_all`]).
    pub fn min_all(&self) -> Result<Tensor> {
        self.extreme_all("MinBackward", false)
    }

    fn extreme_all(&self, name: &'static str, largest: bool) -> Result<Tensor> {
        let out = no_grad(|| match largest {
            true => self.amax(&[], false),
            false => self.amin(&[], false),
        })?;
        Ok(Tensor::record_op(name, &[self], &out, |_| {
            let (x, y) = (self.save_for_backward(), out.save_for_backward());
            Box::new(move |g| {
                let nan = |t: &Tensor| t.ne(t);
                let hit = x.eq(&y)?.logical_or(&nan(&x)?.logical_and(&nan(&y)?)?)?;
                let share = g.div(&hit.to_dtype(g.dtype())?.sum_all()?)?;
                Ok(vec![Some(Tensor::where_(&hit, &share, &g.zeros_like()?)?)])
            })
        }))
    }

    fn extreme_dim(
        &self,
        op_name: &'static str,
        dim: isize,
        keepdim: bool,
        largest: bool,
    ) -> Result<(Tensor, Tensor)> {
        let _op = crate::autograd::attribution::forward_op(op_name);
        let d = resolve_dim(op_name, dim, self.rank())?;
        if self.rank() > 0 && self.shape()[d] == 0 {
            return Err(arg_err(
                op_name,
                format!(
                    "cannot reduce dim {d} of shape {:?}: it has size 0, and max/min of no \
                     elements is undefined; reduce another dim or check the input",
                    self.shape()
                ),
            ));
        }
        let dims = if self.rank() == 0 { vec![] } else { vec![d] };
        let (vop, iop) = if largest {
            (ReduceOp::Max, ReduceOp::ArgMax)
        } else {
            (ReduceOp::Min, ReduceOp::ArgMin)
        };
        let values = self.reduce_raw(&dims, vop, keepdim)?;
        let indices = self.reduce_raw(&dims, iop, keepdim)?;
        let node = Tensor::grad_node(
            if largest {
                "MaxBackward"
            } else {
                "MinBackward"
            },
            &[self],
            |_| {
                let from = self.shape().to_vec();
                let kept = keep_shape(self.shape(), &dims);
                let idx = indices.saved();
                Box::new(move |g| {
                    // The gradient goes to the one selected index along `d`.
                    if from.is_empty() {
                        return Ok(vec![Some(g.clone())]);
                    }
                    let mut pos_shape = vec![1; from.len()];
                    pos_shape[d] = from[d];
                    let pos = Tensor::arange(0.0, from[d] as f64, 1.0, DType::I64, g.device())?
                        .reshape_to(&pos_shape)?;
                    let hit = pos.eq(&idx.reshape_to(&kept)?)?;
                    let g = g.reshape_to(&kept)?.expand(&from)?;
                    Ok(vec![Some(Tensor::where_(&hit, &g, &g.zeros_like()?)?)])
                })
            },
        );
        Ok((Tensor::with_node(&values, node), indices))
    }

    /// `(values, indices)` of the maximum along `dim` (first index on ties).
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.extreme_dim("max_dim", dim, keepdim, true)
    }

    /// `(values, indices)` of the minimum along `dim` (first index on ties).
    pub fn min_dim(&self, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.extreme_dim("min_dim", dim, keepdim, false)
    }

    /// Index (`I64`) of the maximum along `dim` (first on ties; NaN counts as largest).
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        Ok(self.max_dim(dim, keepdim)?.1)
    }

    /// Index (`I64`) of the minimum along `dim` (first on ties).
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        Ok(self.min_dim(dim, keepdim)?.1)
    }

    /// Variance over `dims` with `correction` (1 = Bessel's, PyTorch's default; 0 = population).
    pub fn var(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        self.check_float("var")?;
        let d = resolve_dims("var", dims, self.rank())?;
        let n: usize = d.iter().map(|&i| self.shape()[i]).product();
        let centered = self.sub(&self.mean(dims, true)?)?;
        let denom = n.saturating_sub(correction) as f64;
        centered.square()?.sum(dims, keepdim)?.div_scalar(denom)
    }

    /// Standard deviation: `sqrt(var)`. Where it is 0 (a constant slice) the gradient is 0, as
    /// PyTorch's `std_backward` masks it, not `0 / 0` (sqrt's own derivative there is infinite).
    pub fn std(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        let var = self.var(dims, correction, keepdim)?;
        let out = no_grad(|| var.sqrt())?;
        Ok(Tensor::record_op("StdBackward", &[&var], &out, |_| {
            let std = out.save_for_backward();
            Box::new(move |g| {
                let zero = std.eq_scalar(0.0)?;
                Ok(vec![Some(
                    g.div(&std.mul_scalar(2.0)?)?.masked_fill(&zero, 0.0)?,
                )])
            })
        }))
    }

    /// `log(sum(exp(x)))` over `dims`, computed stably (the max is subtracted first); -inf over
    /// an empty dim (the log of an empty sum), as in PyTorch.
    pub fn logsumexp(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.check_float("logsumexp")?;
        if let Some(wide) = crate::autocast::to_f32(self)? {
            return wide.logsumexp(dims, keepdim);
        }
        let d = resolve_dims("logsumexp", dims, self.rank())?;
        let m = no_grad(|| -> Result<Tensor> {
            if d.iter().any(|&i| self.shape()[i] == 0) {
                // No maximum to shift by: the shift is 0 and the sum of nothing is 0.
                let mut kept = self.shape().to_vec();
                d.iter().for_each(|&i| kept[i] = 1);
                return Tensor::zeros(&kept, self.dtype(), self.device());
            }
            let m = self.amax(dims, true)?;
            let infinite = m.abs()?.eq_scalar(f64::INFINITY)?;
            m.masked_fill(&infinite, 0.0)
        })?;
        let out = self.sub(&m)?.exp()?.sum(dims, true)?.log()?.add(&m)?;
        if keepdim {
            return Ok(out);
        }
        out.reshape_to(&drop_shape(self.shape(), &d))
    }

    /// The `p`-norm over `dims` (`p` = 1, 2, `f64::INFINITY` or any positive value). The gradient
    /// at a zero norm is 0 (PyTorch's convention), not NaN.
    pub fn norm(&self, p: f64, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("NormBackward");
        self.check_float("norm")?;
        if let Some(wide) = crate::autocast::to_f32(self)? {
            return wide.norm(p, dims, keepdim);
        }
        if p.is_nan() || p <= 0.0 {
            return Err(arg_err(
                "norm",
                format!("p must be positive (1, 2, inf, ...), got {p:?}"),
            ));
        }
        let d = resolve_dims("norm", dims, self.rank())?;
        let y = no_grad(|| -> Result<Tensor> {
            let a = self.abs()?;
            if p == f64::INFINITY {
                a.amax(dims, true)
            } else if p == 1.0 {
                a.sum(dims, true)
            } else if p == 2.0 {
                a.square()?.sum(dims, true)?.sqrt()
            } else {
                a.pow_scalar(p)?.sum(dims, true)?.pow_scalar(1.0 / p)
            }
        })?;
        let node = Tensor::grad_node("NormBackward", &[self], |_| {
            let (x, yk) = (self.saved(), y.saved());
            let dims_i: Vec<isize> = d.iter().map(|&i| i as isize).collect();
            Box::new(move |g| {
                let sign = x.sign()?;
                // PyTorch's rules where the formulas give NaN: 0 at a zero norm, at a zero
                // element (|x|^(p-1) is infinite for p < 1), for p = 1 at a NaN element, and
                // for p = inf in a slice whose norm no element equals (a NaN norm).
                let local = if p == f64::INFINITY {
                    let hit = x.abs()?.eq(&yk)?;
                    let count = hit
                        .to_dtype(x.dtype())?
                        .sum(&dims_i, true)?
                        .maximum_scalar(1.0)?;
                    Tensor::where_(&hit, &sign.div(&count)?, &sign.zeros_like()?)?
                } else if p == 1.0 {
                    sign.masked_fill(&x.ne(&x)?, 0.0)?
                } else {
                    // d||x||_p / dx = sign(x) |x|^(p-1) / ||x||^(p-1)
                    sign.mul(&x.abs()?.pow_scalar(p - 1.0)?)?
                        .div(&yk.pow_scalar(p - 1.0)?)?
                        .masked_fill(&x.eq_scalar(0.0)?, 0.0)?
                };
                let zero_norm = yk.eq_scalar(0.0)?;
                let local = local.masked_fill(&zero_norm.expand(x.shape())?, 0.0)?;
                Ok(vec![Some(g.mul(&local)?)])
            })
        });
        let out = Tensor::with_node(&y, node);
        if keepdim {
            Ok(out)
        } else {
            out.reshape_to(&drop_shape(self.shape(), &d))
        }
    }
}
