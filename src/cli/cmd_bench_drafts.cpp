// warmctx-bench drafts: decode with drafts from the workspace (warmctx/drafts.h) next to the
// same server without them and llama-server at its defaults, with and without its own
// drafts (--spec-type ngram-mod), on the same requests (the systems one after another):
// each question asked once, then sent again as an agent retrying its turn does. A random model's answers repeat no
// workspace text, so the first answers show what drafts cost where they do not pay; the
// answers sent again show what they give where they do.
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "bench_harness.h"
#include "cli.h"
#include "warmctx/scheduler.h"

namespace warmctx::cli {
namespace {

using json = nlohmann::json;

struct drafts_args {
    model_flags mf;
    size_t size = 2000;
    int questions = 3;
    int max_tokens = 256;
    int32_t draft_max = 64;  // warmctx's (serve --draft-max)
    uint64_t seed = 5;
    std::string llama_server = default_tool("llama-server");
    bool no_llama_server = false;
    bool json_out = false;
};

// Decode: the client's whole wait less the server's own time to its first token
// (warmctx: first_token_ms; llama-server: prompt_ms). The client's first streamed token is
// no measure where a tool-call parser holds text back until the answer ends (warmctx's,
// over a random model's answer): `client_decode_ms` is that one, for reference.
json entry_of(const turn_timing & t) {
    const double decode_ms = t.total_ms - (t.server_ms > 0 ? t.server_ms : t.ttft_ms);
    const int after_first = std::max(0, t.completion_tokens - 1);
    return {{"ok", t.ok},
            {"error", t.error},
            {"ttft_ms", t.ttft_ms},
            {"server_first_token_ms", t.server_ms},
            {"client_decode_ms", t.total_ms - t.ttft_ms},
            {"decode_ms", decode_ms},
            {"completion_tokens", t.completion_tokens},
            {"decode_tokens_per_s", decode_ms > 0 ? after_first * 1000.0 / decode_ms : 0.0},
            {"drafts", t.drafts}};
}

// The systems in turn, each started alone: two warmctx engines in one process would each
// have a team of llama.cpp's CPU threads (OpenMP), and two teams on the cores slow both.
std::vector<std::string> system_names(const drafts_args & a) {
    std::vector<std::string> n = {"warmctx", "warmctx-no-drafts"};
    if (!a.no_llama_server) n.insert(n.end(), {"llama-server", "llama-server-ngram-mod"});
    return n;
}

result<std::unique_ptr<bench_system>> start_system(const drafts_args & a, const std::string & name) {
    if (name.starts_with("warmctx")) {
        warmctx_system_options wo;
        wo.name = name;
        wo.mf = a.mf;
        wo.draft_max = name == "warmctx" ? a.draft_max : 0;
        wo.parallel = scheduler_options{}.n_parallel;  // serve's default --parallel, as llama-server's 4 slots
        return start_warmctx_system(wo);
    }
    std::vector<std::string> extra;
    if (name.ends_with("ngram-mod")) extra = {"--spec-type", "ngram-mod"};
    return start_llama_server_at_defaults(name, a.llama_server, a.mf, std::move(extra));
}

json summary_of(const json & entries) {
    json s = json::object();
    for (const char * kind : {"first", "again"}) {
        std::vector<double> tps, ms;
        for (const json & e : entries[kind]) {
            tps.push_back(e["decode_tokens_per_s"].get<double>());
            ms.push_back(e["decode_ms"].get<double>());
        }
        s[kind] = {{"decode_tokens_per_s_median", median(tps)}, {"decode_ms_median", median(ms)}};
    }
    return s;
}

int run_drafts(const drafts_args & a) {
    if (a.questions < 1 || a.max_tokens < 2)
        return fail(invalid_argument("--questions must be >= 1 and --max-tokens >= 2"));
    auto pb = prompt_builder::open(a.mf);
    if (!pb) return fail(pb.error());
    progress("building a workspace with a ~" + std::to_string(a.size) + "-token stable prefix");
    workload_generator g(a.seed, (*pb)->counter());
    const std::vector<segment> workspace = make_workspace(g, a.size, 1);
    std::vector<std::vector<segment>> turns;
    std::vector<std::vector<token_id>> prompts;
    for (int q = 0; q < a.questions; ++q) {
        turns.push_back(workspace);
        turns.back().back().content = g.question();
        auto tokens = (*pb)->tokens(turns.back());
        if (!tokens) return fail(tokens.error());
        prompts.push_back(std::move(*tokens));
    }
    std::map<std::string, json> entries, described;
    for (const std::string & name : system_names(a)) {
        auto s = start_system(a, name);
        if (!s) return fail(s.error());
        described[name] = (*s)->describe();
        // Every question, then the same again.
        for (int q = 0; q < a.questions; ++q) {
            for (const char * kind : {"first", "again"}) {
                const turn_timing t =
                    (*s)->send("drafts-" + std::to_string(q), turns[(size_t)q], prompts[(size_t)q], a.max_tokens);
                if (!t.ok) return fail(internal_error(name + ": " + t.error));
                entries[name][kind].push_back(entry_of(t));
                progress(name + " question " + std::to_string(q + 1) + " " + kind + ": " +
                         std::to_string(t.completion_tokens) + " tokens, decode " +
                         std::to_string((int)entries[name][kind].back()["decode_ms"].get<double>()) + " ms");
            }
        }
    }
    json out = {{"bench", "drafts"}, {"model", (*pb)->model_path()}, {"size", a.size}, {"draft_max", a.draft_max},
                {"questions", a.questions}, {"max_tokens", a.max_tokens}, {"threads", a.mf.threads}};
    for (const std::string & name : system_names(a))
        out["systems"][name] = {
            {"describe", described[name]}, {"summary", summary_of(entries[name])}, {"requests", entries[name]}};
    auto tps = [&](const std::string & sys, const char * kind) {
        if (!out["systems"].contains(sys)) return 0.0;
        return out["systems"][sys]["summary"][kind]["decode_tokens_per_s_median"].get<double>();
    };
    json ratios = json::object();
    for (const char * kind : {"first", "again"}) {
        const double w = tps("warmctx", kind), off = tps("warmctx-no-drafts", kind),
                     ng = tps("llama-server-ngram-mod", kind);
        ratios[kind] = {{"vs_no_drafts", off > 0 ? w / off : 0.0},
                        {"vs_llama_server_ngram_mod", ng > 0 ? w / ng : 0.0}};
    }
    out["warmctx_decode_speed_ratio"] = ratios;
    if (a.json_out) {
        std::printf("%s\n", out.dump(1).c_str());
        return 0;
    }
    for (const std::string & name : system_names(a))
        std::printf("%-24s decode tok/s: first %.1f, sent again %.1f\n", name.c_str(), tps(name, "first"),
                    tps(name, "again"));
    return 0;
}

}  // namespace

void register_drafts_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<drafts_args>();
    auto * c = bench.add_subcommand(
        "drafts", "decode with drafts from the workspace next to without, and llama-server with and without ngram-mod");
    a->mf.add_to(*c);
    c->add_option("--size", a->size, "stable-prefix size, tokens")->capture_default_str();
    c->add_option("--questions", a->questions, "questions, each asked and then sent again")->capture_default_str();
    c->add_option("-n,--max-tokens", a->max_tokens, "tokens per answer (greedy)")->capture_default_str();
    c->add_option("--seed", a->seed, "workspace content seed")->capture_default_str();
    c->add_option("--draft-max", a->draft_max, "warmctx's most draft tokens per step (serve --draft-max)")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    c->add_option("--llama-server", a->llama_server, "llama-server binary")->capture_default_str();
    c->add_flag("--no-llama-server", a->no_llama_server, "warmctx with and without drafts only");
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_drafts(*a); });
}

}  // namespace warmctx::cli
