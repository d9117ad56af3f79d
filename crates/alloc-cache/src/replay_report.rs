//! What a replay is asked ([`ReplayMode`]) and what it reports ([`ReplayReport`]), shared by
//! kiln's replay (`replay.rs`) and the model of PyTorch's allocator (`pytorch_policy.rs`).

use crate::error::{Error, Result};

/// Segment strategy for a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayMode {
    /// Fixed segments.
    Default,
    /// Expandable segments.
    Expandable,
}

impl std::str::FromStr for ReplayMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "default" => Ok(ReplayMode::Default),
            "expandable" => Ok(ReplayMode::Expandable),
            _ => Err(Error::InvalidConfig(format!(
                "mode `{s}`: use `default` or `expandable`"
            ))),
        }
    }
}

impl ReplayMode {
    /// `default` or `expandable`.
    pub fn name(self) -> &'static str {
        match self {
            ReplayMode::Default => "default",
            ReplayMode::Expandable => "expandable",
        }
    }
}

/// What a replay reports (the JSON object `cargo xtask replay` prints).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReplayReport {
    /// Alloc and free events replayed.
    pub events: usize,
    /// Largest sum of live requested bytes.
    pub peak_live_bytes: usize,
    /// Largest reserved (backend-held) bytes.
    pub peak_reserved_bytes: usize,
    /// `peak_reserved_bytes / peak_live_bytes` (1.0 is perfect).
    pub reserved_over_live: f64,
    /// Backend calls that obtained memory.
    pub device_allocs: u64,
    /// Backend calls that returned memory.
    pub device_frees: u64,
    /// Allocations retried after releasing the cache.
    pub alloc_retries: u64,
    /// Allocations that failed.
    pub ooms: u64,
}
