// warmctx - a workspace-context engine for local LLM inference.
#include <exception>

#include "cli.h"

#ifndef WARMCTX_VERSION
#define WARMCTX_VERSION "0"
#endif

namespace warmctx::cli {

int g_exit_code = 0;

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
    app.add_option("-m,--model", model,
                   "GGUF model file (default: a generated qwen2.5-0.5b q4_0, cached under $WARMCTX_HOME or ~/.cache/warmctx)");
    if (with_ctx) app.add_option("-c,--n-ctx", n_ctx, "context per sequence, tokens")->capture_default_str();
    app.add_option("-t,--threads", threads, "CPU threads (0 = all cores)")->capture_default_str();
    app.add_option("--gpu-layers", gpu_layers, "layers to offload to the GPU in a CUDA build (-1 = all)")->capture_default_str();
    app.add_option("--kv-type", kv_type, "KV cache type: f32, f16, bf16, q8_0, q4_0, ...")->capture_default_str();
    app.add_option("--kv-mode", kv_mode, "exact (per-sequence KV, bit-identical reuse) or shared (one unified KV)")
        ->capture_default_str();
    app.add_option("--chunk", chunk, "canonical prefill chunk, tokens")->capture_default_str();
    app.add_flag("--flash-attn", flash_attn, "use flash attention (needed for quantized KV types)");
    app.add_flag("-v,--verbose", verbose, "show llama.cpp's log");
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
    o.n_seq_max = n_seq_max;
    o.chunk_tokens = chunk;
    o.n_threads = threads;
    o.n_gpu_layers = gpu_layers;
    o.kv_type = kv_type;
    o.flash_attn = flash_attn;
    o.verbose = verbose;
    return o;
}

}  // namespace warmctx::cli

int main(int argc, char ** argv) {
    using namespace warmctx::cli;
    CLI::App app{"warmctx - keeps the KV of a coding agent's stable context warm across turns, and proves warm == cold"};
    app.set_version_flag("--version", std::string("warmctx ") + WARMCTX_VERSION + " (llama.cpp " +
                                          std::string(warmctx::llama_commit()) + ", " +
                                          std::string(warmctx::backend_name()) + ")");
    app.require_subcommand(1);
    register_model_commands(app);
    register_bench_commands(app);
    register_context_commands(app);
    register_serve_command(app);
    register_snapshot_commands(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError & e) {
        return app.exit(e);
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return g_exit_code;
}
