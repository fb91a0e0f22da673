// warmctx/agent_trace.h - seeded multi-workspace coding-agent traces.
//
// A trace is what several coding agents, each in its own repository, send an engine
// over a working day, in one interleaved order:
//   - each workspace has a stable context of its own size: system prompt, tool
//     schemas, repository rules, pinned source files and a repository map;
//   - every turn picks a workspace with Zipf-distributed popularity (workspace k is
//     chosen with probability proportional to 1 / (k + 1)^s) and sends the stable
//     context plus a fresh diff, fresh test output and a new question;
//   - now and then (edit_prob per turn) one stable segment of the chosen workspace
//     changes - a line of the repository map or of a pinned file - and stays changed.
// The same options and token counter always give the same trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "warmctx/segments.h"
#include "warmctx/status.h"
#include "warmctx/workload.h"

namespace warmctx {

struct agent_trace_options {
    uint64_t seed = 1;
    int n_workspaces = 6;
    int n_turns = 60;
    double zipf_s = 1.1;
    size_t stable_tokens = 4096;   // mean stable context; workspaces range over 0.5x..1.5x
    double edit_prob = 0.05;       // chance per turn of a stable-segment edit
    size_t tail_tokens = 300;      // mean diff + test output per turn
};

struct trace_turn {
    int workspace = 0;             // index into agent_trace::workspace_ids
    int nth = 0;                   // this workspace's turn number, from 0
    std::string edited;            // id of the stable segment changed this turn ("" = none)
    std::vector<segment> segments; // the whole request: stable context + tail + question
};

struct agent_trace {
    std::vector<std::string> workspace_ids;     // "ws-0", "ws-1", ...
    std::vector<size_t> stable_tokens;          // each workspace's stable target size
    std::vector<trace_turn> turns;
};

// Errors: invalid_argument (no workspaces or turns, zipf_s < 0, edit_prob outside
// [0, 1], stable_tokens < 256).
result<agent_trace> make_agent_trace(const agent_trace_options & o, const token_counter & count);

}  // namespace warmctx
