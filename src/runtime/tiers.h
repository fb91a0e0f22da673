// runtime/tiers.h - the tier below the engine's KV and its RAM pool: disk.
//
// A snapshot store (docs/snapshot-format.md). Write-through: when a turn caches its
// prompt, the leading run of blocks of at least the tier's class is saved to disk
// unless the tier already holds it. A lookup that finds a longer prefix on disk than in
// the engine and its pool loads it, trims it at the snapped reuse point, and the turn's
// prefill continues from there. (Host RAM is the pool's: runtime/kv_pool.h.)
//
// Thread safety: none; owned by the context_engine, used on the engine thread.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "warmctx/context_engine.h"
#include "warmctx/snapshot_store.h"

namespace warmctx {

// The one snapshot builder: [0, path.back().end) of a prompt, its KV already saved.
snapshot make_snapshot(const profile & prof, const std::string & workspace, const manifest & man,
                       std::vector<block> path, std::span<const token_id> prompt_tokens, std::vector<uint8_t> kv);

class tier_set {
  public:
    // `max_file_tokens` > 0: the engine's sequences hold that many tokens, so a file of
    // more (made with a larger context) is never looked up nor loaded: a miss.
    // Errors: those of snapshot_store::open, with the tier named.
    static result<std::unique_ptr<tier_set>> open(const tier_options & opts, eviction_policy policy,
                                                  pos_t max_file_tokens = 0);

    bool empty() const { return !disk_; }
    snapshot_store * disk() { return disk_.get(); }

    // A prefix a tier holds beyond `better_than` tokens: its tier, the file, and the
    // snapped reuse point.
    struct hit {
        kv_tier tier = kv_tier::none;
        snapshot_match file;
        reuse_point at;
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
    hit peek(const assembled_prompt & ap, pos_t better_than) const;
    // The profile of the newest snapshot of `workspace` on disk, if any: after a
    // restart under another configuration it names the drift (explain). Reads no file.
    std::optional<profile> newest_profile(const std::string & workspace) const;
    // Loads the longest prefix the disk holds beyond `better_than` into `seq` (cleared
    // first) and trims it at the reuse point; a file that fails its checks is counted
    // (a miss). Returns kv_tier::none when nothing was restored (the sequence is then
    // empty).
    hit restore(engine & e, const profile & prof, const assembled_prompt & ap, pos_t better_than, seq_id seq);
    // The same without loading it anywhere: the hit and its file's snapshot (whose KV
    // holds at least hit.at.n_tokens), or kv_tier::none and nullptr.
    std::pair<hit, std::shared_ptr<const snapshot>> fetch(const profile & prof, const assembled_prompt & ap,
                                                          pos_t better_than);
    // Counts a fetched prefix of n_tokens as restored from disk (it went elsewhere).
    void count_restore(pos_t n_tokens) {
        ctr_.n_restores_disk++;
        ctr_.n_restored_tokens += (uint64_t)n_tokens;
    }

    // Write-through of a finished turn whose prompt's KV is in `seq` (no copy pending).
    // `seq` is left as it is; a prefix shorter than it is cut from a copy of its state.
    // Failures are counted, never fatal: the turn already succeeded.
    void write_through(engine & e, const profile & prof, seq_id seq, const std::string & workspace,
                       const assembled_prompt & ap, size_t n_blocks_held);
    // Puts a ready snapshot on disk. Errors: failed_precondition (no disk tier), put's.
    status put_disk(const snapshot & snap);

    // Restored snapshots are kept (the last few) until the engine caches their prefix
    // again, so requests admitted meanwhile share the bytes.
    void forget_recent_loads() { recent_loads_.clear(); }
    tier_counters counters() const;

  private:
    tier_set() = default;
    hit find(const assembled_prompt & ap, pos_t better_than, bool counted) const;
    // Counts a failed write and says so on stderr (at most one line per 10 s, with the
    // count since the last line): a full disk must not fail silently.
    void write_failed(const status & why);

    tier_options opts_;
    pos_t max_file_tokens_ = 0;  // 0: no limit
    std::unique_ptr<snapshot_store> disk_;
    tier_counters ctr_;
    std::chrono::steady_clock::time_point t_last_warning_{};
    uint64_t n_unreported_failures_ = 0;
    static constexpr size_t k_recent_loads = 4;
    std::deque<std::pair<std::string, std::shared_ptr<const snapshot>>> recent_loads_;  // oldest first
};

}  // namespace warmctx
