// The RMSNorm producer shared by OP_ATTN_NORM, OP_FFN_NORM and OP_HEAD_NORM: superblocks of act_h from the stage's
// residual stream (VM: solvers._norm_into_act).
#pragma once
#include "mk_common.cuh"

// act_h superblocks [sb_begin, sb_end) = RMSNorm(x rows) * weight; `hidden` (if given) gets the f32 values too.
__device__ __noinline__ void norm_into_act(const Globals& g, int stage, const float* weight, int sb_begin, int sb_end,
                              float* hidden, Smem& s) {
    const int rows = stage_rows(g, stage), H = g.hidden_size;
    const float* x = stage_x(g, stage);
    float* inv = s.scratch;  // [MK_MAX_ROWS]
    float* vals = s.scratch + MK_MAX_ROWS;  // [rows][256]
    rows_inv_rms(x, rows, H, H, g.eps, inv, vals);  // vals is free until the values go in
    for (int sb = sb_begin; sb < sb_end; ++sb) {
        for (int o = ctid(); o < rows * QK_SB; o += MK_CONSUMER_THREADS) {
            const int t = o / QK_SB, k = sb * QK_SB + o % QK_SB;
            const float v = k < H ? ld_cg(x + (i64)t * H + k) * inv[t] * weight[k] : 0.f;
            vals[o] = v;
            if (hidden && k < H) hidden[(i64)t * H + k] = v;
        }
        consumers_sync();
        act_store(g.act_h, sb * QK_SB, QK_SB, rows, vals, QK_SB);
        if (g.act_h.q8) act8_store(g.act_h, sb, rows, vals, QK_SB);  // the int8 matmul's copy (MK_MV_I8)
        consumers_sync();
    }
}

// MK_NORM_IN_MATMUL (on; 0 is the A/B): at one row the norm groups (ATTN_NORM, FFN_NORM: 20 instructions of ~8 us
// and a group boundary each, 1.14 ms of the d = 0 cycle with 112 SMs waiting; bench/MEGAKERNEL.md round 8) do
// nothing, and each MIX_IN / FFN_UP instruction norms the stage's x into its SM's own act first (the VM mirrors it:
// solvers.py norm_in_matmul).
#ifndef MK_NORM_IN_MATMUL
#define MK_NORM_IN_MATMUL 1
#endif
// Superblocks of x a warp holds in registers while norm_into_own sums their squares: widths up to 8 x 4 x 256 =
// 8192 (wider models keep the norm groups; solvers.py NORM_OWN_MAX_WIDTH).
#define NORM_OWN_PER_WARP 4
// MK_TIME_NORM (a benchmark knob): TIME_FIRST at norm_into_own's sum of squares (1) or its end (2), not at the
// first matmul batch: the profile's `first` is then the norm's time.
#ifndef MK_TIME_NORM
#define MK_TIME_NORM 0
#endif
// Probes (timing only, wrong results): MK_NORM_PROBE & 1 skips the weight's loads, & 2 every store
#ifndef MK_NORM_PROBE
#define MK_NORM_PROBE 0
#endif
__device__ __forceinline__ bool norm_in_matmul(const Globals& g, int stage) {
    return MK_NORM_IN_MATMUL && g.hidden_size <= MK_CONSUMER_WARPS * NORM_OWN_PER_WARP * QK_SB &&
           stage_rows(g, stage) == 1;
}

// This SM's own act (Globals::act_own: [num_sms] acts of nsb superblocks; formats.py act_nbytes, act8_nbytes).
__device__ __forceinline__ ActRef own_act(const Globals& g) {
    ActRef a = g.act_own;
    const i64 sm = blockIdx.x, nsb = a.nsb;
    a.x16 += sm * nsb * 2048;
    a.x16_lo += sm * nsb * 2048;
    a.sums += sm * nsb * 64;
    a.sums_lo += sm * nsb * 64;
    if (a.q8) {
        a.q8 += sm * nsb * 4096;
        a.scale8 += sm * nsb * 16;
        a.sums8 += sm * nsb * 64;
        a.sums8_lo += sm * nsb * 64;
    }
    return a;
}

// Row 0 of the stage's x, RMSNorm(x) * weight, into this SM's own act: what norm_into_act and act8_store would
// write to act_h at one row (the f16 pair, its sub-block sums, the int8 levels of what the pair holds). Warp w
// takes superblocks w, w + 8, ..., lane l positions 8l .. 8l + 7 of each: every load of x and the weight is issued
// at once and kept in registers through the block's sum of squares (one L2 round trip and one barrier; a loop of
// them cost MIX_IN and FFN_UP ~8 us an instruction, round 8). Returns the act, ready for the matmuls (the barrier
// after the stores orders them before this block's reads, which go through L2 as the writes do).
__device__ __noinline__ ActRef norm_into_own(const Globals& g, int stage, const float* weight, Smem& s) {
    constexpr int PER = NORM_OWN_PER_WARP;
    const ActRef a = own_act(g);
    const int lane = threadIdx.x & 31, nsb = a.nsb;
    const float* x = stage_x(g, stage);
    float xv[PER][8], wv[PER][8], ss = 0.f;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int k0 = (cwarp() + MK_CONSUMER_WARPS * j) * QK_SB + 8 * lane;
        const bool in = k0 < nsb * QK_SB;  // the runner checks the width is a multiple of 256
#pragma unroll
        for (int e = 0; e < 8; e += 4) {
            float* xp = &xv[j][e];
            if (in) {
                ld_cg_f4(x + k0 + e, *reinterpret_cast<float(*)[4]>(xp));
                if (MK_NORM_PROBE & 1)
                    *reinterpret_cast<float4*>(&wv[j][e]) = make_float4(1.f, 1.f, 1.f, 1.f);
                else
                    *reinterpret_cast<float4*>(&wv[j][e]) = *reinterpret_cast<const float4*>(weight + k0 + e);
            } else {
#pragma unroll
                for (int t = 0; t < 4; ++t) xp[t] = wv[j][e + t] = 0.f;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < PER; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += xv[j][e] * xv[j][e];
    ss = warp_sum(ss);
    float* red = s.scratch;  // [MK_CONSUMER_WARPS]
    if (lane == 0) red[cwarp()] = ss;
    consumers_sync();
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < MK_CONSUMER_WARPS; ++w) total += red[w];
    const float inv = rsqrtf(total / g.hidden_size + g.eps);  // rows_inv_rms's form
    if (MK_TIME_NORM == 1) record_first(g);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int sb = cwarp() + MK_CONSUMER_WARPS * j, k0 = sb * QK_SB + 8 * lane;
        if (sb >= nsb) break;
        float v[8], mx = 0.f, sub = 0.f;
        u32 hi16[4], lo16[4];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float val = xv[j][e] * inv * wv[j][e];
            const f16 h = f32_to_f16(val), l = f32_to_f16(val - f16_to_f32(h));
            v[e] = f16_to_f32(h) + f16_to_f32(l);  // what the pair holds (act_held)
            sub += v[e];
            mx = fmaxf(mx, fabsf(v[e]));
            const u32 hb = h, lb = l;  // f16 is the bits (u16)
            if (e & 1) hi16[e >> 1] |= hb << 16, lo16[e >> 1] |= lb << 16;
            else hi16[e >> 1] = hb, lo16[e >> 1] = lb;
        }
        if (MK_NORM_PROBE & 2) {
            if (mx == 12345.f) a.x16[0] = hi16[0] + lo16[3];  // keeps the arithmetic
            continue;
        }
        // positions k0 .. k0 + 3 and k0 + 4 .. k0 + 7 are 4 consecutive f16 each in act_offset's order
        const i64 o0 = act_offset(k0, 0), o1 = act_offset(k0 + 4, 0);
        *reinterpret_cast<uint2*>(a.x16 + o0) = make_uint2(hi16[0], hi16[1]);
        *reinterpret_cast<uint2*>(a.x16 + o1) = make_uint2(hi16[2], hi16[3]);
        *reinterpret_cast<uint2*>(a.x16_lo + o0) = make_uint2(lo16[0], lo16[1]);
        *reinterpret_cast<uint2*>(a.x16_lo + o1) = make_uint2(lo16[2], lo16[3]);
        sub += __shfl_xor_sync(FULL_MASK, sub, 1);  // a sub-block's 32 positions are 4 lanes'
        sub += __shfl_xor_sync(FULL_MASK, sub, 2);
        if ((lane & 3) == 0) store_f16_pair(a.sums, a.sums_lo, (i64)sb * 64 + (lane >> 2), sub);
        if (!a.q8) continue;
        const Act8Levels lv(warp_max(mx));
        u32 qh4[2] = {0u, 0u}, ql4[2] = {0u, 0u};
        float seen = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float qh, ql;
            seen += lv.quantize(v[e], qh, ql);
            qh4[e >> 2] |= ((u32)(int)qh & 0xFFu) << (8 * (e & 3));
            ql4[e >> 2] |= ((u32)(int)ql & 0xFFu) << (8 * (e & 3));
        }
        i8* q = a.q8 + (i64)sb * 4096 + 64 * (lane >> 3) + 16 * (lane & 3) + 8 * ((lane >> 2) & 1);
        *reinterpret_cast<uint2*>(q) = make_uint2(qh4[0], qh4[1]);
        *reinterpret_cast<uint2*>(q + 2048) = make_uint2(ql4[0], ql4[1]);
        seen += __shfl_xor_sync(FULL_MASK, seen, 1);
        seen += __shfl_xor_sync(FULL_MASK, seen, 2);
        if ((lane & 3) == 0) store_f16_pair(a.sums8, a.sums8_lo, (i64)sb * 64 + (lane >> 2), seen);
        if (lane == 0) {
            a.scale8[(i64)sb * 16] = lv.s;
            a.scale8[(i64)sb * 16 + 8] = lv.s_lo;
        }
    }
    consumers_sync();
    if (MK_TIME_NORM == 2) record_first(g);
    return a;
}
