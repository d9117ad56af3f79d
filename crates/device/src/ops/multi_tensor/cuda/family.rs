//! `MultiTensorOps for CudaStorage`: the multi-tensor family on one CUDA device, over the
//! launchers of `cuda.rs` and its siblings. Operands arrive narrowed to `CudaStorage` and on one
//! device (the family's dispatch checked both); this file turns them into the kernels' address
//! tables.
//!
//! Invariants: nothing here waits for the device except [`MultiTensorOps::norm_total`] and
//! [`MultiTensorOps::read_found_inf`] (each a 4-byte copy to the host); every operand's view is
//! checked to lie inside its buffer before its address enters a table; the storages borrowed for
//! a launch outlive its enqueueing, and stream order keeps their blocks alive for the kernel
//! (the caching allocator reuses a freed block only for work queued after it).

use cudarc::driver::result;

use super::{
    adam_step_f32, sgd_step_f32, unscale_and_check, with_clip_plan, AdamConstants, AdamTensor,
    DeviceTensor, FoundInfFlag, SgdConstants, SgdTensor,
};
use crate::ops::multi_tensor::{
    AdamHyper, AdamOperands, MultiTensorOps, NormKind, Operand, OperandMut, SgdHyper, SgdOperands,
};
use crate::{CudaStorage, DType, Device, Error, Result};

/// A global norm on a CUDA device: the `[total_norm, clip_coef]` pair the norm kernel wrote,
/// in a two-float buffer of that device that nothing reads back until asked.
#[derive(Debug)]
pub struct DeviceNorm {
    pair: CudaStorage,
}

impl DeviceNorm {
    /// Device address of the `[total_norm, clip_coef]` pair (for the optimizer kernels' `clip`).
    pub fn address(&self) -> u64 {
        self.pair.device_ptr()
    }
}

/// The kernel's view of a dense operand, after checking it lies inside its buffer.
fn entry(op: &'static str, (st, layout): Operand<'_, CudaStorage>) -> Result<DeviceTensor> {
    st.check_view(op, layout)?;
    Ok(DeviceTensor {
        ptr: st.device_address(layout.offset())?,
        len: layout.numel() as u64,
        dtype: st.dtype(),
    })
}

fn entries(op: &'static str, tensors: &[Operand<'_, CudaStorage>]) -> Result<Vec<DeviceTensor>> {
    tensors.iter().map(|&t| entry(op, t)).collect()
}

fn entries_mut(
    op: &'static str,
    tensors: &[OperandMut<'_, CudaStorage>],
) -> Result<Vec<DeviceTensor>> {
    tensors
        .iter()
        .map(|(st, l)| entry(op, (&**st, *l)))
        .collect()
}

/// The address of an f32 operand of `len` elements (the optimizer kernels are f32-only).
fn f32_address(op: &'static str, operand: Operand<'_, CudaStorage>, len: usize) -> Result<u64> {
    let t = entry(op, operand)?;
    if t.dtype != DType::F32 {
        return Err(Error::UnsupportedDType {
            op,
            dtype: t.dtype,
            hint: "CUDA optimizer steps update f32 parameters, gradients and state; keep master \
                   weights in f32",
        });
    }
    if t.len as usize != len {
        return Err(Error::LengthMismatch {
            op,
            what: format!(
                "a parameter has {len} elements but its gradient or state has {}",
                t.len
            ),
        });
    }
    Ok(t.ptr)
}

fn ordinal_of(tensors: impl IntoIterator<Item = usize>) -> Option<usize> {
    tensors.into_iter().next()
}

fn not_here(op: &'static str, ordinal: usize) -> Error {
    Error::NotImplemented {
        op,
        device: Device::Cuda(ordinal),
    }
}

impl MultiTensorOps for CudaStorage {
    type Norm = DeviceNorm;
    type FoundInf = FoundInfFlag;

    fn per_tensor_norms(
        op: &'static str,
        tensors: &[Operand<'_, Self>],
        _: NormKind,
    ) -> Result<Vec<f64>> {
        let ordinal = ordinal_of(tensors.iter().map(|t| t.0.ordinal())).unwrap_or(0);
        Err(not_here(op, ordinal))
    }

    fn global_norm(
        op: &'static str,
        tensors: &[Operand<'_, Self>],
        kind: NormKind,
        max_norm: f64,
    ) -> Result<DeviceNorm> {
        let Some(ordinal) = ordinal_of(tensors.iter().map(|t| t.0.ordinal())) else {
            return Err(not_here(op, 0));
        };
        let list = entries(op, tensors)?;
        let (_, pair) = CudaStorage::output(ordinal, 2, DType::F32)?;
        with_clip_plan(ordinal, &list, |plan| {
            plan.norm(kind, max_norm, pair.device_ptr())
        })?;
        Ok(DeviceNorm { pair })
    }

    fn norm_total(norm: &DeviceNorm) -> Result<f64> {
        match norm.pair.to_host()?.to_vec::<f32>() {
            Some(pair) if pair.len() == 2 => Ok(f64::from(pair[0])),
            _ => Err(Error::LengthMismatch {
                op: "clip_grad_norm_",
                what: "the device norm is not a pair of f32".into(),
            }),
        }
    }

    fn copy_norm_total(
        op: &'static str,
        norm: &DeviceNorm,
        out: OperandMut<'_, Self>,
    ) -> Result<()> {
        let (st, layout) = out;
        let dst = entry(op, (&*st, layout))?;
        if dst.dtype != DType::F32 || dst.len != 1 {
            return Err(Error::LengthMismatch {
                op,
                what: format!(
                    "the total norm is written to a 0-d f32 tensor, got {} elements of {}",
                    dst.len, dst.dtype
                ),
            });
        }
        let stream = crate::storage::cuda_stream(st.ordinal())?;
        let cuda = |e: cudarc::driver::DriverError| Error::Cuda {
            op,
            msg: e.to_string(),
        };
        stream.context().bind_to_thread().map_err(cuda)?;
        // SAFETY: `dst` is a live f32 element of `st`, held mutably by the caller, and the
        // source is the norm's live pair; the copy is queued on the stream both belong to, so it
        // runs after the norm kernel and before any later use of `dst`.
        unsafe {
            result::memcpy_dtod_async(
                dst.ptr,
                norm.address(),
                std::mem::size_of::<f32>(),
                stream.cu_stream(),
            )
        }
        .map_err(cuda)
    }

    fn scale_by_clip_coef_(
        op: &'static str,
        tensors: &mut [OperandMut<'_, Self>],
        norm: &DeviceNorm,
    ) -> Result<()> {
        let Some(ordinal) = ordinal_of(tensors.iter().map(|t| t.0.ordinal())) else {
            return Ok(());
        };
        let list = entries_mut(op, tensors)?;
        with_clip_plan(ordinal, &list, |plan| plan.scale(norm.address()))
    }

    fn scale_(op: &'static str, tensors: &mut [OperandMut<'_, Self>], _: f64) -> Result<()> {
        match ordinal_of(tensors.iter().map(|t| t.0.ordinal())) {
            None => Ok(()),
            Some(ordinal) => Err(not_here(op, ordinal)),
        }
    }

    fn clamp_(op: &'static str, tensors: &mut [OperandMut<'_, Self>], _: f64) -> Result<()> {
        match ordinal_of(tensors.iter().map(|t| t.0.ordinal())) {
            None => Ok(()),
            Some(ordinal) => Err(not_here(op, ordinal)),
        }
    }

    fn unscale_and_check_(
        op: &'static str,
        tensors: &mut [OperandMut<'_, Self>],
        inv_scale: f32,
    ) -> Result<FoundInfFlag> {
        let ordinal = ordinal_of(tensors.iter().map(|t| t.0.ordinal())).unwrap_or(0);
        let stream = crate::storage::cuda_stream(ordinal)?;
        let mut flag = FoundInfFlag::new(&stream)?;
        let table = entries_mut(op, tensors)?;
        unscale_and_check(&stream, &table, inv_scale, &mut flag)?;
        Ok(flag)
    }

    fn read_found_inf(found: &FoundInfFlag) -> Result<bool> {
        found.read()
    }

    fn adam_step(
        op: &'static str,
        list: &mut [AdamOperands<'_, Self>],
        o: &AdamHyper,
    ) -> Result<()> {
        let Some(ordinal) = ordinal_of(list.iter().map(|w| w.param.0.ordinal())) else {
            return Ok(());
        };
        let mut table = Vec::with_capacity(list.len());
        for w in list.iter() {
            let len = w.param.1.numel();
            let address = |operand| f32_address(op, operand, len);
            table.push(AdamTensor {
                param: address((&*w.param.0, w.param.1))?,
                grad: address(w.grad)?,
                exp_avg: address((&*w.exp_avg.0, w.exp_avg.1))?,
                exp_avg_sq: address((&*w.exp_avg_sq.0, w.exp_avg_sq.1))?,
                max_exp_avg_sq: match &w.max_exp_avg_sq {
                    Some((st, layout)) => address((&**st, *layout))?,
                    None => 0,
                },
                len: len as u64,
                step_size: w.scalars.step_size as f32,
                bias_correction2_sqrt: w.scalars.bias_correction2_sqrt as f32,
            });
        }
        let has_wd = o.weight_decay != 0.0;
        let k = AdamConstants {
            beta1_weight: (1.0 - o.beta1) as f32,
            beta2: o.beta2 as f32,
            beta2_weight: (1.0 - o.beta2) as f32,
            eps: o.eps as f32,
            weight_decay: o.weight_decay as f32,
            decay: (1.0 - o.lr * o.weight_decay) as f32,
            grad_scale: (if o.maximize {
                -o.grad_scale
            } else {
                o.grad_scale
            }) as f32,
            l2: has_wd && !o.decoupled,
            decoupled: has_wd && o.decoupled,
        };
        let stream = crate::storage::cuda_stream(ordinal)?;
        adam_step_f32(&stream, &table, &k, None)
    }

    fn sgd_step(op: &'static str, list: &mut [SgdOperands<'_, Self>], o: &SgdHyper) -> Result<()> {
        let Some(ordinal) = ordinal_of(list.iter().map(|w| w.param.0.ordinal())) else {
            return Ok(());
        };
        let mut table = Vec::with_capacity(list.len());
        for w in list.iter() {
            let len = w.param.1.numel();
            let address = |operand| f32_address(op, operand, len);
            table.push(SgdTensor {
                param: address((&*w.param.0, w.param.1))?,
                grad: address(w.grad)?,
                momentum_buffer: match &w.momentum_buffer {
                    Some((st, layout)) => address((&**st, *layout))?,
                    None => 0,
                },
                len: len as u64,
                first: w.first_momentum_step,
            });
        }
        let k = SgdConstants {
            neg_lr: (-o.lr) as f32,
            weight_decay: o.weight_decay as f32,
            momentum: o.momentum as f32,
            dampening_weight: (1.0 - o.dampening) as f32,
            grad_scale: (if o.maximize {
                -o.grad_scale
            } else {
                o.grad_scale
            }) as f32,
            scaled: o.grad_scale != 1.0 || o.maximize,
            has_wd: o.weight_decay != 0.0,
            nesterov: o.nesterov,
        };
        let stream = crate::storage::cuda_stream(ordinal)?;
        sgd_step_f32(&stream, &table, &k, None)
    }
}
