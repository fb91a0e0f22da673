// cache/prefix_cache_impl.h - the prefix cache's state and its planner, shared by
// prefix_cache.cpp (lookups, the insert: plan, apply, settle) and prefix_cache_state.cpp
// (eviction records, counters, invariants and the public calls). Private to src/cache.
#pragma once

#include <compare>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "prefix_index.h"
#include "warmctx/prefix_cache.h"

namespace warmctx {

using cache_detail::index_holder;
using cache_detail::index_node;
using cache_detail::prefix_index;

namespace cache_detail {
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
}  // namespace cache_detail

using cache_detail::k_hit_halving_period;
using cache_detail::k_stable_group;
using cache_detail::rank_key;

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
    // Mirrors the plan's changes to every slot but plan.slot onto kv_ (trims, clears) and
    // makes the plan's index the cache's.
    void mirror(insert_plan & plan, uint64_t now);
    // What the held prefixes take: their tokens at the budget's bytes per token, and what
    // kv_ops::held_bytes measures beyond that.
    uint64_t bytes_of(const prefix_index & s) const {
        return s.resident_tokens() * budget_.bytes_per_token + s.extra_bytes();
    }
    // Reads every holder's extra bytes from kv_ (held_bytes beyond its tokens' charge).
    void measure_extra_bytes();
    // After an insert: measures what the holders hold and, while that is over the global
    // byte budget, evicts last blocks by the policy (the new path's too). Returns how many.
    size_t settle_bytes(uint64_t now);
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
        if (b.max_bytes > 0 && cache_.bytes_of(s) > b.max_bytes)
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

}  // namespace warmctx
