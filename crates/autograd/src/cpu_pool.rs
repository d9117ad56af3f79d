//! Running a whole forward or backward pass on kiln's CPU pool, instead of handing the pool one
//! op at a time.
//!
//! Every CPU kernel runs inside kiln's rayon pool (`kiln_device::threads`). Called from a thread
//! outside the pool, each op is handed over with `ThreadPool::install` and the caller sleeps
//! until a pool thread has run it and woken it: about 20 us per op on a two-vCPU VM, several
//! percent of a batch-1 ResNet-18 forward (62 ops). Called from a pool thread, the same kernel
//! runs in place. [`on_cpu_pool`] hands a whole closure over once, with the calling thread's
//! per-thread state carried in.
//!
//! Invariants: the closure sees the caller's grad mode and autocast dtype, allocates for the
//! caller's planned steps (`kiln_alloc_cache::StepThread`) and, while an allocation history
//! records, in the caller's allocation context; the pool thread's own state is
//! restored when the closure ends, by guards, so also when it panics (the panic then reaches
//! the caller, as `install` resumes it there). A pass on another device, one started on a pool
//! thread, and any pass while an `OpByOp` is held (thread ranks, which block in collectives) run
//! in place, unchanged.
//! A closure that waits on another thread which itself needs the pool (a hook blocking on a
//! channel fed by kiln ops elsewhere) must not be handed over: with a one-thread pool it would
//! wait forever. Model forwards and backward run user hooks, so a hook that waits like that
//! needs an `OpByOp` held while its pass runs. Nothing else kiln keeps per thread matters to a
//! CPU pass: the random generator is global, and the list of buffers an op saves is built and
//! read on the thread that builds the op.

use crate::autocast::{autocast_dtype, replace_autocast};
use crate::autograd::grad_mode::{is_grad_enabled, set_grad_enabled};
use kiln_device::Device;

/// Restores a pool thread's grad mode and autocast dtype when dropped.
struct Restore {
    grad: bool,
    autocast: Option<kiln_device::DType>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        set_grad_enabled(self.grad);
        replace_autocast(self.autocast);
    }
}

/// Runs `f`, a pass over tensors on `device`, and returns its result: for the CPU, on a thread
/// of kiln's CPU pool with this thread's grad mode, autocast dtype, planned-steps thread and
/// allocation context (`kiln_device::threads::install` carries the last two); in place for another device, on a pool
/// thread, or while ranks running as threads hold passes off the pool
/// (`kiln_device::threads::OpByOp`).
pub fn on_cpu_pool<R: Send>(device: Device, f: impl FnOnce() -> R + Send) -> R {
    let on_pool = kiln_device::threads::cpu_pool()
        .current_thread_index()
        .is_some();
    if device != Device::Cpu || on_pool || !kiln_device::threads::passes_may_run_on_pool() {
        return f();
    }
    let (grad, autocast) = (is_grad_enabled(), autocast_dtype());
    kiln_device::threads::install(move || {
        let _restore = Restore {
            grad: set_grad_enabled(grad),
            autocast: replace_autocast(autocast),
        };
        f()
    })
}
