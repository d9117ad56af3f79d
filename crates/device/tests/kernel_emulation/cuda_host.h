// Host stand-ins for the CUDA built-ins kiln's pool.cu and norm.cu use, so their kernel source
// compiles as C++ and runs on the CPU: one block of blockDim.x std::threads, __syncthreads as a
// barrier, __shfl_down_sync through a per-warp buffer and barrier, atomicAdd as a plain add
// (callers run one thread then), and __half / __nv_bfloat16 as f32 wrappers (so the 16-bit
// kernels are checked for their index logic and f32 arithmetic, not for rounding).
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <thread>
#include <barrier>
#include <vector>
#include <functional>
#include <memory>
struct Dim3 { unsigned x, y, z; };
static thread_local Dim3 threadIdx{0,0,0};
// One block; harnesses set blockDim.x (norm.cpp: 64 threads via run(), pool_gather.cpp: 1).
static Dim3 blockIdx{0,0,0}, blockDim{64,1,1}, gridDim{1,1,1};
static std::barrier<>* BAR;
inline void __syncthreads() { BAR->arrive_and_wait(); }
static double SHFL[64];
static std::barrier<>* WB[2];
inline double __shfl_down_sync(unsigned, double v, int o) {
  unsigned t = threadIdx.x; std::barrier<>* wb = WB[t >> 5]; SHFL[t] = v; wb->arrive_and_wait();
  unsigned lane = t & 31; double r = lane + o < 32 ? SHFL[t + o] : v; wb->arrive_and_wait(); return r;
}
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
struct __half { float v; }; struct __nv_bfloat16 { float v; };
inline float __half2float(__half h){return h.v;} inline float __bfloat162float(__nv_bfloat16 h){return h.v;}
inline __half __float2half_rn(float f){return {f};} inline __nv_bfloat16 __float2bfloat16_rn(float f){return {f};}
inline double __longlong_as_double(long long b){double d; memcpy(&d,&b,8); return d;}
template<class T> void atomicAdd(T* p, T v){*p += v;}
// The threads of the emulated block, made once per block size and reused by every launch
// (making and joining 64 threads per launch spent most of the run in the kernel on small VMs).
struct BlockThreads {
  unsigned n = 0;
  bool quit = false;
  std::function<void()> job;
  std::vector<std::thread> threads;
  std::unique_ptr<std::barrier<>> start, finish;
  void resize(unsigned want) {
    stop();
    n = want;
    quit = false;
    start = std::make_unique<std::barrier<>>(n + 1);
    finish = std::make_unique<std::barrier<>>(n + 1);
    for (unsigned t = 0; t < n; ++t)
      threads.emplace_back([this, t] {
        threadIdx.x = t;
        for (;;) {
          start->arrive_and_wait();
          if (quit) return;
          job();
          finish->arrive_and_wait();
        }
      });
  }
  void stop() {
    if (threads.empty()) return;
    quit = true;
    start->arrive_and_wait();
    for (auto& t : threads) t.join();
    threads.clear();
  }
  ~BlockThreads() { stop(); }
};
// run f on blockDim.x threads of one block
inline void run(std::function<void()> f) {
  static BlockThreads block;
  if (block.n != blockDim.x) block.resize(blockDim.x);
  std::barrier<> bar(blockDim.x); BAR = &bar;
  std::barrier<> w0(32), w1(32); WB[0] = &w0; WB[1] = &w1;
  block.job = std::move(f);
  block.start->arrive_and_wait();
  block.finish->arrive_and_wait();
}
