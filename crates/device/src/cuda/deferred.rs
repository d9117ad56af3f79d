//! Deferred index checks: validate index tensors on the device without waiting for the stream,
//! and report a bad index at the next synchronisation with the error the CPU gives.
//!
//! **Why.** Indexing ops (`embedding`, `index_select`, `gather`, `scatter`, `scatter_add`, their
//! backward) and the cross-entropy targets must reject an index outside `[0, size)` with kiln's
//! [`KernelError::IndexOutOfRange`] (value, coordinates, valid range), not with PyTorch's
//! device-side assert, which kills the CUDA context. Reading a verdict at the op would wait for
//! the stream on every call, which issue 10 forbids: only `to_vec`/`item` (any copy to the host)
//! and an explicit [`crate::synchronize`] wait.
//!
//! **How.** Each device owns one *record*: 16 `u64` words (128 bytes) of device memory. A check
//! is two launches queued on the device's stream right after the op validates its shapes:
//! `kiln_deferred_check_range` scans the indices and, at a bad one, claims the record for the
//! check's sequence number (`atomicCAS` on word 0) and lowers the first bad position
//! (`atomicMin`, row-major, as the CPU scan finds it); `kiln_deferred_check_finish` (one thread)
//! then copies the value at that position and the check's description (op code, dim, size,
//! shape) into the record. Kernels on one stream run one after another, so a record already
//! claimed by another sequence number was claimed by an *earlier* check and is left alone: the
//! record always holds the first failing check in issue order, and nothing else.
//!
//! **Bounded without syncing.** Since only the first failure is ever reported, every check of a
//! device merges into the same record: there are no per-check slots to grow or recycle, and the
//! host keeps a ledger per device that is a few counters plus the table of op names (one entry
//! per distinct `&'static str`, so bounded by the ops kiln has). A ticket with the check's full
//! shape lives only as long as the op that issued it. A million pending checks cost what one
//! does, and no check ever forces a wait to make room.
//!
//! **Reporting.** [`report`] runs after every wait that returns a `Result`
//! ([`crate::CudaStorage::to_host`], which `to_vec`/`item`/`to_device(Cpu)` go through, and
//! [`crate::synchronize`]). When checks are pending it copies the record to the host (one
//! 128-byte copy), waits, queues a reset of the record (`cuMemsetD8Async` to all-ones bytes, so
//! later checks find it clear), and returns the failure as [`Error::DeferredCheck`]: the CPU's
//! error plus the op that raised it and the place it was reported. With nothing pending it makes
//! no driver call. After the error the device works as before: bad indices are skipped by the
//! kernels (see the op docs), so nothing out of bounds was touched and no sticky error exists.
//!
//! **Eager mode.** `KILN_CUDA_EAGER_CHECKS=1` or [`crate::set_eager_checks`]`(true)` makes
//! every op read the record right after its check, and return the plain
//! [`Error::Kernel`] at the op itself, as CPU ops do (like `CUDA_LAUNCH_BLOCKING=1` for finding
//! the culprit; it costs one wait per checked op). An index tensor of more than
//! 8 dims, which the record cannot describe, is always checked eagerly.
//!
//! **Memory.** The record is one `cuMemAlloc` per device, made at the first check and kept for
//! the life of the process, outside the caching allocator: it is kiln's own bookkeeping, so it
//! stays out of `memory_allocated` and the snapshots (whose counts the tests check exactly), and
//! `empty_cache` cannot release it under a pending check.

mod ledger;

use std::sync::Mutex;

use cudarc::driver::{result, DeviceRepr, LaunchConfig, PushKernelArg};

pub use self::ledger::DeferredCheckStats;
pub(crate) use self::ledger::Ticket;
use self::ledger::{record_from_bytes, CheckInfo, Ledger, RECORD_BYTES};
use super::kernels::KernelSource;
use super::launch::{function, launch_error};
use crate::error::{Error, Result};
use crate::storage::cuda_stream;
use crate::Device;

/// The kernels of the deferred checks.
pub const DEFERRED_KERNELS: KernelSource = KernelSource {
    file: "cuda/deferred.cu",
    source: include_str!("deferred.cu"),
};

// SAFETY: plain `#[repr(C)]` integers with the layout of `struct CheckInfo` in deferred.cu.
unsafe impl DeviceRepr for CheckInfo {}

/// One device's checks: the host ledger and the device record (0 until the first check).
#[derive(Default)]
struct DeviceChecks {
    ledger: Ledger,
    record: u64,
}

/// Every device's checks, by logical ordinal. One lock: it is held across a check's two launches
/// so that issue order is stream order, and across a report's copy and wait.
static REGISTRY: Mutex<Vec<DeviceChecks>> = Mutex::new(Vec::new());

fn cuda_err(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Cuda {
        op,
        msg: e.to_string(),
    }
}

/// An index tensor to check: `count` contiguous `i64`s at device address `indices`.
pub(crate) struct IndexCheck<'a> {
    /// The op, for the error.
    pub(crate) op: &'static str,
    /// Device address of the first index.
    pub(crate) indices: u64,
    /// The index tensor's shape (its element count is the number of indices).
    pub(crate) shape: &'a [usize],
    /// The indexed dimension.
    pub(crate) dim: usize,
    /// That dimension's size: indices must lie in `[0, size)`.
    pub(crate) size: usize,
    /// A value that is always accepted (cross-entropy's `ignore_index`).
    pub(crate) ignore: Option<i64>,
}

/// Queues the check of `check` on `cuda:ordinal`'s stream, without waiting. Returns the ticket
/// while the check is still pending; `None` when there was nothing to check or it was settled
/// here (eager mode, or too many dims for the record), in which case a bad index is already
/// this call's error.
pub(crate) fn check_indices(ordinal: usize, check: IndexCheck<'_>) -> Result<Option<Ticket>> {
    let n: usize = check.shape.iter().product();
    if n == 0 {
        return Ok(None);
    }
    let stream = cuda_stream(ordinal)?;
    let ticket = {
        let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        if registry.len() <= ordinal {
            registry.resize_with(ordinal + 1, DeviceChecks::default);
        }
        let entry = &mut registry[ordinal];
        if entry.record == 0 {
            stream
                .context()
                .bind_to_thread()
                .map_err(cuda_err("deferred check record"))?;
            // SAFETY: a plain allocation in the bound context, kept for the life of the process.
            let record = unsafe { result::malloc_sync(RECORD_BYTES) }
                .map_err(cuda_err("deferred check record"))?;
            // SAFETY: the allocation holds RECORD_BYTES bytes; queued before any check.
            unsafe { result::memset_d8_async(record, 0xff, RECORD_BYTES, stream.cu_stream()) }
                .map_err(cuda_err("deferred check record"))?;
            entry.record = record;
        }
        let ticket = entry
            .ledger
            .issue(check.op, check.dim, check.size, check.shape);
        let (n, size, record, seq) = (n as u64, check.size as u64, entry.record, ticket.seq);
        let (has_ignore, ignore) = (i32::from(check.ignore.is_some()), check.ignore.unwrap_or(0));
        let name = "kiln_deferred_check_range";
        let f = function(&stream, &DEFERRED_KERNELS, name)?;
        let mut launch = stream.launch_builder(&f);
        launch
            .arg(&check.indices)
            .arg(&n)
            .arg(&size)
            .arg(&has_ignore)
            .arg(&ignore)
            .arg(&record)
            .arg(&seq);
        // SAFETY: signature as in deferred.cu; reads indices[0..n), writes the record.
        unsafe { launch.launch(super::launch::elementwise_config(n)) }
            .map_err(|e| launch_error(name, e))?;
        let name = "kiln_deferred_check_finish";
        let f = function(&stream, &DEFERRED_KERNELS, name)?;
        let mut launch = stream.launch_builder(&f);
        launch
            .arg(&check.indices)
            .arg(&record)
            .arg(&seq)
            .arg(&ticket.info);
        // SAFETY: signature as in deferred.cu; one thread reads indices[position] (< n, written
        // by the range check) and writes the record.
        let one_thread = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { launch.launch(one_thread) }.map_err(|e| launch_error(name, e))?;
        ticket
    };
    if crate::eager_checks() || !ticket.fits_record() {
        settle(ordinal, Some(&ticket), check.op)?;
        return Ok(None);
    }
    Ok(Some(ticket))
}

/// Reports the first failing check pending on `cuda:ordinal`, if any, as
/// [`Error::DeferredCheck`] naming `reported_at`. Call it after a wait on the stream that
/// returns a `Result`; it makes no driver call when no check is pending.
pub(crate) fn report(ordinal: usize, reported_at: &'static str) -> Result<()> {
    settle(ordinal, None, reported_at)
}

/// Reads and clears `cuda:ordinal`'s record when checks are pending. A failure of `own` (the
/// caller's own check) is returned as the plain [`Error::Kernel`], as at a CPU op; any other as
/// [`Error::DeferredCheck`].
pub(crate) fn settle(ordinal: usize, own: Option<&Ticket>, at: &'static str) -> Result<()> {
    let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let Some(entry) = registry.get_mut(ordinal) else {
        return Ok(());
    };
    if entry.ledger.pending() == 0 {
        return Ok(());
    }
    let stream = cuda_stream(ordinal)?;
    stream
        .context()
        .bind_to_thread()
        .map_err(cuda_err("reading the deferred checks"))?;
    let mut bytes = [0u8; RECORD_BYTES];
    // SAFETY: the record holds RECORD_BYTES bytes; the stream is synchronised before `bytes` is
    // read, and the reset is queued after the copy on the same stream.
    unsafe {
        result::memcpy_dtoh_async(&mut bytes, entry.record, stream.cu_stream())
            .map_err(cuda_err("reading the deferred checks"))?;
        stream
            .synchronize()
            .map_err(cuda_err("reading the deferred checks"))?;
        result::memset_d8_async(entry.record, 0xff, RECORD_BYTES, stream.cu_stream())
            .map_err(cuda_err("clearing the deferred checks"))?;
    }
    match entry.ledger.settle(&record_from_bytes(&bytes), own) {
        None => Ok(()),
        Some(failure) if own.is_some_and(|t| t.seq == failure.seq) => Err(failure.error.into()),
        Some(failure) => Err(Error::DeferredCheck {
            op: failure.op,
            device: Device::Cuda(ordinal),
            reported_at: at,
            error: Box::new(failure.error),
        }),
    }
}

/// Counters of `device`'s deferred checks: how many were issued, how many are pending, and how
/// often the record was read back (each read is one wait on the stream). All zero for a device
/// that never ran a check, and for the CPU, whose checks are eager.
pub fn deferred_check_stats(device: Device) -> DeferredCheckStats {
    let Device::Cuda(ordinal) = device else {
        return DeferredCheckStats::default();
    };
    let registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    registry
        .get(ordinal)
        .map(|entry| entry.ledger.stats())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deferred_cu_compiles_to_ptx_with_both_kernels() {
        let ptx = match super::super::kernels::compile_ptx(&DEFERRED_KERNELS, (8, 0)) {
            Err(Error::NvrtcNotFound) if !crate::testing::cuda_required() => {
                eprintln!("skipping: libnvrtc.so not found (cargo xtask kernels covers this)");
                return;
            }
            other => other.unwrap(),
        };
        for name in ["kiln_deferred_check_range", "kiln_deferred_check_finish"] {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
        }
    }

    #[test]
    fn the_message_names_the_op_the_place_the_fix_and_eager_mode() {
        let error = Error::DeferredCheck {
            op: "embedding",
            device: Device::Cuda(0),
            reported_at: "synchronize",
            error: Box::new(crate::ops::KernelError::IndexOutOfRange {
                op: "embedding",
                index: 10,
                position: vec![0, 2],
                dim: 0,
                size: 10,
            }),
        };
        let text = error.to_string();
        for part in [
            "index 10 at position [0, 2]",
            "every index must lie in [0, 10)",
            "raised by embedding on cuda:0",
            "reported at the next synchronisation, synchronize",
            "KILN_CUDA_EAGER_CHECKS=1",
            "set_eager_checks(true)",
        ] {
            assert!(text.contains(part), "{part:?} missing from {text:?}");
        }
        assert!(matches!(
            error.kernel_error(),
            Some(crate::ops::KernelError::IndexOutOfRange { index: 10, .. })
        ));
    }

    #[test]
    fn no_device_means_nothing_pending_and_no_driver_call() {
        // An ordinal no check ever ran on: reporting is a no-op, the counters are zero.
        assert!(report(1000, "a test").is_ok());
        assert_eq!(
            deferred_check_stats(Device::Cuda(1000)),
            DeferredCheckStats::default()
        );
        assert_eq!(
            deferred_check_stats(Device::Cpu),
            DeferredCheckStats::default()
        );
    }
}
