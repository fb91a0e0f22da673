// Helpers for tests on the generated tiny model (CTest fixture make_tiny_model).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "warmctx/engine.h"

namespace warmctx::testing {

inline engine_options tiny_options(kv_mode mode = kv_mode::exact, uint32_t n_seq = 4) {
    engine_options o;
    o.model_path = WARMCTX_TINY_MODEL;
    o.n_ctx = 2048;
    o.n_seq_max = n_seq;
    o.chunk_tokens = 64;
    o.n_threads = 1;
    o.mode = mode;
    return o;
}

inline std::unique_ptr<engine> open_tiny(kv_mode mode = kv_mode::exact, uint32_t n_seq = 4) {
    auto e = engine::open(tiny_options(mode, n_seq));
    EXPECT_TRUE(e.ok()) << e.error().to_string();
    return e.ok() ? std::move(e.value()) : nullptr;
}

inline std::vector<token_id> random_tokens(size_t n, uint32_t seed, int32_t n_vocab) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<token_id> d(0, std::min(n_vocab, 150000) - 1);
    std::vector<token_id> v(n);
    for (auto & t : v) t = d(rng);
    return v;
}

}  // namespace warmctx::testing
