//! Explicit synchronisation (`torch.cuda.synchronize`) and the switch between deferred and eager
//! index checks on CUDA.
//!
//! CUDA ops queue their work and return at once; kiln waits for a device only where a value
//! must reach the host (a copy to the host: `to_vec`, `item`, `to_device(Cpu)`) and in
//! [`synchronize`]. The index checks of the CUDA indexing ops and of cross-entropy's targets run
//! on the device too, so a bad index is reported at the next such wait, as
//! [`Error::DeferredCheck`](crate::Error::DeferredCheck), with the same value, position and valid
//! range as the CPU error (design: `crates/device/src/cuda/deferred/mod.rs`).
//! [`set_eager_checks`]`(true)` or `KILN_CUDA_EAGER_CHECKS=1` makes each op wait for its own
//! check and return the error at the op instead, as the CPU backend always does (a debugging
//! aid like `CUDA_LAUNCH_BLOCKING=1`: one wait per checked op).

use std::sync::atomic::{AtomicU8, Ordering};

use crate::{Device, Result};

/// The environment variable that turns eager checks on (`1`) for the whole process.
pub const EAGER_CHECKS_VAR: &str = "KILN_CUDA_EAGER_CHECKS";

// 0: not decided yet (read the environment), 1: deferred, 2: eager.
static EAGER: AtomicU8 = AtomicU8::new(0);

/// Makes CUDA index checks eager (`true`: each checked op waits for its check and returns a bad
/// index as its own error) or deferred (`false`, the default: reported at the next
/// synchronisation). Overrides `KILN_CUDA_EAGER_CHECKS`; applies to ops launched afterwards, from
/// any thread. CPU checks are always eager.
pub fn set_eager_checks(eager: bool) {
    EAGER.store(if eager { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether CUDA index checks are eager: the last [`set_eager_checks`], else whether
/// `KILN_CUDA_EAGER_CHECKS=1`.
pub fn eager_checks() -> bool {
    match EAGER.load(Ordering::Relaxed) {
        0 => {
            let eager = std::env::var(EAGER_CHECKS_VAR).is_ok_and(|v| v.trim() == "1");
            // Only the first decision sticks, unless set_eager_checks overrides it.
            let _ = EAGER.compare_exchange(
                0,
                if eager { 2 } else { 1 },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            EAGER.load(Ordering::Relaxed) == 2
        }
        value => value == 2,
    }
}

/// Waits until every op queued on `device` has finished (`torch.cuda.synchronize(device)`), then
/// reports the first bad index found by a deferred check since the last synchronisation as
/// [`Error::DeferredCheck`](crate::Error::DeferredCheck). A no-op on the CPU, whose ops finish
/// before they return.
pub fn synchronize(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => {
            let stream = crate::cuda_stream(ordinal)?;
            stream.synchronize().map_err(|e| crate::Error::Cuda {
                op: "synchronize",
                msg: e.to_string(),
            })?;
            crate::cuda::deferred::report(ordinal, "synchronize")
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(crate::Error::CudaUnavailable(
            "kiln-device was built without its `cuda` feature; rebuild with it".into(),
        )),
    }
}

/// Waits until every op queued on `device` has finished, like [`synchronize`], but leaves a bad
/// index found by a deferred check to be reported by the program's next [`synchronize`] (or
/// copy to the host): for timers and profilers, which wait without taking the program's
/// errors. A no-op on the CPU.
pub fn wait_idle(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => {
            crate::cuda_stream(ordinal)?
                .synchronize()
                .map_err(|e| crate::Error::Cuda {
                    op: "wait_idle",
                    msg: e.to_string(),
                })
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(crate::Error::CudaUnavailable(
            "kiln-device was built without its `cuda` feature; rebuild with it".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_needs_no_wait() {
        assert!(synchronize(Device::Cpu).is_ok());
        assert!(wait_idle(Device::Cpu).is_ok());
    }

    #[test]
    fn set_eager_checks_overrides_the_environment() {
        let before = eager_checks();
        set_eager_checks(true);
        assert!(eager_checks());
        set_eager_checks(false);
        assert!(!eager_checks());
        set_eager_checks(before);
    }
}
