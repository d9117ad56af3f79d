//! Batched matrix multiply. CPU: the `gemm` crate (packed, SIMD micro-kernels, rayon) called once
//! per batch matrix with the layout's real strides, so transposed and broadcast (stride 0) inputs
//! need no copy. CUDA ([`cuda`]): one cuBLAS strided-batched GEMM per product, reading transposed and
//! broadcast operands in place too.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
