//! Refusing a model whose weights no memory of this machine holds, before any is made. The
//! builders make their layers one by one, so without this a depth or width from input (a flag,
//! a config file) would build for hours before memory ran out, or overflow a size first.
//!
//! Each builder passes a lower bound on its f32 weights (the largest matrices of every block),
//! computed with checked arithmetic: `None` means the bound itself overflows `usize`.

use crate::error::config_err;
use crate::Result;

/// Bytes of `count` f32 values of `per` each, checked.
pub(crate) fn f32_bytes(count: usize, per: usize) -> Option<usize> {
    count.checked_mul(per)?.checked_mul(4)
}

/// `Ok` when `bytes` (a lower bound on `what`'s weights, described by `shape`) fits this
/// machine's memory, or the memory cannot be read; else the error naming both and `fix`.
pub(crate) fn check_weights_fit(
    what: &'static str,
    bytes: Option<usize>,
    shape: String,
    fix: &str,
) -> Result<()> {
    let memory = kiln_device::Device::Cpu
        .memory_info()
        .ok()
        .and_then(|m| usize::try_from(m.total).ok());
    if bytes.is_some_and(|b| memory.is_none_or(|m| b <= m)) {
        return Ok(());
    }
    let needed = bytes.map_or("more than 2^64 bytes".to_string(), |b| format!("{b} bytes"));
    let memory = memory.map_or(String::new(), |m| format!(" ({m} bytes)"));
    Err(config_err(
        what,
        format!(
            "{shape} need {needed} for the blocks' weights alone, more than this machine's \
             memory{memory}; {fix}"
        ),
    ))
}
