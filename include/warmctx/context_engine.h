// warmctx/context_engine.h - one request's whole flow, from segments to cache update.
//
//   segments ─▶ assemble (canonical order, per-segment tokens, manifest, block chain)
//            ─▶ prefix cache lookup (longest cached prefix, snapped to a block end)
//            ─▶ copy the holder into the work sequence, trim at the reuse point
//            ─▶ prefill the rest in canonical chunks ─▶ decode
//            ─▶ insert the prompt's cacheable blocks (evicting under budgets)
//
// Every turn carries an explain_report: per segment the tokens reused and prefilled,
// and for a miss the reason (segment changed, profile drift, eviction, snapping, cold).
// explain() produces the same report for a hypothetical request without running it.
//
// Sequences: 0 is the work sequence, 1 the cold-reference sequence (run_cold), and
// 2 .. 2+n_holders-1 belong to the prefix cache.
//
// Thread safety: none. One thread (the engine thread) owns a context_engine.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "warmctx/assembler.h"
#include "warmctx/engine.h"
#include "warmctx/kind_table.h"
#include "warmctx/prefix_cache.h"
#include "warmctx/profile.h"
#include "warmctx/status.h"

namespace warmctx {

struct context_engine_options {
    engine_options engine;            // its n_seq_max is set to 2 + n_holders
    uint32_t n_holders = 4;           // cached prefixes kept resident at once
    cache_budget budget;              // bytes_per_token is filled from the engine
    uint64_t workspace_max_bytes = 0; // per-workspace byte budget (0 = none); becomes a
                                      // token budget once the KV bytes per token are known
    eviction_policy policy = eviction_policy::semantic;
    kind_table kinds;
    std::string tenant_salt;          // two tenants never share a cache entry
};

struct turn_request {
    std::string workspace = "default";
    std::vector<segment> segments;
    sampling_params sampling;
    bool add_generation_prompt = true;
    bool keep_logits = false;         // fill turn_result::prompt_logits / gen_logits
    bool cache = true;                // cache the prompt's cacheable blocks afterwards
};

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

struct segment_explain {
    std::string id;
    segment_kind kind = segment_kind::user;
    retention_class cls = retention_class::none;
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
    pos_t n_common_tokens = -1;       // token prefix shared with the previous turn (-1: none)
    pos_t snapped_from = -1;          // n_common_tokens when snapping moved the reuse point
    double predicted_prefill_ms = -1; // from the measured prefill rate (-1: not measured yet)
    std::string stable_prefix_hash;
    std::vector<segment_explain> segments;

    nlohmann::json to_json() const;
    std::string to_text() const;
};

struct turn_result {
    generation gen;
    explain_report explain;
    manifest man;
    std::string stable_prefix_hash;
    double t_total_ms = 0;            // assemble .. generation done (cache update excluded)
    double t_assemble_ms = 0;
    double t_copy_ms = 0;             // holder -> work sequence
    double t_prefill_ms = 0;
    double t_first_token_ms = 0;      // assemble .. first token chosen
    double t_decode_ms = 0;
    double t_cache_update_ms = 0;     // insert after the turn
    std::vector<float> prompt_logits; // keep_logits: logits after the prompt
    std::vector<float> gen_logits;    // keep_logits: logits of every generation step
};

struct workspace_counters {
    uint64_t n_turns = 0;
    uint64_t n_prompt_tokens = 0;
    uint64_t n_reused_tokens = 0;     // hit tokens
    uint64_t n_prefilled_tokens = 0;  // miss tokens
    uint64_t n_generated_tokens = 0;
    std::map<std::string, uint64_t> misses_by_kind;
};

struct context_counters {
    workspace_counters total;
    std::map<std::string, workspace_counters> workspaces;
    cache_counters cache;
};

class context_engine {
  public:
    static result<std::unique_ptr<context_engine>> open(const context_engine_options & opts);
    ~context_engine();

    // One turn through the warm path. Errors: those of assemble, prefill and generate;
    // the workspace's state is unchanged on error.
    result<turn_result> run_turn(const turn_request & req);
    // The same prompt computed cold in a fresh sequence, the cache untouched: the
    // reference every warm answer must equal.
    result<turn_result> run_cold(const turn_request & req);
    // What run_turn would do, without running anything (no counters, no LRU touch).
    result<explain_report> explain(const turn_request & req) const;
    // Assembles without running (manifest, tokens, hashes).
    result<assembled_prompt> assemble_request(const turn_request & req) const;

    // Pins (or unpins) the stable blocks of the workspace's last turn.
    status pin_workspace(const std::string & workspace, bool pinned);
    void drop_workspace(const std::string & workspace);

    // Changes the canonical chunk size (a profile field): every cached prefix stops
    // matching and explain names the drift. REQUIRES 1 <= n <= the engine's chunk.
    status set_chunk_tokens(uint32_t n);

    const profile & current_profile() const;
    context_counters counters() const;
    engine & raw_engine();
    const prefix_cache & cache() const;

  private:
    struct impl;
    explicit context_engine(std::unique_ptr<impl> p);
    std::unique_ptr<impl> p_;
};

// The text_model the assembler needs, over a real engine (tokenizer + chat template).
std::unique_ptr<text_model> make_engine_text_model(const engine & e);

}  // namespace warmctx
