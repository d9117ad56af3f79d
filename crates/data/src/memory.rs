//! Host buffers whose size comes from input (a sample count, an image size): the size is
//! computed with checked arithmetic and compared with the machine's memory before anything is
//! allocated, and the allocation itself is fallible (`try_reserve`), so a request too large
//! for the machine (or for a `ulimit -v`) is [`Error::OutOfMemory`], never an abort.

use crate::error::{Error, Result};

/// Total physical memory of this machine (kiln-device's host memory report: Linux
/// `MemTotal`); `None` where it cannot be read.
pub(crate) fn physical_memory() -> Option<usize> {
    let info = kiln_device::Device::Cpu.memory_info().ok()?;
    usize::try_from(info.total).ok()
}

/// The error for a size of `what` that overflows `usize`.
pub(crate) fn overflow(op: &'static str, what: &str, fix: &str) -> Error {
    Error::OutOfMemory {
        op,
        what: what.to_string(),
        requested: None,
        available: physical_memory(),
        fix: fix.to_string(),
    }
}

/// The product of `factors` (a byte count), or the error naming `what` when it overflows.
pub(crate) fn checked_size(
    op: &'static str,
    what: &str,
    factors: &[usize],
    fix: &str,
) -> Result<usize> {
    factors
        .iter()
        .try_fold(1usize, |n, &f| n.checked_mul(f))
        .ok_or_else(|| overflow(op, what, fix))
}

/// Errors unless `bytes` fit in this machine's memory.
pub(crate) fn check_fits(op: &'static str, what: &str, bytes: usize, fix: &str) -> Result<()> {
    match physical_memory() {
        Some(total) if bytes > total => Err(Error::OutOfMemory {
            op,
            what: what.to_string(),
            requested: Some(bytes),
            available: Some(total),
            fix: fix.to_string(),
        }),
        _ => Ok(()),
    }
}

/// A buffer of `len` copies of `fill`, checked against memory first and allocated fallibly.
pub(crate) fn filled<T: Clone>(
    op: &'static str,
    what: &str,
    len: usize,
    fill: T,
    fix: &str,
) -> Result<Vec<T>> {
    let mut v = reserved(op, what, len, fix)?;
    v.resize(len, fill);
    Ok(v)
}

/// An empty buffer with room for `len` values, checked against memory first and allocated
/// fallibly (before the work that fills it, so a size that cannot be held costs nothing).
pub(crate) fn reserved<T>(op: &'static str, what: &str, len: usize, fix: &str) -> Result<Vec<T>> {
    let bytes = checked_size(op, what, &[len, std::mem::size_of::<T>()], fix)?;
    check_fits(op, what, bytes, fix)?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::OutOfMemory {
        op,
        what: what.to_string(),
        requested: Some(bytes),
        available: physical_memory(),
        fix: fix.to_string(),
    })?;
    Ok(v)
}

/// The bytes of a `[C, H, W]` image of 8-bit pixels, or an error for `op` naming the shape
/// when the product does not fit in `usize`.
pub(crate) fn image_len(op: &'static str, [c, h, w]: [usize; 3]) -> Result<usize> {
    c.checked_mul(h)
        .and_then(|n| n.checked_mul(w))
        .ok_or_else(|| {
            crate::error::arg_err(
                op,
                format!(
                    "a {c}x{h}x{w} image has more bytes than can be addressed; check the shape"
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_beyond_memory_or_usize_are_errors() {
        let e = checked_size("t", "a thing", &[usize::MAX, 2], "ask for less").unwrap_err();
        assert!(e.to_string().contains("more than usize::MAX"), "{e}");
        let e = filled("t", "a thing", usize::MAX / 2, 0u8, "ask for less").unwrap_err();
        assert!(e.to_string().contains("ask for less"), "{e}");
        assert_eq!(filled("t", "a thing", 3, 7u8, "").unwrap(), vec![7; 3]);
    }
}
