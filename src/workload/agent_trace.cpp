#include "workload/agent_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace warmctx {
namespace {

std::string joined(const std::vector<segment> & segs, size_t from, size_t to) {
    std::string out;
    for (size_t i = from; i < to; ++i) {
        if (!out.empty()) out += "\n\n";
        out += segs[i].content;
    }
    return out;
}

// An assistant's answer to a turn: a sentence and a one-hunk patch.
std::string answer(workload_generator & g) {
    return "The value is used before it is checked. This change checks it first:\n\n" + g.diff("src/pinned_0.cc", 1);
}

}  // namespace

std::vector<trace_message> trace_chat_messages(const trace_turn & turn) {
    std::vector<trace_message> out;
    const size_t n = turn.segments.size();
    const size_t h0 = std::min(turn.n_stable, n), h1 = std::min(h0 + turn.n_history, n);
    out.push_back({"system", joined(turn.segments, 0, h0)});
    for (size_t i = h0; i < h1; ++i)
        out.push_back({turn.segments[i].role.empty() ? "user" : turn.segments[i].role, turn.segments[i].content});
    out.push_back({"user", joined(turn.segments, h1, n)});
    return out;
}

result<agent_trace> make_agent_trace(const agent_trace_options & o, const token_counter & count) {
    if (o.n_workspaces < 1 || o.n_workspaces > 1000) return invalid_argument("workspaces must be in [1, 1000]");
    if (o.n_turns < 1) return invalid_argument("turns must be at least 1");
    if (!(o.zipf_s >= 0)) return invalid_argument("the Zipf exponent must be >= 0");
    if (!(o.edit_prob >= 0 && o.edit_prob <= 1)) return invalid_argument("edit probability must be in [0, 1]");
    if (o.stable_tokens < 256) return invalid_argument("stable tokens must be at least 256");
    if (o.history_window < -1) return invalid_argument("the history window must be -1 (all), 0 (none) or a count");

    std::mt19937_64 rng(o.seed);
    agent_trace t;
    std::vector<std::vector<segment>> stable;        // per workspace, without the question
    std::vector<workload_generator> gens;
    gens.reserve((size_t)o.n_workspaces);
    for (int w = 0; w < o.n_workspaces; ++w) {
        gens.emplace_back(o.seed * 0x9e3779b97f4a7c15ull + (uint64_t)w + 1, count);
        // Sizes spread evenly over 0.5x..1.5x the mean, shuffled so size and
        // popularity are independent.
        const double f = o.n_workspaces == 1 ? 1.0 : 0.5 + (double)w / (o.n_workspaces - 1);
        t.stable_tokens.push_back((size_t)((double)o.stable_tokens * f));
    }
    std::shuffle(t.stable_tokens.begin(), t.stable_tokens.end(), rng);
    for (int w = 0; w < o.n_workspaces; ++w) {
        t.workspace_ids.push_back("ws-" + std::to_string(w));
        auto segs = make_workspace(gens[(size_t)w], t.stable_tokens[(size_t)w], 1 + (int)(rng() % 3));
        segs.pop_back();  // the question; each turn brings its own
        stable.push_back(std::move(segs));
    }

    std::vector<double> cdf((size_t)o.n_workspaces);
    double sum = 0;
    for (int k = 0; k < o.n_workspaces; ++k) cdf[(size_t)k] = (sum += 1.0 / std::pow(k + 1.0, o.zipf_s));
    std::uniform_real_distribution<double> u(0, sum);
    std::uniform_real_distribution<double> u01(0, 1);
    std::vector<int> nth((size_t)o.n_workspaces, 0);
    // Each workspace's conversation so far (history_window != 0): kind history segments.
    std::vector<std::vector<segment>> history((size_t)o.n_workspaces);

    for (int i = 0; i < o.n_turns; ++i) {
        const double x = u(rng);
        const int w = (int)std::min<size_t>(std::lower_bound(cdf.begin(), cdf.end(), x) - cdf.begin(), cdf.size() - 1);
        auto & g = gens[(size_t)w];
        trace_turn turn;
        turn.workspace = w;
        turn.nth = nth[(size_t)w]++;
        if (turn.nth > 0 && u01(rng) < o.edit_prob) {
            // An edit to the repo map or a pinned file (never system, tools or rules).
            std::vector<size_t> editable;
            for (size_t s = 0; s < stable[(size_t)w].size(); ++s) {
                auto k = stable[(size_t)w][s].kind;
                if (k == segment_kind::repo_map || k == segment_kind::pinned_file) editable.push_back(s);
            }
            if (!editable.empty()) {
                auto & seg = stable[(size_t)w][editable[rng() % editable.size()]];
                seg.content = g.edit_one_line(seg.content);
                turn.edited = seg.id;
            }
        }
        turn.segments = stable[(size_t)w];
        turn.n_stable = turn.segments.size();
        if (o.history_window != 0) {
            const auto & h = history[(size_t)w];
            turn.history_available = h.size();
            const size_t keep = o.history_window < 0 ? h.size() : std::min(h.size(), (size_t)o.history_window);
            turn.segments.insert(turn.segments.end(), h.end() - (std::ptrdiff_t)keep, h.end());
            turn.n_history = keep;
        }
        // The tail: a diff and test output of varying size, then the question.
        const size_t tail = o.tail_tokens / 2 + rng() % (o.tail_tokens + 1);
        const int hunks = std::max(1, (int)(tail * 2 / 3 / 60));
        const int failures = std::max(1, (int)(tail / 3 / 40));
        turn.segments.push_back({"diff", segment_kind::diff, "", "", g.diff("src/pinned_0.cc", hunks)});
        turn.segments.push_back({"tests", segment_kind::test_output, "", "", g.test_output(failures)});
        turn.segments.push_back({"question", segment_kind::user, "", "", g.question()});
        if (o.history_window != 0) {
            // This turn's user message and an answer join the conversation.
            auto & h = history[(size_t)w];
            const size_t tail_from = turn.n_stable + turn.n_history;
            for (const auto & [role, content] :
                 {std::pair<std::string, std::string>{"user", joined(turn.segments, tail_from, turn.segments.size())},
                  {"assistant", answer(g)}}) {
                char id[32];
                std::snprintf(id, sizeof id, "h%06zu", h.size());
                segment s;
                s.id = id;
                s.kind = segment_kind::history;
                s.role = role;
                s.content = content;
                h.push_back(std::move(s));
            }
        }
        t.turns.push_back(std::move(turn));
    }
    return t;
}

}  // namespace warmctx
