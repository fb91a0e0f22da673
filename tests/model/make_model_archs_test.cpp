// warmctx make-model beyond qwen2: the tiny Qwen3.5 hybrid (qwen35), sliding-window
// (gpt-oss) and MoE (qwen3moe) shapes load, run, carry the real Qwen2 tokenizer and
// their family's chat template, and the same seed gives the same bytes.
#include <gtest/gtest.h>

#include <cmath>
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

struct arch_case {
    const char * shape;
    const char * arch;
    const char * template_file;   // in llama.cpp's models/templates
    const char * user_marker;     // how the template opens a user turn
    int32_t n_layer;
};

std::ostream & operator<<(std::ostream & os, const arch_case & c) { return os << c.shape; }

class MakeModelArch : public ::testing::TestWithParam<arch_case> {
  protected:
    std::string make(const std::string & type, uint64_t seed, const std::string & tag) {
        const std::string p = std::string(WARMCTX_TEST_TMP) + "/mm-" + GetParam().shape + "-" + tag + ".gguf";
        make_model_options o;
        o.shape = GetParam().shape;
        o.type = type;
        o.seed = seed;
        o.out_path = p;
        o.n_threads = 1;
        const status st = make_model(o);
        EXPECT_TRUE(st.ok()) << st.to_string();
        return p;
    }

    static std::unique_ptr<engine> open(const std::string & path) {
        engine_options eo;
        eo.model_path = path;
        eo.n_ctx = 1024;
        eo.n_seq_max = 1;
        eo.chunk_tokens = 128;
        eo.n_threads = 1;
        auto e = engine::open(eo);
        EXPECT_TRUE(e.ok()) << e.error().to_string();
        return e.ok() ? std::move(e.value()) : nullptr;
    }
};

TEST_P(MakeModelArch, LoadsTokenizesRendersAndRuns) {
    const arch_case & c = GetParam();
    const model_shape * shape = find_model_shape(c.shape);
    ASSERT_NE(shape, nullptr);
    EXPECT_EQ(shape->arch, c.arch);
    EXPECT_EQ(shape->n_ctx_train, 65536);
    auto e = open(make("q8_0", 1, "q8"));
    ASSERT_TRUE(e);
    const model_info & m = e->model();
    EXPECT_EQ(m.architecture, c.arch);
    EXPECT_EQ(m.n_layer, c.n_layer);
    EXPECT_EQ(m.n_ctx_train, 65536);
    EXPECT_NE(m.description.find("Q8_0"), std::string::npos) << m.description;
    // The family's own chat template, byte for byte.
    EXPECT_EQ(m.chat_template, slurp(std::string(WARMCTX_TEMPLATES_DIR) + "/" + c.template_file));

    // The real Qwen2 tokenizer: the same tokens as the qwen2 tiny model's.
    auto qwen2 = open(WARMCTX_TINY_MODEL);
    ASSERT_TRUE(qwen2);
    EXPECT_EQ(m.n_vocab, qwen2->model().n_vocab);
    const std::string text = "def main():\n    return 0  # héllo <|im_start|>\n";
    auto t = e->tokenize(text);
    auto t2 = qwen2->tokenize(text);
    ASSERT_TRUE(t.ok() && t2.ok());
    EXPECT_EQ(*t, *t2);

    // The template renders; the prompt, long enough to pass a 64-token sliding window,
    // prefills to finite logits.
    std::string body;
    for (int i = 0; i < 40; ++i) body += "line " + std::to_string(i) + ": int x" + std::to_string(i) + " = " + std::to_string(i * 7) + ";\n";
    const std::vector<chat_message> msgs = {{"system", "You are a coding assistant."}, {"user", "Explain:\n" + body}};
    auto r = e->apply_chat_template(msgs, true);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_NE(r->find(c.user_marker), std::string::npos) << *r;
    EXPECT_NE(r->find("line 39: int x39"), std::string::npos);
    auto toks = e->tokenize(*r);
    ASSERT_TRUE(toks.ok());
    EXPECT_GT(toks->size(), 300u);
    std::vector<float> logits;
    const status st = e->prefill(0, *toks, 0, {}, &logits);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(logits.size(), (size_t)m.n_vocab);
    size_t finite = 0;
    float lo = logits[0], hi = logits[0];
    for (float v : logits) {
        finite += std::isfinite(v) ? 1 : 0;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    EXPECT_EQ(finite, logits.size());
    EXPECT_LT(lo, hi);  // not a constant
}

TEST_P(MakeModelArch, SameSeedGivesIdenticalBytes) {
    const std::string a = slurp(make("q4_0", 7, "a")), b = slurp(make("q4_0", 7, "b")), c = slurp(make("q4_0", 8, "c"));
    EXPECT_GT(a.size(), 1000000u);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MakeModelArch,
    ::testing::Values(arch_case{"tiny-hybrid", "qwen35", "Qwen3.5-4B.jinja", "<|im_start|>user", 4},
                      arch_case{"tiny-swa", "gpt-oss", "openai-gpt-oss-120b.jinja", "<|start|>user<|message|>", 4},
                      arch_case{"tiny-moe", "qwen3moe", "Qwen3-Coder.jinja", "<|im_start|>user", 2}),
    [](const ::testing::TestParamInfo<arch_case> & i) {
        std::string n = i.param.shape;
        for (auto & ch : n) if (ch == '-') ch = '_';
        return n;
    });

// Every shape is well formed, and each names a template that exists in llama.cpp.
TEST(MakeModelShapes, AllShapesAreConsistent) {
    for (const auto & s : model_shapes()) {
        SCOPED_TRACE(s.name);
        EXPECT_EQ(s.n_ctx_train, 65536);
        EXPECT_GT(s.n_layer, 0);
        EXPECT_EQ(s.n_head % s.n_head_kv, 0);
        EXPECT_TRUE(std::filesystem::exists(std::string(WARMCTX_TEMPLATES_DIR) + "/" + s.template_name) ||
                    s.template_name == "qwen2.5-chat-template.jinja");
        if (s.n_expert > 0) {
            EXPECT_GT(s.n_expert_used, 0);
        }
        if (s.arch == "qwen35") {
            EXPECT_EQ(s.n_layer % s.full_attn_interval, 0);
        }
        EXPECT_EQ(find_model_shape(s.name), &s);
    }
    for (const char * n : {"qwen3.5-hybrid", "gpt-oss-20b", "qwen3-coder-30b-a3b", "qwen2.5-7b"})
        EXPECT_NE(find_model_shape(n), nullptr) << n;
}

}  // namespace
}  // namespace warmctx
