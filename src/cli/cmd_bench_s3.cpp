// warmctx-bench s3 - prefill and decode rates per model shape, next to llama-bench of
// the same build and settings, in one run:
//   cold pp  - N prompt tokens into an empty sequence        (llama-bench -p N)
//   warm pp  - N tokens after a resident D-token prefix: the prefix is copied from the
//              sequence that holds it, then the N tokens are prefilled after it, the
//              copy included in the time, as a warm turn does (llama-bench -p N -d D)
//   tg       - G single-token decode steps                     (llama-bench -n G)
// Each system's allocated KV is reported beside its rates (warmctx: its two streams,
// whole; llama-bench: each test's context).
#include <chrono>

#include "util/clock.h"
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "bench_harness.h"

namespace warmctx::cli {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

struct s3_args {
    model_flags mf;
    std::vector<std::string> shapes = {"tiny", "qwen2.5-0.5b", "qwen2.5-1.5b"};
    std::string type = "q4_0";
    int n_prompt = 512;
    int n_gen = 32;
    int depth = 1024;
    int reps = 3;
    std::string llama_bench = default_tool("llama-bench");
    bool skip_llama_bench = false;
    bool json_out = false;
};

// The engine's three rates on one model. Sequence 0 holds the warm prefix, 1 is the
// work sequence.
result<json> measure_engine(const s3_args & a, const engine_options & base) {
    engine_options o = base;
    o.n_seq_max = 2;
    o.n_ctx = (uint32_t)(a.depth + std::max(a.n_prompt, a.n_gen + 1) + 16);
    auto eng_r = engine::open(o);
    if (!eng_r) return eng_r.error();
    engine & eng = **eng_r;
    std::mt19937 rng(42);
    std::uniform_int_distribution<token_id> dist(0, eng.model().n_vocab - 1);
    std::vector<token_id> prompt((size_t)a.n_prompt), prefix((size_t)a.depth);
    for (auto & t : prompt) t = dist(rng);
    for (auto & t : prefix) t = dist(rng);

    auto cold_once = [&]() -> result<double> {
        eng.clear_all();
        std::vector<float> l;
        auto t0 = clock_type::now();
        WARMCTX_RETURN_IF_ERROR(eng.prefill(1, prompt, 0, {}, &l));
        return ms_since(t0);
    };
    auto warm_once = [&]() -> result<double> {
        eng.clear_seq(1);
        std::vector<float> l;
        auto t0 = clock_type::now();
        WARMCTX_RETURN_IF_ERROR(eng.copy_seq(0, 1));
        WARMCTX_RETURN_IF_ERROR(eng.prefill(1, prompt, (pos_t)a.depth, {}, &l));
        return ms_since(t0);
    };
    auto tg_once = [&]() -> result<double> {
        eng.clear_all();
        std::vector<float> l1;
        WARMCTX_RETURN_IF_ERROR(eng.prefill(1, std::span<const token_id>(prompt.data(), 1), 0, {}, &l1));
        sampling_params sp;
        sp.max_tokens = a.n_gen + 1;
        auto t0 = clock_type::now();
        auto g = eng.generate(1, std::move(l1), sp);
        if (!g) return g.error();
        const double ms = ms_since(t0);
        const size_t steps = g->tokens.empty() ? 0 : g->tokens.size() - 1;
        return steps ? (double)steps * 1000.0 / ms : 0.0;
    };

    // Warm-up for at least a second: the measured runs should find the device's clocks
    // and caches as busy as llama-bench's runs (which follow ours) do.
    progress("  warm-up");
    for (const auto t0 = clock_type::now(); ms_since(t0) < 1000.0;)
        if (auto w = cold_once(); !w) return w.error();
    std::vector<double> cold, warm, tg;
    for (int r = 0; r < a.reps; ++r) {
        auto c = cold_once();
        if (!c) return c.error();
        cold.push_back(a.n_prompt * 1000.0 / *c);
    }
    if (a.depth > 0) {
        progress("  prefilling the " + std::to_string(a.depth) + "-token warm prefix");
        eng.clear_all();
        WARMCTX_RETURN_IF_ERROR(eng.prefill(0, prefix, 0, {}, nullptr));
        if (auto w = warm_once(); !w) return w.error();
        for (int r = 0; r < a.reps; ++r) {
            auto w = warm_once();
            if (!w) return w.error();
            warm.push_back(a.n_prompt * 1000.0 / *w);
        }
    }
    for (int r = 0; r < a.reps; ++r) {
        auto t = tg_once();
        if (!t) return t.error();
        tg.push_back(*t);
    }
    const sample_stats c = summarize(cold), w = summarize(warm), g = summarize(tg);
    return json{{"cold_pp_tps", c.mean}, {"warm_pp_tps", w.mean}, {"tg_tps", g.mean},
                {"cold_pp_stddev", c.stddev}, {"warm_pp_stddev", w.stddev}, {"tg_stddev", g.stddev},
                {"model_desc", eng.model().description}, {"threads", eng.context().n_threads},
                {"n_params", eng.model().n_params},
                // Every KV byte it allocated: its two streams, whole, for all three tests.
                {"kv_allocated_bytes", eng.context().kv_streams_bytes},
                {"kv_bytes_per_token", eng.context().kv_bytes_per_token}};
}

int run_s3(const s3_args & a) {
    if (a.n_prompt < 1 || a.n_gen < 1 || a.reps < 1 || a.depth < 0) {
        return fail(invalid_argument("--prompt-tokens, --gen-tokens and --reps must be >= 1, --depth >= 0"));
    }
    if (a.depth % (int)std::max<uint32_t>(1, a.mf.chunk) != 0) {
        return fail(invalid_argument("--depth must be a multiple of --chunk (" + std::to_string(a.mf.chunk) +
                                     "): a warm prefill starts at a canonical chunk start"));
    }
    if (!a.mf.model.empty()) {
        return fail(invalid_argument("bench s3 generates its models by shape; use --shapes and --type, not --model"));
    }
    json out = {{"bench", "s3"}, {"backend", backend_name()}, {"type", a.type}, {"n_prompt", a.n_prompt},
                {"n_gen", a.n_gen}, {"depth", a.depth}, {"reps", a.reps}, {"flash_attn", a.mf.flash_attn},
                {"gpu_layers", a.mf.gpu_layers}, {"kv_type", a.mf.kv_type}, {"chunk", a.mf.chunk}};
    json rows = json::array();
    for (const auto & shape : a.shapes) {
        auto path = ensure_model(shape, a.type, 0, progress);
        if (!path) return fail(path.error());
        model_flags mf = a.mf;
        mf.model = *path;
        auto eo = mf.to_options(2);
        if (!eo) return fail(eo.error());
        progress(shape + ": warmctx engine");
        auto m = measure_engine(a, *eo);
        if (!m) return fail(m.error());
        json row = {{"shape", shape}, {"model", *path}, {"warmctx", *m}};
        if (!a.skip_llama_bench) {
            const int threads = (*m)["threads"].get<int>();
            auto cold = llama_bench_run(a.llama_bench, *eo, threads, a.n_prompt, 0, 0, a.reps, true);
            if (!cold) return fail(cold.error());
            llama_bench_rate warm;
            if (a.depth > 0) {
                auto w = llama_bench_run(a.llama_bench, *eo, threads, a.n_prompt, 0, a.depth, a.reps, true);
                if (!w) return fail(w.error());
                warm = *w;
            }
            auto tg = llama_bench_run(a.llama_bench, *eo, threads, 0, a.n_gen, 0, a.reps, true);
            if (!tg) return fail(tg.error());
            // llama-bench sizes each test's context to prompt + generated + depth tokens,
            // which llama.cpp rounds up to a multiple of 256 cells: its allocated KV.
            const uint64_t bpt = (*m)["kv_bytes_per_token"].get<uint64_t>();
            auto kv_of = [bpt](int n_tokens) { return (uint64_t)((n_tokens + 255) / 256 * 256) * bpt; };
            row["llama_bench"] = {{"cold_pp_tps", cold->tps}, {"cold_pp_stddev", cold->stddev},
                                  {"warm_pp_tps", warm.tps},  {"warm_pp_stddev", warm.stddev},
                                  {"tg_tps", tg->tps},        {"tg_stddev", tg->stddev},
                                  {"kv_allocated_bytes", {{"cold_pp", kv_of(a.n_prompt)},
                                                          {"warm_pp", kv_of(a.n_prompt + a.depth)},
                                                          {"tg", kv_of(a.n_gen)}}}};
            auto ratio = [](double x, double y) { return y > 0 ? x / y : 0.0; };
            row["ratio"] = {{"cold_pp", ratio((*m)["cold_pp_tps"], cold->tps)},
                            {"warm_pp", ratio((*m)["warm_pp_tps"], warm.tps)},
                            {"tg", ratio((*m)["tg_tps"], tg->tps)}};
        }
        rows.push_back(std::move(row));
    }
    out["rows"] = rows;
    if (a.json_out) { std::printf("%s\n", out.dump(2).c_str()); return 0; }
    std::printf("%-14s %-8s %14s %14s %8s %12s %12s\n", "shape", "test", "warmctx tok/s", "llama-bench", "ratio",
                "warmctx KV", "l-bench KV");
    for (const auto & r : rows)
        for (const char * t : {"cold_pp", "warm_pp", "tg"}) {
            const std::string k = std::string(t) + "_tps";
            const bool lb = r.contains("llama_bench");
            std::printf("%-14s %-8s %14.1f %14.1f %8.3f %9.1f MiB %9.1f MiB\n", r["shape"].get<std::string>().c_str(),
                        t, r["warmctx"].value(k, 0.0), lb ? r["llama_bench"].value(k, 0.0) : 0.0,
                        r.contains("ratio") ? r["ratio"].value(t, 0.0) : 0.0,
                        r["warmctx"]["kv_allocated_bytes"].get<uint64_t>() / 1048576.0,
                        lb ? r["llama_bench"]["kv_allocated_bytes"].value(t, uint64_t{0}) / 1048576.0 : 0.0);
        }
    return 0;
}

}  // namespace

void register_s3_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<s3_args>();
    auto * c = bench.add_subcommand(
        "s3", "cold and warm prefill and decode tok/s per model shape, next to llama-bench (same build)");
    a->mf.add_to(*c, false);
    c->add_option("--shapes", a->shapes, "model shapes (generated once and cached)")
        ->delimiter(',')
        ->capture_default_str();
    c->add_option("--type", a->type, "weight type: f16, q8_0, q4_0")->capture_default_str();
    c->add_option("--prompt-tokens", a->n_prompt, "prompt tokens per prefill test")->capture_default_str();
    c->add_option("--gen-tokens", a->n_gen, "decode steps per generation test")->capture_default_str();
    c->add_option("--depth", a->depth, "resident prefix of the warm prefill test, tokens (0 = skip)")
        ->capture_default_str();
    c->add_option("--reps", a->reps, "repetitions of each test")->capture_default_str();
    c->add_option("--llama-bench", a->llama_bench, "llama-bench binary")->capture_default_str();
    c->add_flag("--no-llama-bench", a->skip_llama_bench, "measure warmctx only");
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_s3(*a); });
}

}  // namespace warmctx::cli
