//! The [`Device`] type: where a tensor lives and where its kernels run.
//!
//! `Device` is a plain value (`Cpu` or `Cuda(logical ordinal)`); everything it knows about the
//! hardware comes from the once-per-process probe ([`crate::cuda_status`]), so asking for the best
//! device, a device's properties or its physical ordinal never re-queries the driver (except free
//! memory, which changes). Selection never panics: `cuda_if_available` and `best` fall back to the
//! CPU and [`Device::best_with_reason`] says why.

use std::fmt;

use crate::error::{Error, Result};
use crate::properties::{CpuProperties, DeviceProperties, MemoryInfo};

/// A compute device. `Cuda(i)` names the *logical* ordinal `i` among the visible CUDA devices
/// (after `CUDA_VISIBLE_DEVICES` / `set_visible_devices`), as in PyTorch's `cuda:i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The host CPU; always available.
    #[default]
    Cpu,
    /// A CUDA device, by logical ordinal.
    Cuda(usize),
}

/// The device [`Device::best_with_reason`] chose, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceChoice {
    /// The device chosen.
    pub device: Device,
    /// Why: the CUDA device's name, or why CUDA is unavailable.
    pub reason: String,
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.device, self.reason)
    }
}

impl Device {
    /// True for [`Device::Cpu`].
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// True for [`Device::Cuda`].
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    /// `Device::Cuda(ordinal)` if that CUDA device is usable, else an error saying why
    /// ([`Error::CudaUnavailable`] or [`Error::NoSuchCudaDevice`]).
    pub fn cuda(ordinal: usize) -> Result<Device> {
        let status = crate::cuda_status();
        status.check()?;
        if ordinal < status.device_count() {
            Ok(Device::Cuda(ordinal))
        } else {
            Err(Error::NoSuchCudaDevice {
                ordinal,
                count: status.device_count(),
            })
        }
    }

    /// `Device::Cuda(ordinal)` if that CUDA device is usable, else [`Device::Cpu`].
    pub fn cuda_if_available(ordinal: usize) -> Device {
        Device::cuda(ordinal).unwrap_or(Device::Cpu)
    }

    /// The first visible CUDA device if CUDA is usable, else the CPU.
    pub fn best() -> Device {
        Device::best_with_reason().device
    }

    /// Like [`Device::best`], with the reason for the choice.
    pub fn best_with_reason() -> DeviceChoice {
        let status = crate::cuda_status();
        match (status.reason(), status.devices().first()) {
            (None, Some(first)) => DeviceChoice {
                device: Device::Cuda(0),
                reason: format!("first visible CUDA device: {}", first.name),
            },
            (Some(reason), _) => DeviceChoice {
                device: Device::Cpu,
                reason: format!("CUDA unavailable: {reason}"),
            },
            (None, None) => DeviceChoice {
                device: Device::Cpu,
                reason: "no CUDA device visible".to_string(),
            },
        }
    }

    /// Number of usable CUDA devices (0 when CUDA is unavailable).
    pub fn cuda_device_count() -> usize {
        crate::cuda_status().device_count()
    }

    /// The physical GPU behind `Cuda(i)`: its ordinal before any visibility mask. `None` for the
    /// CPU, for an ordinal that is not visible, and for a device a UUID selected (its physical
    /// ordinal is hidden by the driver; [`Device::properties`] gives its UUID).
    pub fn physical_ordinal(self) -> Option<usize> {
        match self {
            Device::Cpu => None,
            Device::Cuda(i) => crate::cuda_status().devices().get(i)?.physical_ordinal,
        }
    }

    /// What the device is (name, memory, compute capability, …; model, cores, RAM for the CPU).
    pub fn properties(self) -> Result<DeviceProperties> {
        match self {
            Device::Cpu => Ok(DeviceProperties::Cpu(CpuProperties::read())),
            Device::Cuda(_) => cuda_properties(self),
        }
    }

    /// Free and total memory: `cuMemGetInfo` for a CUDA device (opens its context), `MemAvailable`
    /// and `MemTotal` for the CPU (Linux only).
    pub fn memory_info(self) -> Result<MemoryInfo> {
        match self {
            Device::Cpu => crate::properties::host_memory_info().ok_or(Error::Unsupported {
                what: "host memory info outside Linux (/proc/meminfo)",
            }),
            Device::Cuda(_) => cuda_memory_info(self),
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_properties(device: Device) -> Result<DeviceProperties> {
    crate::cuda::device_properties(device).map(|p| DeviceProperties::Cuda(p.clone()))
}

#[cfg(feature = "cuda")]
fn cuda_memory_info(device: Device) -> Result<MemoryInfo> {
    crate::cuda::memory_info(device)
}

#[cfg(not(feature = "cuda"))]
fn cuda_properties(_device: Device) -> Result<DeviceProperties> {
    Err(Error::CudaUnavailable(
        crate::CudaUnavailable::BuiltWithoutCuda.to_string(),
    ))
}

#[cfg(not(feature = "cuda"))]
fn cuda_memory_info(_device: Device) -> Result<MemoryInfo> {
    Err(Error::CudaUnavailable(
        crate::CudaUnavailable::BuiltWithoutCuda.to_string(),
    ))
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_falls_back_to_cpu_with_the_reason() {
        let status = crate::cuda_status();
        let choice = Device::best_with_reason();
        assert_eq!(choice.device, Device::best());
        if status.is_available() {
            assert_eq!(choice.device, Device::Cuda(0));
            assert_eq!(Device::cuda_if_available(0), Device::Cuda(0));
        } else {
            assert_eq!(choice.device, Device::Cpu);
            assert_eq!(
                choice.reason,
                format!("CUDA unavailable: {}", status.reason().unwrap())
            );
            assert_eq!(Device::cuda_if_available(0), Device::Cpu);
            assert!(matches!(Device::cuda(0), Err(Error::CudaUnavailable(_))));
            assert!(matches!(
                Device::Cuda(0).properties(),
                Err(Error::CudaUnavailable(_))
            ));
            assert!(Device::Cuda(0).memory_info().is_err());
        }
        // An ordinal past every device is never chosen, and the error says how many exist.
        assert_eq!(Device::cuda_if_available(1 << 20), Device::Cpu);
        match Device::cuda(1 << 20) {
            Err(Error::NoSuchCudaDevice { ordinal, count }) => {
                assert_eq!((ordinal, count), (1 << 20, status.device_count()))
            }
            Err(Error::CudaUnavailable(_)) => assert!(!status.is_available()),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn physical_ordinals_and_properties() {
        assert_eq!(Device::Cpu.physical_ordinal(), None);
        assert_eq!(Device::Cuda(1 << 20).physical_ordinal(), None);
        match Device::Cpu.properties().unwrap() {
            DeviceProperties::Cpu(cpu) => assert!(cpu.logical_cores >= 1),
            other => panic!("cpu properties expected, got {other:?}"),
        }
        if let Some(dev) = crate::testing::cuda_device_or_skip() {
            match dev.properties().unwrap() {
                DeviceProperties::Cuda(p) => {
                    assert_eq!(p.logical, 0);
                    assert!(p.total_memory > 0 && p.sm_count > 0 && p.compute_capability.0 >= 5);
                    assert!(p.uuid.starts_with("GPU-") || p.uuid.starts_with("MIG-"));
                }
                other => panic!("cuda properties expected, got {other:?}"),
            }
            let mem = dev.memory_info().unwrap();
            assert!(mem.free > 0 && mem.free <= mem.total);
        }
    }

    #[test]
    fn display_matches_pytorch_names() {
        assert_eq!(Device::Cpu.to_string(), "cpu");
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
    }
}
