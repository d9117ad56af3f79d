//! Device address space (owner: driver work). PLACEHOLDER: the signatures below are the contract
//! the kernel, cuBLAS and NCCL modules rely on; the implementation replaces the bodies.

use std::fmt;

/// Why a device range cannot be touched: names the address and what it hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessError {
    /// Human-readable reason, e.g. "0x2000_0000_1000 + 64 bytes runs 16 bytes past the end of the
    /// 48-byte allocation at 0x2000_0000_0fd0 on device 0".
    pub message: String,
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Ok when `[ptr, ptr + len)` lies inside one live device allocation (of any device) and is
/// mapped readable and writable; `len == 0` needs only `ptr` inside or at the end of one.
pub fn check_device_range(ptr: u64, len: u64) -> Result<(), AccessError> {
    Err(AccessError {
        message: format!("no device memory yet: 0x{ptr:x} + {len} bytes"),
    })
}

/// The device ordinal whose address span holds `ptr`, whether or not it is allocated.
pub fn device_of(ptr: u64) -> Option<i32> {
    let _ = ptr;
    None
}
