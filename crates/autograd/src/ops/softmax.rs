//! `softmax` / `log_softmax` along any dim: the dim is moved last with a transpose view, the
//! kernel works on rows, and the result is transposed back (views, no copies).

use crate::tensor::{resolve_dim, Tensor};
use crate::Result;
use kiln_device::prelude::*;

impl Tensor {
    /// Softmax along `dim`.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl("softmax", dim, false)
    }

    /// Log-softmax along `dim` (more accurate than `softmax(dim).log()`).
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl("log_softmax", dim, true)
    }

    fn softmax_impl(&self, op: &'static str, dim: isize, log: bool) -> Result<Tensor> {
        self.check_float(op)?;
        if let Some(wide) = crate::autocast::to_f32(self)? {
            return wide.softmax_impl(op, dim, log);
        }
        let d = resolve_dim(op, dim, self.rank())?;
        if self.rank() == 0 {
            return self.unsqueeze(0)?.softmax_impl(op, 0, log)?.squeeze_dim(0);
        }
        let last = self.rank() - 1;
        let moved = if d == last {
            self.clone()
        } else {
            self.transpose(d as isize, last as isize)?
        };
        let y = moved.softmax_last(log)?;
        if d == last {
            Ok(y)
        } else {
            y.transpose(d as isize, last as isize)
        }
    }

    fn softmax_last(&self, log: bool) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op(if log {
            "LogSoftmaxBackward"
        } else {
            "SoftmaxBackward"
        });
        let storage = self.storage().softmax_last_dim(self.layout(), log)?;
        let out = Tensor::from_storage(storage, self.shape(), None);
        let name = if log {
            "LogSoftmaxBackward"
        } else {
            "SoftmaxBackward"
        };
        let node = Tensor::grad_node(name, &[self], |_| {
            let y = out.saved();
            Box::new(move |g| {
                let gi = if log {
                    // d log_softmax: g - softmax * sum(g)
                    g.sub(&y.exp()?.mul(&g.sum(&[-1], true)?)?)?
                } else {
                    // d softmax: y * (g - sum(g * y))
                    y.mul(&g.sub(&g.mul(&y)?.sum(&[-1], true)?)?)?
                };
                Ok(vec![Some(gi)])
            })
        });
        Ok(Tensor::with_node(&out, node))
    }
}
