//! The multi-tensor family's dispatch on `Storage` variants, written once: each public function
//! checks that every operand of its list is a contiguous view on one device, narrows the
//! `Storage` operands to that device's storage and calls its [`MultiTensorOps`] implementation.
//!
//! Invariants: this is the only place in `ops/multi_tensor` that matches `Storage::Cpu` /
//! `Storage::Cuda`; a list mixing devices is [`Error::DeviceMismatch`] naming the op, a strided
//! operand is [`KernelError::InvalidShape`], and neither ever panics; an empty list is a no-op
//! (its norm is the host's norm of nothing); results that can stay on a device ([`GlobalNorm`],
//! [`FoundInf`]) remember which device holds them.

use super::{
    AdamHyper, AdamOperands, HostNorm, MultiTensorOps, NormKind, Operand, OperandMut, SgdHyper,
    SgdOperands,
};
use crate::ops::KernelError;
#[cfg(feature = "cuda")]
use crate::CudaStorage;
use crate::{CpuStorage, Device, Error, Layout, Result, Storage};

fn device_of(st: &Storage) -> Device {
    match st {
        Storage::Cpu(_) => Device::Cpu,
        #[cfg(feature = "cuda")]
        Storage::Cuda(c) => Device::Cuda(c.ordinal()),
    }
}

/// The device every operand is on (the CPU for none), after checking each layout is dense.
fn one_device<'s>(
    op: &'static str,
    operands: impl IntoIterator<Item = (&'s Storage, &'s Layout)>,
) -> Result<Device> {
    let mut device = None;
    for (st, layout) in operands {
        if !layout.is_contiguous() {
            return Err(KernelError::InvalidShape {
                op,
                shape: layout.shape().to_vec(),
                rule: "multi-tensor ops take contiguous tensors; call contiguous() on strided \
                       views first"
                    .into(),
            }
            .into());
        }
        let here = device_of(st);
        match device {
            None => device = Some(here),
            Some(first) if first != here => {
                return Err(Error::DeviceMismatch {
                    op,
                    lhs: first,
                    rhs: here,
                })
            }
            Some(_) => {}
        }
    }
    Ok(device.unwrap_or(Device::Cpu))
}

/// Narrows `Storage` operands to one device's storage type `S`.
struct Narrow<S: 'static> {
    op: &'static str,
    device: Device,
    read: for<'x> fn(&'x Storage) -> Option<&'x S>,
    write: for<'x> fn(&'x mut Storage) -> Option<&'x mut S>,
}

impl<S> Narrow<S> {
    fn moved(&self, st: &Storage) -> Error {
        Error::DeviceMismatch {
            op: self.op,
            lhs: self.device,
            rhs: device_of(st),
        }
    }

    fn one<'a>(&self, (st, layout): Operand<'a>) -> Result<Operand<'a, S>> {
        (self.read)(st)
            .map(|s| (s, layout))
            .ok_or_else(|| self.moved(st))
    }

    fn one_mut<'b>(&self, (st, layout): &'b mut OperandMut<'_>) -> Result<OperandMut<'b, S>> {
        // The error is built only for a wrong device (building it for every operand showed up
        // in profiles of lists of thousands of small tensors); `read` and `write` agree on
        // which storages they narrow, so the second check never fails.
        if (self.read)(st).is_none() {
            return Err(self.moved(st));
        }
        let (op, device) = (self.op, self.device);
        (self.write)(st)
            .map(|s| (s, *layout))
            .ok_or(Error::DeviceMismatch {
                op,
                lhs: device,
                rhs: device,
            })
    }

    fn all<'a>(&self, list: &[Operand<'a>]) -> Result<Vec<Operand<'a, S>>> {
        list.iter().map(|&o| self.one(o)).collect()
    }

    fn all_mut<'b>(&self, list: &'b mut [OperandMut<'_>]) -> Result<Vec<OperandMut<'b, S>>> {
        list.iter_mut().map(|o| self.one_mut(o)).collect()
    }

    fn adam<'b>(&self, o: &'b mut AdamOperands<'_>) -> Result<AdamOperands<'b, S>> {
        Ok(AdamOperands {
            param: self.one_mut(&mut o.param)?,
            grad: self.one(o.grad)?,
            exp_avg: self.one_mut(&mut o.exp_avg)?,
            exp_avg_sq: self.one_mut(&mut o.exp_avg_sq)?,
            max_exp_avg_sq: o
                .max_exp_avg_sq
                .as_mut()
                .map(|x| self.one_mut(x))
                .transpose()?,
            scalars: o.scalars,
        })
    }

    fn sgd<'b>(&self, o: &'b mut SgdOperands<'_>) -> Result<SgdOperands<'b, S>> {
        Ok(SgdOperands {
            param: self.one_mut(&mut o.param)?,
            grad: self.one(o.grad)?,
            momentum_buffer: o
                .momentum_buffer
                .as_mut()
                .map(|b| self.one_mut(b))
                .transpose()?,
            first_momentum_step: o.first_momentum_step,
        })
    }
}

fn cpu(op: &'static str) -> Narrow<CpuStorage> {
    Narrow {
        op,
        device: Device::Cpu,
        read: |st| match st {
            Storage::Cpu(c) => Some(c),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => None,
        },
        write: |st| match st {
            Storage::Cpu(c) => Some(c),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => None,
        },
    }
}

#[cfg(feature = "cuda")]
fn cuda(op: &'static str, device: Device) -> Narrow<CudaStorage> {
    Narrow {
        op,
        device,
        read: |st| match st {
            Storage::Cuda(c) => Some(c),
            Storage::Cpu(_) => None,
        },
        write: |st| match st {
            Storage::Cuda(c) => Some(c),
            Storage::Cpu(_) => None,
        },
    }
}

#[cfg(not(feature = "cuda"))]
fn no_cuda(op: &'static str, device: Device) -> Error {
    Error::CudaUnavailable(format!(
        "{op}: operands on {device}, but kiln-device was built without the `cuda` feature"
    ))
}

/// Runs `$body` with `$n` narrowing to the storage type `$S` of `$device`.
macro_rules! on_device {
    ($op:expr, $device:expr, |$S:ident, $n:ident| $body:expr) => {
        match $device {
            Device::Cpu => {
                type $S = CpuStorage;
                let $n = cpu($op);
                $body
            }
            #[cfg(feature = "cuda")]
            device @ Device::Cuda(_) => {
                type $S = CudaStorage;
                let $n = cuda($op, device);
                $body
            }
            #[cfg(not(feature = "cuda"))]
            device @ Device::Cuda(_) => Err(no_cuda($op, device)),
        }
    };
}

fn reads<'s>(list: &'s [Operand<'_>]) -> impl Iterator<Item = (&'s Storage, &'s Layout)> {
    list.iter().map(|&(s, l)| (s, l))
}

fn writes<'s>(list: &'s [OperandMut<'_>]) -> impl Iterator<Item = (&'s Storage, &'s Layout)> {
    list.iter().map(|(s, l)| (&**s, *l))
}

/// The norm of each tensor (PyTorch's `vector_norm(t, p)` per tensor), on the host.
pub fn per_tensor_norms(
    op: &'static str,
    tensors: &[Operand<'_>],
    kind: NormKind,
) -> Result<Vec<f64>> {
    on_device!(op, one_device(op, reads(tensors))?, |S, n| {
        S::per_tensor_norms(op, &n.all(tensors)?, kind)
    })
}

/// The global norm of a list (the norm of the per-tensor norms, PyTorch's `get_total_norm`) and
/// its clip coefficient for `max_norm`, kept where the tensors are: on a CUDA device neither is
/// read back until [`GlobalNorm::total`] asks.
#[derive(Debug)]
pub struct GlobalNorm {
    device: Device,
    at: NormAt,
}

#[derive(Debug)]
enum NormAt {
    Host(HostNorm),
    #[cfg(feature = "cuda")]
    Cuda(<CudaStorage as MultiTensorOps>::Norm),
}

impl GlobalNorm {
    /// The device holding the total and the coefficient.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The total norm on the host (for a CUDA norm, a 4-byte copy that waits for the device).
    pub fn total(&self) -> Result<f64> {
        match &self.at {
            NormAt::Host(n) => CpuStorage::norm_total(n),
            #[cfg(feature = "cuda")]
            NormAt::Cuda(n) => CudaStorage::norm_total(n),
        }
    }

    /// The clip coefficient, when it is known on the host (CPU lists): a caller can skip a
    /// scale pass of coefficient `>= 1` without preparing its operands.
    pub fn host_coef(&self) -> Option<f64> {
        match &self.at {
            NormAt::Host(n) => Some(n.coef),
            #[cfg(feature = "cuda")]
            NormAt::Cuda(_) => None,
        }
    }

    /// The per-tensor norms, when they were computed on the host (CPU lists).
    pub fn per_tensor(&self) -> Option<&[f64]> {
        match &self.at {
            NormAt::Host(n) => Some(&n.per_tensor),
            #[cfg(feature = "cuda")]
            NormAt::Cuda(_) => None,
        }
    }

    /// Writes the total into `out`, a 0-d f32 tensor on the norm's device, without waiting for
    /// the device.
    pub fn copy_total_into(&self, op: &'static str, mut out: OperandMut<'_>) -> Result<()> {
        let device = one_device(op, writes(std::slice::from_ref(&out)))?;
        if device != self.device {
            return Err(Error::DeviceMismatch {
                op,
                lhs: self.device,
                rhs: device,
            });
        }
        match &self.at {
            NormAt::Host(n) => CpuStorage::copy_norm_total(op, n, cpu(op).one_mut(&mut out)?),
            #[cfg(feature = "cuda")]
            NormAt::Cuda(n) => {
                CudaStorage::copy_norm_total(op, n, cuda(op, device).one_mut(&mut out)?)
            }
        }
    }
}

/// Computes the [`GlobalNorm`] of `tensors` of `kind` and its clip coefficient for `max_norm`,
/// in one read pass (one launch on CUDA, which does not wait for the device).
pub fn global_norm(
    op: &'static str,
    tensors: &[Operand<'_>],
    kind: NormKind,
    max_norm: f64,
) -> Result<GlobalNorm> {
    let device = one_device(op, reads(tensors))?;
    let at = match device {
        Device::Cpu => NormAt::Host(CpuStorage::global_norm(
            op,
            &cpu(op).all(tensors)?,
            kind,
            max_norm,
        )?),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => NormAt::Cuda(CudaStorage::global_norm(
            op,
            &cuda(op, device).all(tensors)?,
            kind,
            max_norm,
        )?),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => return Err(no_cuda(op, device)),
    };
    Ok(GlobalNorm { device, at })
}

/// Multiplies every element of `tensors` by `norm`'s clip coefficient when it is below 1 or NaN
/// (a coefficient of 1 changes no bit, so that pass is skipped; on CUDA the kernel reads the
/// coefficient on the device and skips itself).
pub fn scale_by_clip_coef_(
    op: &'static str,
    tensors: &mut [OperandMut<'_>],
    norm: &GlobalNorm,
) -> Result<()> {
    if tensors.is_empty() {
        return Ok(());
    }
    let device = one_device(op, writes(tensors))?;
    if device != norm.device {
        return Err(Error::DeviceMismatch {
            op,
            lhs: norm.device,
            rhs: device,
        });
    }
    match &norm.at {
        NormAt::Host(n) => CpuStorage::scale_by_clip_coef_(op, &mut cpu(op).all_mut(tensors)?, n),
        #[cfg(feature = "cuda")]
        NormAt::Cuda(n) => {
            CudaStorage::scale_by_clip_coef_(op, &mut cuda(op, device).all_mut(tensors)?, n)
        }
    }
}

/// Clips `tensors` in place by their global norm of `kind` to at most `max_norm`:
/// `clip_grad_norm_`'s norm pass, then its scale pass unless the coefficient is 1 or more (or,
/// with `refuse_nonfinite`, the total is NaN or infinite), with the list checked and prepared
/// once for both. Returns the norm and whether a non-finite total left the list alone.
pub fn clip_by_global_norm_(
    op: &'static str,
    tensors: &mut [OperandMut<'_>],
    kind: NormKind,
    max_norm: f64,
    refuse_nonfinite: bool,
) -> Result<(GlobalNorm, bool)> {
    let device = one_device(op, writes(tensors))?;
    let (at, refused) = match device {
        Device::Cpu => {
            let ops = &mut cpu(op).all_mut(tensors)?;
            let (n, refused) =
                CpuStorage::clip_by_global_norm_(op, ops, kind, max_norm, refuse_nonfinite)?;
            (NormAt::Host(n), refused)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let ops = &mut cuda(op, device).all_mut(tensors)?;
            let (n, refused) =
                CudaStorage::clip_by_global_norm_(op, ops, kind, max_norm, refuse_nonfinite)?;
            (NormAt::Cuda(n), refused)
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => return Err(no_cuda(op, device)),
    };
    Ok((GlobalNorm { device, at }, refused))
}

/// Multiplies every element by `coef` (rounded to `f32` for `f32`/`f16`/`bf16` tensors, as
/// PyTorch multiplies by a coefficient of the tensor's dtype).
pub fn scale_(op: &'static str, tensors: &mut [OperandMut<'_>], coef: f64) -> Result<()> {
    on_device!(op, one_device(op, writes(tensors))?, |S, n| {
        S::scale_(op, &mut n.all_mut(tensors)?, coef)
    })
}

/// Clamps every element to `[-limit, limit]` (NaN stays NaN; PyTorch's `clip_grad_value_`).
pub fn clamp_(op: &'static str, tensors: &mut [OperandMut<'_>], limit: f64) -> Result<()> {
    on_device!(op, one_device(op, writes(tensors))?, |S, n| {
        S::clamp_(op, &mut n.all_mut(tensors)?, limit)
    })
}

/// Whether any element of an unscaled list was NaN or infinite, kept where it was found: on a
/// CUDA device in a device-side flag until [`FoundInf::read`].
#[derive(Debug)]
pub struct FoundInf {
    at: FoundAt,
}

#[derive(Debug)]
enum FoundAt {
    Host(bool),
    #[cfg(feature = "cuda")]
    Cuda(<CudaStorage as MultiTensorOps>::FoundInf),
}

impl FoundInf {
    /// True when a NaN or infinity was found (for a CUDA flag, a 4-byte copy that waits).
    pub fn read(&self) -> Result<bool> {
        match &self.at {
            FoundAt::Host(found) => CpuStorage::read_found_inf(found),
            #[cfg(feature = "cuda")]
            FoundAt::Cuda(flag) => CudaStorage::read_found_inf(flag),
        }
    }
}

/// AMP's fused unscale: multiplies every element by `inv_scale` and records whether any
/// element *before* scaling was NaN or infinite, in one pass (one launch on CUDA, whose answer
/// stays on the device).
pub fn unscale_and_check_(
    op: &'static str,
    tensors: &mut [OperandMut<'_>],
    inv_scale: f32,
) -> Result<FoundInf> {
    let device = one_device(op, writes(tensors))?;
    let at = match device {
        Device::Cpu => FoundAt::Host(CpuStorage::unscale_and_check_(
            op,
            &mut cpu(op).all_mut(tensors)?,
            inv_scale,
        )?),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => FoundAt::Cuda(CudaStorage::unscale_and_check_(
            op,
            &mut cuda(op, device).all_mut(tensors)?,
            inv_scale,
        )?),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => return Err(no_cuda(op, device)),
    };
    Ok(FoundInf { at })
}

fn adam_storages<'s>(
    list: &'s [AdamOperands<'_>],
) -> impl Iterator<Item = (&'s Storage, &'s Layout)> {
    list.iter().flat_map(|o| {
        [
            Some((&*o.param.0, o.param.1)),
            Some(o.grad),
            Some((&*o.exp_avg.0, o.exp_avg.1)),
            Some((&*o.exp_avg_sq.0, o.exp_avg_sq.1)),
            o.max_exp_avg_sq.as_ref().map(|(s, l)| (&**s, *l)),
        ]
        .into_iter()
        .flatten()
    })
}

/// One fused Adam/AdamW step (PyTorch's update, rounding in the parameter dtype) over every
/// parameter of `list`, all on one device: f32 and f64 on the CPU, f32 on CUDA (one launch).
pub fn adam_step(op: &'static str, list: &mut [AdamOperands<'_>], hyper: &AdamHyper) -> Result<()> {
    on_device!(op, one_device(op, adam_storages(list))?, |S, n| {
        let mut narrowed = list
            .iter_mut()
            .map(|o| n.adam(o))
            .collect::<Result<Vec<_>>>()?;
        S::adam_step(op, &mut narrowed, hyper)
    })
}

fn sgd_storages<'s>(
    list: &'s [SgdOperands<'_>],
) -> impl Iterator<Item = (&'s Storage, &'s Layout)> {
    list.iter().flat_map(|o| {
        [
            Some((&*o.param.0, o.param.1)),
            Some(o.grad),
            o.momentum_buffer.as_ref().map(|(s, l)| (&**s, *l)),
        ]
        .into_iter()
        .flatten()
    })
}

/// One fused SGD step (momentum, dampening, Nesterov, weight decay, maximize) over every
/// parameter of `list`, all on one device: f32 and f64 on the CPU, f32 on CUDA (one launch).
pub fn sgd_step(op: &'static str, list: &mut [SgdOperands<'_>], hyper: &SgdHyper) -> Result<()> {
    on_device!(op, one_device(op, sgd_storages(list))?, |S, n| {
        let mut narrowed = list
            .iter_mut()
            .map(|o| n.sgd(o))
            .collect::<Result<Vec<_>>>()?;
        S::sgd_step(op, &mut narrowed, hyper)
    })
}

#[cfg(test)]
mod tests;
