// server/api/ollama/ollama.h - the Ollama API, for the editors and tools that speak it
// (VS Code's Ollama provider, Open WebUI, Continue, the `ollama` client libraries):
// POST /api/chat, /api/generate, /api/show; GET /api/tags, /api/ps, /api/version
// (docs/api.md, "The Ollama API").
//
// /api/chat and /api/generate are request mappers and a renderer on the one completion
// path: the body becomes the OpenAI body it means (a JSON value the OpenAI mapper then
// validates, so every route accepts and refuses alike), and errors name Ollama's fields:
//
//   Ollama                              OpenAI
//   messages[].content, role            messages[] (images: refused, a text model)
//   messages[].tool_calls[].function    tool_calls (arguments as an object, ids made up)
//   tools                               tools
//   format "json" | {schema}            response_format json_object | json_schema
//   options.num_predict (-1, -2: none)  max_tokens
//   options.temperature, top_k, top_p, seed, stop, presence_penalty, frequency_penalty
//   think false                         reasoning_budget_tokens 0 (true, "high", ...: the default)
//   logprobs, top_logprobs              logprobs, top_logprobs
//   stream (default true)               stream
//   keep_alive, other options           ignored: the model stays loaded, its settings are the server's
//   /api/generate prompt, system        a system and a user message (raw: the prompt as text)
//   /api/generate template, context     refused (400 naming the field), never ignored
//
// The answer is Ollama's: {model, created_at, message {role, content, thinking,
// tool_calls} (generate: response, thinking), done, done_reason ("stop", "length"),
// total_duration, load_duration, prompt_eval_count, prompt_eval_duration, eval_count,
// eval_duration (nanoseconds)} and the `warmctx` object; streamed, one JSON object per
// line (application/x-ndjson), the last with "done": true. Errors are {"error": message}.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "../../api_error.h"
#include "../../completion_request.h"
#include "warmctx/engine.h"

namespace warmctx::server_detail {

// What the renderer needs to know of an Ollama request.
struct ollama_request_info {
    bool generate = false;  // /api/generate: "response", not "message"
    std::string model;      // as the request named it (Ollama answers with the request's name)
};

// An /api/chat body -> the OpenAI chat body it means. `load_only`: no messages, nothing to
// generate (Ollama loads the model and answers done_reason "load").
maybe_error ollama_chat_to_openai(const nlohmann::json & body, nlohmann::json & chat_body, bool & load_only,
                                  ollama_request_info & info);

// An /api/generate body -> the OpenAI chat body it means (`mode` chat), or with "raw": true
// the text completion body (`mode` text). `load_only`: the prompt is empty, nothing to
// generate (Ollama loads the model and answers done_reason "load").
maybe_error ollama_generate_to_openai(const nlohmann::json & body, nlohmann::json & out, body_mode & mode,
                                      bool & load_only, ollama_request_info & info);

// An error the OpenAI mapper gave, its param and message in Ollama's field names.
void openai_error_to_ollama(api_error & e);

// {"error": message}.
nlohmann::json ollama_error_json(const api_error & e);

// Now, as Ollama writes times (RFC 3339, UTC, microseconds).
std::string ollama_time_now();
// A file time (seconds since the epoch) in the same format.
std::string ollama_time(int64_t unix_seconds);

// The model's "details" object: format, family, parameter size, quantization.
nlohmann::json ollama_model_details(const model_info & m);

}  // namespace warmctx::server_detail
