// server/completion.h - the one completion path: every API's request, once mapped to a
// completion_request, runs here; what the client receives is a renderer's business.
//
//   request mapper (per API)     body -> completion_request         api/<api>/request.cpp
//                                (completion_request.h)
//   serve_completion (here)      merge the workspace's stored segments, validate, build
//                                the answer's grammar (beside the prompt's assembly),
//                                submit, wait; then one loop turns the engine's events
//                                into an answer's text, tool calls and end
//   renderer (per API)           the answer -> a whole body or the stream's bytes
//                                api/openai/render.cpp (chat, text completions),
//                                api/responses/render.cpp (Responses),
//                                api/anthropic/render.cpp (Anthropic Messages)
//
// Adding an API is adding a folder api/<api>/ with a request mapper, a renderer and its
// routes. A renderer is pure: it sees
// no channel, no scheduler and no socket, only what the answer is so far.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "completion_request.h"
#include "route_context.h"

namespace warmctx::server_detail {

// A fragment of a tool call in a streamed answer: its head (id and name, the first time
// the call is seen) and bytes of arguments.
struct call_fragment {
    size_t index = 0;
    bool head = false;        // the call's first fragment: id and name are set
    std::string id, name;
    std::string arguments;    // new argument bytes ("" = none)
};

// What an answer grew by, once: new text and new call fragments. `logprobs` (the text's
// tokens', when asked for and the text is not parsed for calls) and `text_offset` (the
// answer's bytes before this text).
struct answer_delta {
    std::string text;
    std::string reasoning;  // new reasoning text (a template whose answers reason)
    const std::vector<token_logprobs> * logprobs = nullptr;
    size_t text_offset = 0;
    std::vector<call_fragment> calls;
};

// How an answer ended: the engine's finish, whether it called a tool (and was not cut
// short), its usage, and what reuse did and where the time went (each renderer writes
// the `warmctx` extension object from it: warmctx_json).
struct answer_end {
    finish_reason finish = finish_reason::stop;
    bool tool_calls = false;
    completion_usage usage;
    answer_report report;
};

// A whole answer (not streamed): the text as generated, its parse when the answer has a
// tool-call format (calls already named, incomplete ones dropped), and its logprobs
// (null when not asked).
struct whole_answer {
    const std::string & text;
    const parsed_answer * parsed = nullptr;
    nlohmann::json logprobs;
    answer_end end;
};

// One API's output. The completion path calls begin() once, when the response's id is
// known; then either whole() or, for a stream, open(), any number of waiting() and
// delta(), and one finish() or stream_error().
class renderer {
  public:
    virtual ~renderer() = default;
    // The response's identity (meta.id also names the calls) and the request it answers.
    virtual void begin(const response_meta & meta, const completion_request & cr) = 0;
    // The HTTP error before any output (the default: OpenAI's shape, through respond_error).
    virtual void error_response(http_response & res, request_log & log, api_error e);

    virtual nlohmann::json whole(const whole_answer & a) = 0;

    // The stream's media type: server-sent events, or Ollama's JSON lines.
    virtual const char * stream_content_type() const { return "text/event-stream"; }
    // Stream bytes (an empty string writes nothing). open(): at once, before any token
    // (the headers go with it).
    virtual std::string open() = 0;
    // Nothing to send for a while (queued, prefilling): `comment` is the SSE comment that
    // keeps the connection alive (": keep-alive[ prefill P/N]\n\n").
    virtual std::string waiting(const std::string & comment) { return comment; }
    virtual std::string delta(const answer_delta & d) = 0;
    virtual std::string finish(const answer_end & e) = 0;
    // The job failed after the headers went out: the error travels in the stream.
    virtual std::string stream_error(const api_error & e) = 0;
};

// An OpenAI chat or text body (as sent, or the one another API's body means) into `cr`,
// under the server's request limits and bounds (warmctx/server.h): every completion route
// maps through it, so they accept and refuse alike.
maybe_error parse_completion(const route_context & ctx, const nlohmann::json & body, body_mode mode,
                             completion_request & cr);

// Runs `cr` and answers it with `r`: prepares (path_ws: a /v1/workspaces/{id}/... path's
// workspace, validated; its stored segments are merged in), submits, and answers whole
// or streamed. Every error is answered through r.error_response / r.stream_error.
void serve_completion(route_context & ctx, const http_request & req, http_response & res,
                      const std::shared_ptr<request_log> & log, completion_request cr, const std::string * path_ws,
                      std::shared_ptr<renderer> r);

// The renderers of the OpenAI shapes (api/openai/render.cpp): chat.completion(.chunk) and
// text_completion, as cr.shape says.
std::shared_ptr<renderer> make_openai_renderer();

// The Responses renderer (api/responses/render.cpp): a `response` object, or its stream
// events; errors name the Responses field a translated chat field came from.
struct responses_request_info;
std::shared_ptr<renderer> make_responses_renderer(std::shared_ptr<const responses_request_info> info);

// The Anthropic Messages renderer (api/anthropic/render.cpp): a `message`, or its stream
// events; errors in Anthropic's shape.
struct anthropic_request_info;
std::shared_ptr<renderer> make_anthropic_renderer(std::shared_ptr<const anthropic_request_info> info);

// The Ollama renderer (api/ollama/render.cpp): /api/chat's and /api/generate's answers,
// whole or as JSON lines; errors in Ollama's shape.
struct ollama_request_info;
std::shared_ptr<renderer> make_ollama_renderer(ollama_request_info info);

// The llama-server renderer (api/llama_server/render.cpp): /completion's answer, whole
// or streamed, in llama-server's shape.
std::shared_ptr<renderer> make_llama_server_renderer();

}  // namespace warmctx::server_detail
