// kiln_emu_runtime.h: CUDA's execution model for kiln's CUDA emulator. The emulator's NVRTC
// force-includes this header before a kernel's source and compiles the result with g++ into a
// shared object; the kernel runtime (src/kernel) loads it and calls kiln_emu_run_blocks.
//
// Invariants:
// - One block runs on one OS thread; each of its threads is a fiber with its own stack
//   (kiln_emu_fiber.h). threadIdx, blockIdx, blockDim and gridDim read the running fiber.
// - `__shared__` variables are `thread_local`: every fiber of a block shares them, blocks on
//   other OS threads have their own. The object's whole TLS block is filled with 0xff before each
//   block runs, so shared memory a kernel reads before writing is NaN / -1, never a neighbour's
//   leftovers or zero.
// - `__syncthreads` (and _or/_and/_count) releases only when every live thread of the block waits
//   at the same call (file and line) and no thread has exited; anything else is an error naming
//   the threads, never a hang or silent success. A warp operation (__shfl*_sync, __ballot_sync,
//   __any_sync, __all_sync, __syncwarp, __match_*_sync, __reduce_*_sync) completes when every lane
//   of its mask is at an operation of the same kind with the same mask; a lane of the mask that
//   exited, is elsewhere, or does not exist is an error.
// - Scan mode (KILN_EMU_SCAN, used with `g++ -E`) keeps `__global__`, `__launch_bounds__` and
//   `__shared__` visible as marker tokens so the compiler driver can find every kernel.
#ifndef KILN_EMU_RUNTIME_H
#define KILN_EMU_RUNTIME_H

#define __CUDACC__ 1
#define __CUDACC_RTC__ 1
#define __CUDACC_VER_MAJOR__ 13
#define __CUDACC_VER_MINOR__ 0
#ifndef __CUDA_ARCH__
#define __CUDA_ARCH__ 900
#endif

#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __inline_hint__ inline
#define __grid_constant__

#ifdef KILN_EMU_SCAN
#define __global__ __kiln_emu_global__
#define __launch_bounds__(...) __kiln_emu_launch_bounds__(__VA_ARGS__)
#define __shared__ __kiln_emu_shared__
#else
#define __global__
#define __launch_bounds__(...)
#define __shared__ thread_local
#endif

// System headers first: kiln_emu_builtins.h renames glibc's __expf & co. after its own includes.
#include <dlfcn.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if !defined(__x86_64__) || defined(KILN_EMU_UCONTEXT)
#include <ucontext.h>
#endif

#include <type_traits>
#include <utility>

#if __has_include("kiln_emu_builtins.h")
#include "kiln_emu_builtins.h"
#endif

#ifndef KILN_EMU_VECTOR_TYPES_H
// The builtins header defines CUDA's vector types; without it, the two the indices need.
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
#endif

#include "kiln_emu_fiber.h"

#define warpSize 32
#define threadIdx (static_cast<const uint3&>(kiln_emu::current->thread_idx))
#define blockIdx (static_cast<const uint3&>(kiln_emu::current->block->block_idx))
#define blockDim (static_cast<const dim3&>(kiln_emu::current->block->block_dim))
#define gridDim (static_cast<const dim3&>(kiln_emu::current->block->grid_dim))

// Default arguments give every synchronising call its call site (file and line, as #line
// directives name them), so a barrier's identity does not depend on how g++ laid out the code.
// (g++ has no __builtin_COLUMN: two barriers on one source line, or in one macro expansion,
// count as one.)
#define KILN_EMU_SITE_PARAMS const char *kiln_emu_file = __builtin_FILE(), int kiln_emu_line = __builtin_LINE()
#define KILN_EMU_SITE kiln_emu::site{kiln_emu_file, kiln_emu_line}

inline void __syncthreads(KILN_EMU_SITE_PARAMS) {
    kiln_emu::barrier(kiln_emu::BAR_SYNC, 0, "__syncthreads", KILN_EMU_SITE);
}
inline int __syncthreads_count(int predicate, KILN_EMU_SITE_PARAMS) {
    return kiln_emu::barrier(kiln_emu::BAR_COUNT, predicate, "__syncthreads_count", KILN_EMU_SITE);
}
inline int __syncthreads_and(int predicate, KILN_EMU_SITE_PARAMS) {
    return kiln_emu::barrier(kiln_emu::BAR_AND, predicate, "__syncthreads_and", KILN_EMU_SITE);
}
inline int __syncthreads_or(int predicate, KILN_EMU_SITE_PARAMS) {
    return kiln_emu::barrier(kiln_emu::BAR_OR, predicate, "__syncthreads_or", KILN_EMU_SITE);
}

// Blocks run concurrently on OS threads, so fences are real fences.
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

[[noreturn]] inline void __trap() { kiln_emu::fail("__trap() called"); }
[[noreturn]] inline void __brkpt() { kiln_emu::fail("__brkpt() called"); }

namespace kiln_emu {
template <class T> inline unsigned long long to_bits(T v) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                  "warp operations move values of at most 8 bytes");
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof(T));
    return bits;
}
template <class T> inline T from_bits(unsigned long long bits, T like) {
    memcpy(&like, &bits, sizeof(T));
    return like;
}
} // namespace kiln_emu

template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, KILN_EMU_SITE_PARAMS) {
    return kiln_emu::from_bits(kiln_emu::warp_op(kiln_emu::W_SHFL_IDX, mask, kiln_emu::to_bits(var),
                                                 src_lane, width, "__shfl_sync", KILN_EMU_SITE),
                               var);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, KILN_EMU_SITE_PARAMS) {
    return kiln_emu::from_bits(kiln_emu::warp_op(kiln_emu::W_SHFL_UP, mask, kiln_emu::to_bits(var),
                                                 (int)delta, width, "__shfl_up_sync", KILN_EMU_SITE),
                               var);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, KILN_EMU_SITE_PARAMS) {
    return kiln_emu::from_bits(kiln_emu::warp_op(kiln_emu::W_SHFL_DOWN, mask, kiln_emu::to_bits(var),
                                                 (int)delta, width, "__shfl_down_sync", KILN_EMU_SITE),
                               var);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, KILN_EMU_SITE_PARAMS) {
    return kiln_emu::from_bits(kiln_emu::warp_op(kiln_emu::W_SHFL_XOR, mask, kiln_emu::to_bits(var),
                                                 lane_mask, width, "__shfl_xor_sync", KILN_EMU_SITE),
                               var);
}
inline unsigned __ballot_sync(unsigned mask, int predicate, KILN_EMU_SITE_PARAMS) {
    return (unsigned)kiln_emu::warp_op(kiln_emu::W_BALLOT, mask, predicate != 0, 0, 32, "__ballot_sync",
                                       KILN_EMU_SITE);
}
inline int __any_sync(unsigned mask, int predicate, KILN_EMU_SITE_PARAMS) {
    return (int)kiln_emu::warp_op(kiln_emu::W_ANY, mask, predicate != 0, 0, 32, "__any_sync", KILN_EMU_SITE);
}
inline int __all_sync(unsigned mask, int predicate, KILN_EMU_SITE_PARAMS) {
    return (int)kiln_emu::warp_op(kiln_emu::W_ALL, mask, predicate != 0, 0, 32, "__all_sync", KILN_EMU_SITE);
}
inline int __uni_sync(unsigned mask, int predicate, KILN_EMU_SITE_PARAMS) {
    return (int)kiln_emu::warp_op(kiln_emu::W_UNI, mask, predicate != 0, 0, 32, "__uni_sync", KILN_EMU_SITE);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, KILN_EMU_SITE_PARAMS) {
    kiln_emu::warp_op(kiln_emu::W_SYNCWARP, mask, 0, 0, 32, "__syncwarp", KILN_EMU_SITE);
}
template <class T> inline unsigned __match_any_sync(unsigned mask, T value, KILN_EMU_SITE_PARAMS) {
    return (unsigned)kiln_emu::warp_op(kiln_emu::W_MATCH_ANY, mask, kiln_emu::to_bits(value), 0, 32,
                                       "__match_any_sync", KILN_EMU_SITE);
}
template <class T> inline unsigned __match_all_sync(unsigned mask, T value, int *pred, KILN_EMU_SITE_PARAMS) {
    unsigned r = (unsigned)kiln_emu::warp_op(kiln_emu::W_MATCH_ALL, mask, kiln_emu::to_bits(value), 0, 32,
                                             "__match_all_sync", KILN_EMU_SITE);
    *pred = r != 0;
    return r;
}
#define KILN_EMU_REDUCE(NAME, KIND, T)                                                              \
    inline T NAME(unsigned mask, T value, KILN_EMU_SITE_PARAMS) {                                  \
        return (T)kiln_emu::warp_op(KIND, mask, (unsigned long long)(long long)value,                \
                                    std::is_signed<T>::value, 32, #NAME, KILN_EMU_SITE);           \
    }
KILN_EMU_REDUCE(__reduce_add_sync, kiln_emu::W_REDUCE_ADD, unsigned)
KILN_EMU_REDUCE(__reduce_add_sync, kiln_emu::W_REDUCE_ADD, int)
KILN_EMU_REDUCE(__reduce_min_sync, kiln_emu::W_REDUCE_MIN, unsigned)
KILN_EMU_REDUCE(__reduce_min_sync, kiln_emu::W_REDUCE_MIN, int)
KILN_EMU_REDUCE(__reduce_max_sync, kiln_emu::W_REDUCE_MAX, unsigned)
KILN_EMU_REDUCE(__reduce_max_sync, kiln_emu::W_REDUCE_MAX, int)
KILN_EMU_REDUCE(__reduce_and_sync, kiln_emu::W_REDUCE_AND, unsigned)
KILN_EMU_REDUCE(__reduce_or_sync, kiln_emu::W_REDUCE_OR, unsigned)
KILN_EMU_REDUCE(__reduce_xor_sync, kiln_emu::W_REDUCE_XOR, unsigned)
#undef KILN_EMU_REDUCE

// The lanes of the calling warp that have not exited (a fiber cannot tell which lanes a GPU
// would have converged; every live lane is the strictest answer that still names real lanes).
inline unsigned __activemask() { return kiln_emu::active_mask(); }

// The per-kernel entry points the compiler driver appends: a descriptor of the parameters from
// the kernel's real signature, and a function that calls it with arguments unpacked from an array
// of pointers (one per parameter).
namespace kiln_emu {
template <class... A, size_t... I>
inline void call_unpacked(void (*kernel)(A...), void *const *args, std::index_sequence<I...>) {
    kernel(*static_cast<typename std::remove_reference<A>::type *>(args[I])...);
}
template <class... A> struct params {
    static constexpr unsigned count = sizeof...(A);
    static constexpr unsigned sizes[sizeof...(A) + 1] = {(unsigned)sizeof(A)..., 0};
    static constexpr unsigned aligns[sizeof...(A) + 1] = {(unsigned)alignof(A)..., 0};
    static constexpr unsigned char pointers[sizeof...(A) + 1] = {(unsigned char)std::is_pointer<A>::value..., 0};
};
template <class... A> inline params<A...> params_of(void (*)(A...)) { return {}; }
} // namespace kiln_emu

#define KILN_EMU_KERNEL(NAME, MAX_THREADS, MIN_BLOCKS)                                              \
    extern "C" __attribute__((visibility("default"))) void kiln_emu_entry_##NAME(void *const *args) { \
        kiln_emu::call_unpacked(&NAME, args,                                                       \
                                std::make_index_sequence<decltype(kiln_emu::params_of(&NAME))::count>()); \
    }                                                                                              \
    extern "C" __attribute__((visibility("default")))                                              \
    const kiln_emu_kernel_info kiln_emu_info_##NAME = {                                            \
        KILN_EMU_ABI, decltype(kiln_emu::params_of(&NAME))::count,                                 \
        decltype(kiln_emu::params_of(&NAME))::sizes, decltype(kiln_emu::params_of(&NAME))::aligns, \
        decltype(kiln_emu::params_of(&NAME))::pointers, (unsigned)(MAX_THREADS),                   \
        (unsigned)(MIN_BLOCKS), &kiln_emu_entry_##NAME, #NAME};

#endif
