// warmctx-bench calls - what one decode call costs at depth, by size and by how the
// tokens are split into calls, with the host's share apart from the device's:
//   for each size N and split K, N tokens at positions [D, D + N) of a sequence that
//   holds D tokens, in K calls of (nearly) equal size; each call timed until llama_decode
//   returns (host: batch, slot search, graph, inputs such as the attention mask,
//   launches) and until its logits are read (total); then the N tokens are removed.
// Next to it, llama-bench's prefill of N tokens at depth D (its own context of D + N
// cells, one stream), the same build and settings: the floor for one call.
// The engine's KV layout is a flag (--streams, --resident, --cells) so that a warm
// turn's call can be measured both in serve's layout and in a small one.
#include <algorithm>
#include <chrono>
#include <random>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_harness.h"
#include "cli.h"
#include "warmctx/engine.h"

namespace warmctx::cli {
namespace {

using json = nlohmann::json;

struct calls_args {
    model_flags mf;
    int depth = 16384;
    std::vector<int> sizes = {3, 32, 96, 280, 512};
    std::vector<int> splits = {1, 2, 4};
    uint32_t streams = 2;
    int32_t resident = 0;
    uint32_t cells = 0;  // 0 = depth + the largest size, rounded up to 256
    int reps = 7;
    std::string llama_bench = default_tool("llama-bench");
    bool skip_llama_bench = false;
    bool json_out = false;
};

struct split_result {
    double total_ms = 0, host_ms = 0;  // medians over the reps, all K calls summed
};

result<split_result> measure_split(engine & eng, const std::vector<token_id> & toks, pos_t depth, int k, int reps) {
    std::vector<double> total, host;
    const int n = (int)toks.size();
    for (int r = 0; r < reps; ++r) {
        double t = 0, h = 0;
        int at = 0;
        for (int i = 0; i < k; ++i) {
            const int len = (n - at) / (k - i);
            auto d = eng.timed_decode(0, std::span<const token_id>(toks.data() + at, (size_t)len), depth + at);
            if (!d) return d.error();
            t += d->total_ms;
            h += d->host_ms;
            at += len;
        }
        WARMCTX_RETURN_IF_ERROR(eng.trim_seq(0, depth));
        total.push_back(t);
        host.push_back(h);
    }
    return split_result{median(total), median(host)};
}

int run_calls(const calls_args & a) {
    if (a.depth < 0 || a.reps < 1 || a.sizes.empty() || a.splits.empty())
        return fail(invalid_argument("--depth >= 0, --reps >= 1, and at least one size and split"));
    const int max_size = *std::max_element(a.sizes.begin(), a.sizes.end());
    for (int n : a.sizes)
        if (n < 1 || (uint32_t)n > a.mf.chunk)
            return fail(
                invalid_argument("each size must be in [1, --chunk] (" + std::to_string(a.mf.chunk) + "): one call"));
    for (int k : a.splits)
        if (k < 1) return fail(invalid_argument("each split must be >= 1"));
    if (a.depth % (int)std::max<uint32_t>(1, a.mf.chunk) != 0)
        return fail(invalid_argument("--depth must be a multiple of --chunk: the prefix is prefilled in whole chunks"));
    if (a.cells != 0 && (uint64_t)a.cells < (uint64_t)a.depth + (uint64_t)max_size)
        return fail(invalid_argument("--cells " + std::to_string(a.cells) + " cannot hold the " +
                                     std::to_string(a.depth) + "-token prefix and " + std::to_string(max_size) +
                                     " tokens after it"));
    auto eo = a.mf.to_options(a.streams);
    if (!eo) return fail(eo.error());
    eo->n_seq_resident = a.resident;
    // By default room for the prefix, the largest size and the cells flash attention's
    // padding of small batches keeps (engine::pad_rows), rounded up as llama.cpp does.
    eo->n_ctx = a.cells ? a.cells : (uint32_t)((a.depth + max_size + engine::k_pad_cells + 255) / 256 * 256);
    eo->padding_within_n_ctx = true;  // --cells: the cells a stream has, the padding's among them
    progress("calls: opening the engine (" + std::to_string(a.streams) + " streams, " + std::to_string(eo->n_ctx) +
             " cells each, resident " + std::to_string(a.resident) + ")");
    auto eng_r = engine::open(*eo);
    if (!eng_r) return fail(eng_r.error());
    engine & eng = **eng_r;
    if ((uint64_t)eng.context().n_ctx_seq < (uint64_t)a.depth + (uint64_t)max_size)
        return fail(invalid_argument("--cells " + std::to_string(a.cells) + " leaves " +
                                     std::to_string(eng.context().n_ctx_seq) + " a sequence may fill (the rest is kept "
                                     "for padding small batches), too few for the prefix and " +
                                     std::to_string(max_size) + " tokens after it"));
    std::mt19937 rng(7);
    std::uniform_int_distribution<token_id> dist(0, eng.model().n_vocab - 1);
    std::vector<token_id> prefix((size_t)a.depth), tail((size_t)max_size);
    for (auto & t : prefix) t = dist(rng);
    for (auto & t : tail) t = dist(rng);
    if (a.depth > 0) {
        progress("calls: prefilling the " + std::to_string(a.depth) + "-token prefix");
        if (status st = eng.prefill(0, prefix, 0, {}, nullptr); !st.ok()) return fail(st);
    }
    // Warm-up: the device's clocks and the allocator's buffers, as the measured calls find them.
    for (const auto t0 = std::chrono::steady_clock::now();
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0;)
        if (auto w = measure_split(eng, tail, a.depth, 1, 1); !w) return fail(w.error());

    const auto & ci = eng.context();
    json out = {{"bench", "calls"},
                {"backend", backend_name()},
                {"model", eo->model_path},
                {"model_desc", eng.model().description},
                {"depth", a.depth},
                {"reps", a.reps},
                {"flash_attn", ci.flash_attn},
                {"gpu_layers", ci.n_gpu_layers},
                {"warmctx_layout",
                 {{"streams", ci.n_seq_max}, {"resident_streams", ci.n_seq_resident},
                  {"cells_per_stream", ci.kv_bytes_per_token > 0 && ci.n_seq_max > 0
                                           ? ci.kv_streams_bytes / ci.kv_bytes_per_token / ci.n_seq_max
                                           : 0},
                  {"usable_cells_per_stream", ci.n_ctx_seq}, {"pads_small_batches", ci.pads_rows},
                  {"kv_allocated_bytes", ci.kv_streams_bytes}}}};
    json rows = json::array();
    for (int n : a.sizes) {
        std::vector<token_id> toks(tail.begin(), tail.begin() + n);
        json row = {{"tokens", n}};
        json per_split = json::array();
        for (int k : a.splits) {
            if (k > n) continue;
            progress("calls: " + std::to_string(n) + " tokens in " + std::to_string(k) + " call(s)");
            auto r = measure_split(eng, toks, a.depth, k, a.reps);
            if (!r) return fail(r.error());
            // The rows the engine added to the first call (they are the same for the rest
            // but the last, give or take one).
            per_split.push_back({{"calls", k}, {"total_ms", r->total_ms}, {"host_ms", r->host_ms},
                                 {"per_call_ms", r->total_ms / k}, {"padded_rows", eng.pad_rows(n / k, a.depth)}});
        }
        row["warmctx"] = per_split;
        if (!a.skip_llama_bench) {
            auto lb = llama_bench_run(a.llama_bench, *eo, ci.n_threads, n, 0, a.depth, a.reps, true);
            if (!lb) return fail(lb.error());
            row["llama_bench_ms"] = lb->tps > 0 ? n * 1000.0 / lb->tps : 0.0;
            // Its context is depth + N tokens, rounded up to 256 cells by llama.cpp: its allocated KV.
            row["llama_bench_kv_allocated_bytes"] = (uint64_t)((a.depth + n + 255) / 256 * 256) * ci.kv_bytes_per_token;
        }
        rows.push_back(std::move(row));
    }
    out["rows"] = rows;
    if (a.json_out) {
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    std::printf("depth %d, %u streams of %u cells\n%8s %6s %10s %10s %12s\n", a.depth, ci.n_seq_max, ci.n_ctx_seq,
                "tokens", "calls", "total ms", "host ms", "llama-bench");
    for (const auto & r : rows)
        for (const auto & s : r["warmctx"])
            std::printf("%8d %6d %10.2f %10.2f %12.2f\n", r["tokens"].get<int>(), s["calls"].get<int>(),
                        s["total_ms"].get<double>(), s["host_ms"].get<double>(), r.value("llama_bench_ms", 0.0));
    return 0;
}

}  // namespace

void register_calls_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<calls_args>();
    auto * c =
        bench.add_subcommand("calls", "what one decode call costs at depth, by size and split, host and device apart");
    a->mf.add_to(*c, false);
    c->add_option("--depth", a->depth, "tokens the sequence holds before the measured calls")->capture_default_str();
    c->add_option("--sizes", a->sizes, "tokens per measurement (each at most --chunk)")
        ->delimiter(',')
        ->capture_default_str();
    c->add_option("--splits", a->splits, "into how many calls each size is split")
        ->delimiter(',')
        ->capture_default_str();
    c->add_option("--streams", a->streams, "KV streams (sequences) of the engine")->capture_default_str();
    c->add_option("--resident", a->resident, "resident streams beyond those (-1: as many as fit, as serve)")
        ->capture_default_str();
    c->add_option("--cells", a->cells, "cells per stream (0: depth + the largest size)")->capture_default_str();
    c->add_option("--reps", a->reps, "repetitions of each measurement (the median is kept)")->capture_default_str();
    c->add_option("--llama-bench", a->llama_bench, "llama-bench binary")->capture_default_str();
    c->add_flag("--no-llama-bench", a->skip_llama_bench, "measure warmctx only");
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_calls(*a); });
}

}  // namespace warmctx::cli
