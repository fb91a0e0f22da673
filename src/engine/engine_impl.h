// Internal: what the engine's files share - llama.cpp's handles as RAII owners, the
// one mapping of llama_decode's return codes, and the engine's state (engine::impl).
// engine_open.cpp loads a model and sizes its context; engine.cpp tokenizes, prefills,
// decodes and moves sequences; sampling.cpp samples tokens and generates.
#pragma once

#include <algorithm>
#include <atomic>

#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "warmctx/engine.h"

#include "seq_state.h"

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "llama.h"

namespace warmctx {

namespace detail {

struct model_deleter { void operator()(llama_model * m) const { llama_model_free(m); } };
struct context_deleter { void operator()(llama_context * c) const { llama_free(c); } };
struct sampler_deleter { void operator()(llama_sampler * s) const { llama_sampler_free(s); } };
struct threadpool_deleter { void operator()(ggml_threadpool * t) const { ggml_threadpool_free(t); } };
using threadpool_ptr = std::unique_ptr<ggml_threadpool, threadpool_deleter>;
using model_ptr = std::unique_ptr<llama_model, model_deleter>;
using context_ptr = std::unique_ptr<llama_context, context_deleter>;
using sampler_ptr = std::unique_ptr<llama_sampler, sampler_deleter>;

// The one mapping of llama_decode's return codes (llama.h: 0 ok, 1 no KV slot for the
// batch, 2 aborted, -1 invalid batch, < -1 error).
inline status decode_status(int32_t rc) {
    if (rc == 0) return {};
    if (rc == 1) return resource_exhausted("llama_decode: no free KV slot for the batch (context full)");
    if (rc == 2) return {status_code::cancelled, "llama_decode: aborted"};
    if (rc == -1) return invalid_argument("llama_decode: invalid batch");
    return engine_error("llama_decode failed with code " + std::to_string(rc));
}

// Row i of a decode step: one token of one sequence at `pos`, its logits computed (a step's
// rows, a lone row's padding and the steps probe fill their batches the one way).
inline void set_step_row(llama_batch & b, int32_t i, llama_token token, llama_pos pos, llama_seq_id seq) {
    b.token[i] = token;
    b.pos[i] = pos;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = seq;
    b.logits[i] = 1;
}

}  // namespace detail

struct engine::impl {
    engine_options opts;
    detail::model_ptr model;
    // The CPU threads every decode runs on, made once (as llama-server does): without
    // one, llama.cpp starts and joins its threads at every decode. Declared before ctx,
    // so that it outlives the context that uses it.
    detail::threadpool_ptr threadpool;
    detail::context_ptr ctx;
    const llama_vocab * vocab = nullptr;
    model_info minfo;
    context_info cinfo;
    uint32_t n_stream = 1;  // llama.cpp's KV streams: n_seq_max in exact mode, 1 in shared
    llama_batch batch{};
    // Where the KV lives on a GPU: a page-locked host buffer that sequence states pass
    // through on their way out of the device (and in), reused and grown as needed. A
    // copy into pageable memory runs at a fraction of the bus's speed and holds the
    // engine thread meanwhile (a 13k-token prefix of the 0.5B shape: ~275 ms).
    // staging_buft is null on the CPU: states go straight to and from the vectors.
    ggml_backend_buffer_type_t staging_buft = nullptr;
    ggml_backend_buffer_t staging = nullptr;

    ~impl() {
        if (staging) ggml_backend_buffer_free(staging);
        if (batch.token) llama_batch_free(batch);
    }

    // The staging buffer, at least n bytes (nullptr: none, or its allocation failed).
    uint8_t * staging_of(size_t n) {
        if (!staging_buft) return nullptr;
        if (staging && ggml_backend_buffer_get_size(staging) >= n)
            return (uint8_t *)ggml_backend_buffer_get_base(staging);
        if (staging) ggml_backend_buffer_free(staging);
        const size_t step = size_t{64} << 20;  // grow in 64 MiB steps: few reallocations
        staging = ggml_backend_buft_alloc_buffer(staging_buft, (n + step - 1) / step * step);
        return staging ? (uint8_t *)ggml_backend_buffer_get_base(staging) : nullptr;
    }

    llama_memory_t mem() const { return llama_get_memory(ctx.get()); }

    // ---- the model's memory and its checkpoints (engine_memory.cpp) ----
    seq_state::state_layout layout;  // the parts of a saved state (seq_state.h)
    // A checkpoint: the last part of the sequence's state (the window, or the recurrent
    // state) when it held [0, n_tokens), in the one-stream form, without magic and seq.
    struct checkpoint {
        pos_t n_tokens = 0;
        std::shared_ptr<const std::vector<uint8_t>> bytes;
    };
    std::vector<std::vector<checkpoint>> ckpts;  // per sequence, by n_tokens
    // Checkpoint buffers given back, kept for the next one: a 52.7 MB recurrent state in a
    // fresh allocation faults in ~13k pages on its first write. At most two are kept
    // (shared with the deleters of checkpoints still alive elsewhere: the pool, a write).
    struct spare_buffers {
        std::mutex mu;
        std::vector<std::vector<uint8_t>> free;
    };
    std::shared_ptr<spare_buffers> spares = std::make_shared<spare_buffers>();
    // A checkpoint's bytes: a copy of `src`, in a spare buffer where one is free.
    std::shared_ptr<const std::vector<uint8_t>> checkpoint_bytes(std::span<const uint8_t> src);
    std::atomic<double> t_checkpoint_ms{0};  // the engine thread's time in take_checkpoint (one writer)
    // Per sequence: positions below this hold filler cells in the window's cache (a
    // state loaded with only its window); a cut that needs them takes a checkpoint.
    std::vector<pos_t> window_real_from;
    // Takes the checkpoint of `seq` at its current end (n_tokens). Errors: engine_error.
    status take_checkpoint(seq_id seq, pos_t n_tokens);
    // llama.cpp's bytes of `seq` with `flags`, out of the device through the page-locked
    // staging buffer where the backend has one (a view of it, good until its next use),
    // else read into `own` (a view of that). Errors: engine_error.
    result<std::span<const uint8_t>> state_out(seq_id seq, llama_state_seq_flags flags, std::vector<uint8_t> & own);
    const checkpoint * checkpoint_at(seq_id seq, pos_t n_tokens) const;
    // Whether `seq` is cut at `from` as plain KV is (no checkpoint needed): plain KV, or a
    // window whose cells before `from` are real. engine::trim_seq and engine::can_trim.
    bool cuts_in_place(seq_id seq, pos_t from) const {
        return !layout.has_partial() ||
               (layout.window_last && from - cinfo.memory.n_swa >= window_real_from[(size_t)seq]);
    }
    // Learns the memory's kind, layout and sizes at open (decodes two tokens into
    // sequence 0 and clears it).
    status probe_memory(memory_info & mi, uint64_t & kv_bytes_per_token);

    // engine::pad_rows's cost model, per query row in femtoseconds: alone (ggml's
    // one-row flash-attention path) a + b * pos, in a 64-row batch (its tiled path)
    // c + d * pos. Set by init_pad_costs when the engine pads; all zero otherwise.
    struct pad_costs {
        unsigned __int128 a = 0, b = 0, c = 0, d = 0;
    } pad;
    std::atomic<uint64_t> n_padded{0};
    std::atomic<uint64_t> n_prefill_decodes{0};
    std::atomic<uint64_t> n_checkpoints_taken{0};
    void init_pad_costs();
    // Sets cinfo.splits_freely: the same 100 tokens (at most chunk_tokens) in one call and in
    // two padded ones (40 rows, then the rest at depth 40) give the same last logits, bit for
    // bit. Uses and clears sequence 0.
    status probe_free_splits();
    // Sets cinfo.pads_steps (engine::decode_step): one row alone differs from the same row
    // among others, and one row padded to two does not. Uses and clears sequence 0.
    status probe_steps();
    int32_t pad_rows(int32_t n, pos_t pos) const;
    // One llama_decode of a step's rows (engine::decode_step), a lone row padded where
    // cinfo.pads_steps; each row's logits into `logits`. Errors: engine_error.
    status step_call(std::span<const step_input> rows, std::span<std::vector<float>> logits,
                     std::span<token_id> first_max);

    status check_seq(seq_id s) const {
        if (s < 0 || (uint32_t)s >= cinfo.n_seq_max)
            return invalid_argument("sequence id " + std::to_string(s) + " out of range [0, " +
                                    std::to_string(cinfo.n_seq_max) + ")");
        return {};
    }

    // Decodes `n` tokens at positions [pos, pos+n) of seq, logits for the last if asked.
    // Padded to 64 rows where engine::pad_rows says so: copies of the last token at the
    // positions after it, without logits, whose cells are freed again at once (the next
    // decode of seq takes the same cells as without them).
    // `padding`: as pad_rows says (engine), never (a token decoded only to be removed
    // again), or every call under k_pad_to rows (probe_free_splits, measuring whether that
    // makes the splits free).
    enum class padding { engine, never, every_short_call };
    status decode(seq_id seq, const token_id * toks, int32_t n, pos_t pos, bool want_last_logits,
                  padding padded = padding::engine) {
        const int32_t pad = padded == padding::never             ? 0
                            : padded == padding::every_short_call ? (n >= 1 && n < k_pad_to ? k_pad_to - n : 0)
                                                                  : pad_rows(n, pos);
        batch.n_tokens = n + pad;
        for (int32_t i = 0; i < n + pad; ++i) {
            batch.token[i] = toks[std::min(i, n - 1)];
            batch.pos[i] = pos + i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = seq;
            batch.logits[i] = (want_last_logits && i == n - 1) ? 1 : 0;
        }
        status st = detail::decode_status(llama_decode(ctx.get(), batch));
        if (pad > 0) {
            llama_memory_seq_rm(mem(), seq, pos + n, -1);
            n_padded.fetch_add(1, std::memory_order_relaxed);
        }
        return st;
    }

    void copy_logits(std::vector<float> * out) const {
        const float * l = llama_get_logits_ith(ctx.get(), -1);
        out->assign(l, l + minfo.n_vocab);
    }
};

}  // namespace warmctx
