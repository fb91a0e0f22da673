// warmctx/explain_report.h - why a turn reused what it did: per segment the tokens
// reused and prefilled, and for a miss the reason (segment changed, profile drift,
// eviction, snapping, cold). Every turn carries one; context_engine::explain produces
// one for a hypothetical request. Formatting it (JSON, text) is the HTTP and
// command-line layers' (server/explain_format.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/prefix_cache.h"
#include "warmctx/segments.h"
#include "warmctx/types.h"

namespace warmctx {

// Why reuse stopped where it did.
enum class miss_kind {
    full_hit,        // every cacheable block was reused; only the uncacheable tail prefilled
    cold,            // nothing cached for this prompt (first turn of a workspace)
    segment_changed, // a segment differs from the workspace's previous turn
    profile_drift,   // a profile field changed (model, template, chunk size, ...)
    evicted,         // the next block was cached once and evicted
    not_cached,      // the next block was never cached (e.g. a holder was replaced)
};
std::string_view miss_kind_name(miss_kind k);

// Where a turn's reused KV came from: the engine (a work stream in place, or the RAM
// pool of cached prefixes) or the disk tier.
enum class kv_tier { none, engine, disk };
std::string_view kv_tier_name(kv_tier t);  // "none" | "engine" | "disk"

// A pre-warm of the workspace that ran before a turn (explain_report::prewarm): the turn
// was served from it.
struct prewarm_info {
    bool complete = true;           // false: stopped at a chunk boundary so that this turn
                                    // could start from what it had done (it was running)
    int64_t finished_unix_ms = 0;   // when it ended (wall clock)
    double duration_ms = 0;         // admission .. end
    pos_t n_prefilled = 0;          // tokens it prefilled (the rest was cached already)
    pos_t n_cached = 0;             // tokens of the prefix it left cached
    pos_t n_target = 0;             // the cacheable tokens it set out to cache
    pos_t n_found = 0;              // tokens it found cached ...
    kv_tier found_tier = kv_tier::none;  // ... in this tier (disk: restored after a restart)
    bool leading = false;           // this turn's own request started it, for its leading
                                    // segments, while the rest of its prompt tokenized
};

struct segment_explain {
    std::string id;
    segment_kind kind = segment_kind::user;
    retention_class retention = retention_class::none;
    pos_t token_begin = 0, token_end = 0;
    pos_t n_reused = 0;
    pos_t n_prefilled = 0;
};

struct explain_report {
    std::string workspace;
    pos_t n_prompt_tokens = 0;
    pos_t n_reused = 0;
    pos_t n_prefilled = 0;
    pos_t n_cacheable = 0;            // tokens before the first uncacheable block
    std::string matched_workspace;    // whose holder served the reuse ("" on a miss)
    miss_kind kind = miss_kind::cold;
    std::string reason;               // one sentence a person can act on
    std::string missed_segment;       // the segment where reuse stopped ("" on a full hit)
    std::vector<std::string> drifted_fields;   // profile_drift: "chunk_tokens: 512 -> 256"
    std::vector<std::string> changed_segments; // vs the workspace's previous turn
    std::optional<eviction_record> eviction;   // evicted: what, when, why
    kv_tier tier = kv_tier::none;     // where the reused KV came from
    bool in_place = false;            // engine tier: the work stream still held the prefix
                                      // from its last turn (trimmed; nothing copied)
    pos_t n_common_tokens = -1;       // token prefix shared with the previous turn (-1: none)
    pos_t snapped_from = -1;          // n_common_tokens when snapping moved the reuse point
    double predicted_prefill_ms = -1; // from the measured prefill rate (-1: not measured yet)
    std::string stable_prefix_hash;
    // The workspace's learned order of its stable segments (warmctx/volatility.h):
    // whether this prompt's differs from its last turn's, and why it changed or why a
    // better one was not taken ("" when there was nothing to weigh).
    bool reordered = false;
    std::string order_note;
    // The model's memory (warmctx/engine.h, memory_kind) and what it lets a turn reuse:
    // "plain", or e.g. "hybrid: ... checkpoint at every block end ..." ("" when unknown).
    std::string memory_kind;
    std::string memory_note;
    bool generation_prompt_fused = false;  // the last piece took the generation prompt in
    bool conversation_fused = false;       // the chat messages were one run of class none
    std::vector<segment_explain> segments;
    // Set on the first turn after a pre-warm of this workspace whose cached prefix it
    // reused (a pre-warm's own report leaves it empty).
    std::optional<prewarm_info> prewarm;
    // Formatting (JSON, text) is the HTTP and command-line layers' (server/explain_format.h).
};

}  // namespace warmctx
