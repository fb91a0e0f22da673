// server/segments_json.h - the API-neutral parts of a request body: the `segments`
// extension and stored segments, workspace ids, and the bounds on tools and JSON schemas
// every API's request is held to.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api_error.h"
#include "warmctx/segments.h"
#include "warmctx/server.h"

namespace warmctx::server_detail {

inline constexpr size_t k_max_request_segments = 4096;  // the `segments` extension's entries

// 1234567 as "1,234,567" (the bounds' messages).
std::string with_commas(size_t v);

// The tools of a request against bounds.max_tools (their count) and max_tools_bytes (their
// canonical JSON's bytes): a 400 naming `param` and the bound.
maybe_error check_tools_count(size_t n, std::string_view param, const request_bounds & b);
maybe_error check_tools_bytes(size_t bytes, std::string_view param, const request_bounds & b);

// A JSON schema (a tool's parameters, response_format's schema) against the bounds,
// before llama.cpp's converter sees it: enum values (counted into `tally`, over every
// schema of a request) at most bounds.max_enum_values, each pattern at most
// max_pattern_bytes long and max_pattern_nesting deep, anyOf/oneOf alternatives (counted
// into `tally`) at most max_schema_alternatives, each object at most
// max_optional_properties properties not `required`, the converter's estimated work
// (counted into `tally`) at most max_schema_cost, and each $ref a pointer into the
// schema itself that resolves (a remote one, or a chain of references that comes back to
// itself, would be converted to "any value"). A 400 naming `param` and the bound.
struct schema_tally {
    size_t enum_values = 0;
    size_t alternatives = 0;  // anyOf / oneOf
    size_t cost = 0;          // per object schema: its properties + its optional ones squared
};
maybe_error check_schema_bounds(const nlohmann::json & schema, std::string_view param, const request_bounds & bounds,
                                schema_tally & tally);

// The tools segments among `segs` (a chat's `tools`, a body's or a stored segment of kind
// tools holding an OpenAI tools array) against bounds.max_tools and max_tools_bytes, and
// their parameters' schemas as check_schema_bounds does: a 400 naming the bound.
maybe_error check_tools_segments(const std::vector<segment> & segs, const request_bounds & bounds);

// The `segments` extension: [{"id","kind","content","path"?,"role"?}, ...].
// `param` prefixes field names in errors ("segments").
maybe_error parse_segments(const nlohmann::json & arr, std::string_view param, std::vector<segment> & out);
// A stored segment of kind tools whose content is a JSON array is kept as the canonical
// JSON a chat's `tools` field becomes (keys sorted, no spaces), so the tools a client
// stores and the tools its SDK sends with each chat render the same prompt, token for
// token (a template keeps the key order it is given). A body's own segments are used as
// sent.
void canonicalize_stored_tools(segment & s);
// One segment object (a PUT body), with the id given apart.
maybe_error parse_segment_body(const nlohmann::json & obj, std::string id, std::string_view param,
                               segment & out);

// A workspace for a request that names none: "auto-" + 16 hex digits of a hash of the
// system and tools segments (id and content), so each distinct agent set-up gets its
// own workspace and the same set-up always the same one; "default" when there is
// neither a system nor a tools segment.
std::string derive_workspace(const std::vector<segment> & segs);

// Workspace ids: 1..64 chars of [A-Za-z0-9._-], not starting with '.'.
maybe_error validate_workspace_id(std::string_view id, std::string_view param = "workspace");

nlohmann::json segment_json(const segment & s);
}  // namespace warmctx::server_detail
