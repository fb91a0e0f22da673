// The prefix cache: policy, budgets and the engine seam around prefix_index.
//
// How an insert stays within budget ("plan first, then apply")
//   plan_insert runs the whole insert - choose a holder, add the path, evict until the
//   budgets hold - on a COPY of the index, and returns that copy (the plan). Nothing
//   real changes, so a plan that fails costs nothing. apply_insert then mirrors the
//   plan onto the engine by diffing each holder slot before/after: copy + trim for the
//   new holder, trim for a holder that got shorter, clear for one that was emptied or
//   refilled, and finally swaps the copy in. The copy costs O(cached blocks) per insert,
//   which is small next to the KV copy an insert implies, and it means the planner and
//   the mutation are the same code: they cannot disagree.
//
// Why an insert may be planned more than once
//   If the budget can be met only by cutting the new path regardless of policy (a
//   "forced cut": everything else left is pinned), the evictions made before the cut may
//   have been pointless. We then plan again with the path pre-cut to what survived, so
//   only the evictions needed for that shorter path happen. The cut length strictly
//   decreases, so this ends.
#include "warmctx/prefix_cache.h"

#include <algorithm>

#include "prefix_cache_impl.h"

namespace warmctx {

namespace {

// Among the holders holding `chain`, the one a match should use: one of
// `prefer_workspace`, then the most recently used, then the lowest seq.
int32_t pick_holder(const prefix_index & idx, const hash128 & chain, std::string_view prefer_workspace) {
    const index_node * n = idx.find(chain);
    int32_t best = -1;
    auto better = [&](int32_t a, int32_t b) {
        const index_holder & x = idx.holder(a);
        const index_holder & y = idx.holder(b);
        bool xp = !prefer_workspace.empty() && x.workspace == prefer_workspace;
        bool yp = !prefer_workspace.empty() && y.workspace == prefer_workspace;
        if (xp != yp) return xp;
        if (x.t_last_used != y.t_last_used) return x.t_last_used > y.t_last_used;
        return x.seq < y.seq;
    };
    for (int32_t s : n->slots)
        if (best < 0 || better(s, best)) best = s;
    return best;
}

}  // namespace

uint64_t prefix_cache::impl::workspace_max_tokens(const std::string & ws) const {
    auto it = budget_.workspace_max_tokens_override.find(ws);
    return it != budget_.workspace_max_tokens_override.end() ? it->second : budget_.workspace_max_tokens;
}

match prefix_cache::impl::peek(std::span<const block> path, std::string_view prefer_workspace) const {
    const size_t m = index_->longest_match(path);
    if (m == 0) return {};
    const index_holder & h = index_->holder(pick_holder(*index_, path[m - 1].chain, prefer_workspace));
    return {m, path[m - 1].end, h.seq, h.workspace};
}

match prefix_cache::impl::lookup(std::span<const block> path, uint64_t now, std::string_view prefer_workspace) {
    match r = peek(path, prefer_workspace);
    ++tickers_.n_lookups;
    // Ageing for semantic eviction's reuse counts: every k_hit_halving_period lookups all
    // counts halve, so a workspace busy long ago does not outrank one busy now for ever.
    if (tickers_.n_lookups % k_hit_halving_period == 0) index_->halve_hits();
    if (r.n_blocks == 0) return r;
    ++tickers_.n_lookup_hits;
    tickers_.n_hit_tokens += (uint64_t)r.n_tokens;
    index_->touch(path, r.n_blocks, index_->slot_of_seq(r.holder), now);
    index_->count_hit(path, r.n_blocks);
    return r;
}

result<prefix_cache::impl::insert_plan> prefix_cache::impl::plan_insert(const std::string & workspace,
                                                                        std::span<const block> path, size_t n_matched,
                                                                        uint64_t now) const {
    return planner(*this, pins_).plan(*index_, workspace, path, n_matched, now);
}

status prefix_cache::impl::insert(const std::string & workspace, std::span<const block> path, seq_id src_seq,
                                  uint64_t now, insert_outcome * outcome) {
    insert_outcome local;
    insert_outcome & out = outcome ? *outcome : local;
    out = {};

    // ---- validate (nothing changes on error)
    if (index_->slot_of_seq(src_seq) >= 0)
        return invalid_argument("prefix cache insert: src seq " + std::to_string(src_seq) + " is a holder seq");
    pos_t expect_begin = 0;
    for (size_t i = 0; i < path.size(); ++i) {
        if (path[i].begin != expect_begin || path[i].end <= path[i].begin)
            return invalid_argument("prefix cache insert: block " + std::to_string(i) + " is [" +
                                    std::to_string(path[i].begin) + ", " + std::to_string(path[i].end) +
                                    "), expected a non-empty block starting at " + std::to_string(expect_begin));
        expect_begin = path[i].end;
    }
    // Nothing at or after a block of class none is cached: later chains include it.
    size_t n = 0;
    while (n < path.size() && path[n].retention != retention_class::none) ++n;
    const std::span<const block> p = path.first(n);
    const size_t m = index_->longest_match(p);
    for (size_t i = m; i < n; ++i)
        if (index_->find(p[i].chain))
            return invalid_argument("prefix cache insert: block " + std::to_string(i) +
                                    "'s chain hash is resident at another position (malformed path or hash collision)");
    if (n == 0) return {};  // nothing cacheable
    // This workspace's holders that this path leaves at a stable block hold an older
    // version of its context: semantic eviction takes them first among stable content.
    index_->mark_superseded(workspace, p);

    if (m == n) {  // wholly resident: only touch it
        int32_t slot = pick_holder(*index_, p[n - 1].chain, workspace);
        index_->touch(p, n, slot, now);
        ++tickers_.n_inserts_already_cached;
        out.already_cached = true;
        out.n_blocks_cached = n;
        out.n_tokens_cached = p[n - 1].end;
        out.holder = index_->holder(slot).seq;
        return {};
    }

    // ---- plan (pure). Re-plan after a forced cut; see the top of this file.
    size_t k = n;                // the path is planned as p[0, k)
    std::string pre_cut_reason;  // why p[k, n) was cut by an earlier (forced) plan
    std::optional<insert_plan> plan;
    for (;;) {
        auto r = plan_insert(workspace, p.first(k), m, now);
        if (!r.ok()) {
            ++tickers_.n_inserts_rejected;
            out.n_blocks_cached = m;
            out.n_tokens_cached = m ? p[m - 1].end : 0;
            return r.error();
        }
        if (r->forced_cut && r->n_kept > m && r->n_kept < k) {
            k = r->n_kept;
            pre_cut_reason = r->limiting_reason;
            continue;
        }
        plan.emplace(std::move(r).value());
        break;
    }
    // Explain must be able to say why a block of this path is not cached.
    auto record_not_admitted = [&](size_t from, size_t to, const std::string & why) {
        for (size_t i = from; i < to; ++i) {
            eviction_record r;
            r.retention = p[i].retention;
            r.at = now;
            r.workspace = workspace;
            r.reason = "not admitted: " + why;
            r.policy = policy_;
            r.was_resident = false;
            r.begin = p[i].begin;
            r.end = p[i].end;
            r.hits = remembered_reuse(p[i].chain);  // asked for again: counts, though not admitted
            r.at_lookup = tickers_.n_lookups;
            add_record(p[i].chain, std::move(r));
            tickers_.n_not_admitted_tokens += (uint64_t)(p[i].end - p[i].begin);
        }
    };
    if (plan->n_kept <= m) {
        // Nothing new fits. Applying the plan would only evict for nothing (or move the
        // resident prefix to another holder), so change nothing.
        record_not_admitted(m, n, plan->limiting_reason);
        ++tickers_.n_inserts_rejected;
        out.n_blocks_cached = m;
        out.n_tokens_cached = m ? p[m - 1].end : 0;
        out.n_blocks_not_admitted = n - m;
        return resource_exhausted("prefix cache: the " + plan->limiting_reason + " admits nothing new of this path (" +
                                  std::to_string(p[n - 1].end - (m ? p[m - 1].end : 0)) + " new tokens)");
    }

    // ---- apply
    size_t n_evicted = 0;
    for (const auto & r : plan->records) n_evicted += r.counts_as_eviction ? 1 : 0;
    WARMCTX_RETURN_IF_ERROR(apply_insert(*plan, src_seq, now));
    record_not_admitted(k, n, pre_cut_reason);  // p[n_kept, k) the plan recorded itself
    if (k < n || plan->forced_cut) ++tickers_.n_forced_cuts;
    out.n_blocks_not_admitted = n - plan->n_kept;
    out.n_blocks_evicted = n_evicted + settle_bytes(now);
    // What the settling left of the new path (it competes like any holder).
    const index_holder & h = index_->holder(plan->slot);
    const size_t kept = h.in_use && h.generation == plan->generation ? h.path.size() : 0;
    out.n_blocks_cached = kept;
    out.n_tokens_cached = kept ? p[kept - 1].end : 0;
    out.holder = kept ? h.seq : -1;
    return {};
}

status prefix_cache::impl::apply_insert(insert_plan & plan, seq_id src_seq, uint64_t now) {
    prefix_index & next = plan.next;
    const index_holder & nh = next.holder(plan.slot);

    // The new holder first: if the engine refuses, nothing else has been touched yet.
    status st = kv_.copy_seq(src_seq, nh.seq);
    if (st.ok()) st = kv_.trim_seq(nh.seq, nh.n_tokens);
    if (!st.ok()) {
        ++tickers_.n_engine_errors;
        kv_.clear_seq(nh.seq);  // whatever the failed call left there
        std::vector<pending_record> lost;
        if (index_->holder(plan.slot).in_use) {
            // The slot's previous content (a redundant prefix or the chosen victim) is gone.
            const index_holder & old = index_->holder(plan.slot);
            for (const hash128 & c : index_->exclusive_suffix(plan.slot)) {
                const index_node & n = *index_->find(c);
                lost.push_back({c, lost_record(c, n, now, old.workspace, "engine error"), false});
            }
            index_->remove_holder(plan.slot);
        }
        commit_records(lost);
        return st.with_context("prefix cache: copying seq " + std::to_string(src_seq) + " into holder seq " +
                               std::to_string(nh.seq));
    }

    mirror(plan, now);
    ++tickers_.n_inserts;
    tickers_.n_whole_holder_evictions += plan.n_whole_holder_evictions;
    tickers_.n_redundant_holders_dropped += plan.n_redundant_dropped;
    commit_records(plan.records);
    return {};
}

void prefix_cache::impl::mirror(insert_plan & plan, uint64_t now) {
    prefix_index & next = plan.next;
    // Every slot's change but the new holder's (copied by the caller), onto the engine.
    for (int32_t slot = 0; slot < (int32_t)next.n_slots(); ++slot) {
        if (slot == plan.slot) continue;
        const index_holder & before = index_->holder(slot);
        const index_holder & after = next.holder(slot);
        if (!before.in_use) continue;  // a free slot can only have become the new holder
        if (!after.in_use || after.generation != before.generation) {
            kv_.clear_seq(before.seq);
            continue;
        }
        if (after.n_tokens < before.n_tokens && !kv_.trim_seq(before.seq, after.n_tokens).ok()) {
            // Keep the promise "the sequence holds exactly the path": clear it and drop
            // the holder. That only frees more, so the budgets still hold.
            ++tickers_.n_engine_errors;
            kv_.clear_seq(before.seq);
            for (const hash128 & c : next.exclusive_suffix(slot)) {
                const index_node & n = *next.find(c);
                plan.records.push_back({c, lost_record(c, n, now, after.workspace, "engine error"), false});
            }
            next.remove_holder(slot);
        }
    }

    *index_ = std::move(next);
}

void prefix_cache::impl::measure_extra_bytes() {
    if (budget_.bytes_per_token == 0) return;
    for (int32_t slot = 0; slot < (int32_t)index_->n_slots(); ++slot) {
        const index_holder & h = index_->holder(slot);
        if (!h.in_use) continue;
        const uint64_t held = kv_.held_bytes(h.seq), charged = (uint64_t)h.n_tokens * budget_.bytes_per_token;
        index_->set_extra_bytes(slot, held > charged ? held - charged : 0);
    }
}

size_t prefix_cache::impl::settle_bytes(uint64_t now) {
    measure_extra_bytes();
    size_t n = 0;
    const planner pl(*this, pins_);
    while (budget_.max_bytes > 0 && bytes_of(*index_) > budget_.max_bytes) {
        insert_plan plan(*index_);
        int32_t victim = pl.best_candidate(plan.next, nullptr);
        for (int32_t s = 0; victim < 0 && s < (int32_t)plan.next.n_slots(); ++s)
            if (plan.next.holder(s).in_use) victim = s;  // all pinned: the budget still holds
        if (victim < 0) break;
        pl.evict_leaf(plan, victim, "global byte budget", 0, now);
        mirror(plan, now);
        commit_records(plan.records);
        measure_extra_bytes();
        ++n;
    }
    return n;
}

}  // namespace warmctx
