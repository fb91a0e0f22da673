// server/api/llama_server/llama_server.h - llama.cpp's own server routes, for the scripts and
// tools written against llama-server: POST /completion (and /completions), /tokenize,
// /detokenize, /apply-template, GET /props and /slots, with its request and response
// shapes (docs/api.md, "llama-server's routes").
//
// /completion is a request mapper and a renderer on the one completion path: its body
// becomes the /v1/completions request it means (a JSON value, which the OpenAI mapper then
// validates, so both routes accept and refuse alike):
//
//   /completion                 /v1/completions
//   prompt (string, [string])   prompt (raw text, no template)
//   n_predict (-1: no limit)    max_tokens
//   temperature, top_k, top_p, seed, stop, presence_penalty, frequency_penalty, stream: the same
//   cache_prompt, id_slot, ...  ignored: every prompt is cached
//   prompt as token ids, grammar, json_schema: refused (400 naming the field), never ignored
//
// The answer is llama-server's: {content, stop, model, tokens_predicted, tokens_evaluated,
// tokens_cached, stop_type ("eos", "word", "limit"), stopping_word, truncated, timings
// {prompt_n, prompt_ms, ..., predicted_n, predicted_ms, ...}} and the `warmctx` object;
// streamed, one `data: {"content", "stop": false}` event per piece, then that whole object
// with "stop": true.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../api_error.h"
#include "../../completion_request.h"

namespace warmctx::server_detail {

// A /completion body -> the /v1/completions body it means.
maybe_error completion_to_openai(const nlohmann::json & body, nlohmann::json & text_body);

// /tokenize: {content, add_special (false), parse_special (true), with_pieces (false)}.
struct tokenize_request {
    std::string content;
    bool add_special = false;
    bool parse_special = true;
    bool with_pieces = false;
};
maybe_error parse_tokenize(const nlohmann::json & body, tokenize_request & out);
// /detokenize: {tokens: [ids]}.
maybe_error parse_detokenize(const nlohmann::json & body, std::vector<token_id> & out);

// The timings llama-server reports, from an answer's report and usage.
nlohmann::json llama_timings_json(const answer_report & r, const completion_usage & u);

}  // namespace warmctx::server_detail
