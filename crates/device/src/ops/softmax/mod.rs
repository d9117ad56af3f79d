//! Softmax and log-softmax over the last dim (kiln-autograd moves any other dim last with a
//! transpose view). One pass for the row max, one for the sum of exponentials, one to write.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::ops::buffer::BufferOps;
use crate::seam::seam_trait;
use crate::{Layout, Result};

seam_trait! {
    /// Softmax over the last dim.
    pub trait SoftmaxOps: BufferOps {
        /// Softmax (or log-softmax) over the last dim.
        fn softmax_last_dim(&self, layout: &Layout, log: bool) -> Result<Self>;
    }
}
