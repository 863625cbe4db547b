/* A narrow C interface over llama.cpp for verispec's llama.cpp model backend (verispec/models/llamacpp.py).
 *
 * llama.cpp's own structs change layout between versions; Python reaches them only through these functions, which
 * the C compiler builds against the headers of the very llama.cpp they link (`make peers`), so no struct layout is
 * restated anywhere. One model, one context, one sequence: a forward appends tokens to the KV cache and copies the
 * logits of its last positions out; truncate removes the cache from a position on.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "llama.h"

struct vs_model {
    struct llama_model * model;
    struct llama_context * ctx;
    struct ggml_threadpool * threads;
    int32_t n_vocab;
    int32_t n_ctx;
    int32_t n_batch;
};

static void vs_quiet_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level; (void) text; (void) user_data;  /* llama.cpp's loading chatter is not the user's business */
}

struct vs_model * vs_load(const char * path, int32_t n_ctx, int32_t n_batch, int32_t n_threads, int32_t verbose) {
    if (!verbose) {
        llama_log_set(vs_quiet_log, NULL);
    }
    llama_backend_init();
    struct llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    struct llama_model * model = llama_model_load_from_file(path, mparams);
    if (model == NULL) {
        return NULL;
    }
    struct llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = (uint32_t) n_ctx;
    cparams.n_batch = (uint32_t) n_batch;
    cparams.n_ubatch = (uint32_t) n_batch;
    cparams.n_seq_max = 1;
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads;
    struct llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == NULL) {
        llama_model_free(model);
        return NULL;
    }
    /* A thread pool that sleeps as soon as a forward ends: the default one keeps its threads spinning for a while
     * after each forward, which on a small CPU takes the cores from the torch model that runs next. */
    struct ggml_threadpool_params tparams = ggml_threadpool_params_default(n_threads);
    tparams.poll = 0;
    struct ggml_threadpool * threads = ggml_threadpool_new(&tparams);
    if (threads == NULL) {
        llama_free(ctx);
        llama_model_free(model);
        return NULL;
    }
    llama_attach_threadpool(ctx, threads, threads);
    struct vs_model * handle = calloc(1, sizeof(struct vs_model));
    handle->model = model;
    handle->ctx = ctx;
    handle->threads = threads;
    handle->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    handle->n_ctx = (int32_t) llama_n_ctx(ctx);
    handle->n_batch = n_batch;
    return handle;
}

int32_t vs_n_vocab(const struct vs_model * handle) { return handle->n_vocab; }

int32_t vs_n_ctx(const struct vs_model * handle) { return handle->n_ctx; }

/* Feed tokens[0..n) at positions pos0.. and copy the logits of the last n_logits of them to out
 * ([n_logits, n_vocab], row-major). Returns llama_decode's status (0 = success), or -100 for bad arguments. */
int32_t vs_forward(struct vs_model * handle, const int32_t * tokens, int32_t n, int32_t pos0, int32_t n_logits,
                   float * out) {
    if (n < 1 || n_logits < 1 || n_logits > n) {
        return -100;
    }
    for (int32_t start = 0; start < n; start += handle->n_batch) {
        int32_t count = n - start < handle->n_batch ? n - start : handle->n_batch;
        struct llama_batch batch = llama_batch_init(count, 0, 1);
        for (int32_t i = 0; i < count; i++) {
            int32_t index = start + i;
            batch.token[i] = tokens[index];
            batch.pos[i] = pos0 + index;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = index >= n - n_logits;
        }
        batch.n_tokens = count;
        int32_t status = llama_decode(handle->ctx, batch);
        if (status == 0) {
            for (int32_t i = 0; i < count; i++) {
                int32_t row = start + i - (n - n_logits);
                if (row >= 0) {
                    const float * logits = llama_get_logits_ith(handle->ctx, i);
                    if (logits == NULL) {
                        status = -101;
                        break;
                    }
                    memcpy(out + (size_t) row * handle->n_vocab, logits, sizeof(float) * handle->n_vocab);
                }
            }
        }
        llama_batch_free(batch);
        if (status != 0) {
            return status;
        }
    }
    return 0;
}

/* Drop the cache from position `length` on (length 0 empties it). Returns 1 on success. */
int32_t vs_truncate(struct vs_model * handle, int32_t length) {
    return llama_memory_seq_rm(llama_get_memory(handle->ctx), 0, length, -1) ? 1 : 0;
}

void vs_free(struct vs_model * handle) {
    if (handle == NULL) {
        return;
    }
    llama_free(handle->ctx);
    ggml_threadpool_free(handle->threads);
    llama_model_free(handle->model);
    free(handle);
}
