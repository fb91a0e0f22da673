#include "tiers.h"

#include <algorithm>
#include <cstdio>

namespace warmctx {

snapshot make_snapshot(const profile & prof, const std::string & workspace, const manifest & man,
                       std::vector<block> path, std::span<const token_id> prompt_tokens, std::vector<uint8_t> kv) {
    snapshot snap;
    snap.meta.prof = prof;
    snap.meta.profile_fingerprint = prof.fingerprint();
    snap.meta.workspace = workspace;
    snap.meta.man = man;
    const pos_t end = path.empty() ? 0 : path.back().end;
    snap.meta.blocks = std::move(path);
    snap.tokens.assign(prompt_tokens.begin(), prompt_tokens.begin() + end);
    snap.kv = std::move(kv);
    return snap;
}

result<std::unique_ptr<tier_set>> tier_set::open(const tier_options & opts, eviction_policy policy,
                                                  pos_t max_file_tokens) {
    std::unique_ptr<tier_set> t(new tier_set());
    t->opts_ = opts;
    t->max_file_tokens_ = max_file_tokens;
    if (!opts.cache_dir.empty()) {
        snapshot_store_options so;
        so.dir = opts.cache_dir;
        so.fs = opts.disk_fs;
        so.budget_bytes = opts.disk_budget_bytes;
        so.policy = policy;
        auto d = snapshot_store::open(so);  // indexes the directory (headers only, no KV)
        if (!d.ok()) return d.error().with_context("disk tier '" + opts.cache_dir + "'");
        t->disk_ = std::move(d.value());
    }
    return t;
}

tier_set::hit tier_set::find(const assembled_prompt & ap, pos_t better_than, bool counted) const {
    hit h;
    if (!disk_) return h;
    h.file = counted ? disk_->lookup(ap.blocks, max_file_tokens_) : disk_->peek(ap.blocks, max_file_tokens_);
    h.at = snap_reuse(ap, h.file.n_blocks);
    if (h.at.n_tokens > better_than) h.tier = kv_tier::disk;
    return h;
}

tier_set::hit tier_set::peek(const assembled_prompt & ap, pos_t better_than) const { return find(ap, better_than, false); }

std::optional<profile> tier_set::newest_profile(const std::string & workspace) const {
    if (!disk_) return std::nullopt;
    auto newest = disk_->newest_of(workspace);
    if (!newest) return std::nullopt;
    return newest->meta.prof;
}

std::pair<tier_set::hit, std::shared_ptr<const snapshot>> tier_set::fetch(const profile & prof,
                                                                           const assembled_prompt & ap,
                                                                           pos_t better_than) {
    hit h = find(ap, better_than, true);
    if (h.tier == kv_tier::none) return {};
    // Requests admitted while an earlier restore of the same file is still being
    // decoded share its bytes instead of reading the file again.
    std::shared_ptr<const snapshot> snap;
    const std::string key = h.file.key.file_name();
    auto it = std::find_if(recent_loads_.begin(), recent_loads_.end(), [&](const auto & r) { return r.first == key; });
    if (it != recent_loads_.end()) {
        snap = it->second;
        ctr_.n_shared_restores++;
    } else {
        auto loaded = disk_->load(h.file.key, &prof);
        if (!loaded.ok()) { ctr_.n_restore_failures++; return {}; }
        snap = *loaded;
        if (recent_loads_.size() >= k_recent_loads) recent_loads_.pop_front();  // the oldest
        recent_loads_.emplace_back(key, snap);
    }
    return {h, std::move(snap)};
}

tier_set::hit tier_set::restore(engine & e, const profile & prof, const assembled_prompt & ap, pos_t better_than,
                                seq_id seq) {
    auto [h, snap] = fetch(prof, ap, better_than);
    if (!snap) return {};
    e.clear_seq(seq);
    status st = e.load_seq(seq, snap->kv);
    if (st.ok()) st = e.trim_seq(seq, h.at.n_tokens);
    if (!st.ok()) { e.clear_seq(seq); ctr_.n_restore_failures++; return {}; }
    count_restore(h.at.n_tokens);
    return h;
}

void tier_set::write_through(engine & e, const profile & prof, seq_id seq, const std::string & workspace,
                             const assembled_prompt & ap, size_t n_blocks_held) {
    if (!disk_) return;
    // The leading run of cacheable blocks of at least the tier's class, of those the
    // sequence holds (a pre-warm stopped early holds fewer than the prompt has).
    size_t k = 0;
    const size_t n = std::min(n_blocks_held, ap.blocks.size());
    while (k < n && ap.blocks[k].cls != retention_class::none && ap.blocks[k].cls >= opts_.disk_min_class) ++k;
    if (k == 0 || e.seq_n_tokens(seq) < ap.blocks[k - 1].end) return;
    std::vector<block> path(ap.blocks.begin(), ap.blocks.begin() + (long)k);
    if (disk_->lookup(path, max_file_tokens_).n_blocks >= k) return;  // held already
    auto kv = e.save_seq(seq);
    if (!kv.ok()) return write_failed(kv.error());
    if (e.seq_n_tokens(seq) > path.back().end) {
        // The sequence holds more (it stays as it is, for in-place reuse): cut the copy.
        status st = truncate_seq_state(*kv, path.back().end);
        if (!st.ok()) return write_failed(st);
    }
    auto put = disk_->put(make_snapshot(prof, workspace, ap.man, std::move(path), ap.tokens, std::move(kv.value())));
    if (!put.ok()) return write_failed(put.error());
    ctr_.n_writes_disk++;
}

void tier_set::write_failed(const status & why) {
    ctr_.n_write_failures_disk++;
    n_unreported_failures_++;
    const auto now = std::chrono::steady_clock::now();
    if (t_last_warning_ != std::chrono::steady_clock::time_point{} && now - t_last_warning_ < std::chrono::seconds(10))
        return;
    std::fprintf(stderr, "warmctx: disk tier: a write failed (%llu since the last report): %s\n",
                 (unsigned long long)n_unreported_failures_, why.to_string().c_str());
    std::fflush(stderr);
    t_last_warning_ = now;
    n_unreported_failures_ = 0;
}

status tier_set::put_disk(const snapshot & snap) {
    if (!disk_) return failed_precondition("no disk tier (start with a cache directory)");
    auto put = disk_->put(snap);
    if (!put.ok()) return put.error();
    ctr_.n_writes_disk++;
    return {};
}

tier_counters tier_set::counters() const {
    tier_counters c = ctr_;
    if (disk_) {
        auto st = disk_->stats();
        c.disk_bytes = st.n_bytes;
        c.disk_files = st.n_files;
        c.disk_quarantine_files = st.quarantine_files;
        c.disk_quarantine_bytes = st.quarantine_bytes;
    }
    return c;
}

}  // namespace warmctx
