//! Faults in kernel code: one process-wide handler for SIGSEGV, SIGBUS, SIGFPE and SIGILL that
//! turns a fault on a thread running a block into a jump back to that block's runner, and leaves
//! every other fault to the handler that was there before (Rust's stack-overflow handler, or the
//! default action).
//!
//! Invariants:
//! - The handler touches no lock, no allocation and no thread-local: it finds the faulting
//!   thread's [`FaultSlot`] in a fixed table keyed by the kernel thread id.
//! - A slot is armed only while its thread runs a block (the block runner arms and disarms it);
//!   the handler disarms it before jumping, so a second fault is never caught twice.
//! - Every thread that runs blocks has an alternate signal stack, so a fiber's stack overflow is
//!   reported, not turned into a second fault.

use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};
use std::sync::Once;

use super::abi::FaultSlot;

const SIGNALS: [c_int; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL];
const TABLE: usize = 1024;
const ALT_STACK_BYTES: usize = 256 * 1024;

#[allow(clippy::declare_interior_mutable_const)]
const FREE_TID: AtomicI32 = AtomicI32::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const NO_SLOT: AtomicPtr<FaultSlot> = AtomicPtr::new(std::ptr::null_mut());
static TIDS: [AtomicI32; TABLE] = [FREE_TID; TABLE];
static SLOTS: [AtomicPtr<FaultSlot>; TABLE] = [NO_SLOT; TABLE];
static mut PREVIOUS: [std::mem::MaybeUninit<libc::sigaction>; 4] =
    [const { std::mem::MaybeUninit::uninit() }; 4];
static INSTALL: Once = Once::new();

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Calls the handler that was installed before ours, as the kernel would have.
unsafe fn chain(index: usize, sig: c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: PREVIOUS[index] was written by `install` before our handler could run.
    let old = unsafe { (*std::ptr::addr_of!(PREVIOUS))[index].assume_init_ref() };
    let action = old.sa_sigaction;
    if action == libc::SIG_DFL || action == libc::SIG_IGN {
        // Restore the default and return: the faulting instruction runs again and the process
        // ends as it would have without the emulator.
        // SAFETY: a plain sigaction call with a zeroed, default action.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    } else if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed as a three-argument handler.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(action) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the previous handler was installed as a one-argument handler.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(action) };
        f(sig);
    }
}

extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let tid = gettid();
    for i in 0..TABLE {
        if TIDS[i].load(Ordering::Acquire) != tid {
            continue;
        }
        let slot = SLOTS[i].load(Ordering::Acquire);
        // SAFETY: a registered slot lives as long as its thread (see `ThreadSlot`).
        if !slot.is_null() && unsafe { (*slot).armed.swap(0, Ordering::AcqRel) } == 1 {
            // SAFETY: the kernel gives a valid siginfo to SA_SIGINFO handlers.
            let addr = unsafe { (*info).si_addr() } as u64;
            // SAFETY: as above; `jump` was set by the runner before arming the slot and never
            // returns (siglongjmp to the runner's sigsetjmp).
            unsafe {
                (*slot).signo.store(sig, Ordering::Relaxed);
                (*slot).addr.store(addr, Ordering::Relaxed);
                if let Some(jump) = (*slot).jump {
                    jump(slot);
                }
            }
        }
        break;
    }
    let index = SIGNALS.iter().position(|&s| s == sig).unwrap_or(0);
    // SAFETY: forwarding the same arguments the kernel gave us.
    unsafe { chain(index, sig, info, ctx) }
}

/// Installs the handler (once per process).
pub fn install() {
    INSTALL.call_once(|| {
        for (i, &sig) in SIGNALS.iter().enumerate() {
            // SAFETY: a plain sigaction call; PREVIOUS is written before the new handler can
            // run on this signal, and only here.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                let previous = (*std::ptr::addr_of_mut!(PREVIOUS))[i].as_mut_ptr();
                libc::sigaction(sig, std::ptr::null(), previous);
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
    });
}

/// The calling thread's registered slot and alternate stack, released when the thread ends.
pub struct ThreadSlot {
    slot: Box<FaultSlot>,
    index: Option<usize>,
    alt_stack: Option<(*mut libc::c_void, usize)>,
}

impl ThreadSlot {
    fn new() -> ThreadSlot {
        let mut slot = Box::new(FaultSlot {
            armed: AtomicI32::new(0),
            signo: AtomicI32::new(0),
            addr: Default::default(),
            jump: None,
            jmp: std::ptr::null_mut(),
        });
        let tid = gettid();
        let index = (0..TABLE).find(|&i| {
            TIDS[i]
                .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
        if let Some(i) = index {
            SLOTS[i].store(&mut *slot, Ordering::Release);
        }
        ThreadSlot {
            slot,
            index,
            alt_stack: ensure_alt_stack(),
        }
    }

    /// The slot to hand to the block runner; `None` when the table was full (faults then are
    /// not caught: the caller refuses to run).
    pub fn slot(&mut self) -> Option<*mut FaultSlot> {
        self.index.map(|_| &mut *self.slot as *mut FaultSlot)
    }
}

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        if let Some(i) = self.index {
            SLOTS[i].store(std::ptr::null_mut(), Ordering::Release);
            TIDS[i].store(0, Ordering::Release);
        }
        if let Some((base, len)) = self.alt_stack.take() {
            // SAFETY: disables the alternate stack we installed, then frees it.
            unsafe {
                let mut off: libc::stack_t = std::mem::zeroed();
                off.ss_flags = libc::SS_DISABLE;
                libc::sigaltstack(&off, std::ptr::null_mut());
                libc::munmap(base, len);
            }
        }
    }
}

/// Installs an alternate signal stack when the thread has none; returns it for freeing.
fn ensure_alt_stack() -> Option<(*mut libc::c_void, usize)> {
    // SAFETY: sigaltstack queries and sets only this thread's alternate stack; the mapping is
    // ours until ThreadSlot's drop frees it.
    unsafe {
        let mut old: libc::stack_t = std::mem::zeroed();
        libc::sigaltstack(std::ptr::null(), &mut old);
        if old.ss_flags & libc::SS_DISABLE == 0 {
            return None;
        }
        let base = libc::mmap(
            std::ptr::null_mut(),
            ALT_STACK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if base == libc::MAP_FAILED {
            return None;
        }
        let stack = libc::stack_t {
            ss_sp: base,
            ss_flags: 0,
            ss_size: ALT_STACK_BYTES,
        };
        libc::sigaltstack(&stack, std::ptr::null_mut());
        Some((base, ALT_STACK_BYTES))
    }
}

thread_local! {
    static THREAD_SLOT: std::cell::RefCell<Option<ThreadSlot>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with the calling thread's fault slot (registered on first use).
pub fn with_slot<R>(f: impl FnOnce(Option<*mut FaultSlot>) -> R) -> R {
    THREAD_SLOT.with(|cell| {
        let mut guard = cell.borrow_mut();
        let slot = guard.get_or_insert_with(ThreadSlot::new).slot();
        f(slot)
    })
}
