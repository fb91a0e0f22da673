// engine/engine_adapters.h - the engine seen through the seams of the layers below it.
//
// The assembler tokenizes through a text_model, which knows no engine. This adapter
// implements it over a real engine, and engine_profile() computes the profile (the
// fingerprint that roots every chain hash) of the KV an engine computes.
#pragma once

#include <memory>

#include "warmctx/assembler.h"
#include "warmctx/engine.h"
#include "warmctx/profile.h"

namespace warmctx {

// The model's tokenizer and chat template. Plain-text tokens of segment contents of 256
// bytes and more are remembered by content hash (least recently used out past 8 M
// tokens): an unchanged segment is not tokenized again next turn. Thread-safe.
std::unique_ptr<text_model> make_engine_text_model(const engine & e);

// The model's Jinja chat template behind a text model made by make_engine_text_model,
// when it renders conversations with one (engine_options::jinja and a template that
// loads); nullptr otherwise.
class chat_templates;
const chat_templates * engine_chat_templates(const text_model & tm);

// Every field that decides the KV's bits: the model file's digest (memoised), the
// tokenizer's, the chat template's, the llama.cpp commit, backend, RoPE, KV type, chunk
// size, KV mode, flash attention, GPU layers. Not the context's size or sequence count:
// they do not change the KV (see profile.h).
// Errors: those of file_digest on the model file.
result<profile> engine_profile(const engine & e, const engine_options & opts);

// Sets the profile's block grid (checkpoint_tokens, span_tokens) from its chunk size and
// the engine's model and context: the one place both are derived.
void set_block_grid(profile & p, const engine & e);

}  // namespace warmctx
