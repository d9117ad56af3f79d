//! Batched matrix multiply. CPU: the `gemm` crate (packed, SIMD micro-kernels, rayon) called once
//! per batch matrix with the layout's real strides, so transposed and broadcast (stride 0) inputs
//! need no copy. CUDA ([`cuda`]): one cuBLAS strided-batched GEMM per product, reading transposed and
//! broadcast operands in place too.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

/// The plain triple-loop product (`f64` accumulation) the tests and `cargo xtask bench ops`
/// measure the `gemm` path against: a documented reference, not a fast path.
pub use cpu::matmul_reference;

use crate::ops::buffer::BufferOps;
use crate::seam::seam_trait;
use crate::{Layout, Result};

seam_trait! {
    /// Matrix products.
    pub trait MatmulOps: BufferOps {
        /// Batched matrix product: `layout` is `[..batch, m, k]`, `rhs_layout` `[..batch, k, n]`
        /// with identical batch dims (broadcast already, stride 0 allowed); output
        /// `[..batch, m, n]`.
        fn matmul(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<Self>;
    }
}
