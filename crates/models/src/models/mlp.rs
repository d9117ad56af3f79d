//! A multi-layer perceptron: `Linear`, `ReLU` (and `Dropout`) repeated, as a `Sequential`, so
//! its names are `nn.Sequential`'s (`0.weight`, `2.weight`, ...).

use crate::error::config_err;
use crate::layers::{Dropout, Linear, ReLU, Sequential};
use crate::Result;

/// An MLP through the widths `sizes` (`[784, 256, 10]`: two `Linear` layers with a ReLU
/// between; `dropout > 0` adds a `Dropout` after each ReLU).
pub fn mlp(sizes: &[usize], dropout: f64) -> Result<Sequential> {
    if sizes.len() < 2 || sizes.contains(&0) {
        return Err(config_err(
            "mlp",
            format!("sizes {sizes:?} needs at least an input and an output width, all positive"),
        ));
    }
    let mut s = Sequential::new();
    for (i, w) in sizes.windows(2).enumerate() {
        s = s.push(Linear::new(w[0], w[1], true)?);
        if i + 2 < sizes.len() {
            s = s.push(ReLU::new());
            if dropout > 0.0 {
                s = s.push(Dropout::new(dropout)?);
            }
        }
    }
    Ok(s)
}
