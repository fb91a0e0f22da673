// The disk tier's directory read into its index: rescan, and a shared store's refresh
// (store/snapshot_store.h, "Shared directory").
#include "snapshot_store_impl.h"

#include <set>

namespace warmctx {

namespace sf = snapshot_format;

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// As snapshot_store.cpp's: at most this many rejected files are remembered.
constexpr size_t k_max_rejected_records = 1024;

}  // namespace

// ---- rescan -------------------------------------------------------------------------------

void snapshot_store::impl::refresh_if_due() {
    if (!opts_.shared) return;
    {
        std::lock_guard lock(mu_);
        if (now_ms() - t_last_scan_ms_ < opts_.shared_refresh_ms) return;
    }
    (void)rescan();  // a failed read keeps the index as it was: lookups still answer
}

status snapshot_store::impl::rescan() {
    std::lock_guard commit(commit_mu_);
    WARMCTX_RETURN_IF_ERROR(scan_locked());
    // What an earlier run (or another process) left in quarantine/ counts too (by name: no
    // age is known).
    if (opts_.quarantine && !opts_.scan_only) {
        std::deque<std::pair<std::string, uint64_t>> q;
        uint64_t q_bytes = 0;
        if (auto qn = fs_.list_dir(quarantine_dir_); qn.ok()) {
            for (const std::string & name : *qn) {
                if (ends_with(name, ".reason")) continue;
                auto b = fs_.file_size(quarantine_dir_ + "/" + name);
                if (!b.ok()) continue;  // a directory, or gone
                auto r = fs_.file_size(quarantine_dir_ + "/" + name + ".reason");
                q.emplace_back(name, *b + (r.ok() ? *r : 0));
                q_bytes += q.back().second;
            }
        }
        std::lock_guard lock(mu_);
        quarantined_ = std::move(q);
        stats_.quarantine_bytes = q_bytes;
    }
    prune_quarantine(opts_.quarantine_max_files);
    return enforce_budget("", "");
}

status snapshot_store::impl::scan_locked() {
    const uint64_t t_scan = now_ms();
    auto names = fs_.list_dir(opts_.dir);
    if (!names) return names.error().with_context("scanning snapshot directory");
    std::vector<entry_state> good;          // new or changed files, their heads read
    std::set<std::string> seen;             // every sound file's name
    uint64_t n_temp_removed = 0;
    bool changed = false;
    auto record_io_error = [&](const std::string & name, const status & st) {
        std::lock_guard lock(mu_);
        if (rejected_.size() >= k_max_rejected_records) rejected_.erase(rejected_.begin());
        rejected_.push_back({name, snapshot_defect::none, st.message(), false, false});
    };
    for (const std::string & name : *names) {
        if (ends_with(name, sf::k_temp_suffix)) {
            // A write that never reached its rename: a crash's leftover, or another
            // process's write in progress (shared: until it is old). This store's own
            // puts in progress are left alone.
            bool ours_in_progress;
            {
                std::lock_guard lock(mu_);
                ours_in_progress = writing_.count(name) > 0;
            }
            if (opts_.scan_only || ours_in_progress) continue;
            if (opts_.shared) {
                auto v = fs_.stat_file(path_of(name));
                if (!v.ok() || t_scan < opts_.shared_temp_grace_ms ||
                    v->mtime_ns / 1'000'000 > (int64_t)(t_scan - opts_.shared_temp_grace_ms))
                    continue;
            }
            if (fs_.remove_file(path_of(name)).ok()) {
                ++n_temp_removed;
                changed = true;
            }
            continue;
        }
        if (!ends_with(name, sf::k_file_suffix)) continue;
        auto version = fs_.stat_file(path_of(name));
        if (!version) {
            if (version.error().code() != status_code::not_found) record_io_error(name, version.error());
            continue;
        }
        {
            // The file this index holds already (same version: same bytes): nothing to read.
            std::lock_guard lock(mu_);
            auto it = entries_.find(name);
            if (it != entries_.end() && it->second.version == *version) {
                seen.insert(name);
                continue;
            }
        }
        auto f = fs_.open_readable(path_of(name));
        if (!f) {
            if (f.error().code() != status_code::not_found) record_io_error(name, f.error());
            continue;
        }
        snapshot_defect why = snapshot_defect::none;
        auto h = read_snapshot_header(**f, &why);
        f->reset();
        if (!h) {
            if (h.error().code() == status_code::corrupt) reject(name, why, h.error().message(), false, 0);
            else record_io_error(name, h.error());
            continue;
        }
        if (std::string why_not = implausible_kv(*h); !why_not.empty()) {
            reject(name, snapshot_defect::bad_layout, why_not, false, 0);
            continue;
        }
        std::string expected_name = snapshot_file_name(h->meta.key(), h->meta.workspace);
        if (name != expected_name) {
            reject(name, snapshot_defect::misnamed, "misnamed: its header names the file " + expected_name, false, 0);
            continue;
        }
        entry_state es;
        es.e.key = {h->meta.key(), h->meta.workspace};
        es.e.file_name = name;
        es.e.file_bytes = h->file_bytes;
        es.e.kv_bytes = h->kv_bytes;
        es.e.t_last_used_ms = h->meta.created_unix_ms;
        es.e.meta = std::move(h->meta);
        es.version = *version;
        seen.insert(name);
        good.push_back(std::move(es));
    }
    {
        std::lock_guard lock(mu_);
        // Files gone from the directory (removed by another process, or by hand).
        std::vector<std::string> gone;
        for (const auto & [name, st] : entries_)
            if (!seen.count(name)) gone.push_back(name);
        for (const std::string & name : gone) index_remove(name);
        for (entry_state & es : good) {
            // Keep what this process knows of a file it already indexed (the same write).
            auto it = entries_.find(es.e.file_name);
            if (it != entries_.end() && it->second.e.meta.created_unix_ms == es.e.meta.created_unix_ms &&
                it->second.e.file_bytes == es.e.file_bytes) {
                es.e.pinned = it->second.e.pinned;
                es.e.t_last_used_ms = std::max(es.e.t_last_used_ms, it->second.e.t_last_used_ms);
                es.generation = it->second.generation;
            } else {
                es.generation = ++generation_counter_;
            }
            index_remove(es.e.file_name);
            index_add(std::move(es));
        }
        stats_.n_temp_removed += n_temp_removed;
        t_last_scan_ms_ = t_scan;
    }
    if (changed) (void)fs_.sync_dir(opts_.dir);
    return {};
}

}  // namespace warmctx
