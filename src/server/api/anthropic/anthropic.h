// server/api/anthropic/anthropic.h - the Anthropic Messages API (POST /v1/messages) as a request mapper
// and the shapes of its answers. Pure functions: no I/O, no scheduler.
//
// A Messages body becomes the chat request it means (the chat parser then validates it,
// so every route accepts and refuses alike), and the answer is rendered in Anthropic's
// shapes (render.cpp).
//
// Request (anthropic_to_chat):
//
//   Messages                                   chat completions
//   system: "text" | [{type:text, text}]       one system message per block, in order
//   a system block that starts with            the `segments` extension: a segment
//     "x-anthropic-billing-header:"              {id "attribution", kind task_summary}: the
//                                                stable-ish slot right after the stable
//                                                segments (system text, tools); see below
//   messages[i] {role user|assistant|system,   {role, content: the text blocks joined
//     content: "text" | blocks}                  with "\n"}
//   a `tool_use` block {id, name, input}       the assistant message's tool_calls[]
//                                                {id, type function, function {name,
//                                                arguments: input as JSON text}}
//   a `tool_result` block {tool_use_id,        {role tool, tool_call_id, content: its
//     content: "text" | text blocks,             text ("Error: " before it when is_error)},
//     is_error}                                  before the rest of its user message
//   thinking / redacted_thinking blocks        skipped (nothing to replay locally)
//   image, document, search_result blocks      400 unsupported_content naming the block
//   tools[i] {name, description,               {type function, function {name,
//     input_schema} (type absent or "custom")    description, parameters: input_schema}}
//   other tool types (server tools)            400 unsupported_parameter
//   tool_choice {type auto|any|tool|none,      auto | required | {function {name}} | none;
//     name, disable_parallel_tool_use}           parallel_tool_calls: !disable_...
//   max_tokens (required)                      max_tokens, at most the context per sequence
//                                                (a larger value is clamped, not refused)
//   temperature [0, 1], top_p, top_k           the same
//   stop_sequences                             stop
//   stream                                     stream
//   the session (x-claude-code-session-id,     prompt_cache_key (names the workspace)
//     else metadata.user_id's "session_...")
//
//   output_config.format {type json_schema,    response_format json_schema: JSON that follows it
//     schema} (or output_format)
//
// Accepted and ignored (nothing to apply on a local server): thinking, context_management,
// output_config's other fields (effort), metadata (but its session), service_tier, container, mcp_servers and
// cache_control on any block (every system block, message and the tools are already
// segments of their own, so a breakpoint always falls on a block boundary); headers
// anthropic-version and anthropic-beta. Unknown fields are ignored, as on the chat routes.
//
// The attribution block: Claude Code sends, as its first system block,
// "x-anthropic-billing-header: cc_version=...; cc_entrypoint=...;" whose suffix changes
// with the session's first prompt. Rendered first, it would change every token after it
// (the tools and the whole system prompt). warmctx keeps its text in the prompt, in the
// stable-ish slot after the stable segments: constant within a session, it stays in
// place under the growing history (every turn reuses it), and a new session with another
// suffix reuses the tools and the system text before it. warm == cold holds as for any
// segment: the prompt is the one warmctx renders, whatever the order the client sent.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../api_error.h"

namespace warmctx::server_detail {

inline constexpr std::string_view k_attribution_prefix = "x-anthropic-billing-header:";

struct anthropic_request_info {
    std::string model;     // as sent
    bool stream = false;
    std::vector<std::string> stop_sequences;
    // The Messages field each chat message came from, by chat message index
    // ("system[1]", "messages[3]").
    std::vector<std::string> message_sources;
};

// Translates a Messages body (already valid JSON) into a chat-completions body.
// `session`: the x-claude-code-session-id header ("" = none). `max_tokens_cap`: the
// context per sequence (max_tokens above it is clamped).
maybe_error anthropic_to_chat(const nlohmann::json & body, std::string_view session, int32_t max_tokens_cap,
                              nlohmann::json & chat_body, anthropic_request_info & info);

// Renames the param of an error the chat parser gave for a translated body to the
// Messages field it came from (messages[k] -> its source, tools[i].function.parameters
// -> tools[i].input_schema, stop -> stop_sequences).
void chat_error_to_anthropic(api_error & e, const anthropic_request_info & info);

// Anthropic's error type for an HTTP status: invalid_request_error (400, 409, 415, 422),
// authentication_error (401), permission_error (403), not_found_error (404),
// request_too_large (413), rate_limit_error (429), overloaded_error (503, 529),
// api_error (others).
std::string_view anthropic_error_type(int http_status);
// {"type":"error","error":{"type":...,"message":...}} (the message names the param).
nlohmann::json anthropic_error_json(const api_error & e);

// "msg_" + 24 random hex digits.
std::string make_message_id();

// The answer's stop_reason: "end_turn", "max_tokens", "tool_use", "stop_sequence".
struct anthropic_stop {
    std::string reason;
    nlohmann::json sequence = nullptr;  // the stop sequence, when it is known
};

// Usage as Anthropic reports it, from the prompt's token counts: input_tokens (neither
// read from nor written to the cache), cache_read_input_tokens (reused),
// cache_creation_input_tokens (cacheable tokens this request computed and cached),
// output_tokens.
nlohmann::json anthropic_usage(int64_t prompt_tokens, int64_t reused, int64_t cacheable, int64_t output_tokens);

}  // namespace warmctx::server_detail
