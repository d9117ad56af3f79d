//! Elementwise ops: unary functions, broadcasting binary arithmetic, comparisons and `where`.
//! The CPU side is generic strided map loops ([`cpu::map1`], [`cpu::map2`], [`cpu::map3`]); the
//! CUDA side ([`cuda`], `elementwise.cu`) is one grid-stride kernel per op and dtype reading
//! every operand through its strides, with flat and 16-byte vector paths for unary and binary
//! ops on unit-stride operands.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod float;
