//! [`GradScaler`]: dynamic loss scaling for mixed-precision training (PyTorch's
//! `torch.amp.GradScaler`).
//!
//! The loss is multiplied by the scale before backward so small fp16 gradients do not flush to
//! zero; [`GradScaler::unscale_`] divides every gradient of an optimizer by the scale and checks
//! them for inf/NaN in the same fused pass (one read and one write of each gradient and one
//! found-inf answer per device: kiln-device's `unscale_and_check_`, which on a CUDA device is one
//! launch writing a flag in device memory, read back once by `step`). [`GradScaler::step`]
//! skips the optimizer step when anything was non-finite, and [`GradScaler::update`] halves the
//! scale after such a step or doubles it after `growth_interval` clean steps in a row. Call
//! `unscale_` before clipping, as PyTorch documents, so the clip threshold applies to the true
//! gradients:
//!
//! ```text
//! scaler.scale(&loss)?.backward()?;
//! scaler.unscale_(&mut opt)?;
//! clip_grad_norm_(&params, 1.0, 2.0, false)?;
//! scaler.step(&mut opt)?;
//! scaler.update()?;
//! ```

use crate::operands::{by_device, with_operands_mut};
use crate::optimizer::Optimizer;
use crate::{arg_err, Error, Result};
use kiln_autograd::Tensor;
use kiln_device::ops::multi_tensor::{self, FoundInf};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The options of a [`GradScaler`] (PyTorch's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GradScalerOptions {
    /// Initial scale (default 65536 = 2^16).
    pub init_scale: f64,
    /// Factor applied after `growth_interval` clean steps (default 2.0).
    pub growth_factor: f64,
    /// Factor applied after a step with non-finite gradients (default 0.5).
    pub backoff_factor: f64,
    /// Clean steps between growths (default 2000).
    pub growth_interval: u64,
    /// When false, the scaler does nothing (scale 1, steps always taken).
    pub enabled: bool,
}

impl Default for GradScalerOptions {
    fn default() -> Self {
        GradScalerOptions {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            enabled: true,
        }
    }
}

/// The saved state of a [`GradScaler`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GradScalerState {
    /// The current scale.
    pub scale: f32,
    /// Growth factor.
    pub growth_factor: f64,
    /// Backoff factor.
    pub backoff_factor: f64,
    /// Growth interval.
    pub growth_interval: u64,
    /// Clean steps since the last growth or backoff.
    pub growth_tracker: u64,
}

/// Where an optimizer stands between two `update`s. After `unscale_`, each device's answer
/// stays where it was found (on a CUDA device, in a device-side flag) until `step` (or
/// `update`) reads it.
#[derive(Debug)]
enum Stage {
    Unscaled {
        /// One answer per device the gradients were on.
        found_inf: Vec<FoundInf>,
    },
    Stepped {
        found_inf: bool,
    },
}

impl Stage {
    fn found_inf(&self) -> Result<bool> {
        match self {
            Stage::Unscaled { found_inf } => {
                for found in found_inf {
                    if found.read()? {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            Stage::Stepped { found_inf } => Ok(*found_inf),
        }
    }
}

/// Dynamic loss scaler.
#[derive(Debug)]
pub struct GradScaler {
    options: GradScalerOptions,
    scale: f32,
    growth_tracker: u64,
    per_optimizer: HashMap<usize, Stage>,
}

fn key(opt: &dyn Optimizer) -> usize {
    opt as *const dyn Optimizer as *const () as usize
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler::new(GradScalerOptions::default()).expect("the defaults are valid")
    }
}

/// The scales a scaler keeps, for messages: from `1 / f32::MAX` (below it the unscale's
/// `1 / scale` is inf in f32, so every gradient unscales to inf or NaN) to `f32::MAX`.
const SCALE_RANGE: &str = "2.9e-39 = 1 / f32::MAX to 3.4e38 = f32::MAX";

/// True when `scale` is positive, finite as an f32, and its reciprocal in f32 is finite too.
fn usable_scale(scale: f64) -> bool {
    let s = scale as f32;
    scale > 0.0 && s.is_finite() && ((1.0 / f64::from(s)) as f32).is_finite()
}

impl GradScaler {
    /// A scaler with `options` (checked: growth > 1, backoff in (0, 1), an `init_scale` that
    /// [`GradScaler::set_scale`] takes, and a `growth_interval` of at least 1).
    pub fn new(options: GradScalerOptions) -> Result<Self> {
        let o = &options;
        let factors_ok = o.growth_factor > 1.0 && o.backoff_factor > 0.0 && o.backoff_factor < 1.0;
        if !factors_ok {
            return Err(arg_err(
                "GradScaler",
                format!(
                    "growth_factor {:?} must be > 1 and backoff_factor {:?} in (0, 1)",
                    o.growth_factor, o.backoff_factor
                ),
            ));
        }
        if !usable_scale(o.init_scale) || o.growth_interval == 0 {
            return Err(arg_err(
                "GradScaler",
                format!(
                    "init_scale {} must be a positive number within f32's range ({SCALE_RANGE}) \
                     and growth_interval {} at least 1",
                    o.init_scale, o.growth_interval
                ),
            ));
        }
        Ok(GradScaler {
            scale: options.init_scale as f32,
            options,
            growth_tracker: 0,
            per_optimizer: HashMap::new(),
        })
    }

    /// The current scale (1 when disabled).
    pub fn get_scale(&self) -> f64 {
        if self.options.enabled {
            f64::from(self.scale)
        } else {
            1.0
        }
    }

    /// Clean steps since the last scale change.
    pub fn growth_tracker(&self) -> u64 {
        self.growth_tracker
    }

    /// `loss * scale` (recorded by autograd; call `backward` on it).
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        if !self.options.enabled {
            return Ok(loss.clone());
        }
        Ok(loss.mul_scalar(f64::from(self.scale))?)
    }

    /// Divides every gradient of `optimizer` by the scale and records whether any is NaN or
    /// infinite after it (one the unscale overflowed included), in one fused pass. At most once
    /// per optimizer between `update`s; a call that finds no gradient records nothing.
    pub fn unscale_(&mut self, optimizer: &mut dyn Optimizer) -> Result<()> {
        if !self.options.enabled {
            return Ok(());
        }
        match self.per_optimizer.get(&key(optimizer)) {
            Some(Stage::Unscaled { .. }) => {
                return Err(arg_err(
                    "unscale_",
                    "unscale_() has already been called on this optimizer since the last \
                     update(); call it once per step",
                ))
            }
            Some(Stage::Stepped { .. }) => {
                return Err(arg_err(
                    "unscale_",
                    "unscale_() is being called after step(); call update() first",
                ))
            }
            None => {}
        }
        let inv_scale = (1.0 / f64::from(self.scale)) as f32;
        let grads = optimizer
            .named_params()
            .iter()
            .filter_map(|(_, p)| p.grad())
            .map(|g| (g.device(), g))
            .collect::<Vec<(_, Tensor)>>();
        let found_inf = by_device(grads)
            .iter()
            .map(|list| {
                with_operands_mut(list, |ops| {
                    Ok(multi_tensor::unscale_and_check_(
                        "unscale_", ops, inv_scale,
                    )?)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // No gradient, no check: nothing is recorded, so `step` refuses and `update` does not
        // count this as a clean step.
        if !found_inf.is_empty() {
            self.per_optimizer
                .insert(key(optimizer), Stage::Unscaled { found_inf });
        }
        Ok(())
    }

    /// Steps `optimizer` unless its gradients held inf/NaN (unscaling first if `unscale_` was
    /// not called). Returns whether the step was taken. An optimizer none of whose parameters
    /// has a gradient is an error, as in PyTorch (stepping it would do nothing, and `update`
    /// would count a step nothing checked).
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) -> Result<bool> {
        if !self.options.enabled {
            optimizer.step()?;
            return Ok(true);
        }
        let k = key(optimizer);
        if matches!(self.per_optimizer.get(&k), Some(Stage::Stepped { .. })) {
            return Err(arg_err(
                "step",
                "step() has already been called since the last update(); call update() between steps",
            ));
        }
        if !self.per_optimizer.contains_key(&k) {
            self.unscale_(optimizer)?;
        }
        let Some(stage) = self.per_optimizer.get(&k) else {
            return Err(arg_err(
                "step",
                "no parameter of this optimizer has a gradient, so there is nothing to check or \
                 step; call backward on scaler.scale(loss) first (PyTorch: \"No inf checks were \
                 recorded for this optimizer\")",
            ));
        };
        let found_inf = stage.found_inf()?;
        if !found_inf {
            optimizer.step()?;
        }
        self.per_optimizer.insert(k, Stage::Stepped { found_inf });
        Ok(!found_inf)
    }

    /// Adjusts the scale after a step: backoff when any optimizer saw inf/NaN, growth after
    /// `growth_interval` clean steps in a row (PyTorch's `_amp_update_scale_`). A growth that
    /// would overflow f32 keeps the scale. A backoff below `1 / f32::MAX` is refused (the
    /// step's record is consumed, the scale and growth tracker kept): there `1 / scale` is inf
    /// in f32, so every later step would be skipped without a word (PyTorch's scale goes on
    /// down to 0, a silent stall), and gradients non-finite even at such a scale point at a NaN
    /// or inf in the model, not at the scale.
    pub fn update(&mut self) -> Result<()> {
        if !self.options.enabled {
            return Ok(());
        }
        if self.per_optimizer.is_empty() {
            return Err(Error::InvalidArgument {
                op: "update",
                msg: "no inf checks were recorded prior to update(); call unscale_ or step first"
                    .into(),
            });
        }
        let mut found_inf = false;
        for stage in self.per_optimizer.values() {
            found_inf |= stage.found_inf()?;
        }
        if found_inf {
            let backed = (f64::from(self.scale) * self.options.backoff_factor) as f32;
            if !usable_scale(f64::from(backed)) {
                self.per_optimizer.clear();
                return Err(Error::InvalidArgument {
                    op: "update",
                    msg: format!(
                        "the scale {:e} would back off out of f32's usable range \
                         ({SCALE_RANGE}): the gradients were inf or NaN even at this scale, so \
                         they are non-finite whatever the scale (below the range, unscaling by \
                         1 / scale overflows f32 and every later step would be skipped without \
                         a word, as PyTorch's scale goes on down to 0); look for a NaN or inf in \
                         the loss, the model's output or a parameter",
                        self.scale
                    ),
                });
            }
            self.scale = backed;
            self.growth_tracker = 0;
        } else {
            let successful = self.growth_tracker + 1;
            if successful == self.options.growth_interval {
                let grown = (f64::from(self.scale) * self.options.growth_factor) as f32;
                if grown.is_finite() {
                    self.scale = grown;
                }
                self.growth_tracker = 0;
            } else {
                self.growth_tracker = successful;
            }
        }
        self.per_optimizer.clear();
        Ok(())
    }

    /// Sets the scale directly (PyTorch's `update(new_scale)`), checked as `init_scale` is:
    /// positive, finite in f32, and at least `1 / f32::MAX`, so that `1 / scale` is finite.
    pub fn set_scale(&mut self, scale: f64) -> Result<()> {
        if !usable_scale(scale) {
            return Err(arg_err(
                "set_scale",
                format!("scale {scale:?} must be positive and within f32's range ({SCALE_RANGE})"),
            ));
        }
        self.scale = scale as f32;
        Ok(())
    }

    /// The scaler's state.
    pub fn state_dict(&self) -> GradScalerState {
        GradScalerState {
            scale: self.scale,
            growth_factor: self.options.growth_factor,
            backoff_factor: self.options.backoff_factor,
            growth_interval: self.options.growth_interval,
            growth_tracker: self.growth_tracker,
        }
    }

    /// Restores a state from [`GradScaler::state_dict`].
    pub fn load_state_dict(&mut self, s: &GradScalerState) -> Result<()> {
        if s.growth_tracker >= s.growth_interval.max(1) {
            return Err(arg_err(
                "GradScaler::load_state_dict",
                format!(
                    "growth_tracker {} must be below growth_interval {} (it counts the clean \
                     steps since the last growth); the state is damaged, load the one \
                     state_dict() wrote",
                    s.growth_tracker, s.growth_interval
                ),
            ));
        }
        let options = GradScalerOptions {
            init_scale: f64::from(s.scale),
            growth_factor: s.growth_factor,
            backoff_factor: s.backoff_factor,
            growth_interval: s.growth_interval,
            enabled: self.options.enabled,
        };
        let fresh = GradScaler::new(options)?;
        *self = GradScaler {
            growth_tracker: s.growth_tracker,
            ..fresh
        };
        Ok(())
    }
}
