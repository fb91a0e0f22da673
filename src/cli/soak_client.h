// warmctx-bench soak's clients: what each sends (the request mix, with weights), and what
// it counts of the answers. cmd_bench_soak.cpp starts the server, runs the clients, and
// judges and reports what they counted.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"

namespace warmctx::cli::soak {

struct soak_args {
    model_flags mf;
    cache_flags cf;
    int clients = 64;
    double duration_s = 600;
    double sample_s = 10;
    int setups = 16;           // agent set-ups: distinct system prompts (+ tools)
    int segment_workspaces = 16;
    int large_prompt_tokens = 3000;
    int think_ms = 50;         // a client waits 0..think_ms between requests
    uint32_t parallel = 4;
    size_t queue = 256;
    uint32_t holders = 8;
    uint64_t seed = 1;
    bool json_out = false;
};

// What the clients send. Weights are per mille of a client's picks.
enum class req_type {
    chat,
    chat_stream,
    chat_segments,
    workspace_chat,
    large_prompt,
    abandoned,
    workspace_api,
    bad_request,
    monitoring
};
inline constexpr int k_n_types = 9;
inline constexpr const char * k_type_names[k_n_types] = {"chat",           "chat_stream",  "chat_segments",
                                                         "workspace_chat", "large_prompt", "abandoned",
                                                         "workspace_api",  "bad_request",  "monitoring"};
inline constexpr const char * k_type_what[k_n_types] = {
    "chat completion, not streamed, an agent set-up's system prompt (+ tools) and 0-3 earlier turns",
    "the same, streamed, read to [DONE]",
    "chat with a `workspace` and `segments` (instructions, repo map, diff, test output), streamed or not",
    "chat on the client's own stored segments (workspace API) plus a diff, streamed or not",
    "chat with a pinned file of thousands of tokens (one of three shared files, or a new one)",
    "streamed chat left after 1-3 events, or a non-streamed one left by a 50 ms client timeout",
    "the client's own workspace: PUT/GET/DELETE segments, manifest, explain, pin+unpin, branch, DELETE",
    "each must get its 4xx: bad JSON, bad UTF-8, unknown role, bad workspace id, two user segments, n=2, "
    "bad temperature, a prompt over the context, a stored user segment, a missing segment, 404 and 405 routes",
    "GET /health, /metrics, /v1/models",
};
inline constexpr int k_weights[k_n_types] = {230, 180, 140, 100, 20, 80, 130, 80, 40};

struct outcome {
    int status = 0;             // 0: no response
    bool conn_error = false;    // no response, and one was due
    bool abandoned = false;     // the client left on purpose
    bool stream_error = false;  // a 200 stream with an error event, or without [DONE]
    bool unexpected = false;    // an answer other than the one this request must get
    double ms = 0;
    int prompt_tokens = 0;
    std::string note;           // what went wrong
};

struct type_tally {
    uint64_t n = 0, conn_errors = 0, abandoned = 0, stream_errors = 0, unexpected = 0;
    std::map<std::string, uint64_t> by_class;
    std::vector<double> ms;     // every answered request
    int max_prompt_tokens = 0;
};

struct client_tally {
    type_tally types[k_n_types];
    std::vector<nlohmann::json> failures;  // the first few, for the report
};

inline constexpr size_t k_max_failures_kept = 20;

// Whether one more failure is kept: answers with the wrong status stop at
// k_max_failures_kept, so that a flood of them (429s against a small queue) leaves room
// for what matters more, a request with no answer or a broken stream (status 0 or a
// stream error), which may fill the list to twice that.
inline bool keep_failure(size_t kept, bool no_answer_or_broken) {
    return kept < (no_answer_or_broken ? 2 * k_max_failures_kept : k_max_failures_kept);
}

// Code-like text of about `n_tokens` tokens (~14 tokens a line with the Qwen2 tokenizer),
// distinct for each `salt`.
std::string code_text(uint64_t salt, int n_tokens);

// Client `id` sends requests to 127.0.0.1:`port` until `deadline`, picking each at random
// (seeded by a.seed and id) by k_weights, and counts the answers into `out`. `large_files`
// are the large prompts' shared files.
void run_client(int id, int port, const soak_args & a, const std::vector<std::string> & large_files,
                std::chrono::steady_clock::time_point deadline, client_tally & out);

}  // namespace warmctx::cli::soak
