// runtime/context_engine_impl.h - the state behind a context_engine, shared by the
// files that implement it: context_engine.cpp (a turn: begin, prefill, finish; open,
// explain, run_turn, run_cold), context_streams.cpp (the work streams: lookups in them,
// write-backs to the pool, copies between them) and context_workspaces.cpp (pins,
// snapshots, suspend and resume, branches, forgetting; the counters).
#pragma once

#include <chrono>
#include <thread>
#include <condition_variable>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "answer_memory.h"
#include "explain.h"
#include "kv_pool.h"
#include "disk_kv_tier.h"
#include "warmctx/context_engine.h"
#include "warmctx/volatility_store.h"

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

// Holder ids of the RAM pool: far above any engine sequence.
constexpr seq_id k_first_pool_holder = seq_id{1} << 20;

struct context_engine::impl {
    context_engine_options opts;
    seq_id cold_seq = -1;      // after the work sequences, when options.cold_stream
    std::unique_ptr<engine> eng;
    std::unique_ptr<text_model> tm;
    std::unique_ptr<kv_pool> pool;
    std::vector<work_stream> streams;  // one per work sequence
    bool stream_copies = false;         // options.stream_copies, resolved
    // A finished turn's disk write-through, per work stream: the copy out of the stream
    // waits until the engine has been idle for a while (write_through_idle),
    // so that it never holds the next request in the queue, or until something would
    // change the stream below the prefix it saves (flush_deferred_of: a turn that does not
    // keep it in place, a clear, a trim), or a caller needs every write (flush_deferred:
    // snapshots, pins, stop).
    struct deferred_write {
        seq_id seq = -1;
        std::string workspace;
        assembled_prompt prompt;
        size_t n_blocks = 0;
        pos_t save_end = 0;  // the end of what the disk tier saves (n_saved_blocks): the
                             // stream must keep that much; what follows (a diff, history) may go
    };
    std::map<seq_id, deferred_write> deferred;
    void flush_deferred() {
        save_volatility();
        while (!deferred.empty()) flush_deferred_of(deferred.begin()->first);
    }
    void flush_deferred_of(seq_id seq) {
        auto it = deferred.find(seq);
        if (it == deferred.end()) return;
        deferred_write d = std::move(it->second);
        deferred.erase(it);
        tiers->write_through(*eng, prof, d.seq, d.workspace, d.prompt, d.n_blocks);
    }
    // A turn on `seq` keeps its first `keep` tokens: the stream's deferred write, if its
    // prefix reaches past them, is made now.
    void keep_deferred_of(seq_id seq, pos_t keep) {
        auto it = deferred.find(seq);
        if (it != deferred.end() && keep < it->second.save_end) flush_deferred_of(seq);
    }
    std::unique_ptr<prefix_cache> cache;
    std::unique_ptr<disk_kv_tier> tiers;
    answer_memory answers;  // each workspace's last answers, for drafts
    profile prof;
    uint64_t turn_clock = 0;  // a logical clock: a tick per turn and per workspace call (LRU order)
    // The stream the last turn finished on, and when: write_back_ahead leaves it alone
    // for a moment, since that workspace's next turn usually comes first.
    seq_id last_finished_seq = -1;
    clock_type::time_point last_finished_at{};
    double prefill_tokens_per_ms = 0;  // exponential average of measured prefills
    uint64_t max_piece_bytes = 0;      // the longest text any one token stands for
    std::map<std::string, workspace_history> workspaces;
    // Per workspace, how often its stable segments change and their learned order
    // (warmctx/volatility.h). Read by assemble on HTTP threads, written by finish_turn
    // on the engine thread: guarded by volatility_mu.
    mutable std::mutex volatility_mu;
    mutable std::map<std::string, volatility_state> volatility;
    // Kept beside the disk tier (<cache_dir>/volatility/, warmctx/volatility_store.h), so
    // that a restart keeps each workspace's learned order and finer blocks: read when a
    // workspace is first seen (or again after it was forgotten), written after an answer is
    // out when its order, finer blocks or fusion habit changed (observe_turn), every
    // k_volatility_save_every turns, and at close, on the store's own thread. No cache
    // directory: memory only. vol_looked_up and vol_dirty are guarded by volatility_mu.
    std::unique_ptr<volatility_store> vol_store;
    mutable std::set<std::string> vol_looked_up;  // workspaces whose file was read (or found absent)
    std::set<std::string> vol_dirty;
    static constexpr uint64_t k_volatility_save_every = 16;
    // REQUIRES `lock` holds volatility_mu. The workspace's state, read from its file the
    // first time (with the lock let go meanwhile: a slow disk holds no other thread that
    // waits for volatility_mu, the engine thread's finish_turn among them). The pointer is
    // good while the lock is held. vol_looked_up is cleared past k_max_looked_up names (a
    // client can send any number of workspace names): a name seen again is read again.
    volatility_state * volatility_of(const std::string & ws, std::unique_lock<std::mutex> & lock) const;
    static constexpr size_t k_max_looked_up = 65536;
    // Hands the dirty states to the store's writer (takes volatility_mu to copy them).
    void save_volatility();
    size_t n_remembered_tokens = 0;  // sum of workspaces' last_tokens
    context_counters ctr;

    // Remembers `ws`'s last turn, then forgets least recently used workspaces (their
    // history and counters) past the bounds. The workspace just remembered stays.
    void remember(const std::string & ws, const pending_turn & t);

    void forget(const std::string & ws);

    // The tenant salt, with the request's cache_salt when it has one: the chain hashes' root.
    std::string salt_of(const turn_request & req) const;
    result<assembled_prompt> assemble(const turn_request & req) const;

    // No token covers more than max_piece_bytes of text: a request whose content plainly
    // needs more tokens than a sequence holds is refused before it is tokenized
    // (tokenizing megabytes takes seconds).
    status plausible(const turn_request & req) const;

    status fits(const assembled_prompt & prompt) const;

    // Where the last-used workspaces' last prefixes are now (workspace_counters::held_in).
    void note_where_held(context_counters & c) const;
    const workspace_history * history(const std::string & ws) const {
        auto it = workspaces.find(ws);
        return it == workspaces.end() ? nullptr : &it->second;
    }

    explain_report explain(const std::string & ws, const assembled_prompt & prompt, const match & m, pos_t reuse,
                           kv_tier tier) const;

    void count(const std::string & ws, const explain_report & ex, size_t n_generated);

    void note_prefill_rate(pos_t n, double ms) {
        // Short tails are dominated by fixed costs (the lazy KV copy, attention over the
        // reused prefix) and would make the rate useless for predicting a real miss.
        if (n < 128 || ms <= 0) return;
        const double r = n / ms;
        prefill_tokens_per_ms = prefill_tokens_per_ms <= 0 ? r : 0.7 * prefill_tokens_per_ms + 0.3 * r;
    }

    // The one prefill path: `seq` holds exactly [0, from) of `prompt`; computes [from, end)
    // in canonical chunks (REQUIRES both chunk boundaries of `prompt`). When `end` is the
    // prompt's end, `logits` receives the logits after it. Adds the time to `ms`.
    // The time taking checkpoints is added to `checkpoint_ms`, not to `ms`.
    status prefill(seq_id seq, const assembled_prompt & prompt, pos_t from, pos_t end, std::vector<float> & logits,
                   double & ms, double & checkpoint_ms);
    // How far apart the block ends a prefill takes checkpoints at must be, in tokens
    // (context_engine_options::checkpoint_gap_tokens, else what taking one costs).
    pos_t checkpoint_gap() const;

    // Generates after a prefill (run_turn, run_cold): fills out.gen and the timings. A
    // work stream's turn drafts from its workspace (`prompt`, earlier answers) where
    // req.sampling asks; the cold stream never does.
    status generate(seq_id seq, const turn_request & req, std::span<const token_id> prompt,
                    std::vector<float> logits, turn_result & out, clock_type::time_point t0);

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
    // How many of the first `n` blocks `seq` can be cut after (engine::can_trim: a block
    // end with a checkpoint, where the model needs one).
    size_t cuttable(seq_id seq, std::span<const block> blocks, size_t n) const;
    // The deepest block end at or before `at` where `seq` can be cut (engine::can_trim).
    reuse_point resumable(seq_id seq, const assembled_prompt & prompt, reuse_point at) const;

    // How many leading blocks of `blocks` work stream `seq` still holds (equal chain
    // hashes name equal whole prefixes).
    size_t stream_match(seq_id seq, std::span<const block> blocks) const {
        const work_stream & s = streams[(size_t)seq];
        size_t n = 0;
        while (n < s.blocks.size() && n < blocks.size() && s.blocks[n].chain == blocks[n].chain) ++n;
        return n;
    }

    // Offers an idle stream's unsaved blocks (its first n_blocks, or all) to the pool (a
    // copy; the stream keeps them). Under the budget the pool may keep less, or nothing:
    // never an error.
    void write_back(seq_id seq, size_t n_blocks = SIZE_MAX);
    // An idle stream other than `except` that holds at least the first n of `blocks`.
    seq_id stream_holding(std::span<const block> blocks, seq_id except) const;
    // An idle stream that holds nothing, other than `except`.
    seq_id free_stream(seq_id except) const;
    // A turn in place trims `seq` to its first n_keep blocks. The blocks it destroys
    // that a later turn may want are kept - parked whole in a free stream when stream
    // copies are on and one is free (no byte leaves the device), else offered to the
    // pool - unless they are only content of low retention (history that slid out of
    // an agent's window or was compacted away, a terminal log): a branch no agent
    // revisits is not worth a copy of the whole stream on the turn's way.
    void save_branch(seq_id seq, size_t n_keep);
    // Before another prompt overwrites an idle stream: its durable blocks go to the pool,
    // unless the pool holds them already; its per-turn blocks (the last turn's diff, test
    // output...) do not - that workspace's next turn brings its own.
    void write_back_displaced(seq_id seq);
    // Writes back every idle stream whose blocks `blocks` starts with: a lookup in
    // the pool then sees them wherever they ran.
    void write_back_sharing(std::span<const block> blocks, seq_id except);

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
    bool is_stream(seq_id s) const { return s >= 0 && (size_t)s < streams.size(); }

    void clear_stream(seq_id seq);
    // Keeps the streams' checkpoints within opts.stream_checkpoint_max_bytes: while over,
    // the idle stream other than `keep` finished longest ago that holds checkpoints
    // gives its blocks to the pool (write_back: the pool's budget decides what it keeps)
    // and is cleared. Returns how many streams were cleared.
    size_t bound_stream_checkpoints(seq_id keep);
    // Drops checkpoints of `seq` past `max_count` (context_engine_options::
    // stream_checkpoint_max_count says which); returns how many.
    size_t thin_checkpoints(seq_id seq, size_t max_count);
    // A tier may hold a longer prefix than the engine (evicted, or before a restart):
    // restores it into `seq`, updating the match, reuse point, in_place and tier; a
    // candidate that failed leaves `failed` saying why. `ms`: the restore's time.
    void restore_from_tiers(const assembled_prompt & prompt, seq_id seq, match & m, reuse_point & at, bool & in_place,
                            kv_tier & tier, std::string & failed, double & ms);

    // The leading blocks of `prompt` the cache may keep: up to the first of class none.
    static size_t n_cacheable_blocks(const assembled_prompt & prompt) {
        size_t n = 0;
        while (n < prompt.blocks.size() && prompt.blocks[n].retention != retention_class::none) ++n;
        return n;
    }
};

}  // namespace warmctx
