// model_maker_internal.h - what model_maker.cpp (shapes, qwen2 writer, make_model) and
// model_maker_archs.cpp (the other architectures, through llama.cpp's model builder)
// share. Not a public header.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/model_maker.h"
#include "warmctx/status.h"

struct gguf_context;

namespace warmctx::mm_detail {

using progress_fn = std::function<void(const std::string &)>;

uint64_t splitmix64(uint64_t & s);
uint64_t fnv1a(const std::string & s);

// The chat template a shape's models carry (share/warmctx/<template_name>); "" when the
// file is not found (the vocabulary's own template stays).
std::string shape_chat_template(const model_shape & shape);

// Copies every tokenizer.* key of the vocab file into out and, when tmpl is not empty,
// sets tokenizer.chat_template to it. n_vocab: the number of tokens (may be null).
status copy_tokenizer(gguf_context * out, const std::string & vocab_path, const std::string & tmpl, int64_t * n_vocab);

// Writes shape (an architecture other than qwen2) with seeded weights to out_path:
// matrices f16, norms and other 1-D tensors f32, built by llama_model_init_from_user
// and written by llama_model_save_to_file (which writes no chat template: see
// finish_arch_model).
status write_arch_model(const model_shape & shape, uint64_t seed, const std::string & vocab_path,
                        const std::string & out_path, const progress_fn & progress);

// Copies in_path (written by write_arch_model, then quantized) to out_path with the
// metadata the model was built from: the architecture's keys, the vocab file's
// tokenizer.* keys and the shape's chat template (llama_model_save_to_file writes every
// hyperparameter, defaults included, and no chat template), plus the quantizer's
// general.file_type. The tensor data is copied byte for byte.
status finish_arch_model(const std::string & in_path, const model_shape & shape, uint64_t seed,
                         const std::string & vocab_path, const std::string & out_path);

}  // namespace warmctx::mm_detail
