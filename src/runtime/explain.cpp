#include "explain.h"

#include <algorithm>

namespace warmctx {

std::string_view miss_kind_name(miss_kind k) {
    switch (k) {
        case miss_kind::full_hit: return "full_hit";
        case miss_kind::cold: return "cold";
        case miss_kind::segment_changed: return "segment_changed";
        case miss_kind::profile_drift: return "profile_drift";
        case miss_kind::evicted: return "evicted";
        case miss_kind::not_cached: return "not_cached";
    }
    return "cold";
}

std::string_view kv_tier_name(kv_tier t) {
    switch (t) {
        case kv_tier::none: return "none";
        case kv_tier::engine: return "engine";
        case kv_tier::disk: return "disk";
    }
    return "none";
}

namespace {

// The first change at or before block `b` (the first not reused) explains the miss; an
// edit of content before a change of tokens alone, which it may have caused: a template
// may render one segment into another's text (Qwen2.5's writes the tools into the system
// message, so an edit of the tools changes the system message's tokens, wherever the
// tools segment sits in the order). When the workspace's learned order changed with this
// prompt (`reordered`), the segments between moved only; the edit that moved them (a
// changed segment now later) explains the miss.
std::optional<segment_change> change_that_stopped_reuse(const manifest & before, const manifest & now,
                                                        const block & b, bool reordered) {
    std::optional<segment_change> cause, tokens_only, content_later;
    for (const auto & c : diff_manifests(before, now)) {
        if (c.what == segment_change_kind::moved) continue;
        const bool tokens = c.what == segment_change_kind::tokens_changed;
        if (c.after_begin > b.begin) {
            if (!tokens && !content_later) content_later = c;
            continue;
        }
        if (tokens) {
            if (!tokens_only) tokens_only = c;
            continue;
        }
        cause = c;
        break;
    }
    if (!cause) cause = tokens_only && content_later ? content_later : tokens_only;
    if (!cause && reordered) cause = content_later;
    return cause;
}

}  // namespace

explain_report explain_turn(const explain_inputs & in) {
    const assembled_prompt & prompt = in.prompt;
    const match & m = in.m;
    const pos_t reuse = in.reuse;
    explain_report r;
    r.workspace = in.workspace;
    r.n_prompt_tokens = (pos_t)prompt.tokens.size();
    r.n_reused = reuse;
    r.n_prefilled = r.n_prompt_tokens - reuse;
    r.matched_workspace = reuse > 0 ? m.workspace : "";
    r.stable_prefix_hash = prompt.stable_prefix_hash.hex();
    r.reordered = prompt.reordered;
    r.order_note = prompt.order_note;
    r.generation_prompt_fused = prompt.hints.fuse_generation_prompt;
    r.conversation_fused = prompt.hints.fuse_conversation;
    r.n_cacheable = 0;
    for (const auto & b : prompt.blocks) {
        if (b.retention == retention_class::none) break;
        r.n_cacheable = b.end;
    }
    for (const auto & e : prompt.prompt_manifest.segments) {
        segment_explain s;
        s.id = e.id;
        s.kind = e.kind;
        s.retention = e.retention;
        s.token_begin = e.token_begin;
        s.token_end = e.token_end;
        s.n_reused = std::clamp(reuse - e.token_begin, 0, e.n_tokens());
        s.n_prefilled = e.n_tokens() - s.n_reused;
        r.segments.push_back(s);
    }
    if (in.prefill_tokens_per_ms > 0) r.predicted_prefill_ms = r.n_prefilled / in.prefill_tokens_per_ms;

    const workspace_history * st = in.history;
    if (st && st->has_turn) {
        for (const auto & c : diff_manifests(st->last_manifest, prompt.prompt_manifest))
            if (c.what != segment_change_kind::moved) r.changed_segments.push_back(c.to_string());
        pos_t common = 0;
        const size_t n = std::min(st->last_tokens.size(), prompt.tokens.size());
        while ((size_t)common < n && st->last_tokens[common] == prompt.tokens[common]) ++common;
        r.n_common_tokens = common;
    }
    // Where did reuse stop, and why?
    if (r.n_cacheable > 0 && m.n_tokens >= r.n_cacheable) {
        r.kind = miss_kind::full_hit;
        r.reason = "every cacheable block was reused; prefilling only the uncacheable tail";
    } else if (r.n_cacheable == 0) {
        r.kind = miss_kind::cold;
        r.reason = "nothing in this prompt is cacheable (it starts with a segment of class none)";
    } else {
        size_t next = 0;  // the first block not reused
        while (next + 1 < prompt.blocks.size() && prompt.blocks[next].end <= reuse) ++next;
        const block & b = prompt.blocks[next];
        if (b.segment_index >= 0 && (size_t)b.segment_index < prompt.prompt_manifest.segments.size())
            r.missed_segment = prompt.prompt_manifest.segments[(size_t)b.segment_index].id;
        auto ev = in.cache.last_eviction(b.chain);
        // The profile the workspace's KV was last computed under: its previous turn's, or
        // with none remembered (a restart), its newest snapshot's.
        const bool has_turn = st && st->has_turn;
        const profile * before = has_turn ? &st->last_profile
                                 : in.snapshot_profile ? &*in.snapshot_profile
                                                       : nullptr;
        if (before && !(*before == in.prof)) {
            r.kind = miss_kind::profile_drift;
            r.drifted_fields = before->describe_drift(in.prof);
            std::string f;
            for (const auto & d : r.drifted_fields) f += (f.empty() ? "" : "; ") + d;
            r.reason = "profile drift (" + f + "): KV computed under the old profile cannot be reused" +
                       (has_turn ? "" : " (the workspace's newest snapshot was made under it)");
        } else if (ev) {
            r.kind = miss_kind::evicted;
            r.eviction = ev;
            r.reason = "segment '" + r.missed_segment + "' (class " + std::string(retention_class_name(ev->retention)) +
                       ") was evicted at t=" + std::to_string(ev->at) + ": " + ev->reason + " (policy " +
                       std::string(eviction_policy_name(ev->policy)) + ")";
        } else if (st && st->has_turn) {
            const std::optional<segment_change> cause =
                change_that_stopped_reuse(st->last_manifest, prompt.prompt_manifest, b, prompt.reordered);
            std::string changed;
            if (cause) {
                changed = cause->to_string();
                // The segment whose edit stopped reuse is the one the miss is about.
                if (cause->what != segment_change_kind::tokens_changed &&
                    cause->what != segment_change_kind::disappeared)
                    r.missed_segment = cause->id;
            }
            if (!changed.empty()) {
                r.kind = miss_kind::segment_changed;
                r.reason = changed + "; reuse stops at the first block that differs (token " +
                           std::to_string(reuse) + ")";
            } else {
                r.kind = miss_kind::not_cached;
                r.reason = "the prefix up to segment '" + r.missed_segment +
                           "' is not resident (its holder was replaced or never kept it)";
            }
        } else {
            r.kind = miss_kind::cold;
            r.reason = reuse > 0 ? "first turn of workspace '" + in.workspace + "'; " + std::to_string(reuse) +
                                       " tokens shared with workspace '" + m.workspace + "'"
                                 : "first turn of workspace '" + in.workspace +
                                       "' and no other workspace holds this prefix";
        }
    }
    if (r.reordered && r.kind != miss_kind::full_hit) r.reason += "; " + r.order_note;
    // Snapping: the previous turn shares more cacheable tokens than were reused,
    // but reuse can only stop at a block end.
    if (std::min(r.n_common_tokens, r.n_cacheable) > reuse) {
        r.snapped_from = std::min(r.n_common_tokens, r.n_cacheable);
        r.reason += "; " + std::to_string(r.snapped_from) +
                    " cacheable tokens match the previous turn, reuse snapped to " + std::to_string(reuse) +
                    " (a canonical block boundary)";
    }
    return r;
}

}  // namespace warmctx
