// Weight formats on the device: ggml block types repacked into planes, and their decoding into mma fragments.
//
// Repacked layout (engine/cuda/repack.py writes it; its PLANES and TILE_WORDS tables mirror the offsets used
// here): the fields of every block are split into planes, plane p holding field p of all rows * nb blocks,
// row-major (row, block):
//   Q4_K: qs[128] | words                                 Q5_K: qs[128] | qh[32] | words
//   Q6_K: ql'[128] | qh'[64] | scales[16] | d             Q8_0: qs[32] | d      Q5_0: qs[16] | qh[4] | d
//   Q4_0: qs[16] | d                                      F16:  the plain [rows, K] matrix
// so every field is aligned to its own size whatever the block size (Q6_K's 210-byte blocks are not). Q6_K's
// quants are also regrouped (ql', qh', see repack.py) into the nibble order of Q4_K. The "words" of Q4_K and Q5_K
// (each block's 12 scale bytes and its dm = f16 d, f16 dmin) are tiled by 16 rows instead: unit (row / 16) * nb +
// sb of 256 bytes holds the scales of the tile's 16 rows at that superblock, then their dm words (rows padded to
// whole tiles with zeros), so a kernel staging a tile copies them as 256 contiguous bytes.
//
// Fragments: a warp computes 16 rows x 8 columns with mma.m16n8k16. Lane (g, c) = (lane / 4, lane % 4) supplies
// rows g and g + 8 at four k-slots. All types share one canonical assignment: in a superblock of 256 positions,
// lane c owns positions 64c .. 64c + 63, and mma step s = 2i + h (i = 0..7, h = 0..1) takes its positions
// 64c + 32h + 4i + r, r = 0..3: (r = 0, 1) -> slots (2c, 2c+1), (r = 2, 3) -> (2c+8, 2c+9). The activations are
// stored in that order (act layout, mmvq.cu), so the four lanes of a quad read 32 contiguous bytes per token.
//
// Dequantization is exact where it can be: K-quants give A = q * sub-scale as exact small integers in f16 and apply
// the f32 super-scale d after the mma; the mins of Q4_K/Q5_K go through one more mma (exact integer mins against
// sub-block sums of x), scaled by the f32 dmin after it.
#pragma once
#include "common.cuh"

// ggml type ids (GGMLQuantizationType), listed in the same order everywhere.
#define QT_F32 0
#define QT_F16 1
#define QT_Q4_0 2
#define QT_Q5_0 6
#define QT_Q8_0 8
#define QT_Q4_K 12
#define QT_Q5_K 13
#define QT_Q6_K 14

#define QK_SB 256   // positions per superblock (one iteration of a warp)
#define SB_STEPS 16 // mma steps per superblock

// f16x2 constants
#define H2_1024 0x64006400u
#define H2_1032 0x64086408u   // 1024 + 8
#define H2_1040 0x64106410u   // 1024 + 16
#define H2_1056 0x64206420u   // 1024 + 32
#define H2_1152 0x64806480u   // 1024 + 128
#define H2_NEG1024 0xE400E400u
#define H2_NEG64 0xD400D400u
#define H2_SIXTEENTH 0x2C002C00u  // 1/16

__device__ __forceinline__ u32 dup_lo(u32 v) { return prmt(v, v, 0x1010); }
__device__ __forceinline__ u32 dup_hi(u32 v) { return prmt(v, v, 0x3232); }
// Two unsigned bytes (bits 0-7, 8-15) -> exact f16x2.
__device__ __forceinline__ u32 bytes01_to_h2(u32 v) { return hsub2(prmt(v, 0x64646464u, 0x4140), H2_1024); }
__device__ __forceinline__ u32 word_at(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
// Interleave bytes (b0 b1 b2 b3) -> (b0 b2 b1 b3): afterwards the low bytes of the two halves hold b0, b1.
__device__ __forceinline__ u32 pair_bytes(u32 w) { return prmt(w, w, 0x3120); }
// Position of step s of lane c inside its superblock (the canonical assignment above).
__device__ __forceinline__ int canon_kofs(int c, int s) { return 64 * c + 32 * (s & 1) + 4 * (s >> 1); }
// Activation layout ("act"): tokens in groups of 8; per group, superblock sb and step s, the 8 tokens' 16 values
// at the canonical positions of that step: act[act_index(sb, s, n) + 4c + r] holds x[n][k], k = 256 sb +
// canon_kofs(c, s) + r. One step's fragment of all 8 tokens is 256 contiguous bytes; a group is nsb x 2,048 values.
__device__ __forceinline__ i64 act_index(int sb, int s, int n) { return ((i64)(sb * SB_STEPS + s) * 8 + n) * 16; }
// Where x[n][k] sits in its group's act layout.
__device__ __forceinline__ i64 act_at(int k, int n) {
    const int kl = k & (QK_SB - 1);
    return act_index(k / QK_SB, 2 * ((kl >> 2) & 7) + ((kl >> 5) & 1), n) + 4 * (kl >> 6) + (kl & 3);
}

template <int QT> struct QTraits;

// Plane base pointers of one weight tensor (computed once per kernel; loads then index blocks with 32-bit block
// numbers and one wide multiply-add, which keeps address arithmetic out of the inner loops).
struct Planes {
    const u8* p[4];
};
__device__ __forceinline__ Planes make_planes(const u8* w, u64 ntot, int f1, int f2, int f3) {
    return Planes{{w, w + ntot * f1, w + ntot * f2, w + ntot * f3}};
}

// The tiled words of Q4_K / Q5_K (the layout above): the 256-byte unit of row's tile at superblock sb, and row's
// scales and dm inside it.
#define TILE_UNIT 256
#define TILE_DM 192
__device__ __forceinline__ const u8* tile_unit(const u8* words, int nb, int row, int sb) {
    return words + ((u64)(u32)(row >> 4) * (u32)nb + (u32)sb) * TILE_UNIT;
}
__device__ __forceinline__ const u8* tile_scales(const u8* words, int nb, int row, int sb) {
    return tile_unit(words, nb, row, sb) + 12 * (row & 15);
}
__device__ __forceinline__ const u8* tile_dm(const u8* words, int nb, int row, int sb) {
    return tile_unit(words, nb, row, sb) + TILE_DM + 4 * (row & 15);
}

// Full dequantization for the prefill GEMM (no per-superblock epilogue there): A = the weight itself in f16,
// rounded once. Types without a block scale already produce that from frag().
template <int QT, bool SCALED = QTraits<QT>::BLOCK_SCALE> struct FullFrag {
    using Q = QTraits<QT>;
    using Consts = typename Q::Consts;
    static __device__ __forceinline__ void prepare(const typename Q::Row& r, int c, Consts& k) { Q::prepare(r, c, k); }
    static __device__ __forceinline__ void frag(const typename Q::Row& r, const Consts& k, int c, int s, u32& a0,
                                                u32& a2) { Q::frag(r, k, c, s, a0, a2); }
};
template <int QT> struct FullFrag<QT, true> {
    using Q = QTraits<QT>;
    using Consts = typename Q::FullConsts;
    static __device__ __forceinline__ void prepare(const typename Q::Row& r, int c, Consts& k) { Q::prepare_full(r, c, k); }
    static __device__ __forceinline__ void frag(const typename Q::Row& r, const Consts& k, int c, int s, u32& a0,
                                                u32& a2) { Q::frag_full(r, k, c, s, a0, a2); }
};

// Each type provides: Row (one row's raw data for one superblock and lane), load(), prepare() (per-row constants),
// frag(s) (the lane's two f16x2 A registers for step s), and for BLOCK_SCALE types dscale() (the f32 factor applied
// to the whole superblock's product after the mma). Blocks past the end of a row (QK = 32 types whose rows are not
// whole superblocks) read as zeros with d = 0.

// ---------------------------------------------------------------- Q4_0
// Lane c: blocks 2c + j (j = h of the step); byte l of a block: low nibble -> l, high nibble -> 16 + l.
template <> struct QTraits<QT_Q4_0> {
    static constexpr int MIN_BLOCKS = 2;  // mmvq blocks per SM the register budget targets
    static constexpr int QK = 32;
    static constexpr bool BLOCK_SCALE = false, HAS_MIN = false;
    struct Row { uint4 q[2]; u32 d[2]; };
    struct Consts { u32 lo[2], hi[2]; };
    static __device__ __forceinline__ Planes planes(const u8* w, u64 ntot) { return make_planes(w, ntot, 16, 0, 0); }
    static __device__ __forceinline__ void load(Row& r, const Planes& P, int nb, int row, int sb, int c) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int b = sb * 8 + 2 * c + j;
            const bool ok = b < nb;
            const u32 idx = (u32)row * nb + (ok ? b : 0);
            r.q[j] = ok ? ld_stream_u4(P.p[0] + (u64)idx * 16) : make_uint4(0, 0, 0, 0);
            r.d[j] = ok ? ld_stream_u16(P.p[1] + (u64)idx * 2) : 0u;
        }
    }
    static __device__ __forceinline__ void prepare(const Row& r, int c, Consts& k) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            k.lo[j] = dup_lo(r.d[j]);
            k.hi[j] = hmul2(k.lo[j], H2_SIXTEENTH);
        }
    }
    static __device__ __forceinline__ void frag(const Row& r, const Consts& k, int c, int s, u32& a0, u32& a2) {
        const int j = s & 1, i = s >> 1, nib = i >> 2;
        const u32 w = pair_bytes(word_at(r.q[j], i & 3));
        if (nib == 0) {  // low nibbles: q + 1024, minus 1032 -> q - 8
            a0 = hmul2(hsub2(and_or(w, 0x000F000Fu, H2_1024), H2_1032), k.lo[j]);
            a2 = hmul2(hsub2(and_or(w >> 8, 0x000F000Fu, H2_1024), H2_1032), k.lo[j]);
        } else {  // high nibbles: 16 q + 1024, minus 1152 -> 16 (q - 8), times d / 16
            a0 = hmul2(hsub2(and_or(w, 0x00F000F0u, H2_1024), H2_1152), k.hi[j]);
            a2 = hmul2(hsub2(and_or(w >> 8, 0x00F000F0u, H2_1024), H2_1152), k.hi[j]);
        }
    }
};

// ---------------------------------------------------------------- Q5_0
// As Q4_0, the fifth bit of position l of a block is bit l of qh.
template <> struct QTraits<QT_Q5_0> {
    static constexpr int MIN_BLOCKS = 2;  // mmvq blocks per SM the register budget targets
    static constexpr int QK = 32;
    static constexpr bool BLOCK_SCALE = false, HAS_MIN = false;
    struct Row { uint4 q[2]; u32 qh[2]; u32 d[2]; };
    struct Consts { u32 d2[2]; };
    static __device__ __forceinline__ Planes planes(const u8* w, u64 ntot) { return make_planes(w, ntot, 16, 20, 0); }
    static __device__ __forceinline__ void load(Row& r, const Planes& P, int nb, int row, int sb, int c) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int b = sb * 8 + 2 * c + j;
            const bool ok = b < nb;
            const u32 idx = (u32)row * nb + (ok ? b : 0);
            r.q[j] = ok ? ld_stream_u4(P.p[0] + (u64)idx * 16) : make_uint4(0, 0, 0, 0);
            r.qh[j] = ok ? ld_stream_u32(P.p[1] + (u64)idx * 4) : 0u;
            r.d[j] = ok ? ld_stream_u16(P.p[2] + (u64)idx * 2) : 0u;
        }
    }
    static __device__ __forceinline__ void prepare(const Row& r, int c, Consts& k) {
        k.d2[0] = dup_lo(r.d[0]);
        k.d2[1] = dup_lo(r.d[1]);
    }
    static __device__ __forceinline__ void frag(const Row& r, const Consts& k, int c, int s, u32& a0, u32& a2) {
        const int j = s & 1, i = s >> 1, nib = i >> 2;
        const u32 w = word_at(r.q[j], i & 3);
        // positions 32j + 4i .. + 3 of the block pair: qh bits 4i .. 4i + 3, spread to bit 4 of each byte
        const u32 hb = (r.qh[j] >> (4 * i)) & 0xFu;
        const u32 spread = ((hb * 0x00204081u) & 0x01010101u) << 4;
        const u32 v = pair_bytes(((nib ? w >> 4 : w) & 0x0F0F0F0Fu) | spread);
        a0 = hmul2(hsub2(and_or(v, 0x00FF00FFu, H2_1024), H2_1040), k.d2[j]);
        a2 = hmul2(hsub2(and_or(v >> 8, 0x00FF00FFu, H2_1024), H2_1040), k.d2[j]);
    }
};

// ---------------------------------------------------------------- Q8_0
// Lane c: blocks 2c + j (j = h of the step), word i = bytes 4i .. 4i + 3.
template <> struct QTraits<QT_Q8_0> {
    static constexpr int MIN_BLOCKS = 2;  // mmvq blocks per SM the register budget targets
    static constexpr int QK = 32;
    static constexpr bool BLOCK_SCALE = false, HAS_MIN = false;
    struct Row { uint4 q[4]; u32 d[2]; };
    struct Consts { u32 d2[2]; };
    static __device__ __forceinline__ Planes planes(const u8* w, u64 ntot) { return make_planes(w, ntot, 32, 0, 0); }
    static __device__ __forceinline__ void load(Row& r, const Planes& P, int nb, int row, int sb, int c) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int b = sb * 8 + 2 * c + j;
            const bool ok = b < nb;
            const u32 idx = (u32)row * nb + (ok ? b : 0);
            const u8* q = P.p[0] + (u64)idx * 32;
            r.q[2 * j] = ok ? ld_stream_u4(q) : make_uint4(0, 0, 0, 0);
            r.q[2 * j + 1] = ok ? ld_stream_u4(q + 16) : make_uint4(0, 0, 0, 0);
            r.d[j] = ok ? ld_stream_u16(P.p[1] + (u64)idx * 2) : 0u;
        }
    }
    static __device__ __forceinline__ void prepare(const Row& r, int c, Consts& k) {
        k.d2[0] = dup_lo(r.d[0]);
        k.d2[1] = dup_lo(r.d[1]);
    }
    static __device__ __forceinline__ void frag(const Row& r, const Consts& k, int c, int s, u32& a0, u32& a2) {
        const int j = s & 1, i = s >> 1;
        // signed bytes: b + 128 as 1024 + (b + 128), minus 1152 -> b exactly
        const u32 u = word_at(r.q[2 * j + (i >> 2)], i & 3) ^ 0x80808080u;
        a0 = hmul2(hsub2(prmt(u, 0x64646464u, 0x4140), H2_1152), k.d2[j]);
        a2 = hmul2(hsub2(prmt(u, 0x64646464u, 0x4342), H2_1152), k.d2[j]);
    }
};

// ---------------------------------------------------------------- F16
// The plain matrix; lane c reads its 64 positions (128 bytes) per superblock. Positions past K read as zero.
template <> struct QTraits<QT_F16> {
    static constexpr int MIN_BLOCKS = 1;  // mmvq blocks per SM the register budget targets
    static constexpr int QK = 1;
    static constexpr bool BLOCK_SCALE = false, HAS_MIN = false;
    struct Row { uint4 q[8]; };
    struct Consts {};
    // nb is K here (a multiple of 8)
    static __device__ __forceinline__ Planes planes(const u8* w, u64 ntot) { return make_planes(w, ntot, 0, 0, 0); }
    static __device__ __forceinline__ void load(Row& r, const Planes& P, int nb, int row, int sb, int c) {
        const f16* p = reinterpret_cast<const f16*>(P.p[0]) + (u64)((u32)row * nb);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int e = sb * QK_SB + 64 * c + 8 * j;
            r.q[j] = e < nb ? ld_stream_u4(p + e) : make_uint4(0, 0, 0, 0);
        }
    }
    static __device__ __forceinline__ void prepare(const Row& r, int c, Consts& k) {}
    static __device__ __forceinline__ void frag(const Row& r, const Consts& k, int c, int s, u32& a0, u32& a2) {
        const int i = s >> 1, h = s & 1;
        const uint4 v = r.q[4 * h + (i >> 1)];  // positions 32h + 4i .. + 3 of the lane's 64
        a0 = (i & 1) ? v.z : v.x;
        a2 = (i & 1) ? v.w : v.y;
    }
};

#include "kquants.cuh"  // Q4_K, Q5_K, Q6_K
