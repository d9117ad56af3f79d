//! Broadcasting binary arithmetic, comparisons, `where_`, `masked_fill`, `triu`/`tril`.
//!
//! Broadcasting follows PyTorch (NumPy): shapes are right-aligned and each dim pair must be equal
//! or contain a 1. Both operands reach the kernel as stride-0 broadcast layouts of the output
//! shape, so nothing is materialised; the backward sums each gradient back to its operand's shape
//! (`sum_to`). Scalar forms wrap the scalar in a 0-d tensor of the operand's dtype.

use crate::error::{dtype_err, shape_err};
use crate::tensor::{fmt_shape, Tensor};
use crate::Result;
use kiln_device::prelude::*;
use kiln_device::{BinaryOp, CmpOp, DType};

/// The broadcast shape of `a` and `b`, or an error naming `op`, both shapes and the dim that clashes.
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            (x, y) => {
                return Err(shape_err(
                    op,
                    format!(
                        "shapes {} and {} cannot be broadcast: at dim {} sizes {x} and {y} differ (each pair must be equal or one of them 1)",
                        fmt_shape(a),
                        fmt_shape(b),
                        i as isize - rank as isize
                    ),
                ))
            }
        };
    }
    Ok(out)
}

/// The tensors a binary backward kept: lhs, rhs, output (only those its op asked for).
struct Saved([Option<Tensor>; 3]);

impl Saved {
    fn get(&self, i: usize) -> Result<&Tensor> {
        self.0[i].as_ref().ok_or_else(|| {
            crate::Error::Autograd(
                "internal: a binary backward read a tensor it did not save".into(),
            )
        })
    }
    fn a(&self) -> Result<&Tensor> {
        self.get(0)
    }
    fn b(&self) -> Result<&Tensor> {
        self.get(1)
    }
    fn y(&self) -> Result<&Tensor> {
        self.get(2)
    }
}

/// Which of (lhs, rhs, output) a backward keeps, given which operands need a gradient
/// (PyTorch's rule: a tensor is saved only when a gradient that will be computed reads it, so
/// `x * mask` with a `mask` that needs none keeps `mask` alone, not `x`).
type SaveRule = fn([bool; 2]) -> [bool; 3];

/// Keeps nothing (sums and differences).
const NONE: SaveRule = |_| [false, false, false];
/// Keeps both operands, whichever gradient is computed (ties and extremes read both).
const INPUTS: SaveRule = |_| [true, true, false];
/// A product's: each operand's gradient reads the other operand.
const CROSS: SaveRule = |n| [n[1], n[0], false];

type PairGrad = fn(&Saved, &Tensor, [bool; 2]) -> Result<[Option<Tensor>; 2]>;

/// A sum's backward: the gradient, to both operands.
fn add_grad(_: &Saved, g: &Tensor, _: [bool; 2]) -> Result<[Option<Tensor>; 2]> {
    Ok([Some(g.clone()), Some(g.clone())])
}

impl Tensor {
    fn binary_op(
        &self,
        rhs: &Tensor,
        op: BinaryOp,
        (name, lower): (&'static str, &'static str),
        save: SaveRule,
        grad: PairGrad,
    ) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op(name);
        if let Some((a, b)) = crate::autocast::promote_pair(self, rhs)? {
            return a.binary_op(&b, op, (name, lower), save, grad);
        }
        self.check_same_kind(lower, rhs)?;
        let shape = broadcast_shapes(lower, self.shape(), rhs.shape())?;
        let (la, lb) = (
            self.layout().broadcast_to(&shape),
            rhs.layout().broadcast_to(&shape),
        );
        let storage = {
            let (a, b) = (self.storage(), rhs.storage());
            a.binary(&la, &b, &lb, op)?
        };
        let out = Tensor::from_storage(storage, &shape, None);
        Ok(self.with_pair_node(rhs, &out, name, save, grad))
    }

    /// `out` (the op of this tensor and `rhs`, made without history) re-issued with the op's
    /// node: `grad` as its backward, over the tensors `save` names, each gradient summed back
    /// to its operand's shape.
    fn with_pair_node(
        &self,
        rhs: &Tensor,
        out: &Tensor,
        name: &'static str,
        save: SaveRule,
        grad: PairGrad,
    ) -> Tensor {
        let node = Tensor::grad_node(name, &[self, rhs], |needs| {
            let save = save([needs[0], needs[1]]);
            let keep = |i: usize, t: &Tensor| save[i].then(|| t.saved());
            let saved = Saved([keep(0, self), keep(1, rhs), keep(2, out)]);
            let (sa, sb) = (self.shape().to_vec(), rhs.shape().to_vec());
            Box::new(move |g| {
                let [ga, gb] = grad(&saved, g, [needs[0], needs[1]])?;
                Ok(vec![
                    ga.map(|t| t.sum_to(&sa)).transpose()?,
                    gb.map(|t| t.sum_to(&sb)).transpose()?,
                ])
            })
        });
        Tensor::with_node(out, node)
    }

    /// `self + rhs` (broadcasting).
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(rhs, BinaryOp::Add, ("AddBackward", "add"), NONE, add_grad)
    }

    /// `self + rhs` for a `self` the caller gives up: added into its buffer where nothing else
    /// can see it (no other handle, view or saved copy, and not a leaf that requires grad
    /// while a graph is recorded) and `rhs` has its shape and dtype (a residual
    /// connection's sum, backward's sum of two gradients), a new tensor as `add` makes
    /// otherwise. The values and the recorded backward are `add`'s either way.
    pub fn into_add(self, rhs: &Tensor) -> Result<Tensor> {
        let same = rhs.shape() == self.shape() && rhs.dtype() == self.dtype();
        if !same || !self.reusable_alone() {
            return self.add(rhs);
        }
        let _op = crate::autograd::attribution::forward_op("AddBackward");
        self.check_same_kind("add", rhs)?;
        self.write_owned(rhs, BinaryOp::Add)?;
        let out = self.detach();
        Ok(self.with_pair_node(rhs, &out, "AddBackward", NONE, add_grad))
    }

    /// `self - rhs` (broadcasting).
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(
            rhs,
            BinaryOp::Sub,
            ("SubBackward", "sub"),
            NONE,
            |_, g, n| Ok([Some(g.clone()), if n[1] { Some(g.neg()?) } else { None }]),
        )
    }

    /// `self * rhs` (broadcasting).
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(
            rhs,
            BinaryOp::Mul,
            ("MulBackward", "mul"),
            CROSS,
            |s, g, n| {
                Ok([
                    if n[0] { Some(g.mul(s.b()?)?) } else { None },
                    if n[1] { Some(g.mul(s.a()?)?) } else { None },
                ])
            },
        )
    }

    /// `self / rhs` (broadcasting; true division for floats).
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(
            rhs,
            BinaryOp::Div,
            ("DivBackward", "div"),
            |n| [n[1], true, false],
            |s, g, n| {
                let b = s.b()?;
                let ga = if n[0] { Some(g.div(b)?) } else { None };
                // d/db a/b = -a / b², as PyTorch computes it: -g · ((a / b) / b)
                let gb = if n[1] {
                    Some(g.mul(&s.a()?.div(b)?.div(b)?)?.neg()?)
                } else {
                    None
                };
                Ok([ga, gb])
            },
        )
    }

    /// `self ^ rhs` elementwise (broadcasting; floats).
    pub fn pow(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(
            rhs,
            BinaryOp::Pow,
            ("PowBackward", "pow"),
            |n| [true, true, n[1]],
            |s, g, n| {
                let (a, b) = (s.a()?, s.b()?);
                let ga = if n[0] {
                    // d/da a^b = b * a^(b-1), taken as 0 where b == 0 (PyTorch's rule: a^0 is
                    // constant, even at a = 0, NaN or inf, where the formula gives NaN)
                    let raw = g.mul(&b.mul(&a.pow(&b.sub_scalar(1.0)?)?)?)?;
                    Some(Tensor::where_(
                        &b.eq_scalar(0.0)?,
                        &raw.zeros_like()?,
                        &raw,
                    )?)
                } else {
                    None
                };
                let gb = if n[1] {
                    // d/db a^b = a^b * ln a, taken as 0 where a == 0 and b >= 0 (PyTorch's rule)
                    let raw = g.mul(&s.y()?.mul(&a.log()?)?)?;
                    let zero_base = a.eq_scalar(0.0)?.logical_and(&b.ge_scalar(0.0)?)?;
                    Some(Tensor::where_(&zero_base, &raw.zeros_like()?, &raw)?)
                } else {
                    None
                };
                Ok([ga, gb])
            },
        )
    }

    /// Elementwise maximum (ties send half the gradient to each side, as PyTorch).
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(
            rhs,
            BinaryOp::Maximum,
            ("MaximumBackward", "maximum"),
            INPUTS,
            |s, g, _| split_ties(s.a()?, s.b()?, g, CmpOp::Gt),
        )
    }

    /// Elementwise minimum (ties send half the gradient to each side, as PyTorch).
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(
            rhs,
            BinaryOp::Minimum,
            ("MinimumBackward", "minimum"),
            INPUTS,
            |s, g, _| split_ties(s.a()?, s.b()?, g, CmpOp::Lt),
        )
    }

    pub(crate) fn scalar_like(&self, v: f64) -> Result<Tensor> {
        Tensor::scalar(v, self.dtype(), self.device())
    }

    /// `self + v`.
    pub fn add_scalar(&self, v: f64) -> Result<Tensor> {
        self.add(&self.scalar_like(v)?)
    }

    /// `self - v`.
    pub fn sub_scalar(&self, v: f64) -> Result<Tensor> {
        self.sub(&self.scalar_like(v)?)
    }

    /// `v - self`.
    pub fn rsub_scalar(&self, v: f64) -> Result<Tensor> {
        self.scalar_like(v)?.sub(self)
    }

    /// `self * v`.
    pub fn mul_scalar(&self, v: f64) -> Result<Tensor> {
        self.mul(&self.scalar_like(v)?)
    }

    /// `self / v`.
    pub fn div_scalar(&self, v: f64) -> Result<Tensor> {
        self.div(&self.scalar_like(v)?)
    }

    /// `self ^ v`.
    pub fn pow_scalar(&self, v: f64) -> Result<Tensor> {
        self.pow(&self.scalar_like(v)?)
    }

    /// `max(self, v)` elementwise (PyTorch's `clamp_min`; NaN on either side gives NaN). The
    /// gradient passes only where `self > v`, strictly, as PyTorch's: 0 at a tie.
    pub fn maximum_scalar(&self, v: f64) -> Result<Tensor> {
        self.clamp_one_side("ClampMinBackward", v, CmpOp::Gt)
    }

    /// `min(self, v)` elementwise (PyTorch's `clamp_max`; NaN on either side gives NaN). The
    /// gradient passes only where `self < v`, strictly, as PyTorch's: 0 at a tie.
    pub fn minimum_scalar(&self, v: f64) -> Result<Tensor> {
        self.clamp_one_side("ClampMaxBackward", v, CmpOp::Lt)
    }

    fn clamp_one_side(&self, name: &'static str, v: f64, keep: CmpOp) -> Result<Tensor> {
        let bound = self.scalar_like(v)?;
        let out = crate::autograd::grad_mode::no_grad(|| match keep {
            CmpOp::Gt => self.maximum(&bound),
            _ => self.minimum(&bound),
        })?;
        Ok(Tensor::record_op(name, &[self], &out, |_| {
            let x = self.save_for_backward();
            Box::new(move |g| {
                let inside = x.compare(&bound, keep, "clamp")?;
                Ok(vec![Some(Tensor::where_(&inside, g, &g.zeros_like()?)?)])
            })
        }))
    }

    /// Clamps into `[min, max]` (`max` wins where `min > max`). The gradient passes only where
    /// `min < self < max`, strictly, as PyTorch 2.15's does: an element at either bound gets 0
    /// (composed from `maximum` / `minimum`, whose ties split, it got 1/2).
    pub fn clamp(&self, min: f64, max: f64) -> Result<Tensor> {
        let out =
            crate::autograd::grad_mode::no_grad(|| self.maximum_scalar(min)?.minimum_scalar(max))?;
        Ok(Tensor::record_op("ClampBackward", &[self], &out, |_| {
            let x = self.save_for_backward();
            Box::new(move |g| {
                let inside = x.gt_scalar(min)?.logical_and(&x.lt_scalar(max)?)?;
                Ok(vec![Some(Tensor::where_(&inside, g, &g.zeros_like()?)?)])
            })
        }))
    }

    // ----- comparisons (results are Bool, no gradient) -----

    fn compare(&self, rhs: &Tensor, op: CmpOp, lower: &'static str) -> Result<Tensor> {
        self.check_same_kind(lower, rhs)?;
        let shape = broadcast_shapes(lower, self.shape(), rhs.shape())?;
        let (la, lb) = (
            self.layout().broadcast_to(&shape),
            rhs.layout().broadcast_to(&shape),
        );
        let storage = {
            let (a, b) = (self.storage(), rhs.storage());
            a.compare(&la, &b, &lb, op)?
        };
        Ok(Tensor::from_storage(storage, &shape, None))
    }

    /// `self == rhs` (Bool).
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Eq, "eq")
    }
    /// `self != rhs` (Bool).
    pub fn ne(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Ne, "ne")
    }
    /// `self < rhs` (Bool).
    pub fn lt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Lt, "lt")
    }
    /// `self <= rhs` (Bool).
    pub fn le(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Le, "le")
    }
    /// `self > rhs` (Bool).
    pub fn gt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Gt, "gt")
    }
    /// `self >= rhs` (Bool).
    pub fn ge(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Ge, "ge")
    }
    /// `self == v` (Bool).
    pub fn eq_scalar(&self, v: f64) -> Result<Tensor> {
        self.eq(&self.scalar_like(v)?)
    }
    /// `self != v` (Bool).
    pub fn ne_scalar(&self, v: f64) -> Result<Tensor> {
        self.ne(&self.scalar_like(v)?)
    }
    /// `self < v` (Bool).
    pub fn lt_scalar(&self, v: f64) -> Result<Tensor> {
        self.lt(&self.scalar_like(v)?)
    }
    /// `self <= v` (Bool).
    pub fn le_scalar(&self, v: f64) -> Result<Tensor> {
        self.le(&self.scalar_like(v)?)
    }
    /// `self > v` (Bool).
    pub fn gt_scalar(&self, v: f64) -> Result<Tensor> {
        self.gt(&self.scalar_like(v)?)
    }
    /// `self >= v` (Bool).
    pub fn ge_scalar(&self, v: f64) -> Result<Tensor> {
        self.ge(&self.scalar_like(v)?)
    }

    /// Elementwise AND of two Bool tensors.
    pub fn logical_and(&self, rhs: &Tensor) -> Result<Tensor> {
        self.check_bool("logical_and")?;
        rhs.check_bool("logical_and")?;
        let f = Tensor::zeros(&[], DType::Bool, self.device())?;
        Tensor::where_(self, rhs, &f)
    }

    /// Elementwise OR of two Bool tensors.
    pub fn logical_or(&self, rhs: &Tensor) -> Result<Tensor> {
        self.check_bool("logical_or")?;
        rhs.check_bool("logical_or")?;
        let t = Tensor::ones(&[], DType::Bool, self.device())?;
        Tensor::where_(self, &t, rhs)
    }

    /// Elementwise NOT of a Bool tensor.
    pub fn logical_not(&self) -> Result<Tensor> {
        self.check_bool("logical_not")?;
        self.eq(&Tensor::zeros(&[], DType::Bool, self.device())?)
    }

    fn check_bool(&self, op: &'static str) -> Result<()> {
        if !matches!(self.dtype(), DType::Bool | DType::U8) {
            return Err(dtype_err(
                op,
                format!(
                    "needs a bool tensor, got {}; build masks with comparisons such as gt_scalar",
                    self.dtype()
                ),
            ));
        }
        Ok(())
    }

    // ----- selection -----

    /// `on_true` where `cond` is true, else `on_false` (all three broadcast together).
    pub fn where_(cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("WhereBackward");
        cond.check_bool("where")?;
        on_true.check_same_kind("where", on_false)?;
        let shape = broadcast_shapes("where", on_true.shape(), on_false.shape())?;
        let shape = broadcast_shapes("where", cond.shape(), &shape)?;
        let (lc, lt, lf) = (
            cond.layout().broadcast_to(&shape),
            on_true.layout().broadcast_to(&shape),
            on_false.layout().broadcast_to(&shape),
        );
        let storage = {
            let (c, t, f) = (cond.storage(), on_true.storage(), on_false.storage());
            c.where_cond(&lc, &t, &lt, &f, &lf)?
        };
        let out = Tensor::from_storage(storage, &shape, None);
        let node = Tensor::grad_node("WhereBackward", &[on_true, on_false], |needs| {
            let c = cond.saved();
            let (st, sf) = (on_true.shape().to_vec(), on_false.shape().to_vec());
            Box::new(move |g| {
                let zero = g.zeros_like()?;
                let gt = if needs[0] {
                    Some(Tensor::where_(&c, g, &zero)?.sum_to(&st)?)
                } else {
                    None
                };
                let gf = if needs[1] {
                    Some(Tensor::where_(&c, &zero, g)?.sum_to(&sf)?)
                } else {
                    None
                };
                Ok(vec![gt, gf])
            })
        });
        Ok(Tensor::with_node(&out, node))
    }

    /// `value` where `mask` is true, else `self`; as PyTorch's out-of-place `masked_fill`, the
    /// mask and `self` broadcast together (a mask larger than `self` gives a larger output).
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        mask.check_bool("masked_fill")?;
        broadcast_shapes("masked_fill", self.shape(), mask.shape())?;
        Tensor::where_(mask, &self.scalar_like(value)?, self)
    }

    /// Upper triangle of the last two dims: elements with `col - row >= diagonal`, others 0.
    pub fn triu(&self, diagonal: i64) -> Result<Tensor> {
        self.triangle("triu", diagonal, CmpOp::Ge)
    }

    /// Lower triangle of the last two dims: elements with `col - row <= diagonal`, others 0.
    pub fn tril(&self, diagonal: i64) -> Result<Tensor> {
        self.triangle("tril", diagonal, CmpOp::Le)
    }

    fn triangle(&self, op: &'static str, diagonal: i64, keep: CmpOp) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(shape_err(
                op,
                format!(
                    "needs at least 2 dims, got shape {}",
                    fmt_shape(self.shape())
                ),
            ));
        }
        let (r, c) = (self.shape()[self.rank() - 2], self.shape()[self.rank() - 1]);
        let dev = self.device();
        let rows = Tensor::arange(0.0, r as f64, 1.0, DType::I64, dev)?.reshape_to(&[r, 1])?;
        let cols = Tensor::arange(0.0, c as f64, 1.0, DType::I64, dev)?.reshape_to(&[1, c])?;
        let offset = cols.sub(&rows)?;
        let k = Tensor::scalar(diagonal as f64, DType::I64, dev)?;
        let mask = offset.compare(&k, keep, op)?;
        Tensor::where_(&mask, self, &self.scalar_like(0.0)?)
    }
}

/// Gradient of maximum (`win = Gt`) / minimum (`win = Lt`): all to the winner, half each on ties.
fn split_ties(a: &Tensor, b: &Tensor, g: &Tensor, win: CmpOp) -> Result<[Option<Tensor>; 2]> {
    let a_wins = a.compare(b, win, "maximum")?.to_dtype(g.dtype())?;
    let ties = a.eq(b)?.to_dtype(g.dtype())?.mul_scalar(0.5)?;
    let wa = a_wins.add(&ties)?;
    let wb = wa.rsub_scalar(1.0)?;
    Ok([Some(g.mul(&wa)?), Some(g.mul(&wb)?)])
}
