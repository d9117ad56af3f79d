//! Elementwise ops: unary functions, broadcasting binary arithmetic, comparisons and `where`.
//! The CPU side is generic strided map loops ([`cpu::map1`], [`cpu::map2`], [`cpu::map3`]); the
//! CUDA side ([`cuda`], `elementwise.cu`) is one grid-stride kernel per op and dtype reading
//! every operand through its strides.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod float;
