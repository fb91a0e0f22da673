#include "warmctx/chunking.h"

#include <algorithm>

namespace warmctx {

std::vector<std::pair<pos_t, pos_t>> plan_chunks(pos_t pos0, int32_t n_tokens,
                                                 std::span<const pos_t> boundaries,
                                                 int32_t chunk_tokens) {
    std::vector<std::pair<pos_t, pos_t>> chunks;
    if (n_tokens <= 0) return chunks;
    if (chunk_tokens <= 0) chunk_tokens = 1;
    const pos_t end = pos0 + n_tokens;
    std::vector<pos_t> b(boundaries.begin(), boundaries.end());
    b.push_back(0);
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
    // span_start = the last boundary <= pos0
    auto it = std::upper_bound(b.begin(), b.end(), pos0);
    pos_t span_start = *(it - 1);
    pos_t next_boundary = it == b.end() ? end : std::min<pos_t>(*it, end);
    pos_t p = pos0;
    while (p < end) {
        // inside [span_start, next_boundary): chunk starts at span_start + k*chunk
        pos_t k = (p - span_start) / chunk_tokens;
        pos_t chunk_end = std::min<pos_t>(span_start + (k + 1) * chunk_tokens, next_boundary);
        chunks.emplace_back(p, chunk_end);
        p = chunk_end;
        if (p == next_boundary && p < end) {
            span_start = p;
            ++it;
            next_boundary = it == b.end() ? end : std::min<pos_t>(*it, end);
        }
    }
    return chunks;
}

bool is_chunk_start(pos_t pos, std::span<const pos_t> boundaries, int32_t chunk_tokens) {
    if (pos <= 0) return pos == 0;
    if (chunk_tokens <= 0) chunk_tokens = 1;
    pos_t span_start = 0;
    for (pos_t b : boundaries)
        if (b <= pos && b > span_start) span_start = b;
    return (pos - span_start) % chunk_tokens == 0;
}

}  // namespace warmctx
