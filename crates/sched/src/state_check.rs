//! Validation of loaded state dicts: every `load_state_dict` deserializes into a candidate,
//! checks it here against the live scheduler, and only then replaces the live state, so a
//! rejected dict changes nothing.
//!
//! Invariants a valid state keeps (what every `get_lr` relies on not to panic or divide by 0):
//! counters in `-1..=MAX_EPOCH` (so `+ 1` and `2 * T_max` never overflow), one value per
//! parameter group in every per-group list (as many groups as the live scheduler has), every
//! lr, momentum and factor finite and in the range its constructor enforces.

use crate::error::{Result, SchedError};
use crate::scheduler::Core;

/// The largest `last_epoch`, step count or period a loaded state may hold (2^53: exact in f64,
/// and far beyond any run).
pub(crate) const MAX_EPOCH: i64 = 1 << 53;

/// A constructor's count argument (`step_size`, `T_max`, `total_iters`, a milestone, ...) as
/// the i64 the schedule computes with; an error naming `parameter` beyond [`MAX_EPOCH`], where
/// `as i64` would wrap and `2 * T_max` overflow.
pub(crate) fn epochs(scheduler: &'static str, parameter: &'static str, v: usize) -> Result<i64> {
    i64::try_from(v)
        .ok()
        .filter(|&n| n <= MAX_EPOCH)
        .ok_or_else(|| {
            crate::error::invalid(
                scheduler,
                parameter,
                v,
                format!("use at most {MAX_EPOCH} (2^53) epochs or steps"),
            )
        })
}

/// A loaded state that can check itself against the live scheduler (`live`).
pub(crate) trait ValidState {
    fn validate(&self, live: &Self) -> Result<()>;
}

/// Field checks for one scheduler's state, each naming the field in its error.
#[derive(Clone, Copy)]
pub(crate) struct Check(pub &'static str);

impl Check {
    pub fn fail(self, field: &str, value: impl std::fmt::Display, expected: &str) -> SchedError {
        SchedError::InvalidState {
            scheduler: self.0,
            field: field.to_string(),
            value: crate::error::shown(value),
            expected: expected.to_string(),
        }
    }

    /// `ok` or the error for `field`.
    pub fn that(
        self,
        ok: bool,
        field: &str,
        value: impl std::fmt::Display,
        expected: &str,
    ) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(self.fail(field, value, expected))
        }
    }

    pub fn finite(self, field: &str, v: f64) -> Result<()> {
        self.that(v.is_finite(), field, v, "must be a finite number")
    }

    /// Finite and `>= 0` (learning rates, momenta).
    pub fn non_negative(self, field: &str, v: f64) -> Result<()> {
        self.that(
            v.is_finite() && v >= 0.0,
            field,
            v,
            "must be finite and >= 0",
        )
    }

    /// Finite and `> 0` (multiplicative factors).
    pub fn positive(self, field: &str, v: f64) -> Result<()> {
        self.that(v.is_finite() && v > 0.0, field, v, "must be finite and > 0")
    }

    /// An integer counter or period in `lo..=MAX_EPOCH`.
    pub fn count(self, field: &str, v: i64, lo: i64) -> Result<()> {
        self.that(
            (lo..=MAX_EPOCH).contains(&v),
            field,
            v,
            &format!("must be an integer in {lo}..={MAX_EPOCH}"),
        )
    }

    /// One value per group, each passing `each`.
    pub fn per_group(
        self,
        field: &str,
        values: &[f64],
        groups: usize,
        each: impl Fn(Self, &str, f64) -> Result<()>,
    ) -> Result<()> {
        self.that(
            values.len() == groups,
            &format!("{field}.len()"),
            values.len(),
            &format!("must be {groups}, one value per parameter group of this scheduler"),
        )?;
        for (g, &v) in values.iter().enumerate() {
            each(self, &format!("{field}[{g}]"), v)?;
        }
        Ok(())
    }

    /// The shared counters and per-group lists, against the live scheduler's `live` core.
    pub fn core(self, core: &Core, live: &Core) -> Result<()> {
        let groups = live.base_lrs.len();
        self.per_group("base_lrs", &core.base_lrs, groups, Check::non_negative)?;
        // The last lrs written: finite; PyTorch's OneCycleLR can end slightly below 0.
        self.per_group("last_lr", &core.last_lr, groups, Check::finite)?;
        self.count("last_epoch", core.last_epoch, -1)?;
        self.count("step_count", core.step_count, 0)
    }
}

/// `save`/`restore` for schedulers whose whole struct is serializable.
macro_rules! whole_struct_state {
    () => {
        fn save(&self) -> serde_json::Value {
            serde_json::to_value(self).expect("scheduler state serializes")
        }
        fn restore(&mut self, state: serde_json::Value) -> $crate::error::Result<()> {
            let loaded: Self = $crate::scheduler::from_state(Self::NAME, state)?;
            $crate::state_check::ValidState::validate(&loaded, self)?;
            *self = loaded;
            Ok(())
        }
    };
}
pub(crate) use whole_struct_state;
