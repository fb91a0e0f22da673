// runtime/work_streams.h - a context_engine's work streams (its engine's work sequences,
// the resident streams of the device tier among them): what each holds between turns,
// and how much of a prompt each still holds, which decides where a turn reuses from.
// Bookkeeping only, no engine: what moves KV into and out of the streams is
// stream_moves.h. Implemented in work_streams.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "warmctx/context_engine.h"

namespace warmctx {

using clock_type = std::chrono::steady_clock;

// What a work stream holds between turns: the cached blocks of the last prompt it ran
// (trimmed to them), so that the next turn that shares them reuses them in place.
// Write-back is lazy: they are offered to the pool (a copy) only when something is
// about to overwrite them - another prompt's turn in this stream, or a lookup that
// needs them from another stream - never after every turn.
struct work_stream {
    std::vector<block> blocks;  // [0, blocks.back().end) is in the stream
    std::string workspace;      // whose turn left it
    uint64_t t_finished = 0;
    bool busy = false;          // a pending turn runs in it
    bool unsaved = false;       // the blocks have not been offered to the pool yet
    // The leading blocks up to the last one a later turn of the same workspace would
    // still want; those after it are per-turn content (a diff, test output, a log or
    // a snippet), which that turn's own replaces.
    size_t n_durable = 0;
    // Where its last turn resumed: the checkpoints from there on are that turn's own
    // prefill's (and the one it resumed from), where the workspace's next turn resumes.
    pos_t resumed_at = 0;
};

// Content a workspace sends fresh every turn: its next turn's supersedes it.
inline bool is_per_turn(segment_kind k) {
    return k == segment_kind::diff || k == segment_kind::test_output || k == segment_kind::terminal_log ||
           k == segment_kind::snippet || k == segment_kind::user;
}

class work_streams {
  public:
    bool copies = false;  // options.stream_copies, resolved: a stream's prefix may be copied into another
    // The stream the last turn finished on, and when: write_back_ahead leaves it alone
    // for a moment, since that workspace's next turn usually comes first.
    seq_id last_finished_seq = -1;
    clock_type::time_point last_finished_at{};

    // One per work sequence, indexed by it.
    void resize(size_t n) { streams_.resize(n); }
    size_t size() const { return streams_.size(); }
    work_stream & operator[](size_t s) { return streams_[s]; }
    const work_stream & operator[](size_t s) const { return streams_[s]; }
    std::vector<work_stream>::const_iterator begin() const { return streams_.begin(); }
    std::vector<work_stream>::const_iterator end() const { return streams_.end(); }
    bool is_stream(seq_id s) const { return s >= 0 && (size_t)s < streams_.size(); }

    // How many leading blocks of `blocks` work stream `seq` still holds (equal chain
    // hashes name equal whole prefixes).
    size_t n_held(seq_id seq, std::span<const block> blocks) const;
    // An idle stream other than `except` that holds at least the first n of `blocks`.
    seq_id holding(std::span<const block> blocks, seq_id except) const;
    // An idle stream that holds nothing, other than `except`.
    seq_id free_stream(seq_id except) const;

    // The pool's match `m`, or a stream's when it holds at least as many leading blocks
    // of `prompt`: then the match's holder is that work stream. `seq` >= 0: only that
    // stream (in place); -1: any idle stream (explain: another stream's blocks would be
    // written back to the pool and found there).
    // With stream copies, any idle stream may serve a turn too (copied whole), and a
    // stream wins a tie with the pool (a device copy is cheaper than a load); `seq`
    // itself wins every tie (in place, nothing copied).
    match best_match(match m, std::span<const block> blocks, seq_id seq) const;
    // `m`, unless work stream `seq` itself lets the turn reuse as many tokens of `prompt`: then
    // the stream's own match (in place: nothing written back, nothing loaded). A holder
    // may match more blocks and not one token more of reuse: the prompt's last block
    // (a message fused with the generation prompt, kept as history) is never reused.
    match prefer_in_place(match m, const assembled_prompt & prompt, seq_id seq) const;

  private:
    std::vector<work_stream> streams_;
};

}  // namespace warmctx
