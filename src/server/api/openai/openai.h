// server/api/openai/openai.h - OpenAI request bodies -> native types, and native results -> the
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

#include "../../api_error.h"
#include "../../completion_request.h"
#include "../../segments_json.h"
#include "warmctx/conversation.h"
#include "warmctx/context_engine.h"
#include "warmctx/scheduler.h"
#include "warmctx/segments.h"
#include "warmctx/server.h"

namespace warmctx::server_detail {

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

// ---- responses -------------------------------------------------------------------

// "stop" for stop/eos, "length" for length/context_full.
std::string_view openai_finish_reason(finish_reason r);

nlohmann::json usage_json(const completion_usage & u);


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
