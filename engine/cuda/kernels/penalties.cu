// Penalties on the verify rows' logits in place, before choose_rows picks their tokens (engine/cuda/backend.py
// verify_choose; engine/cuda/penalties.py keeps the sequence's counts): engine/sampling.py apply_penalties exactly.
// Repetition over prompt + history: a positive logit divided by the penalty, a negative one multiplied, in float32
// with the penalty rounded to float32 (numpy's weak Python scalar). Frequency and presence over history only:
// z - (frequency * count + presence), each step rounded in float64 and the result to float32, as numpy's in-place
// subtract of a float64 array from float32 logits rounds. Row t's history is the sequence's generated tokens and
// drafts 0..t-1 (engine/spec/verify.py _history).
//
// The sequence's tokens live in one word a vocabulary entry (marks): the count of generated tokens in bits 0-30,
// bit 31 where the prompt holds the token. A token neither seen nor drafted keeps its logits untouched (most of the
// vocabulary: only marks are read for it).
#include "common.cuh"

#define PENALTY_THREADS 256
#define PENALTY_PROMPT_BIT 0x80000000u  // engine/cuda/penalties.py PROMPT_BIT

// marks[tokens[i]] += 1 for the generated tokens the sequence grew by since the last verify pass.
__global__ void __launch_bounds__(PENALTY_THREADS)
penalty_count(u32* __restrict__ marks, const i32* __restrict__ tokens, int num_tokens) {
    PDL_ENTER();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < num_tokens; i += gridDim.x * blockDim.x)
        atomicAdd(&marks[tokens[i]], 1u);  // a token may come twice
}

// One token's logit with its penalties; count > 0 or in_prompt (the caller skips the rest).
__device__ __forceinline__ float penalize(float z, int count, bool in_prompt, float repetition, double frequency,
                                          double presence) {
    if (repetition != 1.f && (in_prompt || count > 0)) {
        z = z > 0.f ? __fdiv_rn(z, repetition) : __fmul_rn(z, repetition);  // NaN > 0 is false: NaN stays
    }
    if (count > 0 && (frequency != 0.0 || presence != 0.0)) {
        // intrinsics: a contracted fma would round frequency * count only once, as numpy does not
        const double sub = __dadd_rn(__dmul_rn(frequency, (double)count), presence);
        z = __double2float_rn(__dsub_rn((double)z, sub));
    }
    return z;
}

// Grid ceil(V / PENALTY_THREADS): a thread owns token k in every row, its count grown by each draft equal to k as
// the rows pass it. drafts[t] for t < num_rows - 1 (the last row's slot holds -1).
__global__ void __launch_bounds__(PENALTY_THREADS)
penalize_rows(float* __restrict__ logits, int V, int ld, int num_rows, const u32* __restrict__ marks,
              const i32* __restrict__ drafts, float repetition, double frequency, double presence) {
    PDL_ENTER();
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= V) return;
    const u32 m = marks[k];
    const bool in_prompt = (m & PENALTY_PROMPT_BIT) != 0;
    int count = (int)(m & ~PENALTY_PROMPT_BIT);
    for (int t = 0; t < num_rows; ++t) {
        if (count > 0 || (in_prompt && repetition != 1.f)) {
            float* z = logits + (i64)t * ld + k;
            *z = penalize(*z, count, in_prompt, repetition, frequency, presence);
        }
        if (t + 1 < num_rows && drafts[t] == k) ++count;  // row t + 1's history holds draft t
    }
}
