// cuda_fp16.h for kiln's CUDA emulator: CUDA's __half and __half2 (IEEE binary16 storage) with
// the conversions, intrinsics and operators of NVIDIA's header, bit-identical to the GPU's
// (round to nearest even unless the name says otherwise, NaN to 0x7fff, overflow to inf,
// subnormals kept). Everything is defined in kiln_emu_float16.h, shared with cuda_bf16.h.
//
// Invariants: sizeof(__half) == 2 and sizeof(__half2) == 4, aligned as CUDA's; the stored bits
// are the IEEE binary16 pattern; every narrowing rounds exactly once from its source.
#ifndef KILN_EMU_CUDA_FP16_H
#define KILN_EMU_CUDA_FP16_H

#include "kiln_emu_float16.h"

#define KILN_EMU_FLOAT16_MODE_half(SUF, MODE) \
    KILN_EMU_FLOAT16_MODE(__half, __half_raw, kiln_emu::F16, half, SUF, MODE)
KILN_EMU_FLOAT16(__half, __half2, __half_raw, __half2_raw, kiln_emu::F16)
KILN_EMU_FLOAT16_NAMED(__half, __half2, __half_raw, kiln_emu::F16, half)
#undef KILN_EMU_FLOAT16_MODE_half

typedef __half half;
typedef __half2 half2;

#endif  // KILN_EMU_CUDA_FP16_H
