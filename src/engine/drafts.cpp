#include "warmctx/drafts.h"

#include <algorithm>

namespace warmctx {

namespace {

uint64_t hash_window(const token_id * t, uint32_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (uint32_t i = 0; i < n; ++i) {
        h ^= (uint64_t)(uint32_t)t[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

// The run of tokens before `end` (exclusive) that holds no separator, at most `n` long.
uint32_t run_length(const std::vector<token_id> & t, size_t end, uint32_t n) {
    uint32_t k = 0;
    while (k < n && k < end && t[end - 1 - k] >= 0) ++k;
    return k;
}

}  // namespace

void draft_index::index_last(bool running) {
    const size_t j = toks_.size() - 1;
    const uint32_t run = run_length(toks_, toks_.size(), k_match.front());
    for (size_t k = 0; k < k_match.size(); ++k) {
        const uint32_t n = k_match[k];
        if (run < n) {
            if (running) prev_[k] = -1;
            continue;
        }
        const token_id * w = toks_.data() + (j + 1 - n);
        const uint64_t h = hash_window(w, n);
        auto [it, fresh] = last_[k].try_emplace(h, (uint32_t)j);
        if (running) {
            // A hash that collides with another n-gram is no match.
            const bool same = !fresh && std::equal(w, w + n, toks_.data() + (it->second + 1 - n));
            prev_[k] = same ? (int64_t)it->second : -1;
        }
        it->second = (uint32_t)j;
    }
}

void draft_index::add_source(std::span<const token_id> tokens) {
    if (tokens.empty()) return;
    toks_.reserve(toks_.size() + tokens.size() + 1);
    for (token_id t : tokens) {
        toks_.push_back(t < 0 ? 0 : t);
        index_last(false);
    }
    toks_.push_back(-1);
    running_from_ = toks_.size();
}

void draft_index::extend(std::span<const token_id> tokens) {
    toks_.reserve(toks_.size() + tokens.size());
    for (token_id t : tokens) push(t);
}

void draft_index::push(token_id t) {
    toks_.push_back(t < 0 ? 0 : t);
    index_last(true);
}

std::vector<token_id> draft_index::propose(size_t n_max) {
    std::vector<token_id> out;
    if (pause_ > 0) {
        --pause_;
        return out;
    }
    const size_t asked = n_max;
    n_max = std::min(n_max, cap_);
    if (n_max == 0 || toks_.size() <= running_from_) return out;
    for (size_t k = 0; k < k_match.size() && k_match[k] >= k_min_match; ++k) {
        if (prev_[k] < 0) continue;
        const size_t from = (size_t)prev_[k] + 1;
        // The first draft, from an earlier answer that the longest n-gram matched (a request
        // sent again): as long as asked, not paced.
        if (k == 0 && from < running_from_ && !recorded_) n_max = asked;
        for (size_t i = from; i < toks_.size() && toks_[i] >= 0 && out.size() < n_max; ++i) out.push_back(toks_[i]);
        // Reaching the tail: the text loops with the period between the two occurrences.
        const size_t period = toks_.size() - from;
        if (out.size() == period)
            for (size_t i = 0; out.size() < n_max; ++i) out.push_back(out[i]);
        if (!out.empty()) break;
    }
    return out;
}

void draft_index::record(size_t drafted, size_t accepted) {
    if (drafted == 0) return;
    recorded_ = true;
    if (accepted >= drafted) {
        cap_ = std::min<size_t>(std::max<size_t>(2, 2 * std::max(cap_, drafted)), 1u << 16);
        misses_ = 0;
    } else if (accepted > 0) {
        cap_ = accepted + 1;
        misses_ = 0;
    } else {
        cap_ = 2;
        misses_ = std::min<uint32_t>(misses_ + 1, 6);
        pause_ = 1u << misses_;
    }
}

}  // namespace warmctx
