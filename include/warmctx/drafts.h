// warmctx/drafts.h - drafts from the workspace: speculative decoding without a draft model.
//
// Agents' models re-emit text their context already holds: a pinned file with a change,
// a tool call retried, the answer to a request sent again. A draft_index holds that text
// (the prompt, and earlier answers of the workspace) and, given the tokens decided so
// far, proposes the tokens that followed the longest earlier occurrence of their tail
// (n-grams of 12, 6 and then 3 tokens). The decoder puts the draft in the same batch as
// the token it has just sampled and samples after each drafted position in turn: a draft
// token stands only where sampling chose it, so the answer is the one decoding without
// drafts gives (the same tokens greedily, the same draws from the same seed), and the
// first token sampled otherwise ends the draft (its positions are cut from the KV).
//
// A draft is not free: every row of a decode computes the model's output layer (on 2 CPU
// cores, 17 rows cost ~6x one row), so the index paces itself: the first draft holds at
// most k_first_draft tokens (but as many as the caller allows where the longest n-gram
// matched an earlier answer: a request sent again), a draft that was taken whole lets the
// next be twice as long (up to the caller's most), one taken in part limits the next to
// what was taken and one more, and drafts rejected at their first token pause drafting for
// 2, 4, ... 64 steps.
// Long drafts pay where they are taken: on the CPU, flash attention computes 64-row tiles,
// so a step of 17 rows at depth costs its attention as one of 64 does.
//
// Numbers: a decode of several rows sums in another order than one of a single row (on
// the CPU, llama.cpp's batched matrix kernel against its one-row dot product, and flash
// attention's split of a lone row's KV), so a drafted answer's logits differ from the
// undrafted one's by what that costs (~1e-2 with f16 weights, ~0.3-0.5 with q8_0 weights on
// AVX-512, the tiny test models), unless the engine pads lone rows to two
// (context_info::pads_steps): then they are the same bits. Where they differ, tokens differ
// only where two tokens' logits are that close (greedy), or a draw falls that near the
// edge between two (sampled); from there it is another text.
//
// Thread safety: none (one decoder's).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "warmctx/types.h"

namespace warmctx {

class draft_index {
  public:
    // A text an answer may repeat (an earlier answer with the end of its prompt): searched,
    // never extended. Call before the running text starts.
    void add_source(std::span<const token_id> tokens);
    // The running text: the prompt, then each token as it is decided.
    void extend(std::span<const token_id> tokens);
    void push(token_id t);
    // Up to `n_max` tokens (fewer as the pacing says) that followed the longest earlier
    // occurrence (at least k_min_match tokens) of the running text's tail, repeating
    // what came after it where that reaches the tail itself (a loop); empty when there
    // is none, or while drafting pauses.
    std::vector<token_id> propose(size_t n_max);
    // What became of the last proposal: `accepted` of its `drafted` tokens were chosen.
    void record(size_t drafted, size_t accepted);

    size_t size() const { return toks_.size(); }
    static constexpr std::array<uint32_t, 3> k_match = {12, 6, 3};
    static constexpr uint32_t k_min_match = 3;
    static constexpr size_t k_first_draft = 16;

  private:
    void index_last(bool running);
    std::vector<token_id> toks_;  // sources then the running text, each ended by -1 (a source)
    size_t running_from_ = 0;     // where the running text starts in toks_
    // Per n-gram length: its hash -> the index of its last token, latest occurrence.
    std::array<std::unordered_map<uint64_t, uint32_t>, k_match.size()> last_;
    // Per n-gram length: where the tail's n-gram occurred before the tail (-1: never).
    std::array<int64_t, k_match.size()> prev_{-1, -1, -1};
    // Pacing: the longest next draft, steps left without drafts, drafts missed in a row.
    size_t cap_ = k_first_draft;
    uint32_t pause_ = 0, misses_ = 0;
    bool recorded_ = false;  // a draft's outcome was recorded
};

// What drafting did over one generation (or a server's life).
struct draft_counters {
    uint64_t n_steps = 0;     // decode steps that carried a draft
    uint64_t n_drafted = 0;   // draft tokens decoded
    uint64_t n_accepted = 0;  // of them, the ones sampling chose
};

// The drafts a turn may hold when its request names none (serve's --draft-max, verify's):
// `asked`, or where it is negative (the default) k_default_draft_max where the engine
// measured that a step's rows give the same bits alone and among others
// (context_info::steps_exact: the CPU, a lone row padded to two where that is cheap), and
// none elsewhere. There rows decoded together part from one row's, and a drafted answer
// parts from the plain one at near ties: `warmctx verify` on an H100 (a q8_0 KV: 44 of 212
// scenarios; a MoE: 34 of 136; docs/benchmarks.md, "Drafts from the workspace"), and on the
// CPU without the padding (2 of 50 scenarios of the tiny model); so there drafts are only
// what a request or the flag asks for.
inline constexpr int32_t k_default_draft_max = 64;
inline int32_t default_draft_max(int32_t asked, std::string_view backend, bool steps_exact) {
    if (asked >= 0) return asked;
    return backend == "CPU" && steps_exact ? k_default_draft_max : 0;
}

}  // namespace warmctx
