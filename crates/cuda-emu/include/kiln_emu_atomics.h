// kiln_emu_atomics.h: CUDA's atomic functions for kiln's CUDA emulator, on GCC's __atomic
// builtins. Included by kiln_emu_builtins.h (the 16-bit float atomics are in cuda_fp16.h /
// cuda_bf16.h).
//
// Invariants: each function is one indivisible read-modify-write of the addressed word, with
// relaxed ordering like CUDA's (ordering comes from __threadfence, the runtime's), and returns
// the word's old value. Operations the hardware lacks (floating point, min / max, inc / dec) are
// compare-and-swap loops on the word's bytes, so a NaN never stalls them. atomicAdd on float
// flushes subnormal inputs and results to sign-preserving zero, as PTX's atom.add.f32 does; the
// double one does not. Only the overloads CUDA declares exist (e.g. no atomicAdd on long long), so
// a kernel that would not compile for a GPU does not compile here. The _block and _system
// variants are the same operations (every scope is the whole process here).
#ifndef KILN_EMU_ATOMICS_H
#define KILN_EMU_ATOMICS_H

// A part of kiln_emu_builtins.h; included alone, it brings the whole header (which skips
// this part, its guard being set, and this part then continues).
#include "kiln_emu_builtins.h"

namespace kiln_emu {

// Applies `next(old)` to *p atomically; returns old.
template <typename T, typename F> inline T atomic_update(T* p, F next) {
    T old;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    T desired = next(old);
    while (!__atomic_compare_exchange(p, &old, &desired, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
        desired = next(old);
    }
    return old;
}

// Sign-preserving zero for a subnormal float (atom.add.f32's flush).
inline float flush_subnormal(float x) {
    return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}

}  // namespace kiln_emu

#define KILN_EMU_ATOMIC_SCOPES(DEFINE) DEFINE() DEFINE(_block) DEFINE(_system)

// Integer arithmetic and bitwise operations that map onto one __atomic_fetch_*.
#define KILN_EMU_ATOMIC_FETCH(NAME, T, BUILTIN, SCOPE)                           \
    __device__ __forceinline__ T NAME##SCOPE(T* address, T val) {                \
        return BUILTIN(address, val, __ATOMIC_RELAXED);                          \
    }
#define KILN_EMU_ATOMIC_INTS(SCOPE)                                                          \
    KILN_EMU_ATOMIC_FETCH(atomicAdd, int, __atomic_fetch_add, SCOPE)                         \
    KILN_EMU_ATOMIC_FETCH(atomicAdd, unsigned int, __atomic_fetch_add, SCOPE)                \
    KILN_EMU_ATOMIC_FETCH(atomicAdd, unsigned long long, __atomic_fetch_add, SCOPE)          \
    KILN_EMU_ATOMIC_FETCH(atomicSub, int, __atomic_fetch_sub, SCOPE)                         \
    KILN_EMU_ATOMIC_FETCH(atomicSub, unsigned int, __atomic_fetch_sub, SCOPE)                \
    KILN_EMU_ATOMIC_FETCH(atomicAnd, int, __atomic_fetch_and, SCOPE)                         \
    KILN_EMU_ATOMIC_FETCH(atomicAnd, unsigned int, __atomic_fetch_and, SCOPE)                \
    KILN_EMU_ATOMIC_FETCH(atomicAnd, unsigned long long, __atomic_fetch_and, SCOPE)          \
    KILN_EMU_ATOMIC_FETCH(atomicOr, int, __atomic_fetch_or, SCOPE)                           \
    KILN_EMU_ATOMIC_FETCH(atomicOr, unsigned int, __atomic_fetch_or, SCOPE)                  \
    KILN_EMU_ATOMIC_FETCH(atomicOr, unsigned long long, __atomic_fetch_or, SCOPE)            \
    KILN_EMU_ATOMIC_FETCH(atomicXor, int, __atomic_fetch_xor, SCOPE)                         \
    KILN_EMU_ATOMIC_FETCH(atomicXor, unsigned int, __atomic_fetch_xor, SCOPE)                \
    KILN_EMU_ATOMIC_FETCH(atomicXor, unsigned long long, __atomic_fetch_xor, SCOPE)          \
    KILN_EMU_ATOMIC_FETCH(atomicExch, int, __atomic_exchange_n, SCOPE)                       \
    KILN_EMU_ATOMIC_FETCH(atomicExch, unsigned int, __atomic_exchange_n, SCOPE)              \
    KILN_EMU_ATOMIC_FETCH(atomicExch, unsigned long long, __atomic_exchange_n, SCOPE)
KILN_EMU_ATOMIC_SCOPES(KILN_EMU_ATOMIC_INTS)
#undef KILN_EMU_ATOMIC_INTS
#undef KILN_EMU_ATOMIC_FETCH

// Operations done as a compare-and-swap loop: `EXPR` computes the new value from `old` and `val`.
#define KILN_EMU_ATOMIC_LOOP(NAME, T, SCOPE, EXPR)                               \
    __device__ __forceinline__ T NAME##SCOPE(T* address, T val) {                \
        return kiln_emu::atomic_update(address, [val](T old) -> T { return EXPR; }); \
    }
#define KILN_EMU_ATOMIC_LOOPS(SCOPE)                                                         \
    KILN_EMU_ATOMIC_LOOP(atomicAdd, float, SCOPE,                                            \
                         kiln_emu::flush_subnormal(kiln_emu::flush_subnormal(old) +          \
                                                   kiln_emu::flush_subnormal(val)))          \
    KILN_EMU_ATOMIC_LOOP(atomicAdd, double, SCOPE, old + val)                                \
    KILN_EMU_ATOMIC_LOOP(atomicExch, float, SCOPE, ((void)old, val))                         \
    KILN_EMU_ATOMIC_LOOP(atomicMin, int, SCOPE, val < old ? val : old)                       \
    KILN_EMU_ATOMIC_LOOP(atomicMin, unsigned int, SCOPE, val < old ? val : old)              \
    KILN_EMU_ATOMIC_LOOP(atomicMin, long long, SCOPE, val < old ? val : old)                 \
    KILN_EMU_ATOMIC_LOOP(atomicMin, unsigned long long, SCOPE, val < old ? val : old)        \
    KILN_EMU_ATOMIC_LOOP(atomicMax, int, SCOPE, val > old ? val : old)                       \
    KILN_EMU_ATOMIC_LOOP(atomicMax, unsigned int, SCOPE, val > old ? val : old)              \
    KILN_EMU_ATOMIC_LOOP(atomicMax, long long, SCOPE, val > old ? val : old)                 \
    KILN_EMU_ATOMIC_LOOP(atomicMax, unsigned long long, SCOPE, val > old ? val : old)        \
    KILN_EMU_ATOMIC_LOOP(atomicInc, unsigned int, SCOPE, old >= val ? 0u : old + 1)          \
    KILN_EMU_ATOMIC_LOOP(atomicDec, unsigned int, SCOPE, (old == 0 || old > val) ? val : old - 1)
KILN_EMU_ATOMIC_SCOPES(KILN_EMU_ATOMIC_LOOPS)
#undef KILN_EMU_ATOMIC_LOOPS

// atomicCAS: stores val where *address == compare; returns the old value either way.
#define KILN_EMU_ATOMIC_CAS(T, SCOPE)                                                        \
    __device__ __forceinline__ T atomicCAS##SCOPE(T* address, T compare, T val) {            \
        __atomic_compare_exchange_n(address, &compare, val, false, __ATOMIC_RELAXED,         \
                                    __ATOMIC_RELAXED);                                       \
        return compare;                                                                      \
    }
#define KILN_EMU_ATOMIC_CASES(SCOPE)                     \
    KILN_EMU_ATOMIC_CAS(int, SCOPE)                      \
    KILN_EMU_ATOMIC_CAS(unsigned int, SCOPE)             \
    KILN_EMU_ATOMIC_CAS(unsigned long long, SCOPE)       \
    KILN_EMU_ATOMIC_CAS(unsigned short, SCOPE)
KILN_EMU_ATOMIC_SCOPES(KILN_EMU_ATOMIC_CASES)
#undef KILN_EMU_ATOMIC_CASES
#undef KILN_EMU_ATOMIC_CAS

#endif  // KILN_EMU_ATOMICS_H
