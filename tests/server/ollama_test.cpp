// The Ollama mappers (server/api/ollama/ollama.h): a body -> the OpenAI body it means, and
// the OpenAI mapper's errors in Ollama's field names. The routes themselves are run by the
// `ollama` client library in tests/sdk/ollama.test.mjs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/api/ollama/ollama.h"

namespace warmctx::server_detail {
namespace {

using json = nlohmann::json;

TEST(Ollama, AChatBodyBecomesTheOpenAiBodyItMeans) {
    json body = json::parse(R"({
      "model": "m:latest", "stream": false, "format": {"type": "object"}, "think": false, "keep_alive": "5m",
      "options": {"temperature": 0.2, "num_predict": 16, "top_k": 5, "num_ctx": 8192, "stop": ["x"]},
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
      "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "tool_name": "f", "content": "1"}]})");
    json out;
    ollama_request_info info;
    bool load = true;
    ASSERT_FALSE(ollama_chat_to_openai(body, out, load, info));
    EXPECT_FALSE(load);
    EXPECT_EQ(info.model, "m:latest");
    EXPECT_FALSE(info.generate);
    EXPECT_EQ(out["stream"], false);
    EXPECT_EQ(out["temperature"], 0.2);
    EXPECT_EQ(out["max_tokens"], 16);
    EXPECT_EQ(out["top_k"], 5);
    EXPECT_EQ(out["stop"], json::array({"x"}));
    EXPECT_FALSE(out.contains("num_ctx"));
    EXPECT_EQ(out["reasoning_budget_tokens"], 0);
    EXPECT_EQ(out["response_format"]["type"], "json_schema");
    EXPECT_EQ(out["response_format"]["json_schema"]["schema"], json({{"type", "object"}}));
    const json & call = out["messages"][1]["tool_calls"][0];
    EXPECT_EQ(call["function"]["arguments"], json({{"a", 1}}));
    EXPECT_EQ(call["type"], "function");
    EXPECT_FALSE(call["id"].get<std::string>().empty());
    EXPECT_TRUE(out["messages"][1]["content"].is_null());  // a call with no text
    EXPECT_EQ(out["tools"], body["tools"]);
}

TEST(Ollama, StreamingIsTheDefaultAndNoLimitIsNoMaxTokens) {
    json out;
    ollama_request_info info;
    bool load = false;
    ASSERT_FALSE(
        ollama_chat_to_openai(json::parse(R"({"messages": [], "options": {"num_predict": -1}})"), out, load, info));
    EXPECT_TRUE(load);  // no messages: Ollama loads the model and answers done_reason "load"
    EXPECT_EQ(out["stream"], true);
    EXPECT_FALSE(out.contains("max_tokens"));
    ASSERT_FALSE(ollama_chat_to_openai(json::parse(R"({"messages": [], "format": "json"})"), out, load, info));
    EXPECT_EQ(out["response_format"], json({{"type", "json_object"}}));
}

TEST(Ollama, WhatATextModelCannotDoIsRefusedNamingTheField) {
    json out;
    ollama_request_info info;
    bool load = false;
    auto e = ollama_chat_to_openai(json::parse(R"({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]})"),
                                   out, load, info);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->param, "messages[0].images");
    body_mode mode;
    e = ollama_generate_to_openai(json::parse(R"({"prompt": "x", "context": [1, 2]})"), out, mode, load, info);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->param, "context");
    e = ollama_generate_to_openai(json::parse(R"({"prompt": "x", "template": "{{ .Prompt }}"})"), out, mode, load, info);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->param, "template");
    e = ollama_chat_to_openai(json::parse(R"({"messages": [], "format": "yaml"})"), out, load, info);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->param, "format");
}

TEST(Ollama, GenerateIsAChatOfSystemAndPromptOrRawText) {
    json out;
    ollama_request_info info;
    body_mode mode = body_mode::text;
    bool load = true;
    ASSERT_FALSE(ollama_generate_to_openai(json::parse(R"({"prompt": "p", "system": "s"})"), out, mode, load, info));
    EXPECT_TRUE(info.generate);
    EXPECT_FALSE(load);
    EXPECT_EQ(mode, body_mode::chat);
    EXPECT_EQ(out["messages"], json::parse(R"([{"role":"system","content":"s"},{"role":"user","content":"p"}])"));
    ASSERT_FALSE(ollama_generate_to_openai(json::parse(R"({"prompt": "p", "raw": true, "suffix": "q"})"), out, mode, load,
                                           info));
    EXPECT_EQ(mode, body_mode::text);
    EXPECT_EQ(out["prompt"], "p");
    EXPECT_EQ(out["suffix"], "q");
    ASSERT_FALSE(ollama_generate_to_openai(json::parse(R"({"model": "m"})"), out, mode, load, info));
    EXPECT_TRUE(load);  // nothing to generate: Ollama answers done_reason "load"
}

TEST(Ollama, TheOpenAiMappersErrorsNameOllamasFields) {
    api_error e = bad_request("invalid_type", "temperature must be a number, not string", "temperature");
    openai_error_to_ollama(e);
    EXPECT_EQ(e.param, "options.temperature");
    EXPECT_EQ(e.message, "options.temperature must be a number, not string");
    api_error f = bad_request("invalid_value", "response_format.json_schema.schema: bad", "response_format.json_schema");
    openai_error_to_ollama(f);
    EXPECT_EQ(f.param, "format.json_schema");
    EXPECT_EQ(ollama_error_json(f), json({{"error", f.message}}));
    api_error g = bad_request("unsupported_schema", "response_format.json_schema.schema.properties: bad",
                              "response_format.json_schema.schema.properties");
    openai_error_to_ollama(g);  // the schema is `format` itself
    EXPECT_EQ(g.param, "format.properties");
    EXPECT_EQ(g.message, "format.properties: bad");
}

}  // namespace
}  // namespace warmctx::server_detail
