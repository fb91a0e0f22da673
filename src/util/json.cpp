#include "util/json.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>

#include <simdjson.h>

namespace warmctx {

size_t find_invalid_utf8(std::string_view s) {
    const auto * p = reinterpret_cast<const unsigned char *>(s.data());
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        const unsigned char c = p[i];
        if (c < 0x80) { ++i; continue; }
        size_t len = 0;
        unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
        if (c >= 0xC2 && c <= 0xDF) { len = 2; }
        else if (c == 0xE0) { len = 3; lo = 0xA0; }           // no overlong 3-byte forms
        else if (c >= 0xE1 && c <= 0xEC) { len = 3; }
        else if (c == 0xED) { len = 3; hi = 0x9F; }           // no surrogates
        else if (c >= 0xEE && c <= 0xEF) { len = 3; }
        else if (c == 0xF0) { len = 4; lo = 0x90; }           // no overlong 4-byte forms
        else if (c >= 0xF1 && c <= 0xF3) { len = 4; }
        else if (c == 0xF4) { len = 4; hi = 0x8F; }           // nothing above U+10FFFF
        else return i;                                        // 0x80..0xC1, 0xF5..0xFF
        if (i + len > n) return i;
        if (p[i + 1] < lo || p[i + 1] > hi) return i;
        for (size_t k = 2; k < len; ++k)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
        i += len;
    }
    return k_utf8_valid;
}

size_t json_nesting_depth(std::string_view s) {
    size_t depth = 0, deepest = 0;
    bool in_string = false, escaped = false;
    for (char c : s) {
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') in_string = true;
        else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
        else if ((c == ']' || c == '}') && depth > 0) --depth;
    }
    return deepest;
}

uint64_t json_parsed_bytes_estimate(std::string_view s) {
    // What glibc's allocator hands out for nlohmann's values (64-bit): a value is 16 bytes
    // in its parent; an array its vector (32) and slots that grow by doubling (24 each on
    // average); an object its map (64) and a tree node per member (96, the key inside it
    // up to 15 bytes); a string 48 and its bytes.
    constexpr uint64_t k_value = 16, k_array = 32 + 24, k_slot = 24, k_object = 64, k_member = 96, k_string = 48;
    uint64_t bytes = k_value;
    uint64_t is_object[2] = {0, 0};  // per nesting level (deeper levels are refused anyway)
    size_t depth = 0;
    bool in_string = false, escaped = false, expect_key = false;
    auto in_object = [&] {
        return depth > 0 && depth <= 128 && ((is_object[(depth - 1) / 64] >> ((depth - 1) % 64)) & 1);
    };
    for (char c : s) {
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
            else ++bytes;
            continue;
        }
        switch (c) {
            case '"':
                in_string = true;
                bytes += expect_key ? k_member : k_string;
                expect_key = false;
                break;
            case '[':
            case '{':
                bytes += c == '[' ? k_array : k_object;
                if (++depth <= 128) {
                    uint64_t & w = is_object[(depth - 1) / 64];
                    const uint64_t bit = uint64_t{1} << ((depth - 1) % 64);
                    w = c == '{' ? (w | bit) : (w & ~bit);
                }
                expect_key = c == '{';
                break;
            case ']':
            case '}':
                if (depth > 0) --depth;
                expect_key = false;
                break;
            case ',':
                if (in_object()) expect_key = true;
                else bytes += k_slot;
                break;
            default: break;
        }
    }
    return bytes;
}

namespace {

// simdjson's document as nlohmann's, with nlohmann's own choices: a non-negative integer is
// unsigned, a repeated key keeps its last value. false: deeper than max_depth.
bool from_simdjson(simdjson::dom::element e, size_t depth_left, nlohmann::json & out) {
    using type = simdjson::dom::element_type;
    switch (e.type()) {
        case type::OBJECT: {
            if (depth_left == 0) return false;
            simdjson::dom::object obj;  // a copy: get_object()'s result is a temporary
            if (e.get(obj) != simdjson::SUCCESS) return false;
            out = nlohmann::json::object();
            for (auto field : obj) {
                nlohmann::json v;
                if (!from_simdjson(field.value, depth_left - 1, v)) return false;
                out[std::string(field.key)] = std::move(v);
            }
            return true;
        }
        case type::ARRAY: {
            if (depth_left == 0) return false;
            simdjson::dom::array arr;
            if (e.get(arr) != simdjson::SUCCESS) return false;
            out = nlohmann::json::array();
            for (auto item : arr) {
                nlohmann::json v;
                if (!from_simdjson(item, depth_left - 1, v)) return false;
                out.push_back(std::move(v));
            }
            return true;
        }
        case type::STRING: out = std::string(e.get_string().value_unsafe()); return true;
        case type::INT64: {
            const int64_t x = e.get_int64().value_unsafe();
            if (x >= 0) out = static_cast<uint64_t>(x);
            else out = x;
            return true;
        }
        case type::UINT64: out = e.get_uint64().value_unsafe(); return true;
        case type::DOUBLE: out = e.get_double().value_unsafe(); return true;
        case type::BOOL: out = e.get_bool().value_unsafe(); return true;
        case type::NULL_VALUE: out = nullptr; return true;
    }
    return false;
}

}  // namespace

std::optional<nlohmann::json> parse_json_fast(std::string_view text, size_t max_depth) {
    // simdjson's buffers and the value built from them live at once: for a text this large
    // that is more memory than nlohmann's parser alone needs, and its speed matters little
    // beside what a body this large costs to prefill.
    if (text.size() > k_fast_json_max_bytes) return std::nullopt;
    try {
        simdjson::dom::parser parser;  // its buffers last one call: a long-lived one keeps its largest body
        auto doc = parser.parse(text.data(), text.size());
        if (doc.error()) return std::nullopt;
        nlohmann::json out;
        if (!from_simdjson(doc.value_unsafe(), max_depth, out)) return std::nullopt;
        return out;
    } catch (const std::bad_alloc &) {
        return std::nullopt;
    }
}

result<nlohmann::json> parse_json(std::string_view text, const json_read_options & opts, json_error * why) {
    auto fail = [why](json_error e, std::string m) -> result<nlohmann::json> {
        if (why) *why = e;
        return invalid_argument(std::move(m));
    };
    if (why) *why = json_error::none;
    // What simdjson accepts is valid UTF-8, one JSON value, and here at most max_depth deep:
    // nothing below would refuse it. What it refuses goes the slow way, whose refusal says
    // where and why.
    if (auto fast = parse_json_fast(text, opts.max_depth)) return std::move(*fast);
    if (opts.check_utf8) {
        if (size_t bad = find_invalid_utf8(text); bad != k_utf8_valid)
            return fail(json_error::invalid_utf8, "not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
    }
    if (json_nesting_depth(text) > opts.max_depth)
        return fail(json_error::too_deep,
                    "nests arrays/objects deeper than " + std::to_string(opts.max_depth) + " levels");
    // nlohmann's reader ends the input at a NUL byte ("{...}\0junk" would read as one
    // value); no JSON text holds one (a string's control characters are escaped).
    if (size_t nul = text.find('\0'); nul != std::string_view::npos)
        return fail(json_error::syntax, "not valid JSON: a NUL byte at offset " + std::to_string(nul));
    try {
        return nlohmann::json::parse(text.begin(), text.end());
    } catch (const nlohmann::json::exception & e) {
        return fail(json_error::syntax, std::string("not valid JSON: ") + e.what());
    } catch (const std::exception & e) {  // bad_alloc on a huge document
        return fail(json_error::syntax, std::string("could not read JSON: ") + e.what());
    }
}

std::string_view json_type_name(const nlohmann::json & v) {
    using t = nlohmann::json::value_t;
    switch (v.type()) {
        case t::null: return "null";
        case t::boolean: return "a boolean";
        case t::string: return "a string";
        case t::array: return "an array";
        case t::object: return "an object";
        case t::number_integer:
        case t::number_unsigned: return "an integer";
        case t::number_float: return "a number";
        default: return "an unsupported value";
    }
}

namespace {
status wrong_type(std::string_view where, std::string_view expected, const nlohmann::json & got) {
    return invalid_argument(std::string(where) + ": " + json_type_mismatch(expected, got));
}
}  // namespace

result<const nlohmann::json *> json_field(const nlohmann::json & obj, std::string_view key, std::string_view where) {
    auto it = obj.find(key);
    if (it == obj.end()) return invalid_argument(std::string(where) + ": missing field '" + std::string(key) + "'");
    return &*it;
}

result<std::string> json_as_string(const nlohmann::json & v, std::string_view where) {
    if (!v.is_string()) return wrong_type(where, "a string", v);
    return v.get<std::string>();
}

std::string json_type_mismatch(std::string_view expected, const nlohmann::json & got) {
    return "must be " + std::string(expected) + ", not " + std::string(json_type_name(got));
}

result<bool> json_as_bool(const nlohmann::json & v, std::string_view where) {
    if (!v.is_boolean()) return wrong_type(where, "true or false", v);
    return v.get<bool>();
}

result<int64_t> json_as_int(const nlohmann::json & v, std::string_view where, int64_t lo, int64_t hi) {
    if (!v.is_number_integer()) return wrong_type(where, "an integer", v);
    const bool huge = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max());
    const int64_t x = huge ? std::numeric_limits<int64_t>::max() : v.get<int64_t>();
    if (huge || x < lo || x > hi)
        return invalid_argument(std::string(where) + ": " + v.dump() + " is outside [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "]");
    return x;
}

result<double> json_as_number(const nlohmann::json & v, std::string_view where) {
    if (!v.is_number()) return wrong_type(where, "a number", v);
    const double d = v.get<double>();
    if (!std::isfinite(d)) return invalid_argument(std::string(where) + ": must be finite");
    return d;
}

std::string dump_json(const nlohmann::json & j, int indent) {
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace warmctx
