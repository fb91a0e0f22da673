// The work streams of a context_engine: the moves of KV between them and the tiers
// (stream_moves.h: the lazy write-back of their blocks to the RAM pool, or a copy into a
// free stream, before something overwrites them; a prefix taken into one; their
// checkpoints bounded), and the engine's calls on them: which stream a turn takes, and
// what an idle engine thread writes ahead.
#include "util/clock.h"

#include <algorithm>

#include "admission.h"
#include "context_engine_impl.h"
#include "stream_moves.h"

namespace warmctx {

status stream_moves::copy_from_holder(seq_id holder, seq_id seq, const assembled_prompt & prompt, reuse_point & at) {
    status st = streams_.is_stream(holder) ? eng_.copy_seq_now(holder, seq) : tiers_.pool->copy_seq(holder, seq);
    if (st.ok()) {
        at = resumable(seq, prompt, at);
        st = eng_.trim_seq(seq, at.n_tokens);
    }
    if (!st.ok()) eng_.clear_seq(seq);
    return st;
}

void stream_moves::write_back(seq_id seq, size_t n_blocks) {
    work_stream & s = streams_[(size_t)seq];
    n_blocks = cuttable(seq, s.blocks, n_blocks);  // saved where its state can be cut
    if (s.busy || !s.unsaved || n_blocks == 0) return;
    s.unsaved = false;
    auto t = clock_type::now();
    status st = tiers_.cache->insert(s.workspace, std::span<const block>(s.blocks.data(), n_blocks), seq, s.t_finished);
    if (st.ok() || st.code() == status_code::resource_exhausted) ctr_.n_write_backs++;
    ctr_.write_back_ms += ms_between(t, clock_type::now());
}

void stream_moves::save_branch(seq_id seq, size_t n_keep, double prefill_tokens_per_ms) {
    work_stream & s = streams_[(size_t)seq];
    const size_t n = std::min(s.blocks.size(), s.n_durable);
    if (!s.unsaved || n_keep >= n) return;
    retention_class top = retention_class::none;
    for (size_t i = n_keep; i < n; ++i) top = std::max(top, s.blocks[i].retention);
    if (top <= retention_class::low) {
        ctr_.n_branches_dropped++;
        return;
    }
    if (park(seq) >= 0) {
        ctr_.n_branches_parked++;
        return;
    }
    // The pool saves the stream whole. Where that takes longer than the branch's tokens
    // take to prefill again, even a retry that surely came would be served sooner
    // without the save.
    // The stream's cells and its checkpoints (the pool's entry carries them): its bytes.
    const context_info & ci = eng_.context();
    const double stream_bytes = (double)eng_.seq_n_tokens(seq) * (double)ci.kv_bytes_per_token +
                                (double)eng_.checkpoints(seq).size() * (double)ci.memory.checkpoint_bytes;
    const pos_t from = n_keep == 0 ? 0 : s.blocks[n_keep - 1].end;
    if (save_costs_more_than_prefill(stream_bytes, tiers_.pool->counters(), (double)(s.blocks[n - 1].end - from),
                                     prefill_tokens_per_ms)) {
        ctr_.n_branches_too_costly++;
        return;
    }
    write_back(seq);
}

seq_id stream_moves::park(seq_id seq) {
    if (!streams_.copies) return -1;
    const seq_id f = streams_.free_stream(seq);
    if (f < 0 || !eng_.copy_seq_now(seq, f).ok()) return -1;
    const work_stream & s = streams_[(size_t)seq];
    work_stream & d = streams_[(size_t)f];
    d.blocks = s.blocks;
    d.workspace = s.workspace;
    d.t_finished = s.t_finished;
    d.n_durable = s.n_durable;
    d.unsaved = s.unsaved;
    ctr_.n_stream_copies++;
    return f;
}

void stream_moves::keep_deferred(seq_id seq, pos_t keep, std::string_view workspace,
                                 std::span<const block> next) {
    auto it = tiers_.deferred.find(seq);
    if (it == tiers_.deferred.end() || keep >= it->second.save_end) return;
    if (deferred_write & d = it->second; d.workspace == workspace) {
        // The workspace's own next turn: its own write, when it ends, starts with what the
        // two prompts share; the old prompt's tail past that, which the workspace moved on
        // from, is given up rather than copied out on the turn's way. In place, the write is
        // cut to the blocks the turn keeps; where the stream is cleared for it (its prefix
        // taken from elsewhere, or none), the write goes. If the turn fails before it ends,
        // what it would have covered is not written from this stream.
        size_t n = 0;
        while (n < d.n_blocks && d.prompt.blocks[n].end <= keep) ++n;
        if (n > 0) {
            d.n_blocks = n;
            d.save_end = std::min(d.save_end, d.prompt.blocks[n - 1].end);
            ctr_.n_deferred_writes_cut++;
            return;
        }
        if (keep == 0 && !next.empty() && !d.prompt.blocks.empty() && d.prompt.blocks[0].chain == next[0].chain) {
            tiers_.deferred.erase(it);
            ctr_.n_deferred_writes_cut++;
            return;
        }
    }
    if (const seq_id f = park(seq); f >= 0) {
        // The parked copy holds all the stream did and owes its saves: the write goes with
        // it, made when the engine is idle (write_through_idle) or before `f` is reused.
        deferred_write d = std::move(it->second);
        tiers_.deferred.erase(it);
        d.seq = f;
        tiers_.defer(std::move(d));
        streams_[(size_t)seq].unsaved = false;
        ctr_.n_deferred_writes_parked++;
        return;
    }
    tiers_.flush_deferred_of(seq);
}

void stream_moves::write_back_displaced(seq_id seq, std::string_view workspace, std::span<const block> next,
                                        double prefill_tokens_per_ms) {
    work_stream & s = streams_[(size_t)seq];
    const size_t n = std::min(s.n_durable, s.blocks.size());
    if (!s.unsaved || n == 0) return;
    const std::span<const block> durable(s.blocks.data(), n);
    if (tiers_.cache->peek(durable, s.workspace).n_blocks >= n) {
        s.unsaved = false;
        return;
    }
    // Another stream of the device tier still holds them: nothing would be lost.
    if (streams_.copies && streams_.holding(durable, seq) >= 0) return;
    if (!workspace.empty() && s.workspace == workspace) {
        size_t shared = 0;
        while (shared < n && shared < next.size() && next[shared].chain == s.blocks[shared].chain) ++shared;
        if (shared > 0) {
            save_branch(seq, shared, prefill_tokens_per_ms);
            return;
        }
    }
    write_back(seq, n);
}

void stream_moves::write_back_sharing(std::span<const block> blocks, seq_id except) {
    for (size_t s = 0; s < streams_.size(); ++s)
        if ((seq_id)s != except && streams_.n_held((seq_id)s, blocks) > 0) write_back((seq_id)s);
}

size_t stream_moves::thin_checkpoints(seq_id seq, size_t max_count) {
    std::vector<pos_t> at = eng_.checkpoints(seq);
    max_count = std::max<size_t>(max_count, 1);
    // Those of the last turn (from where it resumed on) are where the workspace's next
    // turn resumes: thinned only when they alone are too many, and never the deepest few
    // (the end of what it cached, its own message).
    const pos_t last_turn = streams_[(size_t)seq].resumed_at;
    const size_t recent = std::min<size_t>(4, max_count);
    size_t n = 0;
    while (at.size() > max_count) {
        const size_t older = (size_t)(std::lower_bound(at.begin(), at.end(), last_turn) - at.begin());
        const size_t upto = older > 0 ? older : at.size() - recent;  // candidates [0, upto)
        // Of those, the one nearest to the one before it (the first: to the start).
        size_t drop = 0;
        for (size_t i = 1; i < upto; ++i)
            if (at[i] - at[i - 1] < at[drop] - (drop == 0 ? 0 : at[drop - 1])) drop = i;
        eng_.drop_checkpoint(seq, at[drop]);
        at.erase(at.begin() + (long)drop);
        ++n;
    }
    ctr_.n_checkpoints_thinned += n;
    return n;
}

size_t stream_moves::bound_stream_checkpoints(seq_id keep) {
    if (!eng_.context().memory.checkpoints) return 0;
    for (size_t s = 0; s < streams_.size(); ++s) thin_checkpoints((seq_id)s, opts_.stream_checkpoint_max_count);
    const uint64_t max = opts_.stream_checkpoint_max_bytes;
    if (max == 0) return 0;
    size_t n = 0;
    // A stream that owes nothing (its blocks offered to the pool, no deferred disk write)
    // goes first: clearing it copies nothing out of the device, where another's prefix
    // would leave it whole (~0.6 GB of a 4B hybrid's KV) while the next turn waits.
    auto owes = [this](seq_id s) { return streams_[(size_t)s].unsaved || tiers_.deferred.count(s) > 0; };
    while (eng_.checkpoint_bytes_held() > max) {
        seq_id victim = -1;
        for (size_t s = 0; s < streams_.size(); ++s) {
            const work_stream & w = streams_[s];
            if ((seq_id)s == keep || w.busy || eng_.checkpoints((seq_id)s).empty()) continue;
            if (victim < 0) {
                victim = (seq_id)s;
                continue;
            }
            const auto key = std::make_pair(owes((seq_id)s), w.t_finished);
            if (key < std::make_pair(owes(victim), streams_[(size_t)victim].t_finished)) victim = (seq_id)s;
        }
        if (victim < 0) break;  // what is left belongs to turns in flight (or `keep`)
        write_back(victim);
        clear_stream(victim);
        ctr_.n_checkpoint_evictions++;
        ++n;
    }
    // Still over: the streams left (turns in flight, `keep`) thinned, the most held first,
    // down to their deepest checkpoint each at most.
    for (size_t count = opts_.stream_checkpoint_max_count; eng_.checkpoint_bytes_held() > max && count > 1;) {
        count = count / 2;
        for (size_t s = 0; s < streams_.size() && eng_.checkpoint_bytes_held() > max; ++s)
            thin_checkpoints((seq_id)s, count);
    }
    return n;
}

void stream_moves::take_prefix(seq_id seq, const assembled_prompt & prompt, match & m, reuse_point & at,
                               bool & in_place, std::string & refused) {
    const pos_t wanted = at.n_tokens;
    status st;
    if (in_place) {
        at = resumable(seq, prompt, at);
        st = eng_.trim_seq(seq, at.n_tokens);
    } else {
        st = copy_from_holder(m.holder, seq, prompt, at);
        if (st.ok() && streams_.is_stream(m.holder)) ctr_.n_stream_copies++;
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
    eng_.clear_seq(seq);
    ctr_.n_reuse_refused++;
    refused = "the cached prefix of " + std::to_string(wanted) + " tokens could not be reused (" + st.message() +
              "); prefilled cold";
    at = reuse_point{};
    m = match{};
    in_place = false;
}

void stream_moves::restore_from_tiers(const assembled_prompt & prompt, seq_id seq, match & m, reuse_point & at,
                                      bool & in_place, kv_tier & tier, std::string & failed, double & ms) {
    auto tr = clock_type::now();
    disk_kv_tier::hit h = tiers_.disk->restore(eng_, tiers_.prof, prompt, at.n_tokens, seq);
    if (h.tier != kv_tier::none) {
        tier = h.tier;
        at = h.at;
        m = h.as_match();
        in_place = false;  // the restore replaced the stream's content
    }
    // A restore tried, whether it loaded or failed (a file that fails its checks is read
    // and quarantined on the way): its time is the restore's.
    if (h.tier != kv_tier::none || !h.failed.empty()) ms = ms_between(tr, clock_type::now());
    if (h.tier != kv_tier::none || h.failed.empty()) return;
    failed = std::move(h.failed);
    // A load that failed cleared the stream: what it held in place is gone.
    if (in_place && eng_.seq_n_tokens(seq) < at.n_tokens) {
        at = reuse_point{};
        m = match{};
        in_place = false;
        tier = kv_tier::none;
    }
}

size_t stream_moves::cuttable(seq_id seq, std::span<const block> blocks, size_t n) const {
    n = std::min(n, blocks.size());
    while (n > 0 && !eng_.can_trim(seq, blocks[n - 1].end)) --n;
    return n;
}

reuse_point stream_moves::resumable(seq_id seq, const assembled_prompt & prompt, reuse_point at) const {
    while (at.n_blocks > 0 && !eng_.can_trim(seq, at.n_tokens)) {
        --at.n_blocks;
        at.n_tokens = at.n_blocks == 0 ? 0 : prompt.blocks[at.n_blocks - 1].end;
    }
    return at;
}

void stream_moves::clear_stream(seq_id seq) {
    tiers_.flush_deferred_of(seq);  // its disk write-through, while the stream still holds it
    eng_.clear_seq(seq);
    work_stream & s = streams_[(size_t)seq];
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

seq_id context_engine::stream_of_workspace(std::string_view workspace, std::span<const seq_id> idle) const {
    for (seq_id s : idle)
        if (s >= 0 && (size_t)s < p_->streams.size()) {
            const work_stream & st = p_->streams[(size_t)s];
            if (!st.busy && !st.blocks.empty() && st.workspace == workspace) return s;
        }
    return -1;
}

void context_engine::drop_work_streams() {
    p_->flush_deferred();
    for (size_t s = 0; s < p_->streams.size(); ++s) {
        if (p_->streams[s].busy) continue;
        p_->moves.write_back((seq_id)s);
        p_->moves.clear_stream((seq_id)s);
    }
}

bool context_engine::write_through_idle(std::chrono::milliseconds * retry_in) {
    if (retry_in) *retry_in = std::chrono::milliseconds(0);
    p_->volatility.save();
    if (p_->tiers.deferred.empty()) return false;
    const auto since =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - p_->streams.last_finished_at);
    const std::chrono::milliseconds delay(p_->opts.write_through_delay_ms);
    if (since < delay) {
        if (retry_in) *retry_in = std::max(std::chrono::milliseconds(1), delay - since);
        return false;
    }
    p_->tiers.flush_deferred_of(p_->tiers.deferred.begin()->first);
    return true;
}

bool context_engine::write_through_overdue(bool quiet) {
    const uint64_t max_ms = (uint64_t)p_->opts.write_through_max_delay_ms * (quiet ? 1 : 2);
    if (max_ms == 0 || p_->tiers.deferred.empty()) return false;
    // Of the streams no turn is on (a turn in flight moves its stream past the prefix).
    auto oldest = p_->tiers.deferred.end();
    for (auto it = p_->tiers.deferred.begin(); it != p_->tiers.deferred.end(); ++it)
        if (!p_->streams[(size_t)it->first].busy &&
            (oldest == p_->tiers.deferred.end() || it->second.since < oldest->second.since))
            oldest = it;
    if (oldest == p_->tiers.deferred.end() ||
        clock_type::now() - oldest->second.since < std::chrono::milliseconds(max_ms))
        return false;
    p_->tiers.flush_deferred_of(oldest->first);
    p_->ctr.memory.n_write_throughs_overdue++;
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
    if (victim == p_->streams.last_finished_seq) {
        const auto since =
            std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - p_->streams.last_finished_at);
        if (since < k_write_ahead_delay) {
            if (retry_in) *retry_in = k_write_ahead_delay - since;
            return false;
        }
    }
    const uint64_t before = p_->ctr.memory.n_write_backs;
    p_->moves.write_back_displaced(victim);  // nothing when the pool or another stream holds them
    if (p_->ctr.memory.n_write_backs == before) return false;
    p_->ctr.memory.n_write_backs_ahead++;
    return true;
}

}  // namespace warmctx
