// Shared-memory staging of K-quant weights for the pipelined mmvqs (kernels/mmvq.cu mmvq_cp, kernels/mmvq_persist.cu).
//
// A stage holds one superblock of a warp's 16 rows: each plane's bytes of those rows (quants.cuh, repack.py) in
// a region of its own, the 128-byte quant rows padded to 144 bytes so that the readers' 16-byte loads (lanes of
// two rows in one phase) fall in different banks. Every lane issues a fixed handful of cp.async copies per stage;
// the rows it copies are fixed for the whole kernel, so their block-index bases are computed once (Lane), and a
// stage costs one add and one wide multiply-add per copy. Readers then fill the same Row that QTraits<QT>::load
// fills from global memory, so the decoding (frag, prepare) is shared with every other matmul kernel.
#pragma once
#include "quants.cuh"

#define STAGE_ROWS 16

// Block-index base (row * nb) of local row lr of the tile starting at row0; rows past the end repeat the last
// row (their results are never stored).
__device__ __forceinline__ u32 stage_row_base(int row0, int lr, int rows, int nb) {
    return (u32)min(row0 + lr, rows - 1) * (u32)nb;
}

// The words of a Q4_K/Q5_K stage (16 rows' scales, then their dm words: regions SC and DM = SC + 192): the
// tile's 256-byte unit of the tiled plane (quants.cuh), copied by lanes 0-15, 16 bytes each. unit0: the unit of
// the tile's superblock 0 (tile_unit of its first row, a multiple of 16).
__device__ __forceinline__ u32 stage_unit0(int row0, int nb) { return (u32)(row0 >> 4) * (u32)nb; }
__device__ __forceinline__ void stage_words_copy(u32 dst_sc, const u8* words, u32 unit0, int sb, int lane) {
    if (lane < 16) cp_async16_w(dst_sc + 16 * lane, words + ((u64)unit0 + sb) * TILE_UNIT + 16 * lane);
}

template <int QT> struct Stage;

// ---------------------------------------------------------------- Q4_K
// Stage: qs [16][PITCH] | scales [16][12] | dm [16][4] = 2560 bytes at the 144-byte pitch of the f16 readers.
// Copies of lane l: qs chunk (l % 8) of rows l / 8 + 4 j (j = 0..3); lanes 0-15 a 16-byte part of the words
// (stage_words_copy). The int8 reader (kernels/mmvq_i8.cu) takes 8-byte pieces of four rows per phase, which a
// 160-byte pitch keeps in different banks.
template <int PITCH> struct Q4KStage {
    static constexpr int STAGES = 4;  // stages per warp: 3 superblocks in flight while one is multiplied
    static constexpr int QS = 0, QS_PITCH = PITCH, SC = QS + STAGE_ROWS * QS_PITCH, DM = SC + STAGE_ROWS * 12;
    static constexpr int BYTES = DM + STAGE_ROWS * 4;
    static_assert(DM == SC + TILE_DM && SC % 16 == 0, "the words arrive as one 256-byte unit at SC");
    struct Lane { u32 qrow[4], unit0; };
    static __device__ __forceinline__ void init(Lane& L, int row0, int rows, int nb, int lane) {
#pragma unroll
        for (int j = 0; j < 4; ++j) L.qrow[j] = stage_row_base(row0, (lane >> 3) + 4 * j, rows, nb);
        L.unit0 = stage_unit0(row0, nb);
    }
    static __device__ __forceinline__ void copy(u32 dst, const Planes& P, const Lane& L, int sb, int lane, u64 ntot) {
        const int part = lane & 7;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            cp_async16_w(dst + QS + ((lane >> 3) + 4 * j) * QS_PITCH + 16 * part,
                       P.p[0] + (u64)(L.qrow[j] + sb) * 128 + 16 * part);
        stage_words_copy(dst + SC, P.p[1], L.unit0, sb, lane);
    }
    // Row lr of the stage at st, as QTraits<QT_Q4_K>::load would read it (idx: its block index, unused here).
    static __device__ __forceinline__ void read(QTraits<QT_Q4_K>::Row& r, const u8* st, int lr, int c, u32 idx) {
        const uint4* q = reinterpret_cast<const uint4*>(st + QS + lr * QS_PITCH + 32 * c);
        r.q[0] = q[0];
        r.q[1] = q[1];
        const u32* s = reinterpret_cast<const u32*>(st + SC + 12 * lr);
        r.s[0] = s[0];
        r.s[1] = s[1];
        r.s[2] = s[2];
        r.dm = *reinterpret_cast<const u32*>(st + DM + 4 * lr);
    }
};
template <> struct Stage<QT_Q4_K> : Q4KStage<144> {};

// ---------------------------------------------------------------- Q5_K
// Stage: qs [16][144] | qh [16][32] | scales [16][12] | dm [16][4] = 3072 bytes.
// Copies of lane l: qs as Q4_K; qh half (l % 2) of row l / 2; the words as Q4_K (lanes 0-15). Every lane of a
// row reads that row's whole 32-byte qh (QTraits<QT_Q5_K>::load does too): the four lanes of a quad read one
// address, and the two rows of a quarter-warp sit 32 bytes apart, so the 16-byte reads are conflict-free at a
// 32-byte pitch.
template <> struct Stage<QT_Q5_K> {
    static constexpr int STAGES = 4;
    static constexpr int QS = 0, QS_PITCH = 144, QH = QS + STAGE_ROWS * QS_PITCH, SC = QH + STAGE_ROWS * 32;
    static constexpr int DM = SC + STAGE_ROWS * 12, BYTES = DM + STAGE_ROWS * 4;
    static_assert(DM == SC + TILE_DM && SC % 16 == 0, "the words arrive as one 256-byte unit at SC");
    struct Lane { u32 qrow[4], hrow, unit0; };
    static __device__ __forceinline__ void init(Lane& L, int row0, int rows, int nb, int lane) {
#pragma unroll
        for (int j = 0; j < 4; ++j) L.qrow[j] = stage_row_base(row0, (lane >> 3) + 4 * j, rows, nb);
        L.hrow = stage_row_base(row0, lane >> 1, rows, nb);
        L.unit0 = stage_unit0(row0, nb);
    }
    static __device__ __forceinline__ void copy(u32 dst, const Planes& P, const Lane& L, int sb, int lane, u64 ntot) {
        const int part = lane & 7, half = lane & 1;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            cp_async16_w(dst + QS + ((lane >> 3) + 4 * j) * QS_PITCH + 16 * part,
                       P.p[0] + (u64)(L.qrow[j] + sb) * 128 + 16 * part);
        cp_async16_w(dst + QH + (lane >> 1) * 32 + 16 * half, P.p[1] + (u64)(L.hrow + sb) * 32 + 16 * half);
        stage_words_copy(dst + SC, P.p[2], L.unit0, sb, lane);
    }
    static __device__ __forceinline__ void read(QTraits<QT_Q5_K>::Row& r, const u8* st, int lr, int c, u32 idx) {
        const uint4* q = reinterpret_cast<const uint4*>(st + QS + lr * QS_PITCH + 32 * c);
        r.q[0] = q[0];
        r.q[1] = q[1];
        const uint4* h = reinterpret_cast<const uint4*>(st + QH + 32 * lr);
        r.qh[0] = h[0];
        r.qh[1] = h[1];
        const u32* s = reinterpret_cast<const u32*>(st + SC + 12 * lr);
        r.s[0] = s[0];
        r.s[1] = s[1];
        r.s[2] = s[2];
        r.dm = *reinterpret_cast<const u32*>(st + DM + 4 * lr);
    }
};

// ---------------------------------------------------------------- Q6_K
// Stage: ql' [16][144] | qh' [16][64] | scales [16][16] | d [16][4] = 3648 bytes (the int8 reader's pitches, 160
// and 80, keep a half-warp's 8-byte reads of four rows in different banks: Q6KStage<160, 80>, 4160 bytes).
// Copies of lane l: ql' chunk (l % 8) of rows l / 8 + 4 j (j = 0..3); qh' chunk (l % 4) of rows l / 4 + 8 j
// (j = 0, 1); lanes 0-15 the scales of row l, lanes 16-31 the aligned 4-byte word holding d of row l - 16.
// Q6_K's d is 2 bytes at 2 idx of its plane (ntot blocks): the aligned word at 2 idx & ~3 holds it, in its low half
// for even idx and its high half for odd; the copy reads only bytes inside the plane, zero-filling the rest at its
// very end.
__device__ __forceinline__ void q6k_d_word_copy(u32 dst, const u8* plane, u64 idx, u64 ntot) {
    const u64 word = (2 * idx) & ~3ull;
    cp_async4_w(dst, plane + word, (u32)min((u64)4, 2 * ntot - word));
}
__device__ __forceinline__ u32 q6k_d_of_word(u32 word, u64 idx) { return (idx & 1u) ? word >> 16 : word & 0xFFFFu; }

// SWZ (gemm_ws.cu's tight form, QL_P 128): odd rows swap each pair of ql' chunks (16 bytes at 16 (j ^ 1)), which keeps
// a quarter-warp's 16-byte reads of chunks 2c (rows g, g + 1) in different banks without the pitch's padding.
template <int QL_P, int QH_P, bool SWZ = false> struct Q6KStage {
    static constexpr int STAGES = 3;  // 3648-byte stages: 3 let two blocks of 8 warps share one SM
    static constexpr int QL = 0, QL_PITCH = QL_P, QH = QL + STAGE_ROWS * QL_PITCH, QH_PITCH = QH_P;
    static constexpr int SC = QH + STAGE_ROWS * QH_PITCH;
    static constexpr int D = SC + STAGE_ROWS * 16, BYTES = D + STAGE_ROWS * 4;
    // where ql' chunk j (16 bytes) of row lr sits
    static __host__ __device__ __forceinline__ constexpr int ql_at(int lr, int j) {
        return QL + lr * QL_PITCH + 16 * (SWZ ? j ^ (lr & 1) : j);
    }
    struct Lane { u32 lrow[4], hrow[2], xrow; };
    static __device__ __forceinline__ void init(Lane& L, int row0, int rows, int nb, int lane) {
#pragma unroll
        for (int j = 0; j < 4; ++j) L.lrow[j] = stage_row_base(row0, (lane >> 3) + 4 * j, rows, nb);
#pragma unroll
        for (int j = 0; j < 2; ++j) L.hrow[j] = stage_row_base(row0, (lane >> 2) + 8 * j, rows, nb);
        L.xrow = stage_row_base(row0, lane & 15, rows, nb);
    }
    static __device__ __forceinline__ void copy(u32 dst, const Planes& P, const Lane& L, int sb, int lane, u64 ntot) {
        const int part8 = lane & 7, part4 = lane & 3, r = lane & 15;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            cp_async16_w(dst + ql_at((lane >> 3) + 4 * j, part8), P.p[0] + (u64)(L.lrow[j] + sb) * 128 + 16 * part8);
#pragma unroll
        for (int j = 0; j < 2; ++j)
            cp_async16_w(dst + QH + ((lane >> 2) + 8 * j) * QH_PITCH + 16 * part4,
                       P.p[1] + (u64)(L.hrow[j] + sb) * 64 + 16 * part4);
        const u64 idx = L.xrow + sb;
        if (lane < 16) {
            cp_async16_w(dst + SC + 16 * r, P.p[2] + idx * 16);
        } else {
            q6k_d_word_copy(dst + D + 4 * r, P.p[3], idx, ntot);
        }
    }
    static __device__ __forceinline__ void read(QTraits<QT_Q6_K>::Row& r, const u8* st, int lr, int c, u32 idx) {
        r.q[0] = *reinterpret_cast<const uint4*>(st + ql_at(lr, 2 * c));
        r.q[1] = *reinterpret_cast<const uint4*>(st + ql_at(lr, 2 * c + 1));
        r.qh = *reinterpret_cast<const uint4*>(st + QH + lr * QH_PITCH + 16 * c);
        r.sc = *reinterpret_cast<const u32*>(st + SC + 16 * lr + 4 * c);
        r.d = q6k_d_of_word(*reinterpret_cast<const u32*>(st + D + 4 * lr), idx);
    }
};
template <> struct Stage<QT_Q6_K> : Q6KStage<144, 64> {};

// ---------------------------------------------------------------- Q8_0, Q5_0 (the megakernel's rings)
// The 32-weight types a stage at a time too, a superblock being their 8 blocks of 32: nb here counts blocks
// (row * nb + 8 sb is a superblock's first block), and rows must be whole superblocks (cols % 256 == 0, so every
// 8-block run is 16-byte aligned in each plane). They are not used by the per-op kernels; the megakernel stages them
// with MK_STAGED_LEGACY (attention's Q5_0 k and DeltaNet's Q8_0 alpha / beta took ~16 us a 16-row tile through
// registers).

// Q8_0 stage: qs [16][272] (a row's 8 blocks, 256 bytes, padded) | d [16][16] (their f16 scales) = 4608 bytes.
// Copies of lane l: qs chunks l + 32 k (row l / 16 + 2 k, part l % 16), k = 0..7; lanes 0-15 row l's scales.
template <> struct Stage<QT_Q8_0> {
    static constexpr int STAGES = 3;
    static constexpr int QS = 0, QS_PITCH = 272, D = QS + STAGE_ROWS * QS_PITCH, BYTES = D + STAGE_ROWS * 16;
    struct Lane { u32 qrow[8], drow; };
    static __device__ __forceinline__ void init(Lane& L, int row0, int rows, int nb, int lane) {
#pragma unroll
        for (int k = 0; k < 8; ++k) L.qrow[k] = stage_row_base(row0, (lane >> 4) + 2 * k, rows, nb);
        L.drow = stage_row_base(row0, lane & 15, rows, nb);
    }
    static __device__ __forceinline__ void copy(u32 dst, const Planes& P, const Lane& L, int sb, int lane, u64 ntot) {
        const int part = lane & 15;
#pragma unroll
        for (int k = 0; k < 8; ++k)
            cp_async16_w(dst + QS + ((lane >> 4) + 2 * k) * QS_PITCH + 16 * part,
                       P.p[0] + ((u64)L.qrow[k] + 8 * sb) * 32 + 16 * part);
        if (lane < 16) cp_async16_w(dst + D + 16 * lane, P.p[1] + ((u64)L.drow + 8 * sb) * 2);
    }
    // Row lr, lane c's blocks 2c and 2c + 1, as QTraits<QT_Q8_0>::load reads them.
    static __device__ __forceinline__ void read(QTraits<QT_Q8_0>::Row& r, const u8* st, int lr, int c, u32 idx) {
        const uint4* q = reinterpret_cast<const uint4*>(st + QS + lr * QS_PITCH + 64 * c);
#pragma unroll
        for (int i = 0; i < 4; ++i) r.q[i] = q[i];
        const u16* d = reinterpret_cast<const u16*>(st + D + 16 * lr + 4 * c);
        r.d[0] = d[0];
        r.d[1] = d[1];
    }
};

// Q5_0 stage: qs [16][144] (8 blocks' 16 nibble bytes) | qh [16][32] (their high bits) | d [16][16] = 3072 bytes.
// Copies of lane l: qs chunk l % 8 of rows l / 8 + 4 j (j = 0..3); qh half l % 2 of row l / 2; lanes 0-15 row l's
// scales.
template <> struct Stage<QT_Q5_0> {
    static constexpr int STAGES = 4;
    static constexpr int QS = 0, QS_PITCH = 144, QH = QS + STAGE_ROWS * QS_PITCH, D = QH + STAGE_ROWS * 32;
    static constexpr int BYTES = D + STAGE_ROWS * 16;
    struct Lane { u32 qrow[4], hrow, drow; };
    static __device__ __forceinline__ void init(Lane& L, int row0, int rows, int nb, int lane) {
#pragma unroll
        for (int j = 0; j < 4; ++j) L.qrow[j] = stage_row_base(row0, (lane >> 3) + 4 * j, rows, nb);
        L.hrow = stage_row_base(row0, lane >> 1, rows, nb);
        L.drow = stage_row_base(row0, lane & 15, rows, nb);
    }
    static __device__ __forceinline__ void copy(u32 dst, const Planes& P, const Lane& L, int sb, int lane, u64 ntot) {
        const int part = lane & 7, half = lane & 1;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            cp_async16_w(dst + QS + ((lane >> 3) + 4 * j) * QS_PITCH + 16 * part,
                       P.p[0] + ((u64)L.qrow[j] + 8 * sb) * 16 + 16 * part);
        cp_async16_w(dst + QH + (lane >> 1) * 32 + 16 * half, P.p[1] + ((u64)L.hrow + 8 * sb) * 4 + 16 * half);
        if (lane < 16) cp_async16_w(dst + D + 16 * lane, P.p[2] + ((u64)L.drow + 8 * sb) * 2);
    }
    // Row lr, lane c's blocks 2c and 2c + 1, as QTraits<QT_Q5_0>::load reads them.
    static __device__ __forceinline__ void read(QTraits<QT_Q5_0>::Row& r, const u8* st, int lr, int c, u32 idx) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            r.q[j] = *reinterpret_cast<const uint4*>(st + QS + lr * QS_PITCH + 16 * (2 * c + j));
            r.qh[j] = *reinterpret_cast<const u32*>(st + QH + lr * 32 + 4 * (2 * c + j));
            r.d[j] = *reinterpret_cast<const u16*>(st + D + 16 * lr + 2 * (2 * c + j));
        }
    }
};
