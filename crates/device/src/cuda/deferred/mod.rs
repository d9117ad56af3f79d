//! Deferred index checks: validate index tensors on the device without waiting for the stream,
//! and report a bad index at the next synchronisation with the error the CPU gives.
//!
//! **Why.** Indexing ops (`embedding`, `index_select`, `gather`, `scatter`, `scatter_add`, their
//! backward) and the cross-entropy targets must reject an index outside `[0, size)` with kiln's
//! [`KernelError::IndexOutOfRange`](crate::ops::KernelError::IndexOutOfRange) (value,
//! coordinates, valid range), not with PyTorch's device-side assert, which kills the CUDA
//! context. Reading a verdict at the op would wait for the stream on every call, which issue 10
//! forbids: only `to_vec`/`item` (any copy to the host) and an explicit [`crate::synchronize`]
//! wait.
//!
//! **Records.** A check is two launches queued on the device's stream right after the op
//! validates its shapes. `kiln_deferred_check_range` scans the indices and, at a bad one, claims
//! a *record* (16 `u64` words, 128 bytes of device memory) for the check's sequence number
//! (`atomicCAS` on word 0) and lowers the first bad position (`atomicMin`, row-major, as the CPU
//! scan finds it); `kiln_deferred_check_finish` (one thread) then copies the value at that
//! position and the check's description (op code, dim, size, shape) into the record. Kernels on
//! one stream run one after another, so a record already claimed by another sequence number was
//! claimed by an *earlier* check and is left alone: a record holds the first failing check in
//! issue order, and nothing else.
//!
//! **One record slot per thread.** Each thread that runs a check on a device gets its own slot
//! (a record), and a synchronisation reports only the calling thread's slot: a bad index is
//! reported to the thread whose op it was, never to another thread that happens to copy a tensor
//! to the host in between (so parallel tests, or a data thread and a training thread, do not
//! see each other's errors). A thread's checks all merge into its one slot, since only its first
//! failure is ever reported: no slot per check, and no wait to make room. Slots come in chunks of
//! 32 records (one 4 KiB `cuMemAlloc` each, kept for the life of the process); a thread's slot
//! returns to a free list when the thread ends (a failure it never synchronised is dropped), and
//! the next thread to take it clears the record on the stream first. Device memory is thus
//! bounded by the largest number of threads that ever ran checks at once, rounded up to 32,
//! and the host keeps a few counters per slot plus the table of op names (one entry per distinct
//! `&'static str`, so bounded by the ops kiln has). The chunks live outside the caching
//! allocator: they are kiln's own bookkeeping, so they stay out of `memory_allocated` and the
//! snapshots (whose counts the tests check exactly), and `empty_cache` cannot release them.
//!
//! **Reporting.** [`report`] runs after every wait that returns a `Result`
//! ([`crate::CudaStorage::to_host`], which `to_vec`/`item`/`to_device(Cpu)` go through, and
//! [`crate::synchronize`]). When the calling thread has checks pending it copies its record to
//! the host (one 128-byte copy), waits, queues a reset of the record (`cuMemsetD8Async` to
//! all-ones bytes, so later checks find it clear), and returns the failure as
//! [`Error::DeferredCheck`]: the CPU's error plus the op that raised it and the place it was
//! reported. With nothing pending it makes no driver call. After the error the device works as
//! before: the kernels skip bad indices (see the op docs), so nothing out of bounds was touched
//! and no sticky error exists.
//!
//! **Eager mode.** `KILN_CUDA_EAGER_CHECKS=1` or [`crate::set_eager_checks`]`(true)` makes
//! every op read its record right after its check, and return the plain [`Error::Kernel`] at
//! the op itself, as CPU ops do (like `CUDA_LAUNCH_BLOCKING=1` for finding the culprit; it costs
//! one wait per checked op). An index tensor of more than 8 dims, which the record cannot
//! describe, is always checked eagerly. Cross-entropy's target check is deferred like any other
//! (its mean's denominator stays on the device, so it never waits).

mod ledger;

use std::cell::RefCell;
use std::sync::Mutex;

use cudarc::driver::{result, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

pub use self::ledger::DeferredCheckStats;
pub(crate) use self::ledger::Ticket;
use self::ledger::{record_from_bytes, CheckInfo, Ledger, RECORD_BYTES, SLOTS_PER_CHUNK};
use super::kernels::KernelSource;
use super::launch::{function, launch_error};
use crate::error::{Error, Result};
use crate::storage::cuda_stream;
use crate::Device;

/// The kernels of the deferred checks.
pub const DEFERRED_KERNELS: KernelSource = KernelSource {
    file: "cuda/deferred.cu",
    source: include_str!("../deferred.cu"),
};

// SAFETY: plain `#[repr(C)]` integers with the layout of `struct CheckInfo` in deferred.cu.
unsafe impl DeviceRepr for CheckInfo {}

/// One device's checks: the host ledger and the device chunks of records.
#[derive(Default)]
struct DeviceChecks {
    ledger: Ledger,
    chunks: Vec<u64>,
}

impl DeviceChecks {
    /// Device address of `slot`'s record.
    fn record(&self, slot: usize) -> u64 {
        self.chunks[slot / SLOTS_PER_CHUNK] + ((slot % SLOTS_PER_CHUNK) * RECORD_BYTES) as u64
    }
}

/// Every device's checks, by logical ordinal. One lock, held across a check's two launches and
/// across a report's copy and wait (checks are few per step; the launches are microseconds).
static REGISTRY: Mutex<Vec<DeviceChecks>> = Mutex::new(Vec::new());

/// The calling thread's record slot on each device (by ordinal); given back when it ends.
struct ThreadSlots(Vec<Option<usize>>);

impl Drop for ThreadSlots {
    fn drop(&mut self) {
        if self.0.iter().all(Option::is_none) {
            return;
        }
        let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        for (ordinal, slot) in self.0.iter().enumerate() {
            if let (Some(slot), Some(entry)) = (slot, registry.get_mut(ordinal)) {
                entry.ledger.release_slot(*slot);
            }
        }
    }
}

thread_local! {
    static SLOTS: RefCell<ThreadSlots> = const { RefCell::new(ThreadSlots(Vec::new())) };
}

/// The calling thread's slot on `cuda:ordinal`, if it has one.
fn my_slot(ordinal: usize) -> Option<usize> {
    SLOTS
        .try_with(|s| s.borrow().0.get(ordinal).copied().flatten())
        .ok()
        .flatten()
}

fn cuda_err(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Cuda {
        op,
        msg: e.to_string(),
    }
}

/// The calling thread's slot on `cuda:ordinal` (taking one, and a new chunk when all are in
/// use, on its first check there), with its record cleared on `stream` when newly taken.
fn slot_for_thread(entry: &mut DeviceChecks, ordinal: usize, stream: &CudaStream) -> Result<usize> {
    if let Some(slot) = my_slot(ordinal) {
        return Ok(slot);
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(cuda_err("deferred check records"))?;
    let slot = entry.ledger.acquire_slot();
    if slot >= entry.chunks.len() * SLOTS_PER_CHUNK {
        // SAFETY: a plain allocation in the bound context, kept for the life of the process.
        match unsafe { result::malloc_sync(SLOTS_PER_CHUNK * RECORD_BYTES) } {
            Ok(chunk) => entry.chunks.push(chunk),
            Err(e) => {
                entry.ledger.release_slot(slot);
                return Err(cuda_err("deferred check records")(e));
            }
        }
    }
    // SAFETY: the record lies inside its chunk; queued before any check that uses it.
    let cleared = unsafe {
        result::memset_d8_async(entry.record(slot), 0xff, RECORD_BYTES, stream.cu_stream())
    };
    if let Err(e) = cleared {
        entry.ledger.release_slot(slot);
        return Err(cuda_err("deferred check records")(e));
    }
    SLOTS.with(|s| {
        let mut s = s.borrow_mut();
        if s.0.len() <= ordinal {
            s.0.resize(ordinal + 1, None);
        }
        s.0[ordinal] = Some(slot);
    });
    Ok(slot)
}

/// An index tensor to check: contiguous `i64`s at device address `indices`.
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
    let range = function(&stream, &DEFERRED_KERNELS, "kiln_deferred_check_range")?;
    let finish = function(&stream, &DEFERRED_KERNELS, "kiln_deferred_check_finish")?;
    let ticket = {
        let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        if registry.len() <= ordinal {
            registry.resize_with(ordinal + 1, DeviceChecks::default);
        }
        let entry = &mut registry[ordinal];
        let slot = slot_for_thread(entry, ordinal, &stream)?;
        let ticket = entry
            .ledger
            .issue(slot, check.op, check.dim, check.size, check.shape);
        let (n, size, seq) = (n as u64, check.size as u64, ticket.seq);
        let record = entry.record(slot);
        let (has_ignore, ignore) = (i32::from(check.ignore.is_some()), check.ignore.unwrap_or(0));
        let mut launch = stream.launch_builder(&range);
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
            .map_err(|e| launch_error("kiln_deferred_check_range", e))?;
        let mut launch = stream.launch_builder(&finish);
        launch
            .arg(&check.indices)
            .arg(&record)
            .arg(&seq)
            .arg(&ticket.info);
        let one_thread = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: signature as in deferred.cu; one thread reads indices[position] (< n, written
        // by the range check) and writes the record.
        unsafe { launch.launch(one_thread) }
            .map_err(|e| launch_error("kiln_deferred_check_finish", e))?;
        ticket
    };
    if crate::eager_checks() || !ticket.fits_record() {
        settle(ordinal, Some(&ticket), check.op)?;
        return Ok(None);
    }
    Ok(Some(ticket))
}

/// Reports the calling thread's first failing check pending on `cuda:ordinal`, if any, as
/// [`Error::DeferredCheck`] naming `reported_at`. Call it after a wait on the stream that
/// returns a `Result`; it makes no driver call when no check is pending.
pub(crate) fn report(ordinal: usize, reported_at: &'static str) -> Result<()> {
    settle(ordinal, None, reported_at)
}

/// Reads and clears the calling thread's record on `cuda:ordinal` when checks are pending. A
/// failure of `own` (the caller's own check) is returned as the plain [`Error::Kernel`], as at a
/// CPU op; any other as [`Error::DeferredCheck`].
pub(crate) fn settle(ordinal: usize, own: Option<&Ticket>, at: &'static str) -> Result<()> {
    let Some(slot) = my_slot(ordinal) else {
        return Ok(());
    };
    let mut registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let Some(entry) = registry.get_mut(ordinal) else {
        return Ok(());
    };
    if entry.ledger.pending(slot) == 0 {
        return Ok(());
    }
    let stream = cuda_stream(ordinal)?;
    stream
        .context()
        .bind_to_thread()
        .map_err(cuda_err("reading the deferred checks"))?;
    let record = entry.record(slot);
    let mut bytes = [0u8; RECORD_BYTES];
    // SAFETY: the record holds RECORD_BYTES bytes; the stream is synchronised before `bytes` is
    // read, and the reset is queued after the copy on the same stream.
    unsafe {
        result::memcpy_dtoh_async(&mut bytes, record, stream.cu_stream())
            .map_err(cuda_err("reading the deferred checks"))?;
        stream
            .synchronize()
            .map_err(cuda_err("reading the deferred checks"))?;
        result::memset_d8_async(record, 0xff, RECORD_BYTES, stream.cu_stream())
            .map_err(cuda_err("clearing the deferred checks"))?;
    }
    match entry.ledger.settle(slot, &record_from_bytes(&bytes), own) {
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

/// Counters of the deferred checks the calling thread ran on `device`: how many it issued, how
/// many are pending, and how often its record was read back (each read is one wait on the
/// stream). All zero for a thread that never ran a check there, and for the CPU, whose checks
/// are eager.
pub fn deferred_check_stats(device: Device) -> DeferredCheckStats {
    let Device::Cuda(ordinal) = device else {
        return DeferredCheckStats::default();
    };
    let Some(slot) = my_slot(ordinal) else {
        return DeferredCheckStats::default();
    };
    let registry = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    registry
        .get(ordinal)
        .map(|entry| entry.ledger.stats(slot))
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
