// kiln_emu_vector_types.h: CUDA's vector types (char1 ... double4, dim3) and their make_*
// functions, and the __ldg / cache-hinted load and store overloads, for kiln's CUDA emulator.
// Included by kiln_emu_builtins.h.
//
// Invariants: every type has CUDA's members, size and alignment (vector_types.h: a 2-vector is
// aligned to its size, a 4-vector to min(its size, 16), a 1- or 3-vector to its element), checked
// by static_assert below; there are no arithmetic operators, as in CUDA. The loads and stores
// exist only for the types CUDA overloads them for, and are plain accesses (caching is no part
// of a kernel's meaning).
#ifndef KILN_EMU_VECTOR_TYPES_H
#define KILN_EMU_VECTOR_TYPES_H

// A part of kiln_emu_builtins.h; included alone, it brings the whole header (which skips
// this part, its guard being set, and this part then continues).
#include "kiln_emu_builtins.h"

#define KILN_EMU_VEC1(N, T, A)                                                             \
    struct __attribute__((aligned(A))) N##1 { T x; };                                      \
    __device__ __forceinline__ N##1 make_##N##1(T x) { N##1 v; v.x = x; return v; }
#define KILN_EMU_VEC2(N, T, A)                                                             \
    struct __attribute__((aligned(A))) N##2 { T x, y; };                                   \
    __device__ __forceinline__ N##2 make_##N##2(T x, T y) {                                \
        N##2 v; v.x = x; v.y = y; return v;                                                \
    }
#define KILN_EMU_VEC3(N, T, A)                                                             \
    struct __attribute__((aligned(A))) N##3 { T x, y, z; };                                \
    __device__ __forceinline__ N##3 make_##N##3(T x, T y, T z) {                           \
        N##3 v; v.x = x; v.y = y; v.z = z; return v;                                       \
    }
#define KILN_EMU_VEC4_NAMED(TYPE, MAKE, T, A)                                              \
    struct __attribute__((aligned(A))) TYPE { T x, y, z, w; };                             \
    __device__ __forceinline__ TYPE MAKE(T x, T y, T z, T w) {                             \
        TYPE v; v.x = x; v.y = y; v.z = z; v.w = w; return v;                              \
    }
// All four widths of one element type: alignments of the 1-, 2-, 3- and 4-vector.
#define KILN_EMU_VECS(N, T, A1, A2, A4)                                                    \
    KILN_EMU_VEC1(N, T, A1)                                                                \
    KILN_EMU_VEC2(N, T, A2)                                                                \
    KILN_EMU_VEC3(N, T, A1)                                                                \
    KILN_EMU_VEC4_NAMED(N##4, make_##N##4, T, A4)

KILN_EMU_VECS(char, signed char, 1, 2, 4)
KILN_EMU_VECS(uchar, unsigned char, 1, 2, 4)
KILN_EMU_VECS(short, short, 2, 4, 8)
KILN_EMU_VECS(ushort, unsigned short, 2, 4, 8)
KILN_EMU_VECS(int, int, 4, 8, 16)
KILN_EMU_VECS(uint, unsigned int, 4, 8, 16)
KILN_EMU_VECS(long, long, 8, 16, 16)
KILN_EMU_VECS(ulong, unsigned long, 8, 16, 16)
KILN_EMU_VECS(longlong, long long, 8, 16, 16)
KILN_EMU_VECS(ulonglong, unsigned long long, 8, 16, 16)
KILN_EMU_VECS(float, float, 4, 8, 16)
KILN_EMU_VECS(double, double, 8, 16, 16)
// CUDA 13's explicitly aligned 4-vectors of 8-byte elements (16- and 32-byte aligned).
KILN_EMU_VEC4_NAMED(long4_16a, make_long4_16a, long, 16)
KILN_EMU_VEC4_NAMED(long4_32a, make_long4_32a, long, 32)
KILN_EMU_VEC4_NAMED(ulong4_16a, make_ulong4_16a, unsigned long, 16)
KILN_EMU_VEC4_NAMED(ulong4_32a, make_ulong4_32a, unsigned long, 32)
KILN_EMU_VEC4_NAMED(longlong4_16a, make_longlong4_16a, long long, 16)
KILN_EMU_VEC4_NAMED(longlong4_32a, make_longlong4_32a, long long, 32)
KILN_EMU_VEC4_NAMED(ulonglong4_16a, make_ulonglong4_16a, unsigned long long, 16)
KILN_EMU_VEC4_NAMED(ulonglong4_32a, make_ulonglong4_32a, unsigned long long, 32)
KILN_EMU_VEC4_NAMED(double4_16a, make_double4_16a, double, 16)
KILN_EMU_VEC4_NAMED(double4_32a, make_double4_32a, double, 32)
#undef KILN_EMU_VECS
#undef KILN_EMU_VEC1
#undef KILN_EMU_VEC2
#undef KILN_EMU_VEC3
#undef KILN_EMU_VEC4_NAMED

// dim3: a uint3 whose missing components are 1.
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

#define KILN_EMU_CHECK(T, SIZE, ALIGN) \
    static_assert(sizeof(T) == SIZE && alignof(T) == ALIGN, #T " layout differs from CUDA's");
KILN_EMU_CHECK(char1, 1, 1)
KILN_EMU_CHECK(char2, 2, 2)
KILN_EMU_CHECK(char3, 3, 1)
KILN_EMU_CHECK(uchar4, 4, 4)
KILN_EMU_CHECK(short2, 4, 4)
KILN_EMU_CHECK(short3, 6, 2)
KILN_EMU_CHECK(ushort4, 8, 8)
KILN_EMU_CHECK(int2, 8, 8)
KILN_EMU_CHECK(int3, 12, 4)
KILN_EMU_CHECK(uint4, 16, 16)
KILN_EMU_CHECK(long2, 16, 16)
KILN_EMU_CHECK(long3, 24, 8)
KILN_EMU_CHECK(ulong4, 32, 16)
KILN_EMU_CHECK(longlong2, 16, 16)
KILN_EMU_CHECK(ulonglong4, 32, 16)
KILN_EMU_CHECK(float1, 4, 4)
KILN_EMU_CHECK(float2, 8, 8)
KILN_EMU_CHECK(float3, 12, 4)
KILN_EMU_CHECK(float4, 16, 16)
KILN_EMU_CHECK(double1, 8, 8)
KILN_EMU_CHECK(double2, 16, 16)
KILN_EMU_CHECK(double3, 24, 8)
KILN_EMU_CHECK(double4, 32, 16)
KILN_EMU_CHECK(double4_32a, 32, 32)
KILN_EMU_CHECK(dim3, 12, 4)
#undef KILN_EMU_CHECK

// __ldg and the cache-hinted loads / stores, for CUDA's list of types (16-bit floats are
// added by cuda_fp16.h / cuda_bf16.h).
#define KILN_EMU_LOADS(T)                                                                  \
    __device__ __forceinline__ T __ldg(const T* p) { return *p; }                          \
    __device__ __forceinline__ T __ldcg(const T* p) { return *p; }                         \
    __device__ __forceinline__ T __ldca(const T* p) { return *p; }                         \
    __device__ __forceinline__ T __ldcs(const T* p) { return *p; }                         \
    __device__ __forceinline__ T __ldlu(const T* p) { return *p; }                         \
    __device__ __forceinline__ T __ldcv(const T* p) { return *p; }                         \
    __device__ __forceinline__ void __stwb(T* p, T v) { *p = v; }                          \
    __device__ __forceinline__ void __stcg(T* p, T v) { *p = v; }                          \
    __device__ __forceinline__ void __stcs(T* p, T v) { *p = v; }                          \
    __device__ __forceinline__ void __stwt(T* p, T v) { *p = v; }
KILN_EMU_LOADS(char)
KILN_EMU_LOADS(signed char)
KILN_EMU_LOADS(short)
KILN_EMU_LOADS(int)
KILN_EMU_LOADS(long)
KILN_EMU_LOADS(long long)
KILN_EMU_LOADS(unsigned char)
KILN_EMU_LOADS(unsigned short)
KILN_EMU_LOADS(unsigned int)
KILN_EMU_LOADS(unsigned long)
KILN_EMU_LOADS(unsigned long long)
KILN_EMU_LOADS(float)
KILN_EMU_LOADS(double)
KILN_EMU_LOADS(char2)
KILN_EMU_LOADS(char4)
KILN_EMU_LOADS(short2)
KILN_EMU_LOADS(short4)
KILN_EMU_LOADS(int2)
KILN_EMU_LOADS(int4)
KILN_EMU_LOADS(longlong2)
KILN_EMU_LOADS(uchar2)
KILN_EMU_LOADS(uchar4)
KILN_EMU_LOADS(ushort2)
KILN_EMU_LOADS(ushort4)
KILN_EMU_LOADS(uint2)
KILN_EMU_LOADS(uint4)
KILN_EMU_LOADS(ulonglong2)
KILN_EMU_LOADS(float2)
KILN_EMU_LOADS(float4)
KILN_EMU_LOADS(double2)

#endif  // KILN_EMU_VECTOR_TYPES_H
