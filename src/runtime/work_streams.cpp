// What the work streams hold of a prompt (runtime/work_streams.h): how many of its leading
// blocks each still holds, and which stream a turn's reuse comes from.
#include "work_streams.h"

namespace warmctx {

size_t work_streams::n_held(seq_id seq, std::span<const block> blocks) const {
    const work_stream & s = streams_[(size_t)seq];
    size_t n = 0;
    while (n < s.blocks.size() && n < blocks.size() && s.blocks[n].chain == blocks[n].chain) ++n;
    return n;
}

seq_id work_streams::holding(std::span<const block> blocks, seq_id except) const {
    for (size_t o = 0; o < streams_.size(); ++o)
        if ((seq_id)o != except && !streams_[o].busy && n_held((seq_id)o, blocks) >= blocks.size()) return (seq_id)o;
    return -1;
}

seq_id work_streams::free_stream(seq_id except) const {
    for (size_t o = 0; o < streams_.size(); ++o)
        if ((seq_id)o != except && !streams_[o].busy && streams_[o].blocks.empty()) return (seq_id)o;
    return -1;
}

match work_streams::best_match(match m, std::span<const block> blocks, seq_id seq) const {
    const bool others = seq < 0 || copies;
    const bool stream_wins_tie = seq >= 0 || copies;
    bool have_stream = false;
    auto consider = [&](size_t s) {
        if (streams_[s].busy) return;
        const size_t n = n_held((seq_id)s, blocks);
        if (n == 0 || n < m.n_blocks || (n == m.n_blocks && (have_stream || !stream_wins_tie))) return;
        m.n_blocks = n;
        m.n_tokens = blocks[n - 1].end;
        m.holder = (seq_id)s;
        m.workspace = streams_[s].workspace;
        have_stream = true;
    };
    if (seq >= 0) consider((size_t)seq);
    if (others)
        for (size_t s = 0; s < streams_.size(); ++s)
            if ((seq_id)s != seq) consider(s);
    return m;
}

match work_streams::prefer_in_place(match m, const assembled_prompt & prompt, seq_id seq) const {
    if (!is_stream(seq) || m.holder == seq || streams_[(size_t)seq].busy) return m;
    const reuse_point own = snap_reuse(prompt, n_held(seq, prompt.blocks));
    if (own.n_tokens == 0 || own.n_tokens < snap_reuse(prompt, m.n_blocks).n_tokens) return m;
    m.n_blocks = own.n_blocks;
    m.n_tokens = own.n_tokens;
    m.holder = seq;
    m.workspace = streams_[(size_t)seq].workspace;
    return m;
}

}  // namespace warmctx
