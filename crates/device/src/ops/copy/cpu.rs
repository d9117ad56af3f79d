//! CPU copies and casts: the strided kernels (from `crate::ops::strided`) and [`CopyOps`] for
//! host buffers.

pub use crate::ops::strided::{cast, cast_into, copy_contiguous, copy_contiguous_into, copy_into};

use super::CopyOps;
use crate::ops::cpu_dispatch::{cast as cast_storage, output, same_dtype};
use crate::storage::{with_slice, HostElement};
use crate::{CpuStorage, DType, Layout, Result};

impl CopyOps for CpuStorage {
    fn copy_contiguous(&self, layout: &Layout) -> Result<Self> {
        with_slice!(self, s => output(layout.numel(), |out| copy_contiguous_into(s, layout, out)))
    }

    fn copy_into(&self, layout: &Layout, dst: &mut Self, dst_layout: &Layout) -> Result<()> {
        same_dtype("copy", self, dst)?;
        with_slice!(self, s => {
            let d = HostElement::slice_mut(dst).expect("dtypes checked equal above");
            copy_into(s, layout, d, dst_layout)
        });
        Ok(())
    }

    fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<Self> {
        cast_storage(self, layout, dtype)
    }
}
