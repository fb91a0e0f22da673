// verify's oracle: what a turn may legitimately reuse and how it must be explained, and
// the report. Pure (no engine): the unit tests link it without llama.cpp.
#include "runtime/verify.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace warmctx {

std::string verify_mismatch::to_string() const {
    char diff[32];
    std::snprintf(diff, sizeof diff, "%g", max_logit_diff);
    return "scenario-" + std::to_string(scenario) + " " + step + ": warm differs from cold (tokens " +
           (tokens_equal ? "equal" : std::to_string(n_tokens_agree) + "/" + std::to_string(n_tokens) + " agree") +
           ", logits " + (logits_equal ? "equal" : std::string("differ, max |diff| ") + diff) + ")";
}

std::string verify_failure::to_string() const {
    return "scenario-" + std::to_string(scenario) + " " + step + ": " + message + " (reused " +
           std::to_string(n_reused) + ", " + reason + ")";
}

double verify_report::token_agreement() const {
    return n_tokens_compared ? (double)n_tokens_agree / (double)n_tokens_compared : 1.0;
}

bool verify_report::passed() const { return failures.empty() && (mode != "exact" || mismatches.empty()); }

nlohmann::json verify_report::to_json() const {
    std::vector<std::string> f;
    for (const auto & x : failures) f.push_back(x.to_string());
    return {
        {"mode", mode},
        {"model", model},
        {"scenarios", scenarios},
        {"scenarios_asked", scenarios_asked},
        {"turns", turns},
        {"mismatches", mismatched_scenarios},
        {"turn_mismatches", mismatches.size()},
        {"max_logit_diff", max_logit_diff},
        {"token_agreement", token_agreement()},
        {"expectation_failures", failures.size()},
        {"failures", f},
        {"tokens_reused", tokens_reused},
        {"tokens_prefilled", tokens_prefilled},
        {"results", results},
        {"elapsed_ms", elapsed_ms},
        {"seed", seed},
        {"policy", policy},
        {"budget_tokens", budget_tokens},
        {"evictions_by_class", evictions_by_class},
        {"whole_holder_evictions", whole_holder_evictions},
        {"backend", backend},
        {"memory", memory},
        {"stream_copies", stream_copies},
        {"n_stream_copies", n_stream_copies},
        {"n_branches_parked", n_branches_parked},
        {"n_pool_loads", n_pool_loads},
        {"n_write_backs", n_write_backs},
        {"n_padded_decodes", n_padded_decodes},
        {"n_fused_turns", n_fused_turns},
        {"n_fused_conversations", n_fused_conversations},
        {"n_drafted", n_drafted},
        {"n_draft_accepted", n_draft_accepted},
        {"max_drafted_logit_diff", max_drafted_logit_diff},
    };
}

// ---- the oracle ---------------------------------------------------------------

void cache_model::note_cached(std::span<const block> blocks) {
    for (const block & b : blocks) cached_.insert(b.chain);
}

pos_t cache_model::max_reuse(std::span<const block> blocks, pos_t n_tokens) const {
    // Lookups (prefix cache and tiers) match a leading run of the path.
    pos_t reuse = 0;
    for (const block & b : blocks) {
        if (!cached_.count(b.chain) || b.end >= n_tokens) break;
        reuse = b.end;
    }
    return reuse;
}

std::vector<std::string> check_turn(const turn_expectation & want, const explain_report & ex) {
    std::vector<std::string> out;
    if (want.min_reuse >= 0 && ex.n_reused < want.min_reuse)
        out.push_back("expected a hit of at least " + std::to_string(want.min_reuse) + " tokens");
    if (want.max_reuse >= 0 && ex.n_reused > want.max_reuse)
        out.push_back("expected a miss at token " + std::to_string(want.max_reuse));
    if (want.max_cached >= 0 && ex.n_reused > want.max_cached)
        out.push_back("reused more than the " + std::to_string(want.max_cached) +
                      " tokens ever cached for this prompt under this profile");
    if (!want.tier.empty() && kv_tier_name(ex.tier) != want.tier)
        out.push_back("expected a restore from the " + want.tier + " tier, got " + std::string(kv_tier_name(ex.tier)));
    if (want.in_place == 1 && !ex.in_place) out.push_back("expected the turn to reuse its work stream in place");
    if (want.in_place == 0 && ex.in_place)
        out.push_back("expected the prefix loaded into the work stream, not in place");
    if (!want.changed_segment.empty() &&
        (ex.kind != miss_kind::segment_changed || ex.missed_segment != want.changed_segment))
        out.push_back("expected the miss to be explained as a change of segment '" + want.changed_segment + "'");
    if (!want.drifted_field.empty() && ex.n_reused < ex.n_cacheable) {
        if (ex.kind != miss_kind::profile_drift) out.push_back("expected the miss to be explained as profile drift");
        bool named = false;
        for (const auto & f : ex.drifted_fields) named |= f.rfind(want.drifted_field, 0) == 0;
        if (!named) out.push_back("expected explain to name the drifted field " + want.drifted_field);
    }
    return out;
}

// ---- the scenarios ------------------------------------------------------------

}  // namespace warmctx
