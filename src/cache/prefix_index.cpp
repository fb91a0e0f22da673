#include "prefix_index.h"

#include <algorithm>
#include <set>

namespace warmctx::cache_detail {

prefix_index::prefix_index(std::span<const seq_id> seqs, kv_accounting accounting)
    : accounting_(accounting) {
    for (seq_id s : seqs) {
        // Duplicates would let two holders share one engine sequence: ignore them.
        if (slot_of_seq(s) >= 0) continue;
        index_holder h;
        h.seq = s;
        holders_.push_back(std::move(h));
    }
}

const index_node * prefix_index::find(const hash128 & chain) const {
    auto it = nodes_.find(chain);
    return it == nodes_.end() ? nullptr : &it->second;
}

int32_t prefix_index::slot_of_seq(seq_id seq) const {
    for (size_t i = 0; i < holders_.size(); ++i)
        if (holders_[i].seq == seq) return (int32_t)i;
    return -1;
}

int32_t prefix_index::free_slot() const {
    for (size_t i = 0; i < holders_.size(); ++i)
        if (!holders_[i].in_use) return (int32_t)i;
    return -1;
}

size_t prefix_index::n_in_use() const {
    return (size_t)std::count_if(holders_.begin(), holders_.end(), [](const index_holder & h) { return h.in_use; });
}

size_t prefix_index::longest_match(std::span<const block> path) const {
    size_t i = 0;
    for (; i < path.size(); ++i) {
        const index_node * n = find(path[i].chain);
        if (!n) break;
        // A node found by hash must also agree on where it sits; anything else is a
        // malformed path or a hash collision, and must never be served as a hit.
        const hash128 parent = i == 0 ? hash128{} : path[i - 1].chain;
        if (n->depth != i || n->parent != parent || n->begin != path[i].begin || n->end != path[i].end) break;
    }
    return i;
}

int32_t prefix_index::holder_ending_at(const hash128 & chain) const {
    const index_node * n = find(chain);
    if (!n) return -1;
    for (int32_t s : n->slots)
        if (holders_[s].path.back() == chain) return s;
    return -1;
}

std::vector<hash128> prefix_index::exclusive_suffix(int32_t slot, std::span<const block> keep) const {
    std::vector<hash128> out;
    const auto & p = holders_[slot].path;
    for (size_t d = p.size(); d-- > 0;) {
        if (d < keep.size() && keep[d].chain == p[d]) break;  // stays: part of `keep`
        if (find(p[d])->slots.size() > 1) break;               // stays: another holder has it
        out.push_back(p[d]);
    }
    return out;
}

uint64_t prefix_index::workspace_tokens(const std::string & ws) const {
    auto it = workspace_tokens_.find(ws);
    return it == workspace_tokens_.end() ? 0 : it->second;
}

void prefix_index::add_workspace_tokens(const std::string & ws, int64_t delta) {
    uint64_t & v = workspace_tokens_[ws];
    v = (uint64_t)((int64_t)v + delta);
    if (v == 0) workspace_tokens_.erase(ws);
}

// Accounting lives in attach/detach only, so every mutation keeps it right.
void prefix_index::attach(index_node & node, int32_t slot) {
    const std::string & ws = holders_[slot].workspace;
    const int64_t n = node.n_tokens();
    if (accounting_ == kv_accounting::per_holder) {
        resident_tokens_ += n;
        add_workspace_tokens(ws, n);
    } else {
        if (node.slots.empty()) resident_tokens_ += n;
        bool ws_has_it = std::any_of(node.slots.begin(), node.slots.end(),
                                     [&](int32_t s) { return holders_[s].workspace == ws; });
        if (!ws_has_it) add_workspace_tokens(ws, n);
    }
    node.slots.push_back(slot);
}

void prefix_index::detach(index_node & node, int32_t slot) {
    auto it = std::find(node.slots.begin(), node.slots.end(), slot);
    node.slots.erase(it);
    const std::string & ws = holders_[slot].workspace;
    const int64_t n = node.n_tokens();
    if (accounting_ == kv_accounting::per_holder) {
        resident_tokens_ -= n;
        add_workspace_tokens(ws, -n);
    } else {
        if (node.slots.empty()) resident_tokens_ -= n;
        bool ws_has_it = std::any_of(node.slots.begin(), node.slots.end(),
                                     [&](int32_t s) { return holders_[s].workspace == ws; });
        if (!ws_has_it) add_workspace_tokens(ws, -n);
    }
}

void prefix_index::add_holder(int32_t slot, const std::string & ws, std::span<const block> path, uint64_t now) {
    index_holder & h = holders_[slot];
    h.in_use = true;
    h.generation = next_generation_++;
    h.workspace = ws;
    h.path.clear();
    h.stale_from = SIZE_MAX;
    h.t_last_used = now;
    for (size_t i = 0; i < path.size(); ++i) {
        const block & b = path[i];
        auto [it, created] = nodes_.try_emplace(b.chain);
        index_node & n = it->second;
        if (created) {
            n.parent = i == 0 ? hash128{} : path[i - 1].chain;
            n.depth = (uint32_t)i;
            n.begin = b.begin;
            n.end = b.end;
        }
        n.retention = b.retention;
        n.t_last_used = std::max(n.t_last_used, now);
        attach(n, slot);
        h.path.push_back(b.chain);
    }
    h.n_tokens = path.empty() ? 0 : path.back().end;
}

void prefix_index::pop_leaf(int32_t slot) {
    index_holder & h = holders_[slot];
    auto it = nodes_.find(h.path.back());
    detach(it->second, slot);
    if (it->second.slots.empty()) nodes_.erase(it);
    h.path.pop_back();
    if (h.path.empty()) {
        h.in_use = false;
        h.workspace.clear();
        h.n_tokens = 0;
        extra_bytes_ -= h.extra_bytes;
        h.extra_bytes = 0;
    } else {
        h.n_tokens = find(h.path.back())->end;
    }
}

void prefix_index::remove_holder(int32_t slot) {
    while (holders_[slot].in_use) pop_leaf(slot);
}

void prefix_index::touch(std::span<const block> path, size_t n_blocks, int32_t slot, uint64_t now) {
    for (size_t i = 0; i < n_blocks; ++i) {
        index_node & n = nodes_.at(path[i].chain);
        n.t_last_used = std::max(n.t_last_used, now);
    }
    if (slot >= 0) holders_[slot].t_last_used = std::max(holders_[slot].t_last_used, now);
}

void prefix_index::count_hit(std::span<const block> path, size_t n_blocks) {
    for (size_t i = 0; i < n_blocks; ++i) ++nodes_.at(path[i].chain).n_hits;
}

void prefix_index::mark_superseded(const std::string & ws, std::span<const block> path) {
    for (auto & h : holders_) {
        if (!h.in_use || h.workspace != ws) continue;
        size_t c = 0;
        while (c < h.path.size() && c < path.size() && h.path[c] == path[c].chain) ++c;
        if (c == h.path.size()) { h.stale_from = SIZE_MAX; continue; }  // path runs through it
        if (c == path.size()) continue;                                  // it extends path
        if (c >= 1 && nodes_.at(h.path[c]).retention == retention_class::high) h.stale_from = std::min(h.stale_from, c);
    }
}

void prefix_index::set_extra_bytes(int32_t slot, uint64_t bytes) {
    index_holder & h = holders_[slot];
    extra_bytes_ = extra_bytes_ - h.extra_bytes + bytes;
    h.extra_bytes = bytes;
}

void prefix_index::halve_hits() {
    for (auto & [chain, n] : nodes_) n.n_hits /= 2;
}

void prefix_index::clear() {
    for (auto & h : holders_) {
        h.in_use = false;
        h.workspace.clear();
        h.path.clear();
        h.n_tokens = 0;
        h.extra_bytes = 0;
    }
    nodes_.clear();
    resident_tokens_ = 0;
    extra_bytes_ = 0;
    workspace_tokens_.clear();
}

status prefix_index::check_invariants() const {
    auto fail = [](std::string m) { return internal_error("prefix index: " + m); };
    std::unordered_map<hash128, std::vector<int32_t>, hash128_hasher> slots_of;
    std::set<seq_id> seqs;
    uint64_t extra = 0;
    for (size_t s = 0; s < holders_.size(); ++s) {
        const index_holder & h = holders_[s];
        if (!seqs.insert(h.seq).second) return fail("duplicate holder seq");
        extra += h.extra_bytes;
        if (!h.in_use) {
            if (!h.path.empty() || h.n_tokens != 0 || h.extra_bytes != 0) return fail("free holder with content");
            continue;
        }
        if (h.path.empty()) return fail("holder in use with an empty path");
        pos_t expect_begin = 0;
        for (size_t d = 0; d < h.path.size(); ++d) {
            const index_node * n = find(h.path[d]);
            if (!n) return fail("holder block missing from the trie");
            if (n->depth != d || n->begin != expect_begin || n->end <= n->begin ||
                n->parent != (d == 0 ? hash128{} : h.path[d - 1]))
                return fail("holder path not contiguous from 0 in the trie");
            if (n->retention == retention_class::none) return fail("a block of class none is cached");
            expect_begin = n->end;
            slots_of[h.path[d]].push_back((int32_t)s);
        }
        if (h.n_tokens != expect_begin) return fail("holder n_tokens != end of its last block");
        // No holder is a prefix of another: its last block is its own.
        if (find(h.path.back())->slots.size() != 1) return fail("redundant holder (prefix of another)");
    }
    if (slots_of.size() != nodes_.size()) return fail("trie has blocks no holder holds");
    uint64_t total = 0;
    std::map<std::string, uint64_t> per_ws;
    for (const auto & [chain, n] : nodes_) {
        auto it = slots_of.find(chain);
        if (it == slots_of.end()) return fail("orphan trie node");
        auto a = it->second, b = n.slots;
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        if (a != b) return fail("trie node's holder list is wrong");
        if (accounting_ == kv_accounting::per_holder) {
            total += (uint64_t)n.n_tokens() * n.slots.size();
            for (int32_t s : n.slots) per_ws[holders_[s].workspace] += n.n_tokens();
        } else {
            total += n.n_tokens();
            std::set<std::string> wss;
            for (int32_t s : n.slots) wss.insert(holders_[s].workspace);
            for (const auto & w : wss) per_ws[w] += n.n_tokens();
        }
    }
    if (total != resident_tokens_) return fail("resident token count drifted");
    if (extra != extra_bytes_) return fail("extra byte count drifted");
    if (per_ws != workspace_tokens_) return fail("workspace token counts drifted");
    return {};
}

}  // namespace warmctx::cache_detail
