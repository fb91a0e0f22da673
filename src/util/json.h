// util/json.h - the one way warmctx reads JSON: strict, bounded, exception-free.
//
// Every JSON text that reaches warmctx (request bodies, snapshot manifests, kind tables,
// benchmark payloads) is read through parse_json. It refuses, with a status and the byte
// offset where it can, what nlohmann's parser would either crash on or accept too
// generously:
//   - invalid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF)
//   - nesting deeper than max_depth (the parser and every walk of a value recurse once per
//     level, so a body of a million '[' must be refused before anything parses it)
//   - anything that is not exactly one JSON value (trailing garbage, empty text)
// Texts are read by simdjson and handed on as the nlohmann value nlohmann's own parser
// would build; what simdjson refuses is read again by nlohmann's parser, whose refusal
// says where. It never throws. Dumping is the same: dump_json never throws on invalid UTF-8 inside a
// string (a generated piece that is not text becomes U+FFFD).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "warmctx/status.h"

namespace warmctx {

inline constexpr size_t k_utf8_valid = static_cast<size_t>(-1);
inline constexpr size_t k_max_json_depth = 100;

// The byte offset of the first byte that does not start a well-formed UTF-8 character,
// or k_utf8_valid.
size_t find_invalid_utf8(std::string_view s);

// The deepest level of [ and { outside strings (0 for a scalar). Malformed text is
// measured as far as it goes.
size_t json_nesting_depth(std::string_view s);

enum class json_error { none, invalid_utf8, too_deep, syntax };

struct json_read_options {
    size_t max_depth = k_max_json_depth;
    bool check_utf8 = true;
};

// Errors: invalid_argument, with a message that names what is wrong and where
// ("not valid UTF-8 (byte offset 12)", "nests deeper than 100 levels",
// "not valid JSON: ..."). `why`, when given, receives which check failed.
result<nlohmann::json> parse_json(std::string_view text, const json_read_options & opts = {},
                                  json_error * why = nullptr);

// What `text` may become in memory as parsed values (nlohmann::json, the larger of the
// two readers' results), in bytes, estimated in one pass that allocates nothing, from the
// sizes glibc's allocator gives each kind of value (json.cpp). Within a factor of two of
// what the value takes, for the shapes that cost the most per byte of text and for plain
// ones (tests/unit/json_test.cpp): `[{},{},...]` takes ~30 bytes per byte of text.
uint64_t json_parsed_bytes_estimate(std::string_view text);

// The fast reader under parse_json (simdjson, then the same value nlohmann's parser
// builds): the value, or nullopt for anything it does not accept whole - not JSON, invalid
// UTF-8, deeper than max_depth, integers beyond 64 bits - which parse_json then reads with
// nlohmann's parser to say why. Exposed so tests and the fuzzer can hold the two readers
// to the same answers.
// Texts over k_fast_json_max_bytes are left to nlohmann's parser too (memory, not speed).
inline constexpr size_t k_fast_json_max_bytes = 8u << 20;
std::optional<nlohmann::json> parse_json_fast(std::string_view text, size_t max_depth = k_max_json_depth);

// ---- typed reads -----------------------------------------------------------------------
// The strict readers of every JSON format warmctx reads (manifest, profile, kind table,
// request bodies) check types through these, so a wrong type reads the same everywhere.
// `where` names the value ("manifest: segments[2], field 'id'"); errors are
// invalid_argument: "<where>: must be a string, not an integer".

// "a string", "an integer", "a number", "a boolean", "an array", "an object", "null".
std::string_view json_type_name(const nlohmann::json & v);
// "must be <expected>, not <got's type>": the one wording of a wrong type, here and in
// the HTTP layer's 400s (which name the request field instead of a location). A boolean
// is expected as "true or false".
std::string json_type_mismatch(std::string_view expected, const nlohmann::json & got);
// obj[key], or invalid_argument "<where>: missing field '<key>'" (REQUIRES obj is an object).
result<const nlohmann::json *> json_field(const nlohmann::json & obj, std::string_view key, std::string_view where);
result<std::string> json_as_string(const nlohmann::json & v, std::string_view where);
result<bool> json_as_bool(const nlohmann::json & v, std::string_view where);
// An integer in [lo, hi]; "<where>: <v> is outside [lo, hi]" otherwise (huge values too).
result<int64_t> json_as_int(const nlohmann::json & v, std::string_view where, int64_t lo, int64_t hi);
// A finite number.
result<double> json_as_number(const nlohmann::json & v, std::string_view where);

// j.dump() that never throws: compact (indent < 0) or indented.
std::string dump_json(const nlohmann::json & j, int indent = -1);

}  // namespace warmctx
