//! Softmax and log-softmax over the last dim (kiln-autograd moves any other dim last with a
//! transpose view). One pass for the row max, one for the sum of exponentials, one to write.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
