// runtime/kv_pool.h - the prefix cache's holders, held compactly in RAM.
//
// A cached prefix of P tokens is the engine's saved state of a sequence holding exactly
// [0, P): its P cells, not a KV stream of n_ctx cells. The pool implements the cache's
// kv_ops seam over "virtual" holder ids, which are never engine sequences:
//   copy_seq(work -> holder)   saves the work sequence's state into the holder;
//   copy_seq(holder -> work)   loads the holder's state into the work sequence, at
//                              positions 0..P-1 of its stream: the cell layout of a cold
//                              run, so the logits equal a cold run's (exact mode);
//   trim_seq(holder, from)     keeps [0, from): the saved state is cut in RAM
//                              (truncate_seq_state), no KV stream involved;
//   clear_seq(holder)          frees the bytes.
// Engine sequences passed to it are forwarded to the engine unchanged.
//
// Nothing is checksummed: the bytes never leave the process (disk snapshots keep
// their checksums).
//
// Thread safety: none; owned by the context_engine, used on the engine thread.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "warmctx/engine.h"
#include "warmctx/prefix_cache.h"

namespace warmctx {

// Per cell, llama.cpp's saved sequence state carries its position, its number of
// sequence ids and the one id, 4 bytes each, beside the K and V of every layer.
inline constexpr uint64_t k_pool_bytes_per_cell_meta = 12;

struct kv_pool_counters {
    uint64_t used_bytes = 0;       // bytes of the states held
    uint64_t allocated_bytes = 0;  // what the pool's buffers occupy (>= used_bytes)
    uint64_t n_entries = 0;        // prefixes held
    uint64_t n_saves = 0, saved_bytes = 0;
    uint64_t n_loads = 0, loaded_bytes = 0;
    double save_ms = 0, load_ms = 0;
};

// Whether saving `stream_bytes` into the pool, at the rate its saves have run so far
// (`c`), takes longer than prefilling `tokens` again at `prefill_tokens_per_ms`: false
// where either rate is not known yet.
inline bool save_costs_more_than_prefill(double stream_bytes, const kv_pool_counters & c, double tokens,
                                         double prefill_tokens_per_ms) {
    if (prefill_tokens_per_ms <= 0 || c.n_saves == 0 || c.saved_bytes == 0) return false;
    return stream_bytes * c.save_ms / (double)c.saved_bytes > tokens / prefill_tokens_per_ms;
}

class kv_pool final : public kv_ops {
  public:
    // Holder ids are [first_holder, first_holder + n_holders); none may be an engine
    // sequence.
    kv_pool(engine & e, seq_id first_holder, uint32_t n_holders);

    // A source that is no engine sequence: bytes in this engine's raw layout (a disk
    // snapshot made raw, say) holding positions 0..n_tokens-1, which the next
    // copy_seq(staging(), holder) moves into the holder; clear_seq(staging()) drops them.
    seq_id staging() const { return first_ - 1; }
    void stage(std::vector<uint8_t> raw, pos_t n_tokens);

    std::vector<seq_id> holder_ids() const;
    bool is_holder(seq_id s) const { return s >= first_ && s < first_ + (seq_id)n_; }

    status copy_seq(seq_id src, seq_id dst) override;
    status trim_seq(seq_id seq, pos_t from) override;
    void clear_seq(seq_id seq) override;
    // The bytes of the holder's saved state (cells, checkpoints, framing); 0 for an
    // empty holder or an engine sequence.
    uint64_t held_bytes(seq_id seq) const override;

    // The saved state of [0, n_tokens(holder)), or nullptr when the holder is empty.
    const std::vector<uint8_t> * state(seq_id holder) const;
    pos_t n_tokens(seq_id holder) const;

    kv_pool_counters counters() const;

  private:
    struct entry {
        std::vector<uint8_t> bytes;
        pos_t n_tokens = 0;
    };
    status save_into(seq_id src, entry & out);

    engine & e_;
    seq_id first_;
    uint32_t n_;
    entry staged_;
    std::unordered_map<seq_id, entry> entries_;
    kv_pool_counters ctr_;  // tickers; the gauges are computed
};

}  // namespace warmctx
