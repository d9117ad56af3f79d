//! `batch_norm` (training with the running-statistics update, and evaluation) and
//! `layer_norm`, forward and backward through the seam.
//!
//! Batch norm's running statistics are buffers, not inputs: a training forward updates them in
//! place (their version counter goes up, so a graph that saved them refuses a stale backward)
//! and no gradient flows to them. In training the node saves the batch `mean`/`rstd` the kernel
//! returned; in evaluation it saves the running statistics, which are then constants.
//!
//! Batch norm takes PyTorch's mixed dtypes: an F16/BF16 input with F32 weight, bias and running
//! statistics (a 16-bit conv output under autocast, normalised with the module's f32 parameters
//! and buffers) computes in f32 and returns the input's dtype; the saved statistics, the running
//! statistics and the weight/bias gradients are F32, the input gradient 16-bit. Layer norm's
//! operands share one dtype (autocast runs it in f32).

use crate::error::{arg_err, dtype_err, shape_err};
use crate::ops::conv_pool::grad_tensor;
use crate::tensor::{fmt_shape, Tensor};
use crate::{DType, Error, Result};
use kiln_device::ops::norm::batch_norm_param_dtype;
use kiln_device::prelude::*;
use kiln_device::{BatchNormStats, GradMask, InputGrads, RunningStatsMut};

/// Mode and constants of [`Tensor::batch_norm`]; `Default` is PyTorch's (training, momentum
/// 0.1, eps 1e-5).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNormOptions {
    /// Normalise with batch statistics (and update the running ones) instead of the running ones.
    pub training: bool,
    /// Weight of the batch statistic in the running-statistics update.
    pub momentum: f64,
    /// Added to the variance before the square root.
    pub eps: f64,
}

impl Default for BatchNormOptions {
    fn default() -> Self {
        Self {
            training: true,
            momentum: 0.1,
            eps: 1e-5,
        }
    }
}

/// Checks that an optional per-feature tensor has `shape` and lives on `x`'s device (and, with
/// `same_dtype`, has `x`'s dtype).
fn check_param(
    op: &'static str,
    x: &Tensor,
    name: &str,
    t: Option<&Tensor>,
    shape: &[usize],
    same_dtype: bool,
) -> Result<()> {
    if let Some(t) = t {
        if same_dtype {
            x.check_same_kind(op, t)?;
        } else if x.device() != t.device() {
            return Err(Error::Device(kiln_device::Error::DeviceMismatch {
                op,
                lhs: x.device(),
                rhs: t.device(),
            }));
        }
        if t.shape() != shape {
            return Err(shape_err(
                op,
                format!(
                    "{name} has shape {} but input {} needs {}",
                    fmt_shape(t.shape()),
                    fmt_shape(x.shape()),
                    fmt_shape(shape)
                ),
            ));
        }
    }
    Ok(())
}

/// Batch norm's dtype rule (PyTorch's): weight, bias and running statistics share the input's
/// dtype, or the input is F16/BF16 and every one of them is F32.
fn check_batch_norm_dtypes(x: &Tensor, params: [(&str, Option<&Tensor>); 4]) -> Result<()> {
    let dtypes = params.iter().map(|(_, t)| t.map(Tensor::dtype));
    if batch_norm_param_dtype("batch_norm", x.dtype(), dtypes).is_ok() {
        return Ok(());
    }
    let given: Vec<String> = params
        .iter()
        .filter_map(|(name, t)| t.map(|t| format!("{name} {}", t.dtype())))
        .collect();
    Err(dtype_err(
        "batch_norm",
        format!(
            "input {} with {}: weight, bias and running statistics need the input's dtype, or \
             F32 with an F16/BF16 input; convert them with to_dtype",
            x.dtype(),
            given.join(", ")
        ),
    ))
}

impl Tensor {
    /// Training batch norm of an input with no elements, as PyTorch: an empty output, running
    /// statistics untouched, zero gradients for the weight and bias.
    fn empty_batch_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>) -> Result<Tensor> {
        let out = Tensor::zeros(self.shape(), self.dtype(), self.device())?;
        let inputs: Vec<&Tensor> = std::iter::once(self).chain(weight).chain(bias).collect();
        let node = Tensor::grad_node("NativeBatchNormBackward", &inputs, |_| {
            let like: Vec<_> = inputs
                .iter()
                .map(|t| (t.shape().to_vec(), t.dtype(), t.device()))
                .collect();
            Box::new(move |_| {
                like.iter()
                    .map(|(shape, dtype, device)| Ok(Some(Tensor::zeros(shape, *dtype, *device)?)))
                    .collect()
            })
        });
        Ok(Tensor::with_node(&out, node))
    }

    /// Batch normalisation of `[N, C, ...]` over every dim but `C` (PyTorch's
    /// `F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)`).
    ///
    /// Training normalises with the batch mean and biased variance and, when running statistics
    /// are given, updates them in place (unbiased variance); an input with no elements passes
    /// through empty and leaves them alone, as in PyTorch. Evaluation needs them and normalises
    /// with them.
    ///
    /// An F16/BF16 input may come with F32 weight, bias and running statistics (PyTorch's mixed
    /// case, what autocast produces): the op computes in f32 and the output has the input's
    /// dtype, the running statistics are updated in F32 and the weight/bias gradients are F32.
    pub fn batch_norm(
        &self,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        options: BatchNormOptions,
    ) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("NativeBatchNormBackward");
        const OP: &str = "batch_norm";
        self.check_float(OP)?;
        // Under autocast a 16-bit input stays 16-bit: with f32 weight, bias and running
        // statistics it is normalised in f32 and the output keeps its dtype, as cuDNN's batch
        // norm does (batch_norm is on none of autocast's cast lists); nothing is cast here.
        if self.rank() < 2 {
            return Err(shape_err(
                OP,
                format!(
                    "input {} needs at least 2 dims [N, C, ...]; add a batch dim with unsqueeze(0)",
                    fmt_shape(self.shape())
                ),
            ));
        }
        let c = [self.shape()[1]];
        let params = [
            ("weight", weight),
            ("bias", bias),
            ("running_mean", running_mean),
            ("running_var", running_var),
        ];
        for (name, t) in params {
            check_param(OP, self, name, t, &c, false)?;
        }
        check_batch_norm_dtypes(self, params)?;
        let running = match (running_mean, running_var) {
            (Some(m), Some(v)) => Some((m, v)),
            (None, None) => None,
            _ => {
                return Err(arg_err(
                    OP,
                    "running_mean and running_var go together; pass both or neither",
                ))
            }
        };
        if options.eps.is_nan() || options.eps < 0.0 {
            return Err(arg_err(
                OP,
                format!(
                    "eps {:?} must be >= 0 (PyTorch's default is 1e-5)",
                    options.eps
                ),
            ));
        }
        let eps = options.eps;
        if options.training && self.numel() == 0 {
            return self.empty_batch_norm(weight, bias);
        }
        let saved_stats;
        let storage = if options.training {
            if let Some((m, v)) = running {
                for (name, t) in [("running_mean", m), ("running_var", v)] {
                    if !t.is_contiguous() {
                        return Err(arg_err(
                            OP,
                            format!("{name} must be contiguous to be updated in place; pass a contiguous buffer"),
                        ));
                    }
                    let others = [
                        Some(self),
                        weight,
                        bias,
                        Some(if name == "running_mean" { v } else { m }),
                    ];
                    if others.iter().flatten().any(|o| o.shares_storage_with(t)) {
                        return Err(arg_err(
                            OP,
                            format!("{name} shares its storage with another argument; pass a separate buffer"),
                        ));
                    }
                }
            }
            let x = self.storage();
            let (w, b) = (weight.map(|t| t.storage()), bias.map(|t| t.storage()));
            let w_arg = w.as_deref().zip(weight.map(|t| t.layout()));
            let b_arg = b.as_deref().zip(bias.map(|t| t.layout()));
            let [out, mean, rstd] = match running {
                Some((m, v)) => {
                    let (mut ms, mut vs) = (m.storage_mut(), v.storage_mut());
                    let stats = RunningStatsMut {
                        mean: (&mut *ms, m.layout()),
                        var: (&mut *vs, v.layout()),
                        momentum: options.momentum,
                    };
                    x.batch_norm_train(self.layout(), w_arg, b_arg, Some(stats), eps)?
                }
                None => x.batch_norm_train(self.layout(), w_arg, b_arg, None, eps)?,
            };
            saved_stats = Some((grad_tensor(mean, &c), grad_tensor(rstd, &c)));
            out
        } else {
            let Some((m, v)) = running else {
                return Err(arg_err(
                    OP,
                    "evaluation (training = false) normalises with running_mean and running_var; \
                     pass them or use training = true",
                ));
            };
            saved_stats = None;
            let (x, ms, vs) = (self.storage(), m.storage(), v.storage());
            let (w, b) = (weight.map(|t| t.storage()), bias.map(|t| t.storage()));
            x.batch_norm_eval(
                self.layout(),
                w.as_deref().zip(weight.map(|t| t.layout())),
                b.as_deref().zip(bias.map(|t| t.layout())),
                (&ms, m.layout()),
                (&vs, v.layout()),
                eps,
            )?
        };
        let out = Tensor::from_storage(storage, self.shape(), None);
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        let (has_weight, has_bias) = (weight.is_some(), bias.is_some());
        let node = Tensor::grad_node("NativeBatchNormBackward", &inputs, |needs| {
            let x = self.saved();
            let w = weight.map(|w| w.saved());
            let stats = match saved_stats {
                Some((mean, rstd)) => (mean, rstd, None),
                None => {
                    let (m, v) = running.expect("evaluation has running statistics");
                    (m.saved(), v.saved(), Some(eps))
                }
            };
            let mut it = needs.iter().copied();
            let need_x = it.next().unwrap_or(false);
            let need_w = has_weight && it.next().unwrap_or(false);
            let need_b = has_bias && it.next().unwrap_or(false);
            Box::new(move |g| {
                let grads = {
                    let (gs, xs, s0, s1) = (
                        g.storage(),
                        x.storage(),
                        stats.0.storage(),
                        stats.1.storage(),
                    );
                    let ws = w.as_ref().map(|w| w.storage());
                    let w_arg = ws.as_deref().zip(w.as_ref().map(|t| t.layout()));
                    let a = (&*s0, stats.0.layout());
                    let b = (&*s1, stats.1.layout());
                    let st = match stats.2 {
                        None => BatchNormStats::Batch { mean: a, rstd: b },
                        Some(eps) => BatchNormStats::Running {
                            mean: a,
                            var: b,
                            eps,
                        },
                    };
                    gs.batch_norm_backward(
                        g.layout(),
                        (&xs, x.layout()),
                        w_arg,
                        st,
                        GradMask {
                            input: need_x,
                            weight: need_w,
                            bias: need_b,
                        },
                    )?
                };
                let InputGrads {
                    input: gi,
                    weight: gw,
                    bias: gb,
                } = grads;
                let mut out = vec![gi.map(|s| grad_tensor(s, x.shape()))];
                if has_weight {
                    out.push(gw.map(|s| grad_tensor(s, &c)));
                }
                if has_bias {
                    out.push(gb.map(|s| grad_tensor(s, &c)));
                }
                Ok(out)
            })
        });
        Ok(Tensor::with_node(&out, node))
    }

    /// Layer normalisation over the trailing `normalized_shape` dims (PyTorch's
    /// `F.layer_norm`), with optional elementwise `weight` and `bias` of that shape.
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("NativeLayerNormBackward");
        const OP: &str = "layer_norm";
        self.check_float(OP)?;
        if let Some(wide) = crate::autocast::to_f32(self)? {
            let (w, b) = (
                weight.map(|w| w.to_dtype(DType::F32)).transpose()?,
                bias.map(|b| b.to_dtype(DType::F32)).transpose()?,
            );
            return wide.layer_norm(normalized_shape, w.as_ref(), b.as_ref(), eps);
        }
        let k = normalized_shape.len();
        let r = self.rank();
        if k == 0 || k > r || self.shape()[r - k..] != *normalized_shape {
            return Err(shape_err(
                OP,
                format!(
                    "normalized_shape {} must be a non-empty suffix of the input shape {}; pass \
                     the input's last dims",
                    fmt_shape(normalized_shape),
                    fmt_shape(self.shape())
                ),
            ));
        }
        check_param(OP, self, "weight", weight, normalized_shape, true)?;
        check_param(OP, self, "bias", bias, normalized_shape, true)?;
        if eps.is_nan() || eps < 0.0 {
            return Err(arg_err(OP, format!("eps {eps:?} must be >= 0")));
        }
        let [storage, mean, rstd] = {
            let x = self.storage();
            let (w, b) = (weight.map(|t| t.storage()), bias.map(|t| t.storage()));
            x.layer_norm(
                self.layout(),
                k,
                w.as_deref().zip(weight.map(|t| t.layout())),
                b.as_deref().zip(bias.map(|t| t.layout())),
                eps,
            )?
        };
        let rows = [self.shape()[..r - k].iter().product::<usize>()];
        let out = Tensor::from_storage(storage, self.shape(), None);
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        let (has_weight, has_bias) = (weight.is_some(), bias.is_some());
        let pshape = normalized_shape.to_vec();
        let node = Tensor::grad_node("NativeLayerNormBackward", &inputs, |needs| {
            let x = self.saved();
            let w = weight.map(|w| w.saved());
            let (mean, rstd) = (grad_tensor(mean, &rows), grad_tensor(rstd, &rows));
            let mut it = needs.iter().copied();
            let need_x = it.next().unwrap_or(false);
            let need_w = has_weight && it.next().unwrap_or(false);
            let need_b = has_bias && it.next().unwrap_or(false);
            Box::new(move |g| {
                let InputGrads {
                    input: gi,
                    weight: gw,
                    bias: gb,
                } = {
                    let (gs, xs, ms, rs) =
                        (g.storage(), x.storage(), mean.storage(), rstd.storage());
                    let ws = w.as_ref().map(|w| w.storage());
                    gs.layer_norm_backward(
                        g.layout(),
                        (&xs, x.layout()),
                        k,
                        ws.as_deref().zip(w.as_ref().map(|t| t.layout())),
                        [(&ms, mean.layout()), (&rs, rstd.layout())],
                        GradMask {
                            input: need_x,
                            weight: need_w,
                            bias: need_b,
                        },
                    )?
                };
                let mut out = vec![gi.map(|s| grad_tensor(s, x.shape()))];
                if has_weight {
                    out.push(gw.map(|s| grad_tensor(s, &pshape)));
                }
                if has_bias {
                    out.push(gb.map(|s| grad_tensor(s, &pshape)));
                }
                Ok(out)
            })
        });
        Ok(Tensor::with_node(&out, node))
    }
}
