//! [`Storage`]: a buffer on some device, and the dispatch from the backend seam to the device's
//! implementation.
//!
//! `Storage` is an enum over the device storages ([`CpuStorage`] always, [`CudaStorage`] with
//! the `cuda` feature). Each [`BackendStorage`] method matches once on the variant(s) and calls
//! that device's implementation; operands on different devices are an error naming `to_device`.

mod cpu;
mod cpu_nn;
#[cfg(feature = "cuda")]
mod cuda;
mod host;

pub use cpu::CpuStorage;
#[cfg(feature = "cuda")]
pub use cuda::{stream as cuda_stream, CudaStorage};
pub use host::HostBuffer;

use crate::backend::{
    BackendStorage, BatchNormStats, BinaryOp, CmpOp, GradMask, Grads3, Pool2d, ReduceOp,
    RunningStatsMut, Strided, UnaryOp,
};
use crate::ops::conv::Conv2dGeometry;
use crate::{DType, Device, Error, Layout, Result};

/// A buffer of one dtype on one device.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Storage {
    /// Host memory.
    Cpu(CpuStorage),
    /// CUDA device memory.
    #[cfg(feature = "cuda")]
    Cuda(CudaStorage),
}

#[cfg(not(feature = "cuda"))]
fn no_cuda(device: Device) -> Error {
    Error::CudaUnavailable(format!(
        "{device} requested but kiln-device was built without the `cuda` feature; rebuild with it"
    ))
}

/// Runs `$body` with `$s` bound to the device storage of `$st`.
macro_rules! on_device {
    ($st:expr, $s:ident => $body:expr) => {
        match $st {
            Storage::Cpu($s) => $body,
            #[cfg(feature = "cuda")]
            Storage::Cuda($s) => $body,
        }
    };
}

/// Like `on_device!` but wraps a returned device storage back into `Storage`.
macro_rules! wrap {
    ($st:expr, $s:ident => $body:expr) => {
        match $st {
            Storage::Cpu($s) => $body.map(Storage::Cpu),
            #[cfg(feature = "cuda")]
            Storage::Cuda($s) => $body.map(Storage::Cuda),
        }
    };
}

/// Pairs two operands on the same device, or errors.
macro_rules! pair {
    ($op:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {
        match ($a, $b) {
            (Storage::Cpu($x), Storage::Cpu($y)) => $body.map(Storage::Cpu),
            #[cfg(feature = "cuda")]
            (Storage::Cuda($x), Storage::Cuda($y)) if $x.device() == $y.device() => {
                $body.map(Storage::Cuda)
            }
            #[allow(unreachable_patterns)]
            (x, y) => Err(Error::DeviceMismatch {
                op: $op,
                lhs: x.device(),
                rhs: y.device(),
            }),
        }
    };
}

/// A device storage type inside [`Storage`]: lets one dispatch body serve every device, with
/// each extra operand checked to be on the first operand's device.
trait Variant: BackendStorage {
    fn of(s: &Storage) -> Option<&Self>;
    fn of_mut(s: &mut Storage) -> Option<&mut Self>;
    fn wrap(self) -> Storage;
}

impl Variant for CpuStorage {
    fn of(s: &Storage) -> Option<&Self> {
        match s {
            Storage::Cpu(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
    fn of_mut(s: &mut Storage) -> Option<&mut Self> {
        match s {
            Storage::Cpu(c) => Some(c),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
    fn wrap(self) -> Storage {
        Storage::Cpu(self)
    }
}

#[cfg(feature = "cuda")]
impl Variant for CudaStorage {
    fn of(s: &Storage) -> Option<&Self> {
        match s {
            Storage::Cuda(c) => Some(c),
            _ => None,
        }
    }
    fn of_mut(s: &mut Storage) -> Option<&mut Self> {
        match s {
            Storage::Cuda(c) => Some(c),
            _ => None,
        }
    }
    fn wrap(self) -> Storage {
        Storage::Cuda(self)
    }
}

/// `x` as `lhs`'s storage type, or a device-mismatch error naming `op`.
fn arg<'a, S: Variant>(
    op: &'static str,
    lhs: &S,
    x: Strided<'a, Storage>,
) -> Result<Strided<'a, S>> {
    match S::of(x.0) {
        Some(s) if s.device() == lhs.device() => Ok((s, x.1)),
        _ => Err(Error::DeviceMismatch {
            op,
            lhs: lhs.device(),
            rhs: x.0.device(),
        }),
    }
}

/// [`arg`] for optional operands.
fn opt<'a, S: Variant>(
    op: &'static str,
    lhs: &S,
    x: Option<Strided<'a, Storage>>,
) -> Result<Option<Strided<'a, S>>> {
    x.map(|x| arg(op, lhs, x)).transpose()
}

/// [`arg`] for buffers written in place.
fn arg_mut<'a, S: Variant>(
    op: &'static str,
    lhs: &S,
    x: (&'a mut Storage, &'a Layout),
) -> Result<(&'a mut S, &'a Layout)> {
    let rhs = x.0.device();
    match S::of_mut(x.0) {
        Some(s) if rhs == lhs.device() => Ok((s, x.1)),
        _ => Err(Error::DeviceMismatch {
            op,
            lhs: lhs.device(),
            rhs,
        }),
    }
}

/// Wraps each gradient of a backward back into `Storage`.
fn wrap3<S: Variant>(g: Grads3<S>) -> Grads3<Storage> {
    g.map(|g| g.map(Variant::wrap))
}

impl Storage {
    /// A host storage owning `data`.
    pub fn from_vec<T: crate::Element>(data: Vec<T>) -> Self {
        Storage::Cpu(CpuStorage::from_vec(data))
    }

    /// A copy of this storage's `layout` elements on `device`, contiguous.
    pub fn to_device(&self, layout: &Layout, device: Device) -> Result<Storage> {
        let host = self.to_cpu(layout)?;
        Storage::from_cpu(device, &host)
    }
}

impl BackendStorage for Storage {
    fn dtype(&self) -> DType {
        on_device!(self, s => s.dtype())
    }
    fn device(&self) -> Device {
        on_device!(self, s => s.device())
    }
    fn len(&self) -> usize {
        on_device!(self, s => s.len())
    }
    fn full(device: Device, n: usize, value: f64, dtype: DType) -> Result<Self> {
        match device {
            Device::Cpu => CpuStorage::full(device, n, value, dtype).map(Storage::Cpu),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => CudaStorage::full(device, n, value, dtype).map(Storage::Cuda),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(no_cuda(device)),
        }
    }
    fn arange(device: Device, start: f64, step: f64, n: usize, dtype: DType) -> Result<Self> {
        match device {
            Device::Cpu => CpuStorage::arange(device, start, step, n, dtype).map(Storage::Cpu),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => {
                CudaStorage::arange(device, start, step, n, dtype).map(Storage::Cuda)
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(no_cuda(device)),
        }
    }
    fn rand_uniform(
        device: Device,
        n: usize,
        low: f64,
        high: f64,
        seed: u64,
        offset: u64,
        dtype: DType,
    ) -> Result<Self> {
        match device {
            Device::Cpu => CpuStorage::rand_uniform(device, n, low, high, seed, offset, dtype)
                .map(Storage::Cpu),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => CudaStorage::rand_uniform(device, n, low, high, seed, offset, dtype)
                .map(Storage::Cuda),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(no_cuda(device)),
        }
    }
    fn rand_normal(
        device: Device,
        n: usize,
        mean: f64,
        std: f64,
        seed: u64,
        offset: u64,
        dtype: DType,
    ) -> Result<Self> {
        match device {
            Device::Cpu => {
                CpuStorage::rand_normal(device, n, mean, std, seed, offset, dtype).map(Storage::Cpu)
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => CudaStorage::rand_normal(device, n, mean, std, seed, offset, dtype)
                .map(Storage::Cuda),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(no_cuda(device)),
        }
    }
    fn from_cpu(device: Device, cpu: &CpuStorage) -> Result<Self> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(cpu.clone())),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => CudaStorage::from_cpu(device, cpu).map(Storage::Cuda),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(no_cuda(device)),
        }
    }
    fn to_cpu(&self, layout: &Layout) -> Result<CpuStorage> {
        on_device!(self, s => s.to_cpu(layout))
    }
    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self> {
        wrap!(self, s => s.unary(layout, op))
    }
    fn binary(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Self> {
        pair!(op.name(), self, rhs, |a, b| a
            .binary(layout, b, rhs_layout, op))
    }
    fn compare(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout, op: CmpOp) -> Result<Self> {
        pair!("comparison", self, rhs, |a, b| a
            .compare(layout, b, rhs_layout, op))
    }
    fn where_cond(
        &self,
        layout: &Layout,
        on_true: &Self,
        tl: &Layout,
        on_false: &Self,
        fl: &Layout,
    ) -> Result<Self> {
        match (self, on_true, on_false) {
            (Storage::Cpu(c), Storage::Cpu(t), Storage::Cpu(f)) => {
                c.where_cond(layout, t, tl, f, fl).map(Storage::Cpu)
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(c), Storage::Cuda(t), Storage::Cuda(f))
                if c.device() == t.device() && t.device() == f.device() =>
            {
                c.where_cond(layout, t, tl, f, fl).map(Storage::Cuda)
            }
            #[allow(unreachable_patterns)]
            _ => {
                let other = if self.device() != on_true.device() {
                    on_true
                } else {
                    on_false
                };
                Err(Error::DeviceMismatch {
                    op: "where",
                    lhs: self.device(),
                    rhs: other.device(),
                })
            }
        }
    }
    fn reduce(&self, layout: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        wrap!(self, s => s.reduce(layout, dims, op))
    }
    fn matmul(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<Self> {
        pair!("matmul", self, rhs, |a, b| a.matmul(layout, b, rhs_layout))
    }
    fn softmax_last_dim(&self, layout: &Layout, log: bool) -> Result<Self> {
        wrap!(self, s => s.softmax_last_dim(layout, log))
    }
    fn copy_contiguous(&self, layout: &Layout) -> Result<Self> {
        wrap!(self, s => s.copy_contiguous(layout))
    }
    fn copy_into(&self, layout: &Layout, dst: &mut Self, dst_layout: &Layout) -> Result<()> {
        let (src_dev, dst_dev) = (self.device(), dst.device());
        match (self, dst) {
            (Storage::Cpu(a), Storage::Cpu(b)) => a.copy_into(layout, b, dst_layout),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(a), Storage::Cuda(b)) if src_dev == dst_dev => {
                a.copy_into(layout, b, dst_layout)
            }
            #[allow(unreachable_patterns)]
            _ => Err(Error::DeviceMismatch {
                op: "copy",
                lhs: src_dev,
                rhs: dst_dev,
            }),
        }
    }
    fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<Self> {
        wrap!(self, s => s.to_dtype(layout, dtype))
    }

    fn conv2d(
        &self,
        layout: &Layout,
        weight: Strided<'_, Self>,
        bias: Option<Strided<'_, Self>>,
        geometry: &Conv2dGeometry,
    ) -> Result<Self> {
        const OP: &str = "conv2d";
        on_device!(self, s => s
            .conv2d(layout, arg(OP, s, weight)?, opt(OP, s, bias)?, geometry)
            .map(Variant::wrap))
    }
    fn conv2d_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        weight: Strided<'_, Self>,
        geometry: &Conv2dGeometry,
        mask: GradMask,
    ) -> Result<Grads3<Self>> {
        const OP: &str = "conv2d_backward";
        on_device!(self, s => s
            .conv2d_backward(layout, arg(OP, s, input)?, arg(OP, s, weight)?, geometry, mask)
            .map(wrap3))
    }
    fn pool2d(&self, layout: &Layout, pool: &Pool2d) -> Result<(Self, Option<Self>)> {
        on_device!(self, s => s
            .pool2d(layout, pool)
            .map(|(out, idx)| (out.wrap(), idx.map(Variant::wrap))))
    }
    fn pool2d_backward(
        &self,
        layout: &Layout,
        indices: Option<Strided<'_, Self>>,
        pool: &Pool2d,
    ) -> Result<Self> {
        const OP: &str = "max_pool2d_backward";
        on_device!(self, s => s
            .pool2d_backward(layout, opt(OP, s, indices)?, pool)
            .map(Variant::wrap))
    }
    fn batch_norm_train(
        &self,
        layout: &Layout,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        running: Option<RunningStatsMut<'_, Self>>,
        eps: f64,
    ) -> Result<[Self; 3]> {
        const OP: &str = "batch_norm";
        on_device!(self, s => {
            let running = match running {
                None => None,
                Some(r) => Some(RunningStatsMut {
                    mean: arg_mut(OP, s, r.mean)?,
                    var: arg_mut(OP, s, r.var)?,
                    momentum: r.momentum,
                }),
            };
            s.batch_norm_train(layout, opt(OP, s, weight)?, opt(OP, s, bias)?, running, eps)
                .map(|r| r.map(Variant::wrap))
        })
    }
    fn batch_norm_eval(
        &self,
        layout: &Layout,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        running_mean: Strided<'_, Self>,
        running_var: Strided<'_, Self>,
        eps: f64,
    ) -> Result<Self> {
        const OP: &str = "batch_norm";
        on_device!(self, s => s
            .batch_norm_eval(
                layout,
                opt(OP, s, weight)?,
                opt(OP, s, bias)?,
                arg(OP, s, running_mean)?,
                arg(OP, s, running_var)?,
                eps,
            )
            .map(Variant::wrap))
    }
    fn batch_norm_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        weight: Option<Strided<'_, Self>>,
        stats: BatchNormStats<'_, Self>,
        mask: GradMask,
    ) -> Result<Grads3<Self>> {
        const OP: &str = "batch_norm_backward";
        on_device!(self, s => {
            let stats = match stats {
                BatchNormStats::Batch { mean, rstd } => BatchNormStats::Batch {
                    mean: arg(OP, s, mean)?,
                    rstd: arg(OP, s, rstd)?,
                },
                BatchNormStats::Running { mean, var, eps } => BatchNormStats::Running {
                    mean: arg(OP, s, mean)?,
                    var: arg(OP, s, var)?,
                    eps,
                },
            };
            s.batch_norm_backward(layout, arg(OP, s, input)?, opt(OP, s, weight)?, stats, mask)
                .map(wrap3)
        })
    }
    fn layer_norm(
        &self,
        layout: &Layout,
        normalized: usize,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        eps: f64,
    ) -> Result<[Self; 3]> {
        const OP: &str = "layer_norm";
        on_device!(self, s => s
            .layer_norm(layout, normalized, opt(OP, s, weight)?, opt(OP, s, bias)?, eps)
            .map(|r| r.map(Variant::wrap)))
    }
    fn layer_norm_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        normalized: usize,
        weight: Option<Strided<'_, Self>>,
        saved: [Strided<'_, Self>; 2],
        mask: GradMask,
    ) -> Result<Grads3<Self>> {
        const OP: &str = "layer_norm_backward";
        on_device!(self, s => {
            let saved = [arg(OP, s, saved[0])?, arg(OP, s, saved[1])?];
            s.layer_norm_backward(
                layout,
                arg(OP, s, input)?,
                normalized,
                opt(OP, s, weight)?,
                saved,
                mask,
            )
            .map(wrap3)
        })
    }
    fn embedding(&self, layout: &Layout, indices: Strided<'_, Self>) -> Result<Self> {
        on_device!(self, s => s
            .embedding(layout, arg("embedding", s, indices)?)
            .map(Variant::wrap))
    }
    fn embedding_backward(
        &self,
        layout: &Layout,
        indices: Strided<'_, Self>,
        num_embeddings: usize,
        padding_idx: Option<i64>,
    ) -> Result<Self> {
        on_device!(self, s => s
            .embedding_backward(
                layout,
                arg("embedding_backward", s, indices)?,
                num_embeddings,
                padding_idx,
            )
            .map(Variant::wrap))
    }
    fn index_select(&self, layout: &Layout, dim: usize, index: Strided<'_, Self>) -> Result<Self> {
        on_device!(self, s => s
            .index_select(layout, dim, arg("index_select", s, index)?)
            .map(Variant::wrap))
    }
    fn index_select_backward(
        &self,
        layout: &Layout,
        input_shape: &[usize],
        dim: usize,
        index: Strided<'_, Self>,
    ) -> Result<Self> {
        on_device!(self, s => s
            .index_select_backward(
                layout,
                input_shape,
                dim,
                arg("index_select_backward", s, index)?,
            )
            .map(Variant::wrap))
    }
    fn gather(&self, layout: &Layout, dim: usize, index: Strided<'_, Self>) -> Result<Self> {
        on_device!(self, s => s
            .gather(layout, dim, arg("gather", s, index)?)
            .map(Variant::wrap))
    }
    fn scatter(
        &self,
        layout: &Layout,
        dim: usize,
        index: Strided<'_, Self>,
        src: Strided<'_, Self>,
        accumulate: bool,
    ) -> Result<Self> {
        let op = if accumulate { "scatter_add" } else { "scatter" };
        on_device!(self, s => s
            .scatter(layout, dim, arg(op, s, index)?, arg(op, s, src)?, accumulate)
            .map(Variant::wrap))
    }
    fn softmax_cross_entropy(
        &self,
        layout: &Layout,
        target: &Self,
        target_layout: &Layout,
        weight: Option<(&Self, &Layout)>,
        spec: &crate::ops::loss::CrossEntropySpec,
    ) -> Result<crate::ops::loss::CrossEntropyOutput<Self>> {
        use crate::ops::loss::CrossEntropyOutput;
        fn unwrap_all<S>(
            out: CrossEntropyOutput<S>,
            wrap: fn(S) -> Storage,
        ) -> CrossEntropyOutput<Storage> {
            CrossEntropyOutput {
                losses: wrap(out.losses),
                grad: out.grad.map(wrap),
                total_weight: wrap(out.total_weight),
            }
        }
        let mismatch = |other: &Storage| Error::DeviceMismatch {
            op: "cross_entropy",
            lhs: self.device(),
            rhs: other.device(),
        };
        for other in std::iter::once(target).chain(weight.map(|(w, _)| w)) {
            if other.device() != self.device() {
                return Err(mismatch(other));
            }
        }
        match (self, target) {
            (Storage::Cpu(x), Storage::Cpu(t)) => {
                let w = match weight {
                    Some((Storage::Cpu(w), l)) => Some((w, l)),
                    #[allow(unreachable_patterns)]
                    Some((other, _)) => return Err(mismatch(other)),
                    None => None,
                };
                x.softmax_cross_entropy(layout, t, target_layout, w, spec)
                    .map(|o| unwrap_all(o, Storage::Cpu))
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(x), Storage::Cuda(t)) => {
                let w = match weight {
                    Some((Storage::Cuda(w), l)) => Some((w, l)),
                    Some((other, _)) => return Err(mismatch(other)),
                    None => None,
                };
                x.softmax_cross_entropy(layout, t, target_layout, w, spec)
                    .map(|o| unwrap_all(o, Storage::Cuda))
            }
            #[allow(unreachable_patterns)]
            (_, other) => Err(mismatch(other)),
        }
    }
}
