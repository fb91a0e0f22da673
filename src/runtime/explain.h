// runtime/explain.h - why a turn reused what it did: the miss classification behind
// every explain_report (context_engine::begin_turn and context_engine::explain).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "warmctx/context_engine.h"

namespace warmctx {

// A workspace's last turn: what the next turn is compared against.
struct workspace_history {
    manifest last_manifest;
    profile last_profile;
    std::vector<token_id> last_tokens;
    std::vector<block> last_blocks;
    pos_t last_stable_end = 0;
    bool has_turn = false;
    uint64_t t_last_used = 0;  // the turn clock of its last turn (least recently used goes first)
    std::optional<prewarm_info> prewarm;  // its last pre-warm, until a turn is served from it
};

struct explain_inputs {
    const std::string & workspace;
    const assembled_prompt & prompt;
    const match & m;                      // what serves the reuse (a holder or a tier's file)
    pos_t reuse = 0;                      // snapped (snap_reuse)
    const workspace_history * history = nullptr;  // the workspace's last turn, if any
    const profile & prof;                 // the profile now
    const prefix_cache & cache;           // for eviction records (read only)
    double prefill_tokens_per_ms = 0;     // measured rate (0: not measured yet)
    // The profile of the workspace's newest snapshot in a tier (disk_kv_tier::newest_profile):
    // with no previous turn to compare with (after a restart), a snapshot made under
    // another profile names the drift.
    std::optional<profile> snapshot_profile = std::nullopt;
};

// Per-segment reuse, the miss kind and a reason a person can act on, the profile fields
// that drifted, the eviction that lost the next block, and where snapping moved the
// reuse point. Pure: reads its inputs, changes nothing. `tier` is left to the caller.
explain_report explain_turn(const explain_inputs & in);

}  // namespace warmctx
