// engine/model_maker.h - generates GGUF models (Qwen2, Qwen3.5 hybrid, gpt-oss, Qwen3
// MoE architectures) with the real Qwen2 tokenizer, each family's own chat template and
// deterministic pseudo-random weights.
//
// The text such a model writes is gibberish, but its token counts, compute and
// memory are those of the real model of the same shape, so timings and cache
// behaviour are real. The same options always give a byte-identical file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "warmctx/status.h"

namespace warmctx {

// One model shape. arch "qwen2" is written tensor by tensor here; every other
// architecture (qwen35, gpt-oss, qwen3moe) through llama.cpp's own model builder
// (llama_model_init_from_user), which creates each tensor the architecture needs.
struct model_shape {
    std::string name;
    std::string arch = "qwen2";         // GGUF general.architecture
    std::string template_name = "qwen2.5-chat-template.jinja";  // shipped in share/warmctx/
    int32_t n_layer = 0;
    int32_t n_embd = 0;
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t n_ff = 0;
    int32_t n_ctx_train = 65536;        // declared training context (admits the 47k-token benchmarks)
    float rope_freq_base = 1000000.0f;
    float rms_eps = 1e-6f;
    int32_t head_dim = 0;               // 0 = n_embd / n_head
    int32_t n_rot = 0;                  // rotary dimensions; 0 = head_dim
    bool tied_embd = true;              // qwen2: output.weight shares token_embd
    // Mixture of experts (gpt-oss, qwen3moe).
    int32_t n_expert = 0;
    int32_t n_expert_used = 0;
    int32_t n_ff_exp = 0;
    // Sliding-window attention (gpt-oss: every other layer).
    int32_t n_swa = 0;
    // Gated DeltaNet recurrent layers (qwen35): a full-attention layer every
    // full_attn_interval layers, the others recurrent.
    int32_t full_attn_interval = 0;
    int32_t ssm_d_state = 0;            // head dimension of the linear attention
    int32_t ssm_n_group = 0;            // key heads
    int32_t ssm_dt_rank = 0;            // value heads
    int32_t ssm_d_conv = 0;
    bool for_tests = false;             // a tiny shape (fast on a small CPU)

    int32_t head_dim_or_default() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
};

// The shapes: tiny ones for tests (tiny, tiny-hybrid, tiny-swa, tiny-moe, tiny-unsupported) and ones with
// published dimensions for benchmarks (qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b,
// qwen3.5-hybrid, gpt-oss-20b, qwen3-coder-30b-a3b).
const std::vector<model_shape> & model_shapes();

// The shape of that name, or nullptr.
const model_shape * find_model_shape(const std::string & name);

struct make_model_options {
    std::string shape = "tiny";
    std::string type = "f16";        // f16 | q8_0 | q4_0
    uint64_t seed = 0;
    std::string out_path;
    std::string vocab_path;          // "" = default_vocab_path()
    int32_t n_threads = 0;           // for quantization; 0 = all
    std::function<void(const std::string &)> progress;  // one line per step, may be empty
};

// Writes the model to out_path (via a temporary file and a rename). Shapes of an
// architecture other than qwen2 are built in memory by llama.cpp before being written:
// they need about as much RAM as the f16 file (gpt-oss-20b: ~42 GB), plus the disk for
// the f16 file and the output while quantizing.
// Errors: invalid_argument (unknown shape/type, no output path), not_found (vocab),
//         io_error (cannot write), engine_error (quantization failed).
status make_model(const make_model_options & opts);

// The Qwen2 vocabulary shipped beside the binary (share/warmctx/ggml-vocab-qwen2.gguf,
// from the pinned llama.cpp tree; found as util/resources.h says).
std::string default_vocab_path();

// Where warmctx keeps generated models: $WARMCTX_HOME, else $XDG_CACHE_HOME/warmctx,
// else ~/.cache/warmctx.
std::string cache_home();

// A generated model under cache_home()/models/<shape>-<type>-seed<seed>.gguf, made on
// first use (with progress lines). Errors: those of make_model.
result<std::string> ensure_model(const std::string & shape, const std::string & type, uint64_t seed,
                                 const std::function<void(const std::string &)> & progress);

// The default model: qwen2.5-0.5b, q4_0, seed 0, generated once under cache_home()/models.
// Generates it (with progress lines) on first use.
result<std::string> ensure_default_model(const std::function<void(const std::string &)> & progress);

}  // namespace warmctx
