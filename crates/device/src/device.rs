//! The [`Device`] type: where a tensor lives and where its kernels run.

use std::fmt;

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

impl Device {
    /// True for [`Device::Cpu`].
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// True for [`Device::Cuda`].
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}
