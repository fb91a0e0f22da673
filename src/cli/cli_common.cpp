// What the warmctx and warmctx-bench commands share: the model and cache flags, progress
// lines and the exit code of an error.
#include <limits>
#include <exception>
#include <fstream>
#include <sstream>

#include "cli.h"
#include "warmctx/chat_template.h"

#ifndef WARMCTX_VERSION
#define WARMCTX_VERSION "0"
#endif

namespace warmctx::cli {

void progress(const std::string & line) {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
}

int fail(const status & st) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    switch (st.code()) {
        case status_code::invalid_argument:
        case status_code::out_of_range:
        case status_code::not_found: return 2;
        default: return 1;
    }
}

void model_flags::add_to(CLI::App & app, bool with_ctx) {
    app.add_option(
        "-m,--model", model,
        "GGUF model file (default: a generated qwen2.5-0.5b q4_0, cached under $WARMCTX_HOME or ~/.cache/warmctx)");
    if (with_ctx)
        app.add_option(
               "-c,--n-ctx", n_ctx,
               "context per sequence, tokens (0 = the model's training context, or the largest whose KV "
               "streams fit " +
                   std::to_string(default_kv_share_bytes() >> 20) +
                   " MiB, a quarter of RAM up to 8 GiB; "
                   "with flash attention on the CPU each stream has 64 cells more, which pad small batches)")
            ->capture_default_str();
    app.add_option("-t,--threads", threads, "CPU threads (0 = all cores)")->capture_default_str();
    app.add_option("--gpu-layers", gpu_layers,
                   "layers to offload to the GPU in a CUDA build (-1 = all, the default there; 0 = run on the CPU)")
        ->capture_default_str();
    app.add_option("--kv-type", kv_type, "KV cache type: f32, f16, bf16, q8_0, q4_0, ...")->capture_default_str();
    app.add_option("--kv-mode", kv_mode, "exact (per-sequence KV, bit-identical reuse) or shared (one unified KV)")
        ->capture_default_str();
    app.add_option("--chunk", chunk, "canonical prefill chunk, tokens")->capture_default_str();
    app.add_flag(
        "--flash-attn{true},--no-flash-attn{false}", flash_attn,
        "flash attention on (the default, as llama-server's -fa auto) or off; a quantized KV type needs it on");
    app.add_flag("--exact-steps{true},--no-exact-steps{false}", exact_steps,
                 "on the CPU, decode a lone row as two where the engine measures that one row alone gives other "
                 "bits (the default: an answer is the same decoded alone, beside other requests or with drafts) "
                 "or not (faster where one row decodes alone)");
    app.add_option(
        "--chat-template-file", chat_template_file,
        "a Jinja chat template to use instead of the model's own (e.g. one of llama.cpp's models/templates/)");
    app.add_flag("--no-jinja", no_jinja,
                 "render prompts with llama.cpp's built-in per-message templates instead of the model's Jinja template "
                 "(no tools in the template's own format, no tool-call parsing)");
    app.add_flag("-v,--verbose", verbose, "show llama.cpp's log");
}

void cache_flags::add_to(CLI::App & app) {
    app.add_option("--budget-tokens", budget_tokens, "global KV budget of the prefix cache, tokens (0 = unlimited)")
        ->capture_default_str();
    app.add_option("--budget-bytes", budget_bytes,
                   "bytes of KV the cached prefixes may hold in RAM, all together (default: a quarter of RAM, at most "
                   "8 GiB; 0 = unlimited)")
        ->capture_default_str();
    app.add_option("--workspace-budget-tokens", workspace_budget_tokens,
                   "per-workspace KV budget, tokens (0 = unlimited)")
        ->capture_default_str();
    app.add_option("--workspace-budget-bytes", workspace_budget_bytes, "per-workspace KV budget, bytes (0 = unlimited)")
        ->capture_default_str();
    app.add_option("--checkpoint-budget-bytes", checkpoint_budget_bytes,
                   "bytes of RAM the KV streams' checkpoints may hold together, on hybrid, recurrent and "
                   "sliding-window models (-1 = half of --budget-bytes; 0 = unlimited); past it the idle stream "
                   "used longest ago moves its prefix to the RAM pool")
        ->check(CLI::Range(int64_t{-1}, std::numeric_limits<int64_t>::max()))
        ->capture_default_str();
    app.add_option("--checkpoints-per-stream", checkpoints_per_stream,
                   "the most checkpoints one KV stream keeps (hybrid, recurrent and sliding-window models; a long "
                   "conversation takes some every turn); past it the one nearest to the one before it goes")
        ->check(CLI::Range(1u, 65536u))
        ->capture_default_str();
    app.add_option("--checkpoint-gap", checkpoint_gap,
                   "tokens between the block ends a prefill takes checkpoints at, at least (-1 = what taking one "
                   "costs in prefilled tokens, measured; 0 = every block end)")
        ->check(CLI::Range(-1, 1 << 20))
        ->capture_default_str();
    app.add_option("--policy", policy,
                   "eviction policy: semantic (volatile content first, then stable content least reused first; see "
                   "docs/architecture.md) or lru")
        ->capture_default_str();
    app.add_option(
        "--kinds", kinds_file,
        "JSON file overriding the segment kind table, e.g. {\"kinds\":{\"repo_map\":{\"retention\":\"highest\"}}}");
    app.add_option("--tenant", tenant, "tenant salt: two tenants never share a cache entry");
    app.add_option(
        "--cache-dir", cache_dir,
        "disk tier: snapshot directory (stable prefixes survive restarts; serve defaults to <cache dir>/kv)");
    app.add_option("--disk-budget-bytes", disk_budget_bytes,
                   "disk tier byte budget (0 = unlimited; serve with its default cache directory keeps 8 GiB unless "
                   "this is given)")
        ->capture_default_str();
    app.add_option("--disk-min-class", disk_min_class,
                   "lowest retention class kept on disk (low, medium, high, highest)")
        ->capture_default_str();
    app.add_flag("--fixed-order", fixed_order,
                 "keep the kind table's order of stable segments and whole chunks (no learned volatility order, no "
                 "finer blocks at edits, the generation prompt always a chunk of its own; docs/architecture.md)");
}

status cache_flags::apply(context_engine_options & o) const {
    o.budget.max_tokens = budget_tokens;
    o.budget.max_bytes = budget_bytes;
    o.budget.workspace_max_tokens = workspace_budget_tokens;
    o.workspace_max_bytes = workspace_budget_bytes;
    o.stream_checkpoint_max_bytes = checkpoint_budget_bytes >= 0 ? (uint64_t)checkpoint_budget_bytes : budget_bytes / 2;
    o.stream_checkpoint_max_count = checkpoints_per_stream;
    o.checkpoint_gap_tokens = checkpoint_gap;
    auto p = parse_eviction_policy(policy);
    if (!p.ok()) return p.error();
    o.policy = *p;
    o.tenant_salt = tenant;
    o.tiers.cache_dir = cache_dir;
    o.tiers.disk_budget_bytes = disk_budget_bytes;
    o.volatility.enabled = !fixed_order;
    {
        auto c = parse_retention_class(disk_min_class);
        if (!c.ok()) return c.error();
        if (*c == retention_class::none)
            return invalid_argument("--disk-min-class must be low, medium, high or highest");
        o.tiers.disk_min_class = *c;
    }
    if (!kinds_file.empty()) {
        std::ifstream f(kinds_file);
        if (!f) return not_found("cannot open kinds file '" + kinds_file + "'");
        std::stringstream ss;
        ss << f.rdbuf();
        auto k = kind_table::from_json(ss.str());
        if (!k.ok()) return k.error().with_context(kinds_file);
        o.kinds = *k;
    }
    return {};
}

result<engine_options> model_flags::to_options(uint32_t n_seq_max) const {
    engine_options o;
    if (model.empty()) {
        auto p = ensure_default_model(progress);
        if (!p) return p.error();
        o.model_path = *p;
    } else {
        o.model_path = model;
    }
    auto mode = parse_kv_mode(kv_mode);
    if (!mode) return mode.error();
    o.mode = *mode;
    o.n_ctx = n_ctx;
    o.auto_ctx_max_bytes = default_kv_share_bytes();
    o.n_seq_max = n_seq_max;
    o.chunk_tokens = chunk;
    o.n_threads = threads;
    o.n_gpu_layers = gpu_layers;
    o.kv_type = kv_type;
    o.flash_attn = flash_attn;
    o.exact_steps = exact_steps;
    o.verbose = verbose;
    o.jinja = !no_jinja;
    if (!chat_template_file.empty()) {
        std::ifstream f(chat_template_file, std::ios::binary);
        if (!f) return not_found("cannot open chat template file '" + chat_template_file + "'");
        std::stringstream ss;
        ss << f.rdbuf();
        o.chat_template = ss.str();
        if (o.chat_template.empty())
            return invalid_argument("chat template file '" + chat_template_file + "' is empty");
        auto t = chat_templates::load({o.chat_template, "", "", false});
        if (!t.ok()) return t.error().with_context(chat_template_file);
    }
    return o;
}

std::string version_line(const std::string & program) {
    return program + " " + WARMCTX_VERSION + " (llama.cpp " + std::string(llama_commit()) + ", " +
           std::string(backend_name()) + ")";
}

int parse_and_run(CLI::App & app, int argc, char ** argv, const int & rc) {
    // An unknown first word is named, with the commands that exist (CLI11 alone says
    // only "A subcommand is required").
    if (argc > 1 && argv[1][0] != '-') {
        std::string names;
        bool known = false;
        for (const CLI::App * sub : app.get_subcommands({})) {
            known = known || sub->check_name(argv[1]);
            names += (names.empty() ? "" : ", ") + sub->get_name();
        }
        if (!known) {
            std::fprintf(stderr, "error: unknown command '%s' (commands: %s; see --help)\n", argv[1], names.c_str());
            return 2;
        }
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError & e) {
        // --help and --version exit 0; every usage error exits 2, as POSIX tools do.
        const int code = app.exit(e);
        return code == 0 ? 0 : 2;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return rc;
}

}  // namespace warmctx::cli
