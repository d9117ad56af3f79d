// A declaration-only stand-in for the emulator's execution model (kiln_emu_runtime.h), so the
// builtins test can compile kiln's kernel files with `g++ -fsyntax-only` against the builtin
// headers alone. Invariant: it only declares (nothing here runs), and it defines the qualifiers
// before including kiln_emu_builtins.h, the order the real runtime header uses.
#pragma once
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)
#include "kiln_emu_builtins.h"

extern thread_local uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
constexpr int warpSize = 32;
void __syncthreads();
int __syncthreads_or(int predicate);
int __syncthreads_and(int predicate);
int __syncthreads_count(int predicate);
void __threadfence();
void __threadfence_block();
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32);
template <typename T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32);
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32);
template <typename T> T __shfl_sync(unsigned mask, T v, int lane, int width = 32);
unsigned __ballot_sync(unsigned mask, int predicate);
