// warmctx/manifest.h - what an assembled prompt holds, segment by segment: for explain,
// the server and snapshot files; and how two manifests differ.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "warmctx/hash.h"
#include "warmctx/segments.h"
#include "warmctx/status.h"
#include "warmctx/types.h"

namespace warmctx {

struct manifest_entry {
    std::string id;
    segment_kind kind = segment_kind::user;
    std::string path;
    std::string role;                   // the role the message was rendered with
    int order = 0;                      // the kind's order when assembled
    stability how_stable = stability::volatile_;        // the kind's stability
    retention_class retention = retention_class::none;  // the kind's retention class
    pos_t token_begin = 0;              // [token_begin, token_end) in the prompt
    pos_t token_end = 0;
    uint64_t content_bytes = 0;
    hash128 content_hash;               // hash_bytes of the content, unsalted
    hash128 token_hash;                 // hash of the segment's token ids, unsalted

    pos_t n_tokens() const { return token_end - token_begin; }
    bool operator==(const manifest_entry &) const = default;
};

// What was assembled, for explain, the server and snapshot files. Entries are in
// canonical order. Publishes no salt and no root hash.
struct manifest {
    std::vector<manifest_entry> segments;
    pos_t n_tokens = 0;                      // the whole prompt
    pos_t generation_prompt_begin = -1;      // -1: no generation prompt
    pos_t generation_prompt_end = -1;
    pos_t stable_end = 0;                    // see assembled_prompt
    pos_t n_stable_tokens = 0;
    hash128 stable_prefix_hash;
    hash128 profile_fingerprint;

    // {"n_tokens":..., "segments":[{"id":..., "kind":"repo_map", ...}], ...};
    // hashes as 32 hex digits.
    nlohmann::json to_json() const;
    // The inverse of to_json. Strict: a missing field, wrong type, unknown kind,
    // class or stability, or malformed hash is invalid_argument naming it.
    static result<manifest> from_json(const nlohmann::json & j);
    // A fixed-width table, one line per segment plus a header and a summary line.
    std::string to_table() const;

    bool operator==(const manifest &) const = default;
};

// How one segment differs between two manifests.
enum class segment_change_kind {
    appeared,         // only in `after`
    disappeared,      // only in `before`
    content_changed,  // content_hash differs
    tokens_changed,   // same content, different tokens (kind, role, template or tokenizer)
    moved,            // same tokens, different token_begin (something before it changed)
};

struct segment_change {
    std::string id;
    segment_change_kind what = segment_change_kind::appeared;
    pos_t before_begin = -1;         // token_begin in `before` (-1: not there)
    pos_t after_begin = -1;          // token_begin in `after` (-1: not there)
    std::string to_string() const;   // "segment 'src/a.cc' changed (content)"
};

// The segments that differ, in canonical order (the union of both manifests, ordered
// by (order, id, path)). Unchanged segments are not listed. `moved` is reported only
// for segments that neither changed nor appeared but start elsewhere.
std::vector<segment_change> diff_manifests(const manifest & before, const manifest & after);

// Parses hash128::hex() back (32 hex digits, either case): the manifest's hashes.
// Errors: invalid_argument.
result<hash128> parse_hash128(std::string_view hex);

}  // namespace warmctx
