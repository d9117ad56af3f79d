//! `dropout`: zeroes each element with probability `p` and scales the survivors by
//! `1 / (1 - p)`, so the expected value is unchanged.
//!
//! The keep-mask comes from kiln's counter-based Philox generator (the process-wide one, or an
//! explicit [`Generator`]): element `i` is kept when its uniform draw `u_i` in `[0, 1)` is
//! `>= p`. Because the draw depends only on seed and counter, the same seed gives the same mask
//! on every device. The mask times the scale is one tensor, and the output is `x * mask`, so the
//! backward is `mul`'s (gradient times the same scaled mask). In evaluation, or with `p = 0`,
//! the input comes back unchanged.

use crate::error::arg_err;
use crate::tensor::Tensor;
use crate::{Generator, Result};

impl Tensor {
    /// Dropout with the default generator; identity when `training` is false or `p == 0`.
    pub fn dropout(&self, p: f64, training: bool) -> Result<Tensor> {
        self.dropout_impl(p, training, None)
    }

    /// Dropout drawing its mask from `generator` (reproducible independently of other draws).
    pub fn dropout_with(
        &self,
        p: f64,
        training: bool,
        generator: &mut Generator,
    ) -> Result<Tensor> {
        self.dropout_impl(p, training, Some(generator))
    }

    fn dropout_impl(
        &self,
        p: f64,
        training: bool,
        generator: Option<&mut Generator>,
    ) -> Result<Tensor> {
        const OP: &str = "dropout";
        self.check_float(OP)?;
        if !(0.0..1.0).contains(&p) {
            return Err(arg_err(
                OP,
                format!(
                    "probability p = {p:?} must lie in [0, 1); p = 1 would zero everything (use \
                     zeros_like), and typical values are 0.1 to 0.5"
                ),
            ));
        }
        if !training || p == 0.0 {
            return Ok(self.clone());
        }
        let draws = match generator {
            Some(g) => g.uniform(self.shape(), 0.0, 1.0, self.dtype(), self.device())?,
            None => Tensor::rand(self.shape(), self.dtype(), self.device())?,
        };
        let mask = draws
            .ge_scalar(p)?
            .to_dtype(self.dtype())?
            .mul_scalar(1.0 / (1.0 - p))?;
        self.mul(&mask)
    }
}
