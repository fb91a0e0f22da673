// warmctx/chunking.h - the canonical chunking rule: where a prefill's chunks begin.
//
// The KV of a token depends, in its last bits, on which tokens were computed in the same
// batch. So that a warm run (a reused prefix [0, P) plus a prefilled tail) computes every
// token exactly as a cold run did, every prefill splits the prompt the same way:
//   - a chunk never crosses a boundary (a segment start, say);
//   - inside the span between two boundaries, a new chunk starts every `chunk_tokens`
//     tokens counted from the span's start;
//   - a prefill may only start at a chunk start, so the chunks of [P, n) are exactly the
//     cold run's chunks from P on.
// This header is the one place the rule lives: the engine prefills by it, the assembler
// names its blocks by it (a block is a chunk), and the tests check both against it.
#pragma once

#include <span>
#include <utility>
#include <vector>

#include "warmctx/types.h"

namespace warmctx {

// The [begin, end) positions of the chunks covering [pos0, pos0 + n_tokens).
// `boundaries` are absolute positions (sorted or not, duplicates allowed); 0 always is
// one. A chunk_tokens <= 0 is taken as 1. Pure.
std::vector<std::pair<pos_t, pos_t>> plan_chunks(pos_t pos0, int32_t n_tokens,
                                                 std::span<const pos_t> boundaries,
                                                 int32_t chunk_tokens);

// True when `pos` is where a canonical chunk begins: 0, a boundary, or a boundary plus
// a multiple of chunk_tokens (with no boundary in between). Pure.
bool is_chunk_start(pos_t pos, std::span<const pos_t> boundaries, int32_t chunk_tokens);

}  // namespace warmctx
