// runtime/context_engine_impl.h - the state behind a context_engine, composed of one part
// per job, and what crosses the parts. Shared by the files that implement the engine:
// context_engine.cpp (a turn: begin, prefill, finish; open, explain, run_turn, run_cold),
// context_streams.cpp (the work streams: which one a turn takes, write-backs to the pool,
// copies between them) and context_workspaces.cpp (pins, snapshots, suspend and resume,
// branches, forgetting; the counters). The parts, each in its own header:
//
//   engine_path.h            the engine, its text model and profile: prefill, then generate
//   work_streams.h           what each work stream holds, and how much of a prompt
//   cache_tiers.h            the RAM pool, the prefix cache over it, the disk tier; the
//                            disk writes deferred per stream
//   stream_moves.h           KV between the streams and the tiers; the streams' checkpoints
//   workspace_histories.h    each workspace's last turn
//   workspace_volatility.h   what each workspace learned of how its segments change
#pragma once

#include <memory>
#include <string>

#include "cache_tiers.h"
#include "engine_path.h"
#include "stream_moves.h"
#include "work_streams.h"
#include "workspace_histories.h"
#include "workspace_volatility.h"
#include "warmctx/context_engine.h"

namespace warmctx {

struct context_engine::impl {
    // `e`: the engine opened with o.engine.
    impl(const context_engine_options & o, std::unique_ptr<engine> e);

    context_engine_options opts;      // as given, resolved by open (the engine's sequences, the budget)
    engine_path run;                  // the engine, and prefill and generate over it
    work_streams streams;             // one per work sequence
    cache_tiers tiers;                // where prefixes are kept outside the streams
    context_counters ctr;             // the tickers (counters() adds the gauges)
    stream_moves moves;               // over run's engine, the streams and the tiers; counts in ctr.memory
    workspace_histories workspaces;   // each workspace's last turn
    workspace_volatility volatility;  // what each workspace learned (read by assemble on HTTP threads)
    uint64_t turn_clock = 0;          // a logical clock: a tick per turn and per workspace call (LRU order)

    // Every deferred disk write made, and the learned states that changed handed to
    // their writer: what snapshots, pins and a stop need.
    void flush_deferred() {
        volatility.save();
        tiers.flush_deferred();
    }

    // Remembers `ws`'s last turn, then forgets least recently used workspaces (their
    // history and counters) past the bounds. The workspace just remembered stays.
    void remember(const std::string & ws, const pending_turn & t);
    void forget(const std::string & ws);

    // The tenant salt, with the request's cache_salt when it has one: the chain hashes' root.
    std::string salt_of(const turn_request & req) const;
    result<assembled_prompt> assemble(const turn_request & req) const;

    // Where the last-used workspaces' last prefixes are now (workspace_counters::held_in).
    void note_where_held(context_counters & c) const;
    explain_report explain(const std::string & ws, const assembled_prompt & prompt, const match & m, pos_t reuse,
                           kv_tier tier) const;
    void count(const std::string & ws, const explain_report & ex, size_t n_generated);
};

}  // namespace warmctx
