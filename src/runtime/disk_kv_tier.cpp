#include "disk_kv_tier.h"

#include <chrono>
#include <algorithm>
#include <cstdio>
#include <string>

namespace warmctx {

snapshot make_snapshot(const profile & prof, const std::string & workspace, const manifest & prompt_manifest,
                       std::vector<block> path, std::span<const token_id> prompt_tokens, std::vector<uint8_t> kv) {
    snapshot snap;
    snap.meta.prof = prof;
    snap.meta.profile_fingerprint = prof.fingerprint();
    snap.meta.workspace = workspace;
    snap.meta.prompt_manifest = prompt_manifest;
    const pos_t end = path.empty() ? 0 : path.back().end;
    snap.meta.blocks = std::move(path);
    snap.tokens.assign(prompt_tokens.begin(), prompt_tokens.begin() + end);
    snap.kv = std::move(kv);
    return snap;
}

result<std::unique_ptr<disk_kv_tier>> disk_kv_tier::open(const tier_options & opts, eviction_policy policy,
                                                  pos_t max_file_tokens, write_queue_options wq,
                                                  std::function<uint64_t(const snapshot_meta &)> max_kv_bytes) {
    std::unique_ptr<disk_kv_tier> t(new disk_kv_tier());
    t->opts_ = opts;
    t->wq_opts_ = std::move(wq);
    t->max_file_tokens_ = max_file_tokens;
    if (!opts.cache_dir.empty()) {
        snapshot_store_options so;
        so.dir = opts.cache_dir;
        so.fs = opts.disk_fs;
        so.budget_bytes = opts.disk_budget_bytes;
        so.policy = policy;
        so.shared = opts.shared_dir;
        so.max_kv_bytes = std::move(max_kv_bytes);
        disk_kv_tier * self = t.get();
        so.on_rejection_deferred = [self] {
            {
                std::lock_guard lk(self->mu_);
                self->settle_ = true;
            }
            self->cv_work_.notify_all();
        };
        auto d = snapshot_store::open(so);  // indexes the directory (headers only, no KV)
        if (!d.ok()) return d.error().with_context("disk tier '" + opts.cache_dir + "'");
        t->disk_ = std::move(d.value());
        t->writer_ = std::thread([p = t.get()] { p->writer_loop(); });
    }
    return t;
}

disk_kv_tier::~disk_kv_tier() {
    if (!writer_.joinable()) return;
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_work_.notify_all();
    if (wq_opts_.on_destroy) wq_opts_.on_destroy();
    writer_.join();  // the writer empties the queue before it returns
}

void disk_kv_tier::writer_loop() {
    std::unique_lock lk(mu_);
    for (;;) {
        cv_work_.wait(lk, [&] { return stop_ || settle_ || !queue_.empty(); });
        if (settle_) {  // damaged files first: each is one rename and one directory sync
            settle_ = false;
            settling_ = true;
            lk.unlock();
            disk_->settle_rejections();
            lk.lock();
            settling_ = false;
            if (queue_.empty() && !settle_) cv_idle_.notify_all();
            continue;
        }
        if (queue_.empty()) return;  // stopping, and every queued write is done
        // The front stays queued (lookups see it) until its file is in the store's
        // index: a lookup that misses it in the queue afterwards finds the file.
        std::shared_ptr<const snapshot> snap = queue_.front().snap;
        lk.unlock();
        auto put = disk_->put(*snap);
        lk.lock();
        if (put.ok()) n_writes_disk_++;
        else write_failed_locked(put.error());
        queued_bytes_ -= queue_.front().bytes;
        queue_.pop_front();
        if (queue_.empty() && !settle_) cv_idle_.notify_all();
    }
}

void disk_kv_tier::flush() {
    std::unique_lock lk(mu_);
    cv_idle_.wait(lk, [&] { return queue_.empty() && !settle_ && !settling_; });
}

disk_kv_tier::hit disk_kv_tier::find(const assembled_prompt & prompt, pos_t better_than, bool counted) const {
    hit h;
    if (!disk_) return h;
    // The queue first, then the store: a write leaves the queue only once its file is
    // indexed, so a prefix missed in the queue is found in the store.
    {
        std::lock_guard lk(mu_);
        for (const queued_write & q : queue_) {
            const pos_t n_file = (pos_t)q.snap->tokens.size();
            if (max_file_tokens_ > 0 && n_file > max_file_tokens_) continue;
            size_t n = prompt.blocks.size();
            while (n > h.file.n_blocks && !q.chains.count(prompt.blocks[n - 1].chain)) --n;
            if (n <= h.file.n_blocks) continue;
            h.file.key = {q.snap->meta.blocks.back().chain, q.snap->meta.workspace};
            h.file.n_blocks = n;
            h.file.n_tokens = prompt.blocks[n - 1].end;
            h.file.file_n_tokens = n_file;
            h.queued = q.snap;
        }
    }
    snapshot_match file =
        counted ? disk_->lookup(prompt.blocks, max_file_tokens_) : disk_->peek(prompt.blocks, max_file_tokens_);
    if (file.n_blocks > h.file.n_blocks) {  // on a tie the queued bytes win: no file read
        h.file = file;
        h.queued.reset();
    }
    h.at = snap_reuse(prompt, h.file.n_blocks);
    if (h.at.n_tokens > better_than) h.tier = kv_tier::disk;
    return h;
}

disk_kv_tier::hit disk_kv_tier::peek(const assembled_prompt & prompt, pos_t better_than) const {
    return find(prompt, better_than, false);
}

std::optional<profile> disk_kv_tier::newest_profile(const std::string & workspace) const {
    if (!disk_) return std::nullopt;
    {
        std::lock_guard lk(mu_);  // a queued snapshot is newer than any file
        for (auto it = queue_.rbegin(); it != queue_.rend(); ++it)
            if (it->snap->meta.workspace == workspace) return it->snap->meta.prof;
    }
    auto newest = disk_->newest_of(workspace);
    if (!newest) return std::nullopt;
    return newest->meta.prof;
}

std::pair<disk_kv_tier::hit, std::shared_ptr<const snapshot>> disk_kv_tier::fetch(const profile & prof,
                                                                           const assembled_prompt & prompt,
                                                                           pos_t better_than) {
    hit h = find(prompt, better_than, true);
    if (h.tier == kv_tier::none) return {};
    if (h.queued) {
        // Not on disk yet: the queued bytes, checked against the profile as a load is.
        if (status st = check_snapshot_profile(h.queued->meta, prof); !st.ok()) {
            ctr_.n_restore_failures++;
            hit miss;
            miss.failed = "a queued write of this prefix: " + st.message();
            return {miss, nullptr};
        }
        {
            std::lock_guard lk(mu_);
            qstats_.n_restores_from_queue++;
        }
        std::shared_ptr<const snapshot> snap = h.queued;
        return {h, std::move(snap)};
    }
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
        if (!loaded.ok()) {
            // A file removed behind the index (another replica evicted it) failed no check:
            // the store counts it (warmctx_disk_files_gone_total); the turn prefills.
            if (loaded.error().code() != status_code::not_found) ctr_.n_restore_failures++;
            hit miss;
            miss.failed = "the snapshot " + key + " on disk: " + loaded.error().message();
            return {miss, nullptr};
        }
        snap = *loaded;
        if (recent_loads_.size() >= k_recent_loads) recent_loads_.pop_front();  // the oldest
        recent_loads_.emplace_back(key, snap);
    }
    return {h, std::move(snap)};
}

disk_kv_tier::hit disk_kv_tier::restore(engine & e, const profile & prof, const assembled_prompt & prompt,
                                        pos_t better_than, seq_id seq) {
    auto [h, snap] = fetch(prof, prompt, better_than);
    if (!snap) return h;  // a miss, or a candidate that failed (h.failed says why)
    e.clear_seq(seq);
    status st = e.load_seq(seq, snap->kv);
    if (st.ok()) st = e.trim_seq(seq, h.at.n_tokens);
    if (!st.ok()) {
        e.clear_seq(seq);
        ctr_.n_restore_failures++;
        hit miss;
        miss.failed = "the snapshot " + h.file.key.file_name() + " did not load into the stream: " + st.message();
        return miss;
    }
    count_restore(h.at.n_tokens);
    return h;
}

bool disk_kv_tier::holds(std::span<const block> path) {
    if (path.empty()) return true;
    {
        // Queue first, then the store (see find).
        std::lock_guard lk(mu_);
        for (const queued_write & q : queue_)
            if (q.chains.count(path.back().chain)) {
                qstats_.n_held_by_queue++;
                return true;
            }
    }
    return disk_->lookup(path, max_file_tokens_).n_blocks >= path.size();
}

disk_kv_tier::queue_outcome disk_kv_tier::enqueue(snapshot snap) {
    queued_write q;
    q.bytes = (uint64_t)snap.kv.size() + (uint64_t)snap.tokens.size() * sizeof(token_id);
    for (const block & b : snap.meta.blocks) q.chains.insert(b.chain);
    q.snap = std::make_shared<const snapshot>(std::move(snap));
    {
        std::lock_guard lk(mu_);
        if (!queue_.empty() && queued_bytes_ + q.bytes > wq_opts_.max_bytes) {
            qstats_.n_dropped++;
            write_failed_locked(resource_exhausted(
                "write-through dropped: the write queue holds " + std::to_string(queued_bytes_) + " bytes in " +
                std::to_string(queue_.size()) + " writes, and " + std::to_string(q.bytes) + " more would pass its " +
                std::to_string(wq_opts_.max_bytes) + "-byte bound (the disk is slower than the turns)"));
            return queue_outcome::dropped;
        }
        queued_bytes_ += q.bytes;
        qstats_.n_queued++;
        queue_.push_back(std::move(q));
    }
    cv_work_.notify_one();
    return queue_outcome::queued;
}

disk_kv_tier::queue_outcome disk_kv_tier::queue_write(snapshot snap) {
    if (!disk_) return queue_outcome::no_disk;
    if (holds(snap.meta.blocks)) return queue_outcome::held;
    return enqueue(std::move(snap));
}

size_t disk_kv_tier::n_saved_blocks(const assembled_prompt & prompt, size_t n_blocks_held) const {
    if (!disk_) return 0;
    size_t k = 0;
    const size_t n = std::min(n_blocks_held, prompt.blocks.size());
    while (k < n && prompt.blocks[k].retention != retention_class::none &&
           prompt.blocks[k].retention >= opts_.disk_min_class)
        ++k;
    return k;
}

void disk_kv_tier::write_through(engine & e, const profile & prof, seq_id seq, const std::string & workspace,
                             const assembled_prompt & prompt, size_t n_blocks_held) {
    // The leading run of cacheable blocks of at least the tier's class, of those the
    // sequence holds (a pre-warm stopped early holds fewer than the prompt has).
    size_t k = n_saved_blocks(prompt, n_blocks_held);
    // Up to a block end the state can be cut at (one a prefill kept a checkpoint at).
    while (k > 0 && !e.can_trim(seq, prompt.blocks[k - 1].end)) --k;
    if (k == 0 || e.seq_n_tokens(seq) < prompt.blocks[k - 1].end) return;
    std::vector<block> path(prompt.blocks.begin(), prompt.blocks.begin() + (long)k);
    if (holds(path)) return;  // on disk or queued already
    // The copy out of the engine stays on this thread: the stream is reused next. On a
    // GPU it goes through page-locked memory (engine::save_seq).
    const auto t0 = std::chrono::steady_clock::now();
    auto kv = e.save_seq(seq);
    ctr_.n_disk_copies_out++;
    ctr_.disk_copy_out_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!kv.ok()) return write_failed(kv.error());
    if (e.seq_n_tokens(seq) > path.back().end) {
        // The sequence holds more (it stays as it is, for in-place reuse): cut the copy.
        status st = e.truncate_state(*kv, path.back().end);
        if (!st.ok()) return write_failed(st);
    }
    // The file is the writer thread's.
    enqueue(
        make_snapshot(prof, workspace, prompt.prompt_manifest, std::move(path), prompt.tokens, std::move(kv.value())));
}

void disk_kv_tier::write_failed_locked(const status & why) {
    n_write_failures_disk_++;
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

status disk_kv_tier::put_disk(const snapshot & snap) {
    if (!disk_) return failed_precondition("no disk tier (start with a cache directory)");
    flush();  // after the write-throughs queued before: the newest bytes of a key land last
    auto put = disk_->put(snap);
    if (!put.ok()) return put.error();
    std::lock_guard lk(mu_);
    n_writes_disk_++;
    return {};
}

tier_counters disk_kv_tier::counters() const {
    tier_counters c = ctr_;
    {
        std::lock_guard lk(mu_);
        c.n_writes_disk = n_writes_disk_;
        c.n_write_failures_disk = n_write_failures_disk_;
        c.disk_write_queue_writes = queue_.size();
        c.disk_write_queue_bytes = queued_bytes_;
        c.n_write_drops_disk = qstats_.n_dropped;
    }
    if (disk_) {
        auto st = disk_->stats();
        c.disk_bytes = st.n_bytes;
        c.disk_files = st.n_files;
        c.disk_quarantine_files = st.quarantine_files;
        c.disk_quarantine_bytes = st.quarantine_bytes;
        for (uint64_t n : st.evictions_by_class) c.n_evicted_files_disk += n;
        if (auto it = st.load_misses_by_reason.find("not_found"); it != st.load_misses_by_reason.end())
            c.n_gone_files_disk = it->second;
    }
    return c;
}

write_queue_stats disk_kv_tier::queue_stats() const {
    std::lock_guard lk(mu_);
    write_queue_stats q = qstats_;
    q.queued_writes = queue_.size();
    q.queued_bytes = queued_bytes_;
    return q;
}

}  // namespace warmctx
