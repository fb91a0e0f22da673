// The HTTP layer's pure parts: request parsing, messages -> segments, UTF-8, the
// workspace store, the error table and the metrics text. No model, no sockets.
#include <gtest/gtest.h>

#include <algorithm>

#include <sstream>

#include <limits>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/json_util.h"
#include "server/metrics.h"
#include "server/api/openai/openai.h"
#include "server/workspace_store.h"

namespace warmctx::server_detail {
namespace {

using json = nlohmann::json;

completion_request parse_ok(const json & body, body_mode mode = body_mode::chat) {
    completion_request cr;
    request_limits lim;
    lim.max_tokens_cap = 2048;
    lim.n_vocab = 1000;
    auto e = parse_completion_request(body, mode, lim, cr);
    EXPECT_FALSE(e.has_value()) << (e ? e->message : "");
    return cr;
}

api_error parse_err(const json & body, body_mode mode = body_mode::chat) {
    completion_request cr;
    request_limits lim;
    lim.max_tokens_cap = 2048;
    lim.n_vocab = 1000;
    auto e = parse_completion_request(body, mode, lim, cr);
    EXPECT_TRUE(e.has_value());
    return e.value_or(api_error{});
}

TEST(openai_mapping, messages_become_segments) {
    json body = {{"messages", json::array({{{"role", "system"}, {"content", "sys A"}},
                                           {{"role", "developer"}, {"content", "sys B"}},
                                           {{"role", "user"}, {"content", "q1"}},
                                           {{"role", "assistant"}, {"content", "a1"}},
                                           {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "q2"}},
                                                                                       {{"type", "text"}, {"text", "more"}}})}}})},
                 {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"a", 1}}}}})}};
    completion_request cr = parse_ok(body);
    ASSERT_EQ(cr.segments.size(), 6u);
    EXPECT_EQ(cr.segments[0].id, "system-00000");
    EXPECT_EQ(cr.segments[0].kind, segment_kind::system);
    EXPECT_EQ(cr.segments[1].id, "system-00001");
    EXPECT_EQ(cr.segments[1].content, "sys B");
    EXPECT_EQ(cr.segments[2].id, "h0000");
    EXPECT_EQ(cr.segments[2].kind, segment_kind::history);
    EXPECT_EQ(cr.segments[2].role, "user");
    EXPECT_EQ(cr.segments[3].id, "h0001");
    EXPECT_EQ(cr.segments[3].role, "assistant");
    EXPECT_EQ(cr.segments[4].id, "user");
    EXPECT_EQ(cr.segments[4].kind, segment_kind::user);
    EXPECT_EQ(cr.segments[4].content, "q2\nmore");
    EXPECT_EQ(cr.segments[5].id, "tools");
    EXPECT_EQ(cr.segments[5].kind, segment_kind::tools);
    // Canonical: keys sorted, no spaces, whatever order the client wrote them in.
    EXPECT_EQ(cr.segments[5].content, R"([{"function":{"a":1,"name":"f"},"type":"function"}])");
}

TEST(openai_mapping, last_message_not_user_is_history_and_tool_calls_are_kept) {
    json body = {{"messages", json::array({{{"role", "user"}, {"content", "run ls"}},
                                           {{"role", "assistant"},
                                            {"content", nullptr},
                                            {"tool_calls", json::array({{{"id", "c1"},
                                                                         {"type", "function"},
                                                                         {"function", {{"name", "sh"}, {"arguments", "{}"}}}}})}},
                                           {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "a.txt"}}})}};
    completion_request cr = parse_ok(body);
    ASSERT_EQ(cr.segments.size(), 3u);
    for (const segment & s : cr.segments) EXPECT_EQ(s.kind, segment_kind::history);
    // The calls are the message's structure (canonical JSON), not part of its text.
    EXPECT_EQ(cr.segments[1].content, "");
    EXPECT_EQ(cr.segments[1].tool_calls, R"([{"function":{"arguments":"{}","name":"sh"},"id":"c1","type":"function"}])");
    EXPECT_EQ(cr.segments[2].role, "tool");
    EXPECT_EQ(cr.segments[2].tool_call_id, "c1");
    // A call without a function name is a 400 naming it.
    json bad = body;
    bad["messages"][1]["tool_calls"][0]["function"].erase("name");
    EXPECT_EQ(parse_err(bad).param, "messages[1].tool_calls[0].function.name");
}

TEST(openai_mapping, tool_choice_parallel_calls_json_schema_and_prompt_cache_key) {
    const json msgs = json::array({{{"role", "user"}, {"content", "x"}}});
    const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}});
    completion_request a = parse_ok({{"messages", msgs}, {"tools", tools}});
    EXPECT_EQ(a.tool_choice, tool_choice_mode::auto_);
    EXPECT_TRUE(a.parallel_tool_calls);  // OpenAI's default
    EXPECT_EQ(a.tools_json, R"([{"function":{"name":"f","parameters":{}},"type":"function"}])");
    completion_request r = parse_ok({{"messages", msgs}, {"tools", tools}, {"tool_choice", "required"},
                                     {"parallel_tool_calls", false}});
    EXPECT_EQ(r.tool_choice, tool_choice_mode::required);
    EXPECT_FALSE(r.parallel_tool_calls);
    completion_request n = parse_ok(
        {{"messages", msgs}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}});
    EXPECT_EQ(n.tool_choice, tool_choice_mode::required);
    EXPECT_EQ(n.tool_choice_name, "f");
    EXPECT_EQ(parse_ok({{"messages", msgs}, {"tools", tools}, {"tool_choice", "none"}}).tool_choice, tool_choice_mode::none);
    // A required call without tools, an unknown tool_choice, a tool that is not a function.
    EXPECT_EQ(parse_err({{"messages", msgs}, {"tool_choice", "required"}}).param, "tool_choice");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"tools", tools}, {"tool_choice", "sometimes"}}).param, "tool_choice");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"tools", json::array({{{"type", "web_search"}}})}}).param, "tools[0].type");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"parallel_tool_calls", "yes"}}).param, "parallel_tool_calls");
    // json_schema: the schema, canonical.
    const json schema_rf = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}};
    completion_request s = parse_ok({{"messages", msgs}, {"response_format", schema_rf}});
    EXPECT_EQ(s.json_schema, R"({"type":"object"})");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"response_format", {{"type", "json_schema"}}}}).param,
              "response_format.json_schema");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"response_format", {{"type", "xml"}}}}).param, "response_format.type");
    // prompt_cache_key names the workspace when `workspace` does not; an id it cannot be is hashed.
    completion_request k = parse_ok({{"messages", msgs}, {"prompt_cache_key", "conv-123"}});
    EXPECT_EQ(k.workspace, "conv-123");
    EXPECT_TRUE(k.workspace_from_cache_key);
    completion_request h = parse_ok({{"messages", msgs}, {"prompt_cache_key", "a key/with spaces"}});
    EXPECT_EQ(h.workspace.rfind("key-", 0), 0u);
    EXPECT_EQ(h.workspace.size(), 4u + 16u);
    EXPECT_EQ(parse_ok({{"messages", msgs}, {"workspace", "w"}, {"prompt_cache_key", "conv-123"}}).workspace, "w");
}

TEST(openai_mapping, workspace_derivation) {
    completion_request a = parse_ok({{"messages", json::array({{{"role", "system"}, {"content", "S"}},
                                                               {{"role", "user"}, {"content", "x"}}})}});
    completion_request b = parse_ok({{"messages", json::array({{{"role", "system"}, {"content", "S"}},
                                                               {{"role", "user"}, {"content", "y"}},
                                                               {{"role", "assistant"}, {"content", "z"}},
                                                               {{"role", "user"}, {"content", "w"}}})}});
    completion_request c = parse_ok({{"messages", json::array({{{"role", "system"}, {"content", "T"}},
                                                               {{"role", "user"}, {"content", "x"}}})}});
    completion_request d = parse_ok({{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}});
    EXPECT_EQ(derive_workspace(a.segments), derive_workspace(b.segments));  // the tail does not matter
    EXPECT_NE(derive_workspace(a.segments), derive_workspace(c.segments));
    EXPECT_EQ(derive_workspace(a.segments).rfind("auto-", 0), 0u);
    EXPECT_EQ(derive_workspace(a.segments).size(), 21u);
    EXPECT_FALSE(validate_workspace_id(derive_workspace(a.segments)).has_value());
    EXPECT_EQ(derive_workspace(d.segments), "default");
}

TEST(openai_mapping, sampling_fields) {
    completion_request cr = parse_ok({{"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
                                      {"max_tokens", 10},
                                      {"max_completion_tokens", 12},
                                      {"temperature", 0.5},
                                      {"top_p", 0.9},
                                      {"seed", -1},
                                      {"stop", "END"},
                                      {"stream", true},
                                      {"stream_options", {{"include_usage", true}}},
                                      {"workspace", "w1"}});
    EXPECT_EQ(cr.sampling.max_tokens, 12);  // max_completion_tokens wins
    EXPECT_FLOAT_EQ(cr.sampling.temperature, 0.5f);
    EXPECT_FLOAT_EQ(cr.sampling.top_p, 0.9f);
    EXPECT_EQ(cr.sampling.seed, 0xFFFFFFFFu);
    ASSERT_EQ(cr.sampling.stop.size(), 1u);
    EXPECT_EQ(cr.sampling.stop[0], "END");
    EXPECT_TRUE(cr.stream);
    EXPECT_TRUE(cr.include_usage);
    EXPECT_EQ(cr.workspace, "w1");

    completion_request d = parse_ok({{"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
                                     {"max_tokens", nullptr},
                                     {"stop", json::array({"a", "b"})}});
    EXPECT_EQ(d.sampling.max_tokens, 2048) << "no max_tokens: to the end of the context";
    EXPECT_EQ(d.sampling.stop.size(), 2u);

    request_limits lim;
    lim.max_tokens_cap = 2048;
    lim.default_max_tokens = 100;  // serve --default-max-tokens 100
    completion_request e;
    ASSERT_FALSE(parse_completion_request({{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}},
                                          body_mode::chat, lim, e));
    EXPECT_EQ(e.sampling.max_tokens, 100);
}

TEST(openai_mapping, penalties_and_logit_bias_reach_the_sampler) {
    completion_request cr = parse_ok({{"messages", json::array({{{"role", "user"}, {"content", "x"}}})},
                                      {"presence_penalty", 0.5},
                                      {"frequency_penalty", -1.25},
                                      {"logit_bias", {{"42", -100}, {"7", 3.5}}}});
    EXPECT_FLOAT_EQ(cr.sampling.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(cr.sampling.frequency_penalty, -1.25f);
    ASSERT_EQ(cr.sampling.logit_bias.size(), 2u);
    EXPECT_EQ(cr.sampling.logit_bias[0], (std::pair<token_id, float>{42, -100.0f}));
    EXPECT_EQ(cr.sampling.logit_bias[1], (std::pair<token_id, float>{7, 3.5f}));
    const json msgs = json::array({{{"role", "user"}, {"content", "x"}}});
    EXPECT_EQ(parse_err({{"messages", msgs}, {"presence_penalty", 2.5}}).param, "presence_penalty");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"frequency_penalty", "a"}}).param, "frequency_penalty");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"logit_bias", {{"abc", 1}}}}).param, "logit_bias.abc");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"logit_bias", {{"1000", 1}}}}).param, "logit_bias.1000");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"logit_bias", {{"5", 101}}}}).param, "logit_bias.5");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"logit_bias", json::array()}}).param, "logit_bias");
}

// llama-server's speculative.n_max: the draft tokens of this request (0: none); without
// it, the server's --draft-max.
TEST(openai_mapping, speculative_n_max_sets_the_drafts) {
    const json msgs = json::array({{{"role", "user"}, {"content", "x"}}});
    EXPECT_EQ(parse_ok({{"messages", msgs}, {"speculative.n_max", 0}}).sampling.draft_max, 0);
    EXPECT_EQ(parse_ok({{"messages", msgs}, {"speculative.n_max", 8}}).sampling.draft_max, 8);
    request_limits lim;
    lim.default_draft_max = 16;  // serve --draft-max 16
    completion_request d;
    ASSERT_FALSE(parse_completion_request({{"messages", msgs}}, body_mode::chat, lim, d));
    EXPECT_EQ(d.sampling.draft_max, 16);
    EXPECT_EQ(parse_err({{"messages", msgs}, {"speculative.n_max", 65}}).param, "speculative.n_max");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"speculative.n_max", -1}}).param, "speculative.n_max");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"speculative.n_max", "8"}}).param, "speculative.n_max");
}

// What is not implemented yet is refused by name with a 400, never ignored with a 200.
TEST(openai_mapping, unimplemented_parameters_are_refused_by_name) {
    const json msgs = json::array({{{"role", "user"}, {"content", "x"}}});
    const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
    // A schema and tools at once is the one combination not implemented.
    {
        api_error e = parse_err({{"messages", msgs},
                                 {"tools", tools},
                                 {"response_format",
                                  {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", json::object()}}}}}});
        EXPECT_EQ(e.http_status, 400);
        EXPECT_EQ(e.code, "unsupported_parameter");
        EXPECT_EQ(e.param, "response_format");
    }
    // What is accepted: the values that ask for nothing this server lacks.
    parse_ok({{"messages", msgs}, {"logprobs", false}, {"response_format", {{"type", "text"}}}, {"tool_choice", "auto"},
              {"parallel_tool_calls", true}});
    parse_ok({{"messages", msgs}, {"tool_choice", "none"}, {"top_logprobs", nullptr}});
    for (const auto & [key, value] : std::vector<std::pair<std::string, json>>{
             {"echo", true}, {"best_of", 2}, {"tools", json::array()}, {"segments", json::array()}}) {
        api_error e = parse_err({{"prompt", "def f("}, {key, value}}, body_mode::text);
        EXPECT_EQ(e.code, "unsupported_parameter") << key;
        EXPECT_EQ(e.param, key);
    }
    parse_ok({{"prompt", "def f("}, {"logprobs", 0}, {"echo", false}, {"best_of", 1}, {"suffix", ""}}, body_mode::text);
}

TEST(openai_mapping, logprobs_fields) {
    const json msgs = json::array({{{"role", "user"}, {"content", "x"}}});
    EXPECT_EQ(parse_ok({{"messages", msgs}}).sampling.n_logprobs, -1);
    EXPECT_EQ(parse_ok({{"messages", msgs}, {"logprobs", true}}).sampling.n_logprobs, 0);
    EXPECT_EQ(parse_ok({{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 5}}).sampling.n_logprobs, 5);
    EXPECT_EQ(parse_ok({{"messages", msgs}, {"logprobs", false}}).sampling.n_logprobs, -1);
    EXPECT_EQ(parse_err({{"messages", msgs}, {"top_logprobs", 5}}).param, "top_logprobs");  // needs logprobs: true
    EXPECT_EQ(parse_err({{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 21}}).param, "top_logprobs");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"logprobs", 3}}).param, "logprobs");
    EXPECT_EQ(parse_ok({{"prompt", "x"}, {"logprobs", 3}}, body_mode::text).sampling.n_logprobs, 3);
    EXPECT_EQ(parse_err({{"prompt", "x"}, {"logprobs", true}}, body_mode::text).param, "logprobs");
    EXPECT_EQ(parse_err({{"prompt", "x"}, {"logprobs", 21}}, body_mode::text).param, "logprobs");
}

// /v1/completions: the prompt as given (raw), a suffix makes it fill-in-the-middle.
TEST(openai_mapping, a_completion_prompt_is_raw) {
    completion_request cr = parse_ok({{"prompt", "def f(x):"}}, body_mode::text);
    EXPECT_TRUE(cr.raw);
    ASSERT_EQ(cr.segments.size(), 1u);
    EXPECT_EQ(cr.segments[0].content, "def f(x):");
    EXPECT_FALSE(cr.suffix.has_value());
    completion_request fim = parse_ok({{"prompt", "def f(x):"}, {"suffix", "\n    return y"}}, body_mode::text);
    ASSERT_TRUE(fim.suffix.has_value());
    EXPECT_EQ(*fim.suffix, "\n    return y");
    EXPECT_EQ(parse_err({{"prompt", "x"}, {"suffix", 3}}, body_mode::text).param, "suffix");
    EXPECT_FALSE(parse_ok({{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}}).raw);
}

// Found by fuzz/fuzz_chat_request.cpp: a top_p in (0, 1] but below float's smallest
// normal value became 0 (or a denormal), which the engine refuses after the request
// was queued.
TEST(openai_mapping, a_tiny_top_p_stays_positive) {
    json msgs = json::array({{{"role", "user"}, {"content", "x"}}});
    for (double tiny : {1e-50, 1e-300, 5e-324}) {
        completion_request cr = parse_ok({{"messages", msgs}, {"temperature", 1}, {"top_p", tiny}});
        EXPECT_GE(cr.sampling.top_p, std::numeric_limits<float>::min()) << tiny;
        EXPECT_LE(cr.sampling.top_p, 1.0f) << tiny;
    }
}

TEST(openai_mapping, errors_name_the_field) {
    json msgs = json::array({{{"role", "user"}, {"content", "x"}}});
    EXPECT_EQ(parse_err({{"model", "m"}}).param, "messages");
    EXPECT_EQ(parse_err({{"messages", json::array()}}).param, "messages");
    EXPECT_EQ(parse_err({{"messages", json::array({{{"content", "x"}}})}}).param, "messages[0].role");
    EXPECT_EQ(parse_err({{"messages", json::array({{{"role", "robot"}, {"content", "x"}}})}}).code, "unknown_role");
    EXPECT_EQ(parse_err({{"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})}}).param,
              "messages[0].content[0].type");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"max_tokens", 0}}).param, "max_tokens");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"max_tokens", 2049}}).param, "max_tokens");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"max_tokens", 1.5}}).code, "invalid_type");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"temperature", 3}}).param, "temperature");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"top_p", 0}}).param, "top_p");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"n", 2}}).param, "n");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"stop", json::array({""})}}).param, "stop");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"stream", "yes"}}).param, "stream");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"stream_options", {{"include_usage", 1}}}}).param,
              "stream_options.include_usage");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"workspace", "a/b"}}).code, "invalid_workspace");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"segments", json::array({{{"id", "../x"}, {"kind", "diff"}, {"content", ""}}})}}).code,
              "invalid_segment_id");
    EXPECT_EQ(parse_err({{"messages", msgs}, {"tools", {{"a", 1}}}}).param, "tools");
    EXPECT_EQ(parse_err(json::array()).param, "body");
    EXPECT_EQ(parse_err({{"max_tokens", 3}}, body_mode::workspace_chat).param, "messages");
    EXPECT_EQ(parse_err({{"prompt", json::array({"a", "b"})}}, body_mode::text).param, "prompt");
    EXPECT_EQ(parse_err({{"prompt", ""}}, body_mode::text).param, "prompt");
    for (const auto & e : {parse_err({{"messages", msgs}, {"max_tokens", -1}})}) EXPECT_EQ(e.http_status, 400);
}

TEST(openai_mapping, workspace_chat_takes_segments_only_and_text_takes_a_prompt) {
    completion_request w = parse_ok({{"segments", json::array({{{"id", "q"}, {"kind", "user"}, {"content", "why"}}})}},
                                    body_mode::workspace_chat);
    ASSERT_EQ(w.segments.size(), 1u);
    EXPECT_EQ(w.segments[0].kind, segment_kind::user);
    completion_request t = parse_ok({{"prompt", "hello"}}, body_mode::text);
    ASSERT_EQ(t.segments.size(), 1u);
    EXPECT_EQ(t.segments[0].id, "prompt");
    EXPECT_EQ(t.shape, api_shape::text);
}

TEST(openai_mapping, workspace_ids) {
    EXPECT_FALSE(validate_workspace_id("proj-1.main_2").has_value());
    EXPECT_TRUE(validate_workspace_id("").has_value());
    EXPECT_TRUE(validate_workspace_id(".git").has_value());
    EXPECT_TRUE(validate_workspace_id("..").has_value());
    EXPECT_TRUE(validate_workspace_id("a/b").has_value());
    EXPECT_TRUE(validate_workspace_id("a b").has_value());
    EXPECT_TRUE(validate_workspace_id(std::string(65, 'a')).has_value());
    EXPECT_FALSE(validate_workspace_id(std::string(64, 'a')).has_value());
}

TEST(utf8, validator) {
    EXPECT_EQ(find_invalid_utf8("plain ascii"), k_utf8_valid);
    EXPECT_EQ(find_invalid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), k_utf8_valid);
    EXPECT_EQ(find_invalid_utf8("ab\xFF"), 2u);
    EXPECT_EQ(find_invalid_utf8("\xC3"), 0u);              // truncated
    EXPECT_EQ(find_invalid_utf8("\xC0\xAF"), 0u);          // overlong '/'
    EXPECT_EQ(find_invalid_utf8("\xE0\x80\xAF"), 0u);      // overlong
    EXPECT_EQ(find_invalid_utf8("x\xED\xA0\x80"), 1u);     // surrogate U+D800
    EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
    EXPECT_EQ(find_invalid_utf8("\xE2\x82"), 0u);
    // Output never throws on bytes that are not text.
    EXPECT_EQ(dump_json(json("a\xFF")), "\"a\xEF\xBF\xBD\"");
}

TEST(json_depth, counts_brackets_outside_strings) {
    EXPECT_EQ(json_nesting_depth("1"), 0u);
    EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}]})"), 4u);
    EXPECT_EQ(json_nesting_depth(R"({"a": "[[[[[\"[["})"), 1u);
    EXPECT_EQ(json_nesting_depth(std::string(100000, '[')), 100000u);
}

TEST(error_table, status_codes_map_to_http) {
    EXPECT_EQ(error_from_status(invalid_argument("x")).http_status, 400);
    EXPECT_EQ(error_from_status(out_of_range("x")).http_status, 400);
    EXPECT_EQ(error_from_status(not_found("x")).http_status, 404);
    EXPECT_EQ(error_from_status(failed_precondition("x")).http_status, 409);
    api_error busy = error_from_status(resource_exhausted("x"));
    EXPECT_EQ(busy.http_status, 429);
    EXPECT_EQ(busy.retry_after_s, 1);
    EXPECT_EQ(error_from_status(status(status_code::cancelled, "x")).http_status, 503);
    EXPECT_EQ(error_from_status(engine_error("x")).http_status, 500);
    EXPECT_EQ(error_from_status(internal_error("x")).http_status, 500);
    json body = json::parse(error_from_status(invalid_argument("bad"), "messages").body());
    EXPECT_EQ(body["error"]["message"], "bad");
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(body["error"]["code"], "invalid_argument");
    EXPECT_EQ(body["error"]["param"], "messages");
    EXPECT_TRUE(json::parse(bad_request("c", "m").body())["error"]["param"].is_null());
}

TEST(workspace_store_test, bounds) {
    store_limits lim;
    lim.max_workspaces = 2;
    lim.max_segments_per_workspace = 2;
    lim.max_segment_bytes = 100;
    lim.max_store_bytes = 150;
    workspace_store st(lim);
    bool created = false;
    auto seg = [](std::string id, size_t n) { return segment{std::move(id), segment_kind::system, "", "", std::string(n, 'x')}; };
    EXPECT_FALSE(st.put("a", seg("s1", 50), created));
    EXPECT_TRUE(created);
    EXPECT_FALSE(st.put("a", seg("s1", 60), created));  // replace
    EXPECT_FALSE(created);
    EXPECT_EQ(st.n_bytes(), 62u);
    EXPECT_EQ(st.put("a", seg("big", 101), created)->http_status, 413);
    EXPECT_FALSE(st.put("a", seg("s2", 10), created));
    EXPECT_EQ(st.put("a", seg("s3", 1), created)->http_status, 429);  // 2 segments per workspace
    EXPECT_FALSE(st.put("b", seg("s1", 10), created));
    EXPECT_EQ(st.put("c", seg("s1", 1), created)->http_status, 429);  // 2 workspaces
    EXPECT_EQ(st.put("b", seg("s2", 90), created)->http_status, 429);  // 150 bytes in all
    EXPECT_EQ(st.list("a")->size(), 2u);
    EXPECT_EQ(st.list("a")->front().id, "s1");
    EXPECT_TRUE(*st.erase("a", "s2"));
    EXPECT_FALSE(*st.erase("a", "s2"));
    EXPECT_EQ(*st.drop("a"), 1u);
    EXPECT_FALSE(st.list("a").has_value());
    EXPECT_EQ(st.n_segments(), 1u);
    EXPECT_EQ(st.n_bytes(), 12u);
}

// serve --replica: one label on every sample, first among its labels; comments untouched.
TEST(metrics_text, a_replica_label_goes_on_every_sample) {
    const std::string text = "# HELP a_total x\n# TYPE a_total counter\na_total 3\n"
                             "b{route=\"/v1/x y\",status=\"200\"} 1\nc{} 2\nd_bucket{le=\"+Inf\"} 4\n";
    EXPECT_EQ(with_label(text, "replica", "r\"1"),
              "# HELP a_total x\n# TYPE a_total counter\na_total{replica=\"r\\\"1\"} 3\n"
              "b{replica=\"r\\\"1\",route=\"/v1/x y\",status=\"200\"} 1\nc{replica=\"r\\\"1\"} 2\n"
              "d_bucket{replica=\"r\\\"1\",le=\"+Inf\"} 4\n");
    EXPECT_EQ(with_label(text, "replica", ""), text);
    server_metrics m;
    const std::string all = with_label(m.render(engine_snapshot{}), "replica", "r7");
    size_t n_samples = 0;
    std::istringstream lines(all);
    for (std::string line; std::getline(lines, line);) {
        if (line.empty() || line[0] == '#') continue;
        ++n_samples;
        EXPECT_NE(line.find("replica=\"r7\""), std::string::npos) << line;
    }
    EXPECT_GT(n_samples, 10u);
}

TEST(metrics_text, histograms_and_counters) {
    server_metrics m;
    request_outcome o;
    o.route = "/v1/chat/completions";
    o.status = 200;
    o.duration_s = 0.3;
    o.ttft_s = 0.02;
    o.prompt_tokens = 100;
    o.cached_tokens = 60;
    o.prefilled_tokens = 40;
    o.completion_tokens = 5;
    m.record(o);
    o.duration_s = 100;  // beyond the last bucket
    o.ttft_s = -1;
    m.record(o);
    engine_snapshot snap;
    snap.have_counters = true;
    snap.counters.cache.evictions_by_class[static_cast<int>(retention_class::low)] = 3;
    std::string t = m.render(snap);
    EXPECT_NE(t.find("warmctx_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2\n"), std::string::npos) << t;
    EXPECT_NE(t.find("warmctx_cached_tokens_total 120\n"), std::string::npos);
    EXPECT_NE(t.find("warmctx_request_duration_seconds_bucket{le=\"0.5\"} 1\n"), std::string::npos);
    EXPECT_NE(t.find("warmctx_request_duration_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
    EXPECT_NE(t.find("warmctx_request_duration_seconds_count 2\n"), std::string::npos);
    EXPECT_NE(t.find("warmctx_ttft_seconds_count 1\n"), std::string::npos);
    EXPECT_NE(t.find("warmctx_evictions_total{class=\"low\"} 3\n"), std::string::npos);
    EXPECT_NE(t.find("warmctx_cache_bytes{tier=\"engine\"} 0\n"), std::string::npos);
}

// ---- request bounds (issue 30): refused while parsing, before any template or grammar ----

json many_tools(size_t n, size_t description_bytes = 8) {
    json tools = json::array();
    for (size_t i = 0; i < n; ++i)
        tools.push_back({{"type", "function"},
                         {"function", {{"name", "f" + std::to_string(i)},
                                       {"description", std::string(description_bytes, 'd')},
                                       {"parameters", {{"type", "object"}}}}}});
    return tools;
}

json one_user_message() { return json::array({{{"role", "user"}, {"content", "hi"}}}); }

// 30,000 small tools once grew a chat to 24 GB: the count is refused on its own.
TEST(request_bounds, too_many_tools_is_a_400_naming_the_bound) {
    api_error e = parse_err({{"messages", one_user_message()}, {"tools", many_tools(129)}});
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.code, "too_many_tools");
    EXPECT_EQ(e.param, "tools");
    EXPECT_NE(e.message.find("--max-tools"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("128"), std::string::npos) << e.message;
    completion_request cr = parse_ok({{"messages", one_user_message()}, {"tools", many_tools(128)}});
    EXPECT_FALSE(cr.tools_json.empty());
}

TEST(request_bounds, the_tools_canonical_bytes_are_bounded) {
    // 100 tools of 8 KiB descriptions: 800 KiB, over the default 512 KiB.
    api_error e = parse_err({{"messages", one_user_message()}, {"tools", many_tools(100, 8192)}});
    EXPECT_EQ(e.code, "tools_too_large");
    EXPECT_EQ(e.param, "tools");
    EXPECT_NE(e.message.find("--max-tools-bytes"), std::string::npos) << e.message;
    // The bound is the server's.
    completion_request cr;
    request_limits lim;
    lim.bounds.max_tools_bytes = 1u << 20;
    EXPECT_FALSE(parse_completion_request({{"messages", one_user_message()}, {"tools", many_tools(100, 8192)}},
                                          body_mode::chat, lim, cr));
    lim.bounds.max_tools = 10;
    auto e2 = parse_completion_request({{"messages", one_user_message()}, {"tools", many_tools(11)}}, body_mode::chat,
                                       lim, cr);
    ASSERT_TRUE(e2.has_value());
    EXPECT_EQ(e2->code, "too_many_tools");
}

// The `segments` extension's tools segment is the same array by another door.
TEST(request_bounds, a_tools_segment_in_the_body_is_bounded_too) {
    json segs = json::array({{{"id", "tools"}, {"kind", "tools"}, {"content", dump_json(many_tools(200))}}});
    api_error e = parse_err({{"messages", one_user_message()}, {"segments", segs}}, body_mode::workspace_chat);
    EXPECT_EQ(e.code, "too_many_tools");
    // Free text describing tools is a message, not a tools array: not counted.
    json text = json::array({{{"id", "tools"}, {"kind", "tools"}, {"content", "You may call ls and cat."}}});
    parse_ok({{"messages", one_user_message()}, {"segments", text}}, body_mode::workspace_chat);
    // Stored segments are checked after the merge (run_completion) by the same function.
    segment st;
    st.id = "tools";
    st.kind = segment_kind::tools;
    st.content = dump_json(many_tools(129));
    std::vector<segment> stored{st};
    auto e2 = check_tools_segments(stored, request_bounds{});
    ASSERT_TRUE(e2.has_value());
    EXPECT_EQ(e2->code, "too_many_tools");
}

TEST(request_bounds, messages_are_bounded_by_the_server) {
    completion_request cr;
    request_limits lim;
    lim.bounds.max_messages = 8;
    json msgs = json::array();
    for (int i = 0; i < 9; ++i) msgs.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "m"}});
    auto e = parse_completion_request({{"messages", msgs}}, body_mode::chat, lim, cr);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code, "too_many_messages");
    EXPECT_EQ(e->param, "messages");
    EXPECT_NE(e->message.find("--max-messages"), std::string::npos) << e->message;
    msgs.erase(msgs.begin());
    EXPECT_FALSE(parse_completion_request({{"messages", msgs}}, body_mode::chat, lim, cr));
    // The default: 4,096.
    EXPECT_EQ(request_bounds{}.max_messages, 4096u);
}

json with_schema(const json & schema) {
    return {{"messages", one_user_message()},
            {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", schema}}}}}};
}
json enum_of(size_t n) {
    json e = json::array();
    for (size_t i = 0; i < n; ++i) e.push_back("v" + std::to_string(i));
    return e;
}

// A 100k-value enum stalled every client: its grammar is sampled on the engine thread.
TEST(request_bounds, enum_values_are_bounded_over_the_request) {
    parse_ok(with_schema({{"type", "string"}, {"enum", enum_of(256)}}));
    api_error e = parse_err(with_schema({{"type", "string"}, {"enum", enum_of(257)}}));
    EXPECT_EQ(e.code, "too_many_enum_values");
    EXPECT_EQ(e.param, "response_format.json_schema.schema");
    EXPECT_NE(e.message.find("--max-enum-values"), std::string::npos) << e.message;
    // Counted over every property (and every tool).
    json two = {{"type", "object"},
                {"properties", {{"a", {{"enum", enum_of(150)}}}, {"b", {{"enum", enum_of(150)}}}}}};
    EXPECT_EQ(parse_err(with_schema(two)).code, "too_many_enum_values");
    json tools = json::array();
    for (int i = 0; i < 2; ++i)
        tools.push_back({{"type", "function"},
                         {"function", {{"name", "f" + std::to_string(i)},
                                       {"parameters", {{"type", "object"},
                                                       {"properties", {{"x", {{"enum", enum_of(150)}}}}}}}}}});
    api_error t = parse_err({{"messages", one_user_message()}, {"tools", tools}});
    EXPECT_EQ(t.code, "too_many_enum_values");
    EXPECT_EQ(t.param, "tools[1].function.parameters");
}

TEST(request_bounds, patterns_are_bounded_in_length_and_nesting) {
    parse_ok(with_schema({{"type", "string"}, {"pattern", "^(a|b(c|[d(]))+$"}}));
    api_error e = parse_err(with_schema({{"type", "string"}, {"pattern", "^" + std::string(1100, 'a') + "$"}}));
    EXPECT_EQ(e.code, "pattern_too_long");
    EXPECT_NE(e.message.find("--max-pattern-bytes"), std::string::npos) << e.message;
    // llama.cpp's converter gives up past 100 groups deep and accepts any string: refused
    // here, as any nesting over the bound.
    for (size_t depth : {33u, 101u}) {
        api_error d = parse_err(with_schema({{"type", "string"},
                                             {"pattern", "^" + std::string(depth, '(') + "a" + std::string(depth, ')') + "$"}}));
        EXPECT_EQ(d.code, "pattern_too_deep") << depth;
        EXPECT_NE(d.message.find("--max-pattern-nesting"), std::string::npos) << d.message;
    }
    // Escaped parentheses are characters, not groups.
    std::string escaped = "^";
    for (int i = 0; i < 50; ++i) escaped += "\\(";
    parse_ok(with_schema({{"type", "string"}, {"pattern", escaped + "$"}}));
}

// Schemas llama.cpp's converter turns into "any value": a 400, never unconstrained output.
TEST(request_bounds, refs_must_resolve_inside_the_schema) {
    api_error remote = parse_err(with_schema({{"$ref", "https://example.com/schema.json#/x"}}));
    EXPECT_EQ(remote.code, "unsupported_schema");
    EXPECT_EQ(remote.param, "response_format.json_schema.schema");
    EXPECT_EQ(parse_err(with_schema({{"$ref", "#/$defs/missing"}, {"$defs", json::object()}})).code,
              "unsupported_schema");
    json mutual = {{"$ref", "#/$defs/a"},
                   {"$defs", {{"a", {{"$ref", "#/$defs/b"}}}, {"b", {{"$ref", "#/$defs/a"}}}}}};
    EXPECT_EQ(parse_err(with_schema(mutual)).code, "unsupported_schema");
    EXPECT_EQ(parse_err(with_schema({{"$ref", "#"}})).code, "unsupported_schema");
    // Recursion through structure is a schema like any other (a tree).
    json tree = {{"$ref", "#/$defs/node"},
                 {"$defs", {{"node", {{"type", "object"},
                                      {"properties", {{"v", {{"type", "integer"}}},
                                                      {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}}}}}}}}}};
    parse_ok(with_schema(tree));
    // A tool's parameters too.
    json tools = json::array({{{"type", "function"},
                               {"function", {{"name", "f"}, {"parameters", {{"$ref", "http://x/y"}}}}}}});
    api_error t = parse_err({{"messages", one_user_message()}, {"tools", tools}});
    EXPECT_EQ(t.code, "unsupported_schema");
    EXPECT_EQ(t.param, "tools[0].function.parameters");
}

}  // namespace
// More than a thousand system messages keep their order: their ids order them, and sort
// as text in the order they came.
TEST(OpenAiParse, ThousandsOfSystemMessagesKeepTheirOrder) {
    json msgs = json::array();
    for (int i = 0; i < 1002; ++i) msgs.push_back({{"role", "system"}, {"content", "s" + std::to_string(i)}});
    msgs.push_back({{"role", "user"}, {"content", "q"}});
    completion_request cr = parse_ok({{"messages", msgs}});
    std::vector<std::string> ids;
    for (const segment & s : cr.segments)
        if (s.kind == segment_kind::system) ids.push_back(s.id);
    ASSERT_EQ(ids.size(), 1002u);
    EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end())) << ids[100] << " " << ids[1000];
}

}  // namespace warmctx::server_detail
