// What a context_engine remembers per workspace and the calls on a workspace as a whole:
// its last turn (for explain) and the bounds on what is remembered, pins, snapshots,
// suspend and resume, branches, forgetting; and the counters.
#include "warmctx/context_engine.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <optional>

#include "context_engine_impl.h"
#include "workspace_histories.h"
#include "workspace_volatility.h"
#include "warmctx/hash.h"
#include "warmctx/volatility.h"

namespace warmctx {

void workspace_histories::record(const std::string & ws, const pending_turn & t, const profile & prof) {
    auto & h = by_name[ws];
    n_tokens -= h.last_tokens.size();
    h.last_manifest = t.prompt.prompt_manifest;
    h.last_profile = prof;
    h.last_tokens = t.prompt.tokens;
    h.last_blocks = t.prompt.blocks;
    h.last_stable_end = t.prompt.stable_end;
    h.has_turn = true;
    h.t_last_used = t.tick;
    n_tokens += h.last_tokens.size();
}

void workspace_histories::add(const std::string & ws, workspace_history h) {
    n_tokens += h.last_tokens.size();
    by_name[ws] = std::move(h);
}

void workspace_histories::erase(const std::string & ws) {
    if (auto it = by_name.find(ws); it != by_name.end()) {
        n_tokens -= it->second.last_tokens.size();
        by_name.erase(it);
    }
}

std::optional<std::string> workspace_histories::least_recent_except(const std::string & keep) const {
    auto oldest = by_name.end();
    for (auto it = by_name.begin(); it != by_name.end(); ++it)
        if (it->first != keep && (oldest == by_name.end() || it->second.t_last_used < oldest->second.t_last_used))
            oldest = it;
    if (oldest == by_name.end()) return std::nullopt;
    return oldest->first;
}

void context_engine::impl::remember(const std::string & ws, const pending_turn & t) {
    workspaces.record(ws, t, run.prof);
    while (workspaces.by_name.size() > 1 &&
           (workspaces.by_name.size() > opts.max_workspaces || workspaces.n_tokens > opts.max_remembered_tokens)) {
        const std::optional<std::string> oldest = workspaces.least_recent_except(ws);
        if (!oldest) break;
        forget(*oldest);
    }
}

void context_engine::impl::forget(const std::string & ws) {
    workspaces.erase(ws);
    volatility.forget(ws);
    ctr.workspaces.erase(ws);
}

volatility_state * workspace_volatility::state_of(const std::string & ws, std::unique_lock<std::mutex> & lock) const {
    if (auto it = states.find(ws); it != states.end()) return &it->second;
    if (!store || looked_up.count(ws)) return nullptr;
    if (looked_up.size() >= k_max_looked_up) looked_up.clear();
    looked_up.insert(ws);
    lock.unlock();
    std::optional<volatility_state> st = store->read(ws);
    lock.lock();
    if (auto it = states.find(ws); it != states.end()) return &it->second;  // learned meanwhile
    if (!st) return nullptr;
    return &(states[ws] = std::move(*st));
}

void workspace_volatility::observe(const std::string & ws, const assembled_prompt & prompt) {
    std::unique_lock lock(mu);
    volatility_state * st = state_of(ws, lock);
    if (!st) st = &states[ws];
    if (observe_turn(*st, prompt.prompt_manifest, prompt.first_chat_message, prompt.hints, prompt.content_digests) ||
        st->n_turns % k_save_every == 0)
        dirty.insert(ws);
}

void workspace_volatility::save() {
    if (!store) return;
    std::lock_guard lock(mu);
    for (const std::string & ws : dirty)
        if (auto it = states.find(ws); it != states.end()) store->put(ws, it->second);
    dirty.clear();
}

void workspace_volatility::forget(const std::string & ws) {
    save();  // its file keeps what memory lets go of
    std::lock_guard lock(mu);
    states.erase(ws);
    looked_up.erase(ws);
}

void workspace_volatility::copy(const std::string & from, const std::string & to) {
    std::lock_guard lock(mu);
    if (auto v = states.find(from); v != states.end()) states[to] = v->second;
}

status context_engine::pin_workspace(const std::string & workspace, bool pinned) {
    p_->flush_deferred();
    const workspace_history * ws = p_->workspaces.find(workspace);
    if (!ws) return not_found("workspace '" + workspace + "' has no turn yet");
    p_->moves.write_back_sharing(ws->last_blocks, -1);  // pins hold what the pool has
    std::vector<block> stable;
    for (const auto & b : ws->last_blocks)
        if (b.end <= ws->last_stable_end) stable.push_back(b);
    if (pinned) p_->tiers.cache->pin(stable); else p_->tiers.cache->unpin(stable);
    return {};
}

void context_engine::drop_workspace(const std::string & workspace) {
    p_->flush_deferred();
    p_->tiers.cache->drop_workspace(workspace, ++p_->turn_clock);
    for (size_t s = 0; s < p_->streams.size(); ++s)
        if (!p_->streams[s].busy && p_->streams[s].workspace == workspace) p_->moves.clear_stream((seq_id)s);
    p_->forget(workspace);
    if (p_->volatility.store) p_->volatility.store->remove(workspace);  // what it learned goes too
}

size_t context_engine::n_remembered_workspaces() const { return p_->workspaces.by_name.size(); }

status context_engine::snapshot_workspace(const std::string & workspace) {
    p_->flush_deferred();
    snapshot_store * disk = p_->tiers.disk->disk();
    if (!disk) return failed_precondition("no disk tier (start with a cache directory)");
    const workspace_history * ws = p_->workspaces.find(workspace);
    if (!ws) return not_found("workspace '" + workspace + "' has no turn yet");
    p_->moves.write_back_sharing(ws->last_blocks, -1);
    // The pool's copy, or (the budget kept none) a work stream's blocks.
    match m = p_->streams.best_match(p_->tiers.cache->peek(ws->last_blocks, workspace), ws->last_blocks, -1);
    if (m.n_blocks == 0) {
        // Not resident: fine if the disk already holds its prefix.
        if (disk->lookup(ws->last_blocks).n_blocks > 0) return {};
        return not_found("workspace '" + workspace + "' has nothing cached to snapshot");
    }
    engine & e = *p_->run.eng;
    std::vector<block> path(ws->last_blocks.begin(), ws->last_blocks.begin() + (long)m.n_blocks);
    if (disk->lookup(path).n_blocks >= path.size()) return {};
    const bool from_stream = m.holder >= 0 && (uint32_t)m.holder < p_->opts.n_work_seqs;
    if (!from_stream && !p_->tiers.pool->state(m.holder))
        return internal_error("snapshot: the cache's holder has no state in the pool");
    // The pool's bytes and a stream's are in this context's own layout, a file's in the
    // stream-independent one; and the holder may hold more than this workspace's path
    // (another workspace's longer path through the same blocks): cut the copy.
    result<std::vector<uint8_t>> kv =
        from_stream ? e.save_seq(m.holder) : e.portable_state(*p_->tiers.pool->state(m.holder));
    if (!kv.ok()) return kv.error();
    WARMCTX_RETURN_IF_ERROR(e.truncate_state(*kv, path.back().end));
    return p_->tiers.disk->put_disk(make_snapshot(p_->run.prof, workspace, ws->last_manifest, std::move(path),
                                                  ws->last_tokens, std::move(kv.value())));
}

status context_engine::suspend_workspace(const std::string & workspace) {
    p_->flush_deferred();
    WARMCTX_RETURN_IF_ERROR(snapshot_workspace(workspace));
    p_->tiers.cache->drop_workspace(workspace, ++p_->turn_clock);
    for (size_t s = 0; s < p_->streams.size(); ++s)
        if (!p_->streams[s].busy && p_->streams[s].workspace == workspace) p_->moves.clear_stream((seq_id)s);
    return {};
}

status context_engine::resume_workspace(const std::string & workspace) {
    p_->flush_deferred();
    const workspace_history * ws = p_->workspaces.find(workspace);
    if (!ws) return not_found("workspace '" + workspace + "' has no turn yet");
    if (p_->streams.best_match(p_->tiers.cache->peek(ws->last_blocks, workspace), ws->last_blocks, -1).n_blocks > 0)
        return {};  // already resident
    // The file's state, made raw and cut in RAM, becomes a holder of the pool: no KV
    // stream is involved.
    assembled_prompt prompt;
    prompt.tokens = ws->last_tokens;
    prompt.blocks = ws->last_blocks;
    auto [h, snap] = p_->tiers.disk->fetch(p_->run.prof, prompt, 0);
    if (!snap) return not_found("no tier holds a prefix of workspace '" + workspace + "'");
    auto raw = p_->run.eng->raw_state(snap->kv, 0);
    status st = raw.ok() ? p_->run.eng->truncate_state(*raw, h.at.n_tokens) : raw.error();
    if (!st.ok()) return st.with_context("resume '" + workspace + "'");
    std::vector<block> path(ws->last_blocks.begin(), ws->last_blocks.begin() + (long)h.at.n_blocks);
    p_->tiers.pool->stage(std::move(raw.value()), h.at.n_tokens);
    st = p_->tiers.cache->insert(workspace, path, p_->tiers.pool->staging(), ++p_->turn_clock);
    p_->tiers.pool->clear_seq(p_->tiers.pool->staging());
    if (st.ok()) p_->tiers.disk->count_restore(h.at.n_tokens);
    return st;
}

status context_engine::branch_workspace(const std::string & from, const std::string & to) {
    p_->flush_deferred();
    if (from == to) return invalid_argument("branch: the new workspace must differ from the source");
    auto it = p_->workspaces.by_name.find(from);
    if (it == p_->workspaces.by_name.end()) return not_found("workspace '" + from + "' has no turn yet");
    if (p_->workspaces.by_name.count(to)) return failed_precondition("workspace '" + to + "' already exists");
    p_->workspaces.add(to, it->second);  // same manifest and prefix; the cache shares by content
    p_->volatility.copy(from, to);
    return {};
}

void context_engine::drop_engine_cache() {
    p_->flush_deferred();
    p_->tiers.cache->clear();
    for (size_t s = 0; s < p_->streams.size(); ++s)
        if (!p_->streams[s].busy) p_->moves.clear_stream((seq_id)s);
    p_->tiers.disk->forget_recent_loads();
}

context_counters context_engine::counters() const {
    context_counters c = p_->ctr;
    c.cache = p_->tiers.cache->counters();
    c.tiers = p_->tiers.disk->counters();
    kv_memory & m = c.memory;
    const context_info & ci = p_->run.eng->context();
    const uint64_t bpt = ci.kv_bytes_per_token;
    m.streams_allocated_bytes = ci.kv_streams_bytes;
    m.n_padded_decodes = p_->run.eng->padded_decodes();
    m.n_prefill_decodes = p_->run.eng->prefill_decodes();
    for (uint32_t s = 0; s < ci.n_seq_max; ++s)
        m.streams_used_bytes += (uint64_t)p_->run.eng->seq_n_tokens((seq_id)s) * bpt;
    const kv_pool_counters pc = p_->tiers.pool->counters();
    m.pool_bytes = pc.used_bytes;
    m.pool_allocated_bytes = pc.allocated_bytes;
    m.pool_entries = pc.n_entries;
    m.memory_kind = std::string(memory_kind_name(ci.memory.kind));
    m.reuse_across_turns = ci.memory.reuse;
    m.checkpoint_bytes = p_->run.eng->checkpoint_bytes_held();
    m.state_scratch_bytes = p_->run.eng->state_scratch_bytes();
    m.checkpoint_size_bytes = ci.memory.checkpoints ? ci.memory.checkpoint_bytes : 0;
    m.checkpoint_max_bytes = p_->opts.stream_checkpoint_max_bytes;
    m.n_checkpoints_taken = p_->run.eng->checkpoints_taken();
    m.checkpoint_ms = p_->run.eng->checkpoint_ms();
    m.allocated_bytes =
        m.streams_allocated_bytes + m.pool_allocated_bytes + m.checkpoint_bytes + m.state_scratch_bytes;
    m.used_bytes = m.streams_used_bytes + m.pool_bytes + m.checkpoint_bytes;
    m.n_pool_loads = pc.n_loads;
    m.pool_loaded_bytes = pc.loaded_bytes;
    m.pool_load_ms = pc.load_ms;
    m.n_pool_saves = pc.n_saves;
    m.pool_saved_bytes = pc.saved_bytes;
    m.pool_save_ms = pc.save_ms;
    m.n_streams = p_->streams.size();
    m.n_resident_streams = ci.n_seq_resident;
    m.streams_on_device = ci.n_gpu_layers > 0;
    p_->note_where_held(c);
    return c;
}

// Where each of the last-used workspaces' last prefix is now: the cache's holder of it (a
// stream, or the pool), else a snapshot on disk. Bounded: the 64 used last.
void context_engine::impl::note_where_held(context_counters & c) const {
    std::vector<std::pair<uint64_t, const std::string *>> recent;
    for (const auto & [ws, h] : workspaces.by_name)
        if (h.has_turn) recent.emplace_back(h.t_last_used, &ws);
    const size_t n = std::min<size_t>(recent.size(), 64);
    std::partial_sort(recent.begin(), recent.begin() + (long)n, recent.end(),
                      [](const auto & a, const auto & b) { return a.first > b.first; });
    for (size_t i = 0; i < n; ++i) {
        const std::string & ws = *recent[i].second;
        const workspace_history & h = workspaces.by_name.at(ws);
        workspace_counters & w = c.workspaces[ws];
        // A stream whose last turn was the workspace's holds its prefix (offered to the
        // cache lazily); else the cache's holder of it (the pool, or another stream).
        uint64_t in_stream = 0;
        for (const work_stream & st : streams)
            if (st.workspace == ws && !st.blocks.empty()) {
                size_t k = 0;
                while (k < st.blocks.size() && k < h.last_blocks.size() && st.blocks[k].chain == h.last_blocks[k].chain)
                    ++k;
                if (k > 0) in_stream = std::max<uint64_t>(in_stream, (uint64_t)st.blocks[k - 1].end);
            }
        const match m = tiers.cache->peek(h.last_blocks, ws);
        if (in_stream > 0 && in_stream >= (uint64_t)m.n_tokens) {
            w.held_in = "stream";
            w.n_held_tokens = in_stream;
        } else if (m.n_blocks > 0 && m.holder >= 0) {
            w.held_in = m.holder >= k_first_pool_holder ? "pool" : "stream";
            w.n_held_tokens = (uint64_t)m.n_tokens;
        } else {
            w.held_in = tiers.disk && tiers.disk->newest_profile(ws) ? "disk" : "none";
        }
    }
}

}  // namespace warmctx
