// cuda_bf16.h for kiln's CUDA emulator: CUDA's __nv_bfloat16 and __nv_bfloat162 (bfloat16
// storage: float's upper 16 bits) with the conversions, intrinsics and operators of NVIDIA's
// header, bit-identical to the GPU's (round to nearest even unless the name says otherwise,
// NaN to 0x7fff, overflow to inf, subnormals kept; double converts directly, not via float).
// Everything is defined in kiln_emu_float16.h, shared with cuda_fp16.h.
//
// Invariants: sizeof(__nv_bfloat16) == 2 and sizeof(__nv_bfloat162) == 4, aligned as CUDA's;
// the stored bits are the bfloat16 pattern; every narrowing rounds exactly once from its source.
#ifndef KILN_EMU_CUDA_BF16_H
#define KILN_EMU_CUDA_BF16_H

#include "kiln_emu_float16.h"

#define KILN_EMU_FLOAT16_MODE_bfloat16(SUF, MODE) \
    KILN_EMU_FLOAT16_MODE(__nv_bfloat16, __nv_bfloat16_raw, kiln_emu::BF16, bfloat16, SUF, MODE)
KILN_EMU_FLOAT16(__nv_bfloat16, __nv_bfloat162, __nv_bfloat16_raw, __nv_bfloat162_raw, kiln_emu::BF16)
KILN_EMU_FLOAT16_NAMED(__nv_bfloat16, __nv_bfloat162, __nv_bfloat16_raw, kiln_emu::BF16, bfloat16)
#undef KILN_EMU_FLOAT16_MODE_bfloat16

typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

#endif  // KILN_EMU_CUDA_BF16_H
