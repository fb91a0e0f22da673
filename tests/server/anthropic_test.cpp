// The Anthropic Messages API's request mapper, error shape, usage and renderer: pure, no
// model (api/anthropic/: anthropic.h, render.cpp).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/api/anthropic/anthropic.h"
#include "server/completion.h"
#include "server/api/openai/openai.h"

namespace warmctx::server_detail {
namespace {

using json = nlohmann::json;

json base_body() {
    return {{"model", "claude-x"},
            {"max_tokens", 100},
            {"system", json::array({{{"type", "text"}, {"text", "x-anthropic-billing-header: cc_version=2.1.197.c4a;"}},
                                    {{"type", "text"}, {"text", "You are helpful."}, {"cache_control", {{"type", "ephemeral"}}}}})},
            {"messages", json::array({{{"role", "user"}, {"content", "list files"}}})}};
}

TEST(Anthropic, SystemBlocksMessagesToolUseAndToolResultsTranslate) {
    json body = base_body();
    body["messages"] = json::array(
        {{{"role", "user"}, {"content", "list files"}},
         {{"role", "assistant"},
          {"content", json::array({{{"type", "thinking"}, {"thinking", "hmm"}},
                                   {{"type", "text"}, {"text", "Let me look."}},
                                   {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "ls"}, {"input", {{"dir", "."}}}}})}},
         {{"role", "user"},
          {"content", json::array({{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "a.txt"}},
                                   {{"type", "tool_result"},
                                    {"tool_use_id", "toolu_2"},
                                    {"is_error", true},
                                    {"content", json::array({{{"type", "text"}, {"text", "denied"}}})}},
                                   {{"type", "text"}, {"text", "thanks"}}})}}});
    body["tools"] = json::array({{{"name", "ls"}, {"description", "List."}, {"input_schema", {{"type", "object"}}}}});
    body["tool_choice"] = {{"type", "tool"}, {"name", "ls"}, {"disable_parallel_tool_use", true}};
    body["stop_sequences"] = json::array({"END"});
    body["stream"] = true;
    body["thinking"] = {{"type", "adaptive"}};
    body["context_management"] = json::object();
    json chat;
    anthropic_request_info info;
    ASSERT_FALSE(anthropic_to_chat(body, "", 8192, chat, info));
    const json & m = chat["messages"];
    ASSERT_EQ(m.size(), 6u) << chat.dump();
    EXPECT_EQ(m[0], json({{"role", "system"}, {"content", "You are helpful."}}));
    EXPECT_EQ(m[1], json({{"role", "user"}, {"content", "list files"}}));
    EXPECT_EQ(m[2]["role"], "assistant");
    EXPECT_EQ(m[2]["content"], "Let me look.");
    EXPECT_EQ(m[2]["tool_calls"][0]["id"], "toolu_1");
    EXPECT_EQ(m[2]["tool_calls"][0]["function"]["name"], "ls");
    EXPECT_EQ(m[2]["tool_calls"][0]["function"]["arguments"], R"({"dir":"."})");
    EXPECT_EQ(m[3], json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "a.txt"}}));
    EXPECT_EQ(m[4], json({{"role", "tool"}, {"tool_call_id", "toolu_2"}, {"content", "Error: denied"}}));
    EXPECT_EQ(m[5], json({{"role", "user"}, {"content", "thanks"}}));
    EXPECT_EQ(chat["tools"][0]["function"]["parameters"], json({{"type", "object"}}));
    EXPECT_EQ(chat["tool_choice"]["function"]["name"], "ls");
    EXPECT_EQ(chat["parallel_tool_calls"], false);
    EXPECT_EQ(chat["stop"], json::array({"END"}));
    EXPECT_EQ(chat["stream"], true);
    EXPECT_TRUE(info.stream);
    EXPECT_EQ(info.message_sources[0], "system[1]");
    EXPECT_EQ(info.message_sources[3], "messages[2].content[0]");

    // The whole body parses as a chat request.
    completion_request cr;
    ASSERT_FALSE(parse_completion_request(chat, body_mode::chat, request_limits{}, cr));
    EXPECT_EQ(cr.tool_choice, tool_choice_mode::required);
    EXPECT_FALSE(cr.parallel_tool_calls);
}

// The attribution block, whose suffix changes per session, is a volatile segment of its
// own: the stable segments (system, tools) never contain it.
TEST(Anthropic, TheAttributionBlockIsAVolatileSegmentNotSystemText) {
    json chat;
    anthropic_request_info info;
    ASSERT_FALSE(anthropic_to_chat(base_body(), "", 8192, chat, info));
    ASSERT_EQ(chat["segments"].size(), 1u);
    EXPECT_EQ(chat["segments"][0]["id"], "attribution");
    EXPECT_EQ(chat["segments"][0]["kind"], "task_summary");
    completion_request cr;
    ASSERT_FALSE(parse_completion_request(chat, body_mode::chat, request_limits{}, cr));
    int n_attr = 0;
    for (const segment & s : cr.segments) {
        if (s.kind == segment_kind::system) EXPECT_EQ(s.content.find("billing"), std::string::npos);
        if (s.id == "attribution") {
            ++n_attr;
            EXPECT_EQ(s.kind, segment_kind::task_summary);
        }
    }
    EXPECT_EQ(n_attr, 1);
}

// An input_schema that is not an object is refused by name, not blamed on tool_choice.
TEST(Anthropic, AnInputSchemaThatIsNotAnObjectIsNamed) {
    json body = base_body();
    body["tools"] = json::array({{{"name", "ls"}, {"description", "d"}, {"input_schema", "a string"}}});
    json chat;
    anthropic_request_info info;
    ASSERT_FALSE(anthropic_to_chat(body, "", 8192, chat, info));
    completion_request cr;
    auto e = parse_completion_request(chat, body_mode::chat, request_limits{}, cr);
    ASSERT_TRUE(e);
    api_error err = *e;
    chat_error_to_anthropic(err, info);
    EXPECT_EQ(err.param, "tools[0].input_schema") << err.message;
}

// Two attribution blocks (a client may send such a shape) are two segments, each its
// text as sent (no header line), not a duplicate id.
TEST(Anthropic, TwoAttributionBlocksAreTwoSegments) {
    json body = base_body();
    json sys = json::array();
    sys.push_back({{"type", "text"}, {"text", "x-anthropic-billing-header: cc_version=1; cc_entrypoint=cli;"}});
    sys.push_back({{"type", "text"}, {"text", "x-anthropic-billing-header: cc_version=2; cc_entrypoint=sdk;"}});
    sys.push_back({{"type", "text"}, {"text", "You are a coding agent."}});
    body["system"] = sys;
    json chat;
    anthropic_request_info info;
    ASSERT_FALSE(anthropic_to_chat(body, "", 8192, chat, info));
    completion_request cr;
    auto e = parse_completion_request(chat, body_mode::chat, request_limits{}, cr);
    ASSERT_FALSE(e) << e->message;
    std::vector<std::string> attr;
    for (const segment & s : cr.segments)
        if (s.kind == segment_kind::task_summary) {
            attr.push_back(s.id);
            EXPECT_FALSE(s.header);
        }
    EXPECT_EQ(attr, (std::vector<std::string>{"attribution", "attribution-2"}));
}

TEST(Anthropic, SessionNamesTheWorkspaceAndMaxTokensIsClamped) {
    json body = base_body();
    body["max_tokens"] = 32000;
    body["metadata"] = {{"user_id", "user_abc_account_def_session_1234-5678"}};
    json chat;
    anthropic_request_info info;
    ASSERT_FALSE(anthropic_to_chat(body, "", 4096, chat, info));
    EXPECT_EQ(chat["max_tokens"], 4096);
    EXPECT_EQ(chat["prompt_cache_key"], "1234-5678");
    ASSERT_FALSE(anthropic_to_chat(body, "hdr-session", 4096, chat, info));
    EXPECT_EQ(chat["prompt_cache_key"], "hdr-session");  // the header wins
}

TEST(Anthropic, RefusalsNameTheField) {
    auto refused = [](json body) {
        json chat;
        anthropic_request_info info;
        auto e = anthropic_to_chat(body, "", 8192, chat, info);
        return e ? *e : api_error{};
    };
    json b = base_body();
    b.erase("max_tokens");
    EXPECT_EQ(refused(b).param, "max_tokens");
    EXPECT_EQ(refused(b).http_status, 400);
    b = base_body();
    b["messages"][0]["content"] = json::array({{{"type", "image"}, {"source", json::object()}}});
    EXPECT_EQ(refused(b).code, "unsupported_content");
    EXPECT_EQ(refused(b).param, "messages[0].content[0]");
    b = base_body();
    b["tools"] = json::array({{{"type", "web_search_20250305"}, {"name", "web_search"}}});
    EXPECT_EQ(refused(b).param, "tools[0].type");
    b = base_body();
    b["system"][1] = {{"type", "image"}};
    EXPECT_EQ(refused(b).param, "system[1]");
    EXPECT_EQ(refused(b).message.rfind("system[1] is not supported", 0), 0u) << refused(b).message;
    b = base_body();
    b["temperature"] = 1.5;
    EXPECT_EQ(refused(b).param, "temperature");
    b = base_body();
    b["messages"][0]["role"] = "tool";
    EXPECT_EQ(refused(b).param, "messages[0].role");
}

TEST(Anthropic, ErrorsInAnthropicsShape) {
    api_error e = bad_request("invalid_value", "max_tokens must be at least 1", "max_tokens");
    EXPECT_EQ(anthropic_error_json(e),
              json({{"type", "error"}, {"error", {{"type", "invalid_request_error"}, {"message", "max_tokens must be at least 1"}}}}));
    EXPECT_EQ(anthropic_error_type(401), "authentication_error");
    EXPECT_EQ(anthropic_error_type(404), "not_found_error");
    EXPECT_EQ(anthropic_error_type(413), "request_too_large");
    EXPECT_EQ(anthropic_error_type(429), "rate_limit_error");
    EXPECT_EQ(anthropic_error_type(503), "overloaded_error");
    EXPECT_EQ(anthropic_error_type(500), "api_error");
    // A chat parser's param, renamed to the Messages field.
    anthropic_request_info info;
    info.message_sources = {"system[1]", "messages[0]"};
    api_error p = bad_request("x", "y", "messages[1].content");
    chat_error_to_anthropic(p, info);
    EXPECT_EQ(p.param, "messages[0]");
    p.param = "tools[2].function.parameters.properties";
    chat_error_to_anthropic(p, info);
    EXPECT_EQ(p.param, "tools[2].input_schema.properties");
    p.param = "stop";
    chat_error_to_anthropic(p, info);
    EXPECT_EQ(p.param, "stop_sequences");
}

TEST(Anthropic, UsageSplitsReadWrittenAndUncachedInput) {
    // 1,000 prompt tokens: 600 reused, 900 cacheable (so 300 written), 100 not cacheable.
    EXPECT_EQ(anthropic_usage(1000, 600, 900, 7), json({{"input_tokens", 100},
                                                        {"cache_creation_input_tokens", 300},
                                                        {"cache_read_input_tokens", 600},
                                                        {"output_tokens", 7}}));
    EXPECT_EQ(anthropic_usage(50, 0, 0, 1)["input_tokens"], 50);
}

// Each SSE event's name, and its data's `type` must say the same.
std::vector<std::pair<std::string, json>> events_of(const std::string & text) {
    std::vector<std::pair<std::string, json>> out;
    size_t pos = 0;
    while (pos < text.size()) {
        const size_t end = text.find("\n\n", pos);
        EXPECT_NE(end, std::string::npos);
        if (end == std::string::npos) break;
        const std::string ev = text.substr(pos, end - pos);
        pos = end + 2;
        const size_t nl = ev.find('\n');
        EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
        EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
        json data = json::parse(ev.substr(nl + 7));
        const std::string name = ev.substr(7, nl - 7);
        EXPECT_EQ(data["type"], name);
        out.emplace_back(name, std::move(data));
    }
    return out;
}

TEST(Anthropic, StreamEventsTextThenAToolCall) {
    auto info = std::make_shared<anthropic_request_info>();
    info->model = "claude-x";
    auto r = make_anthropic_renderer(info);
    response_meta meta;
    meta.model = "served";
    completion_request cr;
    r->begin(meta, cr);
    std::string s = r->open();
    s += r->waiting(": keep-alive\n\n");
    answer_delta d1;
    d1.text = "Let me ";
    s += r->delta(d1);
    d1.text = "look.";
    s += r->delta(d1);
    answer_delta d2;
    d2.calls.push_back({0, true, "toolu_1", "ls", "{\"dir\":"});
    s += r->delta(d2);
    answer_delta d3;
    d3.calls.push_back({0, false, "", "", "\".\"}"});
    s += r->delta(d3);
    answer_end end;
    end.finish = finish_reason::stop;
    end.tool_calls = true;
    end.usage.prompt_tokens = 1000;
    end.usage.cached_tokens = 600;
    end.usage.completion_tokens = 9;
    end.report.explain.n_cacheable = 900;
    s += r->finish(end);
    auto ev = events_of(s);
    std::vector<std::string> names;
    for (auto & [n, d] : ev) names.push_back(n);
    EXPECT_EQ(names, (std::vector<std::string>{"message_start", "ping", "content_block_start", "content_block_delta",
                                                "content_block_delta", "content_block_stop", "content_block_start",
                                                "content_block_delta", "content_block_delta", "content_block_stop",
                                                "message_delta", "message_stop"}));
    EXPECT_EQ(ev[0].second["message"]["model"], "claude-x");
    EXPECT_EQ(ev[0].second["message"]["id"].get<std::string>().rfind("msg_", 0), 0u);
    EXPECT_EQ(ev[2].second["index"], 0);
    EXPECT_EQ(ev[2].second["content_block"]["type"], "text");
    EXPECT_EQ(ev[3].second["delta"], json({{"type", "text_delta"}, {"text", "Let me "}}));
    EXPECT_EQ(ev[6].second["index"], 1);
    EXPECT_EQ(ev[6].second["content_block"],
              json({{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "ls"}, {"input", json::object()}}));
    EXPECT_EQ(ev[7].second["delta"], json({{"type", "input_json_delta"}, {"partial_json", "{\"dir\":"}}));
    EXPECT_EQ(ev[8].second["delta"]["partial_json"], "\".\"}");
    EXPECT_EQ(ev[9].second["index"], 1);
    EXPECT_EQ(ev[10].second["delta"]["stop_reason"], "tool_use");
    EXPECT_EQ(ev[10].second["usage"]["cache_read_input_tokens"], 600);
    EXPECT_EQ(ev[10].second["usage"]["output_tokens"], 9);
    EXPECT_EQ(ev[10].second["warmctx"]["tokens_cacheable"], 900);  // timings and reuse, as on the chat route
}

TEST(Anthropic, WholeMessagesAndStopReasons) {
    auto info = std::make_shared<anthropic_request_info>();
    info->stop_sequences = {"END"};
    auto r = make_anthropic_renderer(info);
    response_meta meta;
    meta.model = "served";
    completion_request cr;
    r->begin(meta, cr);
    const std::string text = "hello";
    answer_end end;
    end.finish = finish_reason::stop;
    end.report.t_prefill_ms = 1.5;
    json m = r->whole(whole_answer{text, nullptr, nullptr, end});
    EXPECT_EQ(m["model"], "served");
    EXPECT_EQ(m["content"], json::array({{{"type", "text"}, {"text", "hello"}}}));
    EXPECT_EQ(m["stop_reason"], "stop_sequence");
    EXPECT_EQ(m["stop_sequence"], "END");
    EXPECT_EQ(m["warmctx"]["timings"]["prefill_ms"], 1.5);
    end.finish = finish_reason::length;
    EXPECT_EQ(r->whole(whole_answer{text, nullptr, nullptr, end})["stop_reason"], "max_tokens");
    end.finish = finish_reason::eos;
    EXPECT_EQ(r->whole(whole_answer{text, nullptr, nullptr, end})["stop_reason"], "end_turn");
    parsed_answer pa;
    pa.tool_calls.push_back({"toolu_9", "ls", "{\"dir\":\".\"}"});
    end.tool_calls = true;
    json t = r->whole(whole_answer{text, &pa, nullptr, end});
    EXPECT_EQ(t["stop_reason"], "tool_use");
    ASSERT_EQ(t["content"].size(), 1u);  // the parse's content is empty
    EXPECT_EQ(t["content"][0], json({{"type", "tool_use"}, {"id", "toolu_9"}, {"name", "ls"}, {"input", {{"dir", "."}}}}));
}

// A reasoning model's reasoning is a thinking block before the answer: whole, and
// streamed as thinking_delta events closed by an (empty) signature_delta.
TEST(Anthropic, ReasoningIsAThinkingBlockBeforeTheAnswer) {
    auto info = std::make_shared<anthropic_request_info>();
    auto r = make_anthropic_renderer(info);
    response_meta meta;
    meta.model = "served";
    completion_request cr;
    r->begin(meta, cr);
    answer_end end;
    end.finish = finish_reason::eos;
    parsed_answer pa;
    pa.reasoning = "The user wants a listing.";
    pa.content = "Here it is.";
    const std::string raw = "<think>The user wants a listing.</think>Here it is.";
    json m = r->whole(whole_answer{raw, &pa, nullptr, end});
    ASSERT_EQ(m["content"].size(), 2u);
    EXPECT_EQ(m["content"][0], json({{"type", "thinking"}, {"thinking", "The user wants a listing."}, {"signature", ""}}));
    EXPECT_EQ(m["content"][1], json({{"type", "text"}, {"text", "Here it is."}}));

    auto rs = make_anthropic_renderer(info);
    rs->begin(meta, cr);
    std::string s = rs->open();
    answer_delta d;
    d.reasoning = "The user ";
    s += rs->delta(d);
    d.reasoning = "wants a listing.";
    s += rs->delta(d);
    answer_delta t;
    t.text = "Here it is.";
    s += rs->delta(t);
    s += rs->finish(end);
    auto ev = events_of(s);
    std::vector<std::string> names;
    for (auto & [n, e] : ev) names.push_back(n);
    EXPECT_EQ(names, (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                                "content_block_delta", "content_block_delta", "content_block_stop",
                                                "content_block_start", "content_block_delta", "content_block_stop",
                                                "message_delta", "message_stop"}));
    EXPECT_EQ(ev[1].second["content_block"], json({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}));
    EXPECT_EQ(ev[2].second["delta"], json({{"type", "thinking_delta"}, {"thinking", "The user "}}));
    EXPECT_EQ(ev[3].second["delta"]["thinking"], "wants a listing.");
    EXPECT_EQ(ev[4].second["delta"], json({{"type", "signature_delta"}, {"signature", ""}}));
    EXPECT_EQ(ev[5].second["index"], 0);
    EXPECT_EQ(ev[6].second["index"], 1);
    EXPECT_EQ(ev[6].second["content_block"]["type"], "text");
    EXPECT_EQ(ev[7].second["delta"], json({{"type", "text_delta"}, {"text", "Here it is."}}));
}

}  // namespace
}  // namespace warmctx::server_detail
