// warmctx/prefix_cache.h - keeps the KV of cached prompt prefixes resident in engine
// sequences, finds the longest one for a new prompt, and evicts under budgets by what
// the content is (retention class), suffix before prefix, never what is pinned.
//
// Vocabulary
//   block   - a token range [begin, end) of a prompt that starts and ends at a canonical
//             boundary, with the retention class of its segment and a chain hash
//             h_i = H(h_{i-1}, block_i), h_0 = H(profile, tenant salt). Equal chain hashes
//             mean equal whole prefixes [0, end), so a chain hash names a prefix, not just
//             a block. The caller (the planner) computes the blocks; this module never sees
//             tokens.
//   path    - a prompt's blocks in order: contiguous, the first begins at 0.
//   holder  - one engine sequence, from a fixed set handed to the constructor, that holds
//             the KV of one cached path [0, n_tokens). Reusing a prefix = copying the
//             holder's sequence (engine copy_seq) and trimming it at the match's end.
//   match   - the longest cached prefix of a path. It always ends at a block end (the
//             reuse point is "snapped" to a canonical boundary, which is what keeps a warm
//             run bit-identical to a cold one in exact KV mode).
//
// State of a holder
//     free ──insert──▶ holding path [0, n) ──evict last block──▶ holding [0, n') ─┐
//       ▲                   │  ▲                                               │
//       │                   │  └───────────────────────────────────────────────┘
//       └── cleared ◀───────┴── last block evicted / redundant / drop_workspace / clear
//   A holder in use belongs to the workspace that inserted it, and its engine sequence
//   holds exactly the KV of its path: no more tokens (trimmed at the path's end on insert
//   and at each eviction) and no fewer. A free holder's sequence is empty.
//
// Invariants after every public call (check_invariants() verifies them, for tests)
//   - Resident tokens (and bytes: tokens * bytes_per_token, or per holder what kv_ops
//     measures it holds where that is more) are within the global budget
//     and every workspace's tokens within its workspace budget. Budgets are never exceeded,
//     not even transiently between calls: insert plans the whole outcome first (pure, may
//     fail, changes nothing), then applies it, then measures what the holders hold and, if
//     that is over the byte budget (a hybrid's prefix carries recurrent states its tokens
//     do not show), evicts by the same policy until it is not.
//   - No holder's path is a prefix of another holder's path (such a holder is redundant:
//     every match through it can be served by the longer one; it is dropped). Hence the
//     last block of every holder is held by that holder alone, and evicting it really
//     removes that content from the cache.
//   - Blocks of class `none` are never cached.
//
// Accounting (kv_accounting)
//   per_holder   - exact KV mode (one KV stream per sequence): every holder has its own
//                  copy, so every holder's tokens count, shared prefix or not.
//   shared_cells - shared KV mode (unified KV, copy_seq shares cells): a block's tokens
//                  count once however many holders hold it. A workspace's usage counts
//                  each block held by any of its holders once; the sum over workspaces
//                  may therefore exceed the global usage.
//
// Eviction (eviction_policy)
//   Candidates are only the LAST block of each holder (suffix before prefix: a prefix is
//   worth at least as much as anything that extends it). Pinned blocks are never
//   candidates.
//     semantic - volatile content first (classes none, low, medium; lowest class
//                first); then stable content (high, highest) least reused first: a
//                block's lookup hits, plus, when it is cached again after an eviction
//                the records remember, its hits then and one for coming back (all hit
//                counts halve every 256 lookups, so old popularity fades; a superseded
//                version of a workspace's context - one that a later request of the
//                workspace left at a block of class high, after a common first block,
//                as when a repository map or pinned file is edited - counts none); then
//                lowest class, least recently used, lowest holder seq id.
//     lru      - least recently used first, classes ignored, then lowest holder seq id.
//   When a workspace is over its budget, only that workspace's holders are candidates;
//   when the global budget is exceeded, all holders are. The path being inserted competes
//   like any other holder (so a low-class tail of a new path may be "cut" instead of
//   evicting older, higher-class content). If nothing evictable is left, the inserted
//   path is cut shorter (at a block end) instead, pins or not; if nothing new of it fits,
//   insert changes nothing and returns resource_exhausted.
//
// Time
//   `now` is a caller-supplied monotonic clock (any unit, e.g. a request counter or ms).
//   It orders LRU and stamps eviction records; this module never reads a clock.
//
// Thread safety
//   None: no mutex guards this class. It is owned and used by the single engine thread
//   (the thread that owns the llama context), like the engine itself. Callers on other
//   threads must go through the engine thread's queue.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/assembler.h"  // block (the cache depends on context, never the reverse)
#include "warmctx/eviction_policy.h"
#include "warmctx/types.h"
#include "warmctx/hash.h"
#include "warmctx/segments.h"
#include "warmctx/status.h"

namespace warmctx {

// `block` (one canonical block of a prompt, see "Vocabulary" above) is the assembler's
// type, declared in warmctx/assembler.h, so a planner passes assembled_prompt::blocks
// straight in. The cache reads only chain, begin, end and retention; segment_index is not
// kept (blocks it returns, in holder_info, have segment_index 0).

// The seam to the engine: the cache moves KV only through these three calls, so tests
// run on a fake. The engine adapter implements it with llama_memory_seq_cp/seq_rm.
class kv_ops {
  public:
    virtual ~kv_ops() = default;
    // dst := the whole of src (dst's previous content is discarded).
    virtual status copy_seq(seq_id src, seq_id dst) = 0;
    // Drops positions [from, end) of seq.
    virtual status trim_seq(seq_id seq, pos_t from) = 0;
    // Empties seq. Cannot fail.
    virtual void clear_seq(seq_id seq) = 0;
    // The bytes seq's content takes where these ops know it (a RAM pool's saved state,
    // with a hybrid's recurrent states at its checkpoints), else 0. The cache charges a
    // holder the larger of this and its tokens * bytes_per_token.
    virtual uint64_t held_bytes(seq_id /*seq*/) const { return 0; }
};

// Capacities; 0 means unlimited. A holder's bytes are its tokens * bytes_per_token (the
// engine's context_info::kv_bytes_per_token), or what kv_ops::held_bytes measures where that
// is more; max_bytes binds only when bytes_per_token > 0.
struct cache_budget {
    uint64_t max_tokens = 0;
    uint64_t max_bytes = 0;
    uint64_t bytes_per_token = 0;
    uint64_t workspace_max_tokens = 0;  // default for every workspace
    std::map<std::string, uint64_t> workspace_max_tokens_override;  // per workspace name
};

// ok, or invalid_argument when max_bytes is set but bytes_per_token is 0 (the byte cap
// would silently never bind).
status validate_budget(const cache_budget & b);

// The longest cached prefix of a path. n_blocks == 0 means a miss (holder -1).
struct match {
    size_t n_blocks = 0;   // the first n_blocks blocks of the path are cached
    pos_t n_tokens = 0;    // == path[n_blocks - 1].end: the snapped reuse point
    seq_id holder = -1;    // a holder whose sequence holds at least [0, n_tokens)
    std::string workspace; // the workspace that holder belongs to
};

// Why a block left the cache (or was never admitted), for explain.
struct eviction_record {
    retention_class retention = retention_class::none;
    uint64_t at = 0;          // the `now` of the call that evicted it
    std::string workspace;    // of the holder it was evicted from / was being inserted by
    // "global token budget", "global byte budget", "workspace budget", "no free holder",
    // "not admitted: <one of the budget reasons>" (a new block cut from an insert),
    // "workspace dropped", "engine error".
    std::string reason;
    eviction_policy policy = eviction_policy::semantic;
    bool was_resident = true; // false: cut from an insert before it was ever resident
    pos_t begin = 0, end = 0; // the block's token range
    uint32_t hits = 0;        // its reuse count when it left (semantic eviction's memory)
    uint64_t at_lookup = 0;   // the cache's lookup count when it was evicted (for ageing)
};

// What an insert did (optional out-parameter of insert).
struct insert_outcome {
    bool already_cached = false;      // the whole path was resident: only touched
    size_t n_blocks_cached = 0;       // leading blocks of the path resident after the call
    pos_t n_tokens_cached = 0;
    size_t n_blocks_not_admitted = 0; // cacheable blocks cut off the end to fit the budget
    size_t n_blocks_evicted = 0;      // other resident blocks evicted to make room
    seq_id holder = -1;               // the holder now holding the path (-1 if none)
};

struct workspace_usage {
    uint64_t tokens = 0;
    uint64_t bytes = 0;
    size_t n_holders = 0;
};

// Gauges (the current state) and tickers (monotonic since construction).
// Invariants: resident_tokens <= budget.max_tokens (if set);
//   resident_bytes == resident_tokens * bytes_per_token + what holders hold beyond that <= max_bytes (if set);
//   per_holder: resident_tokens == sum of holders' n_tokens;
//   shared_cells: resident_tokens == sum over distinct resident blocks of their tokens;
//   sum of evictions_by_class == number of eviction records with a budget or
//   "no free holder" reason ever made.
struct cache_counters {
    // gauges
    uint64_t resident_tokens = 0;
    uint64_t resident_bytes = 0;
    std::map<std::string, workspace_usage> workspaces;  // only workspaces holding something
    size_t n_holders_in_use = 0;
    size_t n_holders_total = 0;
    size_t n_pinned_blocks = 0;         // distinct pinned chain hashes (resident or not)
    // tickers; indexed by retention_class (none is always 0)
    std::array<uint64_t, k_retention_class_count> evictions_by_class{};      // blocks
    std::array<uint64_t, k_retention_class_count> evicted_tokens_by_class{};
    uint64_t n_inserts = 0;              // calls that cached something new
    uint64_t n_inserts_already_cached = 0;
    uint64_t n_inserts_rejected = 0;     // resource_exhausted: no holder, or nothing new fit
    uint64_t n_not_admitted_tokens = 0;  // tokens cut off inserted paths to fit
    uint64_t n_forced_cuts = 0;          // inserts cut regardless of policy: all else pinned
    uint64_t n_whole_holder_evictions = 0;
    uint64_t n_redundant_holders_dropped = 0;
    uint64_t n_lookups = 0;
    uint64_t n_lookup_hits = 0;          // lookups with n_blocks > 0
    uint64_t n_hit_tokens = 0;           // sum of lookups' n_tokens
    uint64_t n_engine_errors = 0;
};

// One holder in use, for inspection (explain, metrics, tests).
struct holder_info {
    seq_id seq = -1;
    std::string workspace;
    pos_t n_tokens = 0;
    uint64_t t_last_used = 0;
    retention_class last_class = retention_class::none;  // class of its last block
    std::vector<block> blocks;                           // its path
};

class prefix_cache {
  public:
    // The cache may use exactly `holder_seqs` (duplicates ignored) as holders; it assumes
    // they are empty now and that nobody else writes to them while the cache lives.
    // REQUIRES: validate_budget(budget).ok() (otherwise max_bytes does not bind).
    // REQUIRES: `kv` outlives the cache.
    prefix_cache(kv_ops & kv, std::vector<seq_id> holder_seqs, cache_budget budget,
                 eviction_policy policy, kv_accounting accounting);
    ~prefix_cache();
    prefix_cache(const prefix_cache &) = delete;
    prefix_cache & operator=(const prefix_cache &) = delete;

    // The longest cached prefix of `path` over all holders of all workspaces, in time
    // proportional to the matched length (plus the holders of its last block). Workspaces
    // do not isolate: two prefixes with the same chain hash are the same tokens under the
    // same profile and tenant, so sharing them is correct. Tenants are isolated by the
    // chain root. Blocks of class none never match. A malformed path (not contiguous from
    // 0) matches only up to its first malformed block. Among holders holding the match,
    // prefers one of `prefer_workspace`, then the most recently used, then the lowest seq.
    // peek changes nothing.
    match peek(std::span<const block> path, std::string_view prefer_workspace = {}) const;
    // As peek, and marks the matched blocks and the holder used at `now` (LRU) and counts
    // the lookup. The holder's later blocks are NOT marked: suffix before prefix.
    match lookup(std::span<const block> path, uint64_t now, std::string_view prefer_workspace = {});

    // Caches `path` for `workspace`. `src_seq` must hold the KV of the whole path (it may
    // hold more after path.back().end: the copy is trimmed at the cached end).
    //   1. The path is cut before its first block of class none (such blocks are never
    //      cached, and nothing after one can be).
    //   2. If the cut path is already wholly resident: touch it at `now`, return ok.
    //   3. Holder: the holder whose path is a strict prefix of this one (it becomes
    //      redundant, so it is reused), else a free one, else a whole holder evicted by the
    //      policy (reason "no free holder"; one whose exclusive blocks are pinned is never
    //      chosen).
    //   4. Budgets (the workspace's, then the global ones) are enforced by evicting last
    //      blocks per the policy; the new path competes and may be cut shorter, at a block
    //      end; if nothing else is evictable it is cut regardless of pins.
    //   5. kv: copy_seq(src_seq, holder), trim_seq(holder, kept end), then the trims and
    //      clears of the evictions.
    // Blocks already resident keep their place; each takes the retention class given by
    // the latest insert of it (the class table is configuration and may change).
    // The budgets hold when insert returns, whatever it returns.
    // Errors (nothing changed unless said):
    //   invalid_argument   - the path is not contiguous from 0, a block is empty, a block's
    //                        chain is resident with another range or parent, or src_seq is
    //                        one of the holder seqs;
    //   resource_exhausted - no holder can be freed (all pinned), or the budget admits
    //                        nothing new of the path (records say "not admitted: ...");
    //   an error of kv.copy_seq/trim_seq on the new holder - the holder it was being
    //                        copied into is cleared and freed (its previous content, if
    //                        any, is lost), nothing else changed.
    // A failing trim while evicting from another holder clears that holder instead (its
    // content is lost, the call still succeeds), so budgets still hold.
    status insert(const std::string & workspace, std::span<const block> path, seq_id src_seq,
                  uint64_t now, insert_outcome * outcome = nullptr);

    // Pins each block of `path` by chain hash: pinned blocks are never evicted (they can
    // still be cut from an insert that cannot fit otherwise, and dropped by drop_workspace
    // or clear). Pins are counted: pin twice, unpin once -> still pinned. A pin may precede
    // the insert of its blocks. unpin of a block that is not pinned is a no-op.
    void pin(std::span<const block> path);
    void unpin(std::span<const block> path);
    bool is_pinned(const hash128 & chain) const;

    // The last time `chain`'s block left the cache or was refused, if still remembered
    // (the most recent k_max_eviction_records records are kept).
    std::optional<eviction_record> last_eviction(const hash128 & chain) const;
    static constexpr size_t k_max_eviction_records = 4096;

    // Frees every holder of `ws` (clears their sequences), pins or not. Records say
    // "workspace dropped" for blocks no other holder keeps. Not counted as evictions.
    void drop_workspace(const std::string & ws, uint64_t now = 0);
    // Lookups so far (the clock that ages semantic eviction's reuse counts).
    uint64_t n_lookups() const;
    // What the eviction records remember of a block's reuse: 0 if none; else its reuse
    // count when it left (lookup hits while resident plus what was remembered then;
    // a block not admitted counts each time it is asked for), aged, plus one.
    uint32_t remembered_reuse(const hash128 & chain) const;
    // Frees every holder. Pins, records and tickers are kept.
    void clear();

    cache_counters counters() const;
    std::vector<holder_info> holders() const;  // in-use holders, by seq id
    size_t n_free_holders() const;

    const cache_budget & budget() const;
    eviction_policy policy() const;
    kv_accounting accounting() const;
    // The token cap of a workspace (0 = unlimited).
    uint64_t workspace_max_tokens(const std::string & ws) const;

    // Recomputes everything from scratch and checks the invariants listed at the top.
    // O(total cached blocks); for tests and debugging. ok or internal.
    status check_invariants() const;

  private:
    struct impl;  // the index, pins, eviction records and tickers (src/cache/prefix_cache.cpp)
    std::unique_ptr<impl> p_;
};

}  // namespace warmctx
