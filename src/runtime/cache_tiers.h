// runtime/cache_tiers.h - where a context_engine keeps prefixes outside its work streams:
// the RAM pool that holds them (kv_pool.h), the prefix cache that indexes the pool, and
// the disk tier below both (disk_kv_tier.h); and, per work stream, the disk write-through
// its last turn deferred. What moves KV between the streams and these tiers is
// stream_moves.h.
//
// Thread safety: none (the engine thread's).
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "disk_kv_tier.h"
#include "kv_pool.h"
#include "warmctx/context_engine.h"

namespace warmctx {

// Holder ids of the RAM pool: far above any engine sequence.
constexpr seq_id k_first_pool_holder = seq_id{1} << 20;

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
    // Since when the stream owes the disk a write: the turn that deferred it, or the
    // earliest one whose write a later turn's in place took over
    // (context_engine_options::write_through_max_delay_ms bounds it).
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
};

struct cache_tiers {
    // `e` and `prof` (the engine's profile now) are those the deferred writes save with.
    cache_tiers(engine & e, const profile & prof) : eng(e), prof(prof) {}

    engine & eng;
    const profile & prof;
    std::unique_ptr<kv_pool> pool;
    std::unique_ptr<prefix_cache> cache;
    std::unique_ptr<disk_kv_tier> disk;
    std::map<seq_id, deferred_write> deferred;  // at most one per work stream

    // Every stream's deferred write, made now.
    void flush_deferred() {
        while (!deferred.empty()) flush_deferred_of(deferred.begin()->first);
    }
    void flush_deferred_of(seq_id seq) {
        auto it = deferred.find(seq);
        if (it == deferred.end()) return;
        deferred_write d = std::move(it->second);
        deferred.erase(it);
        disk->write_through(eng, prof, d.seq, d.workspace, d.prompt, d.n_blocks);
    }
    // The stream's write from now on `d`: one per stream, so an earlier one the stream's
    // turn kept in place is covered, unless it reaches further (then it is made now).
    void defer(deferred_write d) {
        if (auto old = deferred.find(d.seq); old != deferred.end() && old->second.save_end > d.save_end)
            flush_deferred_of(d.seq);
        else if (old != deferred.end())
            d.since = std::min(d.since, old->second.since);  // still owed: as old as the first
        const seq_id seq = d.seq;
        deferred[seq] = std::move(d);
    }
};

}  // namespace warmctx
