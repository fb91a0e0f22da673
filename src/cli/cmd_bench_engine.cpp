// warmctx-bench engine - the engine adapter's prefill and decode rates next to
// llama-bench's, same build, same model, same settings, in one run.
#include <chrono>

#include "util/clock.h"
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench_harness.h"


namespace warmctx::cli {
namespace {

using clock_type = std::chrono::steady_clock;
struct bench_engine_args {
    model_flags mf;
    int32_t n_prompt = 512;
    int32_t n_gen = 64;
    int32_t reps = 3;
    std::string llama_bench = default_tool("llama-bench");
    bool skip_llama_bench = false;
    bool json = false;
};

using rate = sample_stats;

// llama-bench's pp and tg rates, same model and settings.
result<std::pair<rate, rate>> run_llama_bench(const bench_engine_args & a, const engine_options & o, int32_t threads) {
    auto pp = llama_bench_run(a.llama_bench, o, threads, a.n_prompt, 0, 0, a.reps, true);
    if (!pp) return pp.error();
    auto tg = llama_bench_run(a.llama_bench, o, threads, 0, a.n_gen, 0, a.reps, true);
    if (!tg) return tg.error();
    return std::pair<rate, rate>{{pp->tps, pp->stddev}, {tg->tps, tg->stddev}};
}

int run_bench_engine(const bench_engine_args & a) {
    if (a.n_prompt < 1 || a.n_gen < 1 || a.reps < 1)
        return fail(invalid_argument("--prompt-tokens, --gen-tokens and --reps must be >= 1"));
    model_flags mf = a.mf;
    mf.n_ctx = (uint32_t)(a.n_prompt + a.n_gen + 1);
    auto opts = mf.to_options(1);
    if (!opts) return fail(opts.error());
    auto eng_r = engine::open(*opts);
    if (!eng_r) return fail(eng_r.error());
    engine & eng = **eng_r;
    const int32_t threads = eng.context().n_threads;

    std::mt19937 rng(42);
    std::uniform_int_distribution<token_id> dist(0, eng.model().n_vocab - 1);
    std::vector<token_id> prompt((size_t)a.n_prompt);
    for (auto & t : prompt) t = dist(rng);

    auto prefill_once = [&](std::vector<float> * logits) -> result<double> {
        eng.clear_all();
        auto t0 = clock_type::now();
        status st = eng.prefill(0, prompt, 0, {}, logits);
        if (!st.ok()) return st;
        return ms_since(t0);
    };
    progress("warmctx engine: warm-up");
    { std::vector<float> l; auto w = prefill_once(&l); if (!w) return fail(w.error()); }
    std::vector<double> pp, tg;
    for (int r = 0; r < a.reps; ++r) {
        std::vector<float> logits;
        auto ms = prefill_once(&logits);
        if (!ms) return fail(ms.error());
        pp.push_back(a.n_prompt * 1000.0 / *ms);
        // decode as llama-bench's tg test: from one token, n_gen single-token steps
        eng.clear_all();
        std::vector<float> l1;
        status st = eng.prefill(0, std::span<const token_id>(prompt.data(), 1), 0, {}, &l1);
        if (!st.ok()) return fail(st);
        sampling_params sp;
        sp.max_tokens = a.n_gen + 1;  // n_gen decode steps after the first sampled token
        // force a fixed length: ignore end-of-generation by sampling over our own loop
        auto t0 = clock_type::now();
        auto g = eng.generate(0, std::move(l1), sp);
        if (!g) return fail(g.error());
        double ms_dec = ms_since(t0);
        const size_t steps = g->tokens.empty() ? 0 : g->tokens.size() - 1;
        if (steps > 0) tg.push_back((double)steps * 1000.0 / ms_dec);
    }
    rate ours_pp = summarize(pp), ours_tg = summarize(tg);
    nlohmann::json j = {
        {"model", eng.model().path}, {"model_desc", eng.model().description}, {"threads", threads},
        {"chunk", opts->chunk_tokens}, {"kv_type", opts->kv_type}, {"flash_attn", opts->flash_attn},
        {"backend", backend_name()}, {"reps", a.reps},
    };
    nlohmann::json rows = nlohmann::json::array();
    rate lb_pp, lb_tg;
    bool have_lb = false;
    if (!a.skip_llama_bench) {
        auto lb = run_llama_bench(a, *opts, threads);
        if (!lb) return fail(lb.error());
        lb_pp = lb->first; lb_tg = lb->second; have_lb = true;
    }
    auto row = [&](const std::string & test, rate ours, rate theirs) {
        nlohmann::json r = {{"test", test}, {"warmctx_tps", ours.mean}, {"warmctx_stddev", ours.stddev}};
        if (have_lb) {
            r["llama_bench_tps"] = theirs.mean;
            r["llama_bench_stddev"] = theirs.stddev;
            r["ratio"] = theirs.mean > 0 ? ours.mean / theirs.mean : 0.0;
        }
        rows.push_back(r);
    };
    row("pp" + std::to_string(a.n_prompt), ours_pp, lb_pp);
    row("tg" + std::to_string(a.n_gen), ours_tg, lb_tg);
    j["rows"] = rows;
    if (a.json) { std::printf("%s\n", j.dump(2).c_str()); return 0; }
    std::printf("%-8s %14s %14s %8s\n", "test", "warmctx tok/s", "llama-bench", "ratio");
    for (const auto & r : rows)
        std::printf("%-8s %14.1f %14.1f %8.3f\n", r["test"].get<std::string>().c_str(), r["warmctx_tps"].get<double>(),
                    r.value("llama_bench_tps", 0.0), r.value("ratio", 0.0));
    return 0;
}

}  // namespace

void register_bench_commands(CLI::App & bench, int & rc) {
    auto a = std::make_shared<bench_engine_args>();
    auto * e = bench.add_subcommand(
        "engine", "engine adapter prefill/decode tok/s next to llama-bench (same build and settings)");
    a->mf.add_to(*e, false);
    e->add_option("--prompt-tokens", a->n_prompt, "prompt tokens (pp test)")->capture_default_str();
    e->add_option("--gen-tokens", a->n_gen, "generated tokens (tg test)")->capture_default_str();
    e->add_option("--reps", a->reps, "repetitions of each test")->capture_default_str();
    e->add_option("--llama-bench", a->llama_bench, "llama-bench binary")->capture_default_str();
    e->add_flag("--no-llama-bench", a->skip_llama_bench, "measure warmctx only");
    e->add_flag("--json", a->json, "print JSON");
    on_run(e, rc, [a] { return run_bench_engine(*a); });
    register_overhead_bench(bench, rc);
    register_http_bench(bench, rc);
    register_s2_bench(bench, rc);
    register_render_bench(bench, rc);
    register_drafts_bench(bench, rc);
    register_agents_bench(bench, rc);
    register_trace_bench(bench, rc);
    register_contention_bench(bench, rc);
    register_s3_bench(bench, rc);
    register_calls_bench(bench, rc);
    register_splits_bench(bench, rc);
    register_soak_bench(bench, rc);
    register_edits_bench(bench, rc);
    register_conversation_bench(bench, rc);
}

}  // namespace warmctx::cli
