//! `summary(&model, input_shape)`: torchinfo's table and totals from a shape-only forward.
//!
//! The model's `trace` runs on shapes (no tensor data is allocated); each layer call becomes a
//! [`LayerRecord`]. The totals follow torchinfo 1.8's `ModelStatistics` rules so the figures
//! agree with it to the printed digit:
//! - Total / Trainable params: every parameter of the model (the ones that require grad);
//! - Total mult-adds: the sum over leaf-layer calls of torchinfo's per-layer count (see
//!   `crate::trace`);
//! - Forward/backward pass size: twice the output bytes of every leaf-layer call that has
//!   parameters (output plus its gradient; parameter-free layers such as ReLU are not counted);
//! - Params size: the bytes of the parameters held by leaf layers (parameters held directly by a
//!   container, such as ViT's `class_token`, are counted in Total params but not here, as in
//!   torchinfo);
//! - Input size: the bytes of the input tensor (torchinfo uses `sys.getsizeof` of the storage,
//!   a few dozen bytes more, invisible at two decimals);
//! - Estimated Total Size: input + forward/backward + params.
//!
//! Every count is checked arithmetic: an input whose sizes or mult-adds do not fit in `usize`
//! (a 2^62 batch) is an error, never a wrapped number.
//!
//! Where torchinfo's model is not the training memory (it ignores gradients of parameters,
//! optimizer state and what backward really keeps), `crate::plan` goes further.

use crate::trace::{LayerRecord, Tracer};
use crate::{Layer, Result};
use kiln_autograd::DType;
use std::fmt;

/// torchinfo's summary of a model at one input shape, as data. `Display` prints the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The model's class name.
    pub model_name: &'static str,
    /// Input shape traced.
    pub input_shape: Vec<usize>,
    /// One record per layer call, in call order (the model itself first, depth 0).
    pub layers: Vec<LayerRecord>,
    /// Every parameter.
    pub total_params: usize,
    /// Parameters that require grad.
    pub trainable_params: usize,
    /// Parameters that do not.
    pub non_trainable_params: usize,
    /// torchinfo's mult-adds.
    pub total_mult_adds: usize,
    /// Bytes of the input.
    pub input_bytes: usize,
    /// torchinfo's "Forward/backward pass size" in bytes.
    pub forward_backward_bytes: usize,
    /// torchinfo's "Params size" in bytes.
    pub params_bytes: usize,
    /// Deepest level printed by `Display` (torchinfo's `depth`, 3 by default).
    pub max_depth: usize,
}

impl Summary {
    /// torchinfo's "Estimated Total Size" in bytes.
    pub fn total_bytes(&self) -> usize {
        self.input_bytes
            .saturating_add(self.forward_backward_bytes)
            .saturating_add(self.params_bytes)
    }
}

/// The summary of `model` on a float32 input of `input_shape`.
pub fn summary(model: &dyn Layer, input_shape: &[usize]) -> Result<Summary> {
    summary_with_dtype(model, input_shape, DType::F32)
}

/// The summary of `model` on an input of `input_shape` and `dtype` (`I64` for token ids).
pub fn summary_with_dtype(
    model: &dyn Layer,
    input_shape: &[usize],
    dtype: DType,
) -> Result<Summary> {
    let mut tracer = Tracer::new();
    let x = tracer.input(input_shape, dtype);
    tracer.call("", model, &x)?;
    let too_big = |what: String| {
        crate::error::config_err(
            "summary",
            format!(
                "input {input_shape:?}: {what}, so the counts cannot be shown; use a smaller \
                 batch or input size"
            ),
        )
    };
    if let Some(what) = tracer.overflow() {
        return Err(too_big(what.to_string()));
    }
    let layers = tracer.records();
    let mut total_params = 0;
    let mut trainable_params = 0;
    for p in model.parameters() {
        total_params += p.numel();
        if p.requires_grad() {
            trainable_params += p.numel();
        }
    }
    let mut total_mult_adds = 0;
    let mut forward_backward_bytes = 0;
    let mut params_bytes = 0;
    let overflow = || too_big("the totals exceed usize::MAX".to_string());
    for r in layers.iter().filter(|r| r.is_leaf) {
        total_mult_adds = usize::checked_add(total_mult_adds, r.macs).ok_or_else(overflow)?;
        if r.num_params > 0 {
            forward_backward_bytes = r
                .output_bytes
                .checked_mul(2)
                .and_then(|b| b.checked_add(forward_backward_bytes))
                .ok_or_else(overflow)?;
        }
        if !r.is_recursive {
            params_bytes += r.param_bytes;
        }
    }
    Ok(Summary {
        model_name: model.type_name(),
        input_shape: input_shape.to_vec(),
        layers,
        total_params,
        trainable_params,
        non_trainable_params: total_params - trainable_params,
        total_mult_adds,
        input_bytes: x.bytes(),
        forward_backward_bytes,
        params_bytes,
        max_depth: 3,
    })
}

/// `1234567` as `"1,234,567"`.
pub fn with_commas(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// torchinfo's `(G): 1.81` form of a mult-add count (M below 1e9, G, then T).
fn readable_macs(n: usize) -> String {
    let (unit, v) = if n as f64 >= 1e12 {
        ("T", n as f64 / 1e12)
    } else if n as f64 >= 1e9 {
        ("G", n as f64 / 1e9)
    } else {
        ("M", n as f64 / 1e6)
    };
    if v.fract() == 0.0 {
        format!("({unit}): {}", with_commas(v as usize))
    } else {
        format!("({unit}): {v:.2}")
    }
}

fn mb(bytes: usize) -> String {
    format!("{:.2}", bytes as f64 / 1e6)
}

/// Parameters not already counted by the rows below (torchinfo's `leftover_params`: the layer's
/// count minus, over every non-recursive descendant row, the leaf counts and the leftovers of
/// containers; it can go negative, which prints as `--`).
fn leftover(layers: &[LayerRecord], i: usize) -> i64 {
    let d = layers[i].depth;
    let mut left = layers[i].num_params as i64;
    for (j, r) in layers.iter().enumerate().skip(i + 1) {
        if r.depth <= d {
            break;
        }
        if r.is_recursive {
            continue;
        }
        left -= if r.is_leaf {
            r.num_params as i64
        } else {
            leftover(layers, j)
        };
    }
    left
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const COL: usize = 25;
        let names: Vec<String> = self
            .layers
            .iter()
            .map(|r| {
                if r.depth == 0 {
                    r.type_name.to_string()
                } else {
                    format!("{}: {}-{}", r.type_name, r.depth, r.depth_index)
                }
            })
            .collect();
        let mut name_width = 40;
        let longest = self
            .layers
            .iter()
            .zip(&names)
            .map(|(r, n)| n.chars().count() + r.depth * 5 + 1)
            .max()
            .unwrap_or(0);
        if longest >= name_width {
            name_width = longest.div_ceil(5) * 5;
        }
        let width = name_width + 3 * COL;
        let line = |f: &mut fmt::Formatter<'_>, cells: [&str; 4]| -> fmt::Result {
            let mut s = format!("{:<name_width$} ", cells[0]);
            for c in &cells[1..] {
                s += &format!("{c:<COL$} ");
            }
            writeln!(f, "{}", s.trim_end())
        };
        let rule = "=".repeat(width);
        writeln!(f, "{rule}")?;
        line(
            f,
            [
                "Layer (type:depth-idx)",
                "Output Shape",
                "Param #",
                "Trainable",
            ],
        )?;
        writeln!(f, "{rule}")?;
        for (i, (r, name)) in self.layers.iter().zip(&names).enumerate() {
            if r.depth > self.max_depth {
                continue;
            }
            let prefix = match r.depth {
                0 => String::new(),
                1 => "├─".to_string(),
                d => format!("{}└─", "│    ".repeat(d - 1)),
            };
            let params = if r.num_params == 0 {
                "--".to_string()
            } else if r.is_recursive {
                "(recursive)".to_string()
            } else if r.is_leaf || r.depth == self.max_depth {
                let s = with_commas(r.num_params);
                if r.trainable_params > 0 {
                    s
                } else {
                    format!("({s})")
                }
            } else {
                let left = leftover(&self.layers, i);
                if left > 0 {
                    with_commas(left as usize)
                } else {
                    "--".to_string()
                }
            };
            let trainable = if r.num_params == 0 {
                "--"
            } else if r.trainable_params == 0 {
                "False"
            } else if r.trainable_params == r.num_params {
                "True"
            } else {
                "Partial"
            };
            line(
                f,
                [
                    &format!("{prefix}{name}"),
                    &format!("{:?}", r.output_shape),
                    &params,
                    trainable,
                ],
            )?;
        }
        writeln!(f, "{rule}")?;
        writeln!(f, "Total params: {}", with_commas(self.total_params))?;
        writeln!(
            f,
            "Trainable params: {}",
            with_commas(self.trainable_params)
        )?;
        writeln!(
            f,
            "Non-trainable params: {}",
            with_commas(self.non_trainable_params)
        )?;
        writeln!(f, "Total mult-adds {}", readable_macs(self.total_mult_adds))?;
        writeln!(f, "{rule}")?;
        writeln!(f, "Input size (MB): {}", mb(self.input_bytes))?;
        writeln!(
            f,
            "Forward/backward pass size (MB): {}",
            mb(self.forward_backward_bytes)
        )?;
        writeln!(f, "Params size (MB): {}", mb(self.params_bytes))?;
        writeln!(f, "Estimated Total Size (MB): {}", mb(self.total_bytes()))?;
        write!(f, "{rule}")
    }
}
