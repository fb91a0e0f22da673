// warmctx make-model: deterministic bytes, real tokenizer, quantized types load.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "warmctx/engine.h"
#include "engine/model_maker.h"

namespace warmctx {
namespace {

std::string slurp(const std::string & p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
}

TEST(MakeModel, SameArgumentsGiveIdenticalBytes) {
    const std::string dir = WARMCTX_TEST_TMP;
    make_model_options o;
    o.shape = "tiny";
    o.type = "q8_0";
    o.seed = 3;
    o.out_path = dir + "/mm-a.gguf";
    ASSERT_TRUE(make_model(o).ok());
    o.out_path = dir + "/mm-b.gguf";
    ASSERT_TRUE(make_model(o).ok());
    o.seed = 4;
    o.out_path = dir + "/mm-c.gguf";
    ASSERT_TRUE(make_model(o).ok());
    const std::string a = slurp(dir + "/mm-a.gguf"), b = slurp(dir + "/mm-b.gguf"), c = slurp(dir + "/mm-c.gguf");
    EXPECT_GT(a.size(), 1000000u);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
}

TEST(MakeModel, QuantizedModelLoadsAndRuns) {
    const std::string p = std::string(WARMCTX_TEST_TMP) + "/mm-q4.gguf";
    make_model_options o;
    o.shape = "tiny";
    o.type = "q4_0";
    o.out_path = p;
    ASSERT_TRUE(make_model(o).ok());
    engine_options eo;
    eo.model_path = p;
    eo.n_ctx = 256;
    eo.n_seq_max = 1;
    auto e = engine::open(eo);
    ASSERT_TRUE(e.ok()) << e.error().to_string();
    EXPECT_NE((*e)->model().description.find("Q4_0"), std::string::npos) << (*e)->model().description;
    auto t = (*e)->tokenize("def main():\n    return 0\n");
    ASSERT_TRUE(t.ok());
    std::vector<float> logits;
    ASSERT_TRUE((*e)->prefill(0, *t, 0, {}, &logits).ok());
    EXPECT_EQ(logits.size(), (size_t)(*e)->model().n_vocab);
}

TEST(MakeModel, BadArgumentsAreErrors) {
    make_model_options o;
    o.out_path = std::string(WARMCTX_TEST_TMP) + "/never.gguf";
    o.shape = "huge";
    EXPECT_EQ(make_model(o).code(), status_code::invalid_argument);
    o.shape = "tiny";
    o.type = "q2_k";
    EXPECT_EQ(make_model(o).code(), status_code::invalid_argument);
    o.type = "f16";
    o.vocab_path = "/nonexistent/vocab.gguf";
    EXPECT_EQ(make_model(o).code(), status_code::not_found);
    EXPECT_FALSE(std::filesystem::exists(o.out_path));
}

}  // namespace
}  // namespace warmctx
