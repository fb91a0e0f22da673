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
#include <compare>
#include <deque>
#include <unordered_map>

#include "prefix_index.h"

namespace warmctx {

using cache_detail::index_holder;
using cache_detail::index_node;
using cache_detail::prefix_index;

namespace {

// Eviction order: the smallest key goes first. lru zeroes all but t_last_used and seq.
// Semantic:
//   1. volatile content first, by class (none, low, medium: a stale diff or log goes
//      before any stable context);
//   2. then stable content (high, highest) by how often it was reused: the hits of the
//      block, plus, for a block cached again after an eviction the records remember,
//      the hits it had then and one for coming back - so the prefix of a workspace that
//      keeps coming back outlives one seen once or rarely, whatever their classes;
//   3. then by class (a repository map before a system prompt of the same reuse);
//   4. then least recently used.
struct rank_key {
    uint8_t group = 0;        // semantic: the class if volatile, else k_stable_group
    uint32_t reuse = 0;       // semantic, stable only: hits (+ remembered hits + 1)
    uint8_t retention = 0;
    uint64_t t_last_used = 0;
    seq_id seq = 0;
    auto operator<=>(const rank_key &) const = default;
};
constexpr uint8_t k_stable_group = (uint8_t)retention_class::high;
constexpr uint64_t k_hit_halving_period = 256;

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

std::string_view eviction_policy_name(eviction_policy p) {
    return p == eviction_policy::semantic ? "semantic" : "lru";
}

result<eviction_policy> parse_eviction_policy(std::string_view s) {
    if (s == "semantic") return eviction_policy::semantic;
    if (s == "lru") return eviction_policy::lru;
    return invalid_argument("unknown eviction policy '" + std::string(s) + "' (semantic | lru)");
}

std::string_view kv_accounting_name(kv_accounting a) {
    return a == kv_accounting::per_holder ? "per_holder" : "shared_cells";
}

result<kv_accounting> parse_kv_accounting(std::string_view s) {
    if (s == "per_holder") return kv_accounting::per_holder;
    if (s == "shared_cells") return kv_accounting::shared_cells;
    return invalid_argument("unknown KV accounting '" + std::string(s) + "' (per_holder | shared_cells)");
}

status validate_budget(const cache_budget & b) {
    if (b.max_bytes > 0 && b.bytes_per_token == 0)
        return invalid_argument("cache budget: max_bytes is set but bytes_per_token is 0");
    return {};
}

// The cache's state and the insert machinery behind the public calls.
struct prefix_cache::impl {
    // A record made while planning; committed only if the plan is applied.
    struct pending_record {
        hash128 chain;
        eviction_record record;
        bool counts_as_eviction = false;  // a policy eviction (budget / no free holder)
    };

    struct insert_plan {
        explicit insert_plan(const prefix_index & current) : next(current) {}
        prefix_index next;            // the index as it will be after the insert
        int32_t slot = -1;            // the new holder's slot
        uint64_t generation = 0;      // its generation in `next` (tells it apart from a refill)
        size_t n_kept = 0;            // blocks of the path it holds at the end; 0 if gone
        bool forced_cut = false;      // the path was cut because nothing else was evictable
        std::string limiting_reason;  // the last budget that made us evict or cut
        size_t n_whole_holder_evictions = 0;
        size_t n_redundant_dropped = 0;
        std::vector<pending_record> records;

        bool new_holder_alive() const {
            const index_holder & h = next.holder(slot);
            return h.in_use && h.generation == generation;
        }
    };

    class planner;  // the pure simulation behind plan_insert

    impl(kv_ops & kv, std::vector<seq_id> holder_seqs, cache_budget budget, eviction_policy policy,
         kv_accounting accounting)
        : kv_(kv),
          budget_(std::move(budget)),
          policy_(policy),
          accounting_(accounting),
          index_(std::make_unique<prefix_index>(holder_seqs, accounting)) {}

    uint64_t workspace_max_tokens(const std::string & ws) const;
    match peek(std::span<const block> path, std::string_view prefer_workspace) const;
    match lookup(std::span<const block> path, uint64_t now, std::string_view prefer_workspace);
    status insert(const std::string & workspace, std::span<const block> path, seq_id src_seq, uint64_t now,
                  insert_outcome * outcome);
    result<insert_plan> plan_insert(const std::string & workspace, std::span<const block> path, size_t n_matched,
                                    uint64_t now) const;
    status apply_insert(insert_plan & plan, seq_id src_seq, uint64_t now);
    void commit_records(std::vector<pending_record> & records);
    // The record of a resident block lost without a policy eviction (engine error,
    // workspace dropped): its reuse is remembered like an evicted block's.
    eviction_record lost_record(const hash128 & chain, const index_node & n, uint64_t now, const std::string & ws,
                                const char * reason) const;
    void add_record(const hash128 & chain, eviction_record r);
    uint32_t remembered_reuse(const hash128 & chain) const;
    void drop_workspace(const std::string & ws, uint64_t now);
    void clear();
    cache_counters counters() const;
    std::vector<holder_info> holders() const;
    status check_invariants() const;

    kv_ops & kv_;
    cache_budget budget_;
    eviction_policy policy_;
    kv_accounting accounting_;
    std::unique_ptr<prefix_index> index_;
    std::unordered_map<hash128, uint32_t, hash128_hasher> pins_;  // chain -> pin count (> 0)

    // Eviction records: the newest per chain, bounded FIFO by serial number.
    struct stored_record {
        eviction_record record;
        uint64_t serial = 0;
    };
    std::unordered_map<hash128, stored_record, hash128_hasher> records_;
    std::deque<std::pair<hash128, uint64_t>> record_fifo_;  // (chain, serial), oldest first
    uint64_t record_serial_ = 0;

    cache_counters tickers_;  // only the ticker fields are used
};

// The simulation behind plan_insert. Reads the cache's policy, budgets and pins;
// mutates only the plan's copy of the index.
class prefix_cache::impl::planner {
  public:
    planner(const impl & cache, const std::unordered_map<hash128, uint32_t, hash128_hasher> & pins)
        : cache_(cache), pins_(pins) {}

    bool pinned(const hash128 & chain) const { return pins_.count(chain) > 0; }

    rank_key rank_of(const prefix_index & s, int32_t slot) const {
        const index_holder & h = s.holder(slot);
        const index_node * leaf = s.find(h.path.back());
        if (cache_.policy_ != eviction_policy::semantic) return {0, 0, 0, leaf->t_last_used, h.seq};
        const auto retention = (uint8_t)leaf->retention;
        if (retention < k_stable_group) return {retention, 0, retention, leaf->t_last_used, h.seq};
        // a superseded version of a workspace's context counts no reuse
        const uint32_t reuse = h.stale() ? 0u : leaf->n_hits + cache_.remembered_reuse(h.path.back());
        return {k_stable_group, reuse, retention, leaf->t_last_used, h.seq};
    }

    struct violation {
        std::string reason;
        bool workspace_only = false;
    };

    // The first budget `s` breaks, checking the inserting workspace first: when it is
    // over, it pays for its own insert before anybody else is evicted.
    std::optional<violation> first_violation(const prefix_index & s, const std::string & ws) const {
        const cache_budget & b = cache_.budget_;
        uint64_t ws_cap = cache_.workspace_max_tokens(ws);
        if (ws_cap > 0 && s.workspace_tokens(ws) > ws_cap) return violation{"workspace budget", true};
        if (b.max_tokens > 0 && s.resident_tokens() > b.max_tokens) return violation{"global token budget", false};
        if (b.max_bytes > 0 && s.resident_tokens() * b.bytes_per_token > b.max_bytes)
            return violation{"global byte budget", false};
        return std::nullopt;
    }

    // The holder whose last block goes first, among `ws`'s holders (or all if null);
    // -1 if every candidate is pinned.
    int32_t best_candidate(const prefix_index & s, const std::string * ws) const {
        int32_t best = -1;
        rank_key best_key;
        for (int32_t slot = 0; slot < (int32_t)s.n_slots(); ++slot) {
            const index_holder & h = s.holder(slot);
            if (!h.in_use || (ws && h.workspace != *ws) || pinned(h.path.back())) continue;
            rank_key k = rank_of(s, slot);
            if (best < 0 || k < best_key) best = slot, best_key = k;
        }
        return best;
    }

    // The holder to empty when none is free: ranked by its last block like any
    // eviction, and only if none of the blocks it would take with it is pinned.
    int32_t choose_victim(const prefix_index & s, std::span<const block> path) const {
        int32_t best = -1;
        rank_key best_key;
        for (int32_t slot = 0; slot < (int32_t)s.n_slots(); ++slot) {
            if (!s.holder(slot).in_use) continue;
            auto lost = s.exclusive_suffix(slot, path);
            if (std::any_of(lost.begin(), lost.end(), [&](const hash128 & c) { return pinned(c); })) continue;
            rank_key k = rank_of(s, slot);
            if (best < 0 || k < best_key) best = slot, best_key = k;
        }
        return best;
    }

    void record(insert_plan & p, const index_node & n, const hash128 & chain,
                const std::string & ws, std::string reason, bool was_resident, uint64_t now) const {
        pending_record r;
        r.chain = chain;
        r.record.retention = n.retention;
        r.record.hits = n.n_hits + cache_.remembered_reuse(chain);
        r.record.at_lookup = cache_.tickers_.n_lookups;
        r.record.at = now;
        r.record.workspace = ws;
        r.record.reason = std::move(reason);
        r.record.policy = cache_.policy_;
        r.record.was_resident = was_resident;
        r.record.begin = n.begin;
        r.record.end = n.end;
        r.counts_as_eviction = was_resident;
        p.records.push_back(std::move(r));
    }

    // Evicts the last block of `slot`. A block of the new holder past the previously
    // resident prefix (depth >= n_matched) was never resident: it is "not admitted".
    // If the holder is left a prefix of another holder, it is redundant and dropped.
    void evict_leaf(insert_plan & p, int32_t slot, const std::string & reason,
                    size_t n_matched, uint64_t now) const {
        prefix_index & s = p.next;
        const index_holder & h = s.holder(slot);
        const hash128 chain = h.path.back();
        const bool is_new = slot == p.slot && h.generation == p.generation && h.path.size() - 1 >= n_matched;
        record(p, *s.find(chain), chain, h.workspace, is_new ? "not admitted: " + reason : reason, !is_new, now);
        s.pop_leaf(slot);
        if (h.in_use && s.find(h.path.back())->slots.size() > 1) {
            s.remove_holder(slot);
            ++p.n_redundant_dropped;
        }
    }

    result<insert_plan> plan(const prefix_index & current, const std::string & ws,
                                           std::span<const block> path, size_t n_matched, uint64_t now) const {
        insert_plan p(current);
        prefix_index & s = p.next;

        // A holder whose whole path is a strict prefix of this one becomes redundant:
        // reuse its slot (its content lives on in the new holder).
        int32_t slot = n_matched > 0 ? s.holder_ending_at(path[n_matched - 1].chain) : -1;
        if (slot >= 0) {
            s.remove_holder(slot);
            ++p.n_redundant_dropped;
        } else {
            slot = s.free_slot();
        }
        if (slot < 0) {
            slot = choose_victim(s, path);
            if (slot < 0)
                return resource_exhausted("prefix cache: no free holder, and every holder holds pinned blocks");
            const index_holder & v = s.holder(slot);
            for (const hash128 & c : s.exclusive_suffix(slot, path))
                record(p, *s.find(c), c, v.workspace, "no free holder", true, now);
            s.remove_holder(slot);
            ++p.n_whole_holder_evictions;
        }
        s.add_holder(slot, ws, path, now);
        p.slot = slot;
        p.generation = s.holder(slot).generation;

        while (auto v = first_violation(s, ws)) {
            p.limiting_reason = v->reason;
            int32_t victim = best_candidate(s, v->workspace_only ? &ws : nullptr);
            if (victim < 0) {
                // Nothing evictable: cut the new path, pins or not. The state before the
                // insert was within budget and everything we did since only removed
                // content, so cutting the new holder away entirely always fits.
                if (!p.new_holder_alive())
                    return internal_error("prefix cache: budget exceeded with nothing left to evict");
                victim = p.slot;
                p.forced_cut = true;
            }
            evict_leaf(p, victim, v->reason, n_matched, now);
        }
        p.n_kept = p.new_holder_alive() ? s.holder(slot).path.size() : 0;
        return p;
    }

  private:
    const impl & cache_;
    const std::unordered_map<hash128, uint32_t, hash128_hasher> & pins_;
};

// ---------------------------------------------------------------------------

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
    out.n_blocks_cached = plan->n_kept;
    out.n_tokens_cached = p[plan->n_kept - 1].end;
    out.n_blocks_not_admitted = n - plan->n_kept;
    out.holder = index_->holder(plan->slot).seq;
    out.n_blocks_evicted = n_evicted;
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

    // Mirror every other slot's change onto the engine.
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
    ++tickers_.n_inserts;
    tickers_.n_whole_holder_evictions += plan.n_whole_holder_evictions;
    tickers_.n_redundant_holders_dropped += plan.n_redundant_dropped;
    commit_records(plan.records);
    return {};
}

void prefix_cache::impl::commit_records(std::vector<pending_record> & records) {
    for (auto & r : records) {
        const uint64_t n_tokens = (uint64_t)(r.record.end - r.record.begin);
        const auto c = (size_t)r.record.retention;
        if (r.counts_as_eviction) {
            ++tickers_.evictions_by_class[c];
            tickers_.evicted_tokens_by_class[c] += n_tokens;
        }
        if (!r.record.was_resident) tickers_.n_not_admitted_tokens += n_tokens;
        add_record(r.chain, std::move(r.record));
    }
    records.clear();
}

void prefix_cache::impl::add_record(const hash128 & chain, eviction_record r) {
    const uint64_t serial = ++record_serial_;
    records_[chain] = {std::move(r), serial};
    record_fifo_.emplace_back(chain, serial);
    while (record_fifo_.size() > k_max_eviction_records) {
        auto [c, s] = record_fifo_.front();
        record_fifo_.pop_front();
        auto it = records_.find(c);
        if (it != records_.end() && it->second.serial == s) records_.erase(it);  // not superseded
    }
}

eviction_record prefix_cache::impl::lost_record(const hash128 & chain, const index_node & n, uint64_t now,
                                                const std::string & ws, const char * reason) const {
    return {n.retention,       now, ws, reason, policy_, true, n.begin, n.end, n.n_hits + remembered_reuse(chain),
            tickers_.n_lookups};
}

uint32_t prefix_cache::impl::remembered_reuse(const hash128 & chain) const {
    auto it = records_.find(chain);
    if (it == records_.end()) return 0;
    const eviction_record & r = it->second.record;
    // its reuse then, aged as if it had stayed (halved once per period since), and one
    // for coming back
    const uint64_t periods = tickers_.n_lookups / k_hit_halving_period - r.at_lookup / k_hit_halving_period;
    return (periods >= 32 ? 0u : r.hits >> periods) + 1;
}

void prefix_cache::impl::drop_workspace(const std::string & ws, uint64_t now) {
    std::vector<pending_record> lost;
    for (int32_t slot = 0; slot < (int32_t)index_->n_slots(); ++slot) {
        const index_holder & h = index_->holder(slot);
        if (!h.in_use || h.workspace != ws) continue;
        for (const hash128 & c : index_->exclusive_suffix(slot)) {
            const index_node & n = *index_->find(c);
            lost.push_back({c, lost_record(c, n, now, ws, "workspace dropped"), false});
        }
        kv_.clear_seq(h.seq);
        index_->remove_holder(slot);
    }
    commit_records(lost);
}

void prefix_cache::impl::clear() {
    for (int32_t slot = 0; slot < (int32_t)index_->n_slots(); ++slot)
        if (index_->holder(slot).in_use) kv_.clear_seq(index_->holder(slot).seq);
    index_->clear();
}

cache_counters prefix_cache::impl::counters() const {
    cache_counters c = tickers_;
    c.resident_tokens = index_->resident_tokens();
    c.resident_bytes = c.resident_tokens * budget_.bytes_per_token;
    c.workspaces.clear();
    for (const auto & [ws, tokens] : index_->all_workspace_tokens())
        c.workspaces[ws] = {tokens, tokens * budget_.bytes_per_token, 0};
    c.n_holders_in_use = 0;
    for (int32_t slot = 0; slot < (int32_t)index_->n_slots(); ++slot) {
        const index_holder & h = index_->holder(slot);
        if (!h.in_use) continue;
        ++c.n_holders_in_use;
        ++c.workspaces[h.workspace].n_holders;
    }
    c.n_holders_total = index_->n_slots();
    c.n_pinned_blocks = pins_.size();
    return c;
}

std::vector<holder_info> prefix_cache::impl::holders() const {
    std::vector<holder_info> out;
    for (int32_t slot = 0; slot < (int32_t)index_->n_slots(); ++slot) {
        const index_holder & h = index_->holder(slot);
        if (!h.in_use) continue;
        holder_info hi;
        hi.seq = h.seq;
        hi.workspace = h.workspace;
        hi.n_tokens = h.n_tokens;
        hi.t_last_used = h.t_last_used;
        for (const hash128 & c : h.path) {
            const index_node & n = *index_->find(c);
            hi.blocks.push_back({c, n.begin, n.end, n.retention});
        }
        hi.last_class = hi.blocks.back().retention;
        out.push_back(std::move(hi));
    }
    std::sort(out.begin(), out.end(), [](const holder_info & a, const holder_info & b) { return a.seq < b.seq; });
    return out;
}

status prefix_cache::impl::check_invariants() const {
    WARMCTX_RETURN_IF_ERROR(index_->check_invariants());
    const uint64_t t = index_->resident_tokens();
    if (budget_.max_tokens > 0 && t > budget_.max_tokens)
        return internal_error("prefix cache: " + std::to_string(t) + " resident tokens exceed the global budget");
    if (budget_.max_bytes > 0 && t * budget_.bytes_per_token > budget_.max_bytes)
        return internal_error("prefix cache: resident bytes exceed the global byte budget");
    for (const auto & [ws, tokens] : index_->all_workspace_tokens()) {
        uint64_t cap = workspace_max_tokens(ws);
        if (cap > 0 && tokens > cap)
            return internal_error("prefix cache: workspace '" + ws + "' holds " + std::to_string(tokens) +
                                  " tokens, over its budget of " + std::to_string(cap));
    }
    for (const auto & [chain, count] : pins_)
        if (count == 0) return internal_error("prefix cache: a zero pin count is stored");
    return {};
}

// ---- the public calls

prefix_cache::prefix_cache(kv_ops & kv, std::vector<seq_id> holder_seqs, cache_budget budget,
                           eviction_policy policy, kv_accounting accounting)
    : p_(std::make_unique<impl>(kv, std::move(holder_seqs), std::move(budget), policy, accounting)) {}
prefix_cache::~prefix_cache() = default;

match prefix_cache::peek(std::span<const block> path, std::string_view prefer_workspace) const {
    return p_->peek(path, prefer_workspace);
}
match prefix_cache::lookup(std::span<const block> path, uint64_t now, std::string_view prefer_workspace) {
    return p_->lookup(path, now, prefer_workspace);
}
status prefix_cache::insert(const std::string & workspace, std::span<const block> path, seq_id src_seq,
                            uint64_t now, insert_outcome * outcome) {
    return p_->insert(workspace, path, src_seq, now, outcome);
}
void prefix_cache::pin(std::span<const block> path) {
    for (const block & b : path) ++p_->pins_[b.chain];
}
void prefix_cache::unpin(std::span<const block> path) {
    for (const block & b : path) {
        auto it = p_->pins_.find(b.chain);
        if (it != p_->pins_.end() && --it->second == 0) p_->pins_.erase(it);
    }
}
bool prefix_cache::is_pinned(const hash128 & chain) const { return p_->pins_.count(chain) > 0; }
std::optional<eviction_record> prefix_cache::last_eviction(const hash128 & chain) const {
    auto it = p_->records_.find(chain);
    if (it == p_->records_.end()) return std::nullopt;
    return it->second.record;
}
void prefix_cache::drop_workspace(const std::string & ws, uint64_t now) { p_->drop_workspace(ws, now); }
uint64_t prefix_cache::n_lookups() const { return p_->tickers_.n_lookups; }
uint32_t prefix_cache::remembered_reuse(const hash128 & chain) const { return p_->remembered_reuse(chain); }
void prefix_cache::clear() { p_->clear(); }
cache_counters prefix_cache::counters() const { return p_->counters(); }
std::vector<holder_info> prefix_cache::holders() const { return p_->holders(); }
size_t prefix_cache::n_free_holders() const { return p_->index_->n_slots() - p_->index_->n_in_use(); }
const cache_budget & prefix_cache::budget() const { return p_->budget_; }
eviction_policy prefix_cache::policy() const { return p_->policy_; }
kv_accounting prefix_cache::accounting() const { return p_->accounting_; }
uint64_t prefix_cache::workspace_max_tokens(const std::string & ws) const { return p_->workspace_max_tokens(ws); }
status prefix_cache::check_invariants() const { return p_->check_invariants(); }

}  // namespace warmctx
