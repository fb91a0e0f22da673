// warmctx make-model | info | generate
#include <chrono>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "warmctx/scheduler.h"

namespace warmctx::cli {
namespace {

struct make_model_args {
    make_model_options o;
    std::string shape = "tiny";
};

int run_info(const model_flags & mf, bool json) {
    // serve's default streams: what the engine measures at open (a lone row's pad beside it)
    // depends on them
    auto opts = mf.to_options(scheduler_options{}.n_parallel);
    if (!opts) return fail(opts.error());
    auto eng = engine::open(*opts);
    if (!eng) return fail(eng.error());
    const auto & m = (*eng)->model();
    const auto & c = (*eng)->context();
    nlohmann::json j = {
        {"path", m.path}, {"description", m.description}, {"architecture", m.architecture},
        {"n_params", m.n_params}, {"size_bytes", m.size_bytes}, {"n_vocab", m.n_vocab},
        {"n_ctx_train", m.n_ctx_train}, {"n_layer", m.n_layer}, {"n_embd", m.n_embd},
        {"has_chat_template", !m.chat_template.empty()}, {"n_ctx_seq", c.n_ctx_seq},
        {"kv_type", c.kv_type}, {"kv_mode", kv_mode_name(c.mode)}, {"kv_bytes_per_token", c.kv_bytes_per_token},
        {"backend", c.backend}, {"threads", c.n_threads}, {"llama_commit", llama_commit()},
        {"memory_kind", memory_kind_name(c.memory.kind)}, {"reuse", c.memory.reuse},
        {"sliding_window", c.memory.n_swa}, {"checkpoint_bytes", c.memory.checkpoint_bytes},
        {"memory", c.memory.note}, {"pads_small_batches", c.pads_rows}, {"splits_freely", c.splits_freely},
        {"splits_probe_ms", c.splits_probe_ms}, {"pads_steps", c.pads_steps}, {"pads_beside", c.pads_beside},
        {"steps_pad_cost", c.steps_pad_cost}, {"steps_exact", c.steps_exact},
    };
    if (json) { std::printf("%s\n", j.dump(2).c_str()); return 0; }
    for (auto & [k, v] : j.items())
        std::printf("%-20s %s\n", k.c_str(), v.is_string() ? v.get<std::string>().c_str() : v.dump().c_str());
    return 0;
}

struct generate_args {
    model_flags mf;
    std::string prompt;
    std::string system;
    bool raw = false;
    sampling_params sp;
    bool json = false;
};

int run_generate(const generate_args & a) {
    if (a.prompt.empty()) return fail(invalid_argument("--prompt is empty"));
    auto opts = a.mf.to_options(1);
    if (!opts) return fail(opts.error());
    auto eng_r = engine::open(*opts);
    if (!eng_r) return fail(eng_r.error());
    engine & eng = **eng_r;
    std::string text = a.prompt;
    if (!a.raw) {
        std::vector<chat_message> msgs;
        if (!a.system.empty()) msgs.push_back({"system", a.system});
        msgs.push_back({"user", a.prompt});
        auto t = eng.apply_chat_template(msgs, true);
        if (!t) return fail(t.error());
        text = *t;
    }
    auto toks = eng.tokenize(text);
    if (!toks) return fail(toks.error());
    std::vector<float> logits;
    auto t0 = std::chrono::steady_clock::now();
    status st = eng.prefill(0, *toks, 0, {}, &logits);
    if (!st.ok()) return fail(st);
    double t_prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    auto g = eng.generate(0, std::move(logits), a.sp);
    if (!g) return fail(g.error());
    if (a.json) {
        nlohmann::json j = {{"text", g->text}, {"prompt_tokens", toks->size()}, {"completion_tokens", g->tokens.size()},
                            {"finish_reason", finish_reason_name(g->finish)}, {"t_prefill_ms", t_prefill_ms},
                            {"t_decode_ms", g->t_decode_ms}, {"tokens", g->tokens}};
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("%s\n", g->text.c_str());
    std::fprintf(stderr, "[%zu prompt tokens in %.1f ms, %zu generated in %.1f ms, finish: %s]\n", toks->size(),
                 t_prefill_ms, g->tokens.size(), g->t_decode_ms, std::string(finish_reason_name(g->finish)).c_str());
    return 0;
}

}  // namespace

void register_model_commands(CLI::App & app, int & rc) {
    auto mm = std::make_shared<make_model_args>();
    auto * c = app.add_subcommand("make-model", "generate a GGUF model (Qwen2, Qwen3.5 hybrid, gpt-oss or Qwen3 MoE "
                                                 "architecture) with the real Qwen2 tokenizer and seeded weights");
    std::string shapes;
    for (const auto & s : model_shapes()) {
        const int hd = s.head_dim_or_default();
        shapes += "\n  " + s.name + " (" + s.arch + ", " + std::to_string(s.n_layer) + " layers, n_embd " +
                  std::to_string(s.n_embd) + ", " + std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) +
                  " heads of " + std::to_string(hd);
        if (s.n_expert > 0)
            shapes += ", " + std::to_string(s.n_expert) + " experts (" + std::to_string(s.n_expert_used) + " used)";
        if (s.n_swa > 0) shapes += ", window " + std::to_string(s.n_swa) + " every other layer";
        if (s.full_attn_interval > 0)
            shapes += ", full attention every " + std::to_string(s.full_attn_interval) + " layers";
        shapes += std::string(s.for_tests ? "; for tests" : "") + "; template " + s.template_name + ")";
    }
    c->footer("Every shape declares a 65,536-token training context and carries the real Qwen2 tokenizer.\n"
              "Shapes other than qwen2 ones are built in memory by llama.cpp (llama_model_init_from_user)\n"
              "before being written: they need about as much RAM as the f16 file (gpt-oss-20b: ~42 GB,\n"
              "qwen3-coder-30b-a3b: ~61 GB, qwen3.5-hybrid: ~9 GB), and the disk for the f16 file and the\n"
              "output while quantizing.");
    c->add_option("--shape", mm->o.shape, "model shape:" + shapes)->capture_default_str();
    c->add_option("--type", mm->o.type, "weight type: f16, q8_0, q4_0")->capture_default_str();
    c->add_option("--seed", mm->o.seed, "weight seed (same arguments give a byte-identical file)")
        ->capture_default_str();
    c->add_option("-o,--out", mm->o.out_path, "output GGUF path")->required();
    c->add_option("--vocab", mm->o.vocab_path, "tokenizer source GGUF (default: " + default_vocab_path() + ")");
    c->add_option("-t,--threads", mm->o.n_threads, "threads for quantization (0 = all)");
    on_run(c, rc, [mm] {
        mm->o.progress = progress;
        status st = make_model(mm->o);
        return st.ok() ? 0 : fail(st);
    });

    auto info_flags = std::make_shared<model_flags>();
    auto info_json = std::make_shared<bool>(false);
    auto * i = app.add_subcommand("info", "load a model and print what warmctx sees of it");
    info_flags->add_to(*i);
    i->add_flag("--json", *info_json, "print JSON");
    on_run(i, rc, [info_flags, info_json] { return run_info(*info_flags, *info_json); });

    auto ga = std::make_shared<generate_args>();
    auto * g = app.add_subcommand("generate", "prefill a prompt (through the chat template) and generate");
    ga->mf.add_to(*g);
    g->add_option("-p,--prompt", ga->prompt, "user message")->required();
    g->add_option("--system", ga->system, "system message");
    g->add_flag("--raw", ga->raw, "send the prompt as is, without the chat template");
    g->add_option("-n,--max-tokens", ga->sp.max_tokens, "tokens to generate")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 20));
    g->add_option("--temperature", ga->sp.temperature, "0 = greedy")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 100.0));
    g->add_option("--top-p", ga->sp.top_p, "nucleus sampling")->capture_default_str()->check(CLI::Range(0.0, 1.0));
    g->add_option("--top-k", ga->sp.top_k, "0 = off")->capture_default_str()->check(CLI::NonNegativeNumber);
    g->add_option("--seed", ga->sp.seed, "sampler seed")->capture_default_str();
    g->add_option("--stop", ga->sp.stop, "stop string (repeatable)");
    g->add_flag("--json", ga->json, "print JSON");
    on_run(g, rc, [ga] { return run_generate(*ga); });
}

}  // namespace warmctx::cli
