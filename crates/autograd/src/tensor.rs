//! [`Tensor`]: a strided view of a device buffer, plus its place in the autograd graph.
//!
//! A `Tensor` is a cheap handle (`Arc`) to an immutable description: the shared storage
//! (`Arc<StorageCell>`, so views of one buffer share it, with a version counter that in-place
//! ops bump), a [`Layout`] (shape, strides,
//! offset), and either a `grad_fn` (the [`Node`] of the op that made it) or, for a leaf, a
//! `requires_grad` flag and a `.grad()` slot. Cloning a handle shares everything, like assigning a
//! tensor in Python. Ops never write into an existing buffer except through `copy_into` on a
//! freshly allocated one, so saved tensors cannot be changed behind the graph's back.

use crate::autograd::grad_mode::is_grad_enabled;
use crate::autograd::graph::{BackwardFn, Edge, Node};
use crate::error::{arg_err, dtype_err, shape_err};
use crate::{Error, Result};
use kiln_device::prelude::*;
use kiln_device::{DType, Device, Element, Layout, Storage};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A buffer shared by a tensor and all its views, with the count of in-place writes to it.
/// Tensors saved for backward remember the version they saw; backward refuses to use one that
/// was modified since (PyTorch's version counter).
/// The buffer's device is kept here (not per tensor) so that [`Tensor::to_device_`] can move a
/// buffer in place and every view of it follows.
pub(crate) struct StorageCell {
    data: RwLock<Storage>,
    version: AtomicU64,
    device: AtomicU64,
}

/// `Device` as one word for [`StorageCell::device`]: `u64::MAX` is the CPU, else a CUDA ordinal.
fn encode_device(device: Device) -> u64 {
    match device {
        Device::Cpu => u64::MAX,
        Device::Cuda(i) => i as u64,
    }
}

fn decode_device(word: u64) -> Device {
    if word == u64::MAX {
        Device::Cpu
    } else {
        Device::Cuda(word as usize)
    }
}

impl StorageCell {
    fn new(storage: Storage) -> Self {
        let device = encode_device(storage.device());
        StorageCell {
            data: RwLock::new(storage),
            version: AtomicU64::new(0),
            device: AtomicU64::new(device),
        }
    }

    /// The device holding the buffer.
    fn device(&self) -> Device {
        decode_device(self.device.load(Ordering::Acquire))
    }

    /// How many in-place writes this buffer has seen.
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }
}

pub(crate) struct TensorImpl {
    id: u64,
    storage: Arc<StorageCell>,
    layout: Layout,
    dtype: DType,
    requires_grad: AtomicBool,
    grad_fn: Option<Arc<Node>>,
    grad: Mutex<Option<Tensor>>,
}

/// An n-dimensional array on a device, with reverse-mode autograd.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorImpl>);

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `[2, 3]`-style rendering of a shape for messages.
pub(crate) fn fmt_shape(shape: &[usize]) -> String {
    format!("{shape:?}")
}

/// The element count of a shape from user input, or a shape error naming it when the count (or a
/// contiguous stride) would not fit in `isize`.
pub(crate) fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    kiln_device::checked_numel(shape).ok_or_else(|| {
        shape_err(
            op,
            format!(
                "shape {} has too many elements: the product of its sizes exceeds {} (isize::MAX)",
                fmt_shape(shape),
                isize::MAX
            ),
        )
    })
}

/// Resolves a possibly negative dim against `rank` (PyTorch's wrap rule).
pub(crate) fn resolve_dim(op: &'static str, dim: isize, rank: usize) -> Result<usize> {
    // A 0-d tensor takes dims as if it had one dim, as in PyTorch: -1 and 0 both name it.
    let r = (rank as isize).max(1);
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(arg_err(
            op,
            format!(
                "dim {dim} is out of range for a tensor of rank {rank} (valid: {}..={})",
                -r,
                r - 1
            ),
        ));
    }
    Ok(d as usize)
}

/// Resolves a list of dims, sorted and de-duplicated (an empty list means all dims).
pub(crate) fn resolve_dims(op: &'static str, dims: &[isize], rank: usize) -> Result<Vec<usize>> {
    if dims.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        let r = resolve_dim(op, d, rank)?;
        if rank == 0 {
            continue;
        }
        if out.contains(&r) {
            return Err(arg_err(
                op,
                format!("dim {d} appears more than once in {dims:?}"),
            ));
        }
        out.push(r);
    }
    out.sort_unstable();
    Ok(out)
}

impl Tensor {
    // ----- construction (crate-internal) -----

    pub(crate) fn from_parts(
        storage: Arc<StorageCell>,
        layout: Layout,
        grad_fn: Option<Arc<Node>>,
    ) -> Tensor {
        let dtype = {
            let s = storage.data.read().unwrap_or_else(|p| p.into_inner());
            s.dtype()
        };
        Tensor(Arc::new(TensorImpl {
            id: next_id(),
            storage,
            layout,
            dtype,
            requires_grad: AtomicBool::new(false),
            grad_fn,
            grad: Mutex::new(None),
        }))
    }

    /// A tensor over a fresh contiguous storage of `shape`.
    pub(crate) fn from_storage(
        storage: Storage,
        shape: &[usize],
        grad_fn: Option<Arc<Node>>,
    ) -> Tensor {
        Tensor::from_parts(
            Arc::new(StorageCell::new(storage)),
            Layout::contiguous(shape),
            grad_fn,
        )
    }

    /// A view of this tensor's storage with another layout.
    pub(crate) fn view_with(&self, layout: Layout, grad_fn: Option<Arc<Node>>) -> Tensor {
        Tensor::from_parts(self.0.storage.clone(), layout, grad_fn)
    }

    /// The node for an op with `inputs`, or `None` when grad mode is off or no input needs grad.
    /// `make` gets, per input, whether it needs a gradient, and returns the backward closure
    /// (only called when a node is made, so nothing is saved otherwise).
    pub(crate) fn grad_node(
        name: &'static str,
        inputs: &[&Tensor],
        make: impl FnOnce(Vec<bool>) -> BackwardFn,
    ) -> Option<Arc<Node>> {
        if !is_grad_enabled() || !inputs.iter().any(|t| t.requires_grad()) {
            return None;
        }
        let needs: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
        let edges = inputs
            .iter()
            .map(|t| {
                if !t.requires_grad() {
                    None
                } else if let Some(node) = &t.0.grad_fn {
                    Some(Edge::Node(node.clone()))
                } else {
                    Some(Edge::Leaf((*t).clone()))
                }
            })
            .collect();
        let (backward, saved) = crate::autograd::graph::collect_saved(|| make(needs));
        Some(Arc::new(Node::new(name, edges, backward, saved)))
    }

    /// The node of the op that made this tensor.
    pub(crate) fn grad_fn_node(&self) -> Option<Arc<Node>> {
        self.0.grad_fn.clone()
    }

    /// Read access to the storage.
    pub(crate) fn storage(&self) -> RwLockReadGuard<'_, Storage> {
        self.0
            .storage
            .data
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Write access to the storage, bumping its version (for in-place ops).
    pub(crate) fn storage_mut(&self) -> RwLockWriteGuard<'_, Storage> {
        self.bump_version();
        self.storage_lock_write()
    }

    /// The buffer's write lock, without marking it changed.
    pub(crate) fn storage_lock_write(&self) -> RwLockWriteGuard<'_, Storage> {
        self.0
            .storage
            .data
            .write()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the buffer changed: saved-tensor checks compare this version.
    pub(crate) fn bump_version(&self) {
        self.0.storage.version.fetch_add(1, Ordering::AcqRel);
    }

    /// A detached handle to save for backward; the node records the storage version it saw.
    pub(crate) fn saved(&self) -> Tensor {
        crate::autograd::graph::register_saved(&self.0.storage);
        self.detach()
    }

    /// The storage handle (shared by views).
    pub(crate) fn storage_arc(&self) -> &Arc<StorageCell> {
        &self.0.storage
    }

    // ----- public accessors -----

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.0.layout.shape()
    }

    /// Size of dim `dim` (negative counts from the end).
    pub fn size(&self, dim: isize) -> Result<usize> {
        Ok(self.shape()[resolve_dim("size", dim, self.rank())?])
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.layout.rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        self.0.layout.strides()
    }

    /// The layout (shape, strides, offset).
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// Device.
    pub fn device(&self) -> Device {
        self.0.storage.device()
    }

    /// True when the elements are densely packed in row-major order.
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    /// True when both tensors view the same buffer (one is a view of the other, or both of a third).
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    /// How many handles share this tensor's storage: views, clones and tensors saved by the
    /// graph for backward (PyTorch's `use_count`). Lets tests see saved tensors being freed.
    pub fn storage_use_count(&self) -> usize {
        Arc::strong_count(&self.0.storage)
    }

    /// Number of in-place writes to this tensor's storage so far.
    pub fn version(&self) -> u64 {
        self.0.storage.version()
    }

    /// A process-unique id of this tensor handle's description (not of its storage).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// True when gradients flow to or through this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.grad_fn.is_some() || self.0.requires_grad.load(Ordering::Relaxed)
    }

    /// True for tensors not made by a recorded op (user-created tensors, parameters, detached).
    pub fn is_leaf(&self) -> bool {
        self.0.grad_fn.is_none()
    }

    /// Name of the op that made this tensor (`"MulBackward"`, ...), `None` for leaves.
    pub fn grad_fn_name(&self) -> Option<&'static str> {
        self.0.grad_fn.as_ref().map(|n| n.name)
    }

    /// Marks a leaf as needing gradients (or not, to freeze it). Only leaves can change this, and
    /// only float tensors can require gradients. Returns the tensor (a handle sharing this one's
    /// data and flag), so it ends a chain that creates a leaf, as PyTorch's `requires_grad_()`:
    /// `let w = Tensor::randn(&[3], DType::F32, Device::Cpu)?.set_requires_grad(true)?;`.
    pub fn set_requires_grad(&self, requires_grad: bool) -> Result<Tensor> {
        if !self.is_leaf() {
            return Err(Error::Autograd(format!(
                "set_requires_grad: only leaf tensors can change requires_grad, but this one was made \
                 by {}; use detach() to get a leaf that shares its data",
                self.grad_fn_name().unwrap_or("an op")
            )));
        }
        if requires_grad && !self.dtype().is_float() {
            return Err(dtype_err(
                "set_requires_grad",
                format!("only floating-point tensors can require gradients, this one is {}; convert with to_dtype(DType::F32)", self.dtype()),
            ));
        }
        self.0.requires_grad.store(requires_grad, Ordering::Relaxed);
        Ok(self.clone())
    }

    /// The accumulated gradient of a leaf, if any.
    pub fn grad(&self) -> Option<Tensor> {
        self.0
            .grad
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the gradient (`None` clears it, as `zero_grad(set_to_none = true)` does).
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad {
            if g.shape() != self.shape() {
                return Err(shape_err(
                    "set_grad",
                    format!(
                        "gradient shape {} does not match tensor shape {}",
                        fmt_shape(g.shape()),
                        fmt_shape(self.shape())
                    ),
                ));
            }
        }
        *self.0.grad.lock().unwrap_or_else(|p| p.into_inner()) = grad.map(|g| g.detach());
        Ok(())
    }

    /// Adds `g` into `.grad()` (the leaf end of backward).
    pub(crate) fn accumulate_grad(&self, g: Tensor) -> Result<()> {
        // The allocation history counts what `.grad` holds as gradients; a result of backward
        // kept as it is (no copy, no sum) changes category here.
        let _gradient = kiln_device::AllocContext::category(kiln_device::MemoryCategory::Gradient);
        let mut slot = self.0.grad.lock().unwrap_or_else(|p| p.into_inner());
        let g = g.contiguous()?;
        let sum = match slot.take() {
            None => g,
            // As PyTorch's AccumulateGrad: into the old gradient when nobody else can see it.
            Some(old) => old.into_add(&g)?,
        };
        kiln_device::reattribute_storage(&sum.storage(), kiln_device::MemoryCategory::Gradient);
        *slot = Some(sum);
        Ok(())
    }

    /// A leaf sharing this tensor's storage and layout, with no history and no grad.
    pub fn detach(&self) -> Tensor {
        self.view_with(self.0.layout.clone(), None)
    }

    // ----- host and device transfer -----

    /// The elements in row-major order, as `T` (which must be this tensor's dtype).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(dtype_err(
                "to_vec",
                format!(
                    "asked for {} elements but the tensor is {}; call to_dtype(DType::{:?}) first",
                    T::DTYPE,
                    self.dtype(),
                    T::DTYPE
                ),
            ));
        }
        let host = self.storage().to_cpu(self.layout())?;
        Ok(host.to_vec::<T>().expect("dtype checked above"))
    }

    /// The elements in row-major order converted to `f64` (any dtype).
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        Ok(self.storage().to_cpu(self.layout())?.to_f64_vec())
    }

    /// The value of a one-element tensor, as `f64`.
    pub fn item(&self) -> Result<f64> {
        if self.numel() != 1 {
            return Err(shape_err(
                "item",
                format!(
                    "only one-element tensors have an item; this one has shape {} ({} elements)",
                    fmt_shape(self.shape()),
                    self.numel()
                ),
            ));
        }
        Ok(self.to_vec_f64()?[0])
    }

    /// A copy on `device` (gradients flow back to the source device).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("ToDeviceBackward");
        if device == self.device() {
            return Ok(self.clone());
        }
        let storage = self.storage().to_device(self.layout(), device)?;
        let src = self.device();
        let node = Tensor::grad_node("ToDeviceBackward", &[self], |_| {
            Box::new(move |g| Ok(vec![Some(g.to_device(src)?)]))
        });
        Ok(Tensor::from_storage(storage, self.shape(), node))
    }

    /// Moves the buffer this tensor views to `device` in place (PyTorch's `module.to(device)` on a
    /// parameter or buffer): the handle, its id, `requires_grad` and name stay, every view of the
    /// buffer follows, and a leaf's gradient moves too. The whole buffer moves, so offsets and
    /// strides stay valid. The version counter is bumped, so a graph that saved this tensor
    /// refuses to run backward afterwards instead of reading moved data.
    pub fn to_device_(&self, device: Device) -> Result<()> {
        if self.0.grad_fn.is_some() {
            return Err(arg_err(
                "to_device_",
                format!(
                    "this tensor is the output of {} and part of a graph; move a leaf (a \
                     parameter or buffer), or use to_device for a differentiable copy",
                    self.grad_fn_name().unwrap_or("an op")
                ),
            ));
        }
        if device == self.device() {
            return Ok(());
        }
        let grad = match self.grad() {
            Some(g) => Some(g.detach().to_device(device)?),
            None => None,
        };
        {
            let mut data = self.storage_mut();
            let whole = Layout::contiguous(&[data.len()]);
            let moved = data.to_device(&whole, device)?;
            *data = moved;
            self.0
                .storage
                .device
                .store(encode_device(device), Ordering::Release);
        }
        if grad.is_some() {
            self.set_grad(grad)?;
        }
        Ok(())
    }

    /// A copy converted to `dtype` (gradients flow back between float types).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("ToDtypeBackward");
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let storage = self.storage().to_dtype(self.layout(), dtype)?;
        let src = self.dtype();
        let node = if dtype.is_float() {
            Tensor::grad_node("ToDtypeBackward", &[self], |_| {
                Box::new(move |g| Ok(vec![Some(g.to_dtype(src)?)]))
            })
        } else {
            None
        };
        Ok(Tensor::from_storage(storage, self.shape(), node))
    }

    /// Checks that `other` has this tensor's dtype and device (for binary ops).
    pub(crate) fn check_same_kind(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.dtype() != other.dtype() {
            return Err(dtype_err(
                op,
                format!(
                    "dtypes differ ({} vs {}); convert one with to_dtype first",
                    self.dtype(),
                    other.dtype()
                ),
            ));
        }
        if self.device() != other.device() {
            return Err(Error::Device(kiln_device::Error::DeviceMismatch {
                op,
                lhs: self.device(),
                rhs: other.device(),
            }));
        }
        Ok(())
    }

    /// Requires a float dtype.
    pub(crate) fn check_float(&self, op: &'static str) -> Result<()> {
        if !self.dtype().is_float() {
            return Err(dtype_err(
                op,
                format!(
                    "needs a floating-point tensor, got {}; convert with to_dtype(DType::F32)",
                    self.dtype()
                ),
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor(shape={}, dtype={}, device={}",
            fmt_shape(self.shape()),
            self.dtype(),
            self.device()
        )?;
        if let Some(name) = self.grad_fn_name() {
            write!(f, ", grad_fn={name}")?;
        } else if self.requires_grad() {
            write!(f, ", requires_grad=true")?;
        }
        if self.numel() <= 16 {
            if let Ok(v) = self.to_vec_f64() {
                write!(f, ", data={v:?}")?;
            }
        }
        write!(f, ")")
    }
}
