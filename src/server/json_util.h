// server/json_util.h - JSON and UTF-8 helpers of the HTTP layer.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "warmctx/json_depth.h"

namespace warmctx::server_detail {

inline constexpr size_t k_utf8_valid = static_cast<size_t>(-1);

// The byte offset of the first byte that does not start a well-formed UTF-8 character
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF, no truncated
// sequence), or k_utf8_valid.
size_t find_invalid_utf8(std::string_view s);

// The deepest nesting of arrays and objects in a JSON text (brackets inside strings do
// not count). Checked before parsing: serializing a parsed value recurses once per level,
// so a body of a million '[' must be refused before anything walks it.
using warmctx::json_nesting_depth;  // include/warmctx/json_depth.h
inline constexpr size_t k_max_json_depth = 100;

// j.dump() that never throws: compact, and invalid UTF-8 inside strings (a generated
// piece that is not text) becomes U+FFFD instead of a type_error.
std::string dump_json(const nlohmann::json & j);

}  // namespace warmctx::server_detail
