// Q6_K's weights for int8 activations: shared by the per-op matmul (kernels/mmvq_i8q6.cu, whose header describes
// the positions and sub-blocks) and the megakernel's one-row matmul (megakernel/matvec.cuh).
#pragma once
#include "mmvq.cuh"

using Q6KStage8 = Q6KStage<160, 80>;  // the int8 reader's pitches

// Four 6-bit weights as the signed bytes q - 32: the low nibbles from lo's bits 0-3 of each byte, the high bits
// from hi's bits 0-1 (other bits ignored). q + 128 per byte, minus 32 without a borrow (every byte is >= 128),
// then minus 128 by flipping the top bit.
__device__ __forceinline__ u32 q6_s8x4(u32 lo, u32 hi) {
    const u32 v = (lo & 0x0F0F0F0Fu) | ((hi & 0x03030303u) << 4) | 0x80808080u;
    return (v - 0x20202020u) ^ 0x80808080u;
}

__device__ __forceinline__ int sbyte(u32 word, int shift) { return (int)(signed char)(word >> shift); }
