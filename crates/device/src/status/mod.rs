//! Whether CUDA is usable in this process, and if not, exactly why.
//!
//! [`cuda_status`] probes once per process and caches the answer (the same way the driver's own
//! state is per process). Probing is the moment kiln's CUDA state is initialised: it freezes the
//! programmatic visibility mask ([`crate::set_visible_devices`]). The probe never panics: it checks
//! that `libcuda` and `libnvrtc` can be loaded before calling into them (cudarc's
//! `is_culib_present`), and turns every driver failure into a [`CudaUnavailable`] reason.

pub(crate) mod reason;

pub use reason::{CudaStatus, CudaUnavailable};
use std::sync::OnceLock;

static STATUS: OnceLock<CudaStatus> = OnceLock::new();

/// Probes CUDA once per process (freezing [`crate::set_visible_devices`]) and says whether it is
/// usable, which devices are visible, and why not when it is not. Never panics.
pub fn cuda_status() -> &'static CudaStatus {
    STATUS.get_or_init(|| {
        let programmatic_mask = crate::visibility::freeze();
        probe(programmatic_mask)
    })
}

#[cfg(feature = "cuda")]
fn probe(programmatic_mask: Option<String>) -> CudaStatus {
    crate::cuda::probe::probe(programmatic_mask)
}

#[cfg(not(feature = "cuda"))]
fn probe(_programmatic_mask: Option<String>) -> CudaStatus {
    CudaStatus::unavailable(CudaUnavailable::BuiltWithoutCuda, Vec::new(), Vec::new())
}
