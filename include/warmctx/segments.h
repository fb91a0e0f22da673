// warmctx/segments.h - typed pieces of a workspace's context.
//
// A request's context is a set of segments. Each has a kind; the kind decides its
// stability, its retention class (what eviction protects first) and its place in
// the canonical order. Input order never changes the assembled prompt.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/status.h"

namespace warmctx {

enum class segment_kind : uint8_t {
    system, tools, instructions,   // stable, highest
    repo_map, pinned_file,         // stable, high
    task_summary,                  // stable-ish, high
    history,                       // volatile, low (earlier turns, append-only)
    diff, test_output,             // volatile, medium
    terminal_log, snippet,         // volatile, low
    user,                          // volatile, none (this turn)
};
inline constexpr int k_segment_kind_count = 12;

enum class stability : uint8_t { stable, stable_ish, volatile_ };

// Ordered: a lower class is evicted first. `none` is never cached past its request.
enum class retention_class : uint8_t { none = 0, low = 1, medium = 2, high = 3, highest = 4 };
inline constexpr int k_retention_class_count = 5;

std::string_view segment_kind_name(segment_kind k);
result<segment_kind> parse_segment_kind(std::string_view s);
std::string_view stability_name(stability s);
std::string_view retention_class_name(retention_class r);
result<retention_class> parse_retention_class(std::string_view s);

struct segment {
    std::string id;          // unique within a request; [A-Za-z0-9._:/-], 1..128 chars
    segment_kind kind = segment_kind::user;
    std::string path;        // optional (pinned files); breaks ties in the order
    std::string role;        // optional chat role override ("user"/"assistant" for history)
    std::string content;
    // A chat message's structure, for templates that render it (history segments):
    // an assistant message's OpenAI `tool_calls` array as JSON text ("" = none), and
    // the call a `tool` message answers ("" = none). Part of the segment's identity.
    std::string tool_calls;
    std::string tool_call_id;
    // false: the content as sent, without its kind's header line ("# system: <id>") - a
    // chat message (an OpenAI system message, an Anthropic system block) reaches the
    // model exactly as the template renders it. Part of the segment's identity.
    bool header = true;
};

}  // namespace warmctx
