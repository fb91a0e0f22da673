// The Responses API translation: Responses request -> chat body, chat result -> response
// object, chat chunks -> Responses stream events. Pure JSON, no model.
#include <gtest/gtest.h>

#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/api/openai/openai.h"
#include "server/api/responses/responses.h"

namespace warmctx::server_detail {
namespace {

using json = nlohmann::json;

json chat_ok(const json & body, responses_request_info * info_out = nullptr) {
    json chat;
    responses_request_info info;
    auto e = responses_to_chat(body, chat, info);
    EXPECT_FALSE(e.has_value()) << (e ? e->param + ": " + e->message : "");
    if (info_out) *info_out = info;
    return chat;
}

api_error chat_err(const json & body) {
    json chat;
    responses_request_info info;
    auto e = responses_to_chat(body, chat, info);
    EXPECT_TRUE(e.has_value()) << body.dump();
    return e.value_or(api_error{});
}

json base() { return {{"model", "m"}, {"input", "hi"}}; }

json with(json body, const std::string & key, json value) {
    body[key] = std::move(value);
    return body;
}

TEST(Responses, StringInputBecomesOneUserMessage) {
    responses_request_info info;
    json chat = chat_ok({{"model", "qwen"}, {"input", "Say hi"}}, &info);
    EXPECT_EQ(chat["model"], "qwen");
    ASSERT_EQ(chat["messages"].size(), 1u);
    EXPECT_EQ(chat["messages"][0], json({{"role", "user"}, {"content", "Say hi"}}));
    EXPECT_FALSE(chat.contains("stream"));
    EXPECT_FALSE(chat.contains("tools"));
    EXPECT_EQ(info.model, "qwen");
    EXPECT_FALSE(info.stream);
}

TEST(Responses, ItemInputWithTextPartsAndInstructions) {
    json body = {{"model", "m"},
                 {"instructions", "Be brief."},
                 {"input", json::array({{{"type", "message"},
                                         {"role", "developer"},
                                         {"content", json::array({{{"type", "input_text"}, {"text", "env: linux"}}})}},
                                        {{"role", "user"},  // an easy input message: no type
                                         {"content", json::array({{{"type", "input_text"}, {"text", "part one"}},
                                                                  {{"type", "input_text"}, {"text", "part two"}}})}},
                                        {{"type", "message"},
                                         {"role", "assistant"},
                                         {"id", "msg_old"},
                                         {"status", "completed"},
                                         {"content", json::array({{{"type", "output_text"},
                                                                   {"text", "ok"},
                                                                   {"annotations", json::array()}}})}},
                                        {{"role", "user"}, {"content", "next"}}})}};
    responses_request_info info;
    json chat = chat_ok(body, &info);
    const json & m = chat["messages"];
    ASSERT_EQ(m.size(), 5u);
    EXPECT_EQ(m[0], json({{"role", "system"}, {"content", "Be brief."}}));
    EXPECT_EQ(m[1], json({{"role", "developer"}, {"content", "env: linux"}}));
    EXPECT_EQ(m[2], json({{"role", "user"}, {"content", "part one\npart two"}}));
    EXPECT_EQ(m[3], json({{"role", "assistant"}, {"content", "ok"}}));
    EXPECT_EQ(m[4], json({{"role", "user"}, {"content", "next"}}));
    EXPECT_EQ(info.instructions, "Be brief.");
    EXPECT_EQ(info.message_sources,
              (std::vector<std::string>{"instructions", "input[0]", "input[1]", "input[2]", "input[3]"}));

    // Images and files are refused by the part's type; unknown parts and roles too.
    api_error e = chat_err({{"input", json::array({{{"role", "user"},
                                                    {"content", json::array({{{"type", "input_text"}, {"text", "a"}},
                                                                             {{"type", "input_image"},
                                                                              {"image_url", "http://x"}}})}}})}});
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.code, "unsupported_parameter");
    EXPECT_EQ(e.param, "input[0].content[1].type");
    e = chat_err({{"input", json::array({{{"role", "user"},
                                          {"content", json::array({{{"type", "input_file"}, {"file_id", "f"}}})}}})}});
    EXPECT_EQ(e.code, "unsupported_parameter");
    EXPECT_EQ(e.param, "input[0].content[0].type");
    EXPECT_EQ(chat_err({{"input", json::array({{{"role", "robot"}, {"content", "x"}}})}}).param, "input[0].role");
    EXPECT_EQ(chat_err({{"input", json::array({{{"role", "user"}}})}}).param, "input[0].content");
    // Instructions alone leave nothing to answer.
    EXPECT_EQ(chat_err({{"instructions", "x"}, {"input", json::array()}}).param, "input");
}

TEST(Responses, FunctionCallsMergeIntoToolCallsAndOutputsBecomeToolMessages) {
    json body = {{"input", json::array({
                               {{"role", "user"}, {"content", "list and count"}},
                               {{"type", "reasoning"}, {"id", "rs_1"}, {"encrypted_content", "opaque"},
                                {"summary", json::array()}},
                               {{"type", "message"}, {"role", "assistant"}, {"content", "Running two tools."}},
                               {{"type", "function_call"}, {"id", "fc_a"}, {"call_id", "call_1"},
                                {"name", "ls"}, {"arguments", "{\"dir\":\".\"}"}},
                               {{"type", "reasoning"}, {"id", "rs_2"}, {"summary", json::array()}},
                               {{"type", "function_call"}, {"call_id", "call_2"}, {"name", "wc"},
                                {"arguments", "{}"}},
                               {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "a.txt"}},
                               {{"type", "function_call_output"}, {"call_id", "call_2"},
                                {"output", json::array({{{"type", "input_text"}, {"text", "3"}},
                                                        {{"type", "output_text"}, {"text", "lines"}}})}},
                               {{"type", "function_call"}, {"call_id", "call_3"}, {"name", "ls"},
                                {"arguments", "{}"}},
                               {{"type", "function_call_output"}, {"call_id", "call_3"}, {"output", ""}},
                           })}};
    responses_request_info info;
    json chat = chat_ok(body, &info);
    const json & m = chat["messages"];
    ASSERT_EQ(m.size(), 6u) << m.dump();
    EXPECT_EQ(m[0]["role"], "user");
    // The assistant message item and the two calls after it (reasoning between them is
    // skipped) are one assistant message.
    EXPECT_EQ(m[1]["role"], "assistant");
    EXPECT_EQ(m[1]["content"], "Running two tools.");
    ASSERT_EQ(m[1]["tool_calls"].size(), 2u);
    EXPECT_EQ(m[1]["tool_calls"][0], json({{"id", "call_1"},
                                           {"type", "function"},
                                           {"function", {{"name", "ls"}, {"arguments", "{\"dir\":\".\"}"}}}}));
    EXPECT_EQ(m[1]["tool_calls"][1]["id"], "call_2");
    EXPECT_EQ(m[1]["tool_calls"][1]["function"]["name"], "wc");
    EXPECT_EQ(m[2], json({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "a.txt"}}));
    EXPECT_EQ(m[3], json({{"role", "tool"}, {"tool_call_id", "call_2"}, {"content", "3\nlines"}}));
    // A call after a tool output opens a new assistant message, with no text.
    EXPECT_EQ(m[4]["role"], "assistant");
    EXPECT_TRUE(m[4]["content"].is_null());
    ASSERT_EQ(m[4]["tool_calls"].size(), 1u);
    EXPECT_EQ(m[4]["tool_calls"][0]["id"], "call_3");
    EXPECT_EQ(m[5]["tool_call_id"], "call_3");
    EXPECT_EQ(info.message_sources[1], "input[2]");
    EXPECT_EQ(info.message_sources[4], "input[8]");

    // Two consecutive calls with nothing before them: one new assistant message.
    json two = chat_ok({{"input", json::array({{{"role", "user"}, {"content", "x"}},
                                               {{"type", "function_call"}, {"call_id", "a"}, {"name", "f"},
                                                {"arguments", "{}"}},
                                               {{"type", "function_call"}, {"call_id", "b"}, {"name", "g"},
                                                {"arguments", "{}"}}})}});
    ASSERT_EQ(two["messages"].size(), 2u);
    EXPECT_EQ(two["messages"][1]["tool_calls"].size(), 2u);

    // Malformed items name their field; item_reference and unknown types are refused.
    auto one = [](json item) { return json{{"input", json::array({std::move(item)})}}; };
    EXPECT_EQ(chat_err(one({{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}})).param, "input[0].call_id");
    EXPECT_EQ(chat_err(one({{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}, {"arguments", json::object()}}))
                  .param,
              "input[0].arguments");
    EXPECT_EQ(chat_err(one({{"type", "function_call_output"}, {"call_id", "c"}})).param, "input[0].output");
    api_error ref = chat_err(one({{"type", "item_reference"}, {"id", "msg_1"}}));
    EXPECT_EQ(ref.code, "unsupported_parameter");
    EXPECT_EQ(ref.param, "input[0].type");
    api_error unknown = chat_err(one({{"type", "computer_call_output"}, {"call_id", "c"}}));
    EXPECT_EQ(unknown.http_status, 400);
    EXPECT_EQ(unknown.param, "input[0].type");
    EXPECT_EQ(chat_err(one("text")).param, "input[0]");
}

TEST(Responses, ToolsAndToolChoiceTranslate) {
    json params = {{"type", "object"}, {"properties", {{"cmd", {{"type", "string"}}}}}};
    json tools = json::array({{{"type", "function"},
                               {"name", "shell"},
                               {"description", "Run a command"},
                               {"parameters", params},
                               {"strict", true}},
                              {{"type", "function"}, {"name", "noop"}}});
    responses_request_info info;
    json chat = chat_ok(with(with(base(), "tools", tools), "tool_choice", {{"type", "function"}, {"name", "shell"}}),
                        &info);
    ASSERT_EQ(chat["tools"].size(), 2u);
    EXPECT_EQ(chat["tools"][0], json({{"type", "function"},
                                      {"function",
                                       {{"name", "shell"},
                                        {"description", "Run a command"},
                                        {"parameters", params},
                                        {"strict", true}}}}));
    EXPECT_EQ(chat["tools"][1], json({{"type", "function"}, {"function", {{"name", "noop"}}}}));
    EXPECT_EQ(chat["tool_choice"], json({{"type", "function"}, {"function", {{"name", "shell"}}}}));
    EXPECT_EQ(info.tools, tools) << "echoed as sent, in the Responses shape";
    EXPECT_EQ(info.tool_choice, json({{"type", "function"}, {"name", "shell"}}));

    for (const char * s : {"auto", "none", "required"})
        EXPECT_EQ(chat_ok(with(base(), "tool_choice", s))["tool_choice"], s);
    EXPECT_EQ(chat_err(with(base(), "tool_choice", "any")).param, "tool_choice");
    EXPECT_EQ(chat_err(with(base(), "tool_choice", 3)).param, "tool_choice");
    EXPECT_EQ(chat_err(with(base(), "tool_choice", {{"type", "web_search_preview"}})).param, "tool_choice.type");
    EXPECT_EQ(chat_err(with(base(), "tool_choice", {{"type", "function"}})).param, "tool_choice.name");

    json pt = chat_ok(with(base(), "parallel_tool_calls", false), &info);
    EXPECT_EQ(pt["parallel_tool_calls"], false);
    EXPECT_FALSE(info.parallel_tool_calls);

    // Hosted tools, by their type.
    for (const char * type : {"web_search", "web_search_preview", "file_search", "code_interpreter",
                              "computer_use_preview", "image_generation", "mcp", "local_shell", "custom"}) {
        json ts = json::array({{{"type", "function"}, {"name", "f"}}, {{"type", type}, {"name", "x"}}});
        api_error e = chat_err(with(base(), "tools", ts));
        EXPECT_EQ(e.http_status, 400) << type;
        EXPECT_EQ(e.code, "unsupported_parameter") << type;
        EXPECT_EQ(e.param, "tools[1].type") << type;
    }
    json custom = json::array({{{"type", "custom"}, {"name", "apply_patch"}}});
    EXPECT_NE(chat_err(with(base(), "tools", custom)).message.find("custom (freeform) tools"), std::string::npos);
    EXPECT_EQ(chat_err(with(base(), "tools", json::array({{{"type", "function"}}}))).param, "tools[0].name");
    EXPECT_EQ(chat_err(with(base(), "tools", json::array({{{"type", "function"}, {"name", "f"}, {"parameters", "x"}}})))
                  .param,
              "tools[0].parameters");
    EXPECT_EQ(chat_err(with(base(), "tools", json::object())).param, "tools");
}

TEST(Responses, SamplingFormatAndEchoedFields) {
    json body = base();
    body["temperature"] = 0.2;
    body["top_p"] = 0.9;
    body["max_output_tokens"] = 64;
    body["seed"] = 7;
    body["user"] = "u1";
    body["stream"] = true;
    body["prompt_cache_key"] = "thread-42";
    body["reasoning"] = {{"effort", "medium"}, {"summary", "auto"}};
    body["metadata"] = {{"k", "v"}};
    body["text"] = {{"format", {{"type", "json_object"}}}, {"verbosity", "low"}};
    body["workspace"] = "w1";
    responses_request_info info;
    json chat = chat_ok(body, &info);
    EXPECT_EQ(chat["temperature"], 0.2);
    EXPECT_EQ(chat["top_p"], 0.9);
    EXPECT_EQ(chat["max_tokens"], 64);
    EXPECT_FALSE(chat.contains("max_output_tokens"));
    EXPECT_EQ(chat["seed"], 7);
    EXPECT_EQ(chat["user"], "u1");
    EXPECT_EQ(chat["stream"], true);
    EXPECT_EQ(chat["stream_options"], json({{"include_usage", true}}));
    EXPECT_EQ(chat["prompt_cache_key"], "thread-42");
    EXPECT_EQ(chat["response_format"], json({{"type", "json_object"}}));
    EXPECT_EQ(chat["workspace"], "w1");
    for (const char * k : {"reasoning", "metadata", "text", "instructions", "input"}) EXPECT_FALSE(chat.contains(k)) << k;
    EXPECT_TRUE(info.stream);
    EXPECT_EQ(info.reasoning_effort, "medium");
    EXPECT_EQ(info.reasoning_summary, "auto");
    EXPECT_EQ(info.metadata, json({{"k", "v"}}));
    EXPECT_EQ(info.max_output_tokens, 64);
    EXPECT_EQ(info.prompt_cache_key, "thread-42");
    EXPECT_EQ(info.text, json({{"format", {{"type", "json_object"}}}, {"verbosity", "low"}}));

    json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
    json js = chat_ok(with(base(), "text",
                           {{"format", {{"type", "json_schema"}, {"name", "thing"}, {"schema", schema}, {"strict", true}}}}),
                      &info);
    EXPECT_EQ(js["response_format"],
              json({{"type", "json_schema"}, {"json_schema", {{"name", "thing"}, {"schema", schema}, {"strict", true}}}}));
    EXPECT_EQ(info.text["format"]["name"], "thing");
    EXPECT_FALSE(chat_ok(with(base(), "text", {{"format", {{"type", "text"}}}})).contains("response_format"));
    EXPECT_EQ(chat_err(with(base(), "text", {{"format", {{"type", "json_schema"}, {"schema", schema}}}})).param,
              "text.format.name");
    EXPECT_EQ(chat_err(with(base(), "text", {{"format", {{"type", "yaml"}}}})).param, "text.format.type");
}

TEST(Responses, RefusedFieldsAre400NamingTheField) {
    const std::vector<std::pair<std::string, json>> refused = {
        {"store", true},
        {"previous_response_id", "resp_123"},
        {"conversation", "conv_1"},
        {"conversation", {{"id", "conv_1"}}},
        {"background", true},
        {"truncation", "auto"},
        {"prompt", {{"id", "pmpt_1"}, {"version", "2"}}},
        {"top_logprobs", 5},
    };
    for (const auto & [key, value] : refused) {
        api_error e = chat_err(with(base(), key, value));
        EXPECT_EQ(e.http_status, 400) << key;
        EXPECT_EQ(e.code, "unsupported_parameter") << key;
        EXPECT_EQ(e.param, key);
    }
}

TEST(Responses, AcceptedAndIgnoredFieldsChangeNothing) {
    const std::vector<std::pair<std::string, json>> ignored = {
        {"store", false},
        {"include", json::array({"reasoning.encrypted_content", "message.output_text.logprobs"})},
        {"reasoning", {{"effort", "high"}, {"summary", "auto"}}},
        {"metadata", {{"a", "b"}}},
        {"service_tier", "auto"},
        {"truncation", "disabled"},
        {"background", false},
        {"safety_identifier", "user-hash"},
        {"prompt_cache_retention", "24h"},
        {"stream_options", {{"include_obfuscation", false}}},
        {"previous_response_id", nullptr},
        {"conversation", nullptr},
        {"prompt", nullptr},
        {"max_tool_calls", 4},
        {"top_logprobs", 0},
        {"some_future_field", {{"x", 1}}},
    };
    const json plain = chat_ok(base());
    json all = base();
    for (const auto & [key, value] : ignored) {
        EXPECT_EQ(chat_ok(with(base(), key, value)), plain) << key;
        all[key] = value;
    }
    EXPECT_EQ(chat_ok(all), plain);
    // The absent `store` is not refused (OpenAI's default would be true).
    EXPECT_FALSE(base().contains("store"));
}

TEST(Responses, WrongTypesNameTheField) {
    const std::vector<std::pair<std::string, json>> wrong = {
        {"input", 5},           {"model", 1},          {"instructions", json::array()},
        {"store", "no"},        {"background", 1},     {"truncation", "sometimes"},
        {"include", "x"},       {"reasoning", "high"}, {"metadata", "m"},
        {"temperature", "hot"}, {"top_p", "x"},        {"max_output_tokens", 1.5},
        {"stream", "yes"},      {"user", 3},           {"prompt_cache_key", 1},
        {"parallel_tool_calls", "no"}, {"text", "plain"}, {"service_tier", 1},
    };
    for (const auto & [key, value] : wrong) {
        api_error e = chat_err(with(base(), key, value));
        EXPECT_EQ(e.http_status, 400) << key;
        EXPECT_EQ(e.param, key);
    }
    EXPECT_EQ(chat_err(with(base(), "include", json::array({1}))).param, "include[0]");
    EXPECT_EQ(chat_err(with(base(), "reasoning", {{"effort", 3}})).param, "reasoning.effort");
    EXPECT_EQ(chat_err(with(base(), "max_output_tokens", 0)).param, "max_output_tokens");
    EXPECT_EQ(chat_err({{"model", "m"}}).param, "input");
    EXPECT_EQ(chat_err({{"model", "m"}, {"input", nullptr}}).param, "input");
    EXPECT_EQ(chat_err(json::array()).param, "body");
}

completion_usage usage_of(int64_t prompt, int64_t completion, int64_t cached) {
    completion_usage u;
    u.prompt_tokens = prompt;
    u.completion_tokens = completion;
    u.cached_tokens = cached;
    return u;
}

TEST(Responses, NonStreamedText) {
    responses_request_info info;
    chat_ok({{"model", "m"},
             {"input", "hi"},
             {"instructions", "sys"},
             {"metadata", {{"k", "v"}}},
             {"reasoning", {{"effort", "low"}}},
             {"tools", json::array({{{"type", "function"}, {"name", "f"}}})}},
            &info);
    const json wx = {{"workspace", "auto-1"}, {"tokens_reused", 80}};
    json r = answer_to_response(info, "resp_abc", 1700000000, "Hello!", {}, finish_reason::stop, usage_of(100, 7, 80), wx);
    EXPECT_EQ(r["id"], "resp_abc");
    EXPECT_EQ(r["object"], "response");
    EXPECT_EQ(r["created_at"], 1700000000);
    EXPECT_EQ(r["status"], "completed");
    EXPECT_TRUE(r["incomplete_details"].is_null());
    EXPECT_TRUE(r["error"].is_null());
    EXPECT_EQ(r["model"], "m");
    ASSERT_EQ(r["output"].size(), 1u);
    EXPECT_EQ(r["output"][0], json({{"type", "message"},
                                    {"id", "msg_abc"},
                                    {"status", "completed"},
                                    {"role", "assistant"},
                                    {"content", json::array({{{"type", "output_text"},
                                                              {"text", "Hello!"},
                                                              {"annotations", json::array()}}})}}));
    EXPECT_FALSE(r.contains("output_text")) << "an SDK convenience, not wire format";
    EXPECT_EQ(r["usage"], json({{"input_tokens", 100},
                                {"input_tokens_details", {{"cached_tokens", 80}}},
                                {"output_tokens", 7},
                                {"output_tokens_details", {{"reasoning_tokens", 0}}},
                                {"total_tokens", 107}}));
    EXPECT_EQ(r["warmctx"], wx);
    // The request's settings, echoed.
    EXPECT_EQ(r["instructions"], "sys");
    EXPECT_EQ(r["tools"], json::array({{{"type", "function"}, {"name", "f"}}}));
    EXPECT_EQ(r["tool_choice"], "auto");
    EXPECT_EQ(r["parallel_tool_calls"], true);
    EXPECT_EQ(r["temperature"], 1.0);
    EXPECT_EQ(r["top_p"], 1.0);
    EXPECT_TRUE(r["max_output_tokens"].is_null());
    EXPECT_EQ(r["text"], json({{"format", {{"type", "text"}}}}));
    EXPECT_EQ(r["reasoning"], json({{"effort", "low"}, {"summary", nullptr}}));
    EXPECT_EQ(r["metadata"], json({{"k", "v"}}));
    EXPECT_EQ(r["store"], false);
    EXPECT_TRUE(r["previous_response_id"].is_null());

    // No extension object: no `warmctx` field.
    json r2 = answer_to_response(info, "resp_x", 1, "x", {}, finish_reason::eos, usage_of(1, 1, 0), nullptr);
    EXPECT_EQ(r2["status"], "completed");
    EXPECT_FALSE(r2.contains("warmctx"));
}

TEST(Responses, NonStreamedTwoToolCalls) {
    responses_request_info info;
    const std::vector<response_call> calls = {{"call_A", "ls", "{\"dir\":\"/\"}"}, {"call_B", "cat", "{}"}};
    json r = answer_to_response(info, "resp_q9", 5, "", calls, finish_reason::stop, usage_of(100, 7, 80), nullptr);
    EXPECT_EQ(r["status"], "completed");
    ASSERT_EQ(r["output"].size(), 2u) << "no message item without text";
    EXPECT_EQ(r["output"][0], json({{"type", "function_call"},
                                    {"id", "fc_q9_0"},
                                    {"call_id", "call_A"},
                                    {"name", "ls"},
                                    {"arguments", "{\"dir\":\"/\"}"},
                                    {"status", "completed"}}));
    EXPECT_EQ(r["output"][1]["id"], "fc_q9_1");
    EXPECT_EQ(r["output"][1]["call_id"], "call_B");
    EXPECT_EQ(r["output"][1]["name"], "cat");

    // Text and a call: the message first.
    json both = answer_to_response(info, "resp_q9", 5, "Looking.", calls, finish_reason::stop, usage_of(100, 7, 80), nullptr);
    ASSERT_EQ(both["output"].size(), 3u);
    EXPECT_EQ(both["output"][0]["type"], "message");
    EXPECT_EQ(both["output"][1]["type"], "function_call");
}

TEST(Responses, LengthIsIncomplete) {
    responses_request_info info;
    chat_ok(with(base(), "max_output_tokens", 7), &info);
    json r = answer_to_response(info, "resp_z", 1, "Once upon a", {}, finish_reason::length, usage_of(100, 7, 80), nullptr);
    EXPECT_EQ(r["status"], "incomplete");
    EXPECT_EQ(r["incomplete_details"], json({{"reason", "max_output_tokens"}}));
    EXPECT_EQ(r["max_output_tokens"], 7);
    ASSERT_EQ(r["output"].size(), 1u);
    EXPECT_EQ(r["output"][0]["status"], "incomplete");
    EXPECT_EQ(r["output"][0]["content"][0]["text"], "Once upon a");
}

TEST(Responses, StreamTextThenToolCall) {
    responses_request_info info;
    chat_ok(with(base(), "stream", true), &info);
    responses_stream rs(info, "resp_s1", 99);
    std::vector<responses_event> evs = rs.start();
    // Two text pieces, then one tool call in three fragments, as the completion path
    // streams them.
    auto add = [&](std::vector<responses_event> more) { evs.insert(evs.end(), more.begin(), more.end()); };
    add(rs.text(""));
    add(rs.text("Let me "));
    add(rs.text("check."));
    add(rs.call(0, "call_7", "shell", ""));
    add(rs.call(0, "", "", "{\"cmd\":"));
    add(rs.call(0, "", "", "\"ls\"}"));
    add(rs.finish(finish_reason::stop, usage_of(50, 12, 40), {{"workspace", "w"}}));
    EXPECT_TRUE(rs.done());
    EXPECT_TRUE(rs.text("more").empty()) << "nothing after finish";

    std::vector<std::string> names;
    for (const responses_event & e : evs) names.push_back(e.event);
    const std::vector<std::string> expected = {
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    };
    ASSERT_EQ(names, expected);

    for (size_t i = 0; i < evs.size(); ++i) {
        EXPECT_EQ(evs[i].data["type"], evs[i].event);
        EXPECT_EQ(evs[i].data["sequence_number"], static_cast<int64_t>(i)) << evs[i].event;
    }
    // created / in_progress: the response in progress, nothing in it yet.
    EXPECT_EQ(evs[0].data["response"]["status"], "in_progress");
    EXPECT_EQ(evs[0].data["response"]["output"], json::array());
    EXPECT_EQ(evs[0].data["response"]["id"], "resp_s1");
    EXPECT_EQ(evs[1].data["response"]["status"], "in_progress");

    // The message: one item id from added to done, output_index 0.
    const json & added = evs[2].data;
    EXPECT_EQ(added["output_index"], 0);
    EXPECT_EQ(added["item"]["type"], "message");
    EXPECT_EQ(added["item"]["status"], "in_progress");
    EXPECT_EQ(added["item"]["content"], json::array());
    const std::string msg_id = added["item"]["id"];
    EXPECT_EQ(msg_id, "msg_s1");
    EXPECT_EQ(evs[3].data["part"], json({{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}));
    for (int i : {3, 4, 5, 6, 7}) {
        EXPECT_EQ(evs[i].data["item_id"], msg_id) << i;
        EXPECT_EQ(evs[i].data["output_index"], 0) << i;
        EXPECT_EQ(evs[i].data["content_index"], 0) << i;
    }
    EXPECT_EQ(evs[4].data["delta"], "Let me ");
    EXPECT_EQ(evs[4].data["logprobs"], json::array());
    EXPECT_EQ(evs[5].data["delta"], "check.");
    EXPECT_EQ(evs[6].data["text"], "Let me check.");
    EXPECT_EQ(evs[7].data["part"]["text"], "Let me check.");
    EXPECT_EQ(evs[8].data["item"]["id"], msg_id);
    EXPECT_EQ(evs[8].data["item"]["status"], "completed");
    EXPECT_EQ(evs[8].data["item"]["content"][0]["text"], "Let me check.");

    // The call: output_index 1, one item id, the arguments the concatenated deltas.
    const json & call_added = evs[9].data;
    EXPECT_EQ(call_added["output_index"], 1);
    EXPECT_EQ(call_added["item"]["type"], "function_call");
    EXPECT_EQ(call_added["item"]["status"], "in_progress");
    EXPECT_EQ(call_added["item"]["arguments"], "");
    EXPECT_EQ(call_added["item"]["call_id"], "call_7");
    EXPECT_EQ(call_added["item"]["name"], "shell");
    const std::string fc_id = call_added["item"]["id"];
    EXPECT_EQ(fc_id, "fc_s1_0");
    std::string concatenated;
    for (int i : {10, 11}) {
        EXPECT_EQ(evs[i].data["item_id"], fc_id);
        EXPECT_EQ(evs[i].data["output_index"], 1);
        concatenated += evs[i].data["delta"].get<std::string>();
    }
    EXPECT_EQ(concatenated, "{\"cmd\":\"ls\"}");
    EXPECT_EQ(evs[12].data["item_id"], fc_id);
    EXPECT_EQ(evs[12].data["arguments"], concatenated);
    EXPECT_EQ(evs[12].data["name"], "shell");
    EXPECT_EQ(evs[13].data["item"], json({{"type", "function_call"},
                                          {"id", fc_id},
                                          {"call_id", "call_7"},
                                          {"name", "shell"},
                                          {"arguments", concatenated},
                                          {"status", "completed"}}));

    // completed: the whole response, as the non-streamed one would be.
    const json & r = evs[14].data["response"];
    EXPECT_EQ(r["status"], "completed");
    ASSERT_EQ(r["output"].size(), 2u);
    EXPECT_EQ(r["output"][0], evs[8].data["item"]);
    EXPECT_EQ(r["output"][1], evs[13].data["item"]);
    EXPECT_EQ(r["usage"]["input_tokens"], 50);
    EXPECT_EQ(r["usage"]["input_tokens_details"]["cached_tokens"], 40);
    EXPECT_EQ(r["usage"]["output_tokens"], 12);
    EXPECT_EQ(r["usage"]["total_tokens"], 62);
    EXPECT_EQ(r["warmctx"], json({{"workspace", "w"}}));
}

// A reasoning model's reasoning is a reasoning item before the message (its text as one
// reasoning_text part), whole and streamed.
TEST(Responses, ReasoningIsAnItemBeforeTheMessage) {
    responses_request_info info;
    chat_ok(base(), &info);
    json r = answer_to_response(info, "resp_r1", 3, "Done.", {}, finish_reason::stop, usage_of(5, 3, 0), nullptr,
                                "Think first.");
    ASSERT_EQ(r["output"].size(), 2u);
    EXPECT_EQ(r["output"][0], json({{"type", "reasoning"},
                                    {"id", "rs_r1_0"},
                                    {"status", "completed"},
                                    {"summary", json::array()},
                                    {"content", json::array({{{"type", "reasoning_text"}, {"text", "Think first."}}})}}));
    EXPECT_EQ(r["output"][1]["type"], "message");
    EXPECT_EQ(r["output"][1]["content"][0]["text"], "Done.");

    responses_stream rs(info, "resp_r2", 4);
    std::vector<responses_event> evs = rs.start();
    for (const char * piece : {"Think ", "first."}) {
        auto more = rs.reasoning(piece);
        evs.insert(evs.end(), more.begin(), more.end());
    }
    auto t = rs.text("Done.");
    evs.insert(evs.end(), t.begin(), t.end());
    auto fin = rs.finish(finish_reason::stop, usage_of(5, 3, 0), nullptr);
    evs.insert(evs.end(), fin.begin(), fin.end());
    std::vector<std::string> names;
    for (const responses_event & e : evs) names.push_back(e.event);
    const std::vector<std::string> expected = {
        "response.created",          "response.in_progress",       "response.output_item.added",
        "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done",  "response.content_part.done", "response.output_item.done",
        "response.completed",
    };
    ASSERT_EQ(names, expected);
    EXPECT_EQ(evs[2].data["item"]["type"], "reasoning");
    EXPECT_EQ(evs[4].data["delta"], "Think ");
    EXPECT_EQ(evs[6].data["text"], "Think first.");
    EXPECT_EQ(evs[8].data["item"]["content"][0]["text"], "Think first.");
    EXPECT_EQ(evs[9].data["output_index"], 1);
    const json & done = evs.back().data["response"];
    ASSERT_EQ(done["output"].size(), 2u);
    EXPECT_EQ(done["output"][0]["type"], "reasoning");
    EXPECT_EQ(done["output"][0]["content"][0]["text"], "Think first.");
    EXPECT_EQ(done["output"][1]["content"][0]["text"], "Done.");
}

TEST(Responses, StreamLengthIsIncompleteAndErrorsFail) {
    responses_request_info info;
    chat_ok(base(), &info);
    {
        responses_stream rs(info, "resp_L", 1);
        rs.start();
        rs.text("abc");
        auto evs = rs.finish(finish_reason::length, usage_of(3, 1, 0), nullptr);
        ASSERT_EQ(evs.size(), 4u);
        EXPECT_EQ(evs[0].event, "response.output_text.done");
        EXPECT_EQ(evs[2].event, "response.output_item.done");
        EXPECT_EQ(evs[2].data["item"]["status"], "incomplete");
        EXPECT_EQ(evs[3].event, "response.incomplete");
        EXPECT_EQ(evs[3].data["response"]["status"], "incomplete");
        EXPECT_EQ(evs[3].data["response"]["incomplete_details"]["reason"], "max_output_tokens");
        EXPECT_EQ(evs[3].data["response"]["usage"]["input_tokens_details"]["cached_tokens"], 0);
        EXPECT_EQ(evs[3].data["sequence_number"], 8);
    }
    {
        responses_stream rs(info, "resp_E", 1);
        auto evs = rs.start();
        auto more = rs.text("par");
        evs.insert(evs.end(), more.begin(), more.end());
        auto err = rs.error(server_error("the engine failed"));
        ASSERT_EQ(err.size(), 2u);
        EXPECT_EQ(err[0].event, "error");
        EXPECT_EQ(err[0].data["type"], "error");
        EXPECT_EQ(err[0].data["message"], "the engine failed");
        EXPECT_TRUE(err[0].data.contains("code"));
        EXPECT_TRUE(err[0].data["param"].is_null());
        EXPECT_EQ(err[0].data["sequence_number"], static_cast<int64_t>(evs.size()));
        EXPECT_EQ(err[1].event, "response.failed");
        EXPECT_EQ(err[1].data["response"]["status"], "failed");
        EXPECT_EQ(err[1].data["response"]["error"]["message"], "the engine failed");
        EXPECT_EQ(err[1].data["response"]["output"][0]["content"][0]["text"], "par");
        EXPECT_TRUE(rs.done());
        EXPECT_TRUE(rs.finish(finish_reason::stop, usage_of(1, 1, 0), nullptr).empty());
    }
}

TEST(Responses, ChatErrorsNameTheResponsesField) {
    responses_request_info info;
    chat_ok({{"instructions", "s"},
             {"input", json::array({{{"role", "user"}, {"content", "a"}},
                                    {{"type", "reasoning"}},
                                    {{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}, {"arguments", "{}"}}})}},
            &info);
    auto renamed = [&](const std::string & chat_param) {
        api_error e = bad_request("invalid_value", "x", chat_param);
        chat_error_to_responses(e, info);
        return e.param;
    };
    EXPECT_EQ(renamed("messages[0].content"), "instructions");
    EXPECT_EQ(renamed("messages[1].role"), "input[0]");
    EXPECT_EQ(renamed("messages[2].tool_calls"), "input[2]");
    EXPECT_EQ(renamed("messages[99]"), "input");
    EXPECT_EQ(renamed("messages"), "input");
    EXPECT_EQ(renamed("max_tokens"), "max_output_tokens");
    EXPECT_EQ(renamed("response_format"), "text.format");
    EXPECT_EQ(renamed("tools[3].function.parameters"), "tools[3].parameters");
    EXPECT_EQ(renamed("tool_choice.function.name"), "tool_choice.name");
    EXPECT_EQ(renamed("temperature"), "temperature");
    EXPECT_EQ(renamed(""), "");
}

TEST(Responses, TranslatedBodyParsesAsAChatRequest) {
    // A Codex-shaped request: its chat translation is a valid chat body, and the
    // conversation reaches the segments in order.
    json body = {{"model", "local"},
                 {"instructions", "You are a coding agent."},
                 {"store", false},
                 {"stream", true},
                 {"include", json::array({"reasoning.encrypted_content"})},
                 {"reasoning", {{"effort", "medium"}, {"summary", "auto"}}},
                 {"prompt_cache_key", "t1"},
                 {"tool_choice", "auto"},
                 {"parallel_tool_calls", false},
                 {"tools", json::array({{{"type", "function"},
                                         {"name", "shell"},
                                         {"parameters", {{"type", "object"}}},
                                         {"strict", false}}})},
                 {"input", json::array({{{"type", "message"},
                                         {"role", "user"},
                                         {"content", json::array({{{"type", "input_text"}, {"text", "run ls"}}})}},
                                        {{"type", "function_call"}, {"call_id", "c1"}, {"name", "shell"},
                                         {"arguments", "{}"}},
                                        {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "a.txt"}}})}};
    json chat = chat_ok(body);
    completion_request cr;
    request_limits lim;
    auto e = parse_completion_request(chat, body_mode::chat, lim, cr);
    ASSERT_FALSE(e.has_value()) << e->param << ": " << e->message;
    EXPECT_TRUE(cr.stream);
    EXPECT_TRUE(cr.include_usage);
    ASSERT_GE(cr.segments.size(), 4u);
    EXPECT_EQ(cr.segments[0].content, "You are a coding agent.");
    EXPECT_EQ(cr.segments[1].content, "run ls");
    EXPECT_EQ(cr.segments[3].content, "a.txt");
}

TEST(Responses, SseTextAndIds) {
    responses_event e{"response.output_text.delta", {{"type", "response.output_text.delta"}, {"delta", "a\nb"}}};
    EXPECT_EQ(sse_text(e), "event: response.output_text.delta\n"
                           "data: {\"delta\":\"a\\nb\",\"type\":\"response.output_text.delta\"}\n\n");
    const std::string a = make_response_id(), b = make_response_id();
    EXPECT_EQ(a.rfind("resp_", 0), 0u);
    EXPECT_EQ(a.size(), 5u + 32u);
    EXPECT_NE(a, b);
}

// Codex groups tools in a namespace: its function tools join the list under their names;
// a bad tool inside is named with the namespace's index.
TEST(Responses, ANamespaceOfFunctionToolsIsFlattened) {
    json tools = json::array({{{"type", "function"}, {"name", "shell"}},
                              {{"type", "namespace"},
                               {"name", "multi_agent_v1"},
                               {"description", "agents"},
                               {"tools", json::array({{{"type", "function"}, {"name", "spawn_agent"}},
                                                      {{"type", "function"}, {"name", "close_agent"}}})}}});
    json chat = chat_ok(with(base(), "tools", tools));
    ASSERT_EQ(chat["tools"].size(), 3u);
    EXPECT_EQ(chat["tools"][1]["function"]["name"], "spawn_agent");
    EXPECT_EQ(chat["tools"][2]["function"]["name"], "close_agent");
    tools[1]["tools"][1] = {{"type", "web_search"}};
    EXPECT_EQ(chat_err(with(base(), "tools", tools)).param, "tools[1].tools[1].type");
    tools[1].erase("tools");
    EXPECT_EQ(chat_err(with(base(), "tools", tools)).param, "tools[1].tools");
}

// Before the answer begins, a heartbeat is another response.in_progress (with the next
// sequence number); after, nothing.
TEST(Responses, HeartbeatsAreInProgressEventsUntilTheAnswerBegins) {
    responses_request_info info;
    chat_ok(with(base(), "stream", true), &info);
    responses_stream rs(info, "resp_h1", 7);
    auto first = rs.heartbeat();  // before start(): start()'s two events
    ASSERT_EQ(first.size(), 2u);
    EXPECT_EQ(first[0].event, "response.created");
    auto hb = rs.heartbeat();
    ASSERT_EQ(hb.size(), 1u);
    EXPECT_EQ(hb[0].event, "response.in_progress");
    EXPECT_EQ(hb[0].data["sequence_number"], 2);
    EXPECT_EQ(hb[0].data["response"]["status"], "in_progress");
    (void)rs.text("Let me ");
    EXPECT_TRUE(rs.heartbeat().empty());
}

// 20,000 tools in a namespace once aborted the server: a namespace's tools count one by
// one against the chat's bound, and the 400 names `tools`.
TEST(Responses, ANamespaceOfTooManyToolsIsRefused) {
    json inner = json::array();
    for (int i = 0; i < 129; ++i) inner.push_back({{"type", "function"}, {"name", "t" + std::to_string(i)}});
    json body = {{"input", "hi"},
                 {"tools", json::array({{{"type", "namespace"}, {"name", "ns"}, {"tools", inner}}})}};
    responses_request_info info;
    json chat = chat_ok(body, &info);
    completion_request cr;
    request_limits lim;
    auto e = parse_completion_request(chat, body_mode::chat, lim, cr);
    ASSERT_TRUE(e.has_value());
    chat_error_to_responses(*e, info);
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->code, "too_many_tools");
    EXPECT_EQ(e->param, "tools");
}

}  // namespace
}  // namespace warmctx::server_detail
