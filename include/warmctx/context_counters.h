// warmctx/context_counters.h - what a context_engine counts: turns and tokens per
// workspace, pre-warms, the cache, the disk tier, and every byte of KV it holds
// (context_engine::counters; /metrics renders them).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "warmctx/prefix_cache.h"

namespace warmctx {

struct workspace_counters {
    uint64_t n_turns = 0;
    uint64_t n_prompt_tokens = 0;
    uint64_t n_reused_tokens = 0;     // hit tokens
    uint64_t n_prefilled_tokens = 0;  // miss tokens
    uint64_t n_generated_tokens = 0;
    std::map<std::string, uint64_t> misses_by_kind;
    // Where the workspace's last prompt's prefix is now (context_engine::counters, for the
    // workspaces used last): "stream" (a KV stream, on the device when the model is),
    // "pool" (the RAM pool), "disk" (a snapshot file; the engine holds none of it) or
    // "none"; and how many of its tokens the stream or the pool holds. Not in `total`.
    std::string held_in;
    uint64_t n_held_tokens = 0;
};

struct tier_counters {
    uint64_t n_restores_disk = 0;
    uint64_t n_restored_tokens = 0;
    uint64_t n_writes_disk = 0;
    uint64_t n_write_failures_disk = 0;  // a full disk, say (also logged)
    uint64_t n_restore_failures = 0;     // a tier's file failed its checks: fell back
    uint64_t n_shared_restores = 0;      // restores served by an earlier restore's bytes
    uint64_t disk_write_queue_writes = 0, disk_write_queue_bytes = 0;  // gauges: snapshots queued for the disk writer
    uint64_t n_write_drops_disk = 0;     // write-throughs dropped: the write queue was full (also in failures)
    uint64_t disk_bytes = 0, disk_files = 0;
    uint64_t disk_quarantine_files = 0, disk_quarantine_bytes = 0;  // in the disk budget
    uint64_t n_evicted_files_disk = 0;   // snapshot files this process evicted for the disk budget
    uint64_t n_gone_files_disk = 0;      // loads of a file removed behind the index (a shared
                                         // directory: another replica evicted it); misses
    // Write-throughs' copies of the KV out of the engine, on the engine thread (the rest
    // of a write is the writer thread's): how many, and their time.
    uint64_t n_disk_copies_out = 0;
    double disk_copy_out_ms = 0;
};

// Every byte of KV the engine holds. Streams are allocated whole (n_ctx cells each) when
// the engine opens; the pool holds each cached prefix's own cells.
struct kv_memory {
    uint64_t streams_allocated_bytes = 0;  // n_streams * n_ctx * bytes per token
    uint64_t streams_used_bytes = 0;       // tokens in the streams * bytes per token
    uint64_t pool_bytes = 0;               // cached prefixes' saved states
    uint64_t pool_allocated_bytes = 0;     // their buffers
    uint64_t pool_entries = 0;
    uint64_t allocated_bytes = 0;          // streams + pool + checkpoints + state scratch, allocated
    uint64_t used_bytes = 0;               // streams + pool + checkpoints, used
    uint64_t n_pool_loads = 0, pool_loaded_bytes = 0;
    double pool_load_ms = 0;
    uint64_t n_pool_saves = 0, pool_saved_bytes = 0;
    double pool_save_ms = 0;
    uint64_t n_in_place_turns = 0;         // warm turns that copied nothing
    uint64_t n_padded_decodes = 0;         // decodes padded to 64 rows (engine::pad_rows)
    uint64_t n_prefill_decodes = 0;        // decode calls of prefills (engine::prefill_decodes)
    uint64_t n_write_backs = 0;            // a stream's blocks offered to the pool (lazily)
    double write_back_ms = 0;              // time spent on those write-backs
    uint64_t n_write_backs_ahead = 0;      // of them, made by an idle engine (write_back_ahead),
                                           // on no turn's way
    uint64_t n_streams = 0;                // work streams, the resident ones included
    uint64_t n_resident_streams = 0;       // of which resident (the device tier)
    bool streams_on_device = false;        // the model's layers (and so the KV) are on a GPU
    uint64_t n_stream_copies = 0;          // prefixes copied stream to stream (device)
    uint64_t n_branches_parked = 0;        // trimmed blocks kept by a copy into a free stream
    uint64_t n_branches_dropped = 0;       // trimmed blocks of low retention not saved
    uint64_t n_branches_too_costly = 0;    // trimmed blocks not saved: the save would cost more than a re-prefill
    uint64_t n_deferred_writes_parked = 0;  // disk writes moved with their stream into a free one
    uint64_t n_deferred_writes_cut = 0;     // disk writes cut to what their workspace's next turn kept
    uint64_t n_write_throughs_overdue = 0;  // disk writes made while busy, write_through_max_delay_ms old
    // Checkpoints (engine.h, memory_kind): the streams' windows or recurrent states at
    // block ends, held in host RAM beside the streams (the pool's are in pool_bytes).
    uint64_t checkpoint_bytes = 0;
    uint64_t state_scratch_bytes = 0;      // allocated to move states, holding none (engine::state_scratch_bytes)
    uint64_t checkpoint_size_bytes = 0;    // one checkpoint (0: the model needs none)
    uint64_t checkpoint_max_bytes = 0;     // their bound (context_engine_options::stream_checkpoint_max_bytes; 0: none)
    uint64_t n_checkpoint_evictions = 0;   // streams cleared to keep their checkpoints within it
    uint64_t n_checkpoints_taken = 0;      // checkpoints prefills took (engine::checkpoints_taken)
    uint64_t n_checkpoints_thinned = 0;    // dropped past a stream's count or the bytes' bound
    double checkpoint_ms = 0;              // the engine thread's time taking them (engine::checkpoint_ms)
    uint64_t n_reuse_refused = 0;          // turns served cold: their prefix could not be taken
    std::string memory_kind = "plain";     // memory_kind_name of the model (warmctx/engine.h)
    bool reuse_across_turns = true;        // false: the model's memory is served without reuse
};

struct prewarm_counters {
    uint64_t n_prewarms = 0;            // pre-warm turns finished (complete or not)
    uint64_t n_already_cached = 0;      // of which found everything cached: did nothing
    uint64_t n_preempted = 0;           // stopped early for a turn of their workspace
    uint64_t n_prefilled_tokens = 0;    // tokens they prefilled
    uint64_t n_served_turns = 0;        // turns that reused what a pre-warm left
};

struct context_counters {
    workspace_counters total;           // turns (pre-warms are counted in `prewarm`)
    prewarm_counters prewarm;
    std::map<std::string, workspace_counters> workspaces;
    cache_counters cache;
    tier_counters tiers;
    kv_memory memory;
};

}  // namespace warmctx
