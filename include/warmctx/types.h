// warmctx/types.h - the plain types every layer shares: token ids, sequence ids,
// positions. Nothing here knows llama.cpp; the engine adapter maps them onto it.
#pragma once

#include <cstdint>

namespace warmctx {

using token_id = int32_t;  // a vocabulary index
using seq_id = int32_t;    // a KV sequence (a work stream, a holder)
using pos_t = int32_t;     // a token position inside a sequence, from 0

}  // namespace warmctx
