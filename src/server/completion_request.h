// server/completion_request.h - what every API's request becomes (a completion_request,
// under the server's request_limits) and what every API's answer carries beside its text
// (response_meta, the `warmctx` extension object). No API's shapes: those are under
// src/server/api/<api>/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "warmctx/context_engine.h"
#include "warmctx/scheduler.h"
#include "warmctx/segments.h"
#include "warmctx/server.h"

namespace warmctx::server_detail {

inline constexpr size_t k_max_messages = 10000;     // history ids are h0000..h9999
inline constexpr size_t k_max_stop_strings = 16;
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

// Time the HTTP thread spent on a request before handing it to the scheduler.
struct request_timings {
    double assemble_ms = 0;     // rendering and tokenizing the prompt, hashing its blocks
    double answer_wait_ms = 0;  // after that, waiting for the tools' or schema's grammar
                                // (built meanwhile on another thread)
    double request_ms = 0;      // arrival .. handed to the scheduler, all of it
};

// What reuse did for a request and where its time went, as the engine and the HTTP thread
// measured them: what every API's answer carries beside its text. Renderers read it
// natively (Anthropic's cache_creation_input_tokens is explain.n_cacheable) and write it
// as the `warmctx` extension object with warmctx_json.
struct answer_report {
    std::string workspace;
    explain_report explain;
    draft_counters drafts;   // what drafts from the workspace did for this answer
    // The scheduler's timings of the job (completion_event's, same names).
    double t_queue_ms = 0, t_first_token_ms = 0, t_total_ms = 0;
    double t_assemble_ms = 0, t_restore_ms = 0, t_copy_ms = 0, t_prefill_ms = 0, t_checkpoint_ms = 0;
    double t_write_back_ms = 0, t_lookup_ms = 0, t_sampler_ms = 0, t_interleave_ms = 0;
    uint32_t n_decode_steps = 0;  // after the first token (completion_event's)
    double t_decode_step_ms = 0, t_sample_ms = 0, t_finish_ms = 0;
    int64_t n_generated = 0;  // the answer's tokens (its decode rate)
    request_timings rt;      // the HTTP thread's
};
// The report of a job that ended with `done` (its explain, drafts and timings).
answer_report report_of(const std::string & workspace, const completion_event & done, const request_timings & rt);

// What reuse did for a turn, by its tokens: "warm" (every cacheable token reused), "partial"
// (some), "cold" (none) - whatever the miss kind says of why it stopped.
const char * reuse_result(const explain_report & ex);

// The `warmctx` extension object of a response.
nlohmann::json warmctx_json(const answer_report & r);

struct response_meta {
    std::string id;         // "chatcmpl-..." / "cmpl-..."
    int64_t created = 0;    // unix seconds
    std::string model;
    api_shape shape = api_shape::chat;
};

}  // namespace warmctx::server_detail
