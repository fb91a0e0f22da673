// runtime/disk_kv_tier.h - the tier below the engine's KV and its RAM pool: disk.
//
// A snapshot store (docs/snapshot-format.md). Write-through: when a turn caches its
// prompt, the leading run of blocks of at least the tier's class is saved to disk
// unless the tier already holds it. A lookup that finds a longer prefix on disk than in
// the engine and its pool loads it, trims it at the snapped reuse point, and the turn's
// prefill continues from there. (Host RAM is the pool's: runtime/kv_pool.h.)
//
// The write is not the turn's: write_through copies the KV out of the engine on the
// calling thread (it must: the stream is reused next) and hands the snapshot to the
// tier's writer thread, which serializes, checksums, writes, syncs and renames the file
// (~160 MB, hundreds of ms, for a 13k-token prefix on the H200). Until its file is in the
// store a queued snapshot is served from memory: lookups see it, a restore of its prefix
// takes the queued bytes (no wait, no file read), and the same prefix is never queued
// twice. The queue is bounded in bytes (write_queue_options); a write that does not fit
// is dropped, counted and logged. flush() waits for the queue to drain; disk() and
// put_disk() flush first, so whoever reads the directory or needs a file sees every
// write queued before. The destructor finishes every queued write, then joins.
//
// A restore that finds a file damaged takes it out of the store's index at once; the
// writer thread moves the file to quarantine/ (a rename and a directory sync), so the
// engine thread never waits on the directory. flush() waits for those moves too.
//
// Thread safety: every call is made by the owner's thread (the engine thread); the
// writer thread touches only the queue, the write counters (both under mu_) and the
// store (thread-safe itself: snapshot_store.h). counters() and queue_stats() read them
// under mu_.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>

#include "warmctx/context_engine.h"
#include "store/snapshot_store.h"

namespace warmctx {

// The one snapshot builder: [0, path.back().end) of a prompt, its KV already saved.
snapshot make_snapshot(const profile & prof, const std::string & workspace, const manifest & prompt_manifest,
                       std::vector<block> path, std::span<const token_id> prompt_tokens, std::vector<uint8_t> kv);

// The disk tier's write queue: snapshots written through, waiting for (or in) the
// writer thread's put.
struct write_queue_options {
    // The bytes (KV and tokens) of the snapshots the writer may hold, the one being
    // written included. A write-through that would go past it is dropped (counted in
    // n_write_failures_disk and write_queue_stats::n_dropped, logged) rather than held:
    // memory stays bounded when the disk is slower than the turns. One snapshot is
    // always taken when the queue is empty, whatever its size (its bytes are already in
    // memory: the engine just copied them).
    uint64_t max_bytes = uint64_t{1} << 30;
    // Called by the destructor on its thread, after it told the writer to stop and
    // before it waits for the queued writes to finish. For tests.
    std::function<void()> on_destroy;
};

// Gauges (now) and tickers (since open) of the write queue.
struct write_queue_stats {
    uint64_t queued_writes = 0;        // gauge: snapshots queued or being written
    uint64_t queued_bytes = 0;         // gauge: their bytes (KV and tokens)
    uint64_t n_queued = 0;             // write-throughs handed to the writer
    uint64_t n_dropped = 0;            // refused: the queue was full (also write failures)
    uint64_t n_held_by_queue = 0;      // write-throughs skipped: a queued snapshot holds the prefix
    uint64_t n_restores_from_queue = 0;  // restores served by a queued snapshot's bytes
};

class disk_kv_tier {
  public:
    // `max_file_tokens` > 0: the engine's sequences hold that many tokens, so a file of
    // more (made with a larger context) is never looked up nor loaded: a miss.
    // Errors: those of snapshot_store::open, with the tier named.
    static result<std::unique_ptr<disk_kv_tier>> open(const tier_options & opts, eviction_policy policy,
                                                  pos_t max_file_tokens = 0, write_queue_options wq = {},
                                                  std::function<uint64_t(const snapshot_meta &)> max_kv_bytes = {});
    // Finishes every queued write (none is lost), then joins the writer thread.
    ~disk_kv_tier();
    disk_kv_tier(const disk_kv_tier &) = delete;
    disk_kv_tier & operator=(const disk_kv_tier &) = delete;

    bool empty() const { return !disk_; }
    // The store, for direct use (list, lookup, path_of, stats): flushes first, so it
    // holds every write-through queued before the call.
    snapshot_store * disk() {
        flush();
        return disk_.get();
    }
    // Waits until every write queued so far is on disk (or failed, counted) and every
    // damaged file a restore found is moved aside. Returns at once when nothing is left.
    void flush();

    // A prefix a tier holds beyond `better_than` tokens: its tier, the file, and the
    // snapped reuse point.
    struct hit {
        kv_tier tier = kv_tier::none;
        snapshot_match file;
        reuse_point at;
        // Set when the prefix is a queued write's, not yet in a file: its bytes.
        std::shared_ptr<const snapshot> queued;
        // A miss (tier none) after a candidate was tried and failed: why (its file failed
        // its checks and was quarantined, it was gone, it did not load); "" otherwise.
        std::string failed;
        // The hit as the match explain reports (no holder: the KV came from a file).
        match as_match() const {
            match m;
            m.n_blocks = at.n_blocks;
            m.n_tokens = at.n_tokens;
            m.workspace = file.key.workspace;
            return m;
        }
    };
    // What restore() would try first, counted nowhere and loading nothing (explain).
    hit peek(const assembled_prompt & prompt, pos_t better_than) const;
    // The profile of the newest snapshot of `workspace` on disk, if any: after a
    // restart under another configuration it names the drift (explain). Reads no file.
    std::optional<profile> newest_profile(const std::string & workspace) const;
    // Loads the longest prefix the disk holds beyond `better_than` into `seq` (cleared
    // first) and trims it at the reuse point; a file that fails its checks is counted
    // (a miss). Returns kv_tier::none when nothing was restored (the sequence is then
    // empty).
    hit restore(engine & e, const profile & prof, const assembled_prompt & prompt, pos_t better_than, seq_id seq);
    // The same without loading it anywhere: the hit and its file's snapshot (whose KV
    // holds at least hit.at.n_tokens), or kv_tier::none and nullptr.
    std::pair<hit, std::shared_ptr<const snapshot>> fetch(const profile & prof, const assembled_prompt & prompt,
                                                          pos_t better_than);
    // Counts a fetched prefix of n_tokens as restored from disk (it went elsewhere).
    void count_restore(pos_t n_tokens) {
        ctr_.n_restores_disk++;
        ctr_.n_restored_tokens += (uint64_t)n_tokens;
    }

    // Write-through of a finished turn whose prompt's KV is in `seq` (no copy pending).
    // `seq` is left as it is; a prefix shorter than it is cut from a copy of its state.
    // The copy is made here; the file is written by the writer thread (queue_write):
    // this returns without waiting for any I/O. Failures are counted, never fatal: the
    // turn already succeeded.
    void write_through(engine & e, const profile & prof, seq_id seq, const std::string & workspace,
                       const assembled_prompt & prompt, size_t n_blocks_held);
    // How many of the first `n_blocks_held` blocks of `prompt` write_through saves: the
    // leading run of cacheable blocks of at least the tier's class (0: none, or no disk).
    size_t n_saved_blocks(const assembled_prompt & prompt, size_t n_blocks_held) const;
    // What write_through does with its snapshot: queues it for the writer thread unless
    // the disk or the queue holds its prefix already, or the queue is full.
    enum class queue_outcome { queued, held, dropped, no_disk };
    queue_outcome queue_write(snapshot snap);
    // Puts a ready snapshot on disk now, after the queued writes (flush): the file exists
    // when it returns ok. Errors: failed_precondition (no disk tier), put's.
    status put_disk(const snapshot & snap);

    // Restored snapshots are kept (the last few) until the engine caches their prefix
    // again, so requests admitted meanwhile share the bytes.
    void forget_recent_loads() { recent_loads_.clear(); }
    // The write counters are the writer's: a write counts once its file is in the store.
    tier_counters counters() const;
    write_queue_stats queue_stats() const;

  private:
    // A snapshot queued for the writer (the front one is being written while it is in
    // the queue), with the chain hashes of its blocks for lookups.
    struct queued_write {
        std::shared_ptr<const snapshot> snap;
        std::unordered_set<hash128, hash128_hasher> chains;
        uint64_t bytes = 0;
    };

    disk_kv_tier() = default;
    hit find(const assembled_prompt & prompt, pos_t better_than, bool counted) const;
    // Whether the disk or the queue holds `path` whole (counted as a store lookup).
    bool holds(std::span<const block> path);
    // Queues a snapshot that holds() said is new.
    queue_outcome enqueue(snapshot snap);
    void writer_loop();
    // Counts a failed write and says so on stderr (at most one line per 10 s, with the
    // count since the last line): a full disk must not fail silently. REQUIRES mu_.
    void write_failed_locked(const status & why);
    void write_failed(const status & why) {
        std::lock_guard lk(mu_);
        write_failed_locked(why);
    }

    tier_options opts_;
    write_queue_options wq_opts_;
    pos_t max_file_tokens_ = 0;  // 0: no limit
    std::unique_ptr<snapshot_store> disk_;  // thread-safe: used by both threads
    tier_counters ctr_;                     // the owner's thread's counters (restores)
    static constexpr size_t k_recent_loads = 4;
    std::deque<std::pair<std::string, std::shared_ptr<const snapshot>>> recent_loads_;  // oldest first

    mutable std::mutex mu_;  // guards everything below
    std::condition_variable cv_work_;   // the writer waits for a write or stop_
    std::condition_variable cv_idle_;   // flush() waits for an empty queue
    std::deque<queued_write> queue_;    // oldest first; the writer writes the front
    bool stop_ = false;
    // Files a restore found damaged wait for the writer to move them aside (the store's
    // on_rejection_deferred): the engine thread never renames or syncs a directory.
    bool settle_ = false, settling_ = false;
    uint64_t queued_bytes_ = 0;
    write_queue_stats qstats_;          // its tickers (the gauges are computed)
    uint64_t n_writes_disk_ = 0, n_write_failures_disk_ = 0;
    std::chrono::steady_clock::time_point t_last_warning_{};
    uint64_t n_unreported_failures_ = 0;
    std::thread writer_;                // last: started once the rest is built
};

}  // namespace warmctx
