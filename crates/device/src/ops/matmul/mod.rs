//! Batched matrix multiply. CPU: the `gemm` crate (packed, SIMD micro-kernels, rayon) called once
//! per batch matrix with the layout's real strides, so transposed and broadcast (stride 0) inputs
//! need no copy. CUDA (later): cuBLAS strided-batched GEMM through the same seam.

pub mod cpu;
