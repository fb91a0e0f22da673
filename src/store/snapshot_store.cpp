// The disk tier: a directory of snapshot files, indexed by chain hash (see the header).
#include "snapshot_store_impl.h"

#include "durable_file.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <set>
#include <tuple>

namespace warmctx {

namespace sf = snapshot_format;

namespace {

// At most this many rejected files are remembered (the oldest are forgotten first).
constexpr size_t k_max_rejected_records = 1024;

}  // namespace

// One load in progress: the first caller reads, later callers wait on `result`.
struct snapshot_store::impl::inflight {
    std::shared_future<result<std::shared_ptr<const snapshot>>> value;
    snapshot_defect defect = snapshot_defect::none;  // set by the reader before the result
};

snapshot_store::impl::impl(snapshot_store_options opts)
    : opts_(std::move(opts)), fs_(opts_.fs ? *opts_.fs : posix_fs()) {
    while (opts_.dir.size() > 1 && opts_.dir.back() == '/') opts_.dir.pop_back();
    quarantine_dir_ = opts_.dir + "/quarantine";
    stats_.budget_bytes = opts_.budget_bytes;
}

uint64_t snapshot_store::impl::now_ms() const {
    if (opts_.clock_ms) return opts_.clock_ms();
    return (uint64_t)std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string snapshot_store::impl::path_of(const std::string & file_name) const { return opts_.dir + "/" + file_name; }

// ---- index ------------------------------------------------------------------------------

void snapshot_store::impl::index_add(entry_state st) {
    const std::string name = st.e.file_name;
    for (size_t i = 0; i < st.e.meta.blocks.size(); ++i) by_chain_[st.e.meta.blocks[i].chain].emplace_back(name, i);
    stats_.n_bytes += st.e.file_bytes;
    entries_[name] = std::move(st);
}

void snapshot_store::impl::index_remove(const std::string & file_name) {
    auto it = entries_.find(file_name);
    if (it == entries_.end()) return;
    for (const block & b : it->second.e.meta.blocks) {
        auto c = by_chain_.find(b.chain);
        if (c == by_chain_.end()) continue;
        auto & refs = c->second;
        refs.erase(std::remove_if(refs.begin(), refs.end(), [&](const auto & r) { return r.first == file_name; }),
                   refs.end());
        if (refs.empty()) by_chain_.erase(c);
    }
    stats_.n_bytes -= it->second.e.file_bytes;
    entries_.erase(it);
}

// ---- rejecting bad files ------------------------------------------------------------------

void snapshot_store::impl::reject(const std::string & file_name, snapshot_defect d, const std::string & reason,
                            bool in_index, uint64_t generation) {
    rejected_file rf;
    rf.file_name = file_name;
    rf.defect = d;
    rf.reason = reason;
    bool move = !opts_.scan_only;
    if (in_index) {
        std::lock_guard lock(mu_);
        auto it = entries_.find(file_name);
        // A put replaced the file while it was being read: what failed is gone already.
        if (it == entries_.end() || it->second.generation != generation) move = false;
        else index_remove(file_name);
    }
    if (move && d != snapshot_defect::none) {
        const std::string path = path_of(file_name);
        if (opts_.quarantine) {
            const std::string line = std::string(snapshot_defect_name(d)) + "\t" + reason + "\n";
            if (quarantine_file(fs_, path, quarantine_dir_, file_name, line)) {
                rf.quarantined = true;
                auto bytes = fs_.file_size(quarantine_dir_ + "/" + file_name);
                std::lock_guard lock(mu_);
                quarantined_.emplace_back(file_name, (bytes.ok() ? *bytes : 0) + line.size());
                stats_.quarantine_bytes += quarantined_.back().second;
            }
        }
        if (!rf.quarantined && fs_.remove_file(path).ok()) rf.removed = true;
        (void)fs_.sync_dir(opts_.dir);
    }
    {
        std::lock_guard lock(mu_);
        if (rf.quarantined) ++stats_.n_quarantined;
        if (rf.removed) ++stats_.n_bad_removed;
        if (rejected_.size() >= k_max_rejected_records) rejected_.erase(rejected_.begin());
        rejected_.push_back(std::move(rf));
    }
    prune_quarantine(opts_.quarantine_max_files);
}

void snapshot_store::impl::prune_quarantine(size_t max_files) {
    if (opts_.scan_only) return;
    std::vector<std::string> doomed;
    {
        std::lock_guard lock(mu_);
        while (!quarantined_.empty() &&
               (quarantined_.size() > max_files ||
                (opts_.budget_bytes > 0 && stats_.n_bytes + stats_.quarantine_bytes > opts_.budget_bytes))) {
            doomed.push_back(quarantined_.front().first);
            stats_.quarantine_bytes -= quarantined_.front().second;
            ++stats_.n_quarantine_pruned;
            quarantined_.pop_front();
        }
    }
    for (const std::string & name : doomed) {
        (void)fs_.remove_file(quarantine_dir_ + "/" + name);
        (void)fs_.remove_file(quarantine_dir_ + "/" + name + ".reason");
    }
    if (!doomed.empty()) (void)fs_.sync_dir(quarantine_dir_);
}

// ---- budget -------------------------------------------------------------------------------

std::string snapshot_store::impl::pick_victim_locked(const std::function<bool(const entry_state &)> & in_scope,
                                               const std::string & keep) const {
    const entry_state * best = nullptr;
    auto order = [&](const entry_state & s) {
        int retention = opts_.policy == eviction_policy::semantic ? (int)s.e.meta.last_class() : 0;
        return std::tuple<int, uint64_t, const std::string &>(retention, s.e.t_last_used_ms, s.e.file_name);
    };
    for (const auto & [name, s] : entries_) {
        if (!in_scope(s) || s.e.pinned || name == keep || inflight_.count(name)) continue;
        if (!best || order(s) < order(*best)) best = &s;
    }
    return best ? best->e.file_name : std::string();
}

void snapshot_store::impl::evict_locked(const std::string & name, std::vector<std::string> & victims) {
    const entry_state & s = entries_.at(name);
    ++stats_.evictions_by_class[(size_t)s.e.meta.last_class()];
    stats_.n_evicted_bytes += s.e.file_bytes;
    victims.push_back(name);
    index_remove(name);
}

uint64_t snapshot_store::impl::evict_for_space(uint64_t bytes) {
    if (opts_.scan_only || bytes == 0) return 0;
    std::lock_guard commit(commit_mu_);
    uint64_t q_before = 0, freed = 0;
    {
        std::lock_guard lock(mu_);
        q_before = stats_.quarantine_bytes;
    }
    prune_quarantine(0);  // quarantined files first: they serve nobody
    std::vector<std::string> victims;
    {
        std::lock_guard lock(mu_);
        freed = q_before - stats_.quarantine_bytes;
        while (freed < bytes) {
            std::string v = pick_victim_locked([](const entry_state &) { return true; }, {});
            if (v.empty()) break;
            freed += entries_.at(v).e.file_bytes;
            evict_locked(v, victims);
        }
    }
    for (const std::string & v : victims) {
        (void)fs_.remove_file(path_of(v));
        if (opts_.on_evict) opts_.on_evict(v);
    }
    if (!victims.empty()) (void)fs_.sync_dir(opts_.dir);
    return freed;
}

status snapshot_store::impl::enforce_budget(const std::string & keep, const std::string & keep_workspace) {
    if (opts_.scan_only || (opts_.budget_bytes == 0 && opts_.workspace_budget_bytes == 0)) return {};
    prune_quarantine(opts_.quarantine_max_files);  // quarantined files go before any snapshot
    std::vector<std::string> victims;
    bool drop_keep = false;
    uint64_t keep_bytes = 0;
    {
        std::lock_guard lock(mu_);
        auto pick = [&](const std::function<bool(const entry_state &)> & in_scope) {
            return pick_victim_locked(in_scope, keep);
        };
        auto evict = [&](const std::string & name) { evict_locked(name, victims); };
        if (!keep.empty() && entries_.count(keep)) keep_bytes = entries_.at(keep).e.file_bytes;

        // Each workspace within its own budget first (only the put's workspace can have
        // grown on a put; at rescan every workspace is checked).
        if (opts_.workspace_budget_bytes) {
            std::map<std::string, uint64_t> usage;
            for (const auto & [name, s] : entries_) usage[s.e.key.workspace] += s.e.file_bytes;
            for (auto & [ws, bytes] : usage) {
                if (!keep.empty() && ws != keep_workspace) continue;
                while (bytes > opts_.workspace_budget_bytes) {
                    // (an init-capture: clang before 16 cannot capture a structured binding)
                    std::string v = pick([&ws = ws](const entry_state & s) { return s.e.key.workspace == ws; });
                    if (v.empty()) {
                        if (!keep.empty() && ws == keep_workspace && entries_.count(keep)) drop_keep = true;
                        break;
                    }
                    bytes -= entries_.at(v).e.file_bytes;
                    evict(v);
                }
            }
        }
        if (opts_.budget_bytes && !drop_keep) {
            while (stats_.n_bytes + stats_.quarantine_bytes > opts_.budget_bytes) {
                std::string v = pick([](const entry_state &) { return true; });
                if (v.empty()) {
                    if (!keep.empty() && entries_.count(keep)) drop_keep = true;
                    break;
                }
                evict(v);
            }
        }
        if (drop_keep) index_remove(keep);
    }
    for (const std::string & v : victims) {
        (void)fs_.remove_file(path_of(v));  // a failure leaves an unindexed file: the next rescan sees it
        if (opts_.on_evict) opts_.on_evict(v);
    }
    if (drop_keep) (void)fs_.remove_file(path_of(keep));
    if (!victims.empty() || drop_keep) (void)fs_.sync_dir(opts_.dir);
    if (drop_keep)
        return resource_exhausted("snapshot of " + std::to_string(keep_bytes) +
                                  " bytes does not fit the snapshot budget: the rest is pinned or being loaded");
    return {};
}

// ---- put ----------------------------------------------------------------------------------

result<snapshot_entry> snapshot_store::impl::put(const snapshot_meta & meta_in, std::span<const token_id> tokens,
                                           std::span<const uint8_t> kv) {
    auto fail = [&](status st) {
        std::lock_guard lock(mu_);
        ++stats_.n_put_failures;
        return st;
    };
    snapshot_meta meta = meta_in;  // a copy of the metadata only, to stamp the time
    if (meta.created_unix_ms == 0) meta.created_unix_ms = now_ms();
    if (status st = validate_snapshot(meta, tokens, kv); !st.ok()) return fail(st);
    for (uint64_t budget : {opts_.budget_bytes, opts_.workspace_budget_bytes})
        if (budget && kv.size() > budget)
            return fail(resource_exhausted("snapshot of " + std::to_string(kv.size()) +
                                           " KV bytes exceeds the snapshot budget of " + std::to_string(budget) +
                                           " bytes"));

    const std::string final_name = snapshot_file_name(meta.key(), meta.workspace);
    // Unique per process and call: two puts of one key never share a temp file.
    const std::string temp_name = unique_temp_name(final_name);
    // A rescan meanwhile must not take this temp file for a crash's leftover.
    {
        std::lock_guard lock(mu_);
        writing_.insert(temp_name);
    }
    struct unregister {
        impl * self;
        const std::string & name;
        ~unregister() {
            std::lock_guard lock(self->mu_);
            self->writing_.erase(name);
        }
    } unregister_on_return{this, temp_name};
    auto f = durable_file::create(fs_, opts_.dir, final_name, temp_name);
    if (!f) return fail(f.error().with_context("writing snapshot"));
    auto w = write_snapshot(f->out(), meta, tokens, kv);
    if (status st = w.ok() ? f->finish() : w.error(); !st.ok())
        return fail(st.with_context("writing snapshot " + final_name));  // the temp file goes with `f`
    const uint64_t file_bytes = *w;
    for (uint64_t budget : {opts_.budget_bytes, opts_.workspace_budget_bytes})
        if (budget && file_bytes > budget)
            return fail(resource_exhausted("snapshot of " + std::to_string(file_bytes) +
                                           " bytes exceeds the snapshot budget of " + std::to_string(budget) +
                                           " bytes"));

    std::lock_guard commit(commit_mu_);
    // The file is complete and in place once this returns ok; a failed directory sync only
    // means the rename may not survive a crash (the old file or none would then be found).
    status dir_st;
    if (status st = f->commit(&dir_st); !st.ok()) return fail(st.with_context("committing snapshot " + final_name));

    entry_state es;
    es.e.key = {meta.key(), meta.workspace};
    es.e.file_name = final_name;
    es.e.file_bytes = file_bytes;
    es.e.kv_bytes = kv.size();
    es.e.t_last_used_ms = now_ms();
    es.e.meta = std::move(meta);
    if (auto v = fs_.stat_file(path_of(final_name)); v.ok()) es.version = *v;
    {
        std::lock_guard lock(mu_);
        if (auto it = entries_.find(final_name); it != entries_.end()) {
            es.e.pinned = it->second.e.pinned;
            index_remove(final_name);
        }
        es.generation = ++generation_counter_;
        index_add(es);
    }
    // Shared: the budget is the directory's, other processes' files included.
    if (opts_.shared) (void)scan_locked();
    if (status st = enforce_budget(final_name, es.e.key.workspace); !st.ok()) return fail(st);
    if (!dir_st.ok()) return fail(dir_st.with_context("committing snapshot " + final_name));
    std::lock_guard lock(mu_);
    ++stats_.n_puts;
    stats_.n_bytes_written += file_bytes;
    return es.e;
}

// ---- lookup and load ----------------------------------------------------------------------

// The longest prefix of `path` some file holds. REQUIRES mu_ held.
snapshot_match snapshot_store::impl::find_locked(std::span<const hash128> path, pos_t max_file_tokens) const {
    // From the longest prefix down: the first chain hash some file holds at the same
    // block index is the answer (a chain hash names the whole prefix before it).
    for (size_t i = path.size(); i-- > 0;) {
        auto it = by_chain_.find(path[i]);
        if (it == by_chain_.end()) continue;
        const entry_state * best = nullptr;
        for (const auto & [name, index] : it->second) {
            if (index != i) continue;  // only a hash collision could make this differ
            const entry_state & s = entries_.at(name);
            if (max_file_tokens > 0 && s.e.meta.n_tokens() > max_file_tokens) continue;
            if (!best || std::pair(s.e.file_bytes, s.e.file_name) < std::pair(best->e.file_bytes, best->e.file_name))
                best = &s;
        }
        if (!best) continue;
        snapshot_match m;
        m.key = best->e.key;
        m.n_blocks = i + 1;
        m.n_tokens = best->e.meta.blocks[i].end;
        m.file_n_tokens = best->e.meta.n_tokens();
        return m;
    }
    return {};
}

snapshot_match snapshot_store::impl::lookup(std::span<const hash128> path, pos_t max_file_tokens) {
    refresh_if_due();
    std::lock_guard lock(mu_);
    ++stats_.n_lookups;
    snapshot_match m = find_locked(path, max_file_tokens);
    ++(m.n_blocks > 0 ? stats_.n_lookup_hits : stats_.n_lookup_misses);
    return m;
}

snapshot_match snapshot_store::impl::peek(std::span<const block> path, pos_t max_file_tokens) const {
    std::vector<hash128> chains;
    chains.reserve(path.size());
    for (const block & b : path) chains.push_back(b.chain);
    std::lock_guard lock(mu_);
    return find_locked(chains, max_file_tokens);
}

snapshot_match snapshot_store::impl::lookup(std::span<const block> path, pos_t max_file_tokens) {
    std::vector<hash128> chains;
    chains.reserve(path.size());
    for (const block & b : path) chains.push_back(b.chain);
    return lookup(chains, max_file_tokens);
}

std::optional<snapshot_entry> snapshot_store::impl::newest_of(const std::string & workspace) const {
    std::lock_guard lock(mu_);
    const entry_state * best = nullptr;
    for (const auto & [name, s] : entries_) {
        if (s.e.key.workspace != workspace) continue;
        // entries_ is ordered by name: on equal times the later name wins
        if (!best || s.e.meta.created_unix_ms >= best->e.meta.created_unix_ms) best = &s;
    }
    if (!best) return std::nullopt;
    return best->e;
}

result<std::shared_ptr<const snapshot>> snapshot_store::impl::load(const snapshot_key & key, const profile * expected) {
    using load_result = result<std::shared_ptr<const snapshot>>;
    const std::string name = key.file_name();

    // Counts this call's outcome and applies the caller's own profile check.
    auto finish = [&](const load_result & r, snapshot_defect defect) -> load_result {
        std::string reason;
        status out;
        if (!r.ok()) {
            out = r.error();
            switch (out.code()) {
                case status_code::not_found: reason = "not_found"; break;
                case status_code::corrupt: reason = "corrupt:" + std::string(snapshot_defect_name(defect)); break;
                default: reason = "io_error"; break;
            }
        } else if (expected) {
            out = check_snapshot_profile((*r)->meta, *expected);
            if (!out.ok()) reason = "profile_drift";
        }
        std::lock_guard lock(mu_);
        if (!reason.empty()) {
            ++stats_.load_misses_by_reason[reason];
            return out;
        }
        ++stats_.n_load_hits;
        return r;
    };

    std::promise<load_result> promise;
    std::shared_ptr<inflight> fl;
    uint64_t generation = 0;
    bool reader = false;
    {
        std::lock_guard lock(mu_);
        ++stats_.n_loads;
        if (auto it = inflight_.find(name); it != inflight_.end()) {
            fl = it->second;
            ++stats_.n_shared_loads;
        } else {
            auto e = entries_.find(name);
            if (e == entries_.end()) {
                ++stats_.load_misses_by_reason["not_found"];
                return not_found("no snapshot " + name + " in " + opts_.dir);
            }
            generation = e->second.generation;
            fl = std::make_shared<inflight>();
            fl->value = promise.get_future().share();
            inflight_[name] = fl;
            reader = true;
        }
    }
    if (!reader) {
        if (opts_.on_shared_load) opts_.on_shared_load(key);
        const load_result & r = fl->value.get();  // `defect` was written before the result was set
        return finish(r, fl->defect);
    }

    // This call reads, for itself and for every call that joins meanwhile.
    snapshot_defect defect = snapshot_defect::none;
    uint64_t n_bytes = 0;
    load_result r = [&]() -> load_result {
        auto f = fs_.open_readable(path_of(name));
        if (!f) return f.error().with_context("loading snapshot");
        n_bytes = (*f)->size();
        // The head first: a file replaced behind the index may declare more KV than its
        // tokens can hold, and is then not read further.
        auto h = read_snapshot_header(**f, &defect);
        if (!h) return h.error().with_context("snapshot " + name);
        if (std::string why_not = implausible_kv(*h); !why_not.empty()) {
            defect = snapshot_defect::bad_layout;
            return corrupt("snapshot " + name + ": " + why_not);
        }
        auto s = read_snapshot(**f, &defect);
        if (!s) return s.error().with_context("snapshot " + name);
        if (s->meta.key() != key.chain || s->meta.workspace != key.workspace) {
            defect = snapshot_defect::misnamed;
            return corrupt("snapshot " + name + ": misnamed: the file holds key " + s->meta.key().hex() +
                           " of workspace '" + s->meta.workspace + "'");
        }
        return std::shared_ptr<const snapshot>(std::make_shared<snapshot>(std::move(*s)));
    }();
    bool deferred = false;
    if (!r.ok() && r.error().code() == status_code::corrupt && opts_.on_rejection_deferred) {
        // Out of the index now (no lookup finds it again); the file moves later.
        std::lock_guard commit(commit_mu_);
        std::lock_guard lock(mu_);
        if (auto it = entries_.find(name); it != entries_.end() && it->second.generation == generation) {
            index_remove(name);
            deferred_.push_back({name, defect, r.error().message()});
            deferred = true;
        }
    } else if (!r.ok() && r.error().code() == status_code::corrupt) {
        std::lock_guard commit(commit_mu_);
        reject(name, defect, r.error().message(), /*in_index=*/true, generation);
    } else if (!r.ok() && r.error().code() == status_code::not_found) {
        // Removed behind the index (another process sharing the directory evicted it).
        std::lock_guard commit(commit_mu_);
        std::lock_guard lock(mu_);
        if (auto it = entries_.find(name); it != entries_.end() && it->second.generation == generation)
            index_remove(name);
    }
    fl->defect = defect;
    promise.set_value(r);
    {
        std::lock_guard lock(mu_);
        inflight_.erase(name);
        ++stats_.n_file_reads;
        stats_.n_bytes_read += n_bytes;
        if (r.ok())
            if (auto it = entries_.find(name); it != entries_.end()) it->second.e.t_last_used_ms = now_ms();
    }
    if (deferred) opts_.on_rejection_deferred();
    return finish(r, defect);
}

void snapshot_store::impl::settle_rejections() {
    std::vector<deferred_rejection> todo;
    {
        std::lock_guard lock(mu_);
        todo.swap(deferred_);
    }
    for (deferred_rejection & d : todo) {
        std::lock_guard commit(commit_mu_);
        bool replaced = false;
        {
            std::lock_guard lock(mu_);
            replaced = entries_.count(d.file_name) > 0;  // a put wrote it again since
        }
        // A replaced file is recorded and left alone (in_index with no generation of it).
        reject(d.file_name, d.defect, d.reason, /*in_index=*/replaced, replaced ? UINT64_MAX : 0);
    }
}

std::string snapshot_store::impl::implausible_kv(const snapshot_header & h) const {
    const uint64_t most = opts_.max_kv_bytes ? opts_.max_kv_bytes(h.meta) : 0;
    if (most == 0 || h.kv_bytes <= most) return {};
    return "its head declares " + std::to_string(h.kv_bytes) + " bytes of KV for " + std::to_string(h.meta.n_tokens()) +
           " tokens; this model's KV for them is at most " + std::to_string(most);
}

// ---- removal, pins ------------------------------------------------------------------------

status snapshot_store::impl::remove(const snapshot_key & key) {
    const std::string name = key.file_name();
    std::lock_guard commit(commit_mu_);
    {
        std::lock_guard lock(mu_);
        if (!entries_.count(name)) return not_found("no snapshot " + name + " in " + opts_.dir);
        index_remove(name);
    }
    WARMCTX_RETURN_IF_ERROR(fs_.remove_file(path_of(name)));
    return fs_.sync_dir(opts_.dir);
}

result<size_t> snapshot_store::impl::remove_all() {
    std::lock_guard commit(commit_mu_);
    std::vector<std::string> names;
    {
        std::lock_guard lock(mu_);
        for (const auto & [name, s] : entries_) names.push_back(name);
        for (const auto & name : names) index_remove(name);
    }
    status first;
    for (const auto & name : names) {
        status st = fs_.remove_file(path_of(name));
        if (!st.ok() && first.ok()) first = st;
    }
    if (status st = fs_.sync_dir(opts_.dir); !st.ok() && first.ok()) first = st;
    if (!first.ok()) return first;
    return names.size();
}

status snapshot_store::impl::pin(const snapshot_key & key) {
    std::lock_guard lock(mu_);
    auto it = entries_.find(key.file_name());
    if (it == entries_.end()) return not_found("no snapshot " + key.file_name() + " to pin");
    it->second.e.pinned = true;
    return {};
}

void snapshot_store::impl::unpin(const snapshot_key & key) {
    std::lock_guard lock(mu_);
    if (auto it = entries_.find(key.file_name()); it != entries_.end()) it->second.e.pinned = false;
}

// ---- views --------------------------------------------------------------------------------

std::vector<snapshot_entry> snapshot_store::impl::list() const {
    std::lock_guard lock(mu_);
    std::vector<snapshot_entry> out;
    out.reserve(entries_.size());
    for (const auto & [name, s] : entries_) out.push_back(s.e);
    return out;
}

std::optional<snapshot_entry> snapshot_store::impl::find(const snapshot_key & key) const {
    std::lock_guard lock(mu_);
    auto it = entries_.find(key.file_name());
    if (it == entries_.end()) return std::nullopt;
    return it->second.e;
}

std::vector<rejected_file> snapshot_store::impl::rejected() const {
    std::lock_guard lock(mu_);
    return rejected_;
}

snapshot_store_stats snapshot_store::impl::stats() const {
    std::lock_guard lock(mu_);
    snapshot_store_stats s = stats_;
    s.n_files = entries_.size();
    s.quarantine_files = quarantined_.size();
    s.n_pinned = 0;
    for (const auto & [name, e] : entries_) s.n_pinned += e.e.pinned ? 1 : 0;
    return s;
}

// ---- the public calls ----------------------------------------------------------------------

snapshot_store::snapshot_store(snapshot_store_options opts) : p_(std::make_unique<impl>(std::move(opts))) {}

snapshot_store::~snapshot_store() { p_->settle_rejections(); }

result<std::unique_ptr<snapshot_store>> snapshot_store::open(snapshot_store_options opts) {
    if (opts.dir.empty()) return invalid_argument("snapshot store: no directory given");
    std::unique_ptr<snapshot_store> s(new snapshot_store(std::move(opts)));
    impl & d = *s->p_;
    if (!d.opts_.scan_only) {
        WARMCTX_RETURN_IF_ERROR(d.fs_.create_dirs(d.opts_.dir).with_context("snapshot store"));
        if (d.opts_.quarantine)
            WARMCTX_RETURN_IF_ERROR(d.fs_.create_dirs(d.quarantine_dir_).with_context("snapshot store"));
    }
    WARMCTX_RETURN_IF_ERROR(d.rescan());
    return s;
}

result<snapshot_entry> snapshot_store::put(const snapshot_meta & meta, std::span<const token_id> tokens,
                                           std::span<const uint8_t> kv) {
    return p_->put(meta, tokens, kv);
}
snapshot_match snapshot_store::lookup(std::span<const hash128> path, pos_t max_file_tokens) {
    return p_->lookup(path, max_file_tokens);
}
snapshot_match snapshot_store::lookup(std::span<const block> path, pos_t max_file_tokens) {
    return p_->lookup(path, max_file_tokens);
}
snapshot_match snapshot_store::peek(std::span<const block> path, pos_t max_file_tokens) const {
    return p_->peek(path, max_file_tokens);
}
std::optional<snapshot_entry> snapshot_store::newest_of(const std::string & workspace) const {
    return p_->newest_of(workspace);
}
result<std::shared_ptr<const snapshot>> snapshot_store::load(const snapshot_key & key, const profile * expected) {
    return p_->load(key, expected);
}
void snapshot_store::settle_rejections() { p_->settle_rejections(); }
status snapshot_store::remove(const snapshot_key & key) { return p_->remove(key); }
result<size_t> snapshot_store::remove_all() { return p_->remove_all(); }
uint64_t snapshot_store::evict_for_space(uint64_t bytes) { return p_->evict_for_space(bytes); }
status snapshot_store::pin(const snapshot_key & key) { return p_->pin(key); }
void snapshot_store::unpin(const snapshot_key & key) { p_->unpin(key); }
status snapshot_store::rescan() { return p_->rescan(); }
std::vector<snapshot_entry> snapshot_store::list() const { return p_->list(); }
std::optional<snapshot_entry> snapshot_store::find(const snapshot_key & key) const { return p_->find(key); }
std::vector<rejected_file> snapshot_store::rejected() const { return p_->rejected(); }
snapshot_store_stats snapshot_store::stats() const { return p_->stats(); }
const snapshot_store_options & snapshot_store::options() const { return p_->opts_; }
std::string snapshot_store::path_of(const std::string & file_name) const { return p_->path_of(file_name); }

}  // namespace warmctx
