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

// The A fragments of chunk j's low (a[0]) and high (a[1]) mma from a Q6KStage8 stage: rows g, g + 8 at k 4c ..
// and 16 + 4c .. (kernels/mmvq_i8q6.cu's positions), as signed q - 32.
__device__ __forceinline__ void q6_frags(const u8* st, int g, int c, int j, u32 (&a)[2][4]) {
    using S = Q6KStage8;
    const int hshift = 4 * (c >> 1);
    const uint2 l0 = *reinterpret_cast<const uint2*>(st + S::QL + g * S::QL_PITCH + 32 * j + 8 * c);
    const uint2 l1 = *reinterpret_cast<const uint2*>(st + S::QL + (g + 8) * S::QL_PITCH + 32 * j + 8 * c);
    const uint2 h0 = *reinterpret_cast<const uint2*>(st + S::QH + g * S::QH_PITCH + 16 * j + 8 * (c & 1));
    const uint2 h1 = *reinterpret_cast<const uint2*>(st + S::QH + (g + 8) * S::QH_PITCH + 16 * j + 8 * (c & 1));
    const u32 h0x = h0.x >> hshift, h0y = h0.y >> hshift, h1x = h1.x >> hshift, h1y = h1.y >> hshift;
    a[0][0] = q6_s8x4(l0.x, h0x);
    a[0][1] = q6_s8x4(l1.x, h1x);
    a[0][2] = q6_s8x4(l0.y, h0y);
    a[0][3] = q6_s8x4(l1.y, h1y);
    a[1][0] = q6_s8x4(l0.x >> 4, h0x >> 2);
    a[1][1] = q6_s8x4(l1.x >> 4, h1x >> 2);
    a[1][2] = q6_s8x4(l0.y >> 4, h0y >> 2);
    a[1][3] = q6_s8x4(l1.y >> 4, h1y >> 2);
}
