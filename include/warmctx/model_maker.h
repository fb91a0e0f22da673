// warmctx/model_maker.h - generates Qwen2-architecture GGUF models with the real
// Qwen2 tokenizer and chat template and deterministic pseudo-random weights.
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

struct model_shape {
    std::string name;
    int32_t n_layer = 0;
    int32_t n_embd = 0;
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t n_ff = 0;
    int32_t n_ctx_train = 0;   // declared training context (admits the 47k-token benchmarks)
    float rope_freq_base = 1000000.0f;
    float rms_eps = 1e-6f;
};

// tiny, qwen2.5-0.5b, qwen2.5-1.5b
const std::vector<model_shape> & model_shapes();

struct make_model_options {
    std::string shape = "tiny";
    std::string type = "f16";        // f16 | q8_0 | q4_0
    uint64_t seed = 0;
    std::string out_path;
    std::string vocab_path;          // "" = default_vocab_path()
    int32_t n_threads = 0;           // for quantization; 0 = all
    std::function<void(const std::string &)> progress;  // one line per step, may be empty
};

// Writes the model to out_path (via a temporary file and a rename).
// Errors: invalid_argument (unknown shape/type, no output path), not_found (vocab),
//         io_error (cannot write), engine_error (quantization failed).
status make_model(const make_model_options & opts);

// The Qwen2 vocabulary shipped beside the binary (share/warmctx/ggml-vocab-qwen2.gguf,
// from the pinned llama.cpp tree; found as warmctx/resources.h says).
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
