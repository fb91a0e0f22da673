// warmctx-bench render: what the model's Jinja chat template costs a turn - assembling a large
// workspace prompt with it next to llama.cpp's built-in per-message templates, cold and
// warm - and what parsing a tool call out of an answer costs, whole and as a stream
// parses it (once per generated token).
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "bench_harness.h"
#include "cli.h"
#include "util/clock.h"
#include "warmctx/assembler.h"
#include "warmctx/chat_template.h"
#include "warmctx/engine.h"
#include "engine/engine_adapters.h"
#include "warmctx/kind_table.h"
#include "workload/workload.h"

namespace warmctx::cli {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

struct render_args {
    model_flags mf;
    size_t size = 47000;
    int turns = 20;
    uint64_t seed = 3;
    bool json_out = false;
};

// An agent's turn: the workspace, then a tool loop's history (an assistant call and its
// result, twice), then the question.
std::vector<segment> agent_turn(const std::vector<segment> & workspace, workload_generator & g) {
    std::vector<segment> s = workspace;
    const segment question = s.back();
    s.pop_back();
    for (int i = 0; i < 2; ++i) {
        const std::string id = "call_" + std::to_string(i);
        segment call{"h000" + std::to_string(2 * i), segment_kind::history, "", "assistant", ""};
        call.tool_calls = R"([{"function":{"arguments":"{\"path\":\"src/main.cc\"}","name":"read_file"},"id":")" + id +
                          R"(","type":"function"}])";
        segment result{"h000" + std::to_string(2 * i + 1), segment_kind::history, "", "tool", g.terminal_log(6)};
        result.tool_call_id = id;
        s.push_back(std::move(call));
        s.push_back(std::move(result));
    }
    s.push_back(question);
    return s;
}

struct mode_result {
    double cold_ms = 0;
    std::vector<double> warm_ms;
    size_t n_tokens = 0;
};

result<mode_result> time_assembly(const render_args & a, const std::string & model_path, bool jinja,
                                  const std::vector<segment> & workspace) {
    model_flags mf = a.mf;
    mf.model = model_path;
    mf.no_jinja = !jinja;
    auto eo = mf.to_options(1);
    if (!eo) return eo.error();
    eo->n_ctx = 256;  // only the tokenizer and the template are used
    auto e = engine::open(*eo);
    if (!e) return e.error();
    auto tm = make_engine_text_model(**e);
    if (jinja && !tm->renders_conversations())
        return failed_precondition("the model's chat template does not load as Jinja");
    auto prof = engine_profile(**e, *eo);
    if (!prof) return prof.error();
    const kind_table kinds;
    workload_generator g(a.seed, [&](const std::string & t) { return (size_t)(*e)->tokenize(t, false)->size(); });
    mode_result r;
    auto t0 = clock_type::now();
    auto prompt = assemble(agent_turn(workspace, g), kinds, *tm, *prof, "", prof->chunk_tokens);
    r.cold_ms = ms_since(t0);
    if (!prompt) return prompt.error();
    r.n_tokens = prompt->tokens.size();
    for (int i = 0; i < a.turns; ++i) {
        auto segs = agent_turn(workspace, g);
        segs.back().content = g.question();
        t0 = clock_type::now();
        auto w = assemble(segs, kinds, *tm, *prof, "", prof->chunk_tokens);
        r.warm_ms.push_back(ms_since(t0));
        if (!w) return w.error();
    }
    return r;
}

int run_render(const render_args & a) {
    if (a.turns < 1 || a.size < 256)
        return fail(invalid_argument("--turns must be at least 1 and --size at least 256"));
    auto pb = prompt_builder::open(a.mf);
    if (!pb) return fail(pb.error());
    progress("building a workspace with a ~" + std::to_string(a.size) + "-token stable prefix");
    workload_generator g(a.seed * 1000003ull + a.size, (*pb)->counter());
    const std::vector<segment> workspace = make_workspace(g, a.size, 2);
    const std::string model_path = (*pb)->model_path();
    pb->reset();

    json out = {{"bench", "render"}, {"model", model_path}, {"size", a.size}, {"turns", a.turns}};
    mode_result modes[2];
    for (int jinja = 1; jinja >= 0; --jinja) {
        progress(std::string("assembling with ") + (jinja ? "the Jinja template" : "the built-in templates"));
        auto r = time_assembly(a, model_path, jinja != 0, workspace);
        if (!r) return fail(r.error());
        modes[jinja] = *r;
        out[jinja ? "jinja" : "builtin"] = {{"prompt_tokens", r->n_tokens},
                                            {"cold_ms", r->cold_ms},
                                            {"warm_ms_median", median(r->warm_ms)},
                                            {"warm_ms_p90", percentile(r->warm_ms, 0.9)},
                                            {"warm_ms_all", r->warm_ms}};
    }
    out["warm_overhead_ms"] = median(modes[1].warm_ms) - median(modes[0].warm_ms);

    // Parsing: a tool call as the model writes it in Qwen2.5's format.
    model_flags mf = a.mf;
    mf.model = model_path;
    auto eo = mf.to_options(1);
    if (!eo) return fail(eo.error());
    eo->n_ctx = 256;
    auto e = engine::open(*eo);
    if (!e) return fail(e.error());
    auto tm = make_engine_text_model(**e);
    const chat_templates * ct = engine_chat_templates(*tm);
    if (ct) {
        std::string tools;  // the workspace's tool schemas
        for (const segment & sg : workspace)
            if (sg.kind == segment_kind::tools) tools = sg.content;
        auto af = ct->answer({}, {tools, tool_choice_mode::auto_, "", true, ""});
        if (!af) return fail(af.error());
        // A call of the first tool, with its one required argument.
        const json first = json::parse(tools)[0]["function"];
        const std::string answer = "<tool_call>\n{\"name\": \"" + first["name"].get<std::string>() +
                                   "\", \"arguments\": {\"path\": \"src/main.cc\"}}\n</tool_call>";
        auto toks = (*e)->tokenize(answer, true);
        if (!toks) return fail(toks.error());
        std::vector<double> whole, streamed;
        for (int i = 0; i < 50; ++i) {
            auto t0 = clock_type::now();
            auto p = af->parser->parse(answer, false);
            whole.push_back(ms_since(t0));
            if (!p || p->tool_calls.size() != 1) return fail(internal_error("the tool call did not parse"));
            std::string so_far;
            t0 = clock_type::now();
            for (token_id t : *toks) {
                so_far += (*e)->token_piece(t);
                (void)af->parser->parse(so_far, true);
            }
            streamed.push_back(ms_since(t0));
        }
        out["parse"] = {{"format", af->format_name},
                        {"answer_tokens", toks->size()},
                        {"whole_ms_median", median(whole)},
                        {"streamed_total_ms_median", median(streamed)},
                        {"streamed_per_token_ms", median(streamed) / (double)toks->size()}};
    }
    if (a.json_out) {
        std::printf("%s\n", out.dump(1).c_str());
    } else {
        std::printf(
            "%zu-token prompt: warm assembly %.3f ms with the Jinja template, %.3f ms built-in (overhead %.3f ms); "
            "cold %.1f / %.1f ms\n",
            modes[1].n_tokens, median(modes[1].warm_ms), median(modes[0].warm_ms),
            out["warm_overhead_ms"].get<double>(), modes[1].cold_ms, modes[0].cold_ms);
        if (out.contains("parse"))
            std::printf("tool call parse: %.3f ms whole, %.3f ms over a stream of %zu tokens\n",
                        out["parse"]["whole_ms_median"].get<double>(),
                        out["parse"]["streamed_total_ms_median"].get<double>(),
                        out["parse"]["answer_tokens"].get<size_t>());
    }
    return 0;
}

}  // namespace

void register_render_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<render_args>();
    auto * c = bench.add_subcommand(
        "render", "what the model's Jinja chat template adds to assembling a turn, and what parsing a tool call costs");
    a->mf.add_to(*c, false);
    c->add_option("--size", a->size, "stable-prefix size, tokens")->capture_default_str();
    c->add_option("--turns", a->turns, "warm turns timed (the median is reported)")->capture_default_str();
    c->add_option("--seed", a->seed, "workspace content seed")->capture_default_str();
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_render(*a); });
}

}  // namespace warmctx::cli
