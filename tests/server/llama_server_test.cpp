// llama-server's request bodies (server/api/llama_server): /completion as the
// /v1/completions body it means, /tokenize and /detokenize; model-free.
#include <gtest/gtest.h>

#include "server/api/llama_server/llama_server.h"

namespace warmctx::server_detail {
namespace {

using json = nlohmann::json;

TEST(LlamaServerRequest, ACompletionBodyIsTheTextCompletionItMeans) {
    json out;
    ASSERT_FALSE(completion_to_openai({{"prompt", "def f():"},
                                       {"n_predict", 32},
                                       {"temperature", 0.2},
                                       {"top_k", 40},
                                       {"stop", json::array({"\n\n"})},
                                       {"stream", true},
                                       {"cache_prompt", true},
                                       {"id_slot", 3}},
                                      out));
    EXPECT_EQ(out, json({{"prompt", "def f():"},
                         {"max_tokens", 32},
                         {"temperature", 0.2},
                         {"top_k", 40},
                         {"stop", json::array({"\n\n"})},
                         {"stream", true}}));
    // -1: no limit (max_tokens absent: to the end of the context).
    ASSERT_FALSE(completion_to_openai({{"prompt", "x"}, {"n_predict", -1}}, out));
    EXPECT_FALSE(out.contains("max_tokens"));
}

TEST(LlamaServerRequest, WhatItCannotHonourIsRefusedNamingTheField) {
    json out;
    auto param_of = [&](const json & body) {
        auto e = completion_to_openai(body, out);
        return e ? e->param : std::string("(accepted)");
    };
    EXPECT_EQ(param_of({{"n_predict", 3}}), "prompt");
    EXPECT_EQ(param_of({{"prompt", json::array({1, 2, 3})}}), "prompt");
    EXPECT_EQ(param_of({{"prompt", json::array({json::array({1, 2})})}}), "prompt");
    EXPECT_EQ(param_of({{"prompt", "x"}, {"grammar", "root ::= \"a\""}}), "grammar");
    EXPECT_EQ(param_of({{"prompt", "x"}, {"json_schema", {{"type", "object"}}}}), "json_schema");
    EXPECT_EQ(param_of({{"prompt", "x"}, {"n_predict", -2}}), "n_predict");
    EXPECT_EQ(param_of({{"prompt", "x"}, {"n_predict", "many"}}), "n_predict");
    EXPECT_EQ(param_of(json::array()), "body");
}

TEST(LlamaServerRequest, TokenizeAndDetokenizeBodies) {
    tokenize_request t;
    ASSERT_FALSE(parse_tokenize({{"content", "hi"}, {"with_pieces", true}, {"parse_special", false}}, t));
    EXPECT_EQ(t.content, "hi");
    EXPECT_TRUE(t.with_pieces);
    EXPECT_FALSE(t.parse_special);
    EXPECT_FALSE(t.add_special);
    EXPECT_EQ(parse_tokenize({{"content", "hi"}, {"add_special", "yes"}}, t)->param, "add_special");
    EXPECT_EQ(parse_tokenize(json::object(), t)->param, "content");
    std::vector<token_id> ids;
    ASSERT_FALSE(parse_detokenize({{"tokens", json::array({1, 2, 3})}}, ids));
    EXPECT_EQ(ids, (std::vector<token_id>{1, 2, 3}));
    ids.clear();
    EXPECT_EQ(parse_detokenize({{"tokens", json::array({1, -2})}}, ids)->param, "tokens[1]");
    EXPECT_EQ(parse_detokenize({{"tokens", "1 2"}}, ids)->param, "tokens");
}

}  // namespace
}  // namespace warmctx::server_detail
