// What a context_engine remembers per workspace and the calls on a workspace as a whole:
// its last turn (for explain) and the bounds on what is remembered, pins, snapshots,
// suspend and resume, branches, forgetting; and the counters.
#include "warmctx/context_engine.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <optional>

#include "context_engine_impl.h"
#include "warmctx/hash.h"
#include "warmctx/volatility.h"

namespace warmctx {

void context_engine::impl::remember(const std::string & ws, const pending_turn & t) {
    auto & h = workspaces[ws];
    n_remembered_tokens -= h.last_tokens.size();
    h.last_manifest = t.prompt.prompt_manifest;
    h.last_profile = prof;
    h.last_tokens = t.prompt.tokens;
    h.last_blocks = t.prompt.blocks;
    h.last_stable_end = t.prompt.stable_end;
    h.has_turn = true;
    h.t_last_used = t.tick;
    n_remembered_tokens += h.last_tokens.size();
    while (workspaces.size() > 1 &&
           (workspaces.size() > opts.max_workspaces || n_remembered_tokens > opts.max_remembered_tokens)) {
        auto oldest = workspaces.end();
        for (auto it = workspaces.begin(); it != workspaces.end(); ++it)
            if (it->first != ws && (oldest == workspaces.end() || it->second.t_last_used < oldest->second.t_last_used))
                oldest = it;
        if (oldest == workspaces.end()) break;
        forget(std::string(oldest->first));  // a copy: forget erases the entry whose key this is
    }
}

void context_engine::impl::forget(const std::string & ws) {
    if (auto it = workspaces.find(ws); it != workspaces.end()) {
        n_remembered_tokens -= it->second.last_tokens.size();
        workspaces.erase(it);
    }
    save_volatility();  // its file keeps what memory lets go of
    std::lock_guard lock(volatility_mu);
    volatility.erase(ws);
    vol_looked_up.erase(ws);
    ctr.workspaces.erase(ws);
}

volatility_state * context_engine::impl::volatility_of(const std::string & ws,
                                                       std::unique_lock<std::mutex> & lock) const {
    if (auto it = volatility.find(ws); it != volatility.end()) return &it->second;
    if (!vol_store || vol_looked_up.count(ws)) return nullptr;
    if (vol_looked_up.size() >= k_max_looked_up) vol_looked_up.clear();
    vol_looked_up.insert(ws);
    lock.unlock();
    std::optional<volatility_state> st = vol_store->read(ws);
    lock.lock();
    if (auto it = volatility.find(ws); it != volatility.end()) return &it->second;  // learned meanwhile
    if (!st) return nullptr;
    return &(volatility[ws] = std::move(*st));
}

void context_engine::impl::save_volatility() {
    if (!vol_store) return;
    std::lock_guard lock(volatility_mu);
    for (const std::string & ws : vol_dirty)
        if (auto it = volatility.find(ws); it != volatility.end()) vol_store->put(ws, it->second);
    vol_dirty.clear();
}

status context_engine::pin_workspace(const std::string & workspace, bool pinned) {
    p_->flush_deferred();
    const workspace_history * ws = p_->history(workspace);
    if (!ws) return not_found("workspace '" + workspace + "' has no turn yet");
    p_->write_back_sharing(ws->last_blocks, -1);  // pins hold what the pool has
    std::vector<block> stable;
    for (const auto & b : ws->last_blocks)
        if (b.end <= ws->last_stable_end) stable.push_back(b);
    if (pinned) p_->cache->pin(stable); else p_->cache->unpin(stable);
    return {};
}

void context_engine::drop_workspace(const std::string & workspace) {
    p_->flush_deferred();
    p_->cache->drop_workspace(workspace, ++p_->turn_clock);
    for (size_t s = 0; s < p_->streams.size(); ++s)
        if (!p_->streams[s].busy && p_->streams[s].workspace == workspace) p_->clear_stream((seq_id)s);
    p_->forget(workspace);
    if (p_->vol_store) p_->vol_store->remove(workspace);  // what it learned goes too
}

size_t context_engine::n_remembered_workspaces() const { return p_->workspaces.size(); }

status context_engine::snapshot_workspace(const std::string & workspace) {
    p_->flush_deferred();
    snapshot_store * disk = p_->tiers->disk();
    if (!disk) return failed_precondition("no disk tier (start with a cache directory)");
    const workspace_history * ws = p_->history(workspace);
    if (!ws) return not_found("workspace '" + workspace + "' has no turn yet");
    p_->write_back_sharing(ws->last_blocks, -1);
    // The pool's copy, or (the budget kept none) a work stream's blocks.
    match m = p_->best_match(p_->cache->peek(ws->last_blocks, workspace), ws->last_blocks, -1);
    if (m.n_blocks == 0) {
        // Not resident: fine if the disk already holds its prefix.
        if (disk->lookup(ws->last_blocks).n_blocks > 0) return {};
        return not_found("workspace '" + workspace + "' has nothing cached to snapshot");
    }
    engine & e = *p_->eng;
    std::vector<block> path(ws->last_blocks.begin(), ws->last_blocks.begin() + (long)m.n_blocks);
    if (disk->lookup(path).n_blocks >= path.size()) return {};
    const bool from_stream = m.holder >= 0 && (uint32_t)m.holder < p_->opts.n_work_seqs;
    if (!from_stream && !p_->pool->state(m.holder))
        return internal_error("snapshot: the cache's holder has no state in the pool");
    // The pool's bytes and a stream's are in this context's own layout, a file's in the
    // stream-independent one; and the holder may hold more than this workspace's path
    // (another workspace's longer path through the same blocks): cut the copy.
    result<std::vector<uint8_t>> kv = from_stream ? e.save_seq(m.holder) : e.portable_state(*p_->pool->state(m.holder));
    if (!kv.ok()) return kv.error();
    WARMCTX_RETURN_IF_ERROR(e.truncate_state(*kv, path.back().end));
    return p_->tiers->put_disk(
        make_snapshot(p_->prof, workspace, ws->last_manifest, std::move(path), ws->last_tokens, std::move(kv.value())));
}

status context_engine::suspend_workspace(const std::string & workspace) {
    p_->flush_deferred();
    WARMCTX_RETURN_IF_ERROR(snapshot_workspace(workspace));
    p_->cache->drop_workspace(workspace, ++p_->turn_clock);
    for (size_t s = 0; s < p_->streams.size(); ++s)
        if (!p_->streams[s].busy && p_->streams[s].workspace == workspace) p_->clear_stream((seq_id)s);
    return {};
}

status context_engine::resume_workspace(const std::string & workspace) {
    p_->flush_deferred();
    const workspace_history * ws = p_->history(workspace);
    if (!ws) return not_found("workspace '" + workspace + "' has no turn yet");
    if (p_->best_match(p_->cache->peek(ws->last_blocks, workspace), ws->last_blocks, -1).n_blocks > 0)
        return {};  // already resident
    // The file's state, made raw and cut in RAM, becomes a holder of the pool: no KV
    // stream is involved.
    assembled_prompt prompt;
    prompt.tokens = ws->last_tokens;
    prompt.blocks = ws->last_blocks;
    auto [h, snap] = p_->tiers->fetch(p_->prof, prompt, 0);
    if (!snap) return not_found("no tier holds a prefix of workspace '" + workspace + "'");
    auto raw = p_->eng->raw_state(snap->kv, 0);
    status st = raw.ok() ? p_->eng->truncate_state(*raw, h.at.n_tokens) : raw.error();
    if (!st.ok()) return st.with_context("resume '" + workspace + "'");
    std::vector<block> path(ws->last_blocks.begin(), ws->last_blocks.begin() + (long)h.at.n_blocks);
    p_->pool->stage(std::move(raw.value()), h.at.n_tokens);
    st = p_->cache->insert(workspace, path, p_->pool->staging(), ++p_->turn_clock);
    p_->pool->clear_seq(p_->pool->staging());
    if (st.ok()) p_->tiers->count_restore(h.at.n_tokens);
    return st;
}

status context_engine::branch_workspace(const std::string & from, const std::string & to) {
    p_->flush_deferred();
    if (from == to) return invalid_argument("branch: the new workspace must differ from the source");
    auto it = p_->workspaces.find(from);
    if (it == p_->workspaces.end()) return not_found("workspace '" + from + "' has no turn yet");
    if (p_->workspaces.count(to)) return failed_precondition("workspace '" + to + "' already exists");
    workspace_history h = it->second;  // same manifest and prefix; the cache shares by content
    p_->n_remembered_tokens += h.last_tokens.size();
    p_->workspaces[to] = std::move(h);
    std::lock_guard lock(p_->volatility_mu);
    if (auto v = p_->volatility.find(from); v != p_->volatility.end()) p_->volatility[to] = v->second;
    return {};
}

void context_engine::drop_engine_cache() {
    p_->flush_deferred();
    p_->cache->clear();
    for (size_t s = 0; s < p_->streams.size(); ++s)
        if (!p_->streams[s].busy) p_->clear_stream((seq_id)s);
    p_->tiers->forget_recent_loads();
}

context_counters context_engine::counters() const {
    context_counters c = p_->ctr;
    c.cache = p_->cache->counters();
    c.tiers = p_->tiers->counters();
    kv_memory & m = c.memory;
    const context_info & ci = p_->eng->context();
    const uint64_t bpt = ci.kv_bytes_per_token;
    m.streams_allocated_bytes = ci.kv_streams_bytes;
    m.n_padded_decodes = p_->eng->padded_decodes();
    for (uint32_t s = 0; s < ci.n_seq_max; ++s)
        m.streams_used_bytes += (uint64_t)p_->eng->seq_n_tokens((seq_id)s) * bpt;
    const kv_pool_counters pc = p_->pool->counters();
    m.pool_bytes = pc.used_bytes;
    m.pool_allocated_bytes = pc.allocated_bytes;
    m.pool_entries = pc.n_entries;
    m.memory_kind = std::string(memory_kind_name(ci.memory.kind));
    m.reuse_across_turns = ci.memory.reuse;
    m.checkpoint_bytes = p_->eng->checkpoint_bytes_held();
    m.checkpoint_size_bytes = ci.memory.checkpoints ? ci.memory.checkpoint_bytes : 0;
    m.checkpoint_max_bytes = p_->opts.stream_checkpoint_max_bytes;
    m.n_checkpoints_taken = p_->eng->checkpoints_taken();
    m.checkpoint_ms = p_->eng->checkpoint_ms();
    m.allocated_bytes = m.streams_allocated_bytes + m.pool_allocated_bytes + m.checkpoint_bytes;
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
    for (const auto & [ws, h] : workspaces)
        if (h.has_turn) recent.emplace_back(h.t_last_used, &ws);
    const size_t n = std::min<size_t>(recent.size(), 64);
    std::partial_sort(recent.begin(), recent.begin() + (long)n, recent.end(),
                      [](const auto & a, const auto & b) { return a.first > b.first; });
    for (size_t i = 0; i < n; ++i) {
        const std::string & ws = *recent[i].second;
        const workspace_history & h = workspaces.at(ws);
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
        const match m = cache->peek(h.last_blocks, ws);
        if (in_stream > 0 && in_stream >= (uint64_t)m.n_tokens) {
            w.held_in = "stream";
            w.n_held_tokens = in_stream;
        } else if (m.n_blocks > 0 && m.holder >= 0) {
            w.held_in = m.holder >= k_first_pool_holder ? "pool" : "stream";
            w.n_held_tokens = (uint64_t)m.n_tokens;
        } else {
            w.held_in = tiers && tiers->newest_profile(ws) ? "disk" : "none";
        }
    }
}

}  // namespace warmctx
