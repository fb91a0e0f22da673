// The one path a turn computes by (runtime/engine_path.h): whether a request fits a work
// sequence, the prefill of a prompt's tail in canonical chunks with its checkpoints, and
// the generation after it.
#include "engine_path.h"

#include <algorithm>

#include "util/clock.h"

namespace warmctx {

status engine_path::plausible(const turn_request & req) const {
    uint64_t bytes = 0;
    for (const segment & sg : req.segments) bytes += sg.content.size() + sg.path.size();
    const uint64_t n_ctx = eng->context().n_ctx_seq;
    if (max_piece_bytes > 0 && bytes / max_piece_bytes > n_ctx)
        return out_of_range("the request's segments hold " + std::to_string(bytes) + " bytes of text, at least " +
                            std::to_string(bytes / max_piece_bytes) +
                            " tokens (no token of this model covers more than " + std::to_string(max_piece_bytes) +
                            " bytes), but the context holds " + std::to_string(n_ctx) +
                            " per sequence (start the server with a larger -c/--n-ctx)");
    return {};
}

status engine_path::fits(const assembled_prompt & prompt) const {
    if (prompt.tokens.size() <= eng->context().n_ctx_seq) return {};
    return out_of_range("prompt needs " + std::to_string(prompt.tokens.size()) + " tokens but the context holds " +
                        std::to_string(eng->context().n_ctx_seq) +
                        " per sequence (start the server with a larger -c/--n-ctx)");
}

namespace {
// Where a model with checkpoints keeps them: its prompt's block ends - but the prompt's
// end when its last block is the generation prompt alone: no turn resumes there (a stream
// keeps its blocks up to the turn's own message; the generation prompt and the answer go),
// and on a GPU a checkpoint is a copy of the recurrent state out of the device (52.7 MB for
// Qwen3.5-4B). A generation prompt fused with the message before it is kept with it.
// Of those, an end nearer than `gap` tokens to the next one kept is left out (a turn that
// would resume there resumes from the one before and prefills at most `gap` tokens more),
// but never the last two, the end of the cacheable blocks and the turn's own message (where
// the workspace's next turn resumes), nor the end of the stable prefix (where one that
// changes its volatile content resumes).
std::vector<pos_t> checkpoint_ends(const assembled_prompt & prompt, size_t n_cacheable, pos_t gap) {
    std::vector<pos_t> ends;
    ends.reserve(prompt.blocks.size());
    for (const block & b : prompt.blocks) ends.push_back(b.end);
    const pos_t n = (pos_t)prompt.tokens.size();
    const manifest & m = prompt.prompt_manifest;
    if (!ends.empty() && ends.back() == n && m.generation_prompt_begin >= 0 && m.generation_prompt_end == n &&
        m.generation_prompt_end > m.generation_prompt_begin && prompt.blocks.back().begin >= m.generation_prompt_begin)
        ends.pop_back();
    if (gap > 0 && ends.size() > 2) {
        const pos_t cacheable_end = n_cacheable > 0 ? prompt.blocks[n_cacheable - 1].end : -1;
        std::vector<pos_t> kept{ends.back()};
        for (size_t i = ends.size() - 1; i-- > 0;)
            if (i + 2 >= ends.size() || ends[i] == cacheable_end || ends[i] == prompt.stable_end ||
                kept.back() - ends[i] >= gap)
                kept.push_back(ends[i]);
        ends.assign(kept.rbegin(), kept.rend());
    }
    if (ends.empty()) ends.push_back(-1);  // none (engine::prefill reads an empty list as every chunk end)
    return ends;
}
}  // namespace

pos_t engine_path::checkpoint_gap() const {
    if (checkpoint_gap_tokens >= 0) return checkpoint_gap_tokens;
    // What taking one costs, in the tokens a prefill computes meanwhile, and at least the
    // tokens whose attention KV outweighs one checkpoint (prof.checkpoint_tokens): they
    // then cost at most the memory of the KV they cover.
    const pos_t time_gap = (pos_t)std::min(1e6, eng->checkpoint_mean_ms() * prefill_tokens_per_ms);
    return std::max(time_gap, (pos_t)prof.checkpoint_tokens);
}

status engine_path::prefill(seq_id seq, const assembled_prompt & prompt, pos_t from, pos_t end,
                            std::vector<float> & logits, double & ms, double & checkpoint_ms) {
    auto tp = clock_type::now();
    const double c0 = eng->checkpoint_ms();
    std::span<const token_id> part(prompt.tokens.data() + from, (size_t)(end - from));
    const bool last = (size_t)end == prompt.tokens.size();
    WARMCTX_RETURN_IF_ERROR(eng->prefill(
        seq, part, from, prompt.boundaries, last ? &logits : nullptr, (int32_t)prof.chunk_tokens,
        eng->context().memory.checkpoints ? checkpoint_ends(prompt, n_cacheable_blocks(prompt), checkpoint_gap())
                                          : std::vector<pos_t>{}));
    const double ckpt = eng->checkpoint_ms() - c0;
    const double took = ms_between(tp, clock_type::now()) - ckpt;
    ms += took;
    checkpoint_ms += ckpt;
    note_prefill_rate((pos_t)part.size(), took);
    return {};
}

status engine_path::generate(seq_id seq, const turn_request & req, std::span<const token_id> prompt,
                             std::vector<float> logits, turn_result & out, clock_type::time_point t0) {
    out.t_first_token_ms = ms_between(t0, clock_type::now());
    if (req.keep_logits) out.prompt_logits = logits;
    // The cold reference decodes without drafts: a warm answer with them must equal it.
    std::unique_ptr<draft_index> drafts;
    if (seq != cold_seq && req.sampling.draft_max > 0 && drops_a_draft(eng->context().memory))
        drafts = answers.index_for(req.workspace, prompt);
    auto g =
        eng->generate(seq, std::move(logits), req.sampling, req.keep_logits ? &out.gen_logits : nullptr, drafts.get());
    if (!g.ok()) return g.error();
    if (seq != cold_seq && req.cache) answers.remember(req.workspace, prompt, g->tokens);
    out.gen = std::move(g.value());
    out.t_decode_ms = out.gen.t_decode_ms;
    out.t_total_ms = ms_between(t0, clock_type::now());
    return {};
}

}  // namespace warmctx
