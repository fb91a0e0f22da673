// The snapshot store's private state and helpers, shared by snapshot_store.cpp and
// snapshot_store_scan.cpp. Locking: commit_mu_ serialises directory changes, mu_ guards
// the index and the books (see store/snapshot_store.h).
#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "store/snapshot_store.h"

namespace warmctx {

struct snapshot_store::impl {
    // The public calls (store/snapshot_store.h says what each does).
    result<snapshot_entry> put(const snapshot_meta & meta, std::span<const token_id> tokens,
                               std::span<const uint8_t> kv);
    snapshot_match lookup(std::span<const hash128> path, pos_t max_file_tokens);
    snapshot_match lookup(std::span<const block> path, pos_t max_file_tokens);
    snapshot_match peek(std::span<const block> path, pos_t max_file_tokens) const;
    std::optional<snapshot_entry> newest_of(const std::string & workspace) const;
    result<std::shared_ptr<const snapshot>> load(const snapshot_key & key, const profile * expected);
    void settle_rejections();
    status remove(const snapshot_key & key);
    result<size_t> remove_all();
    uint64_t evict_for_space(uint64_t bytes);
    status pin(const snapshot_key & key);
    void unpin(const snapshot_key & key);
    status rescan();
    std::vector<snapshot_entry> list() const;
    std::optional<snapshot_entry> find(const snapshot_key & key) const;
    std::vector<rejected_file> rejected() const;
    snapshot_store_stats stats() const;
    std::string path_of(const std::string & file_name) const;

    struct inflight;
    struct entry_state {
        snapshot_entry e;
        uint64_t generation = 0;  // bumped when a put replaces the file
        file_version version;     // as last seen (stat) by a put or a scan
    };
    explicit impl(snapshot_store_options opts);
    uint64_t now_ms() const;
    // REQUIRES mu_. The longest prefix of `path` held by a file (lookup, uncounted).
    snapshot_match find_locked(std::span<const hash128> path, pos_t max_file_tokens) const;
    // REQUIRES mu_. Index maintenance.
    void index_add(entry_state st);
    void index_remove(const std::string & file_name);
    // REQUIRES commit_mu_ (not mu_). Moves a bad file aside (or deletes it); records it.
    // Why a head's KV is more than opts_.max_kv_bytes allows ("" = it is not).
    std::string implausible_kv(const snapshot_header & h) const;
    void reject(const std::string & file_name, snapshot_defect d, const std::string & reason, bool in_index,
                uint64_t generation);
    // REQUIRES commit_mu_ (not mu_). Deletes quarantined files, oldest first, while there
    // are more than `max_files` or live + quarantined bytes exceed the budget.
    void prune_quarantine(size_t max_files);
    // REQUIRES mu_. The victim among the entries `in_scope`, by the policy ("" when none
    // is evictable; `keep` never is); and its removal from the index, counted.
    std::string pick_victim_locked(const std::function<bool(const entry_state &)> & in_scope,
                                   const std::string & keep) const;
    void evict_locked(const std::string & name, std::vector<std::string> & victims);
    // REQUIRES commit_mu_ (not mu_). Evicts to the budgets; `keep` (may be empty) is the
    // file just put. Returns resource_exhausted when `keep` had to go.
    status enforce_budget(const std::string & keep, const std::string & keep_workspace);
    // REQUIRES commit_mu_ (not mu_). The directory into the index (rescan's first part).
    status scan_locked();
    // A shared store's lookup: rescan() when the last read is shared_refresh_ms old.
    void refresh_if_due();

    snapshot_store_options opts_;
    file_system & fs_;
    std::string quarantine_dir_;

    std::mutex commit_mu_;            // serialises directory changes (see the header comment)
    mutable std::mutex mu_;           // guards everything below
    std::map<std::string, entry_state> entries_;  // by file name
    // chain hash -> (file name, block index) of every block of every indexed file
    std::unordered_map<hash128, std::vector<std::pair<std::string, size_t>>, hash128_hasher> by_chain_;
    std::map<std::string, std::shared_ptr<inflight>> inflight_;  // loads in progress, by file name
    std::vector<rejected_file> rejected_;
    // quarantine/: (file name, bytes with its .reason), oldest first
    std::deque<std::pair<std::string, uint64_t>> quarantined_;
    std::set<std::string> writing_;   // temp file names of puts in progress (rescan skips them)
    struct deferred_rejection {
        std::string file_name;
        snapshot_defect defect;
        std::string reason;
    };
    std::vector<deferred_rejection> deferred_;  // loads' rejections not yet settled
    snapshot_store_stats stats_;
    uint64_t generation_counter_ = 0;
    uint64_t t_last_scan_ms_ = 0;     // when scan_locked last read the directory
};

}  // namespace warmctx
