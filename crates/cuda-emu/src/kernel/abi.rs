//! The C structs shared with the block runner compiled into every module
//! (include/kiln_emu_fiber.h), field for field.
//!
//! Invariants: [`ABI`] equals the header's `KILN_EMU_ABI`; a module built for another ABI is
//! refused when loaded, never called.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicU64};

/// `KILN_EMU_ABI` of include/kiln_emu_fiber.h.
pub const ABI: u32 = 1;

/// `KILN_EMU_OK`: every block ran.
pub const RUN_OK: c_int = 0;
/// `KILN_EMU_FAULT`: a signal in kernel code (see [`FaultSlot`]).
pub const RUN_FAULT: c_int = 1;
/// `KILN_EMU_FAILED`: misuse (barrier, warp operation, `__trap`) or a runtime error.
pub const RUN_FAILED: c_int = 2;

/// `kiln_emu_kernel_info`: one kernel's parameters by its real signature.
#[repr(C)]
pub struct KernelInfo {
    pub abi: u32,
    pub param_count: u32,
    pub param_sizes: *const u32,
    pub param_aligns: *const u32,
    pub param_is_pointer: *const u8,
    pub max_threads: u32,
    pub min_blocks: u32,
    pub entry: unsafe extern "C" fn(*const *mut c_void),
    pub name: *const c_char,
}

/// `kiln_emu_fault_slot`: where the signal handler finds the thread's running block.
#[repr(C)]
pub struct FaultSlot {
    pub armed: AtomicI32,
    pub signo: AtomicI32,
    pub addr: AtomicU64,
    pub jump: Option<unsafe extern "C" fn(*mut FaultSlot)>,
    pub jmp: *mut c_void,
}

/// `kiln_emu_launch`: one OS thread's share of a launch.
#[repr(C)]
pub struct Launch {
    pub abi: u32,
    pub schedule: u32,
    pub seed: u64,
    pub entry: unsafe extern "C" fn(*const *mut c_void),
    pub args: *const *mut c_void,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dl_handle: *mut c_void,
    pub tls_size: usize,
    pub stacks: *mut u8,
    pub stack_stride: usize,
    pub guard_bytes: usize,
    pub next_block: *const AtomicU64,
    pub total_blocks: u64,
    pub abort_flag: *const AtomicI32,
    pub slot: *mut FaultSlot,
    pub code: c_int,
    pub padding: c_int,
    pub message: [c_char; 1024],
}

/// `kiln_emu_run_blocks`.
pub type RunBlocks = unsafe extern "C" fn(*mut Launch) -> c_int;
