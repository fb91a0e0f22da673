// server/answer_build.h - the answer's format (the grammar of the tools or of a JSON
// schema, its triggers, the parser) and the sampling it makes, built on a grammar_builds
// thread while the request's own thread assembles the prompt, and the request's wait for
// it: a deadline (server_options::grammar_deadline_ms), its client leaving, the server
// stopping. The build owns copies of what it reads: a request that stops waiting leaves it
// to finish on its own (llama.cpp's converter cannot be interrupted; the request bounds
// keep it short).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

#include "api_error.h"
#include "completion_request.h"
#include "route_context.h"
#include "warmctx/chat_template.h"
#include "warmctx/scheduler.h"

namespace warmctx::server_detail {

// The client left a request that is not streamed: its job is cancelled, and the log and
// metrics say 499 (nobody reads the answer).
api_error client_gone_error();

// The format's grammar, triggers, reasoning markers and stops, into the sampling.
void apply_answer_format(answer_format & af, sampling_params & s);

struct answer_ready {
    answer_format af;                      // the parser (its grammar moved into `sampling`)
    sampling_params sampling;              // the request's, with the format applied
    std::unique_ptr<generation_step> gen;  // null: made at admission (which reports its error)
    size_t grammar_bytes = 0;              // the grammar as built; over the bound: no sampler was made
};

struct answer_build {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<result<answer_ready>> out;  // guarded by mu; set once
    bool skipped = false;                     // guarded by mu: the pool stopped before it ran
    std::shared_ptr<std::atomic<bool>> abandoned = std::make_shared<std::atomic<bool>>(false);
};

// Starts the build of cr's answer format (with_tools: its tools' grammar, through `ct`).
std::shared_ptr<answer_build> start_answer_format(route_context & ctx, const completion_request & cr,
                                                  const chat_templates * ct, bool with_tools);

// Waits for the build: its result; or, when the deadline passes, the client leaves or the
// server stops first, an error status with `refusal` set to the answer (the build is then
// abandoned: one that has not started is skipped).
result<answer_ready> wait_answer_format(route_context & ctx, const http_request & req, answer_build & b,
                                        steady::time_point deadline, maybe_error & refusal);

}  // namespace warmctx::server_detail
