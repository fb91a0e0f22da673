// server/openai.h - OpenAI request bodies -> native types, and native results -> the
// OpenAI response shapes. Pure functions: no I/O, no scheduler.
//
// How a plain chat request becomes segments (also in docs/api.md):
//
//   messages[i].role        segment
//   system | developer      kind system, id "system-00000", "system-00001", ... (in order), no header line
//   the LAST message, if    kind user, id "user"
//     its role is user
//   every other message     kind history, id "h0000", "h0001", ... in conversation
//     (user, assistant,       order, role = the message's role (so canonical order,
//      tool)                  which sorts by id, is the conversation order)
//   request field `tools`   kind tools, id "tools", content = the canonical JSON text
//                           of the array (keys sorted, no spaces)
//
// An assistant message's `tool_calls` are appended to its content as canonical JSON
// text. Content may be a string, null, or an array of {"type":"text","text":...} parts
// (joined with "\n"). A system message in the middle of a conversation moves to the
// front (stable context first): the point of canonical order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api_error.h"
#include "warmctx/conversation.h"
#include "warmctx/context_engine.h"
#include "warmctx/scheduler.h"
#include "warmctx/segments.h"
#include "warmctx/server.h"

namespace warmctx::server_detail {

inline constexpr size_t k_max_messages = 10000;     // history ids are h0000..h9999
inline constexpr size_t k_max_stop_strings = 16;
inline constexpr size_t k_max_request_segments = 4096;
inline constexpr int64_t k_max_draft_tokens = 64;  // speculative.n_max

struct request_limits {
    int32_t max_tokens_cap = 8192;      // the context per sequence: more can never fit
    int32_t default_max_tokens = 0;     // a request without max_tokens: 0 = to the end of the context
    int32_t default_reasoning_budget = -1;  // a request without reasoning_budget_tokens (-1: none)
    int32_t default_draft_max = 0;      // a request without speculative.n_max (0: no drafts)
    int32_t n_vocab = 0;                // logit_bias token ids are below it (0: not checked)
    request_bounds bounds;              // messages, tools, schemas (warmctx/server.h)
};

enum class api_shape { chat, text };    // chat.completion vs text_completion

struct completion_request {
    api_shape shape = api_shape::chat;
    std::string workspace;              // "" = not named (derive_workspace)
    bool workspace_from_cache_key = false;  // named by prompt_cache_key, not `workspace`
    std::vector<segment> segments;      // messages mapping, then the `segments` extension
    sampling_params sampling;
    bool stream = false;
    bool include_usage = false;         // stream_options.include_usage
    bool raw = false;                   // /v1/completions: the prompt as given, no template
    std::optional<std::string> suffix;  // /v1/completions: fill-in-the-middle
    // Tools: the `tools` array as canonical JSON text ("" = none), tool_choice (a named
    // function is `required` of that one), parallel_tool_calls (OpenAI's default: true).
    std::string tools_json;
    tool_choice_mode tool_choice = tool_choice_mode::auto_;
    std::string tool_choice_name;
    bool parallel_tool_calls = true;
    // response_format json_schema: the schema as JSON text ("" = none).
    std::string json_schema;
    // cache_salt: this request's blocks are shared only with requests of the same salt.
    std::string cache_salt;
    // The last message was the assistant's text: the answer continues it (a prefill).
    std::string continuation;
    std::string continuation_param;  // that message, as the request named it ("messages[3]")
};

// What the body of each route must carry.
enum class body_mode {
    chat,            // /v1/chat/completions: `messages` required
    workspace_chat,  // /v1/workspaces/{id}/chat/completions: `messages` or `segments`
    text,            // /v1/completions: `prompt` required
};

// Parses a request body (already valid JSON) into `out`. Unknown fields are ignored
// (clients send many); known fields of the wrong type or out of range are a 400 naming
// the field, and so are known fields this server does not implement yet (a
// response_format other than text, a tool_choice other than auto/none, a completion's
// echo/best_of). logprobs/top_logprobs set sampling.n_logprobs. Sampling defaults: max_tokens to the end of the
// context (limits.default_max_tokens when set), temperature 1 (OpenAI's), top_p 1, a
// random seed when none is given; presence_penalty, frequency_penalty and logit_bias
// go to the sampler.
maybe_error parse_completion_request(const nlohmann::json & body, body_mode mode,
                                     const request_limits & limits, completion_request & out);

// The messages mapping of the header comment. `tools` may be null (absent). The
// message count and the tools (count, canonical bytes) are checked against `bounds`
// first, before anything is copied.
// A last message that is the assistant's text (no tool calls) is not a segment: its text
// goes to `continuation` (when given), for the model to continue, as llama-server does.
maybe_error map_messages(const nlohmann::json & messages, const nlohmann::json * tools,
                         std::vector<segment> & out, const request_bounds & bounds = {},
                         std::string * continuation = nullptr);

// A JSON schema (a tool's parameters, response_format's schema) against the bounds,
// before llama.cpp's converter sees it: enum values (counted into `tally`, over every
// schema of a request) at most bounds.max_enum_values, each pattern at most
// max_pattern_bytes long and max_pattern_nesting deep, anyOf/oneOf alternatives (counted
// into `tally`) at most max_schema_alternatives, each object at most
// max_optional_properties properties not `required`, and each $ref a pointer into the
// schema itself that resolves (a remote one, or a chain of references that comes back to
// itself, would be converted to "any value"). A 400 naming `param` and the bound.
struct schema_tally {
    size_t enum_values = 0;
    size_t alternatives = 0;  // anyOf / oneOf
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

// ---- responses -------------------------------------------------------------------

// "stop" for stop/eos, "length" for length/context_full.
std::string_view openai_finish_reason(finish_reason r);

nlohmann::json usage_json(const completion_usage & u);
nlohmann::json segment_json(const segment & s);

// Time the HTTP thread spent on a request before handing it to the scheduler.
struct request_timings {
    double assemble_ms = 0;     // rendering and tokenizing the prompt, hashing its blocks
    double answer_wait_ms = 0;  // after that, waiting for the tools' or schema's grammar
                                // (built meanwhile on another thread)
    double request_ms = 0;      // arrival .. handed to the scheduler, all of it
};

// The `warmctx` extension object of a response: what reuse did for this request.
nlohmann::json warmctx_json(const std::string & workspace, const explain_report & ex,
                            const completion_event & done, const request_timings & rt);

struct response_meta {
    std::string id;         // "chatcmpl-..." / "cmpl-..."
    int64_t created = 0;    // unix seconds
    std::string model;
    api_shape shape = api_shape::chat;
};

// The `logprobs` object of a choice: chat {"content": [{token, logprob, bytes,
// top_logprobs}]}, text {tokens, token_logprobs, top_logprobs, text_offset} (text_offset
// counted from `offset`, the bytes of text before these tokens).
nlohmann::json logprobs_json(api_shape shape, const std::vector<token_logprobs> & lps, size_t offset = 0);

// A whole non-streamed response (`logprobs`: the choice's, null when not asked). With
// `parsed` (a chat answer parsed by the template's tool-call format) the message carries
// its content (null when there are calls and no text), `tool_calls` and
// `reasoning_content`, and finish_reason is "tool_calls" when it called any.
nlohmann::json completion_response(const response_meta & m, const std::string & text,
                                   finish_reason finish, const completion_usage & usage,
                                   nlohmann::json warmctx_ext, nlohmann::json logprobs = nullptr,
                                   const parsed_answer * parsed = nullptr);

// A parsed call in OpenAI's shape: {"id","type":"function","function":{"name","arguments"}}
// (`index` added for a streamed delta when index >= 0).
nlohmann::json tool_call_json(const parsed_tool_call & c, int index = -1);
// A chunk of reasoning (delta.reasoning_content, as llama-server streams a thinking model's).
nlohmann::json chunk_reasoning(const response_meta & m, const std::string & text, bool include_usage);
// A streamed chat delta of tool-call fragments: {"tool_calls":[{index, id?, type?,
// function:{name?, arguments}}]} - `calls` already in that shape.
nlohmann::json chunk_tool_calls(const response_meta & m, nlohmann::json calls, bool include_usage);

// Streamed chunks (the JSON after "data: "). `include_usage` adds "usage": null to
// each, as OpenAI does when stream_options.include_usage is set.
nlohmann::json chunk_role(const response_meta & m, bool include_usage);  // chat only
nlohmann::json chunk_delta(const response_meta & m, const std::string & text, bool include_usage,
                           nlohmann::json logprobs = nullptr);
nlohmann::json chunk_finish(const response_meta & m, finish_reason finish, bool include_usage,
                            nlohmann::json warmctx_ext, bool tool_calls = false);
nlohmann::json chunk_usage(const response_meta & m, const completion_usage & usage);

}  // namespace warmctx::server_detail
