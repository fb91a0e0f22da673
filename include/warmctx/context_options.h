// warmctx/context_options.h - how a context_engine is opened: the engine, the streams,
// the cache's budgets and policy, the kind table, the tenant, the disk tier, and the
// bounds on what it remembers per workspace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "warmctx/engine.h"
#include "warmctx/eviction_policy.h"
#include "warmctx/kind_table.h"
#include "warmctx/prefix_cache.h"
#include "warmctx/volatility.h"

namespace warmctx {

class file_system;

// The tier below the engine's KV and its RAM pool: disk. Write-through: when a turn
// caches a prefix, its leading run of blocks of at least the tier's class is written to
// disk unless the tier already holds it, so it survives eviction from the pool, a
// restart or a crash. A lookup that finds a longer prefix on disk than in the engine
// restores it from there, and the turn then caches it in the pool again (promotion).
struct tier_options {
    std::string cache_dir;                          // disk tier directory ("" = no disk tier)
    file_system * disk_fs = nullptr;                // the disk tier's file system (nullptr: the real
                                                    // one); must outlive the engine (tests inject faults)
    uint64_t disk_budget_bytes = 0;                 // 0 = unlimited
    retention_class disk_min_class = retention_class::high;
    // Other processes use cache_dir too (replicas sharing one disk tier): see
    // store/snapshot_store.h, "Shared directory".
    bool shared_dir = false;
};

struct context_engine_options {
    engine_options engine;            // its n_seq_max is set to n_work_seqs (+ 1: cold_stream);
                                      // its n_seq_resident streams (none with cold_stream)
                                      // become work streams too: the device tier
    // A prefix another idle stream holds is copied stream to stream (llama.cpp copies the
    // whole stream, keeping its cell layout: exact) instead of through the RAM pool. On a
    // GPU that is a device-to-device copy (an 805 MB stream in about a millisecond on an
    // H200), against a save to host RAM and a load back; on the CPU it copies n_ctx cells
    // where the pool copies the prefix's own, so `automatic` turns it on only where the
    // model's layers run on a GPU.
    enum class stream_copy_mode { automatic, on, off };
    stream_copy_mode stream_copies = stream_copy_mode::automatic;
    // A KV stream of its own for run_cold, the reference runs of verify, the benches and
    // the tests. serve has none: every stream it allocates runs turns.
    bool cold_stream = true;
    uint32_t n_holders = 4096;        // at most this many cached prefixes in the pool (each
                                      // is compact: the byte budget is the real bound)
    uint32_t n_work_seqs = 1;         // turns in flight at once (the scheduler's n_parallel)
    cache_budget budget;              // bytes_per_token is filled from the engine
    uint64_t workspace_max_bytes = 0; // per-workspace byte budget (0 = none); becomes a
                                      // token budget once the KV bytes per token are known
    // Bytes of RAM the streams' checkpoints may hold together (a hybrid's recurrent state
    // or a window at each block end of what a stream holds; 0 = no bound). Past it, after
    // a turn, the idle stream finished longest ago gives its prefix to the pool (under
    // the pool's budget, with its checkpoints) and is cleared, until the rest fit or only
    // busy streams hold any; then the busy ones are thinned (below).
    uint64_t stream_checkpoint_max_bytes = 0;
    // The most checkpoints one stream keeps (a long conversation takes one or more every
    // turn). Past it, the one whose loss costs the least goes: the nearest to the one
    // before it (a turn that would resume there prefills that distance more); never one
    // of the deepest four (where the next turns resume). As llama-server's 32 a slot, but
    // at block ends.
    uint32_t stream_checkpoint_max_count = 32;
    // How far apart (tokens) the block ends a prefill takes checkpoints at must be: -1 =
    // what taking one costs in prefilled tokens (its measured time at the measured rate;
    // on a CPU nearly every block end, out of a GPU's 4B hybrid ~100 tokens); 0 = every one.
    int32_t checkpoint_gap_tokens = -1;
    eviction_policy policy = eviction_policy::semantic;
    kind_table kinds;
    // Per workspace, the learned order of its stable segments and their finer blocks
    // (warmctx/volatility.h); `enabled = false` (--fixed-order) keeps the kind table's
    // order and whole chunks.
    volatility_options volatility;
    std::string tenant_salt;          // two tenants never share a cache entry
    tier_options tiers;
    // A finished turn's disk write-through (the copy of its prefix out of the stream)
    // waits until no turn has finished for this long (context_engine::write_through_idle):
    // an agent's next turn usually comes sooner and would otherwise wait in the queue for
    // that copy (~190 ms for 19k tokens of a 0.5B model out of an H100).
    uint32_t write_through_delay_ms = 500;
    // ... but a stream's write waits at most this long, even while turns keep the engine
    // busy (and a workspace's turns keep taking its write over in place): made between two
    // decode steps once it is this old and no request waits or prefills, or once it is
    // twice as old (context_engine::write_through_overdue). What a crash or a kill can
    // lose of what turns cached; 0: no bound (idle only).
    uint32_t write_through_max_delay_ms = 10000;
    // What the engine remembers per workspace (its last turn, for explain; its counters)
    // is bounded: past this many workspaces, or past this many tokens of remembered
    // prompts, the least recently used workspace is forgotten (its cached KV is not
    // touched: reuse is by content; only explain's comparison with its last turn goes).
    size_t max_workspaces = 1024;
    size_t max_remembered_tokens = size_t{8} << 20;  // 32 MiB of token ids
};

}  // namespace warmctx
