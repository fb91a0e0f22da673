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
// llama_state_seq_get_data on this pinned commit, for a model whose memory is one
// attention KV cache (llama_kv_cache: no sliding window, no recurrent layers, no M-RoPE
// or per-cell token ext), writes, host-endian:
//
//   u32 magic (0xaf143cd8)   i32 seq_id   u32 n_stream (the context's KV stream count)
//   n_stream x stream record:
//     u32 cell_count                                   (0: nothing more for this stream)
//     cell_count x { i32 pos, u32 n_seq_id (= 1), i32 seq_id }
//     u32 v_trans, u32 n_layer
//     K: n_layer x { i32 type, u64 row_bytes, cell_count x row_bytes }
//     V: v_trans 0: n_layer x { i32 type, u64 row_bytes, cell_count x row_bytes }
//        v_trans 1: n_layer x { i32 type, u32 elem_bytes, u32 n_embd, n_embd x cell_count x elem_bytes }
//
// (llama_context::state_seq_write_data writes the magic and seq id, then the memory's
// state_write: nothing else precedes or follows the KV cache's part.) The stream count is
// the context's - exact mode has one stream per sequence, so it is n_seq_max - and
// llama.cpp refuses a state of another count. A sequence's cells live in its own stream
// only, and reading a single sequence puts every non-empty record into the destination
// sequence's own stream, whatever its place in the list.
//
// warmctx keeps the state as a one-stream context writes it: seq id 0, n_stream 1 and the
// sequence's one record with its cells' seq ids 0. The bytes then depend on the KV alone,
// not on how many sequences the saving context had nor on which one held the prefix.
// load_seq expands that form to the current context's stream count (the record, then
// empty streams). Any other layout (another memory type, a cell shared by sequences) is
// refused with `corrupt`, never passed on.
inline constexpr uint32_t k_seq_state_magic = 0xaf143cd8;
inline constexpr size_t k_seq_state_cell_bytes = 12;  // pos, n_seq_id, one seq_id

struct stream_record {
    size_t begin = 0, end = 0;  // [begin, end) of the record, its cell count included
    uint32_t n_cells = 0;
    pos_t max_pos = -1;
};

struct parsed_state {
    std::optional<stream_record> record;  // the one non-empty stream, if any
};

// Parses a whole state of `seq` with `n_stream_expected` streams (0: any count): every
// size is checked against the bytes, so any input is safe. Errors: corrupt.
result<parsed_state> parse_seq_state(std::span<const uint8_t> bytes, int32_t seq, uint32_t n_stream_expected);

void put_u32(std::vector<uint8_t> & out, uint32_t v);

// Sets every cell's seq id to `seq` in a copy of the record's bytes at `copy`.
void set_record_seq(uint8_t * copy, const stream_record & rec, int32_t seq);

// Appends the record's bytes with every cell's seq id set to `seq`.
void append_record(std::vector<uint8_t> & out, std::span<const uint8_t> state, const stream_record & rec,
                   int32_t seq);

}  // namespace warmctx::seq_state
