//! The answer of the CUDA probe: [`CudaStatus`] (usable or not, the visible devices) and
//! [`CudaUnavailable`] (each reason CUDA cannot be used, with the fix in its message).
//!
//! Invariants: a status that is not usable always carries a reason; every reason's message
//! names the problem and what to do about it.

use std::fmt;

use crate::properties::CudaDeviceProperties;

/// Why CUDA cannot be used. Each message names the problem and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaUnavailable {
    /// kiln-device was compiled without its `cuda` cargo feature.
    BuiltWithoutCuda,
    /// `libcuda.so` (the NVIDIA driver's library) could not be loaded.
    DriverNotFound,
    /// The driver library lacks a function kiln needs (a driver older than CUDA 13.0).
    DriverTooOld {
        /// The loader's complaint.
        detail: String,
    },
    /// A driver call failed.
    Driver {
        /// The call (`cuInit`, `cuDeviceGetCount`, …).
        call: &'static str,
        /// The driver's error name, e.g. `CUDA_ERROR_NO_DEVICE`.
        code: String,
    },
    /// The driver initialised but reports no device, and nothing masks them.
    NoDevices,
    /// `CUDA_VISIBLE_DEVICES` leaves no device visible.
    HiddenByEnv {
        /// The variable's value.
        value: String,
        /// Where and why its parsing stopped, when known without the driver.
        detail: Option<String>,
    },
    /// [`crate::set_visible_devices`] left no device visible.
    HiddenByProgram {
        /// The ids given.
        ids: String,
        /// Where and why their parsing stopped.
        detail: Option<String>,
    },
    /// Devices exist but `libnvrtc.so` is missing, so no kernel can be compiled.
    NvrtcNotFound,
}

impl fmt::Display for CudaUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let detail = |d: &Option<String>| d.as_ref().map(|d| format!(" ({d})")).unwrap_or_default();
        match self {
            Self::BuiltWithoutCuda => write!(
                f,
                "built without the `cuda` feature; rebuild with default features (or `--features cuda`)"
            ),
            Self::DriverNotFound => write!(
                f,
                "libcuda.so not found; install the NVIDIA driver, or add the folder holding \
                 libcuda.so.1 to LD_LIBRARY_PATH"
            ),
            Self::DriverTooOld { detail } => write!(
                f,
                "the NVIDIA driver is older than CUDA 13.0 ({detail}); install driver 580 or newer"
            ),
            Self::Driver { call, code } => write!(
                f,
                "driver returned {code} from {call}; check that `nvidia-smi` lists a GPU and that \
                 this process may open /dev/nvidia*"
            ),
            Self::NoDevices => write!(f, "the driver reports no CUDA device; `nvidia-smi` should list one"),
            Self::HiddenByEnv { value, detail: d } => {
                let why = match d {
                    Some(d) => format!(" ({d})"),
                    None => ": the driver returned CUDA_ERROR_NO_DEVICE, so no visible device \
                               matches it (or no GPU is installed)"
                        .to_string(),
                };
                write!(
                    f,
                    "CUDA_VISIBLE_DEVICES={value:?} hides all devices{why}; unset it or name a \
                     device `nvidia-smi -L` lists"
                )
            }
            Self::HiddenByProgram { ids, detail: d } => write!(
                f,
                "set_visible_devices([{ids}]) hides all devices{}; name a device among those \
                 CUDA_VISIBLE_DEVICES leaves visible",
                detail(d)
            ),
            Self::NvrtcNotFound => write!(
                f,
                "libnvrtc.so not found, so kernels cannot be compiled; install the CUDA toolkit's \
                 NVRTC (or `pip install nvidia-cuda-nvrtc`) and add its lib folder to LD_LIBRARY_PATH"
            ),
        }
    }
}

/// What the CUDA probe found: the visible devices and, when CUDA cannot be used, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaStatus {
    devices: Vec<CudaDeviceProperties>,
    unavailable: Option<CudaUnavailable>,
    notes: Vec<String>,
}

impl CudaStatus {
    /// A usable status with these devices (at least one).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn available(devices: Vec<CudaDeviceProperties>, notes: Vec<String>) -> Self {
        Self {
            devices,
            unavailable: None,
            notes,
        }
    }

    /// An unusable status; `devices` may still list what the driver showed (e.g. NVRTC missing).
    pub(crate) fn unavailable(
        reason: CudaUnavailable,
        devices: Vec<CudaDeviceProperties>,
        notes: Vec<String>,
    ) -> Self {
        Self {
            devices,
            unavailable: Some(reason),
            notes,
        }
    }

    /// True when kiln can run kernels on CUDA devices.
    pub fn is_available(&self) -> bool {
        self.unavailable.is_none()
    }

    /// Why CUDA cannot be used, `None` when it can.
    pub fn reason(&self) -> Option<&CudaUnavailable> {
        self.unavailable.as_ref()
    }

    /// The visible devices in logical order (empty when the driver could not list any).
    pub fn devices(&self) -> &[CudaDeviceProperties] {
        &self.devices
    }

    /// Number of usable devices (0 when CUDA is unavailable).
    pub fn device_count(&self) -> usize {
        if self.is_available() {
            self.devices.len()
        } else {
            0
        }
    }

    /// Remarks that do not make CUDA unusable, e.g. a visibility list that stopped early.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// `Ok(())` when available, else [`crate::Error::CudaUnavailable`] with the reason.
    pub fn check(&self) -> crate::Result<()> {
        match &self.unavailable {
            None => Ok(()),
            Some(reason) => Err(crate::Error::CudaUnavailable(reason.to_string())),
        }
    }
}

impl fmt::Display for CudaStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.unavailable {
            None => write!(f, "CUDA available: {} device(s)", self.devices.len()),
            Some(reason) => write!(f, "CUDA unavailable: {reason}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_name_problem_and_fix() {
        let cases = [
            (
                CudaUnavailable::DriverNotFound,
                "libcuda.so not found",
                "LD_LIBRARY_PATH",
            ),
            (
                CudaUnavailable::BuiltWithoutCuda,
                "built without the `cuda` feature",
                "rebuild",
            ),
            (
                CudaUnavailable::Driver {
                    call: "cuInit",
                    code: "CUDA_ERROR_NO_DEVICE".into(),
                },
                "driver returned CUDA_ERROR_NO_DEVICE from cuInit",
                "nvidia-smi",
            ),
            (
                CudaUnavailable::HiddenByEnv {
                    value: String::new(),
                    detail: None,
                },
                "CUDA_VISIBLE_DEVICES=\"\" hides all devices",
                "unset it",
            ),
            (
                CudaUnavailable::NvrtcNotFound,
                "libnvrtc.so not found",
                "nvidia-cuda-nvrtc",
            ),
        ];
        for (reason, problem, fix) in cases {
            let msg = reason.to_string();
            assert!(msg.starts_with(problem), "{msg}");
            assert!(msg.contains(fix), "{msg}");
        }
    }

    #[test]
    fn unavailable_status_has_no_usable_devices() {
        let status =
            CudaStatus::unavailable(CudaUnavailable::DriverNotFound, Vec::new(), Vec::new());
        assert!(!status.is_available());
        assert_eq!(status.device_count(), 0);
        let err = status.check().unwrap_err();
        assert!(
            err.to_string()
                .starts_with("CUDA unavailable: libcuda.so not found"),
            "{err}"
        );
        assert_eq!(
            status.to_string(),
            format!("CUDA unavailable: {}", CudaUnavailable::DriverNotFound)
        );
    }

    #[test]
    fn probe_on_this_machine_never_panics_and_gives_a_reason_or_devices() {
        let status = crate::cuda_status();
        if status.is_available() {
            assert!(status.device_count() >= 1);
        } else {
            assert!(!status.reason().unwrap().to_string().is_empty());
            assert_eq!(status.device_count(), 0);
        }
        if cfg!(not(feature = "cuda")) {
            assert_eq!(status.reason(), Some(&CudaUnavailable::BuiltWithoutCuda));
        }
    }
}
