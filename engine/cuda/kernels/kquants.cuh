// The K-quant weight formats (Q4_K, Q5_K, Q6_K) on the device: see quants.cuh for the layout and fragment order.
#pragma once
#include "quants.cuh"

// Scale and min of sub-blocks 2c and 2c+1 of a Q4_K/Q5_K block, each as a byte pair (low byte = sub-block 2c).
__device__ __forceinline__ void k4_scale_pairs(u32 s0, u32 s1, u32 s2, int c, u32& sc, u32& mn) {
    const u32 sh = 16u * (c & 1);
    const u32 sc_a = (s0 >> sh) & 0x3F3Fu, mn_a = (s1 >> sh) & 0x3F3Fu;
    const u32 sc_b = ((s2 >> sh) & 0x0F0Fu) | ((s0 >> (sh + 2)) & 0x3030u);
    const u32 mn_b = ((s2 >> (sh + 4)) & 0x0F0Fu) | ((s1 >> (sh + 2)) & 0x3030u);
    sc = c >= 2 ? sc_b : sc_a;
    mn = c >= 2 ? mn_b : mn_a;
}

// Full-dequantization constants of sub-blocks 2c, 2c+1 (dup'ed f16x2): scale d sc, and the offset
// centre d sc - dmin m of a weight whose quant is taken relative to `centre`.
__device__ __forceinline__ void k4_full_consts(u32 sc, u32 mn, u32 dm, float centre, u32& lo_s, u32& hi_s, u32& lo_c,
                                               u32& hi_c) {
    const float d = f16_to_f32((f16)(dm & 0xFFFFu)), dmin = f16_to_f32((f16)(dm >> 16));
    const float s0 = d * (float)(sc & 0xFF), s1 = d * (float)(sc >> 8);
    const float c0 = centre * s0 - dmin * (float)(mn & 0xFF), c1 = centre * s1 - dmin * (float)(mn >> 8);
    lo_s = dup_lo(pack_f16x2(s0, s0));
    hi_s = dup_lo(pack_f16x2(s1, s1));
    lo_c = dup_lo(pack_f16x2(c0, c0));
    hi_c = dup_lo(pack_f16x2(c1, c1));
}

// ---------------------------------------------------------------- Q4_K
// Lane c: the 32-byte chunk c of qs; byte l: low nibble -> 64c + l (sub-block 2c), high -> 64c + 32 + l (2c + 1).
template <> struct QTraits<QT_Q4_K> {
    static constexpr int MIN_BLOCKS = 2;  // mmvq blocks per SM the register budget targets
    static constexpr int QK = 256;
    static constexpr bool BLOCK_SCALE = true, HAS_MIN = true;
    struct Row { uint4 q[2]; u32 s[3]; u32 dm; };
    struct Consts { u32 lo_s, lo_b, hi_s, hi_b, mins; };
    static __device__ __forceinline__ Planes planes(const u8* w, u64 ntot) { return make_planes(w, ntot, 128, 0, 0); }
    static __device__ __forceinline__ void load(Row& r, const Planes& P, int nb, int row, int sb, int c) {
        const u32 idx = (u32)row * nb + sb;
        const u8* qs = P.p[0] + (u64)idx * 128 + 32 * c;
        r.q[0] = ld_stream_u4(qs);
        r.q[1] = ld_stream_u4(qs + 16);
        const u8* sc = tile_scales(P.p[1], nb, row, sb);
        r.s[0] = ld_stream_u32(sc);
        r.s[1] = ld_stream_u32(sc + 4);
        r.s[2] = ld_stream_u32(sc + 8);
        r.dm = ld_stream_u32(tile_dm(P.p[1], nb, row, sb));
    }
    static __device__ __forceinline__ void prepare(const Row& r, int c, Consts& k) {
        u32 sc, mn;
        k4_scale_pairs(r.s[0], r.s[1], r.s[2], c, sc, mn);
        const u32 sch = bytes01_to_h2(sc);
        k.lo_s = dup_lo(sch);                          // low nibbles: q + 1024
        k.lo_b = hmul2(k.lo_s, H2_NEG1024);
        k.hi_s = hmul2(dup_hi(sch), H2_SIXTEENTH);     // high nibbles: 16 q + 1024
        k.hi_b = hmul2(dup_hi(sch), H2_NEG64);
        k.mins = bytes01_to_h2(mn);  // m of both sub-blocks, exact (dmin is applied in f32 after the mma)
    }
    static __device__ __forceinline__ float dscale(const Row& r) { return f16_to_f32((f16)(r.dm & 0xFFFFu)); }
    static __device__ __forceinline__ float mscale(const Row& r) { return f16_to_f32((f16)(r.dm >> 16)); }
    // full dequantization, centred so that no rounding is amplified: w = (d sc) (q - 8) + (8 d sc - dmin m), with
    // d sc and the per-sub-block constant rounded to f16 once each
    struct FullConsts { u32 lo_s, hi_s, lo_c, hi_c; };
    static __device__ __forceinline__ void prepare_full(const Row& r, int c, FullConsts& k) {
        u32 sc, mn;
        k4_scale_pairs(r.s[0], r.s[1], r.s[2], c, sc, mn);
        k4_full_consts(sc, mn, r.dm, 8.f, k.lo_s, k.hi_s, k.lo_c, k.hi_c);
        k.hi_s = hmul2(k.hi_s, H2_SIXTEENTH);  // the high nibbles arrive as 16 (q - 8)
    }
    static __device__ __forceinline__ void frag_full(const Row& r, const FullConsts& k, int c, int s, u32& a0, u32& a2) {
        const int i = s >> 1;
        const u32 w = pair_bytes(word_at(r.q[i >> 2], i & 3));
        if ((s & 1) == 0) {
            a0 = hfma2(hsub2(and_or(w, 0x000F000Fu, H2_1024), H2_1032), k.lo_s, k.lo_c);
            a2 = hfma2(hsub2(and_or(w >> 8, 0x000F000Fu, H2_1024), H2_1032), k.lo_s, k.lo_c);
        } else {
            a0 = hfma2(hsub2(and_or(w, 0x00F000F0u, H2_1024), H2_1152), k.hi_s, k.hi_c);
            a2 = hfma2(hsub2(and_or(w >> 8, 0x00F000F0u, H2_1024), H2_1152), k.hi_s, k.hi_c);
        }
    }
    static __device__ __forceinline__ void frag(const Row& r, const Consts& k, int c, int s, u32& a0, u32& a2) {
        const int i = s >> 1;
        const u32 w = pair_bytes(word_at(r.q[i >> 2], i & 3));
        if ((s & 1) == 0) {
            a0 = hfma2(and_or(w, 0x000F000Fu, H2_1024), k.lo_s, k.lo_b);
            a2 = hfma2(and_or(w >> 8, 0x000F000Fu, H2_1024), k.lo_s, k.lo_b);
        } else {
            a0 = hfma2(and_or(w, 0x00F000F0u, H2_1024), k.hi_s, k.hi_b);
            a2 = hfma2(and_or(w >> 8, 0x00F000F0u, H2_1024), k.hi_s, k.hi_b);
        }
    }
};

// ---------------------------------------------------------------- Q5_K
// As Q4_K; the fifth bit of positions 64c + l and 64c + 32 + l is bit 2c (resp. 2c + 1) of qh[l].
template <> struct QTraits<QT_Q5_K> {
    static constexpr int MIN_BLOCKS = 1;  // mmvq blocks per SM the register budget targets
    static constexpr int QK = 256;
    static constexpr bool BLOCK_SCALE = true, HAS_MIN = true;
    struct Row { uint4 q[2]; uint4 qh[2]; u32 s[3]; u32 dm; };
    struct Consts { u32 lo_s, lo_b, hi_s, hi_b, mins; };
    static __device__ __forceinline__ Planes planes(const u8* w, u64 ntot) { return make_planes(w, ntot, 128, 160, 0); }
    static __device__ __forceinline__ void load(Row& r, const Planes& P, int nb, int row, int sb, int c) {
        const u32 idx = (u32)row * nb + sb;
        const u8* qs = P.p[0] + (u64)idx * 128 + 32 * c;
        r.q[0] = ld_stream_u4(qs);
        r.q[1] = ld_stream_u4(qs + 16);
        const u8* qh = P.p[1] + (u64)idx * 32;
        r.qh[0] = ld_stream_u4(qh);
        r.qh[1] = ld_stream_u4(qh + 16);
        const u8* sc = tile_scales(P.p[2], nb, row, sb);
        r.s[0] = ld_stream_u32(sc);
        r.s[1] = ld_stream_u32(sc + 4);
        r.s[2] = ld_stream_u32(sc + 8);
        r.dm = ld_stream_u32(tile_dm(P.p[2], nb, row, sb));
    }
    static __device__ __forceinline__ void prepare(const Row& r, int c, Consts& k) {
        u32 sc, mn;
        k4_scale_pairs(r.s[0], r.s[1], r.s[2], c, sc, mn);
        const u32 sch = bytes01_to_h2(sc);
        k.lo_s = dup_lo(sch);
        k.lo_b = hmul2(k.lo_s, H2_NEG1024);
        k.hi_s = dup_hi(sch);
        k.hi_b = hmul2(k.hi_s, H2_NEG1024);
        k.mins = bytes01_to_h2(mn);
    }
    static __device__ __forceinline__ float dscale(const Row& r) { return f16_to_f32((f16)(r.dm & 0xFFFFu)); }
    static __device__ __forceinline__ float mscale(const Row& r) { return f16_to_f32((f16)(r.dm >> 16)); }
    struct FullConsts { u32 lo_s, hi_s, lo_c, hi_c; };  // as Q4_K's, centred at 16
    static __device__ __forceinline__ void prepare_full(const Row& r, int c, FullConsts& k) {
        u32 sc, mn;
        k4_scale_pairs(r.s[0], r.s[1], r.s[2], c, sc, mn);
        k4_full_consts(sc, mn, r.dm, 16.f, k.lo_s, k.hi_s, k.lo_c, k.hi_c);
    }
    static __device__ __forceinline__ void frag_full(const Row& r, const FullConsts& k, int c, int s, u32& a0, u32& a2) {
        const int i = s >> 1, h = s & 1;
        const u32 w = word_at(r.q[i >> 2], i & 3), hw = word_at(r.qh[i >> 2], i & 3);
        const u32 hbit = ((hw >> (2 * c + h)) & 0x01010101u) << 4;
        const u32 v = pair_bytes(((h ? w >> 4 : w) & 0x0F0F0F0Fu) | hbit);
        const u32 sc = h ? k.hi_s : k.lo_s, cc = h ? k.hi_c : k.lo_c;
        a0 = hfma2(hsub2(and_or(v, 0x00FF00FFu, H2_1024), H2_1040), sc, cc);
        a2 = hfma2(hsub2(and_or(v >> 8, 0x00FF00FFu, H2_1024), H2_1040), sc, cc);
    }
    static __device__ __forceinline__ void frag(const Row& r, const Consts& k, int c, int s, u32& a0, u32& a2) {
        const int i = s >> 1, h = s & 1;
        const u32 w = word_at(r.q[i >> 2], i & 3), hw = word_at(r.qh[i >> 2], i & 3);
        const u32 hbit = ((hw >> (2 * c + h)) & 0x01010101u) << 4;
        const u32 v = pair_bytes(((h ? w >> 4 : w) & 0x0F0F0F0Fu) | hbit);
        const u32 sc = h ? k.hi_s : k.lo_s, bias = h ? k.hi_b : k.lo_b;
        a0 = hfma2(and_or(v, 0x00FF00FFu, H2_1024), sc, bias);
        a2 = hfma2(and_or(v >> 8, 0x00FF00FFu, H2_1024), sc, bias);
    }
};

// ---------------------------------------------------------------- Q6_K (regrouped, see repack.py)
// ql' chunk c (32 bytes), byte l: low nibble -> 64c + l, high -> 64c + 32 + l. qh' chunk c (16 bytes), byte l:
// bit pairs (0-1, 2-3, 4-5, 6-7) -> positions 64c + l, 64c + 32 + l, 64c + 16 + l, 64c + 48 + l. The 16-wide
// sub-block scales stay in place: lane c uses scales 4c .. 4c + 3.
template <> struct QTraits<QT_Q6_K> {
    static constexpr int MIN_BLOCKS = 2;  // mmvq blocks per SM the register budget targets
    static constexpr int QK = 256;
    static constexpr bool BLOCK_SCALE = true, HAS_MIN = false;
    struct Row { uint4 q[2]; uint4 qh; u32 sc; u32 d; };
    struct Consts { u32 s[4]; };  // scale of positions 64c + 16 m .. + 15, m = 0..3
    static __device__ __forceinline__ Planes planes(const u8* w, u64 ntot) { return make_planes(w, ntot, 128, 192, 208); }
    static __device__ __forceinline__ void load(Row& r, const Planes& P, int nb, int row, int sb, int c) {
        const u32 idx = (u32)row * nb + sb;
        const u8* ql = P.p[0] + (u64)idx * 128 + 32 * c;
        r.q[0] = ld_stream_u4(ql);
        r.q[1] = ld_stream_u4(ql + 16);
        r.qh = ld_stream_u4(P.p[1] + (u64)idx * 64 + 16 * c);
        r.sc = ld_stream_u32(P.p[2] + (u64)idx * 16 + 4 * c);
        r.d = ld_stream_u16(P.p[3] + (u64)idx * 2);
    }
    static __device__ __forceinline__ void prepare(const Row& r, int c, Consts& k) {
        // int8 scales b: (b ^ 0x80) = b + 128 as 1024 + (b + 128), minus 1152 -> b exactly
        const u32 u = r.sc ^ 0x80808080u;
        const u32 lo2 = hsub2(prmt(u, 0x64646464u, 0x4140), H2_1152);
        const u32 hi2 = hsub2(prmt(u, 0x64646464u, 0x4342), H2_1152);
        k.s[0] = dup_lo(lo2);
        k.s[1] = dup_hi(lo2);
        k.s[2] = dup_lo(hi2);
        k.s[3] = dup_hi(hi2);
    }
    static __device__ __forceinline__ float dscale(const Row& r) { return f16_to_f32((f16)r.d); }
    using FullConsts = Consts;  // the sub-scales times d
    static __device__ __forceinline__ void prepare_full(const Row& r, int c, FullConsts& k) {
        prepare(r, c, k);
        const u32 d2 = dup_lo(r.d);
#pragma unroll
        for (int j = 0; j < 4; ++j) k.s[j] = hmul2(k.s[j], d2);
    }
    static __device__ __forceinline__ void frag_full(const Row& r, const FullConsts& k, int c, int s, u32& a0, u32& a2) {
        frag(r, k, c, s, a0, a2);
    }
    static __device__ __forceinline__ void frag(const Row& r, const Consts& k, int c, int s, u32& a0, u32& a2) {
        const int i = s >> 1, h = s & 1;
        const u32 w = word_at(r.q[i >> 2], i & 3), hw = word_at(r.qh, i & 3);
        const u32 hbits = ((hw >> (4 * (i >> 2) + 2 * h)) & 0x03030303u) << 4;
        const u32 v = pair_bytes(((h ? w >> 4 : w) & 0x0F0F0F0Fu) | hbits);
        const u32 sc = k.s[2 * h + (i >> 2)];
        a0 = hmul2(hsub2(and_or(v, 0x00FF00FFu, H2_1024), H2_1056), sc);  // (q - 32) * scale
        a2 = hmul2(hsub2(and_or(v >> 8, 0x00FF00FFu, H2_1024), H2_1056), sc);
    }
};
