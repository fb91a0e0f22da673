// Shared helpers of the warmctx and warmctx-bench subcommands (cli_common.cpp).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "warmctx/context_engine.h"
#include "warmctx/engine.h"
#include "engine/model_maker.h"
#include "util/resources.h"
#include "workload/workload.h"

namespace warmctx::cli {

// Options every command that loads a model takes.
struct model_flags {
    std::string model;          // "" = the default model (generated once, cached)
    uint32_t n_ctx = 0;         // 0 = automatic (engine_options::n_ctx)
    int32_t threads = 0;
    // A CUDA build offloads every layer, as llama-server does (--gpu-layers 0 opts out).
    // Flash attention is on by default on the GPU and on the CPU, as llama-server's
    // `-fa auto` turns it on on both (--no-flash-attn opts out): on the CPU it prefills
    // chunks of 64 tokens and more at depth much faster (docs/benchmarks.md), and chunks
    // of 4 to 63 tokens slower.
    int32_t gpu_layers = backend_name() == "CPU" ? 0 : -1;
    std::string kv_type = "f16";
    std::string kv_mode = "exact";
    uint32_t chunk = 512;
    bool flash_attn = true;
    bool exact_steps = true;
    bool verbose = false;
    std::string chat_template_file;  // "" = the model's own template
    bool no_jinja = false;

    void add_to(CLI::App & app, bool with_ctx = true);
    // Resolves the model path (generating the default if needed) into engine options.
    result<engine_options> to_options(uint32_t n_seq_max) const;
};

// Flags that shape the context engine above the model: budgets, policy, kinds,
// tenant, and the host-RAM and disk tiers.
struct cache_flags {
    uint64_t budget_tokens = 0;
    uint64_t budget_bytes = default_kv_share_bytes();
    uint64_t workspace_budget_tokens = 0;
    uint64_t workspace_budget_bytes = 0;
    int64_t checkpoint_budget_bytes = -1;  // -1: half of budget_bytes (none when that is 0)
    uint32_t checkpoints_per_stream = 32;
    int32_t checkpoint_gap = -1;
    std::string policy = "semantic";
    std::string kinds_file;
    std::string tenant;
    std::string cache_dir;
    uint64_t disk_budget_bytes = 0;
    std::string disk_min_class = "high";
    bool fixed_order = false;

    void add_to(CLI::App & app);
    status apply(context_engine_options & o) const;
};

// Where serve keeps its disk tier by default, and where `warmctx snapshot` looks:
// <cache home>/kv (the workspace store beside it, in kv/workspaces).
inline std::string default_disk_dir() { return cache_home() + "/kv"; }
// serve's disk tier budget when none is given.
inline constexpr uint64_t k_default_disk_budget = uint64_t{8} << 30;

// Progress lines go to stderr so that --json output on stdout stays clean.
void progress(const std::string & line);

// Prints "error: <message>" to stderr and returns the process exit code for `st`.
int fail(const status & st);

// Makes `run` the action of command `c`. Every command's function returns its exit
// code; CLI11 callbacks return void, so the callback stores it in `rc`, which main
// returns.
template <class F>
void on_run(CLI::App * c, int & rc, F run) {
    c->callback([&rc, run = std::move(run)] { rc = run(); });
}

// "<program> <version> (llama.cpp <commit>, <backend>)", what --version prints.
std::string version_line(const std::string & program);

// Parses the command line into `app` and runs the chosen command: its exit code (the one
// its callback stored in `rc`), 0 for --help and --version, 2 for a usage error (an
// unknown first word is named with the commands that exist), 1 for an exception.
int parse_and_run(CLI::App & app, int argc, char ** argv, const int & rc);

// Each adds its subcommands to `app`; `rc` receives the exit code of the one that runs.
// warmctx's commands:
void register_model_commands(CLI::App & app, int & rc);
void register_context_commands(CLI::App & app, int & rc);
void register_serve_command(CLI::App & app, int & rc);
void register_snapshot_commands(CLI::App & app, int & rc);
// warmctx-bench's: every benchmark (register_bench_commands adds all of the others).
void register_bench_commands(CLI::App & app, int & rc);
void register_overhead_bench(CLI::App & bench, int & rc);
void register_restore_bench(CLI::App & bench, int & rc);
void register_http_bench(CLI::App & bench, int & rc);
void register_s2_bench(CLI::App & bench, int & rc);
void register_render_bench(CLI::App & bench, int & rc);
void register_drafts_bench(CLI::App & bench, int & rc);
void register_agents_bench(CLI::App & bench, int & rc);
void register_trace_bench(CLI::App & bench, int & rc);
void register_contention_bench(CLI::App & bench, int & rc);
void register_s3_bench(CLI::App & bench, int & rc);
void register_calls_bench(CLI::App & bench, int & rc);
void register_splits_bench(CLI::App & bench, int & rc);
void register_soak_bench(CLI::App & bench, int & rc);
void register_edits_bench(CLI::App & bench, int & rc);
void register_conversation_bench(CLI::App & bench, int & rc);

// Sizes synthetic workloads with the model's own tokenizer (a rough estimate on error).
inline token_counter counter_for(const context_engine & ce) {
    return [&ce](const std::string & s) -> size_t {
        auto t = ce.tokenize(s);
        return t.ok() ? t->size() : s.size() / 4;
    };
}

}  // namespace warmctx::cli
