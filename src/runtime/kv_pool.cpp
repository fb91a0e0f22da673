#include "kv_pool.h"

#include <chrono>

#include "util/clock.h"

namespace warmctx {

namespace {
using clock_type = std::chrono::steady_clock;
}  // namespace

kv_pool::kv_pool(engine & e, seq_id first_holder, uint32_t n_holders)
    : e_(e), first_(first_holder), n_(n_holders) {}

void kv_pool::stage(std::vector<uint8_t> raw, pos_t n_tokens) {
    staged_.bytes = std::move(raw);
    staged_.n_tokens = n_tokens;
}

std::vector<seq_id> kv_pool::holder_ids() const {
    std::vector<seq_id> ids;
    ids.reserve(n_);
    for (uint32_t i = 0; i < n_; ++i) ids.push_back(first_ + (seq_id)i);
    return ids;
}

status kv_pool::save_into(seq_id src, entry & out) {
    auto t = clock_type::now();
    auto bytes = e_.save_seq_raw(src);
    if (!bytes.ok()) return bytes.error();
    out.n_tokens = e_.seq_n_tokens(src);
    out.bytes = std::move(bytes.value());
    out.bytes.shrink_to_fit();
    ctr_.n_saves++;
    ctr_.saved_bytes += out.bytes.size();
    ctr_.save_ms += ms_since(t);
    return {};
}

status kv_pool::copy_seq(seq_id src, seq_id dst) {
    if (src == dst) return {};
    const bool from_pool = is_holder(src), to_pool = is_holder(dst);
    if (!from_pool && !to_pool) return e_.copy_seq(src, dst);
    if (src == staging() && to_pool) {  // staged bytes -> a holder
        if (staged_.bytes.empty()) return failed_precondition("kv_pool: nothing staged");
        staged_.bytes.shrink_to_fit();
        ctr_.n_saves++;
        ctr_.saved_bytes += staged_.bytes.size();
        entries_[dst] = std::move(staged_);
        staged_ = entry{};
        return {};
    }
    if (!from_pool) {  // a work sequence -> a holder
        entry fresh;
        WARMCTX_RETURN_IF_ERROR(save_into(src, fresh));
        entries_[dst] = std::move(fresh);
        return {};
    }
    auto it = entries_.find(src);
    if (to_pool) {
        if (it == entries_.end()) entries_.erase(dst); else entries_[dst] = it->second;
        return {};
    }
    // A holder -> a work sequence.
    if (it == entries_.end()) {
        e_.clear_seq(dst);
        return {};
    }
    auto t = clock_type::now();
    WARMCTX_RETURN_IF_ERROR(e_.load_seq_raw(dst, it->second.bytes));
    ctr_.n_loads++;
    ctr_.loaded_bytes += it->second.bytes.size();
    ctr_.load_ms += ms_since(t);
    return {};
}

status kv_pool::trim_seq(seq_id seq, pos_t from) {
    if (!is_holder(seq)) return e_.trim_seq(seq, from);
    if (from < 0) return invalid_argument("trim position must not be negative");
    auto it = entries_.find(seq);
    if (it == entries_.end() || from >= it->second.n_tokens) return {};
    if (from == 0) {
        entries_.erase(it);
        return {};
    }
    // Cut in RAM: the first `from` cells are positions 0..from-1 (kv_pool.h).
    status st = e_.truncate_state(it->second.bytes, from);
    if (!st.ok()) {
        entries_.erase(it);  // an unexpected layout: a miss later, never a wrong prefix
        return st;
    }
    it->second.bytes.shrink_to_fit();
    it->second.n_tokens = from;
    return {};
}

void kv_pool::clear_seq(seq_id seq) {
    if (seq == staging()) {
        staged_ = entry{};
        return;
    }
    if (!is_holder(seq)) {
        e_.clear_seq(seq);
        return;
    }
    entries_.erase(seq);
}

const std::vector<uint8_t> * kv_pool::state(seq_id holder) const {
    auto it = entries_.find(holder);
    return it == entries_.end() ? nullptr : &it->second.bytes;
}

uint64_t kv_pool::held_bytes(seq_id seq) const {
    auto it = entries_.find(seq);
    return it == entries_.end() ? 0 : it->second.bytes.size();
}

pos_t kv_pool::n_tokens(seq_id holder) const {
    auto it = entries_.find(holder);
    return it == entries_.end() ? 0 : it->second.n_tokens;
}

kv_pool_counters kv_pool::counters() const {
    kv_pool_counters c = ctr_;
    c.used_bytes = c.allocated_bytes = c.n_entries = 0;
    for (const auto & [id, e] : entries_) {
        c.used_bytes += e.bytes.size();
        c.allocated_bytes += e.bytes.capacity();
        c.n_entries++;
    }
    return c;
}

}  // namespace warmctx
