#include "server/explain_format.h"

#include <cstdio>
#include <sstream>

namespace warmctx {

nlohmann::json explain_json(const explain_report & r) {
    nlohmann::json segs = nlohmann::json::array();
    for (const auto & s : r.segments)
        segs.push_back({{"id", s.id}, {"kind", segment_kind_name(s.kind)}, {"class", retention_class_name(s.retention)},
                        {"token_begin", s.token_begin}, {"token_end", s.token_end},
                        {"tokens_reused", s.n_reused}, {"tokens_prefilled", s.n_prefilled}});
    nlohmann::json j = {
        {"workspace", r.workspace},
        {"prompt_tokens", r.n_prompt_tokens},
        {"tokens_reused", r.n_reused},
        {"tokens_prefilled", r.n_prefilled},
        {"tokens_cacheable", r.n_cacheable},
        {"result", miss_kind_name(r.kind)},
        {"reason", r.reason},
        {"missed_segment", r.missed_segment},
        {"matched_workspace", r.matched_workspace},
        {"drifted_fields", r.drifted_fields},
        {"changed_segments", r.changed_segments},
        {"common_tokens_with_previous_turn", r.n_common_tokens},
        {"snapped_from", r.snapped_from},
        {"predicted_prefill_ms", r.predicted_prefill_ms},
        {"stable_prefix_hash", r.stable_prefix_hash},
        {"tier", kv_tier_name(r.tier)},
        {"in_place", r.in_place},
        {"reordered", r.reordered},
        {"order_note", r.order_note},
        {"memory", {{"kind", r.memory_kind}, {"note", r.memory_note}}},
        {"generation_prompt_fused", r.generation_prompt_fused},
        {"conversation_fused", r.conversation_fused},
        {"segments", segs},
    };
    j["prewarm"] = prewarm_json(r.prewarm);
    if (r.eviction) {
        j["eviction"] = {{"class", retention_class_name(r.eviction->retention)}, {"at", r.eviction->at},
                         {"workspace", r.eviction->workspace}, {"reason", r.eviction->reason},
                         {"policy", eviction_policy_name(r.eviction->policy)},
                         {"token_begin", r.eviction->begin}, {"token_end", r.eviction->end}};
    } else {
        j["eviction"] = nullptr;
    }
    return j;
}

nlohmann::json prewarm_json(const std::optional<prewarm_info> & p) {
    if (!p) return nullptr;
    return {{"complete", p->complete},
            {"finished_unix_ms", p->finished_unix_ms},
            {"duration_ms", p->duration_ms},
            {"tokens_prefilled", p->n_prefilled},
            {"tokens_cached", p->n_cached},
            {"tokens_target", p->n_target},
            {"tokens_found", p->n_found},
            {"found_in", kv_tier_name(p->found_tier)},
            {"ahead", p->leading}};
}

std::string explain_text(const explain_report & r) {
    std::ostringstream o;
    char line[512];
    std::snprintf(line, sizeof line, "workspace %s: %d prompt tokens, %d reused (from %s), %d prefilled (%s)\n",
                  r.workspace.c_str(), r.n_prompt_tokens, r.n_reused, std::string(kv_tier_name(r.tier)).c_str(),
                  r.n_prefilled, std::string(miss_kind_name(r.kind)).c_str());
    o << line << "  why: " << r.reason << "\n";
    if (r.predicted_prefill_ms >= 0) {
        std::snprintf(line, sizeof line, "  predicted prefill: %.0f ms\n", r.predicted_prefill_ms);
        o << line;
    }
    if (r.prewarm) {
        std::snprintf(line, sizeof line,
                      "  served from a pre-warm%s: %d tokens cached of %d, %d prefilled by it in %.0f ms\n",
                      r.prewarm->complete ? "" : " stopped early for this turn", r.prewarm->n_cached,
                      r.prewarm->n_target, r.prewarm->n_prefilled, r.prewarm->duration_ms);
        o << line;
    }
    if (!r.order_note.empty() && !r.reordered) o << "  order: " << r.order_note << "\n";
    if (!r.memory_kind.empty() && r.memory_kind != "plain") o << "  memory: " << r.memory_note << "\n";
    o << "  stable prefix hash: " << r.stable_prefix_hash << "\n";
    std::snprintf(line, sizeof line, "  %-28s %-13s %-8s %13s %8s %10s\n", "segment", "kind", "class", "tokens",
                  "reused", "prefilled");
    o << line;
    for (const auto & s : r.segments) {
        std::string range = std::to_string(s.token_begin) + ".." + std::to_string(s.token_end);
        std::snprintf(line, sizeof line, "  %-28.28s %-13s %-8s %13s %8d %10d\n", s.id.c_str(),
                      std::string(segment_kind_name(s.kind)).c_str(),
                      std::string(retention_class_name(s.retention)).c_str(), range.c_str(), s.n_reused, s.n_prefilled);
        o << line;
    }
    return o.str();
}

}  // namespace warmctx
