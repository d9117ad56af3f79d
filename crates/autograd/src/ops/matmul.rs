//! `matmul` with PyTorch's rules: 1-D operands are promoted (and the added dim removed after),
//! batch dims broadcast. A batch of matrices times one matrix (`Linear` on `[B, T, D]`) folds
//! the batch into the rows and runs as one product (see [`folded_rows`]). Otherwise both operands
//! reach the kernel as views expanded to one batch shape, so broadcast batches are not copied;
//! the backward is two more matmuls, and `expand`'s backward sums the broadcast batch dims.

use crate::error::shape_err;
use crate::ops::broadcast_shapes;
use crate::tensor::{fmt_shape, Tensor};
use crate::{Error, Result};
use kiln_device::prelude::*;

impl Tensor {
    /// Matrix product with batch broadcasting (`[.., m, k] @ [.., k, n]`; 1-D operands allowed).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("MmBackward");
        self.check_float("matmul")?;
        if let Some(cast) = crate::autocast::lower_all(&[self, rhs])? {
            return cast[0].matmul(&cast[1]);
        }
        self.check_same_kind("matmul", rhs)?;
        let shapes = || format!("{} @ {}", fmt_shape(self.shape()), fmt_shape(rhs.shape()));
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(shape_err(
                "matmul",
                format!(
                    "{}: both operands need at least 1 dim; use mul for scalars",
                    shapes()
                ),
            ));
        }
        let a = if self.rank() == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = if rhs.rank() == 1 {
            rhs.unsqueeze(-1)?
        } else {
            rhs.clone()
        };
        let (ra, rb) = (a.rank(), b.rank());
        let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
        let (k2, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
        if k != k2 {
            return Err(shape_err(
                "matmul",
                format!("{}: inner dims {k} != {k2}", shapes()),
            ));
        }
        let batch = broadcast_shapes("matmul", &a.shape()[..ra - 2], &b.shape()[..rb - 2])
            .map_err(|_| {
                shape_err(
                    "matmul",
                    format!(
                    "{}: batch dims {} and {} cannot be broadcast (each pair must be equal or 1)",
                    shapes(),
                    fmt_shape(&a.shape()[..ra - 2]),
                    fmt_shape(&b.shape()[..rb - 2])
                ),
                )
            })?;
        let out = if let Some(rows) = folded_rows(&a, &b) {
            // `[.., m, k] @ [k, n]` as one `[rows, k] @ [k, n]` product: one GEMM, and the
            // matrix's gradient is one product over all rows, not one per batch summed after.
            let out = a.reshape_to(&[rows, k])?.bmm(&b)?;
            let shape: Vec<usize> = a.shape()[..ra - 1].iter().copied().chain([n]).collect();
            out.reshape_to(&shape)?
        } else {
            let sa: Vec<usize> = batch.iter().copied().chain([m, k]).collect();
            let sb: Vec<usize> = batch.iter().copied().chain([k, n]).collect();
            a.expand(&sa)?.bmm(&b.expand(&sb)?)?
        };
        let out = if self.rank() == 1 {
            out.squeeze_dim(-2)?
        } else {
            out
        };
        if rhs.rank() == 1 {
            out.squeeze_dim(-1)
        } else {
            Ok(out)
        }
    }

    /// The kernel call: both operands have identical batch dims.
    fn bmm(&self, rhs: &Tensor) -> Result<Tensor> {
        let r = self.rank();
        let mut shape = self.shape().to_vec();
        shape[r - 1] = rhs.shape()[r - 1];
        let storage = {
            let (a, b) = (self.storage(), rhs.storage());
            a.matmul(self.layout(), &b, rhs.layout())?
        };
        let out = Tensor::from_storage(storage, &shape, None);
        let node = Tensor::grad_node("MmBackward", &[self, rhs], |needs| {
            // Each operand's gradient reads only the other operand, so an operand is kept only
            // when the other one needs a gradient (PyTorch's rule: `x @ w` with a frozen `w`
            // keeps `w`, not the activation `x`).
            let (a_t, b_t) = (is_transposed(self), is_transposed(rhs));
            let a = needs[1].then(|| self.saved());
            let b = needs[0].then(|| rhs.saved());
            Box::new(move |g| {
                // Each gradient is computed in its operand's layout: for an operand that is a
                // transposed view (Linear's `weight.t()`), as the transpose of the product
                // in the other order, so it reaches the parameter contiguous, not as a
                // transposed view `.grad` would have to copy.
                let ga = match (needs[0], a_t) {
                    (false, _) => None,
                    (true, false) => Some(g.bmm(&kept(&b)?.transpose(-1, -2)?)?),
                    (true, true) => Some(kept(&b)?.bmm(&g.transpose(-1, -2)?)?.transpose(-1, -2)?),
                };
                let gb = match (needs[1], b_t) {
                    (false, _) => None,
                    (true, false) => Some(kept(&a)?.transpose(-1, -2)?.bmm(g)?),
                    (true, true) => Some(g.transpose(-1, -2)?.bmm(kept(&a)?)?.transpose(-1, -2)?),
                };
                Ok(vec![ga, gb])
            })
        });
        Ok(Tensor::with_node(&out, node))
    }
}

/// The rows of `a` folded into a matrix when `a @ b` (`a` of rank 3 or more, `b` a matrix)
/// runs as one `[rows, k] @ [k, n]` product. It does when `a`'s rows fold without a copy, and
/// also when `b`'s gradient is recorded: unfolded, that gradient would be one `[k, n]` product
/// per batch, all held at once and then summed (PyTorch folds in the same two cases).
fn folded_rows(a: &Tensor, b: &Tensor) -> Option<usize> {
    let ra = a.rank();
    if ra < 3 || b.rank() != 2 {
        return None;
    }
    let rows = a.shape()[..ra - 1]
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
    let k = a.shape()[ra - 1];
    let grad = b.requires_grad() && crate::autograd::grad_mode::is_grad_enabled();
    (grad || a.layout().view(&[rows, k]).is_some()).then_some(rows)
}

/// An operand `MmBackward` kept (it keeps each one only when the other needs a gradient).
fn kept(t: &Option<Tensor>) -> Result<&Tensor> {
    t.as_ref().ok_or_else(|| {
        Error::Autograd("internal: MmBackward read an operand it did not keep".into())
    })
}

/// Whether the last two dims of `t` are a transposed contiguous matrix (column-major: unit
/// stride down a column, a whole column between columns), as `weight.t()` is.
fn is_transposed(t: &Tensor) -> bool {
    let (shape, strides) = (t.layout().shape(), t.layout().strides());
    let r = shape.len();
    r >= 2
        && shape[r - 2] > 1
        && shape[r - 1] > 1
        && strides[r - 2] == 1
        && strides[r - 1] == shape[r - 2]
}
