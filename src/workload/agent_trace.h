// workload/agent_trace.h - seeded multi-workspace coding-agent traces.
//
// A trace is what several coding agents, each in its own repository, send an engine
// over a working day, in one interleaved order:
//   - each workspace has a stable context of its own size: system prompt, tool
//     schemas, repository rules, pinned source files and a repository map;
//   - every turn picks a workspace with Zipf-distributed popularity (workspace k is
//     chosen with probability proportional to 1 / (k + 1)^s) and sends the stable
//     context plus a fresh diff, fresh test output and a new question;
//   - now and then (edit_prob per turn) one stable segment of the chosen workspace
//     changes - a line of the repository map or of a pinned file - and stays changed;
//   - with a history window, each workspace also keeps a conversation: every turn's user
//     message (its diff, test output and question) and an assistant answer are appended
//     to it, and each later turn carries the last history_window messages of it (the
//     window slides, as agents that keep the last N messages do); -1 carries all of it.
// The same options and token counter always give the same trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "warmctx/segments.h"
#include "warmctx/status.h"
#include "workload/workload.h"

namespace warmctx {

struct agent_trace_options {
    uint64_t seed = 1;
    int n_workspaces = 6;
    int n_turns = 60;
    double zipf_s = 1.1;
    size_t stable_tokens = 4096;   // mean stable context; workspaces range over 0.5x..1.5x
    double edit_prob = 0.05;       // chance per turn of a stable-segment edit
    size_t tail_tokens = 300;      // mean diff + test output per turn
    // Earlier messages of the workspace's conversation each turn carries: 0 = none (the
    // trace as it always was: stable context + tail + question), N > 0 = the last N
    // (fewer while the conversation is shorter), -1 = all of them.
    int history_window = 0;
};

// One chat message of a turn as a plain OpenAI client sends it.
struct trace_message {
    std::string role;              // "system", "user" or "assistant"
    std::string content;
};

struct trace_turn {
    int workspace = 0;             // index into agent_trace::workspace_ids
    int nth = 0;                   // this workspace's turn number, from 0
    std::string edited;            // id of the stable segment changed this turn ("" = none)
    std::vector<segment> segments; // the whole request: stable context, then the history
                                   // window, then the tail (diff, test output) and question
    size_t n_stable = 0;           // segments[0, n_stable) are the stable context
    size_t n_history = 0;          // segments[n_stable, n_stable + n_history): the history
                                   // window, oldest first; kind history, role user or
                                   // assistant, id "h" + the message's 6-digit index in
                                   // the workspace's conversation
    size_t history_available = 0;  // messages the conversation had before this turn
};

// The turn as a plain OpenAI chat: one system message (the stable segments' contents in
// order, joined by blank lines), the history window as user/assistant messages, then one
// user message (the diff, the test output and the question, joined by blank lines: the
// same text the next turns' history carries for this turn).
std::vector<trace_message> trace_chat_messages(const trace_turn & turn);

struct agent_trace {
    std::vector<std::string> workspace_ids;     // "ws-0", "ws-1", ...
    std::vector<size_t> stable_tokens;          // each workspace's stable target size
    std::vector<trace_turn> turns;
};

// Errors: invalid_argument (no workspaces or turns, zipf_s < 0, edit_prob outside
// [0, 1], stable_tokens < 256, history_window < -1).
result<agent_trace> make_agent_trace(const agent_trace_options & o, const token_counter & count);

}  // namespace warmctx
