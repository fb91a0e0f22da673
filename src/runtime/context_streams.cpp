// The work streams of a context_engine: which stream a turn takes, how much of a prompt a
// stream still holds, and the lazy write-back of their blocks to the RAM pool (or a copy
// into a free stream) before something overwrites them.
#include "warmctx/clock.h"

#include <algorithm>

#include "admission.h"
#include "context_engine_impl.h"

namespace warmctx {

status context_engine::impl::copy_from_holder(seq_id holder, seq_id seq, const assembled_prompt & prompt,
                                              reuse_point & at) {
    status st = is_stream(holder) ? eng->copy_seq_now(holder, seq) : pool->copy_seq(holder, seq);
    if (st.ok()) {
        at = resumable(seq, prompt, at);
        st = eng->trim_seq(seq, at.n_tokens);
    }
    if (!st.ok()) eng->clear_seq(seq);
    return st;
}

void context_engine::impl::write_back(seq_id seq, size_t n_blocks) {
    work_stream & s = streams[(size_t)seq];
    n_blocks = cuttable(seq, s.blocks, n_blocks);  // saved where its state can be cut
    if (s.busy || !s.unsaved || n_blocks == 0) return;
    s.unsaved = false;
    auto t = clock_type::now();
    status st = cache->insert(s.workspace, std::span<const block>(s.blocks.data(), n_blocks), seq, s.t_finished);
    if (st.ok() || st.code() == status_code::resource_exhausted) ctr.memory.n_write_backs++;
    ctr.memory.write_back_ms += ms_between(t, clock_type::now());
}

seq_id context_engine::impl::stream_holding(std::span<const block> blocks, seq_id except) const {
    for (size_t o = 0; o < streams.size(); ++o)
        if ((seq_id)o != except && !streams[o].busy && stream_match((seq_id)o, blocks) >= blocks.size())
            return (seq_id)o;
    return -1;
}

seq_id context_engine::impl::free_stream(seq_id except) const {
    for (size_t o = 0; o < streams.size(); ++o)
        if ((seq_id)o != except && !streams[o].busy && streams[o].blocks.empty()) return (seq_id)o;
    return -1;
}

void context_engine::impl::save_branch(seq_id seq, size_t n_keep) {
    work_stream & s = streams[(size_t)seq];
    const size_t n = std::min(s.blocks.size(), s.n_durable);
    if (!s.unsaved || n_keep >= n) return;
    retention_class top = retention_class::none;
    for (size_t i = n_keep; i < n; ++i) top = std::max(top, s.blocks[i].retention);
    if (top <= retention_class::low) {
        ctr.memory.n_branches_dropped++;
        return;
    }
    if (stream_copies) {
        if (const seq_id f = free_stream(seq); f >= 0 && eng->copy_seq_now(seq, f).ok()) {
            work_stream & d = streams[(size_t)f];
            d.blocks = s.blocks;
            d.workspace = s.workspace;
            d.t_finished = s.t_finished;
            d.n_durable = s.n_durable;
            d.unsaved = true;
            ctr.memory.n_branches_parked++;
            ctr.memory.n_stream_copies++;
            return;
        }
    }
    write_back(seq);
}

void context_engine::impl::write_back_displaced(seq_id seq) {
    work_stream & s = streams[(size_t)seq];
    const size_t n = std::min(s.n_durable, s.blocks.size());
    if (!s.unsaved || n == 0) return;
    const std::span<const block> durable(s.blocks.data(), n);
    if (cache->peek(durable, s.workspace).n_blocks >= n) {
        s.unsaved = false;
        return;
    }
    // Another stream of the device tier still holds them: nothing would be lost.
    if (stream_copies && stream_holding(durable, seq) >= 0) return;
    write_back(seq, n);
}

void context_engine::impl::write_back_sharing(std::span<const block> blocks, seq_id except) {
    for (size_t s = 0; s < streams.size(); ++s)
        if ((seq_id)s != except && stream_match((seq_id)s, blocks) > 0) write_back((seq_id)s);
}

match context_engine::impl::best_match(match m, std::span<const block> blocks, seq_id seq) const {
    const bool others = seq < 0 || stream_copies;
    const bool stream_wins_tie = seq >= 0 || stream_copies;
    bool have_stream = false;
    auto consider = [&](size_t s) {
        if (streams[s].busy) return;
        const size_t n = stream_match((seq_id)s, blocks);
        if (n == 0 || n < m.n_blocks || (n == m.n_blocks && (have_stream || !stream_wins_tie))) return;
        m.n_blocks = n;
        m.n_tokens = blocks[n - 1].end;
        m.holder = (seq_id)s;
        m.workspace = streams[s].workspace;
        have_stream = true;
    };
    if (seq >= 0) consider((size_t)seq);
    if (others)
        for (size_t s = 0; s < streams.size(); ++s)
            if ((seq_id)s != seq) consider(s);
    return m;
}

match context_engine::impl::prefer_in_place(match m, const assembled_prompt & prompt, seq_id seq) const {
    if (!is_stream(seq) || m.holder == seq || streams[(size_t)seq].busy) return m;
    const reuse_point own = snap_reuse(prompt, stream_match(seq, prompt.blocks));
    if (own.n_tokens == 0 || own.n_tokens < snap_reuse(prompt, m.n_blocks).n_tokens) return m;
    m.n_blocks = own.n_blocks;
    m.n_tokens = own.n_tokens;
    m.holder = seq;
    m.workspace = streams[(size_t)seq].workspace;
    return m;
}

size_t context_engine::impl::thin_checkpoints(seq_id seq, size_t max_count) {
    std::vector<pos_t> at = eng->checkpoints(seq);
    max_count = std::max<size_t>(max_count, 1);
    // Those of the last turn (from where it resumed on) are where the workspace's next
    // turn resumes: thinned only when they alone are too many, and never the deepest few
    // (the end of what it cached, its own message).
    const pos_t last_turn = streams[(size_t)seq].resumed_at;
    const size_t recent = std::min<size_t>(4, max_count);
    size_t n = 0;
    while (at.size() > max_count) {
        const size_t older = (size_t)(std::lower_bound(at.begin(), at.end(), last_turn) - at.begin());
        const size_t upto = older > 0 ? older : at.size() - recent;  // candidates [0, upto)
        // Of those, the one nearest to the one before it (the first: to the start).
        size_t drop = 0;
        for (size_t i = 1; i < upto; ++i)
            if (at[i] - at[i - 1] < at[drop] - (drop == 0 ? 0 : at[drop - 1])) drop = i;
        eng->drop_checkpoint(seq, at[drop]);
        at.erase(at.begin() + (long)drop);
        ++n;
    }
    ctr.memory.n_checkpoints_thinned += n;
    return n;
}

size_t context_engine::impl::bound_stream_checkpoints(seq_id keep) {
    if (!eng->context().memory.checkpoints) return 0;
    for (size_t s = 0; s < streams.size(); ++s) thin_checkpoints((seq_id)s, opts.stream_checkpoint_max_count);
    const uint64_t max = opts.stream_checkpoint_max_bytes;
    if (max == 0) return 0;
    size_t n = 0;
    while (eng->checkpoint_bytes_held() > max) {
        seq_id victim = -1;
        for (size_t s = 0; s < streams.size(); ++s) {
            const work_stream & w = streams[s];
            if ((seq_id)s == keep || w.busy || eng->checkpoints((seq_id)s).empty()) continue;
            if (victim < 0 || w.t_finished < streams[(size_t)victim].t_finished) victim = (seq_id)s;
        }
        if (victim < 0) break;  // what is left belongs to turns in flight (or `keep`)
        write_back(victim);
        clear_stream(victim);
        ctr.memory.n_checkpoint_evictions++;
        ++n;
    }
    // Still over: the streams left (turns in flight, `keep`) thinned, the most held first,
    // down to their deepest checkpoint each at most.
    for (size_t count = opts.stream_checkpoint_max_count; eng->checkpoint_bytes_held() > max && count > 1;) {
        count = count / 2;
        for (size_t s = 0; s < streams.size() && eng->checkpoint_bytes_held() > max; ++s)
            thin_checkpoints((seq_id)s, count);
    }
    return n;
}

void context_engine::impl::take_prefix(seq_id seq, const assembled_prompt & prompt, match & m, reuse_point & at,
                                       bool & in_place, std::string & refused) {
    const pos_t wanted = at.n_tokens;
    status st;
    if (in_place) {
        at = resumable(seq, prompt, at);
        st = eng->trim_seq(seq, at.n_tokens);
    } else {
        st = copy_from_holder(m.holder, seq, prompt, at);
        if (st.ok() && is_stream(m.holder)) ctr.memory.n_stream_copies++;
    }
    if (st.ok()) {
        if (at.n_tokens < wanted)
            refused = "the state has no checkpoint at " + std::to_string(wanted) +
                      " tokens (left out or thinned); resumed from " + std::to_string(at.n_tokens);
        m.n_blocks = at.n_blocks;
        m.n_tokens = at.n_tokens;
        if (at.n_tokens == 0) {
            m = match{};
            in_place = false;
        }
        return;
    }
    // The prefix could not be taken (an engine error): the turn is served cold, never
    // refused, and says why.
    eng->clear_seq(seq);
    ctr.memory.n_reuse_refused++;
    refused = "the cached prefix of " + std::to_string(wanted) + " tokens could not be reused (" + st.message() +
              "); prefilled cold";
    at = reuse_point{};
    m = match{};
    in_place = false;
}

size_t context_engine::impl::cuttable(seq_id seq, std::span<const block> blocks, size_t n) const {
    n = std::min(n, blocks.size());
    while (n > 0 && !eng->can_trim(seq, blocks[n - 1].end)) --n;
    return n;
}

reuse_point context_engine::impl::resumable(seq_id seq, const assembled_prompt & prompt, reuse_point at) const {
    while (at.n_blocks > 0 && !eng->can_trim(seq, at.n_tokens)) {
        --at.n_blocks;
        at.n_tokens = at.n_blocks == 0 ? 0 : prompt.blocks[at.n_blocks - 1].end;
    }
    return at;
}

void context_engine::impl::clear_stream(seq_id seq) {
    flush_deferred_of(seq);  // its disk write-through, while the stream still holds it
    eng->clear_seq(seq);
    work_stream & s = streams[(size_t)seq];
    s.blocks.clear();
    s.workspace.clear();
    s.unsaved = false;
}

seq_id context_engine::pick_work_seq(std::string_view workspace, std::span<const seq_id> free_seqs) const {
    std::vector<stream_view> views;
    views.reserve(p_->streams.size());
    for (const work_stream & st : p_->streams)
        views.push_back({st.busy, st.blocks.empty(), st.workspace, st.t_finished});
    return choose_stream(workspace, views, free_seqs);
}

void context_engine::drop_work_streams() {
    p_->flush_deferred();
    for (size_t s = 0; s < p_->streams.size(); ++s) {
        if (p_->streams[s].busy) continue;
        p_->write_back((seq_id)s);
        p_->clear_stream((seq_id)s);
    }
}

bool context_engine::write_through_idle(std::chrono::milliseconds * retry_in) {
    if (retry_in) *retry_in = std::chrono::milliseconds(0);
    p_->save_volatility();
    if (p_->deferred.empty()) return false;
    const auto since = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - p_->last_finished_at);
    const std::chrono::milliseconds delay(p_->opts.write_through_delay_ms);
    if (since < delay) {
        if (retry_in) *retry_in = std::max(std::chrono::milliseconds(1), delay - since);
        return false;
    }
    p_->flush_deferred_of(p_->deferred.begin()->first);
    return true;
}

bool context_engine::write_back_ahead(std::chrono::milliseconds * retry_in) {
    if (retry_in) *retry_in = std::chrono::milliseconds(0);
    seq_id victim = -1;
    uint64_t oldest = 0;
    for (size_t s = 0; s < p_->streams.size(); ++s) {
        const work_stream & st = p_->streams[s];
        if (st.busy) continue;
        if (st.blocks.empty()) return false;  // a free stream: nothing is displaced next
        if (victim < 0 || st.t_finished < oldest) {
            victim = (seq_id)s;
            oldest = st.t_finished;
        }
    }
    if (victim < 0 || !p_->streams[(size_t)victim].unsaved) return false;
    // The stream a turn has just finished on is its workspace's: an agent's next turn
    // comes back to it in place, most often within moments, and then nothing is
    // displaced. Saving it now (a copy of its whole prefix, 370 ms for 47k tokens out of
    // an H200) would hold that turn in the queue; it waits k_write_ahead_delay first.
    if (victim == p_->last_finished_seq) {
        const auto since =
            std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - p_->last_finished_at);
        if (since < k_write_ahead_delay) {
            if (retry_in) *retry_in = k_write_ahead_delay - since;
            return false;
        }
    }
    const uint64_t before = p_->ctr.memory.n_write_backs;
    p_->write_back_displaced(victim);  // nothing when the pool or another stream holds them
    if (p_->ctr.memory.n_write_backs == before) return false;
    p_->ctr.memory.n_write_backs_ahead++;
    return true;
}

}  // namespace warmctx
