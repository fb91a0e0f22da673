// End-to-end tests of the HTTP layer: an in-process scheduler on the tiny model and an
// http_server on an ephemeral port, driven over loopback by a real HTTP client.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/sse_reader.h"
#include "server_test_util.h"
#include "warmctx/scheduler.h"
#include "warmctx/server.h"

namespace warmctx {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

using testing_http::eventually;
using testing_http::raw_connection;
using testing_http::tiny_scheduler_options;

struct sse_event {
    bool done = false;  // "data: [DONE]"
    json data;
};

// Splits an SSE body into its data events, skipping comments (": keep-alive", or
// ": keep-alive prefill P/N" while a prompt is prefilled, which SSE clients ignore);
// fails the test on anything else.
std::vector<sse_event> parse_sse(const std::string & body) {
    std::vector<sse_event> out;
    bool unterminated = false;
    std::string framed;  // the events framed again: the body itself when each ends in "\n\n"
    for (const cli::sse_event & event : cli::sse_reader::read_all(body, &unterminated)) {
        const std::string & ev = event.raw;
        framed += ev + "\n\n";
        if (ev.rfind(":", 0) == 0) {
            EXPECT_EQ(ev.rfind(": keep-alive", 0), 0u) << ev;
            EXPECT_EQ(ev.find('\n'), std::string::npos) << ev;
            continue;
        }
        EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
        std::string payload = ev.substr(6);
        sse_event e;
        if (payload == "[DONE]") {
            e.done = true;
        } else {
            e.data = json::parse(payload, nullptr, false);
            EXPECT_FALSE(e.data.is_discarded()) << payload;
        }
        out.push_back(std::move(e));
    }
    EXPECT_FALSE(unterminated) << "unterminated SSE event at " << framed.size();
    EXPECT_EQ(framed, body.substr(0, framed.size())) << "an SSE event not framed by one blank line";
    return out;
}

json chat_body(const std::string & user, int max_tokens = 4) {
    return {{"model", "tiny"},
            {"messages", json::array({{{"role", "system"}, {"content", "You are a terse assistant."}},
                                      {{"role", "user"}, {"content", user}}})},
            {"max_tokens", max_tokens},
            {"temperature", 0}};
}

class server_test : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        auto s = scheduler::start(tiny_scheduler_options());
        ASSERT_TRUE(s.ok()) << s.error().to_string();
        sched_ = std::move(*s);
        server_options so;
        so.port = 0;
        so.max_body_bytes = 256 * 1024;
        so.log_requests = false;
        auto h = http_server::start(*sched_, so);
        ASSERT_TRUE(h.ok()) << h.error().to_string();
        server_ = std::move(*h);
    }
    static void TearDownTestSuite() {
        server_.reset();
        if (sched_) sched_->stop();
        sched_.reset();
    }
    void SetUp() override { ASSERT_TRUE(server_ && sched_); }

    static std::unique_ptr<httplib::Client> client(int port = -1) {
        auto c = std::make_unique<httplib::Client>("127.0.0.1", port < 0 ? server_->port() : port);
        c->set_read_timeout(120, 0);
        c->set_write_timeout(30, 0);
        return c;
    }
    static httplib::Result post(const std::string & path, const std::string & body, const httplib::Headers & h = {}) {
        return client()->Post(path.c_str(), h, body, "application/json");
    }
    static httplib::Result post_json(const std::string & path, const json & body) { return post(path, body.dump()); }

    // The response is an OpenAI error object with this status; returns its "error".
    static json expect_error(const httplib::Result & r, int http_status) {
        EXPECT_TRUE(r) << "no response";
        if (!r) return {};
        EXPECT_EQ(r->status, http_status) << r->body;
        json j = json::parse(r->body, nullptr, false);
        EXPECT_TRUE(j.is_object() && j.contains("error")) << r->body;
        if (!j.is_object() || !j.contains("error")) return {};
        const json & e = j["error"];
        EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r->body;
        EXPECT_TRUE(e["type"].is_string()) << r->body;
        EXPECT_TRUE(e["code"].is_string()) << r->body;
        EXPECT_TRUE(e.contains("param")) << r->body;
        return e;
    }

    // After bad input: the server still answers, and still serves a completion.
    static void expect_healthy() {
        auto h = client()->Get("/health");
        ASSERT_TRUE(h);
        EXPECT_EQ(h->status, 200);
        auto r = post_json("/v1/chat/completions", chat_body("still there?", 2));
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200) << r->body;
    }

    static std::unique_ptr<scheduler> sched_;
    static std::unique_ptr<http_server> server_;
};

std::unique_ptr<scheduler> server_test::sched_;
std::unique_ptr<http_server> server_test::server_;

// ---- basics ----------------------------------------------------------------------

TEST_F(server_test, health_and_models) {
    auto h = client()->Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    EXPECT_EQ(json::parse(h->body)["status"], "ok");

    auto m = client()->Get("/v1/models");
    ASSERT_TRUE(m);
    ASSERT_EQ(m->status, 200) << m->body;
    json j = json::parse(m->body);
    EXPECT_EQ(j["object"], "list");
    ASSERT_EQ(j["data"].size(), 1u);
    EXPECT_EQ(j["data"][0]["object"], "model");
    EXPECT_EQ(j["data"][0]["id"], "tiny-f16-seed1");
    EXPECT_EQ(j["data"][0]["meta"]["n_ctx_seq"], 2048);

    auto one = client()->Get("/v1/models/tiny-f16-seed1");
    ASSERT_TRUE(one);
    EXPECT_EQ(one->status, 200);
    expect_error(client()->Get("/v1/models/gpt-9"), 404);
}

TEST_F(server_test, chat_non_streamed) {
    auto r = post_json("/v1/chat/completions", chat_body("Say hello.", 6));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    json j = json::parse(r->body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(j["model"], "tiny-f16-seed1");
    ASSERT_EQ(j["choices"].size(), 1u);
    const json & c = j["choices"][0];
    EXPECT_EQ(c["index"], 0);
    EXPECT_EQ(c["message"]["role"], "assistant");
    EXPECT_TRUE(c["message"]["content"].is_string());
    EXPECT_TRUE(c["finish_reason"] == "stop" || c["finish_reason"] == "length") << c;
    const json & u = j["usage"];
    EXPECT_GT(u["prompt_tokens"].get<int>(), 0);
    EXPECT_GE(u["completion_tokens"].get<int>(), 1);
    EXPECT_LE(u["completion_tokens"].get<int>(), 6);
    EXPECT_EQ(u["total_tokens"].get<int>(), u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
    EXPECT_GE(u["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
    // The warmctx extension says where reuse stopped.
    EXPECT_TRUE(j["warmctx"]["workspace"].get<std::string>().rfind("auto-", 0) == 0) << j["warmctx"];
    EXPECT_EQ(j["warmctx"]["tokens_reused"].get<int>() + j["warmctx"]["tokens_prefilled"].get<int>(),
              u["prompt_tokens"].get<int>());
}

TEST_F(server_test, chat_streamed_with_usage) {
    json body = chat_body("Count to three.", 6);
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    auto r = post_json("/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    auto events = parse_sse(r->body);
    ASSERT_GE(events.size(), 4u) << r->body;  // role, >= 0 deltas, finish, usage, [DONE]
    EXPECT_TRUE(events.back().done);
    for (size_t i = 0; i + 1 < events.size(); ++i) EXPECT_FALSE(events[i].done) << "[DONE] before the end";

    const json & first = events.front().data;
    EXPECT_EQ(first["object"], "chat.completion.chunk");
    EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
    std::string id = first["id"];

    int n_finish = 0;
    json usage;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        const json & d = events[i].data;
        EXPECT_EQ(d["id"], id);
        EXPECT_EQ(d["object"], "chat.completion.chunk");
        ASSERT_TRUE(d.contains("usage")) << d;  // null until the usage chunk
        if (!d["usage"].is_null()) {
            EXPECT_EQ(i + 2, events.size()) << "the usage chunk is the last before [DONE]";
            EXPECT_TRUE(d["choices"].empty());
            usage = d["usage"];
            continue;
        }
        if (!d["choices"][0]["finish_reason"].is_null()) ++n_finish;
    }
    EXPECT_EQ(n_finish, 1);
    ASSERT_TRUE(usage.is_object());
    EXPECT_GT(usage["prompt_tokens"].get<int>(), 0);
    EXPECT_GE(usage["completion_tokens"].get<int>(), 1);
    EXPECT_LE(usage["completion_tokens"].get<int>(), 6);
    EXPECT_TRUE(usage["prompt_tokens_details"].contains("cached_tokens"));
}

TEST_F(server_test, text_completions) {
    auto r = post_json("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 3}, {"temperature", 0}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_TRUE(j["choices"][0]["text"].is_string());
    EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 3);

    auto s = post_json("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 3}, {"stream", true}});
    ASSERT_TRUE(s);
    ASSERT_EQ(s->status, 200) << s->body;
    auto events = parse_sse(s->body);
    ASSERT_GE(events.size(), 2u);
    EXPECT_TRUE(events.back().done);
    EXPECT_EQ(events.front().data["object"], "text_completion");
}

// ---- reuse -----------------------------------------------------------------------

TEST_F(server_test, cached_tokens_rise_on_second_turn) {
    std::string system = "You are a coding agent working in the repository warmctx.";
    for (int i = 0; i < 40; ++i) system += " Rule " + std::to_string(i) + ": keep changes small and tested.";
    json tools =
        json::array({{{"type", "function"},
                      {"function",
                       {{"name", "read_file"},
                        {"description", "Read a file of the repository"},
                        {"parameters", {{"type", "object"}, {"properties", {{"path", {{"type", "string"}}}}}}}}}}});
    json turn1 = {{"messages", json::array({{{"role", "system"}, {"content", system}},
                                            {{"role", "user"}, {"content", "List the files."}}})},
                  {"tools", tools},
                  {"max_tokens", 4},
                  {"temperature", 0}};
    auto r1 = post_json("/v1/chat/completions", turn1);
    ASSERT_TRUE(r1);
    ASSERT_EQ(r1->status, 200) << r1->body;
    json j1 = json::parse(r1->body);
    const int stable_tokens = j1["warmctx"]["tokens_cacheable"];  // system + tools
    ASSERT_GT(stable_tokens, 0);

    json turn2 = turn1;
    turn2["messages"].push_back({{"role", "assistant"}, {"content", j1["choices"][0]["message"]["content"]}});
    turn2["messages"].push_back({{"role", "user"}, {"content", "Now read README.md."}});
    auto r2 = post_json("/v1/chat/completions", turn2);
    ASSERT_TRUE(r2);
    ASSERT_EQ(r2->status, 200) << r2->body;
    json j2 = json::parse(r2->body);
    EXPECT_EQ(j2["warmctx"]["workspace"], j1["warmctx"]["workspace"]);
    const int cached2 = j2["usage"]["prompt_tokens_details"]["cached_tokens"];
    EXPECT_GT(cached2, 0) << j2["warmctx"];
    EXPECT_GE(cached2, stable_tokens) << j2["warmctx"];
    EXPECT_GT(j2["usage"]["prompt_tokens"].get<int>(), j1["usage"]["prompt_tokens"].get<int>());
    // The first turn has no previous one; the second shares the first's prompt up to
    // where the first's question ends, past the stable part.
    EXPECT_EQ(j1["warmctx"]["tokens_common_with_previous_turn"], -1);
    const int common2 = j2["warmctx"]["tokens_common_with_previous_turn"];
    EXPECT_GT(common2, stable_tokens) << j2["warmctx"];
    EXPECT_LE(common2, j1["usage"]["prompt_tokens"].get<int>()) << j2["warmctx"];
    // Where the time to the first token went: the cold turn copied nothing, the warm one
    // copied the cached prefix. Assembling (and waiting for the answer's grammar) lies
    // within request_ms, on the HTTP thread before the scheduler has the request;
    // restoring, copying and prefilling lie within first_token_ms, which counts from there.
    for (const json * j : {&j1, &j2}) {
        const json & w = (*j)["warmctx"];
        const json & t = w["timings"];
        ASSERT_TRUE(t.is_object()) << w;
        double engine = 0, http = 0;
        for (const char * k : {"assemble_ms", "answer_wait_ms", "restore_ms", "copy_ms", "prefill_ms"}) {
            ASSERT_TRUE(t.contains(k) && t[k].is_number()) << k << " " << t;
            EXPECT_GE(t[k].get<double>(), 0.0) << k;
            (std::string_view(k) == "assemble_ms" || std::string_view(k) == "answer_wait_ms" ? http : engine) +=
                t[k].get<double>();
        }
        EXPECT_GT(t["prefill_ms"].get<double>(), 0.0) << t;
        EXPECT_GT(t["assemble_ms"].get<double>(), 0.0) << t;
        EXPECT_LE(engine, w["first_token_ms"].get<double>() + 0.001) << w;
        ASSERT_TRUE(w.contains("request_ms") && w["request_ms"].is_number()) << w;
        EXPECT_LE(http, w["request_ms"].get<double>() + w["first_token_ms"].get<double>() + 0.001) << w;
        EXPECT_GE(w["request_ms"].get<double>(), t["answer_wait_ms"].get<double>()) << w;
    }
    EXPECT_EQ(j1["warmctx"]["timings"]["copy_ms"].get<double>(), 0.0);
    EXPECT_GT(j2["warmctx"]["timings"]["copy_ms"].get<double>(), 0.0);
    // And after it: the answer's decode, its time and rate (llama-server's timings have them).
    for (const json * j : {&j1, &j2}) {
        const json & w = (*j)["warmctx"];
        ASSERT_TRUE(w.contains("decode_ms") && w.contains("decode_tokens_per_second")) << w;
        EXPECT_NEAR(w["decode_ms"].get<double>(), w["total_ms"].get<double>() - w["first_token_ms"].get<double>(),
                    1e-6);
        const int n = (*j)["usage"]["completion_tokens"].get<int>();
        if (n > 1 && w["decode_ms"].get<double>() > 0)
            EXPECT_NEAR(w["decode_tokens_per_second"].get<double>(), 1000.0 * (n - 1) / w["decode_ms"].get<double>(),
                        1e-6);
    }
}

// ---- concurrency -----------------------------------------------------------------

TEST_F(server_test, sixteen_parallel_clients) {
    constexpr int n = 16;
    std::vector<std::future<int>> results;
    for (int i = 0; i < n; ++i) {
        results.push_back(std::async(std::launch::async, [i] {
            json body = chat_body("Client " + std::to_string(i) + " asks a question.", 4);
            if (i % 2) body["stream"] = true;
            auto r = post_json("/v1/chat/completions", body);
            if (!r) return -100 - static_cast<int>(r.error());  // which transport error
            if (i % 2) {
                auto ev = parse_sse(r->body);
                if (ev.empty() || !ev.back().done) return -2;
            }
            return r->status;
        }));
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(results[i].get(), 200) << "client " << i;
}

TEST_F(server_test, client_disconnect_mid_stream_cancels_the_job) {
    const uint64_t cancelled_before = sched_->stats().n_cancelled;
    json body = chat_body("Write a very long story.", 1500);
    body["stream"] = true;
    body["temperature"] = 1.0;
    body["seed"] = 7;
    const std::string b = body.dump();
    raw_connection c(server_->port());
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c.send_all("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           "Content-Length: " +
                           std::to_string(b.size()) + "\r\n\r\n" + b));
    std::string got;
    ASSERT_TRUE(c.read_until("data: ", got)) << got;  // the stream has begun
    EXPECT_NE(got.find("200 OK"), std::string::npos) << got;
    c.close();

    EXPECT_TRUE(eventually([&] { return sched_->stats().n_cancelled > cancelled_before; }))
        << "the scheduler never saw the job cancelled";
    EXPECT_TRUE(eventually([&] { return sched_->stats().active_jobs == 0; }));
    expect_healthy();
}

// ---- auth ------------------------------------------------------------------------

TEST_F(server_test, auth_off_needs_no_header) {
    auto r = client()->Get("/v1/models");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
}

TEST_F(server_test, auth_on_needs_the_bearer_key) {
    server_options so;
    so.port = 0;
    so.api_key = "s3cret-key";
    so.log_requests = false;
    auto h = http_server::start(*sched_, so);
    ASSERT_TRUE(h.ok()) << h.error().to_string();
    const int port = (*h)->port();

    json e = expect_error(client(port)->Get("/v1/models"), 401);
    EXPECT_EQ(e["type"], "authentication_error");
    expect_error(client(port)->Get("/v1/models", httplib::Headers{{"Authorization", "Bearer wrong-key!"}}), 401);
    expect_error(client(port)->Get("/v1/models", httplib::Headers{{"Authorization", "Bearer s3cret-ke"}}), 401);
    expect_error(client(port)->Get("/metrics"), 401);
    expect_error(client(port)->Post("/v1/chat/completions", chat_body("hi").dump(), "application/json"), 401);

    auto ok = client(port)->Get("/v1/models", httplib::Headers{{"Authorization", "Bearer s3cret-key"}});
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
    auto chat = client(port)->Post("/v1/chat/completions", {{"Authorization", "Bearer s3cret-key"}},
                                   chat_body("hi", 2).dump(), "application/json");
    ASSERT_TRUE(chat);
    EXPECT_EQ(chat->status, 200) << chat->body;
    auto health = client(port)->Get("/health");  // never needs the key
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
    (*h)->stop();
}

// ---- bad input: each a 4xx with a clear message, nothing else affected ---------------

TEST_F(server_test, bad_input_malformed_json) {
    json e = expect_error(post("/v1/chat/completions", "{\"messages\": [}"), 400);
    EXPECT_EQ(e["code"], "invalid_json");
    expect_error(post("/v1/chat/completions", ""), 400);
    // Deep nesting is refused before anything recurses over it.
    std::string deep = R"({"messages": [{"role": "user", "content": "hi"}], "tools": )" + std::string(100000, '[') +
                       std::string(100000, ']') + "}";
    expect_error(post("/v1/chat/completions", deep), 400);
    expect_healthy();
}

TEST_F(server_test, bad_input_wrong_types) {
    json body = chat_body("hi");
    body["temperature"] = "hot";
    json e = expect_error(post_json("/v1/chat/completions", body), 400);
    EXPECT_EQ(e["param"], "temperature");
    EXPECT_EQ(e["code"], "invalid_type");

    json b2 = {{"messages", "hello"}};
    EXPECT_EQ(expect_error(post_json("/v1/chat/completions", b2), 400)["param"], "messages");
    json b3 = {{"messages", json::array({{{"role", "user"}, {"content", 42}}})}};
    EXPECT_EQ(expect_error(post_json("/v1/chat/completions", b3), 400)["param"], "messages[0].content");
    expect_error(post("/v1/chat/completions", "[1, 2, 3]"), 400);
    json b4 = chat_body("hi");
    b4["stop"] = json::array({1, 2});
    EXPECT_EQ(expect_error(post_json("/v1/chat/completions", b4), 400)["param"], "stop[0]");
    expect_healthy();
}

TEST_F(server_test, bad_input_missing_messages) {
    json e = expect_error(post_json("/v1/chat/completions", {{"model", "tiny"}, {"max_tokens", 4}}), 400);
    EXPECT_EQ(e["param"], "messages");
    EXPECT_NE(e["message"].get<std::string>().find("messages"), std::string::npos);
    expect_error(post_json("/v1/completions", {{"max_tokens", 4}}), 400);
    expect_healthy();
}

TEST_F(server_test, bad_input_unknown_role) {
    json body = {{"messages", json::array({{{"role", "wizard"}, {"content", "abracadabra"}},
                                           {{"role", "user"}, {"content", "hi"}}})}};
    json e = expect_error(post_json("/v1/chat/completions", body), 400);
    EXPECT_EQ(e["code"], "unknown_role");
    EXPECT_EQ(e["param"], "messages[0].role");
    EXPECT_NE(e["message"].get<std::string>().find("wizard"), std::string::npos);
    expect_healthy();
}

TEST_F(server_test, bad_input_oversized_body) {
    json body = chat_body(std::string(300 * 1024, 'a'));  // the fixture's limit is 256 KiB
    json e = expect_error(post_json("/v1/chat/completions", body), 413);
    EXPECT_EQ(e["code"], "payload_too_large");
    expect_healthy();
}

TEST_F(server_test, bad_input_prompt_longer_than_the_context) {
    std::string text;
    for (int i = 0; i < 2500; ++i) text += "w" + std::to_string(i) + " ";  // far more than 2048 tokens
    json e = expect_error(post_json("/v1/chat/completions", chat_body(text, 4)), 400);
    EXPECT_EQ(e["code"], "out_of_range") << e;
    json streamed = chat_body(text, 4);
    streamed["stream"] = true;  // decided before the stream starts: still a plain 400
    expect_error(post_json("/v1/chat/completions", streamed), 400);
    expect_healthy();
}

TEST_F(server_test, bad_input_invalid_utf8) {
    std::string body = "{\"messages\": [{\"role\": \"user\", \"content\": \"caf\xC3\x28 \xFF\"}], \"max_tokens\": 2}";
    json e = expect_error(post("/v1/chat/completions", body), 400);
    EXPECT_EQ(e["code"], "invalid_utf8");
    // A lone surrogate escape is not UTF-8 either.
    expect_error(post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "\ud800"}]})"), 400);
    expect_healthy();
}

TEST_F(server_test, bad_input_negative_max_tokens) {
    json body = chat_body("hi");
    body["max_tokens"] = -5;
    json e = expect_error(post_json("/v1/chat/completions", body), 400);
    EXPECT_EQ(e["param"], "max_tokens");
    body["max_tokens"] = 0;
    expect_error(post_json("/v1/chat/completions", body), 400);
    expect_healthy();
}

TEST_F(server_test, bad_input_huge_max_tokens) {
    json body = chat_body("hi");
    body["max_tokens"] = 1000000000;
    json e = expect_error(post_json("/v1/chat/completions", body), 400);
    EXPECT_EQ(e["param"], "max_tokens");
    body.erase("max_tokens");
    body["max_completion_tokens"] = 18446744073709551615ull;
    EXPECT_EQ(expect_error(post_json("/v1/chat/completions", body), 400)["param"], "max_completion_tokens");
    expect_healthy();
}

TEST_F(server_test, bad_input_bad_workspace_ids) {
    json body = chat_body("hi");
    body["workspace"] = "../etc";
    json e = expect_error(post_json("/v1/chat/completions", body), 400);
    EXPECT_EQ(e["code"], "invalid_workspace");
    body["workspace"] = std::string(65, 'w');
    expect_error(post_json("/v1/chat/completions", body), 400);
    expect_error(client()->Get("/v1/workspaces/.hidden/segments"), 400);
    expect_error(client()->Get("/v1/workspaces/a%20b/manifest"), 400);
    expect_error(client()->Put("/v1/workspaces/ok/segments/a..b/../c", R"({"kind":"system","content":"x"})",
                               "application/json"),
                 400);
    expect_error(client()->Put("/v1/workspaces/ok/segments/%2Fabs", R"({"kind":"system","content":"x"})",
                               "application/json"),
                 400);
    expect_healthy();
}

TEST_F(server_test, bad_input_unknown_route_and_wrong_method) {
    json e = expect_error(client()->Get("/v1/nothing-here"), 404);
    EXPECT_EQ(e["code"], "unknown_route");
    auto r = client()->Get("/v1/chat/completions");
    json e2 = expect_error(r, 405);
    EXPECT_EQ(e2["code"], "method_not_allowed");
    EXPECT_EQ(r->get_header_value("Allow"), "POST");
    expect_error(client()->Delete("/v1/models"), 405);
    expect_healthy();
}

TEST_F(server_test, bad_input_segments_extension) {
    json body = chat_body("hi");
    body["segments"] = json::array({{{"id", "map"}, {"kind", "repo_map"}}});  // no content
    EXPECT_EQ(expect_error(post_json("/v1/chat/completions", body), 400)["param"], "segments[0].content");
    body["segments"] = json::array({{{"id", "map"}, {"kind", "galaxy"}, {"content", "x"}}});
    EXPECT_EQ(expect_error(post_json("/v1/chat/completions", body), 400)["param"], "segments[0].kind");
    body["segments"] = json::array({{{"id", "user"}, {"kind", "user"}, {"content", "second question"}}});
    expect_error(post_json("/v1/chat/completions", body), 400);  // two user segments
    expect_healthy();
}

// ---- segments extension and workspace API -----------------------------------------

TEST_F(server_test, segments_extension_and_named_workspace) {
    json body = chat_body("What does the map say?", 3);
    body["workspace"] = "ext-ws";
    body["segments"] = json::array({{{"id", "map"}, {"kind", "repo_map"}, {"content", "src/ main.cpp util.cpp"}},
                                    {{"id", "d1"}, {"kind", "diff"}, {"content", "+int x = 1;"}, {"path", "a.cpp"}}});
    auto r = post_json("/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["warmctx"]["workspace"], "ext-ws");
}

TEST_F(server_test, workspace_api_round_trip) {
    const std::string base = "/v1/workspaces/proj-1";
    std::string rules = "Repository rules:";
    for (int i = 0; i < 30; ++i) rules += " rule " + std::to_string(i) + " says test everything.";
    auto put = [&](const std::string & id, const json & body) {
        return client()->Put((base + "/segments/" + id).c_str(), body.dump(), "application/json");
    };
    auto p1 = put("sys", {{"kind", "system"}, {"content", "You are a coding agent."}});
    ASSERT_TRUE(p1);
    EXPECT_EQ(p1->status, 201) << p1->body;
    auto p2 = put("rules", {{"kind", "instructions"}, {"content", rules}});
    ASSERT_TRUE(p2);
    EXPECT_EQ(p2->status, 201) << p2->body;
    auto p3 = put("src/map.txt", {{"kind", "repo_map"}, {"content", "src/a.cc\nsrc/b.cc"}, {"path", "src/map.txt"}});
    ASSERT_TRUE(p3);
    EXPECT_EQ(p3->status, 201) << p3->body;
    auto p4 = put("sys", {{"kind", "system"}, {"content", "You are a careful coding agent."}});  // replace
    ASSERT_TRUE(p4);
    EXPECT_EQ(p4->status, 200) << p4->body;
    EXPECT_FALSE(json::parse(p4->body)["created"].get<bool>());
    expect_error(put("q", {{"kind", "user"}, {"content", "no"}}), 400);
    expect_error(put("x", {{"kind", "system"}}), 400);

    auto g = client()->Get((base + "/segments/sys").c_str());
    ASSERT_TRUE(g);
    ASSERT_EQ(g->status, 200);
    EXPECT_EQ(json::parse(g->body)["content"], "You are a careful coding agent.");
    auto gs = client()->Get((base + "/segments/src/map.txt").c_str());
    ASSERT_TRUE(gs);
    ASSERT_EQ(gs->status, 200) << gs->body;
    EXPECT_EQ(json::parse(gs->body)["path"], "src/map.txt");

    auto list = client()->Get((base + "/segments").c_str());
    ASSERT_TRUE(list);
    ASSERT_EQ(list->status, 200);
    EXPECT_EQ(json::parse(list->body)["data"].size(), 3u);

    auto manifest_res = client()->Get((base + "/manifest").c_str());
    ASSERT_TRUE(manifest_res);
    ASSERT_EQ(manifest_res->status, 200) << manifest_res->body;
    json mj = json::parse(manifest_res->body);
    ASSERT_EQ(mj["segments"].size(), 3u);
    EXPECT_EQ(mj["segments"][0]["id"], "sys");  // canonical order: system, instructions, repo_map
    EXPECT_EQ(mj["segments"][1]["id"], "rules");
    EXPECT_EQ(mj["segments"][2]["id"], "src/map.txt");
    EXPECT_GT(mj["n_tokens"].get<int>(), 0);

    auto ex = client()->Get((base + "/explain?question=What%20changed%3F").c_str());
    ASSERT_TRUE(ex);
    ASSERT_EQ(ex->status, 200) << ex->body;
    json exj = json::parse(ex->body);
    EXPECT_GT(exj["prompt_tokens"].get<int>(), mj["n_tokens"].get<int>());

    // Chat against the workspace, sending only the tail.
    auto chat = [&](const std::string & q) {
        json body = {
            {"messages", json::array({{{"role", "user"}, {"content", q}}})}, {"max_tokens", 3}, {"temperature", 0}};
        return client()->Post((base + "/chat/completions").c_str(), body.dump(), "application/json");
    };
    auto c1 = chat("First question?");
    ASSERT_TRUE(c1);
    ASSERT_EQ(c1->status, 200) << c1->body;
    json c1j = json::parse(c1->body);
    EXPECT_EQ(c1j["warmctx"]["workspace"], "proj-1");
    auto c2 = chat("Second question?");
    ASSERT_TRUE(c2);
    ASSERT_EQ(c2->status, 200) << c2->body;
    json c2j = json::parse(c2->body);
    EXPECT_GE(c2j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), mj["n_tokens"].get<int>())
        << c2j["warmctx"];

    // Tail segments in the body work too (and override stored ids for this request).
    json seg_body = {{"segments", json::array({{{"id", "t1"}, {"kind", "test_output"}, {"content", "1 failed"}},
                                               {{"id", "q"}, {"kind", "user"}, {"content", "Why?"}}})},
                     {"max_tokens", 2}};
    auto c3 = client()->Post((base + "/chat/completions").c_str(), seg_body.dump(), "application/json");
    ASSERT_TRUE(c3);
    EXPECT_EQ(c3->status, 200) << c3->body;

    auto pin = client()->Post((base + "/pin").c_str());
    ASSERT_TRUE(pin);
    EXPECT_EQ(pin->status, 200) << pin->body;
    auto unpin = client()->Post((base + "/unpin").c_str());
    ASSERT_TRUE(unpin);
    EXPECT_EQ(unpin->status, 200) << unpin->body;

    auto del = client()->Delete((base + "/segments/rules").c_str());
    ASSERT_TRUE(del);
    EXPECT_EQ(del->status, 200);
    expect_error(client()->Get((base + "/segments/rules").c_str()), 404);
    expect_error(client()->Delete((base + "/segments/rules").c_str()), 404);

    auto wsl = client()->Get("/v1/workspaces");
    ASSERT_TRUE(wsl);
    EXPECT_NE(wsl->body.find("proj-1"), std::string::npos);

    auto drop = client()->Delete(base.c_str());
    ASSERT_TRUE(drop);
    EXPECT_EQ(drop->status, 200);
    expect_error(client()->Get((base + "/segments").c_str()), 404);
    expect_error(chat("After the drop?"), 404);
}

// ---- observability ----------------------------------------------------------------

double metric_value(const std::string & text, const std::string & series) {
    size_t p = text.find("\n" + series + " ");
    if (p == std::string::npos) return -1;
    return std::stod(text.substr(p + series.size() + 2));
}

TEST_F(server_test, metrics_names_and_request_counts) {
    const std::string series = "warmctx_requests_total{route=\"/v1/chat/completions\",status=\"200\"}";
    ASSERT_EQ(post_json("/v1/chat/completions", chat_body("count me", 2))->status, 200);
    auto m1 = client()->Get("/metrics");
    ASSERT_TRUE(m1);
    ASSERT_EQ(m1->status, 200);
    EXPECT_NE(m1->get_header_value("Content-Type").find("text/plain"), std::string::npos);
    for (const char * name :
         {"warmctx_requests_total", "warmctx_prompt_tokens_total", "warmctx_cached_tokens_total",
          "warmctx_prefilled_tokens_total", "warmctx_generated_tokens_total", "warmctx_ttft_seconds_bucket",
          "warmctx_request_duration_seconds_bucket", "warmctx_request_duration_seconds_count",
          "warmctx_cache_bytes{tier=\"engine\"}", "warmctx_cache_tokens{tier=\"engine\"}",
          "warmctx_cache_entries{tier=\"engine\"}", "warmctx_evictions_total{class=\"low\"}", "warmctx_queue_depth",
          "warmctx_active_sequences", "warmctx_jobs_cancelled_total", "# TYPE warmctx_ttft_seconds histogram"})
        EXPECT_NE(m1->body.find(name), std::string::npos) << name;
    const double before = metric_value(m1->body, series);
    ASSERT_GE(before, 1);
    EXPECT_GE(metric_value(m1->body, "warmctx_generated_tokens_total"), 1);
    EXPECT_EQ(metric_value(m1->body, "warmctx_engine_reachable"), 1);

    ASSERT_EQ(post_json("/v1/chat/completions", chat_body("count me too", 2))->status, 200);
    expect_error(client()->Get("/v1/nothing"), 404);
    auto m2 = client()->Get("/metrics");
    ASSERT_TRUE(m2);
    EXPECT_EQ(metric_value(m2->body, series), before + 1);
    EXPECT_GE(metric_value(m2->body, "warmctx_requests_total{route=\"unmatched\",status=\"404\"}"), 1);
}

TEST_F(server_test, one_log_line_per_request) {
    server_options so;
    so.port = 0;
    so.log_requests = true;
    auto h = http_server::start(*sched_, so);
    ASSERT_TRUE(h.ok());
    ::testing::internal::CaptureStderr();
    json body = chat_body("log me", 2);
    body["workspace"] = "logged-ws";
    auto r = client((*h)->port())->Post("/v1/chat/completions", body.dump(), "application/json");
    (*h)->stop();
    std::string err = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    json line;
    size_t begin = 0;
    while (begin < err.size()) {
        size_t end = err.find('\n', begin);
        if (end == std::string::npos) end = err.size();
        json j = json::parse(err.substr(begin, end - begin), nullptr, false);
        if (j.is_object() && j.value("route", "") == "/v1/chat/completions") line = j;
        begin = end + 1;
    }
    ASSERT_TRUE(line.is_object()) << err;
    EXPECT_EQ(line["route"], "/v1/chat/completions");
    EXPECT_EQ(line["status"], 200);
    EXPECT_EQ(line["workspace"], "logged-ws");
    for (const char * f : {"ts", "prompt_tokens", "tokens_reused", "tokens_prefilled", "completion_tokens", "ttft_ms",
                           "duration_ms"})
        EXPECT_TRUE(line.contains(f)) << f;
    EXPECT_GT(line["prompt_tokens"].get<int>(), 0);
}

// ---- back-pressure ----------------------------------------------------------------

TEST(server_queue_test, full_queue_answers_429_with_retry_after) {
    constexpr size_t max_queue = 2;
    auto s = scheduler::start(tiny_scheduler_options(1, max_queue));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    scheduler & sched = **s;
    server_options so;
    so.port = 0;
    so.max_queue = max_queue;
    so.log_requests = false;
    auto h = http_server::start(sched, so);
    ASSERT_TRUE(h.ok());
    const int port = (*h)->port();
    auto post_chat = [port](int i) {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(120, 0);
        auto r = c.Post("/v1/chat/completions", chat_body("queued " + std::to_string(i), 2).dump(), "application/json");
        return r ? std::make_pair(r->status, r->get_header_value("Retry-After")) : std::make_pair(-1, std::string());
    };

    // Hold the engine thread so that nothing leaves the queue: the queue's depth is
    // then exactly what was submitted, and the next submissions must be refused.
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    std::promise<void> holding;
    auto holder = std::async(std::launch::async, [&] {
        return sched.call([&](context_engine &) {
            holding.set_value();
            released.wait();
        });
    });
    holding.get_future().wait();

    std::vector<std::future<std::pair<int, std::string>>> queued;
    for (size_t i = 0; i < max_queue; ++i)
        queued.push_back(std::async(std::launch::async, post_chat, static_cast<int>(i)));
    ASSERT_TRUE(eventually([&] { return sched.stats().queue_depth == max_queue; })) << sched.stats().queue_depth;

    std::vector<std::future<std::pair<int, std::string>>> refused;
    for (int i = 0; i < 4; ++i) refused.push_back(std::async(std::launch::async, post_chat, 100 + i));
    int n_429 = 0;
    for (auto & f : refused) {
        auto [code, retry_after] = f.get();
        EXPECT_EQ(code, 429);
        if (code == 429) {
            ++n_429;
            EXPECT_EQ(retry_after, "1");
        }
    }
    EXPECT_GE(n_429, 1);
    EXPECT_GE(sched.stats().n_rejected, 4u);

    release.set_value();
    EXPECT_TRUE(holder.get().ok());
    for (auto & f : queued) EXPECT_EQ(f.get().first, 200);
    (*h)->stop();
    sched.stop();
}

TEST(server_stop_test, stop_answers_waiting_requests_and_health_goes_away) {
    auto s = scheduler::start(tiny_scheduler_options(1, 4));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    scheduler & sched = **s;
    server_options so;
    so.port = 0;
    so.log_requests = false;
    auto h = http_server::start(sched, so);
    ASSERT_TRUE(h.ok());
    const int port = (*h)->port();

    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    std::promise<void> holding;
    auto holder = std::async(std::launch::async, [&] {
        return sched.call([&](context_engine &) {
            holding.set_value();
            released.wait();
        });
    });
    holding.get_future().wait();
    auto waiting = std::async(std::launch::async, [port] {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(120, 0);
        auto r = c.Post("/v1/chat/completions", chat_body("wait", 2).dump(), "application/json");
        return r ? r->status : -1;
    });
    ASSERT_TRUE(eventually([&] { return sched.stats().queue_depth == 1; }));
    (*h)->stop();  // the waiting request is answered 503, its job cancelled
    EXPECT_EQ(waiting.get(), 503);
    httplib::Client c("127.0.0.1", port);
    EXPECT_FALSE(c.Get("/health"));  // nothing listens any more
    release.set_value();
    EXPECT_TRUE(holder.get().ok());
    sched.stop();
}

}  // namespace
}  // namespace warmctx

namespace warmctx {
namespace {

TEST(server_tier_test, snapshot_suspend_resume_branch_over_http) {
    char templ[] = "/tmp/warmctx-srv-XXXXXX";
    const std::string dir = mkdtemp(templ);
    auto o = tiny_scheduler_options(2);
    o.engine.tiers.cache_dir = dir;
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    server_options so;
    so.port = 0;
    so.log_requests = false;
    auto h = http_server::start(**s, so);
    ASSERT_TRUE(h.ok());
    httplib::Client c("127.0.0.1", (*h)->port());
    c.set_read_timeout(120, 0);
    std::string rules = "Repository rules:";
    for (int i = 0; i < 40; ++i) rules += " rule " + std::to_string(i) + " says test everything.";
    ASSERT_EQ(c.Put("/v1/workspaces/w1/segments/rules", json({{"kind", "instructions"}, {"content", rules}}).dump(),
                    "application/json")->status, 201);
    auto chat = [&](const std::string & ws, const std::string & q) {
        json body = {{"messages", json::array({json{{"role", "user"}, {"content", q}}})}, {"max_tokens", 2}};
        auto r = c.Post(("/v1/workspaces/" + ws + "/chat/completions").c_str(), body.dump(), "application/json");
        EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
        return r ? json::parse(r->body, nullptr, false) : json();
    };
    chat("w1", "first");
    auto post = [&](const std::string & path, const std::string & body = "{}") {
        auto r = c.Post(path.c_str(), body, "application/json");
        return r ? r->status : -1;
    };
    EXPECT_EQ(post("/v1/workspaces/w1/snapshot"), 200);
    EXPECT_EQ(post("/v1/workspaces/w1/suspend"), 200);
    // Suspended: the next turn is served from disk.
    auto ex = c.Get("/v1/workspaces/w1/explain?question=hi");
    ASSERT_TRUE(ex && ex->status == 200);
    EXPECT_EQ(json::parse(ex->body)["tier"], "disk") << ex->body;
    EXPECT_EQ(post("/v1/workspaces/w1/resume"), 200);
    ex = c.Get("/v1/workspaces/w1/explain?question=hi");
    EXPECT_EQ(json::parse(ex->body)["tier"], "engine") << ex->body;
    EXPECT_EQ(post("/v1/workspaces/w1/branch", R"({"to": "w2"})"), 200);
    auto b = chat("w2", "in the branch");
    EXPECT_GT(b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << b.dump();
    EXPECT_EQ(b["warmctx"]["tier"], "engine") << b.dump();  // usage says which tier served it
    EXPECT_EQ(post("/v1/workspaces/w1/branch", R"({"to": "../x"})"), 400);
    EXPECT_EQ(post("/v1/workspaces/nope/suspend"), 404);
    (*h)->stop();
    (*s)->stop();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace warmctx
