// llamacpp_logits: llama.cpp's logits (or greedy tokens) for fixed token ids, for bench/compare_llamacpp.py.
//
//   llamacpp_logits logits MODEL IDS OUT [exact]    decode IDS in one batch with an output at every position and
//                                                   write int32 T, int32 V, then float32 logits [T, V] to OUT
//   llamacpp_logits greedy MODEL IDS N OUT [exact]  decode IDS, then generate up to N tokens by argmax (lowest id
//                                                   on ties, stopping after an end-of-generation token); write
//                                                   their ids to OUT, one per line
//
// IDS is a text file of whitespace-separated token ids. CPU, 2 threads. By default the context is llama.cpp's
// default one (F16 KV cache, flash attention when the backend picks it); `exact` asks for an F32 KV cache and no
// flash attention, so that on a file with F32 weights llama.cpp computes in float32 throughout.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static std::vector<llama_token> read_ids(const char * path) {
    std::ifstream in(path);
    std::vector<llama_token> ids;
    long value;
    while (in >> value) {
        ids.push_back((llama_token) value);
    }
    return ids;
}

// Decode tokens at positions pos.. in one batch; outputs at every position when all_logits, else at the last.
static bool decode(llama_context * ctx, const std::vector<llama_token> & tokens, int pos, bool all_logits) {
    llama_batch batch = llama_batch_init((int32_t) tokens.size(), 0, 1);
    for (size_t i = 0; i < tokens.size(); i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = pos + (llama_pos) i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = all_logits || i + 1 == tokens.size();
    }
    batch.n_tokens = (int32_t) tokens.size();
    int rc = llama_decode(ctx, batch);
    llama_batch_free(batch);
    if (rc != 0) {
        fprintf(stderr, "llama_decode failed with %d\n", rc);
    }
    return rc == 0;
}

static llama_token argmax(const float * logits, int n_vocab) {
    llama_token best = 0;
    for (int v = 1; v < n_vocab; v++) {
        if (logits[v] > logits[best]) {
            best = v;
        }
    }
    return best;
}

static int write_logits(llama_context * ctx, int n_tokens, int n_vocab, const char * out_path) {
    FILE * out = fopen(out_path, "wb");
    if (!out) {
        fprintf(stderr, "cannot write %s\n", out_path);
        return 1;
    }
    int32_t header[2] = {n_tokens, n_vocab};
    fwrite(header, sizeof(int32_t), 2, out);
    for (int i = 0; i < n_tokens; i++) {
        fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, out);
    }
    return fclose(out) == 0 ? 0 : 1;
}

static int run_greedy(llama_context * ctx, const llama_vocab * vocab, std::vector<llama_token> ids, int n_new,
                      const char * out_path) {
    int n_vocab = llama_vocab_n_tokens(vocab);
    if (!decode(ctx, ids, 0, false)) {
        return 1;
    }
    std::vector<llama_token> generated;
    for (int step = 0; step < n_new; step++) {
        llama_token next = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        generated.push_back(next);
        if (llama_vocab_is_eog(vocab, next) || step + 1 == n_new) {
            break;
        }
        if (!decode(ctx, {next}, (int) (ids.size() + generated.size() - 1), false)) {
            return 1;
        }
    }
    FILE * out = fopen(out_path, "w");
    if (!out) {
        fprintf(stderr, "cannot write %s\n", out_path);
        return 1;
    }
    for (llama_token t : generated) {
        fprintf(out, "%d\n", t);
    }
    return fclose(out) == 0 ? 0 : 1;
}

static bool no_progress(float, void *) {
    return true;
}

int main(int argc, char ** argv) {
    std::string mode = argc > 1 ? argv[1] : "";
    int n_args = mode == "logits" ? 5 : 6;  // without the optional trailing `exact`
    bool exact = argc == n_args + 1 && std::string(argv[n_args]) == "exact";
    if ((mode != "logits" && mode != "greedy") || (argc != n_args && !exact)) {
        fprintf(stderr, "usage: %s logits MODEL IDS OUT [exact] | greedy MODEL IDS N OUT [exact]\n", argv[0]);
        return 2;
    }
    std::vector<llama_token> ids = read_ids(argv[3]);
    int n_new = mode == "greedy" ? atoi(argv[4]) : 0;
    if (ids.empty() || (mode == "greedy" && n_new < 1)) {
        fprintf(stderr, "no token ids in %s (or N < 1)\n", argv[3]);
        return 2;
    }
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    mparams.progress_callback = no_progress;
    llama_model * model = llama_model_load_from_file(argv[2], mparams);
    if (!model) {
        fprintf(stderr, "llama.cpp could not load %s\n", argv[2]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    llama_context_params cparams = llama_context_default_params();
    uint32_t n_tokens = (uint32_t) ids.size();
    cparams.n_ctx = ((n_tokens + n_new + 255) / 256) * 256;
    cparams.n_batch = cparams.n_ubatch = n_tokens;  // one pass, as our reference's prefill
    cparams.n_threads = cparams.n_threads_batch = 2;
    if (exact) {
        cparams.type_k = cparams.type_v = GGML_TYPE_F32;
        cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) {
        fprintf(stderr, "llama.cpp could not create a context for %s\n", argv[2]);
        return 1;
    }
    int rc = 0;
    if (mode == "logits") {
        rc = decode(ctx, ids, 0, true) ? write_logits(ctx, (int) n_tokens, llama_vocab_n_tokens(vocab), argv[4]) : 1;
    } else {
        rc = run_greedy(ctx, vocab, ids, n_new, argv[5]);
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
