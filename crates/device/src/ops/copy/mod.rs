//! Copies: strided to contiguous, contiguous into a strided destination (`cat`, `stack`, the
//! backward of `narrow`/`select`), and dtype conversion.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
