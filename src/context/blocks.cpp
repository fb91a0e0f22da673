// Block hashing: the chain hashes that name a prompt's KV, and the blocks they name.
#include <algorithm>
#include <optional>

#include "assembly.h"

#include <algorithm>
#include <bit>

#include "warmctx/chunking.h"

namespace warmctx {

namespace {

// Token ids as little-endian int32 bytes: the hash must not depend on the host.
const void * token_bytes(std::span<const token_id> tokens, std::vector<uint32_t> & scratch) {
    if constexpr (std::endian::native == std::endian::little) {
        return tokens.data();
    } else {
        scratch.resize(tokens.size());
        for (size_t i = 0; i < tokens.size(); ++i) scratch[i] = __builtin_bswap32(static_cast<uint32_t>(tokens[i]));
        return scratch.data();
    }
}

}  // namespace

hash128 hash_tokens(std::span<const token_id> tokens) {
    std::vector<uint32_t> scratch;
    return hash_bytes(token_bytes(tokens, scratch), tokens.size_bytes());
}

hash128 chain_hash(hash128 prev, std::span<const token_id> tokens) {
    std::vector<uint32_t> scratch;
    return hash_combine(prev, token_bytes(tokens, scratch), tokens.size_bytes());
}

hash128 root_hash(const profile & prof, std::string_view tenant_salt) {
    // The salt is hashed after a domain tag so that h_0 can never equal a block hash
    // computed from the same fingerprint.
    constexpr std::string_view k_tag = "warmctx-root-v1";
    const hash128 tagged = hash_combine(prof.fingerprint(), k_tag.data(), k_tag.size());
    return hash_combine(tagged, tenant_salt.data(), tenant_salt.size());
}

// Boundaries and blocks of an assembled prompt from its pieces (see assemble).
void detail::build_blocks(assembled_prompt & out, std::span<const detail::piece> pieces, const profile & prof,
                          std::string_view tenant_salt, uint32_t chunk_tokens) {
    const auto n_tokens = static_cast<pos_t>(out.tokens.size());
    // A piece starts a chunk unless the piece before it has retention `none`: nothing
    // at or after a `none` block is cached in the pool, so no other turn starts there,
    // and chunking the uncached tail together saves a decode call per turn without
    // changing any KV that is reused. The generation prompt is the exception: it always
    // starts a chunk, so that the turn's own user message ends one. The work stream
    // keeps that message, and an agent's next turn, which carries it in its history
    // (the same piece, rendered the same), reuses it in place: one decode call more
    // per turn against prefilling the last message (often a tool's output) twice.
    // So do a segment's own parts (a message's diff units): the same message, as the
    // next turn's history, is chunked at them.
    // Chat messages: a run begins at an assistant message, and the messages after it
    // (the user's, a tool's) continue it (piece::continues). An agent's next request
    // appends an assistant message and what answers it, so what it reuses ends where an
    // assistant message begins, and its new messages are one decode call (with the
    // generation prompt, two) rather than one per message.
    // Runs of short messages are packed into spans of about prof.span_tokens
    // (conversation_span), so that a conversation of many short messages prefills in
    // calls of the engine's size rather than one small call per exchange, each paying a
    // call's cost at depth: an assistant message joins the span before it while that
    // span, with the assistant's whole run (its message and the messages that continue
    // it), still fits in span_tokens, or while the span holds less than half of it.
    // Where a span ends depends only on the messages up to it (and their positions), so an
    // appended turn cuts its shared history as the turn before did and resumes from the
    // last span's start, prefilling again at most one span of what that turn computed
    // (docs/architecture.md, "Chunk runs").
    // Spans grow with depth: where a run would start at position p, its span holds at
    // most min(span_tokens, p / 8), so what an appended turn prefills again is at most
    // 1/8 of what it reuses, while a call costs most (attention over all before it).
    // Below 8 x 64 tokens (spans of fewer than 64 tokens, one of flash attention's row
    // tiles) nothing is packed: a short conversation keeps every exchange a run of its
    // own, and an agent's short tool loop reuses all of its history turn after turn.
    constexpr pos_t k_span_depth_ratio = 8;
    constexpr pos_t k_span_min = 64;
    std::vector<bool> starts_run(pieces.size(), true);
    const auto span_tokens = (pos_t)prof.span_tokens;
    pos_t run_begin = 0;
    for (size_t i = 1; i < pieces.size(); ++i) {
        const bool part = pieces[i].segment_index >= 0 && pieces[i].segment_index == pieces[i - 1].segment_index;
        const bool gen = pieces[i].segment_index == k_generation_prompt_index;
        starts_run[i] = (pieces[i - 1].retention != retention_class::none && !pieces[i].continues) || gen || part;
        const pos_t span = std::min(span_tokens, pieces[i].begin / k_span_depth_ratio);
        if (starts_run[i] && !gen && !part && pieces[i].after_message && span >= k_span_min) {
            size_t j = i + 1;
            while (j < pieces.size() && pieces[j].continues) ++j;
            const pos_t held = pieces[i].begin - run_begin;
            const pos_t run_end = j < pieces.size() ? pieces[j].begin : pieces.back().end;
            if (held < span / 2 || run_end - run_begin <= span) starts_run[i] = false;
        }
        if (starts_run[i]) run_begin = pieces[i].begin;
    }
    for (size_t i = 0; i < pieces.size(); ++i) {
        const detail::piece & pc = pieces[i];
        if (starts_run[i] && pc.begin > 0 && pc.begin < n_tokens &&
            (out.boundaries.empty() || out.boundaries.back() != pc.begin))
            out.boundaries.push_back(pc.begin);
    }

    // Blocks: the canonical chunks (warmctx/chunking.h) of the whole prompt, each named
    // by the chain hash of everything up to its end. A block that spans several pieces
    // has the lowest class of theirs (chat messages of one run; pieces after a `none`
    // one) and is named after the piece it starts in.
    // Every canonical chunk end is a block end, whatever the model's memory: where it needs
    // a checkpoint to resume (a recurrent state, a sliding window: engine.h, memory_kind),
    // the prefill chooses the block ends it takes them at (engine_path.cpp, checkpoint_ends:
    // spaced by prof.checkpoint_tokens, and always the last ones), and a turn resumes from
    // the deepest it shares.
    out.root_hash = root_hash(prof, tenant_salt);
    hash128 h = out.root_hash;
    size_t at = 0;
    for (auto [b, e] : plan_chunks(0, n_tokens, out.boundaries, static_cast<int32_t>(chunk_tokens))) {
        while (pieces[at].end <= b) ++at;
        retention_class retention = pieces[at].retention;
        for (size_t k = at; k < pieces.size() && pieces[k].begin < e; ++k)
            retention = std::min(retention, pieces[k].retention);
        h = chain_hash(h, std::span(out.tokens).subspan(b, e - b));
        out.blocks.push_back({h, b, e, retention, pieces[at].segment_index});
    }
}

uint32_t checkpoint_spacing(uint64_t checkpoint_bytes, uint64_t kv_bytes_per_token, uint32_t chunk_tokens) {
    // A checkpoint costs no more than the attention KV of the tokens it spans: at most
    // twice the memory of plain KV, and a resume prefills less than one spacing again.
    if (checkpoint_bytes == 0 || chunk_tokens == 0) return 0;
    const uint64_t per_token = std::max<uint64_t>(kv_bytes_per_token, 1);
    const uint64_t tokens = (checkpoint_bytes + per_token - 1) / per_token;
    const uint64_t chunks = std::max<uint64_t>(1, (tokens + chunk_tokens - 1) / chunk_tokens);
    return chunks <= 1 ? 0 : (uint32_t)std::min<uint64_t>(chunks * chunk_tokens, 1u << 20);
}

uint32_t conversation_span(std::string_view backend, uint32_t chunk_tokens, uint32_t n_threads, int32_t n_head,
                           uint64_t weights_per_row) {
    uint32_t span = 128;
    if (backend == "CPU") {
        const uint64_t threads = std::max<uint32_t>(n_threads, 1);
        // The fewest rows that fill flash attention's tiles ...
        uint64_t rows = 256 * threads / (uint64_t)std::max<int32_t>(n_head, 1);
        // ... or, where a row costs little beside a call's own ~5 ms (graph, a barrier per
        // op, the mask over every cell), the rows that make that a third of the call: a
        // row at ~2 FLOPs per weight and a nominal 20 GFLOP/s a thread.
        const double row_ms = 2.0 * (double)weights_per_row / (20e9 * (double)threads) * 1e3;
        if (row_ms > 0) rows = std::max<uint64_t>(rows, (uint64_t)std::min(1e6, 3 * 5.0 / row_ms));
        span = (uint32_t)std::clamp<uint64_t>((rows + 63) / 64 * 64, 64, 256);
    }
    return std::min(span, chunk_tokens);
}

reuse_point snap_reuse(const assembled_prompt & prompt, size_t n_blocks) {
    const auto n = static_cast<pos_t>(prompt.tokens.size());
    size_t k = std::min(n_blocks, prompt.blocks.size());
    while (k > 0 && prompt.blocks[k - 1].end >= n) --k;
    return {k, k == 0 ? 0 : prompt.blocks[k - 1].end};
}

}  // namespace warmctx
