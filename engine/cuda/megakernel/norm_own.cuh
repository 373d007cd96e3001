// The one-row norm inside the matmuls that read act_h (MIX_IN, FFN_UP): each instruction forms RMSNorm(x) *
// weight itself, so ATTN_NORM / FFN_NORM do nothing at one row (VM: solvers.py norm_in_matmul, _matmul_input).
#pragma once
#include "matvec.cuh"

// MK_NORM_IN_MATMUL=1 (a knob, off by default until it wins; bench/MEGAKERNEL.md round 8): the norm groups
// (ATTN_NORM, FFN_NORM: 20 instructions of ~8 us and a group boundary each, 1.19 ms of the d = 0 cycle with 112
// SMs waiting) do nothing at one row. Measured with every level stored to L2 and read back: the groups' steps
// fell 1.19 -> 0.38 ms but MIX_IN / FFN_UP gained 7-10 us an instruction (13.60 against 12.89 ms), ~4-6 us of it
// the stores (without them 12.60); hence the levels in shared memory below (MK_NORM_SMEM).
#ifndef MK_NORM_IN_MATMUL
#define MK_NORM_IN_MATMUL 0
#endif
// MK_NORM_SMEM (on with MK_NORM_IN_MATMUL): an instruction whose every matmul takes one row's int8 levels from the
// batch's shared area (A8_SMEM) gets them written there, nothing to L2; the others (Q8_0 / Q5_0 tiles: f16
// activations) write the SM's own act in L2.
#ifndef MK_NORM_SMEM
#define MK_NORM_SMEM 1
#endif
// Superblocks of x a warp holds in registers while norm_into_own sums their squares: widths up to 8 x 4 x 256 =
// 8192 (wider models keep the norm groups; solvers.py NORM_OWN_MAX_WIDTH).
#define NORM_OWN_PER_WARP 4
// MK_TIME_NORM (a benchmark knob): TIME_FIRST at norm_into_own's sum of squares (1) or its end (2), not at the
// first matmul batch: the profile's `first` is then the norm's time.
#ifndef MK_TIME_NORM
#define MK_TIME_NORM 0
#endif

__device__ __forceinline__ bool norm_in_matmul(const Globals& g, int stage) {
    return MK_NORM_IN_MATMUL && g.hidden_size <= MK_CONSUMER_WARPS * NORM_OWN_PER_WARP * QK_SB &&
           stage_rows(g, stage) == 1;
}

// Whether the rows from row_begin of w at one row take their int8 levels from the batch's shared area in one
// chunk (mv_rows, mv_staged_kind's A8_SMEM), so norm_into_own may put them there.
__device__ __forceinline__ bool levels_from_smem(const Globals& g, const WeightRef& w, int row_begin) {
    return MK_NORM_SMEM && g.act_own.q8 && mv_staged(w, row_begin) && mv_act8_smem(w.qtype, 1, true) &&
           w.cols / QK_SB <= MK_ACT8_MAX_SB;
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

// One superblock's int8 levels of row 0 (lane l's positions 8l .. 8l + 7) as Act8Stage::copy_all would have
// copied them from the act's int8 copy to the batch's area at st.
__device__ __forceinline__ void levels_to_smem(u8* st, const Act8Lane& q, int lane) {
    u8* at = st + Act8Stage::SLOTS + 64 * (lane >> 3) + 16 * (lane & 3) + 8 * ((lane >> 2) & 1);
    *reinterpret_cast<uint2*>(at) = make_uint2(q.hi[0], q.hi[1]);
    *reinterpret_cast<uint2*>(at + I8_SLOT_PITCH) = make_uint2(q.lo[0], q.lo[1]);
    if ((lane & 3) == 0) {
        f16* sums = reinterpret_cast<f16*>(st + Act8Stage::SUMS);
        const f16 h = f32_to_f16(q.sub);
        sums[lane >> 2] = h;
        sums[8 + (lane >> 2)] = f32_to_f16(q.sub - f16_to_f32(h));
    }
    if (lane < 8)  // rows 0-3 of each level; rows 1-3 zero
        reinterpret_cast<float*>(st + Act8Stage::SCALES)[lane] = lane == 0 ? q.lv.s : lane == 4 ? q.lv.s_lo : 0.f;
}

// Row 0 of the stage's x, RMSNorm(x) * weight, for this instruction's matmuls: with `smem`, the int8 levels
// straight into the batch's shared area (the returned act says so: in_smem); else this SM's own act in L2, what
// norm_into_act and act8_store would write to act_h at one row (the f16 pair, its sub-block sums, the int8 levels
// of what the pair holds). Warp w takes superblocks w, w + 8, ..., lane l positions 8l .. 8l + 7 of each: every
// load of x and the weight is issued at once and held in registers through the block's sum of squares (one L2
// round trip and one barrier). The barrier at the end orders the stores before the matmuls' reads (through L2,
// as the writes go).
__device__ __noinline__ ActRef norm_into_own(const Globals& g, int stage, const float* weight, bool smem, Smem& s) {
    constexpr int PER = NORM_OWN_PER_WARP;
    ActRef a = own_act(g);
    a.in_smem = smem;
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
        if (!smem) {  // positions k0 .. k0 + 3 and k0 + 4 .. k0 + 7: 4 consecutive f16 each in act_offset's order
            const i64 o0 = act_offset(k0, 0), o1 = act_offset(k0 + 4, 0);
            *reinterpret_cast<uint2*>(a.x16 + o0) = make_uint2(hi16[0], hi16[1]);
            *reinterpret_cast<uint2*>(a.x16 + o1) = make_uint2(hi16[2], hi16[3]);
            *reinterpret_cast<uint2*>(a.x16_lo + o0) = make_uint2(lo16[0], lo16[1]);
            *reinterpret_cast<uint2*>(a.x16_lo + o1) = make_uint2(lo16[2], lo16[3]);
            sub += __shfl_xor_sync(FULL_MASK, sub, 1);  // a sub-block's 32 positions are 4 lanes'
            sub += __shfl_xor_sync(FULL_MASK, sub, 2);
            if ((lane & 3) == 0) store_f16_pair(a.sums, a.sums_lo, (i64)sb * 64 + (lane >> 2), sub);
        }
        if (!a.q8) continue;
        const Act8Lane q(v, mx);
        if (smem)
            levels_to_smem(reinterpret_cast<u8*>(s.scratch) + MK_RING_OFFSET + sb * Act8Stage::BYTES, q, lane);
        else
            q.store(a, sb, 0, lane);
    }
    consumers_sync();
    if (MK_TIME_NORM == 2) record_first(g);
    return a;
}
