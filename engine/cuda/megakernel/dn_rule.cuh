// OP_DN_RULE: the gated delta rule of value heads [head_begin, head_end) of one DeltaNet layer: apply the last
// pass's accepted rows to the state (and store it: that is the commit), run this pass's rows from it without
// storing (which of them count is decided after the head), save their keys, values and gates for the next commit,
// and write RMSNorm(o) * ssm_norm * silu(z) into act_mix. VM: solvers.dn_rule.
#pragma once
#include "dn_common.cuh"

struct DnRuleOp {
    static constexpr int OPCODE = OP_DN_RULE;
    static constexpr int WAITS_ON = OP_MIX_IN;
    struct Parsed {
        int layer, head_begin, head_end;  // fields, in the order of instructions.py's DnRule
        __device__ explicit Parsed(const i32* w)
            : layer(w[INST_ARGS + 0]), head_begin(w[INST_ARGS + 1]), head_end(w[INST_ARGS + 2]) {}
    };
    struct Loader {  // the state is this head's own: it is read once, nothing to gain from a prefetch
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    // Row t's q, k (L2-normalised, q scaled) at this thread's state rows, v at its 4 columns, gate and beta for
    // head h.
    template <int KL, int COLS>
    static __device__ void inputs(const Globals& g, const LayerRefs& L, int h, int t,
                                  float (&q)[DnHead<KL, COLS>::RPT], float (&k)[DnHead<KL, COLS>::RPT],
                                  float (&v)[4], float& gt, float& bt) {
        using H = DnHead<KL, COLS>;
        const int C = g.conv_dim, hk = h % g.ssm_k_heads, key = g.ssm_k_heads * H::DK;
        const float* row = g.conv_out + (i64)t * C;
        float qs = 0.f, ks = 0.f;
#pragma unroll
        for (int i = 0; i < H::RPT; ++i) {
            q[i] = ld_cg(row + hk * H::DK + H::row(i));
            k[i] = ld_cg(row + key + hk * H::DK + H::row(i));
            qs += q[i] * q[i];
            ks += k[i] * k[i];
        }
        const float qn = rsqrtf(H::rows_sum(qs) + g.eps) * rsqrtf((float)H::DK), kn = rsqrtf(H::rows_sum(ks) + g.eps);
#pragma unroll
        for (int i = 0; i < H::RPT; ++i) {
            q[i] *= qn;
            k[i] *= kn;
        }
        ld_cg_f4(row + 2 * key + h * H::DV + H::col0(), v);
        const float* pr = g.proj + (i64)t * g.proj_width;
        gt = L.v[LV_SSM_A][h] * softplus_ref(ld_cg(pr + g.off_alpha + h) + L.v[LV_SSM_DT][h]);
        bt = sigmoid_ref(ld_cg(pr + g.off_beta + h));
    }
    template <int KL, int COLS>
    static __device__ void save(const Globals& g, const LayerRefs& L, int h, int t,
                                const float (&k)[DnHead<KL, COLS>::RPT], const float (&v)[4], float gt, float bt) {
        using H = DnHead<KL, COLS>;
        const int hv = g.ssm_v_heads;
        if (cwarp() == 0 && H::cg() == 0)  // one lane per row holds its key
#pragma unroll
            for (int i = 0; i < H::RPT; ++i) static_cast<float*>(L.s[LS_RK])[((i64)t * hv + h) * H::DK + H::row(i)] = k[i];
        if (H::rg() == 0)  // one lane per column group holds its values
            *reinterpret_cast<float4*>(static_cast<float*>(L.s[LS_RV]) + ((i64)t * hv + h) * H::DV + H::col0()) =
                make_float4(v[0], v[1], v[2], v[3]);
        if (cwarp() == 0 && (threadIdx.x & 31) == 0) {
            static_cast<float*>(L.s[LS_RG])[(i64)t * hv + h] = gt;
            static_cast<float*>(L.s[LS_RB])[(i64)t * hv + h] = bt;
        }
    }
    struct Storer {  // gated RMSNorm of the head's outputs o_s [rows][Dv] into act_mix
        static __device__ void run(const Globals& g, const LayerRefs& L, int h, int rows, float* o_s, Smem& s) {
            const int lane = threadIdx.x & 31, dv = g.ssm_dv;
            float* inv = o_s + MK_MAX_ROWS * dv;
            float* vals = inv + MK_MAX_ROWS;
            for (int t = cwarp(); t < rows; t += MK_CONSUMER_WARPS) {
                float ss = 0.f;
                for (int c = lane; c < dv; c += 32) ss += o_s[t * dv + c] * o_s[t * dv + c];
                ss = warp_sum(ss);
                if (lane == 0) inv[t] = rsqrtf(ss / dv + g.eps);
            }
            consumers_sync();
            for (int o = ctid(); o < rows * dv; o += MK_CONSUMER_THREADS) {
                const int t = o / dv, c = o % dv;
                const float z = ld_cg(g.proj + (i64)t * g.proj_width + g.off_gate + h * dv + c);
                vals[o] = o_s[o] * inv[t] * L.v[LV_SSM_NORM][c] * silu_ref(z);
            }
            consumers_sync();
            ActRef mix = g.act_mix;  // this layer's written width: act8_fill closes superblocks inside it
            mix.width = g.ssm_v_heads * dv;
            act_store(mix, h * dv, dv, rows, vals, dv);
            consumers_sync();
        }
    };
    struct Consumer {
        template <int KL, int COLS>
        static __device__ void head(const Globals& g, const LayerRefs& L, int h, int rows, Smem& s) {
            DnHead<KL, COLS> st;
            float* ssm = static_cast<float*>(L.s[LS_SSM]);
            st.load(ssm, h);
            const int n_prev = ctl_get(g, CTL_COMMIT_N);
            dn_replay<KL, COLS>(g, L, h, n_prev, st);
            if (n_prev > 0) st.store(ssm, h);
            consumers_sync();  // every warp has read the saved rows before warp 0 overwrites them
            float* o_s = s.scratch;
            using H = DnHead<KL, COLS>;
            for (int t = 0; t < rows; ++t) {
                float q[H::RPT], k[H::RPT], v[4], o[4], gt, bt;
                inputs<KL, COLS>(g, L, h, t, q, k, v, gt, bt);
                save<KL, COLS>(g, L, h, t, k, v, gt, bt);
                st.update(k, v, gt, bt);
                st.output(q, o);
                if (H::rg() == 0) *reinterpret_cast<float4*>(o_s + t * H::DV + H::col0()) = make_float4(o[0], o[1], o[2], o[3]);
            }
            consumers_sync();
            Storer::run(g, L, h, rows, o_s, s);
        }
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const LayerRefs& L = layer_refs(g, p.layer);
            const int rows = stage_rows(g, stage);
            for (int h = p.head_begin; h < p.head_end; ++h)
                dn_dispatch(g, [&](auto tag) {
                    using Head = decltype(tag);
                    head<Head::ROWS_PER_LANE, Head::COLS_PER_WARP>(g, L, h, rows, s);
                });
        }
    };
};
