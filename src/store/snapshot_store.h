// store/snapshot_store.h - the disk tier: a directory of snapshot files with its own
// byte budget, indexed by block chain hash without reading any KV.
//
// Files
//   <dir>/<key hex>-<workspace hash>.wcsnap   one snapshot (docs/snapshot-format.md), named
//                                             by snapshot_file_name(key, workspace)
//   <dir>/<final name>.<pid>-<n>.tmp          a snapshot being written; never indexed, and
//                                             removed by open()/rescan() (a crash's leftover)
//   <dir>/quarantine/<name>                   a file that failed its checks, moved aside,
//   <dir>/quarantine/<name>.reason            with the reason as one line of text
//   anything else                             ignored (not ours)
// Unless `shared`, the store assumes it is the only writer of its directory (it removes
// every temp file it did not start as a crash's leftover).
//
// Shared directory (options.shared: several processes, on one machine or several over a
// shared filesystem, each with a store on the same directory)
//   - a temp file is another writer's write in progress until it is older than
//     shared_temp_grace_ms (then a crash's leftover, removed);
//   - the index follows the directory: a counted lookup re-reads it (names and stat, a
//     header only for a file not seen before or changed) when the last read is
//     shared_refresh_ms old, and a put re-reads it before enforcing the budget, so the
//     budget is the directory's (give every process the same one) and another process's
//     file is found and counted once, by name;
//   - a file another process removed (evicted) is a miss "not_found" at load and leaves
//     the index; one it is still reading stays readable (POSIX: an open file outlives its
//     name), so one process's eviction never fails another's load in progress;
//   - "used" is this process's last put or load of a file, else its creation time.
//
// Durability
//   put = write <temp>, sync, close, rename to the final name, sync the directory. After a
//   crash at any point the final name holds the previous snapshot of that key (or none) or
//   the new one, complete; never a torn file (see fs.h's contract). A file that is damaged
//   anyway (a lying disk, a bad copy) is caught by its checksums: at open/rescan (head) or
//   at load (everything) it is quarantined and the lookup/load is a miss with the reason.
//
// Lookup and load
//   lookup(path) finds, over every file's blocks, the longest prefix of the path that some
//   file holds (by chain hash: equal chain hashes mean equal tokens, chunking, profile and
//   tenant up to that block). The file may hold more than the match: load it, then trim the
//   sequence at match.n_tokens. load(key) reads the whole file and verifies it (both
//   checksums, the chain hashes against the tokens, the name against the header) before
//   returning any byte. Concurrent loads of one key share one read.
//
// Budget and eviction
//   The bytes of the indexed files are kept within budget_bytes (and each workspace's
//   within workspace_budget_bytes), checked after every put and rescan. Victims: semantic
//   policy - lowest retention class of the file's last block first, least recently used
//   within a class (then file name); lru - least recently used only. Never a pinned file,
//   one being loaded, or the file just put; if the budget cannot be met otherwise, the file
//   just put is removed again and put returns resource_exhausted. "Used" is the last put or
//   load in this process, else the file's creation time.
//
// Thread safety
//   All public calls are thread-safe. `mu_` guards the in-memory state (entries, chain map,
//   pins, in-flight loads, puts in progress, rejected files, counters) and is never held
//   during I/O. `commit_mu_` serialises every change of the directory (renames, removals,
//   quarantines, rescans) so the index and the directory change in the same order; lock
//   order is commit_mu_ then mu_. Snapshot writes and reads (the long I/O) run under
//   neither: loads of other keys and lookups proceed while a file is written or read.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "warmctx/fs.h"
#include "warmctx/eviction_policy.h"
#include "store/snapshot.h"

namespace warmctx {

// A file in the store: the chain hash of its last block and its workspace.
struct snapshot_key {
    hash128 chain;
    std::string workspace;
    std::string file_name() const { return snapshot_file_name(chain, workspace); }
    bool operator==(const snapshot_key &) const = default;
};

struct snapshot_store_options {
    std::string dir;                       // the cache directory (created if missing)
    file_system * fs = nullptr;            // nullptr: posix_fs(); must outlive the store
    uint64_t budget_bytes = 0;             // all files; 0 = unlimited
    uint64_t workspace_budget_bytes = 0;   // each workspace's files; 0 = unlimited
    eviction_policy policy = eviction_policy::semantic;
    bool quarantine = true;                // a bad file goes to quarantine/ (false: removed)
    // quarantine/ keeps at most this many files (oldest out first), and its bytes count
    // against budget_bytes: a quarantined file goes before any snapshot is evicted.
    size_t quarantine_max_files = 16;
    // Never change the directory at open/rescan: bad files are reported by rejected() but
    // left in place, temp files are left alone, the budget is not enforced. For readers
    // beside a live writer (the CLI's ls/show/verify). put/remove still work.
    bool scan_only = false;
    std::function<uint64_t()> clock_ms;    // Unix time in ms; empty = the system clock
    // Other processes use the directory too (see "Shared directory" above).
    bool shared = false;
    uint64_t shared_refresh_ms = 250;
    uint64_t shared_temp_grace_ms = 10 * 60 * 1000;
    // The most KV bytes a snapshot of these blocks and tokens can hold (the engine's
    // bytes per token and per checkpoint, with room to spare); empty or 0: unchecked. A
    // head that declares more is rejected from its head alone, before any KV is read: a
    // checksummed head declaring 6 GB for 350 tokens was read whole on the engine thread.
    std::function<uint64_t(const snapshot_meta &)> max_kv_bytes;
    // When set, a load that finds a file damaged takes it out of the index at once and
    // leaves moving it aside (quarantine or removal: a rename and a directory sync) to
    // settle_rejections(), which the owner runs on another thread: the caller of load
    // (the engine thread) never waits on the directory. Called (no lock held) after each
    // such load.
    std::function<void()> on_rejection_deferred;
    // Called (no lock held) with the name of each file the budget evicted. For tests.
    std::function<void(const std::string &)> on_evict;
    // Called (on the caller's thread, no lock held) when a load joins another caller's
    // in-flight read of the same key. For tests and metrics.
    std::function<void(const snapshot_key &)> on_shared_load;
};

// What the index knows of one file (from its head; no KV read).
struct snapshot_entry {
    snapshot_key key;
    std::string file_name;
    snapshot_meta meta;
    uint64_t file_bytes = 0;
    uint64_t kv_bytes = 0;
    uint64_t t_last_used_ms = 0;
    bool pinned = false;
};

// A file the store refused: at open/rescan (head checks, name) or at load (full checks).
struct rejected_file {
    std::string file_name;
    snapshot_defect defect = snapshot_defect::none;  // none: an I/O error, not damage
    std::string reason;                              // the status message
    bool quarantined = false;                        // moved to quarantine/
    bool removed = false;                            // deleted (quarantine off)
};

// The longest prefix of a path that a file holds. A miss has n_blocks == 0.
struct snapshot_match {
    snapshot_key key;
    size_t n_blocks = 0;        // the path's first n_blocks blocks are in the file
    pos_t n_tokens = 0;         // their end: load the file, then trim the sequence here
    pos_t file_n_tokens = 0;    // tokens the file holds (>= n_tokens)
    bool hit() const { return n_blocks > 0; }
};

// Gauges (the current state) and tickers (since open).
// Invariants: n_loads == n_load_hits + sum(load_misses_by_reason);
//   n_lookups == n_lookup_hits + n_lookup_misses; n_file_reads <= n_loads - n_shared_loads
//   + (reads by rescan are not counted here).
struct snapshot_store_stats {
    // gauges
    uint64_t n_files = 0;
    uint64_t n_bytes = 0;
    uint64_t budget_bytes = 0;
    uint64_t n_pinned = 0;
    // tickers
    uint64_t n_puts = 0;               // successful
    uint64_t n_put_failures = 0;
    uint64_t n_bytes_written = 0;
    uint64_t n_lookups = 0, n_lookup_hits = 0, n_lookup_misses = 0;
    uint64_t n_loads = 0;              // calls of load()
    uint64_t n_load_hits = 0;          // calls that returned a snapshot
    uint64_t n_shared_loads = 0;       // calls served by another call's read
    uint64_t n_file_reads = 0;         // whole-file reads done by loads
    uint64_t n_bytes_read = 0;
    // "not_found", "io_error", "profile_drift", "corrupt:<defect>" (e.g. "corrupt:truncated")
    std::map<std::string, uint64_t> load_misses_by_reason;
    uint64_t n_quarantined = 0;        // moved to quarantine/ (at scan or load)
    uint64_t quarantine_files = 0;     // gauge: files now in quarantine/ (reasons not counted)
    uint64_t quarantine_bytes = 0;     // gauge: their bytes, reasons included (in the budget)
    uint64_t n_quarantine_pruned = 0;  // quarantined files deleted to keep quarantine/ bounded
    uint64_t n_bad_removed = 0;        // bad files deleted (quarantine off)
    uint64_t n_temp_removed = 0;       // leftover temp files deleted by open/rescan
    std::array<uint64_t, k_retention_class_count> evictions_by_class{};  // files, by last block's class
    uint64_t n_evicted_bytes = 0;
};

class snapshot_store {
  public:
    // Creates the directory (and quarantine/) unless scan_only, then rescan().
    // Errors: invalid_argument (no dir), io_error / not_found from the file system.
    static result<std::unique_ptr<snapshot_store>> open(snapshot_store_options opts);
    ~snapshot_store();
    snapshot_store(const snapshot_store &) = delete;
    snapshot_store & operator=(const snapshot_store &) = delete;

    // Writes a snapshot durably (see Durability), replacing the file of the same key, and
    // evicts to the budget. meta.created_unix_ms 0 means now. Returns the new entry.
    // Errors: invalid_argument (validate_snapshot), resource_exhausted (larger than a
    // budget, or the budget is held by pinned files), io_error (the file system; nothing
    // of this put is indexed, and the previous file of the key is untouched, except when
    // only the final directory sync failed: then the new file is in place and indexed
    // but may not survive a crash).
    result<snapshot_entry> put(const snapshot_meta & meta, std::span<const token_id> tokens,
                               std::span<const uint8_t> kv);
    result<snapshot_entry> put(const snapshot & s) { return put(s.meta, s.tokens, s.kv); }

    // The longest prefix of `path` (a prompt's block chain hashes, in order) held by any
    // file; ties go to the smallest file. Reads nothing. `max_file_tokens` > 0: only files
    // of at most that many tokens (a reader whose sequences hold fewer cannot load the
    // others).
    snapshot_match lookup(std::span<const hash128> path, pos_t max_file_tokens = 0);
    snapshot_match lookup(std::span<const block> path, pos_t max_file_tokens = 0);
    // The same answer as lookup, counted nowhere: what a lookup would find (explain).
    snapshot_match peek(std::span<const block> path, pos_t max_file_tokens = 0) const;
    // The newest file of `workspace` (latest creation time, then file name), if any.
    // Reads nothing; counted nowhere.
    std::optional<snapshot_entry> newest_of(const std::string & workspace) const;

    // Reads and fully verifies the file of `key`. When `expected` is given, a snapshot of
    // another profile is a miss (failed_precondition naming the drifted fields; the file
    // is kept: it is valid, for another configuration). A damaged file is quarantined (or
    // removed) and the result is corrupt with the defect's name. Concurrent calls for one
    // key share one read and one snapshot object.
    // Errors (every one a miss, counted by reason): not_found, corrupt, io_error,
    // failed_precondition.
    result<std::shared_ptr<const snapshot>> load(const snapshot_key & key, const profile * expected = nullptr);

    // Moves aside the files loads found damaged (on_rejection_deferred) and records them
    // in rejected() and the stats; a file a put has replaced meanwhile stays. Thread-safe.
    void settle_rejections();

    // Removes a file (not_found if the index does not hold it) / every indexed file.
    status remove(const snapshot_key & key);
    result<size_t> remove_all();

    // Room on a full disk for another store's write (the durable workspace store shares
    // the disk): removes quarantined files, then evicts snapshots by the policy's order
    // (never a pinned one, nor one being loaded) until `bytes` are freed or nothing
    // evictable is left. Returns the bytes freed.
    uint64_t evict_for_space(uint64_t bytes);

    // Pinned files are never evicted. In-memory only (a restart forgets pins).
    status pin(const snapshot_key & key);
    void unpin(const snapshot_key & key);

    // Re-reads the directory (heads only, of files new or changed since the last read):
    // indexes good files, quarantines bad ones, removes temp files (all unless scan_only;
    // shared: those older than shared_temp_grace_ms), then enforces the budget.
    status rescan();

    std::vector<snapshot_entry> list() const;                  // sorted by file name
    std::optional<snapshot_entry> find(const snapshot_key & key) const;
    std::vector<rejected_file> rejected() const;               // since open, in order
    snapshot_store_stats stats() const;
    const snapshot_store_options & options() const;
    std::string path_of(const std::string & file_name) const;  // dir + "/" + file_name

  private:
    struct impl;  // the index, the locks, quarantine's books, the stats (src/store/snapshot_store_impl.h)
    explicit snapshot_store(snapshot_store_options opts);
    std::unique_ptr<impl> p_;
};

}  // namespace warmctx
