// runtime/engine_path.h - the model a context_engine runs on, and the one path a turn
// computes by: the prompt's tail prefilled in canonical chunks (with checkpoints at the
// block ends worth one, where the model's memory keeps them), then the answer generated.
// Owned by context_engine::impl (context_engine_impl.h); implemented in engine_path.cpp.
//
// Thread safety: the engine thread's, but for what assemble_request and its checks read
// (tm, prof, max_piece_bytes and the engine's context), which serving never changes.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "answer_memory.h"
#include "warmctx/context_engine.h"

namespace warmctx {

using clock_type = std::chrono::steady_clock;

// The leading blocks of `prompt` the cache may keep: up to the first of class none.
inline size_t n_cacheable_blocks(const assembled_prompt & prompt) {
    size_t n = 0;
    while (n < prompt.blocks.size() && prompt.blocks[n].retention != retention_class::none) ++n;
    return n;
}

struct engine_path {
    std::unique_ptr<engine> eng;
    std::unique_ptr<text_model> tm;      // the engine's tokenizer and template, as the assembler sees them
    profile prof;                        // the engine's profile now (set_chunk_tokens changes it)
    seq_id cold_seq = -1;                // after the work sequences, when options.cold_stream
    answer_memory answers;               // each workspace's last answers, for drafts
    int32_t checkpoint_gap_tokens = -1;  // context_engine_options::checkpoint_gap_tokens
    double prefill_tokens_per_ms = 0;    // exponential average of measured prefills
    uint64_t max_piece_bytes = 0;        // the longest text any one token stands for

    // No token covers more than max_piece_bytes of text: a request whose content plainly
    // needs more tokens than a sequence holds is refused before it is tokenized
    // (tokenizing megabytes takes seconds).
    status plausible(const turn_request & req) const;
    status fits(const assembled_prompt & prompt) const;

    // The one prefill path: `seq` holds exactly [0, from) of `prompt`; computes [from, end)
    // in canonical chunks (REQUIRES both chunk boundaries of `prompt`). When `end` is the
    // prompt's end, `logits` receives the logits after it. Adds the time to `ms`.
    // The time taking checkpoints is added to `checkpoint_ms`, not to `ms`.
    status prefill(seq_id seq, const assembled_prompt & prompt, pos_t from, pos_t end, std::vector<float> & logits,
                   double & ms, double & checkpoint_ms);
    // How far apart the block ends a prefill takes checkpoints at must be, in tokens
    // (context_engine_options::checkpoint_gap_tokens, else what taking one costs in time,
    // and at least profile::checkpoint_tokens: what it costs in memory).
    pos_t checkpoint_gap() const;

    // Generates after a prefill (run_turn, run_cold): fills out.gen and the timings. A
    // work stream's turn drafts from its workspace (`prompt`, earlier answers) where
    // req.sampling asks; the cold stream never does.
    status generate(seq_id seq, const turn_request & req, std::span<const token_id> prompt, std::vector<float> logits,
                    turn_result & out, clock_type::time_point t0);

    void note_prefill_rate(pos_t n, double ms) {
        // Short tails are dominated by fixed costs (the lazy KV copy, attention over the
        // reused prefix) and would make the rate useless for predicting a real miss.
        if (n < 128 || ms <= 0) return;
        const double r = n / ms;
        prefill_tokens_per_ms = prefill_tokens_per_ms <= 0 ? r : 0.7 * prefill_tokens_per_ms + 0.3 * r;
    }
};

}  // namespace warmctx
