#include "warmctx/agent_trace.h"

#include <algorithm>
#include <cmath>

namespace warmctx {

result<agent_trace> make_agent_trace(const agent_trace_options & o, const token_counter & count) {
    if (o.n_workspaces < 1 || o.n_workspaces > 1000) return invalid_argument("workspaces must be in [1, 1000]");
    if (o.n_turns < 1) return invalid_argument("turns must be at least 1");
    if (!(o.zipf_s >= 0)) return invalid_argument("the Zipf exponent must be >= 0");
    if (!(o.edit_prob >= 0 && o.edit_prob <= 1)) return invalid_argument("edit probability must be in [0, 1]");
    if (o.stable_tokens < 256) return invalid_argument("stable tokens must be at least 256");

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
        // The tail: a diff and test output of varying size, then the question.
        const size_t tail = o.tail_tokens / 2 + rng() % (o.tail_tokens + 1);
        const int hunks = std::max(1, (int)(tail * 2 / 3 / 60));
        const int failures = std::max(1, (int)(tail / 3 / 40));
        turn.segments.push_back({"diff", segment_kind::diff, "", "", g.diff("src/pinned_0.cc", hunks)});
        turn.segments.push_back({"tests", segment_kind::test_output, "", "", g.test_output(failures)});
        turn.segments.push_back({"question", segment_kind::user, "", "", g.question()});
        t.turns.push_back(std::move(turn));
    }
    return t;
}

}  // namespace warmctx
