// cache/prefix_index.h - the data structure behind prefix_cache: a trie of cached blocks
// keyed by chain hash, the holders (engine sequences) that hold paths through it, and
// the token accounting. Pure data: it never talks to the engine and knows nothing of
// budgets or policies. It is a value type on purpose: prefix_cache plans an insert by
// running it on a copy (see prefix_cache.cpp), so the plan and the real mutation are the
// same code.
//
// Why a hash map is a trie here: a chain hash names a whole prefix, so the node for
// block i of a path is found directly by path[i].chain, and its parent is path[i-1].chain.
// Walking a path costs one lookup per block, independent of how many holders exist.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "warmctx/prefix_cache.h"

namespace warmctx::cache_detail {

// A cached block. Exists exactly while at least one holder's path contains it.
struct index_node {
    hash128 parent;          // chain of the previous block; {} at depth 0
    uint32_t depth = 0;      // index of the block in its path
    pos_t begin = 0, end = 0;
    retention_class retention = retention_class::none;
    uint64_t t_last_used = 0;
    uint32_t n_hits = 0;     // lookups that reused this block while it was resident
    std::vector<int32_t> slots;  // holders (slot numbers) whose path contains this block

    pos_t n_tokens() const { return end - begin; }
};

// One engine sequence the cache may use. Free when !in_use (then path is empty).
struct index_holder {
    seq_id seq = -1;
    bool in_use = false;
    // Changes every time the slot is filled. Lets the planner's diff tell "same holder,
    // trimmed" (trim_seq) from "emptied and refilled" (clear/copy).
    uint64_t generation = 0;
    std::string workspace;
    std::vector<hash128> path;   // chain hashes, root first
    pos_t n_tokens = 0;          // end of the last block, 0 when free
    uint64_t t_last_used = 0;
    // Blocks path[stale_from..] are a superseded version of this workspace's stable
    // context: a later request of the workspace left them there (mark_superseded).
    size_t stale_from = SIZE_MAX;
    bool stale() const { return path.size() > stale_from; }
    // What its content takes beyond n_tokens * the budget's bytes per token (a hybrid's
    // recurrent states, framing), as kv_ops::held_bytes said at its last change; 0 when
    // free. A trim keeps it until measured again: a shorter prefix holds no more.
    uint64_t extra_bytes = 0;
};

class prefix_index {
  public:
    prefix_index(std::span<const seq_id> seqs, kv_accounting accounting);

    // ---- queries
    kv_accounting accounting() const { return accounting_; }
    size_t n_slots() const { return holders_.size(); }
    const index_holder & holder(int32_t slot) const { return holders_[slot]; }
    const index_node * find(const hash128 & chain) const;
    int32_t slot_of_seq(seq_id seq) const;  // -1 if not a holder seq
    int32_t free_slot() const;              // lowest free slot, -1 if none
    size_t n_in_use() const;

    // How many leading blocks of `path` are resident, stopping at the first block that
    // is absent or disagrees with the resident node (range, depth or parent).
    // O(returned count).
    size_t longest_match(std::span<const block> path) const;

    // The slot whose path ends exactly at `chain` (its last block), or -1.
    int32_t holder_ending_at(const hash128 & chain) const;

    // The blocks `slot` alone holds, leaf first, stopping at the first block another
    // holder also holds or that equals keep[depth] (blocks that will stay resident).
    std::vector<hash128> exclusive_suffix(int32_t slot, std::span<const block> keep = {}) const;

    uint64_t resident_tokens() const { return resident_tokens_; }
    // The holders' extra_bytes, summed.
    uint64_t extra_bytes() const { return extra_bytes_; }
    uint64_t workspace_tokens(const std::string & ws) const;
    const std::map<std::string, uint64_t> & all_workspace_tokens() const { return workspace_tokens_; }

    // ---- mutations (no engine calls; callers mirror them with kv_ops)

    // Fills free `slot` with `path` for `ws`, creating missing nodes. Every block of the
    // path is marked used at `now` and takes the path's retention class (latest wins).
    // REQUIRES: slot free; path well-formed and consistent with resident nodes.
    void add_holder(int32_t slot, const std::string & ws, std::span<const block> path, uint64_t now);
    // Drops the last block of `slot`'s path; frees the slot when it becomes empty.
    // REQUIRES: slot in use.
    void pop_leaf(int32_t slot);
    // Drops the whole path of `slot` and frees it. REQUIRES: slot in use.
    void remove_holder(int32_t slot);
    // Marks the first n_blocks blocks of `path` (resident) and `slot` used at `now`.
    void touch(std::span<const block> path, size_t n_blocks, int32_t slot, uint64_t now);
    // Counts a reuse of the first n_blocks of `path` (all resident).
    void count_hit(std::span<const block> path, size_t n_blocks);
    // Marks the holders of `ws` whose path leaves `path` after a common first block, at a
    // block of class high (by default a repository map, pinned file or task summary: an
    // edit), as superseded from there. A different system prompt or tool set (highest) is
    // another agent, not an edit. A holder `path` runs through is not stale.
    void mark_superseded(const std::string & ws, std::span<const block> path);
    // Halves every node's hit count (ageing: old popularity fades).
    void halve_hits();
    // Sets an in-use slot's extra_bytes.
    void set_extra_bytes(int32_t slot, uint64_t bytes);
    // Frees every slot.
    void clear();

    // Recomputes nodes, holders and usage from the holders' paths and compares.
    status check_invariants() const;

  private:
    void attach(index_node & node, int32_t slot);
    void detach(index_node & node, int32_t slot);
    void add_workspace_tokens(const std::string & ws, int64_t delta);

    kv_accounting accounting_;
    std::vector<index_holder> holders_;
    std::unordered_map<hash128, index_node, hash128_hasher> nodes_;
    uint64_t resident_tokens_ = 0;
    uint64_t extra_bytes_ = 0;
    std::map<std::string, uint64_t> workspace_tokens_;  // only non-zero entries
    uint64_t next_generation_ = 1;
};

}  // namespace warmctx::cache_detail
