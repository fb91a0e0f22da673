// engine/seq_state.h - llama.cpp's saved sequence state, read and cut without calling
// llama.cpp: the engine's save/load conversions and truncate_seq_state (warmctx/engine.h).
// Internal to the engine and to the fuzz harness of these readers; no llama.h here.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "warmctx/status.h"
#include "warmctx/types.h"

namespace warmctx::seq_state {

// ---- sequence state: llama.cpp's layout and warmctx's stream-independent form -------
//
// llama_state_seq_get_data on this pinned commit writes, host-endian:
//
//   u32 magic (0xaf143cd8)   i32 seq_id
//   then each part of the model's memory, in order (state_layout says which):
//
//   an attention KV cache (llama_kv_cache):
//     u32 n_stream (the context's KV stream count)
//     n_stream x stream record:
//       u32 cell_count                                   (0: nothing more for this stream)
//       cell_count x { i32 pos, u32 n_seq_id (= 1), [ext: i32 x, i32 y, i32 tok], i32 seq_id }
//         (ext only where the cache keeps it: M-RoPE models such as Qwen3.5, per-layer
//         n-gram embeddings)
//       u32 v_trans, u32 n_layer
//       K: n_layer x { i32 type, u64 row_bytes, cell_count x row_bytes }
//       V: v_trans 0: n_layer x { i32 type, u64 row_bytes, cell_count x row_bytes }
//          v_trans 1: n_layer x { i32 type, u32 elem_bytes, u32 n_embd, n_embd x cell_count x elem_bytes }
//     A sliding window's cache writes only the cells its window still sees: the last
//     n_swa positions before the sequence's end.
//
//   a recurrent memory (llama_memory_recurrent), always last:
//     u32 cell_count (0 or 1 for one sequence), cell_count x { i32 pos, u32 n_seq_id (= 0) },
//     then its state tensors to the end (their layout depends on which layers are
//     recurrent; warmctx never reads into them).
//
// Plain attention models have one KV part; sliding-window models (llama_kv_cache_iswa)
// two, the full layers' then the window's; hybrid models (llama_memory_hybrid) a KV part
// then a recurrent part. With LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY llama.cpp writes only
// the LAST part (the window, or the recurrent state): that is a checkpoint's payload.
//
// Checkpoints. A state of a model with such a part is only valid at its own end: the
// window and the recurrent state cannot be cut back. warmctx therefore carries, after
// llama.cpp's bytes, the payloads of that part at earlier positions (block ends), so a
// state can be cut to any of them:
//
//   ... llama.cpp's state ...
//   n_ckpt x { u32 n_tokens, u64 n_bytes, n_bytes (the last part, one-stream form) }
//   u64 llama_bytes (where llama.cpp's state ends)   u32 n_ckpt   u32 k_checkpoint_magic
//
// Plain states never carry this trailer (their bytes are exactly llama.cpp's).
//
// warmctx keeps the state as a one-stream context writes it: seq id 0, n_stream 1 and the
// sequence's one record per KV part with its cells' seq ids 0. The bytes then depend on
// the KV alone, not on how many sequences the saving context had nor on which one held
// the prefix. The engine expands that form to the current context's stream count. Any
// other layout (a cell shared by sequences, cell extensions) is refused with `corrupt`.
inline constexpr uint32_t k_seq_state_magic = 0xaf143cd8;
inline constexpr uint32_t k_checkpoint_magic = 0x504b4357;  // "WCKP"
inline constexpr size_t k_seq_state_cell_bytes = 12;  // pos, n_seq_id, one seq_id
inline constexpr size_t k_trailer_footer_bytes = 16;

// The parts of a model's state after the magic and the seq id.
struct state_layout {
    uint32_t n_kv_parts = 1;     // attention KV caches (a sliding-window model: 2)
    bool window_last = false;    // the last KV part is a sliding window's
    bool recurrent = false;      // a recurrent part follows the KV parts
    uint32_t cell_ext = 0;       // bytes of a cell's extension (0, or 12: x, y, tok)
    // A checkpoint holds the last part: the window or the recurrent state.
    bool has_partial() const { return window_last || recurrent; }
    bool operator==(const state_layout &) const = default;
};

struct stream_record {
    size_t begin = 0, end = 0;  // [begin, end) of the record, its cell count included
    uint32_t n_cells = 0;
    pos_t min_pos = -1, max_pos = -1;
    uint32_t cell_bytes = k_seq_state_cell_bytes;  // one cell's metadata, its extension included
};

struct state_part {
    size_t begin = 0, end = 0;             // the part's bytes
    bool recurrent = false;
    uint32_t n_stream = 0;                 // a KV part's stream count
    uint32_t record_stream = 0;            // the index of its non-empty stream
    std::optional<stream_record> record;   // a KV part's one non-empty stream, if any
    pos_t recurrent_pos = -1;              // a recurrent part's cell position (-1: none)
};

struct checkpoint_ref {
    pos_t n_tokens = 0;        // the state holds [0, n_tokens) at this checkpoint
    size_t begin = 0, end = 0; // its payload's bytes
};

struct parsed_state {
    std::vector<state_part> parts;
    size_t llama_end = 0;      // where llama.cpp's bytes end
    std::vector<checkpoint_ref> checkpoints;  // sorted by n_tokens, unique
    // The first KV part's record (the tokens the state holds), if any.
    const std::optional<stream_record> & record() const { return parts.front().record; }
    pos_t n_tokens() const {
        if (parts.front().recurrent) return parts.front().recurrent_pos + 1;
        return record() ? record()->max_pos + 1 : 0;
    }
};

// Parses a whole state of `seq` with `n_stream_expected` streams per KV part (0: any
// count): every size is checked against the bytes, so any input is safe. A KV part
// other than a window must hold positions 0..n-1; a window's cells end where the
// first part's do. Errors: corrupt.
result<parsed_state> parse_seq_state(std::span<const uint8_t> bytes, int32_t seq, uint32_t n_stream_expected,
                                     const state_layout & layout = {});

// Parses a checkpoint's payload (the last part alone, one-stream form for a KV part).
result<state_part> parse_partial(std::span<const uint8_t> bytes, const state_layout & layout);

void put_u32(std::vector<uint8_t> & out, uint32_t v);
void put_u64(std::vector<uint8_t> & out, uint64_t v);

// Sets every cell's seq id to `seq` in a copy of the record's bytes at `copy`.
void set_record_seq(uint8_t * copy, const stream_record & rec, int32_t seq);

// Appends the record's bytes with every cell's seq id set to `seq`.
void append_record(std::vector<uint8_t> & out, std::span<const uint8_t> state, const stream_record & rec,
                   int32_t seq);

// Appends a KV part of `n_stream` streams holding `rec` (from `src`) in stream
// `at_stream` with seq id `seq`, the others empty; no record: all empty.
void append_kv_part(std::vector<uint8_t> & out, std::span<const uint8_t> src, const std::optional<stream_record> & rec,
                    uint32_t n_stream, uint32_t at_stream, int32_t seq);

// Appends a window record padded at the front with zero cells at positions 0..min_pos-1,
// so that llama.cpp, loading it into an emptied stream, puts position p in cell p as a
// cold run does (masked cells weigh exactly 0 in attention, whatever they hold).
void append_padded_window(std::vector<uint8_t> & out, std::span<const uint8_t> src, const stream_record & rec,
                          int32_t seq);

// Appends the checkpoint trailer (entries: n_tokens, payload) for llama bytes ending at
// `llama_bytes`. Nothing when `entries` is empty.
void append_trailer(std::vector<uint8_t> & out, size_t llama_bytes,
                    std::span<const std::pair<pos_t, std::span<const uint8_t>>> entries);

// Cuts a state of `layout` to [0, n_keep) (truncate_seq_state in warmctx/engine.h, for
// any layout): the KV parts keep their first n_keep cells; the last part, where the
// layout has one, becomes the checkpoint at n_keep (out_of_range when there is none);
// the checkpoints before n_keep stay. n_keep equal to the state's length changes nothing.
status truncate_state(std::vector<uint8_t> & state, pos_t n_keep, const state_layout & layout);

}  // namespace warmctx::seq_state
