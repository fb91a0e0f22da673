// The prefix cache's names, eviction records, counters and invariants, and the public
// calls onto its impl (the insert machinery is prefix_cache.cpp).
#include <algorithm>

#include "prefix_cache_impl.h"

namespace warmctx {

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
    c.resident_bytes = bytes_of(*index_);
    c.workspaces.clear();
    for (const auto & [ws, tokens] : index_->all_workspace_tokens())
        c.workspaces[ws] = {tokens, tokens * budget_.bytes_per_token, 0};
    c.n_holders_in_use = 0;
    for (int32_t slot = 0; slot < (int32_t)index_->n_slots(); ++slot) {
        const index_holder & h = index_->holder(slot);
        if (!h.in_use) continue;
        ++c.n_holders_in_use;
        ++c.workspaces[h.workspace].n_holders;
        c.workspaces[h.workspace].bytes += h.extra_bytes;
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
    if (budget_.max_bytes > 0 && bytes_of(*index_) > budget_.max_bytes)
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

