// runtime/stream_moves.h - the moves of a prefix's KV between a context_engine's work
// streams (work_streams.h) and its tiers (cache_tiers.h):
//   out of a stream: its blocks written back to the RAM pool, lazily (when something is
//     about to overwrite them), or parked whole in a free stream;
//   into a stream: a prefix cut in place, copied from the pool or another stream, or
//     restored from disk - cut only at a block end its state can be cut at;
//   and the streams' checkpoints kept within their bounds.
// Holds no state of its own: it works on the parts context_engine::impl owns, and counts
// in its kv_memory counters. Implemented in context_streams.cpp.
//
// Thread safety: none (the engine thread's).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "cache_tiers.h"
#include "work_streams.h"
#include "warmctx/context_engine.h"

namespace warmctx {

class stream_moves {
  public:
    stream_moves(engine & e, const context_engine_options & opts, work_streams & streams, cache_tiers & tiers,
                 kv_memory & ctr)
        : eng_(e), opts_(opts), streams_(streams), tiers_(tiers), ctr_(ctr) {}

    // Out of a stream.
    // Offers an idle stream's unsaved blocks (its first n_blocks, or all) to the pool (a
    // copy; the stream keeps them). Under the budget the pool may keep less, or nothing:
    // never an error.
    void write_back(seq_id seq, size_t n_blocks = SIZE_MAX);
    // A turn in place trims `seq` to its first n_keep blocks. The blocks it destroys
    // that a later turn may want are kept - parked whole in a free stream when stream
    // copies are on and one is free (no byte leaves the device), else offered to the
    // pool - unless they are only content of low retention (history that slid out of
    // an agent's window or was compacted away, a terminal log): a branch no agent
    // revisits is not worth a copy of the whole stream on the turn's way. Nor is one
    // whose copy into the pool (the whole stream, at the pool's measured rate) would take
    // longer than prefilling the branch again at `prefill_tokens_per_ms` (0: not known):
    // a long prefix out of a device on the turn's way, for a retry that may not come.
    void save_branch(seq_id seq, size_t n_keep, double prefill_tokens_per_ms = 0);
    // A turn of `workspace` (its prompt's blocks `next`) on `seq` keeps its first `keep`
    // tokens: the stream's deferred disk write, if the prefix it saves reaches past them, is
    // not made on the turn's way. The same workspace's turn cuts the write to the blocks it
    // keeps in place, or, taking a prefix its prompt starts with from elsewhere, drops it
    // (its own write, when it ends, covers what they share); another's parks the stream
    // whole in a free stream where stream copies are on (a device copy, milliseconds, where
    // the save is a copy out of the device of the whole prefix) and the write goes with it.
    // Else it is made now.
    void keep_deferred(seq_id seq, pos_t keep, std::string_view workspace, std::span<const block> next = {});
    // Copies `seq` whole into a free stream with its blocks and what it owes (unsaved):
    // that stream, or -1 where stream copies are off, none is free or the copy failed.
    seq_id park(seq_id seq);
    // Before another prompt overwrites an idle stream: its durable blocks go to the pool,
    // unless the pool holds them already; its per-turn blocks (the last turn's diff, test
    // output...) do not - that workspace's next turn brings its own. Where that prompt is
    // the stream's own workspace's next (`workspace`, its blocks `next`) and starts as the
    // stream does, the turn brings what they share from elsewhere, and what follows is
    // the old prompt's tail, which the workspace moved on from: a branch, kept or not as
    // save_branch decides.
    void write_back_displaced(seq_id seq, std::string_view workspace = {}, std::span<const block> next = {},
                              double prefill_tokens_per_ms = 0);
    // Writes back every idle stream whose blocks `blocks` starts with: a lookup in
    // the pool then sees them wherever they ran.
    void write_back_sharing(std::span<const block> blocks, seq_id except);
    // Empties the stream, after its deferred disk write (made while it still holds it).
    void clear_stream(seq_id seq);

    // Into a stream.
    // Loads a pool holder's prefix into `seq` (cleared first) and trims it at `reuse`;
    // a holder that is another stream is copied whole, the data at once, so that what
    // happens to either stream before the next decode (a load, a save) sees it done.
    // Where the copy cannot be cut at `at` (a checkpoint left out or thinned), at the
    // deepest block end before it that it can: `at` says which.
    status copy_from_holder(seq_id holder, seq_id seq, const assembled_prompt & prompt, reuse_point & at);
    // Into `seq`, m.holder's prefix `at`: cut back in place or copied, at the deepest block
    // end at or before `at` the state can be cut at (`at` and `m` say where). Where it
    // cannot be taken (an engine error), `seq` is cleared, `at`, `m` and `in_place` reset,
    // and `refused` says why; where it was taken short of `at`, it says that.
    void take_prefix(seq_id seq, const assembled_prompt & prompt, match & m, reuse_point & at, bool & in_place,
                     std::string & refused);
    // A tier may hold a longer prefix than the engine (evicted, or before a restart):
    // restores it into `seq`, updating the match, reuse point, in_place and tier; a
    // candidate that failed leaves `failed` saying why. `ms`: the restore's time.
    void restore_from_tiers(const assembled_prompt & prompt, seq_id seq, match & m, reuse_point & at, bool & in_place,
                            kv_tier & tier, std::string & failed, double & ms);

    // Where a stream can be cut, and its checkpoints.
    // How many of the first `n` blocks `seq` can be cut after (engine::can_trim: a block
    // end with a checkpoint, where the model needs one).
    size_t cuttable(seq_id seq, std::span<const block> blocks, size_t n) const;
    // The deepest block end at or before `at` where `seq` can be cut (engine::can_trim).
    reuse_point resumable(seq_id seq, const assembled_prompt & prompt, reuse_point at) const;
    // Keeps the streams' checkpoints within opts.stream_checkpoint_max_bytes: while over,
    // an idle stream other than `keep` that holds checkpoints gives its blocks to the pool
    // (write_back: the pool's budget decides what it keeps) and is cleared - one that owes
    // nothing first (its blocks offered to the pool already, no deferred disk write), then
    // the one finished longest ago. Returns how many streams were cleared.
    size_t bound_stream_checkpoints(seq_id keep);
    // Drops checkpoints of `seq` past `max_count` (context_engine_options::
    // stream_checkpoint_max_count says which); returns how many.
    size_t thin_checkpoints(seq_id seq, size_t max_count);

  private:
    engine & eng_;
    const context_engine_options & opts_;  // the checkpoints' bounds
    work_streams & streams_;
    cache_tiers & tiers_;
    kv_memory & ctr_;  // context_counters::memory
};

}  // namespace warmctx
