// warmctx/json_depth.h - how deeply a JSON text nests, without parsing it.
//
// nlohmann's parser recurses once per nesting level, so untrusted JSON (request bodies,
// snapshot files) is checked with this first: a hostile document cannot exhaust the stack.
#pragma once

#include <cstddef>
#include <string_view>

namespace warmctx {

// The deepest level of [ and { outside strings (0 for a scalar). Malformed text is
// measured as far as it goes.
size_t json_nesting_depth(std::string_view s);

}  // namespace warmctx
