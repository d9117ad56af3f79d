//! kiln's CUDA emulator: one shared library that exports, with NVIDIA's C names and ABI, the part
//! of the CUDA driver API, NVRTC, cuBLAS and NCCL that kiln reaches through cudarc, implemented on
//! the CPU. `cargo xtask emu -- CMD` builds it and runs CMD with `libcuda.so.1`,
//! `libnvrtc.so.13`, `libcublas.so.13` and `libnccl.so.2` resolving to it, so kiln's CUDA backend
//! runs (and its GPU tests pass or fail) on a machine without a GPU.
//!
//! It is a test instrument, so it is strict, like a real GPU and stricter. Invariants:
//! - Device memory lives in its own address range ([`space`]): each emulated device owns a
//!   reserved, otherwise inaccessible span; an allocation is readable and writable only while it
//!   is live, it starts filled with 0xff (NaN in every float dtype), its end abuts an
//!   inaccessible guard page, and freed memory is inaccessible again. A
//!   pointer outside every live allocation is never dereferenced by the emulator's own code (copies,
//!   cuBLAS, NCCL check ranges first), and a kernel's stray access faults and is reported with the
//!   kernel's name.
//! - Work on a stream runs asynchronously, in order, on that stream's own worker thread
//!   ([`driver`]); nothing the host has not synchronised with is guaranteed to be done.
//! - "NVRTC" ([`nvrtc`]) compiles exactly the source and options it is given, with the host C++
//!   compiler against the emulator's header of CUDA's built-ins; a kernel ([`kernel`]) runs every
//!   thread of a block as a fiber with real `__syncthreads` and warp semantics, blocks on several
//!   OS threads at once (so atomics are real), with its arguments unpacked by its real signature.
//! - An entry point the emulator does not implement is still exported ([`stubs`]): it logs its
//!   name and returns the library's "not supported" status, never crashes.
//!
//! Configuration. Set by `cargo xtask emu` from its flags: `KILN_EMU_DEVICES` (device count),
//! `KILN_EMU_MEMORY` (bytes per device), `KILN_EMU_CC` (compute capability, `9.0`),
//! `KILN_EMU_DELAY` (random delays on stream work, so host/stream races reproduce). Read when set:
//! `KILN_EMU_LOG` (log every call), `KILN_EMU_SCHEDULE` / `KILN_EMU_SEED` (the order a block's
//! threads run in between barriers), `KILN_EMU_THREADS` (OS threads per launch), `KILN_EMU_CACHE`
//! / `KILN_EMU_OPT` (where compiled modules are cached, g++'s optimisation level: [`nvrtc`]),
//! `KILN_EMU_NCCL_TIMEOUT` (seconds any NCCL wait may take before it fails: [`nccl`]).

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

pub mod cublas;
pub mod driver;
pub mod kernel;
pub mod nccl;
pub mod nvrtc;
pub mod space;
pub mod stubs;
