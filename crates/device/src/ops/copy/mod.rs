//! Copies: strided to contiguous, contiguous into a strided destination (`cat`, `stack`, the
//! backward of `narrow`/`select`), and dtype conversion.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::ops::buffer::BufferOps;
use crate::seam::seam_trait;
use crate::{DType, Layout, Result};

seam_trait! {
    /// Copies and casts of a strided view.
    pub trait CopyOps: BufferOps {
        /// The elements of `layout`, contiguous.
        fn copy_contiguous(&self, layout: &Layout) -> Result<Self>;
        /// Writes the elements of `layout` into `dst` through `dst_layout` (same shape).
        op("copy")
        fn copy_into(&self, layout: &Layout, dst: &mut Self, dst_layout: &Layout) -> Result<()>;
        /// The elements of `layout` converted to `dtype`, contiguous.
        fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<Self>;
    }
}
