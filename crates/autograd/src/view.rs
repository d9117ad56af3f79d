//! View ops: new [`Layout`]s over the same storage, never a copy (except `reshape` and
//! `contiguous` when the layout forces one). Each records a backward that maps the gradient
//! back to the input's shape: the inverse view, a sum over broadcast dims (`expand`), or a
//! zero-filled gradient with the view's region written in (`narrow`, `select`).

use crate::error::{arg_err, shape_err};
use crate::tensor::{checked_numel, fmt_shape, resolve_dim, Tensor};
use crate::Result;
use kiln_device::prelude::*;
use kiln_device::{Layout, Storage};

/// Resolves a shape with at most one `-1` against `numel`.
pub(crate) fn infer_shape(
    op: &'static str,
    spec: &[isize],
    numel: usize,
    from: &[usize],
) -> Result<Vec<usize>> {
    let mut infer = None;
    for (i, &s) in spec.iter().enumerate() {
        if s == -1 {
            if infer.replace(i).is_some() {
                return Err(arg_err(op, format!("only one dim can be -1 in {spec:?}")));
            }
        } else if s < 0 {
            return Err(arg_err(
                op,
                format!("invalid size {s} in {spec:?}; sizes are >= 0, or -1 for one inferred dim"),
            ));
        }
    }
    // The inferred dim counts as 1 in the product of the known sizes.
    let mut shape: Vec<usize> = spec
        .iter()
        .map(|&s| if s == -1 { 1 } else { s as usize })
        .collect();
    let known = checked_numel(op, &shape)?;
    if let Some(i) = infer {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(shape_err(
                op,
                format!(
                    "shape {spec:?} is invalid for a tensor of shape {} ({numel} elements)",
                    fmt_shape(from)
                ),
            ));
        }
        shape[i] = numel / known;
    } else if known != numel {
        return Err(shape_err(
            op,
            format!(
                "shape {spec:?} has {known} elements but the tensor of shape {} has {numel}",
                fmt_shape(from)
            ),
        ));
    }
    Ok(shape)
}

/// Gradient of a view that selects a region: zeros of `shape` with `g` written through `region`.
pub(crate) fn embed_grad(
    g: &Tensor,
    shape: &[usize],
    region: impl Fn(&Layout) -> Layout,
) -> Result<Tensor> {
    let n = shape.iter().product();
    let mut out = Storage::full(g.device(), n, 0.0, g.dtype())?;
    let dst = region(&Layout::contiguous(shape));
    g.storage().copy_into(g.layout(), &mut out, &dst)?;
    Ok(Tensor::from_storage(out, shape, None))
}

/// The most pieces [`Tensor::chunk`] makes of an empty dim (each an empty tensor): a hostile
/// count must not allocate that many handles.
pub const MAX_EMPTY_CHUNKS: usize = 1 << 16;

impl Tensor {
    /// The same elements as `shape` (one dim may be -1) without copying; an error when the
    /// layout does not allow it (use [`Tensor::reshape`] or [`Tensor::contiguous`] then).
    pub fn view(&self, shape: &[isize]) -> Result<Tensor> {
        let shape = infer_shape("view", shape, self.numel(), self.shape())?;
        self.view_as_shape("view", &shape)
    }

    fn view_as_shape(&self, op: &'static str, shape: &[usize]) -> Result<Tensor> {
        let Some(layout) = self.layout().view(shape) else {
            return Err(shape_err(
                op,
                format!(
                    "a tensor of shape {} with strides {:?} cannot be viewed as {} without copying (its dims \
                     are not laid out contiguously, e.g. after permute or transpose); use reshape, which copies \
                     when it must, or call contiguous() first",
                    fmt_shape(self.shape()),
                    self.strides(),
                    fmt_shape(shape)
                ),
            ));
        };
        let from = self.shape().to_vec();
        let node = Tensor::grad_node("ViewBackward", &[self], |_| {
            Box::new(move |g| Ok(vec![Some(g.reshape_to(&from)?)]))
        });
        Ok(self.view_with(layout, node))
    }

    /// The same elements as `shape` (one dim may be -1): a view when the layout allows, else a copy.
    pub fn reshape(&self, shape: &[isize]) -> Result<Tensor> {
        let shape = infer_shape("reshape", shape, self.numel(), self.shape())?;
        self.reshape_to(&shape)
    }

    /// [`Tensor::reshape`] with a fully known shape.
    pub fn reshape_to(&self, shape: &[usize]) -> Result<Tensor> {
        let requested = checked_numel("reshape", shape)?;
        if requested != self.numel() {
            return Err(shape_err(
                "reshape",
                format!(
                    "shape {} has {} elements but the tensor of shape {} has {}",
                    fmt_shape(shape),
                    requested,
                    fmt_shape(self.shape()),
                    self.numel()
                ),
            ));
        }
        if self.layout().view(shape).is_some() {
            return self.view_as_shape("reshape", shape);
        }
        self.contiguous()?.view_as_shape("reshape", shape)
    }

    /// A contiguous tensor with the same elements (`self` when already contiguous).
    pub fn contiguous(&self) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("ContiguousBackward");
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let storage = self.storage().copy_contiguous(self.layout())?;
        let node = Tensor::grad_node("ContiguousBackward", &[self], |_| {
            Box::new(|g| Ok(vec![Some(g.clone())]))
        });
        Ok(Tensor::from_storage(storage, self.shape(), node))
    }

    /// A size-1 dim inserted at `dim` (`-1` appends).
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("unsqueeze", dim, self.rank() + 1)?;
        let node = Tensor::grad_node("UnsqueezeBackward", &[self], |_| {
            Box::new(move |g| Ok(vec![Some(g.squeeze_dim(d as isize)?)]))
        });
        Ok(self.view_with(self.layout().unsqueeze(d), node))
    }

    /// Dim `dim` removed if its size is 1 (otherwise unchanged, as in PyTorch).
    pub fn squeeze_dim(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("squeeze_dim", dim, self.rank())?;
        if self.rank() == 0 || self.shape()[d] != 1 {
            return Ok(self.clone());
        }
        let node = Tensor::grad_node("SqueezeBackward", &[self], |_| {
            Box::new(move |g| Ok(vec![Some(g.unsqueeze(d as isize)?)]))
        });
        Ok(self.view_with(self.layout().squeeze_dim(d), node))
    }

    /// Every size-1 dim removed.
    pub fn squeeze(&self) -> Result<Tensor> {
        let shape: Vec<usize> = self.shape().iter().copied().filter(|&s| s != 1).collect();
        self.reshape_to(&shape)
    }

    /// Dims reordered: output dim `i` is input dim `dims[i]`.
    pub fn permute(&self, dims: &[isize]) -> Result<Tensor> {
        if dims.len() != self.rank() {
            return Err(arg_err(
                "permute",
                format!("got {} dims {dims:?} for a tensor of rank {} (shape {}); give each dim exactly once", dims.len(), self.rank(), fmt_shape(self.shape())),
            ));
        }
        let mut perm = Vec::with_capacity(dims.len());
        for &d in dims {
            let r = resolve_dim("permute", d, self.rank())?;
            if perm.contains(&r) {
                return Err(arg_err(
                    "permute",
                    format!("dim {d} repeats in {dims:?}; give each dim exactly once"),
                ));
            }
            perm.push(r);
        }
        let mut inverse = vec![0isize; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i as isize;
        }
        let node = Tensor::grad_node("PermuteBackward", &[self], |_| {
            Box::new(move |g| Ok(vec![Some(g.permute(&inverse)?)]))
        });
        Ok(self.view_with(self.layout().permute(&perm), node))
    }

    /// Dims `a` and `b` swapped.
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let (da, db) = (
            resolve_dim("transpose", a, self.rank())?,
            resolve_dim("transpose", b, self.rank())?,
        );
        if self.rank() == 0 {
            return Ok(self.clone());
        }
        let node = Tensor::grad_node("TransposeBackward", &[self], |_| {
            Box::new(move |g| Ok(vec![Some(g.transpose(da as isize, db as isize)?)]))
        });
        Ok(self.view_with(self.layout().transpose(da, db), node))
    }

    /// Transpose of a matrix (rank <= 2), as PyTorch's `.t()`.
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() > 2 {
            return Err(shape_err(
                "t",
                format!(
                    "expects a tensor of rank <= 2, got shape {}; use transpose(a, b)",
                    fmt_shape(self.shape())
                ),
            ));
        }
        if self.rank() < 2 {
            return Ok(self.clone());
        }
        self.transpose(0, 1)
    }

    /// Elements `start..start + length` of dim `dim`.
    pub fn narrow(&self, dim: isize, start: usize, length: usize) -> Result<Tensor> {
        let d = resolve_dim("narrow", dim, self.rank())?;
        let size = self.shape().get(d).copied().unwrap_or(1);
        if start.checked_add(length).is_none_or(|end| end > size) {
            return Err(arg_err(
                "narrow",
                format!(
                    "start {start} + length {length} exceeds size {size} of dim {dim} (shape {})",
                    fmt_shape(self.shape())
                ),
            ));
        }
        let from = self.shape().to_vec();
        let node = Tensor::grad_node("NarrowBackward", &[self], |_| {
            Box::new(move |g| {
                Ok(vec![Some(embed_grad(g, &from, |l| {
                    l.narrow(d, start, length)
                })?)])
            })
        });
        Ok(self.view_with(self.layout().narrow(d, start, length), node))
    }

    /// Index `index` of dim `dim`, removing that dim (negative `index` counts from the end).
    pub fn select(&self, dim: isize, index: isize) -> Result<Tensor> {
        let d = resolve_dim("select", dim, self.rank())?;
        if self.rank() == 0 {
            return Err(shape_err("select", "cannot select from a 0-d tensor"));
        }
        let size = self.shape()[d] as isize;
        let i = if index < 0 { index + size } else { index };
        if i < 0 || i >= size {
            return Err(arg_err(
                "select",
                format!("index {index} is out of range for dim {dim} of size {size}"),
            ));
        }
        let i = i as usize;
        let from = self.shape().to_vec();
        let node = Tensor::grad_node("SelectBackward", &[self], |_| {
            Box::new(move |g| Ok(vec![Some(embed_grad(g, &from, |l| l.select(d, i))?)]))
        });
        Ok(self.view_with(self.layout().select(d, i), node))
    }

    /// Broadcast to `shape` without copying (size-1 dims stretch; new dims are added in front).
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        checked_numel("expand", shape)?;
        let ok = shape.len() >= self.rank()
            && self
                .shape()
                .iter()
                .rev()
                .zip(shape.iter().rev())
                .all(|(&s, &t)| s == t || s == 1);
        if !ok {
            return Err(shape_err(
                "expand",
                format!(
                    "cannot expand shape {} to {}: each dim must match or be 1, and the target may only add dims in front",
                    fmt_shape(self.shape()),
                    fmt_shape(shape)
                ),
            ));
        }
        if shape == self.shape() {
            return Ok(self.clone());
        }
        let from = self.shape().to_vec();
        let node = Tensor::grad_node("ExpandBackward", &[self], |_| {
            Box::new(move |g| Ok(vec![Some(g.sum_to(&from)?)]))
        });
        Ok(self.view_with(self.layout().broadcast_to(shape), node))
    }

    /// Dims `start..=end` merged into one. A 0-d tensor becomes `[1]` (its dims are 0 or -1).
    pub fn flatten(&self, start: isize, end: isize) -> Result<Tensor> {
        let (s, e) = (
            resolve_dim("flatten", start, self.rank())?,
            resolve_dim("flatten", end, self.rank())?,
        );
        if self.rank() == 0 {
            return self.reshape_to(&[1]);
        }
        if s > e {
            return Err(arg_err(
                "flatten",
                format!("start dim {start} comes after end dim {end}"),
            ));
        }
        let mut shape = self.shape()[..s].to_vec();
        shape.push(self.shape()[s..=e].iter().product());
        shape.extend_from_slice(&self.shape()[e + 1..]);
        self.reshape_to(&shape)
    }

    /// The dim a split runs along: `dim` resolved, on a tensor of at least one dim.
    fn split_dim(&self, op: &'static str, dim: isize) -> Result<usize> {
        if self.rank() == 0 {
            return Err(shape_err(
                op,
                "a 0-d tensor has no dim to split; unsqueeze it to [1] first",
            ));
        }
        resolve_dim(op, dim, self.rank())
    }

    /// `chunks` nearly equal pieces along `dim`, as views: PyTorch's `chunk`, pieces of
    /// `ceil(size / chunks)` (the last may be smaller, and there may be fewer than `chunks`);
    /// an empty dim gives `chunks` empty pieces (at most [`MAX_EMPTY_CHUNKS`]).
    pub fn chunk(&self, chunks: usize, dim: isize) -> Result<Vec<Tensor>> {
        if chunks == 0 {
            return Err(arg_err("chunk", "chunks must be at least 1"));
        }
        let d = self.split_dim("chunk", dim)?;
        let size = self.shape()[d];
        if size > 0 {
            return self.split(size.div_ceil(chunks), dim);
        }
        if chunks > MAX_EMPTY_CHUNKS {
            return Err(arg_err(
                "chunk",
                format!(
                    "{chunks} chunks of an empty dim would be {chunks} empty tensors (at most \
                     {MAX_EMPTY_CHUNKS}); ask for fewer"
                ),
            ));
        }
        self.split_sizes(&vec![0; chunks], dim)
    }

    /// Pieces of `size` along `dim` (the last may be smaller), as views; an empty dim gives one
    /// empty piece, and only an empty dim takes a size of 0 (as in PyTorch).
    pub fn split(&self, size: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = self.split_dim("split", dim)?;
        let total = self.shape()[d];
        if total == 0 {
            return Ok(vec![self.narrow(d as isize, 0, 0)?]);
        }
        if size == 0 {
            return Err(arg_err(
                "split",
                format!("split size must be at least 1 for dim {dim} of size {total}"),
            ));
        }
        (0..total)
            .step_by(size)
            .map(|start| self.narrow(d as isize, start, size.min(total - start)))
            .collect()
    }

    /// Pieces with the given sizes along `dim` (they must add up to the dim's size).
    pub fn split_sizes(&self, sizes: &[usize], dim: isize) -> Result<Vec<Tensor>> {
        let d = self.split_dim("split_sizes", dim)?;
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if total != Some(self.shape()[d]) {
            let sum = match total {
                Some(t) => t.to_string(),
                None => "more than usize::MAX".to_string(),
            };
            return Err(shape_err(
                "split_sizes",
                format!(
                    "sizes {sizes:?} add up to {sum} but dim {dim} has size {}",
                    self.shape()[d]
                ),
            ));
        }
        let mut start = 0;
        let mut out = Vec::with_capacity(sizes.len());
        for &s in sizes {
            out.push(self.narrow(d as isize, start, s)?);
            start += s;
        }
        Ok(out)
    }
}
