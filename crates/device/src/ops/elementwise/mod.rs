//! Elementwise ops: unary functions, broadcasting binary arithmetic, comparisons and `where`.
//! The CPU side is generic strided map loops ([`cpu::map1`], [`cpu::map2`], [`cpu::map3`]); the
//! CUDA side (one grid-stride kernel per op, reading strides) comes with the CUDA backend issue.

pub mod cpu;
pub mod float;
