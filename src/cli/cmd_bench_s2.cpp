// warmctx-bench s2 - the seed's S2: a coding-agent prompt with a stable prefix of
// 2k..47k tokens, sent cold and then warm (same stable context, a new question), to
// warmctx and to llama-server of the same llama.cpp build (its prompt cache on), in one
// run; time to first token at the client over loopback, and llama-bench's prefill time
// for the same prompt length as the floor a cold turn is held to.
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench_harness.h"

namespace warmctx::cli {
namespace {

using json = nlohmann::json;

struct s2_args {
    model_flags mf;
    std::vector<size_t> sizes = {2048, 8192};
    int warm_turns = 3;
    std::vector<std::string> systems = {"warmctx", "llama-server"};
    std::string llama_server = default_tool("llama-server");
    std::string llama_bench = default_tool("llama-bench");
    bool skip_llama_bench = false;
    int cache_ram_mib = -1;
    uint64_t seed = 3;
    bool json_out = false;
};

struct s2_prompt {
    size_t target = 0;
    std::vector<segment> cold;
    std::vector<token_id> cold_tokens;
    std::vector<std::vector<segment>> warm;
    std::vector<std::vector<token_id>> warm_tokens;
};

// Each size's prompt, cold and warm (same stable context, a new question per warm turn).
result<std::vector<s2_prompt>> build_s2_prompts(const s2_args & a, prompt_builder & pb) {
    std::vector<s2_prompt> prompts;
    for (size_t size : a.sizes) {
        if (size < 256) return invalid_argument("--sizes: each size must be at least 256 tokens");
        progress("building the S2 prompt with a ~" + std::to_string(size) + "-token stable prefix");
        workload_generator g(a.seed * 1000003ull + size, pb.counter());
        s2_prompt p;
        p.target = size;
        p.cold = make_workspace(g, size, 2);
        auto t = pb.tokens(p.cold);
        if (!t) return t.error();
        p.cold_tokens = std::move(*t);
        for (int w = 0; w < a.warm_turns; ++w) {
            auto segs = p.cold;
            segs.back().content = g.question();
            auto wt = pb.tokens(segs);
            if (!wt) return wt.error();
            p.warm.push_back(std::move(segs));
            p.warm_tokens.push_back(std::move(*wt));
        }
        prompts.push_back(std::move(p));
    }
    return prompts;
}

result<std::unique_ptr<bench_system>> start_s2_system(const std::string & name, const s2_args & a,
                                                      const model_flags & mf, uint64_t bpt) {
    if (name == "warmctx") {
        warmctx_system_options o;
        o.mf = mf;
        o.holders = 2;
        return start_warmctx_system(o);
    }
    llama_server_options o;
    o.binary = a.llama_server;
    o.mf = mf;
    o.cache_ram_mib = a.cache_ram_mib;
    o.kv_bytes_per_token = bpt;
    return start_llama_server(o);
}

// One system's cold turn and warm turns on workspace `ws`: row[name], and its allocated KV
// in row["kv_allocated_bytes_bound"].
status measure_s2_system(const std::string & name, bench_system & sys, const s2_prompt & p, const std::string & ws,
                         json & row) {
    // Each system's KV allocation at this size (streams/slots whole, plus the
    // bound of its prefix pool or prompt cache).
    row["kv_allocated_bytes_bound"][name] = sys.describe().value("kv_allocated_bytes_bound", uint64_t{0});
    progress(name + ": " + std::to_string(p.cold_tokens.size()) + "-token prompt, cold");
    auto cold = sys.send(ws, p.cold, p.cold_tokens, 1);
    if (!cold.ok) return engine_error(name + ": cold turn failed: " + cold.error);
    std::vector<double> warm_ms, warm_server_ms;
    json warm_all = json::array(), warm_phases = json::array(), warm_turns = json::array();
    int warm_cached = 0, warm_prompt = 0;
    for (size_t w = 0; w < p.warm.size(); ++w) {
        auto t = sys.send(ws, p.warm[w], p.warm_tokens[w], 1);
        if (!t.ok) return engine_error(name + ": warm turn failed: " + t.error);
        warm_ms.push_back(t.ttft_ms);
        warm_server_ms.push_back(t.server_ms);
        warm_all.push_back(t.ttft_ms);
        if (!t.phases.is_null()) warm_phases.push_back(t.phases);
        warm_turns.push_back(
            {{"prompt_tokens", t.prompt_tokens}, {"cached_tokens", t.cached_tokens}, {"reason", t.reason}});
        warm_cached = t.cached_tokens;
        warm_prompt = t.prompt_tokens;
    }
    const double warm = median(warm_ms);
    progress(name + ": cold " + std::to_string(cold.ttft_ms) + " ms, warm " + std::to_string(warm) + " ms");
    row[name] = {{"cold_ttft_ms", cold.ttft_ms}, {"cold_prompt_tokens", cold.prompt_tokens},
                 {"cold_cached_tokens", cold.cached_tokens}, {"warm_ttft_ms", warm},
                 {"warm_ttft_ms_all", warm_all}, {"warm_prompt_tokens", warm_prompt},
                 {"warm_cached_tokens", warm_cached},
                 {"cold_server_ms", cold.server_ms}, {"warm_server_ms", median(warm_server_ms)},
                 {"warm_over_cold", cold.ttft_ms > 0 ? warm / cold.ttft_ms : 0.0}};
    if (!cold.phases.is_null()) row[name]["cold_phases"] = cold.phases;
    if (!warm_phases.empty()) row[name]["warm_phases_all"] = warm_phases;
    row[name]["warm_turns_all"] = warm_turns;  // each warm turn's tokens and, from warmctx, why
    return {};
}

// llama-bench's prefill of the same prompt length: row["llama_bench"], and each system's
// cold TTFT over it.
status add_llama_bench_floor(const s2_args & a, const model_flags & mf, int threads, const s2_prompt & p, json & row) {
    auto eo = mf.to_options(1);
    if (!eo) return eo.error();
    const int n = (int)p.cold_tokens.size();
    auto r = llama_bench_run(a.llama_bench, *eo, threads, n, 0, 0, 1, mf.gpu_layers != 0);
    if (!r) return r.error();
    const double ms = r->tps > 0 ? n * 1000.0 / r->tps : 0;
    row["llama_bench"] = {{"pp_tps", r->tps}, {"prefill_ms", ms}};
    for (const auto & name : a.systems)
        if (row.contains(name) && ms > 0)
            row[name]["cold_over_llama_bench"] = row[name]["cold_ttft_ms"].get<double>() / ms;
    return {};
}

void print_s2(const s2_args & a, const json & rows) {
    std::printf("%8s  %-13s %12s %12s %9s %9s %12s\n", "prompt", "system", "cold ms", "warm ms", "warm/cold", "cached",
                "cold/l-bench");
    for (const auto & r : rows)
        for (const auto & name : a.systems) {
            if (!r.contains(name)) continue;
            const auto & x = r[name];
            std::printf("%8d  %-13s %12.1f %12.1f %9.4f %9d %12.3f\n", r["prompt_tokens"].get<int>(), name.c_str(),
                        x["cold_ttft_ms"].get<double>(), x["warm_ttft_ms"].get<double>(),
                        x["warm_over_cold"].get<double>(), x["warm_cached_tokens"].get<int>(),
                        x.value("cold_over_llama_bench", 0.0));
        }
}

int run_s2(const s2_args & a) {
    if (a.sizes.empty() || a.warm_turns < 1)
        return fail(invalid_argument("--sizes needs a size and --warm-turns >= 1"));
    for (const auto & s : a.systems)
        if (s != "warmctx" && s != "llama-server") {
            return fail(invalid_argument("--systems: unknown system '" + s + "' (warmctx, llama-server)"));
        }
    auto pb = prompt_builder::open(a.mf);
    if (!pb) return fail(pb.error());
    auto prompts = build_s2_prompts(a, **pb);
    if (!prompts) return fail(prompts.error());
    const std::string model_path = (*pb)->model_path();
    const std::string model_desc = (*pb)->model_description();
    const uint64_t bpt = (*pb)->kv_bytes_per_token();
    pb->reset();

    model_flags mf = a.mf;
    mf.model = model_path;
    const uint32_t chunk = std::max<uint32_t>(1, mf.chunk);

    // A warm-up request first, so one-time costs (buffers, GPU library handles) are
    // paid before the cold turn is timed, as they would be in a server that has run.
    // It shares no text with the S2 prompts, so the cold turn stays cold.
    const std::vector<segment> warmup_segs = {{"question", segment_kind::user, "", "", "Say hello."}};
    std::vector<token_id> warmup_tokens;
    {
        auto pb2 = prompt_builder::open(mf);
        if (!pb2) return fail(pb2.error());
        auto t = (*pb2)->tokens(warmup_segs);
        if (!t) return fail(t.error());
        warmup_tokens = std::move(*t);
    }

    json out = {{"bench", "s2"}, {"model", model_path}, {"model_desc", model_desc}, {"backend", backend_name()},
                {"warm_turns", a.warm_turns}, {"flash_attn", mf.flash_attn}, {"gpu_layers", mf.gpu_layers}};
    json rows = json::array();
    json systems = json::array();
    const int threads = mf.threads > 0 ? mf.threads : (int)std::max(1u, std::thread::hardware_concurrency());

    // Each size gets fresh processes sized for it, so every cold turn is truly cold.
    for (const auto & p : *prompts) {
        size_t longest = p.cold_tokens.size();
        for (const auto & w : p.warm_tokens) longest = std::max(longest, w.size());
        mf.n_ctx = (uint32_t)((longest + 64 + chunk - 1) / chunk * chunk);
        json row = {{"target_prefix_tokens", p.target}, {"prompt_tokens", p.cold_tokens.size()}, {"n_ctx", mf.n_ctx}};
        const std::string ws = "s2-" + std::to_string(p.target);
        for (const auto & name : a.systems) {
            auto sys = start_s2_system(name, a, mf, bpt);
            if (!sys) return fail(sys.error());
            if (auto w = (*sys)->send("warmup", warmup_segs, warmup_tokens, 1); !w.ok) {
                return fail(engine_error(name + ": warm-up request failed: " + w.error));
            }
            if (systems.size() < a.systems.size()) systems.push_back({{"name", name}, {"config", (*sys)->describe()}});
            if (status st = measure_s2_system(name, **sys, p, ws, row); !st.ok()) return fail(st);
        }
        if (!a.skip_llama_bench)
            if (status st = add_llama_bench_floor(a, mf, threads, p, row); !st.ok()) return fail(st);
        rows.push_back(std::move(row));
    }

    out["systems"] = systems;
    out["rows"] = rows;
    if (a.json_out) { std::printf("%s\n", out.dump(2).c_str()); return 0; }
    print_s2(a, rows);
    return 0;
}

}  // namespace

void register_s2_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<s2_args>();
    auto * c = bench.add_subcommand(
        "s2", "cold vs warm time to first token at 2k..47k-token stable prefixes, warmctx next to llama-server");
    a->mf.add_to(*c, false);
    c->add_option("--sizes", a->sizes, "stable-prefix sizes, tokens")->delimiter(',')->capture_default_str();
    c->add_option("--warm-turns", a->warm_turns, "warm turns per size (the median is reported)")->capture_default_str();
    c->add_option("--systems", a->systems, "systems to run: warmctx, llama-server")
        ->delimiter(',')
        ->capture_default_str();
    c->add_option("--llama-server", a->llama_server, "llama-server binary")->capture_default_str();
    c->add_option("--llama-bench", a->llama_bench, "llama-bench binary (cold prefill reference)")
        ->capture_default_str();
    c->add_flag("--no-llama-bench", a->skip_llama_bench, "skip the llama-bench reference");
    c->add_option("--cache-ram", a->cache_ram_mib, "llama-server --cache-ram, MiB (-1 = its default)")
        ->capture_default_str();
    c->add_option("--seed", a->seed, "workspace content seed")->capture_default_str();
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_s2(*a); });
}

}  // namespace warmctx::cli
