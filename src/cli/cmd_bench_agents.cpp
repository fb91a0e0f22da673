// warmctx-bench agents: many agents on one server at once, each in its own workspace. Each
// agent's turn is its workspace, its conversation so far and a new question, answered
// (greedy) before its next turn, all agents at once: what an agent waits for while the
// others write. Each system alone in turn, at its defaults (warmctx: serve's --parallel
// unless asked; llama-server: its 4 slots). Per system: each turn's TTFT, the warm turns'
// (each agent's second on) p50 and p95, and the tokens per second all agents write together.
// The workspaces hold no tool definitions (turns_of says why).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench_harness.h"
#include "cli.h"
#include "warmctx/scheduler.h"

namespace warmctx::cli {
namespace {

using json = nlohmann::json;

struct agents_args {
    model_flags mf;
    int agents = 8;
    int turns = 4;
    size_t size = 2000;
    int max_tokens = 128;
    uint32_t parallel = 0;  // warmctx's --parallel (0: serve's default)
    int32_t resident_streams = -1;  // warmctx's --resident-streams (-1: serve's default)
    uint64_t seed = 9;
    std::string llama_server = default_tool("llama-server");
    bool no_llama_server = false;
    bool json_out = false;
};

// One agent's turns: segments (for warmctx) and the same prompt as tokens (for llama-server).
struct agent_turn {
    std::vector<segment> segs;
    std::vector<token_id> tokens;
};

// Agent a's turns: its workspace, then each earlier question and a short answer, then the
// next question. The history is fixed in advance (a random model's answers say nothing), so
// every system is sent the same prompts.
result<std::vector<agent_turn>> turns_of(prompt_builder & pb, workload_generator & g, const agents_args & a) {
    std::vector<segment> ws = make_workspace(g, a.size, 1);
    const segment question = ws.back();
    ws.pop_back();
    // No tool definitions: with tools warmctx's streamed tool-call parser holds a random
    // model's text back until the answer ends, while llama-server, sent the prompt as
    // tokens, parses nothing; without them both stream each token as it comes, so the
    // client's first token is each system's time to it.
    std::erase_if(ws, [](const segment & s) { return s.kind == segment_kind::tools; });
    std::vector<agent_turn> out;
    std::vector<segment> history;
    for (int t = 0; t < a.turns; ++t) {
        segment q = question;
        q.content = g.question();
        agent_turn turn;
        turn.segs = ws;
        turn.segs.insert(turn.segs.end(), history.begin(), history.end());
        turn.segs.push_back(q);
        auto tokens = pb.tokens(turn.segs);
        if (!tokens) return tokens.error();
        turn.tokens = std::move(*tokens);
        out.push_back(std::move(turn));
        for (const char * role : {"user", "assistant"}) {
            segment h;
            h.id = "h" + std::to_string(history.size());
            h.kind = segment_kind::history;
            h.role = role;
            h.content = role[0] == 'u' ? q.content : "Done: the change is in and the tests pass.";
            history.push_back(std::move(h));
        }
    }
    return out;
}

result<std::unique_ptr<bench_system>> start_system(const agents_args & a, const std::string & name) {
    if (name == "warmctx") {
        warmctx_system_options wo;
        wo.name = name;
        wo.mf = a.mf;
        wo.parallel = a.parallel > 0 ? a.parallel : scheduler_options{}.n_parallel;
        wo.resident_streams = a.resident_streams;  // -1: serve's default, the device tier's (RAM on the CPU)
        return start_warmctx_system(wo);
    }
    return start_llama_server_at_defaults(name, a.llama_server, a.mf);
}

// Every agent at once, each turn after its last; one system.
json run_system(bench_system & s, const std::vector<std::vector<agent_turn>> & agents, int max_tokens) {
    std::vector<std::vector<turn_timing>> got(agents.size());
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (size_t i = 0; i < agents.size(); ++i)
        threads.emplace_back([&, i] {
            for (const agent_turn & t : agents[i])
                got[i].push_back(s.send("agent-" + std::to_string(i), t.segs, t.tokens, max_tokens));
        });
    for (auto & t : threads) t.join();
    const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    json turns = json::array();
    std::vector<double> warm, first;
    long written = 0;
    int failed = 0;
    for (size_t i = 0; i < got.size(); ++i)
        for (size_t k = 0; k < got[i].size(); ++k) {
            const turn_timing & t = got[i][k];
            failed += t.ok ? 0 : 1;
            written += t.completion_tokens;
            (k == 0 ? first : warm).push_back(t.ttft_ms);
            turns.push_back({{"agent", i}, {"turn", k}, {"ok", t.ok}, {"error", t.error}, {"ttft_ms", t.ttft_ms},
                             {"server_first_token_ms", t.server_ms}, {"total_ms", t.total_ms},
                             {"prompt_tokens", t.prompt_tokens}, {"cached_tokens", t.cached_tokens},
                             {"completion_tokens", t.completion_tokens}, {"timings", t.timings}});
        }
    return {{"wall_s", wall_s},
            {"failed", failed},
            {"completion_tokens", written},
            {"tokens_per_s", wall_s > 0 ? (double)written / wall_s : 0.0},
            {"first_turn_ttft_ms", {{"p50", percentile(first, 0.5)}, {"p95", percentile(first, 0.95)}}},
            {"warm_turn_ttft_ms",
             {{"p50", percentile(warm, 0.5)}, {"p95", percentile(warm, 0.95)}, {"max", percentile(warm, 1.0)}}},
            {"turns", turns}};
}

int run_agents(const agents_args & a) {
    if (a.agents < 1 || a.turns < 2 || a.max_tokens < 1)
        return fail(invalid_argument("--agents must be >= 1, --turns >= 2 and --max-tokens >= 1"));
    auto pb = prompt_builder::open(a.mf);
    if (!pb) return fail(pb.error());
    progress("building " + std::to_string(a.agents) + " workspaces of ~" + std::to_string(a.size) + " stable tokens");
    std::vector<std::vector<agent_turn>> agents;
    for (int i = 0; i < a.agents; ++i) {
        workload_generator g(a.seed + (uint64_t)i, (*pb)->counter());
        auto t = turns_of(**pb, g, a);
        if (!t) return fail(t.error());
        agents.push_back(std::move(*t));
    }
    std::vector<std::string> names = {"warmctx"};
    if (!a.no_llama_server) names.push_back("llama-server");
    json out = {{"bench", "agents"}, {"model", (*pb)->model_path()}, {"agents", a.agents}, {"turns", a.turns},
                {"size", a.size}, {"max_tokens", a.max_tokens}, {"threads", a.mf.threads}};
    for (const std::string & name : names) {
        auto s = start_system(a, name);
        if (!s) return fail(s.error());
        progress(name + ": " + std::to_string(a.agents) + " agents at once, " + std::to_string(a.turns) +
                 " turns each");
        json r = run_system(**s, agents, a.max_tokens);
        r["describe"] = (*s)->describe();
        r["end_state"] = (*s)->state();
        progress(name + ": warm-turn TTFT p50 " + std::to_string((int)r["warm_turn_ttft_ms"]["p50"].get<double>()) +
                 " ms, p95 " + std::to_string((int)r["warm_turn_ttft_ms"]["p95"].get<double>()) + " ms, " +
                 std::to_string((int)r["tokens_per_s"].get<double>()) + " tokens/s written, " +
                 std::to_string(r["failed"].get<int>()) + " failed");
        out["systems"][name] = std::move(r);
    }
    if (out["systems"].contains("llama-server")) {
        const json & w = out["systems"]["warmctx"];
        const json & l = out["systems"]["llama-server"];
        auto ratio = [](double x, double y) { return y > 0 ? x / y : 0.0; };
        out["warmctx_vs_llama_server"] = {
            {"warm_turn_ttft_p50", ratio(w["warm_turn_ttft_ms"]["p50"], l["warm_turn_ttft_ms"]["p50"])},
            {"warm_turn_ttft_p95", ratio(w["warm_turn_ttft_ms"]["p95"], l["warm_turn_ttft_ms"]["p95"])},
            {"tokens_per_s", ratio(w["tokens_per_s"], l["tokens_per_s"])}};
    }
    int failed = 0;
    for (const auto & [name, r] : out["systems"].items()) failed += r["failed"].get<int>();
    if (a.json_out) std::printf("%s\n", out.dump(1).c_str());
    return failed > 0 ? 1 : 0;
}

}  // namespace

void register_agents_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<agents_args>();
    auto * c = bench.add_subcommand(
        "agents", "many agents at once, each its own workspace: warm-turn TTFT while the others write, tokens/s");
    a->mf.add_to(*c);
    c->add_option("--agents", a->agents, "agents at once, each its own workspace")
        ->capture_default_str()
        ->check(CLI::Range(1, 256));
    c->add_option("--turns", a->turns, "turns per agent (the first is cold)")->capture_default_str();
    c->add_option("--size", a->size, "stable tokens per workspace")->capture_default_str();
    c->add_option("-n,--max-tokens", a->max_tokens, "tokens per answer (greedy)")->capture_default_str();
    c->add_option("--parallel", a->parallel, "warmctx's --parallel (0: serve's default)")->capture_default_str();
    c->add_option("--resident-streams", a->resident_streams,
                  "warmctx's --resident-streams (-1: serve's default, sized from memory)")
        ->capture_default_str()
        ->check(CLI::Range(-1, 255));
    c->add_option("--seed", a->seed, "workspace content seed (agent i: seed + i)")->capture_default_str();
    c->add_option("--llama-server", a->llama_server, "llama-server binary")->capture_default_str();
    c->add_flag("--no-llama-server", a->no_llama_server, "warmctx only");
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_agents(*a); });
}

}  // namespace warmctx::cli
