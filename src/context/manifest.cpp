// The manifest: its JSON (both ways), its table, and how two manifests differ.
#include "warmctx/manifest.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "util/json.h"
#include "warmctx/kind_table.h"
#include "quote.h"

namespace warmctx {

using detail::quote_input;

result<hash128> parse_hash128(std::string_view hex) {
    if (hex.size() != 32) return invalid_argument("hash " + quote_input(hex) + " must be 32 hex digits");
    uint64_t parts[2] = {0, 0};
    for (size_t i = 0; i < 32; ++i) {
        const char c = hex[i];
        uint64_t d;
        if (c >= '0' && c <= '9') d = uint64_t(c - '0');
        else if (c >= 'a' && c <= 'f') d = uint64_t(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = uint64_t(c - 'A' + 10);
        else return invalid_argument("hash " + quote_input(hex) + " has a non-hex digit");
        parts[i / 16] = (parts[i / 16] << 4) | d;
    }
    return hash128{parts[0], parts[1]};
}

// ---- JSON and table ----------------------------------------------------------------------

nlohmann::json manifest::to_json() const {
    nlohmann::json segs = nlohmann::json::array();
    for (const manifest_entry & e : segments) {
        segs.push_back({
            {"id", e.id},
            {"kind", segment_kind_name(e.kind)},
            {"path", e.path},
            {"role", e.role},
            {"order", e.order},
            {"stability", stability_name(e.how_stable)},
            {"class", retention_class_name(e.retention)},
            {"token_begin", e.token_begin},
            {"token_end", e.token_end},
            {"n_tokens", e.n_tokens()},
            {"content_bytes", e.content_bytes},
            {"content_hash", e.content_hash.hex()},
            {"token_hash", e.token_hash.hex()},
        });
    }
    return {
        {"n_tokens", n_tokens},
        {"generation_prompt_begin", generation_prompt_begin},
        {"generation_prompt_end", generation_prompt_end},
        {"stable_end", stable_end},
        {"n_stable_tokens", n_stable_tokens},
        {"stable_prefix_hash", stable_prefix_hash.hex()},
        {"profile_fingerprint", profile_fingerprint.hex()},
        {"segments", std::move(segs)},
    };
}

namespace {

// The field `key` of the object `obj` (named `where`) into `out`, through json.h's
// readers chosen by out's type: "<where>: missing field '<key>'", "<where>: field
// '<key>': must be a string, not an integer", and so on.
template <class T>
status read_field(const nlohmann::json & obj, std::string_view key, const std::string & where, T & out) {
    auto field = json_field(obj, key, where);
    if (!field.ok()) return field.error();
    const nlohmann::json & v = **field;
    const std::string at = where + ": field '" + std::string(key) + "'";
    if constexpr (std::is_integral_v<T>) {
        constexpr int64_t hi = std::numeric_limits<T>::max() > uint64_t(std::numeric_limits<int64_t>::max())
                                   ? std::numeric_limits<int64_t>::max()
                                   : int64_t(std::numeric_limits<T>::max());
        auto x = json_as_int(v, at, int64_t(std::numeric_limits<T>::min()), hi);
        if (!x.ok()) return x.error();
        out = static_cast<T>(*x);
        return {};
    } else {
        auto text = json_as_string(v, at);
        if (!text.ok()) return text.error();
        if constexpr (std::is_same_v<T, std::string>) {
            out = std::move(*text);
            return {};
        } else if constexpr (std::is_same_v<T, hash128>) {
            auto h = parse_hash128(*text);
            if (!h.ok()) return h.error().with_context(at);
            out = *h;
            return {};
        } else {
            // A name: segment_kind, stability or retention_class.
            result<T> parsed = [&] {
                if constexpr (std::is_same_v<T, segment_kind>) return parse_segment_kind(*text);
                else if constexpr (std::is_same_v<T, stability>) return parse_stability(*text);
                else return parse_retention_class(*text);
            }();
            if (!parsed.ok()) return parsed.error();
            out = *parsed;
            return {};
        }
    }
}

}  // namespace

result<manifest> manifest::from_json(const nlohmann::json & j) {
    const std::string where = "manifest";
    if (!j.is_object()) return invalid_argument("manifest: must be a JSON object");
    manifest m;
    WARMCTX_RETURN_IF_ERROR(read_field(j, "n_tokens", where, m.n_tokens));
    WARMCTX_RETURN_IF_ERROR(read_field(j, "generation_prompt_begin", where, m.generation_prompt_begin));
    WARMCTX_RETURN_IF_ERROR(read_field(j, "generation_prompt_end", where, m.generation_prompt_end));
    WARMCTX_RETURN_IF_ERROR(read_field(j, "stable_end", where, m.stable_end));
    WARMCTX_RETURN_IF_ERROR(read_field(j, "n_stable_tokens", where, m.n_stable_tokens));
    WARMCTX_RETURN_IF_ERROR(read_field(j, "stable_prefix_hash", where, m.stable_prefix_hash));
    WARMCTX_RETURN_IF_ERROR(read_field(j, "profile_fingerprint", where, m.profile_fingerprint));
    auto segs_field = json_field(j, "segments", where);
    if (!segs_field.ok()) return segs_field.error();
    const nlohmann::json & segs = **segs_field;
    if (!segs.is_array()) return invalid_argument("manifest: field 'segments' must be an array");
    for (size_t i = 0; i < segs.size(); ++i) {
        const nlohmann::json & s = segs[i];
        const std::string at = "manifest: segments[" + std::to_string(i) + "]";
        if (!s.is_object()) return invalid_argument(at + ": must be an object");
        manifest_entry e;
        WARMCTX_RETURN_IF_ERROR(read_field(s, "id", at, e.id));
        WARMCTX_RETURN_IF_ERROR(read_field(s, "kind", at, e.kind));
        WARMCTX_RETURN_IF_ERROR(read_field(s, "path", at, e.path));
        WARMCTX_RETURN_IF_ERROR(read_field(s, "role", at, e.role));
        WARMCTX_RETURN_IF_ERROR(read_field(s, "order", at, e.order));
        WARMCTX_RETURN_IF_ERROR(read_field(s, "stability", at, e.how_stable));
        WARMCTX_RETURN_IF_ERROR(read_field(s, "class", at, e.retention));
        WARMCTX_RETURN_IF_ERROR(read_field(s, "token_begin", at, e.token_begin));
        WARMCTX_RETURN_IF_ERROR(read_field(s, "token_end", at, e.token_end));
        WARMCTX_RETURN_IF_ERROR(read_field(s, "content_bytes", at, e.content_bytes));
        WARMCTX_RETURN_IF_ERROR(read_field(s, "content_hash", at, e.content_hash));
        WARMCTX_RETURN_IF_ERROR(read_field(s, "token_hash", at, e.token_hash));
        if (e.token_begin < 0 || e.token_end < e.token_begin)
            return invalid_argument(at + ": bad token range");
        m.segments.push_back(std::move(e));
    }
    return m;
}

std::string manifest::to_table() const {
    std::string out;
    char line[512];
    std::snprintf(line, sizeof line, "%3s  %-12s  %-10s  %-7s  %-15s  %7s  %-12s  %-12s  %s\n", "#", "kind",
                  "stability", "class", "tokens", "n", "content", "token_hash", "id (path)");
    out += line;
    for (size_t i = 0; i < segments.size(); ++i) {
        const manifest_entry & e = segments[i];
        char range[48];
        std::snprintf(range, sizeof range, "[%d, %d)", e.token_begin, e.token_end);
        std::string name = e.id;
        if (!e.path.empty() && e.path != e.id) name += " (" + e.path + ")";
        std::snprintf(line, sizeof line, "%3zu  %-12s  %-10s  %-7s  %-15s  %7d  %-12s  %-12s  ", i,
                      std::string(segment_kind_name(e.kind)).c_str(), std::string(stability_name(e.how_stable)).c_str(),
                      std::string(retention_class_name(e.retention)).c_str(), range, e.n_tokens(),
                      e.content_hash.short_hex().c_str(), e.token_hash.short_hex().c_str());
        out += line;
        out += name;
        out += '\n';
    }
    if (generation_prompt_begin >= 0) {
        std::snprintf(line, sizeof line, "  -  %-12s  %-10s  %-7s  [%d, %d)\n", "(generation)", "-", "none",
                      generation_prompt_begin, generation_prompt_end);
        out += line;
    }
    std::snprintf(line, sizeof line, "%d tokens, stable prefix [0, %d) %s, %d tokens in stable segments, profile %s\n",
                  n_tokens, stable_end, stable_prefix_hash.short_hex().c_str(), n_stable_tokens,
                  profile_fingerprint.short_hex().c_str());
    out += line;
    return out;
}

// ---- diff ---------------------------------------------------------------------------------

std::string segment_change::to_string() const {
    std::string s = "segment " + quote_input(id);
    switch (what) {
        case segment_change_kind::appeared: return s + " appeared";
        case segment_change_kind::disappeared: return s + " disappeared";
        case segment_change_kind::content_changed: return s + " changed (content)";
        case segment_change_kind::tokens_changed:
            return s + " changed (tokens: same content, different kind, role, template or tokenizer)";
        case segment_change_kind::moved:
            return s + " moved (unchanged, now starts at token " + std::to_string(after_begin) + ", was " +
                   std::to_string(before_begin) + ")";
    }
    return s;
}

std::vector<segment_change> diff_manifests(const manifest & before, const manifest & after) {
    std::map<std::string_view, const manifest_entry *> old_by_id, new_by_id;
    for (const auto & e : before.segments) old_by_id[e.id] = &e;
    for (const auto & e : after.segments) new_by_id[e.id] = &e;

    // The union, each under the entry that describes it best (after's when present).
    std::vector<const manifest_entry *> all;
    for (const auto & e : after.segments) all.push_back(&e);
    for (const auto & e : before.segments)
        if (!new_by_id.count(e.id)) all.push_back(&e);
    std::sort(all.begin(), all.end(), [](const manifest_entry * a, const manifest_entry * b) {
        return std::tie(a->order, a->id, a->path) < std::tie(b->order, b->id, b->path);
    });

    std::vector<segment_change> out;
    for (const manifest_entry * e : all) {
        const auto o = old_by_id.find(e->id);
        const auto n = new_by_id.find(e->id);
        segment_change c;
        c.id = e->id;
        if (o == old_by_id.end()) {
            c.what = segment_change_kind::appeared;
            c.after_begin = n->second->token_begin;
        } else if (n == new_by_id.end()) {
            c.what = segment_change_kind::disappeared;
            c.before_begin = o->second->token_begin;
        } else {
            c.before_begin = o->second->token_begin;
            c.after_begin = n->second->token_begin;
            if (o->second->content_hash != n->second->content_hash) c.what = segment_change_kind::content_changed;
            else if (o->second->token_hash != n->second->token_hash) c.what = segment_change_kind::tokens_changed;
            else if (c.before_begin != c.after_begin) c.what = segment_change_kind::moved;
            else continue;  // unchanged
        }
        out.push_back(std::move(c));
    }
    return out;
}

}  // namespace warmctx
