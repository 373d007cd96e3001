// OP_MTP_IN: act_eh superblocks [sb_begin, sb_end) of [RMSNorm(embed(token)) * enorm | RMSNorm(hidden) * hnorm] for
// the rows of the MTP pass: in step 0 the committed rows' tokens with the trunk hidden of the row before (the last
// committed hidden for row 0), plus the new pending token; in step s the draft of step s - 1 with that step's
// output. VM: solvers.mtp_in.
#pragma once
#include "dequant.cuh"

struct MtpInOp {
    static constexpr int OPCODE = OP_MTP_IN;
    static constexpr int WAITS_ON = OP_VERIFY;  // or OP_DRAFT_PICK of the previous step
    struct Parsed {
        int sb_begin, sb_end;  // fields, in the order of instructions.py's MtpIn
        __device__ explicit Parsed(const i32* w) : sb_begin(w[INST_ARGS + 0]), sb_end(w[INST_ARGS + 1]) {}
    };
    struct Loader {
        static __device__ void run(const Globals& g, const Parsed& p) {}
    };
    // Row t's token and the hidden state it is paired with.
    static __device__ void row_inputs(const Globals& g, int step, int t, int& token, const float*& hidden) {
        const int H = g.hidden_size;
        if (step == 0) {
            token = ctl_get(g, CTL_MTP_IDS + t);
            hidden = t == 0 ? g.last_hidden : g.hidden + (i64)(t - 1) * H;
        } else {
            token = ctl_get(g, CTL_DRAFTS + step - 1);
            hidden = g.mtp_hidden + (i64)(step == 1 ? ctl_get(g, CTL_MTP_ROWS) - 1 : 0) * H;
        }
    }
    // 1/rms of row t's embedding (item even) or hidden (item odd), a warp per item; the embedding row is
    // dequantised 256 values at a time through the warp's buffer.
    static __device__ float inv_rms(const Globals& g, int step, int item, float* buf) {
        const int H = g.hidden_size, lane = threadIdx.x & 31;
        int token;
        const float* hidden;
        row_inputs(g, step, item >> 1, token, hidden);
        float ss = 0.f;
        for (int k0 = 0; k0 < H; k0 += QK_SB) {
            if (item & 1) {
                for (int k = k0 + lane; k < min(k0 + QK_SB, H); k += 32) ss += ld_cg(hidden + k) * ld_cg(hidden + k);
                continue;
            }
            weight_row(g, g.mtp_embd, token, k0, min(k0 + QK_SB, H), buf, 32, lane);
            __syncwarp();
            for (int k = lane; k < min(QK_SB, H - k0); k += 32) ss += buf[k] * buf[k];
            __syncwarp();
        }
        return rsqrtf(warp_sum(ss) / H + g.eps);
    }
    struct Consumer {
        static __device__ void run(const Globals& g, const Parsed& p, int stage, Smem& s) {
            const LayerRefs& L = layer_refs(g, g.num_layers);
            const int rows = stage_rows(g, stage), step = mtp_step(g, stage), H = g.hidden_size;
            float* inv = s.scratch;                            // [2][MK_MAX_ROWS]: embedding, hidden
            float* bufs = s.scratch + 2 * MK_MAX_ROWS;         // [8 warps][256]
            float* vals = bufs + MK_CONSUMER_WARPS * QK_SB;    // [rows][256]
            for (int item = cwarp(); item < 2 * rows; item += MK_CONSUMER_WARPS) {
                const float v = inv_rms(g, step, item, bufs + cwarp() * QK_SB);
                if ((threadIdx.x & 31) == 0) inv[(item & 1) * MK_MAX_ROWS + (item >> 1)] = v;
            }
            consumers_sync();
            for (int sb = p.sb_begin; sb < p.sb_end; ++sb) {
                const int k0 = sb * QK_SB;
                for (int t = 0; t < rows; ++t) {
                    int token;
                    const float* hidden;
                    row_inputs(g, step, t, token, hidden);
                    if (k0 < H) {  // the embedding half (H is a multiple of 256)
                        weight_row(g, g.mtp_embd, token, k0, k0 + QK_SB, vals + t * QK_SB, MK_CONSUMER_THREADS, ctid());
                        consumers_sync();
                        const int k = k0 + ctid();
                        vals[t * QK_SB + ctid()] *= inv[t] * L.v[LV_ENORM][k];
                    } else {
                        const int k = k0 - H + ctid();
                        vals[t * QK_SB + ctid()] = ld_cg(hidden + k) * inv[MK_MAX_ROWS + t] * L.v[LV_HNORM][k];
                    }
                }
                consumers_sync();
                act_store(g.act_eh, k0, QK_SB, rows, vals, QK_SB);
                consumers_sync();
            }
        }
    };
};
