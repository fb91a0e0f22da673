// The completion routes' handlers on the tiny model, without a socket: a request
// struct in, a response struct (or a stream driven through a chunk_sink) out.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/sse_reader.h"
#include "server/router.h"
#include "warmctx/scheduler.h"

namespace warmctx::server_detail {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

scheduler_options tiny_options() {
    scheduler_options o;
    o.engine.engine.model_path = WARMCTX_TINY_MODEL;
    o.engine.engine.n_ctx = 2048;
    o.engine.engine.chunk_tokens = 64;
    o.engine.engine.n_threads = 1;
    o.engine.n_holders = 4;
    o.n_parallel = 2;
    o.max_queue = 8;
    return o;
}

// Collects what a stream writes; `fail_after` writes succeed, then the client is gone.
class string_sink final : public chunk_sink {
  public:
    explicit string_sink(size_t fail_after = SIZE_MAX) : fail_after_(fail_after) {}
    bool write(std::string_view d) override {
        if (n_writes_++ >= fail_after_) return false;
        text.append(d);
        return true;
    }
    void done() override { is_done = true; }
    std::string text;
    bool is_done = false;

  private:
    size_t fail_after_;
    size_t n_writes_ = 0;
};

// Runs a streamed response as the transport does: steps until done or abandoned, then
// its end, once.
bool drive(http_response & res, string_sink & sink) {
    bool completed = false;
    for (int i = 0; i < 10000; ++i) {
        if (!res.stream(sink)) break;
        if (sink.is_done) {
            completed = true;
            break;
        }
    }
    res.stream_end();
    return completed;
}

class routes_model_test : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        auto s = scheduler::start(tiny_options());
        ASSERT_TRUE(s.ok()) << s.error().to_string();
        sched_ = std::move(*s);
    }
    static void TearDownTestSuite() {
        if (sched_) sched_->stop();
        sched_.reset();
    }
    void SetUp() override {
        ASSERT_TRUE(sched_);
        server_options o;
        o.log_requests = false;
        ctx_ = std::make_unique<route_context>(sched_.get(), o);
        router_ = std::make_unique<router>(*ctx_);
    }
    http_response post(const std::string & path, const json & body) {
        http_request r;
        r.method = "POST";
        r.path = path;
        r.body = body.dump();
        return router_->handle(r);
    }
    static json chat(const std::string & q, bool stream) {
        return {{"messages", json::array({{{"role", "system"}, {"content", "Be terse."}}, {{"role", "user"}, {"content", q}}})},
                {"max_tokens", 4},
                {"temperature", 0},
                {"stream", stream},
                {"stream_options", {{"include_usage", true}}}};
    }
    std::string metrics() const { return ctx_->metrics.render(engine_snapshot{}); }
    // Streams `body`, leaves after the role chunk and one more, and waits until the
    // scheduler has cancelled the job (its count past `cancelled_before`).
    void leave_mid_stream(const json & body, uint64_t cancelled_before) {
        http_response res = post("/v1/chat/completions", body);
        ASSERT_EQ(res.status, 200) << res.body;
        string_sink sink(2);
        EXPECT_FALSE(drive(res, sink));
        auto deadline = std::chrono::steady_clock::now() + 30s;
        while (sched_->stats().n_cancelled == cancelled_before && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(5ms);
    }

    static std::unique_ptr<scheduler> sched_;
    std::unique_ptr<route_context> ctx_;
    std::unique_ptr<router> router_;
};

std::unique_ptr<scheduler> routes_model_test::sched_;

// Holds the engine thread for `d` (a call that sleeps), as a long prefill chunk would;
// the constructor returns once the engine thread is held.
class engine_held {
  public:
    engine_held(scheduler & s, std::chrono::milliseconds d)
        : t_([this, &s, d] {
              (void)s.call([this, d](context_engine &) {
                  entered_ = true;
                  std::this_thread::sleep_for(d);
              });
          }) {
        while (!entered_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    void join() { if (t_.joinable()) t_.join(); }
    ~engine_held() { join(); }

  private:
    std::atomic<bool> entered_{false};
    std::thread t_;
};

// /metrics reads what the engine thread published: it answers at once while the engine
// thread is busy (here: a call that holds it for 3 s, as a long prefill chunk would).
TEST_F(routes_model_test, metrics_never_wait_on_the_engine_thread) {
    engine_held busy(*sched_, 3s);
    http_request r;
    r.method = "GET";
    r.path = "/metrics";
    const auto t0 = std::chrono::steady_clock::now();
    http_response res = router_->handle(r);
    const auto waited = std::chrono::steady_clock::now() - t0;
    busy.join();
    EXPECT_EQ(res.status, 200);
    EXPECT_LT(waited, 1s);
    EXPECT_NE(res.body.find("warmctx_engine_reachable 1\n"), std::string::npos) << res.body.substr(0, 400);
    EXPECT_NE(res.body.find("warmctx_kv_allocated_bytes "), std::string::npos);
    // The allocated bytes by part add up to the total.
    auto value_of = [&](const std::string & line_start) {
        const size_t at = res.body.find("\n" + line_start);
        EXPECT_NE(at, std::string::npos) << line_start;
        return at == std::string::npos ? -1.0 : std::stod(res.body.substr(at + 1 + line_start.size()));
    };
    double parts = 0;
    for (const char * p : {"streams", "pool", "checkpoints", "scratch"})
        parts += value_of(std::string("warmctx_kv_allocated_bytes_by_part{part=\"") + p + "\"} ");
    const double total = value_of("warmctx_kv_allocated_bytes ");
    EXPECT_GT(total, 0);
    EXPECT_NEAR(parts, total, total * 1e-9);
}

// A streamed request that waits (here: the engine thread held for 1.5 s, as behind a
// long prefill chunk) gets its headers and first chunk after at most sse_keep_alive_ms,
// then an SSE comment that often until its tokens come.
TEST_F(routes_model_test, a_waiting_stream_gets_keep_alive_comments) {
    server_options o;
    o.log_requests = false;
    o.sse_keep_alive_ms = 300;
    route_context ctx(sched_.get(), o);
    router rt(ctx);
    engine_held busy(*sched_, 1500ms);
    http_request r;
    r.method = "POST";
    r.path = "/v1/chat/completions";
    r.body = chat("wait for me", true).dump();
    const auto t0 = std::chrono::steady_clock::now();
    http_response res = rt.handle(r);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1000ms);  // the handler did not wait it out
    string_sink sink;
    const bool completed = drive(res, sink);
    busy.join();
    EXPECT_TRUE(completed);
    const size_t role = sink.text.find("\"role\":\"assistant\"");
    const size_t comment = sink.text.find(": keep-alive\n\n");
    const size_t content = sink.text.find("\"finish_reason\":\"");
    ASSERT_NE(role, std::string::npos) << sink.text;
    ASSERT_NE(comment, std::string::npos) << sink.text;
    EXPECT_LT(role, comment);      // the first chunk went out before the wait
    EXPECT_LT(comment, content);   // comments while waiting
    EXPECT_NE(sink.text.find("data: [DONE]"), std::string::npos);
}

// A stream whose prompt is prefilling says how far it has got in its keep-alive comments
// (a chunk made slow here, as a chunk of a big model on a CPU is).
TEST(routes_progress, a_prefilling_stream_tells_its_progress_in_keep_alive_comments) {
    scheduler_options so = tiny_options();
    so.after_prefill_chunk = [](const turn_request &, pos_t pos) {
        if (pos == 128) std::this_thread::sleep_for(600ms);  // the second chunk of 64
    };
    auto sc = scheduler::start(so);
    ASSERT_TRUE(sc.ok());
    server_options o;
    o.log_requests = false;
    o.sse_keep_alive_ms = 100;
    route_context ctx(sc->get(), o);
    router rt(ctx);
    std::string q;
    while (q.size() < 3000) q += "tell me about the module number " + std::to_string(q.size()) + ". ";
    http_request r;
    r.method = "POST";
    r.path = "/v1/chat/completions";
    r.body = json({{"messages", json::array({{{"role", "user"}, {"content", q}}})}, {"max_tokens", 2}, {"stream", true}}).dump();
    http_response res = rt.handle(r);
    string_sink sink;
    EXPECT_TRUE(drive(res, sink));
    const std::string key = ": keep-alive prefill ";
    const size_t at = sink.text.find(key);
    ASSERT_NE(at, std::string::npos) << sink.text.substr(0, 400);
    EXPECT_LT(at, sink.text.find("\"finish_reason\":\""));
    // Each comment: tokens in the sequence so far, of the prompt's; while the second chunk
    // is held, the first one (64 tokens) is done.
    int most = -1;
    for (size_t p = at; p != std::string::npos; p = sink.text.find(key, p + 1)) {
        int k = 0, n = 0;
        ASSERT_EQ(std::sscanf(sink.text.c_str() + p + key.size(), "%d/%d", &k, &n), 2);
        EXPECT_GE(k, 0);
        EXPECT_LT(k, n);
        EXPECT_GT(n, 600);
        most = std::max(most, k);
    }
    EXPECT_GE(most, 64);
    (*sc)->stop();
}

// /v1/completions takes its prompt as given: no chat template around it (its prompt
// tokens are the text's own), a second prompt with the same beginning reuses its
// blocks, and a suffix needs the vocabulary's FIM tokens.
TEST_F(routes_model_test, completions_take_the_prompt_as_given) {
    std::string code;
    for (int i = 0; code.size() < 1200; ++i) code += "def f" + std::to_string(i) + "(x):\n    return x * " + std::to_string(i) + "\n";
    auto tokens_of = [&](const std::string & text) {
        size_t n = 0;
        EXPECT_TRUE(sched_->call([&](context_engine & ce) { n = ce.tokenize(text)->size(); }).ok());
        return n;
    };
    http_response a = post("/v1/completions", {{"prompt", code}, {"max_tokens", 2}, {"temperature", 0}});
    ASSERT_EQ(a.status, 200) << a.body;
    const json ja = json::parse(a.body);
    EXPECT_EQ(ja["object"], "text_completion");
    EXPECT_EQ(ja["usage"]["prompt_tokens"].get<size_t>(), tokens_of(code)) << "the text's own tokens, no template";
    http_response b = post("/v1/completions", {{"prompt", code + "def g(y):\n"}, {"max_tokens", 2}, {"temperature", 0}});
    ASSERT_EQ(b.status, 200) << b.body;
    EXPECT_GE(json::parse(b.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 64)
        << "the shared beginning is reused";
    // The tiny model's vocabulary (Qwen2's) has no fill-in-the-middle tokens: a suffix is
    // a 400 that says so (the FIM layout itself: Assembler.ARawPromptIsTheTextAsGivenAndCacheable).
    http_response f = post("/v1/completions", {{"prompt", "def add(a, b):\n"}, {"suffix", "\nprint(add(1, 2))\n"},
                                               {"max_tokens", 2}, {"temperature", 0}});
    EXPECT_EQ(f.status, 400) << f.body;
    EXPECT_NE(f.body.find("no fill-in-the-middle tokens"), std::string::npos) << f.body;
}

// llama-server's routes: /tokenize and /detokenize round-trip through the model's
// tokenizer, /apply-template is the prompt warmctx assembles for the messages, /completion
// answers what /v1/completions answers (greedy) in llama-server's shape, with its
// timings; /props and /slots describe the server.
TEST_F(routes_model_test, llama_server_routes_answer_in_its_shapes) {
    const std::string text = "<|im_start|>user\nhello world<|im_end|>";
    http_response t = post("/tokenize", {{"content", text}});
    ASSERT_EQ(t.status, 200) << t.body;
    const json ids = json::parse(t.body)["tokens"];
    size_t n_expected = 0;
    ASSERT_TRUE(sched_->call([&](context_engine & ce) { n_expected = ce.tokenize(text)->size(); }).ok());
    EXPECT_EQ(ids.size(), n_expected);
    EXPECT_LT(ids.size(), 12u) << "control tokens parsed as one token each";
    http_response d = post("/detokenize", {{"tokens", ids}});
    ASSERT_EQ(d.status, 200) << d.body;
    EXPECT_EQ(json::parse(d.body)["content"], text);
    http_response plain = post("/tokenize", {{"content", text}, {"parse_special", false}, {"with_pieces", true}});
    ASSERT_EQ(plain.status, 200) << plain.body;
    const json pieces = json::parse(plain.body)["tokens"];
    EXPECT_GT(pieces.size(), ids.size()) << "without parse_special the markup is text";
    std::string joined;
    for (const json & p : pieces) joined += p["piece"].get<std::string>();
    EXPECT_EQ(joined, text);
    // A character split over byte tokens: each piece its bytes, which join into it.
    http_response split = post("/tokenize", {{"content", "\xc2\x82"}, {"with_pieces", true}});
    ASSERT_EQ(split.status, 200) << split.body;
    std::string bytes;
    const json split_tokens = json::parse(split.body)["tokens"];
    for (const json & p : split_tokens) {
        if (p["piece"].is_string()) bytes += p["piece"].get<std::string>();
        else for (const json & b : p["piece"]) bytes.push_back((char)b.get<int>());
    }
    EXPECT_EQ(bytes, "\xc2\x82") << split.body;
    EXPECT_TRUE(split_tokens[0]["piece"].is_array()) << split.body;
    EXPECT_EQ(post("/detokenize", {{"tokens", json::array({-1})}}).status, 400);
    EXPECT_EQ(post("/tokenize", {{"content", 3}}).status, 400);

    const json messages = json::array({{{"role", "system"}, {"content", "Be terse."}}, {{"role", "user"}, {"content", "hi"}}});
    http_response a = post("/apply-template", {{"messages", messages}});
    ASSERT_EQ(a.status, 200) << a.body;
    const std::string prompt = json::parse(a.body)["prompt"];
    EXPECT_EQ(prompt, "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");

    std::string code;
    for (int i = 0; code.size() < 600; ++i) code += "def f" + std::to_string(i) + "(x):\n    return x + " + std::to_string(i) + "\n";
    http_response v1 = post("/v1/completions", {{"prompt", code}, {"max_tokens", 6}, {"temperature", 0}});
    ASSERT_EQ(v1.status, 200) << v1.body;
    http_response c = post("/completion", {{"prompt", code}, {"n_predict", 6}, {"temperature", 0}, {"cache_prompt", true}});
    ASSERT_EQ(c.status, 200) << c.body;
    const json jc = json::parse(c.body);
    EXPECT_EQ(jc["content"], json::parse(v1.body)["choices"][0]["text"]);
    EXPECT_EQ(jc["stop"], true);
    EXPECT_EQ(jc["tokens_predicted"], 6);
    EXPECT_EQ(jc["stop_type"], "limit");
    EXPECT_GT(jc["tokens_cached"].get<int>(), 0) << "the same prompt again";
    EXPECT_EQ(jc["timings"]["predicted_n"], 6);
    EXPECT_GE(jc["timings"]["predicted_ms"].get<double>(), 0.0);
    EXPECT_EQ(jc["timings"]["prompt_n"].get<int>() + jc["timings"]["cache_n"].get<int>(), jc["tokens_evaluated"].get<int>());
    EXPECT_TRUE(jc.contains("warmctx"));
    // Streamed: the pieces, then the whole object with stop true.
    http_response s = post("/completion", {{"prompt", code}, {"n_predict", 6}, {"temperature", 0}, {"stream", true}});
    ASSERT_EQ(s.status, 200) << s.body;
    string_sink sink;
    ASSERT_TRUE(drive(s, sink));
    std::string streamed;
    json last;
    for (size_t at = 0; (at = sink.text.find("data: ", at)) != std::string::npos;) {
        const size_t end = sink.text.find("\n\n", at);
        last = json::parse(sink.text.substr(at + 6, end - at - 6));
        if (!last["stop"].get<bool>()) streamed += last["content"].get<std::string>();
        at = end;
    }
    EXPECT_EQ(streamed, jc["content"].get<std::string>());
    EXPECT_EQ(last["stop"], true);
    EXPECT_EQ(last["tokens_predicted"], 6);
    // Refused, never ignored: token ids and grammars.
    EXPECT_EQ(post("/completion", {{"prompt", json::array({1, 2, 3})}}).status, 400);
    EXPECT_EQ(post("/completion", {{"prompt", "x"}, {"grammar", "root ::= \"a\""}}).status, 400);

    http_request g;
    g.method = "GET";
    g.path = "/props";
    http_response p = router_->handle(g);
    ASSERT_EQ(p.status, 200) << p.body;
    const json jp = json::parse(p.body);
    EXPECT_EQ(jp["total_slots"], 2);
    EXPECT_EQ(jp["default_generation_settings"]["n_ctx"], sched_->context().n_ctx_seq);
    EXPECT_FALSE(jp["chat_template"].get<std::string>().empty());
    // The last stream's answer is out before its job retires (the engine keeps its prefix
    // first): wait for that, then every slot is idle.
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    auto running = [&] {
        for (const job_progress & j : sched_->jobs())
            if (!j.prewarm && j.what != job_progress::state::queued) return true;
        return false;
    };
    while (running() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    g.path = "/slots";
    http_response sl = router_->handle(g);
    ASSERT_EQ(sl.status, 200) << sl.body;
    const json js = json::parse(sl.body);
    ASSERT_EQ(js.size(), 2u);
    EXPECT_EQ(js[0]["is_processing"], false) << js;
}

// A chat's messages reach the model as its template renders them (the tiny model's is
// Qwen2.5's ChatML): no header line before a system message's text, so the prompt is the
// tokens llama.cpp's own rendering gives - two system messages, an Anthropic-style
// attribution segment without a header.
TEST_F(routes_model_test, system_messages_reach_the_model_as_sent) {
    const std::string sys_a = "You are a careful coding agent.", sys_b = "Answer briefly.", user = "Why does parse fail?";
    http_response r = post("/v1/chat/completions", {{"messages", {{{"role", "system"}, {"content", sys_a}},
                                                                  {{"role", "system"}, {"content", sys_b}},
                                                                  {{"role", "user"}, {"content", user}}}},
                                                     {"max_tokens", 1},
                                                     {"temperature", 0}});
    ASSERT_EQ(r.status, 200) << r.body;
    const std::string chatml = "<|im_start|>system\n" + sys_a + "<|im_end|>\n<|im_start|>system\n" + sys_b +
                               "<|im_end|>\n<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
    size_t n = 0;
    ASSERT_TRUE(sched_->call([&](context_engine & ce) { n = ce.tokenize(chatml)->size(); }).ok());
    EXPECT_EQ(json::parse(r.body)["usage"]["prompt_tokens"].get<size_t>(), n) << r.body;
    // A body segment that asks for no header is its content alone, too.
    http_response h = post("/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", user}}}},
                            {"segments", {{{"id", "note"}, {"kind", "task_summary"}, {"content", sys_b}, {"header", false}}}},
                            {"max_tokens", 1},
                            {"temperature", 0}});
    ASSERT_EQ(h.status, 200) << h.body;
    const std::string with_note = "<|im_start|>system\n" + sys_b + "<|im_end|>\n<|im_start|>user\n" + user +
                                  "<|im_end|>\n<|im_start|>assistant\n";
    ASSERT_TRUE(sched_->call([&](context_engine & ce) { n = ce.tokenize(with_note)->size(); }).ok());
    EXPECT_EQ(json::parse(h.body)["usage"]["prompt_tokens"].get<size_t>(), n) << h.body;
}

// A request whose last message is the assistant's text continues it (a prefill, as
// llama-server does), on the chat route and the Messages route: the prompt is the
// conversation before it, the generation prompt and that text (control tokens in it stay
// text), and the answer is what the model adds - greedy, the tokens a raw completion of
// the same prompt gives.
// A chat sent again (an agent retrying its turn) is drafted from the answer before
// (serve's --draft-max, 64 by default): the same text, most of it decoded ahead;
// speculative.n_max 0 decodes it without drafts, the same.
TEST_F(routes_model_test, a_chat_sent_again_is_drafted_from_the_answer_before) {
    const json body = {{"messages", {{{"role", "system"}, {"content", "You write code."}},
                                     {{"role", "user"}, {"content", "Write the function again."}}}},
                       {"prompt_cache_key", "drafts-again"}, {"max_tokens", 40}, {"temperature", 0}};
    auto answer = [&](const json & b) {
        http_response r = post("/v1/chat/completions", b);
        EXPECT_EQ(r.status, 200) << r.body;
        return json::parse(r.body);
    };
    const json first = answer(body), again = answer(body);
    const std::string text = first["choices"][0]["message"]["content"].get<std::string>();
    EXPECT_EQ(again["choices"][0]["message"]["content"].get<std::string>(), text);
    const int n = again["usage"]["completion_tokens"].get<int>();
    ASSERT_GT(n, 8) << again.dump();
    const json d = again["warmctx"]["drafts"];
    // The first token comes after the prompt; then each step decodes a token and a draft
    // after it (the answer before matched wholly: as many as --draft-max allows, 64, at
    // once; the last one ends before the answer's last token), and samples the next from
    // the last.
    int steps = 0, accepted = 0;
    for (int g = 1, cap = 64; g < n;) {
        const int k = std::min(cap, n - g - 1);
        steps += k > 0;
        accepted += k;
        g += k + 1;
    }
    EXPECT_EQ(d["steps"].get<int>(), steps) << d.dump();
    EXPECT_EQ(d["accepted"].get<int>(), accepted) << d.dump();
    EXPECT_EQ(d["drafted"], d["accepted"]) << d.dump();
    json off_body = body;
    off_body["speculative.n_max"] = 0;
    const json off = answer(off_body);
    EXPECT_EQ(off["choices"][0]["message"]["content"].get<std::string>(), text);
    EXPECT_EQ(off["warmctx"]["drafts"]["drafted"], 0) << off.dump();
    EXPECT_GE(sched_->stats().drafts.n_accepted, d["accepted"].get<uint64_t>());
}

TEST_F(routes_model_test, a_last_assistant_message_is_continued) {
    const std::string sys = "Be brief.", user = "Name a prime.", start = "Sure, the first prime is";
    const std::string head = "<|im_start|>system\n" + sys + "<|im_end|>\n<|im_start|>user\n" + user +
                             "<|im_end|>\n<|im_start|>assistant\n";
    const std::string rendered = head + start;
    const json messages = {{{"role", "system"}, {"content", sys}},
                           {{"role", "user"}, {"content", user}},
                           {{"role", "assistant"}, {"content", start}}};
    http_response c = post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_EQ(c.status, 200) << c.body;
    size_t n = 0;
    ASSERT_TRUE(sched_->call([&](context_engine & ce) { n = ce.tokenize(rendered)->size(); }).ok());
    const json cj = json::parse(c.body);
    EXPECT_EQ(cj["usage"]["prompt_tokens"].get<size_t>(), n) << c.body;
    http_response raw = post("/v1/completions", {{"prompt", rendered}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_EQ(raw.status, 200) << raw.body;
    const std::string continued = json::parse(raw.body)["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(cj["choices"][0]["message"]["content"].get<std::string>(), continued);
    http_response a = post("/v1/messages", {{"model", "m"}, {"messages", messages}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(json::parse(a.body)["content"][0]["text"].get<std::string>(), continued) << a.body;
    // An assistant message with tool calls, or one before the last, is history as before.
    http_response h = post("/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", user}},
                                          {{"role", "assistant"}, {"content", start}},
                                          {{"role", "user"}, {"content", "Another."}}}},
                            {"max_tokens", 1},
                            {"temperature", 0}});
    ASSERT_EQ(h.status, 200) << h.body;
    // Control tokens in the continuation are text, not the template's own.
    http_response inj = post("/v1/chat/completions",
                             {{"messages", {{{"role", "system"}, {"content", sys}},
                                            {{"role", "user"}, {"content", user}},
                                            {{"role", "assistant"}, {"content", "<|im_end|>"}}}},
                              {"max_tokens", 1},
                              {"temperature", 0}});
    ASSERT_EQ(inj.status, 200) << inj.body;
    size_t plain = 0;
    ASSERT_TRUE(sched_->call([&](context_engine & ce) { plain = ce.tokenize(head)->size(); }).ok());
    // "<|im_end|>" read as text is several tokens; as the control token, one.
    EXPECT_GT(json::parse(inj.body)["usage"]["prompt_tokens"].get<size_t>(), plain + 1) << inj.body;
}

// logprobs: the chosen token's log-probability and the most likely alternatives, per
// generated token, in OpenAI's shapes (chat, streamed chat, completions). Greedy: the
// chosen token is the most likely one.
TEST_F(routes_model_test, logprobs_come_with_every_generated_token) {
    json body = {{"messages", json::array({{{"role", "user"}, {"content", "Count to ten."}}})},
                 {"max_tokens", 6}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 3}};
    http_response res = post("/v1/chat/completions", body);
    ASSERT_EQ(res.status, 200) << res.body;
    const json j = json::parse(res.body);
    const json & content = j["choices"][0]["logprobs"]["content"];
    ASSERT_TRUE(content.is_array()) << res.body.substr(0, 400);
    const int n = j["usage"]["completion_tokens"].get<int>();
    if (j["choices"][0]["finish_reason"] == "length") EXPECT_EQ((int)content.size(), n);
    ASSERT_FALSE(content.empty());
    std::string joined;
    for (const json & t : content) {
        ASSERT_EQ(t["top_logprobs"].size(), 3u);
        EXPECT_LE(t["logprob"].get<double>(), 0.0);
        EXPECT_EQ(t["logprob"], t["top_logprobs"][0]["logprob"]) << "greedy takes the most likely";
        EXPECT_EQ(t["token"], t["top_logprobs"][0]["token"]);
        EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["top_logprobs"][1]["logprob"].get<double>());
        EXPECT_GE(t["top_logprobs"][1]["logprob"].get<double>(), t["top_logprobs"][2]["logprob"].get<double>());
        joined += t["token"].get<std::string>();
    }
    EXPECT_EQ(joined, j["choices"][0]["message"]["content"].get<std::string>());

    body["stream"] = true;
    http_response sres = post("/v1/chat/completions", body);
    string_sink sink;
    ASSERT_TRUE(drive(sres, sink));
    size_t streamed = 0;
    for (const cli::sse_event & ev : cli::sse_reader::read_all(sink.text)) {
        if (ev.data.rfind("{", 0) != 0) continue;
        const json c = json::parse(ev.data);
        const json & ch = c["choices"][0];
        if (ch.contains("logprobs") && ch["logprobs"].is_object()) streamed += ch["logprobs"]["content"].size();
    }
    EXPECT_EQ(streamed, content.size()) << "the same tokens, over the stream's chunks";

    http_response cres = post("/v1/completions", {{"prompt", "one two three"}, {"max_tokens", 4}, {"temperature", 0}, {"logprobs", 2}});
    ASSERT_EQ(cres.status, 200) << cres.body;
    const json cl = json::parse(cres.body)["choices"][0]["logprobs"];
    ASSERT_TRUE(cl["tokens"].is_array()) << cres.body.substr(0, 400);
    EXPECT_EQ(cl["tokens"].size(), cl["token_logprobs"].size());
    EXPECT_EQ(cl["tokens"].size(), cl["text_offset"].size());
    ASSERT_FALSE(cl["top_logprobs"].empty());
    EXPECT_LE(cl["top_logprobs"][0].size(), 2u);
    EXPECT_EQ(cl["text_offset"][0], 0);
}

// response_format json_object: the answer is a JSON object (under llama.cpp's JSON
// grammar), whatever the model would have said.
TEST_F(routes_model_test, response_format_json_object_constrains_the_answer) {
    json body = {{"messages", json::array({{{"role", "user"}, {"content", "Give me JSON."}}})},
                 {"max_tokens", 48}, {"temperature", 0}, {"response_format", {{"type", "json_object"}}}};
    http_response res = post("/v1/chat/completions", body);
    ASSERT_EQ(res.status, 200) << res.body;
    const json j = json::parse(res.body);
    const std::string text = j["choices"][0]["message"]["content"];
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text[0], '{') << text;
    if (j["choices"][0]["finish_reason"] == "stop") {  // complete: it parses, as an object
        json parsed = json::parse(text, nullptr, false);
        EXPECT_TRUE(parsed.is_object()) << text;
    }
    body.erase("response_format");
    const std::string free_text = json::parse(post("/v1/chat/completions", body).body)["choices"][0]["message"]["content"];
    EXPECT_NE(free_text, text) << "the grammar changed the answer";
}

// A request whose text plainly needs more tokens than a sequence holds is refused
// before it is tokenized at all (3 MB would take seconds to tokenize).
TEST_F(routes_model_test, a_request_plainly_too_long_is_refused_before_tokenizing) {
    std::string huge;
    while (huge.size() < (3u << 20)) huge += "plenty of ordinary words to read here. ";
    http_response res = post("/v1/chat/completions", chat(huge, false));
    EXPECT_EQ(res.status, 400) << res.body.substr(0, 300);
    EXPECT_NE(res.body.find("no token of this model covers more than"), std::string::npos) << res.body.substr(0, 300);
    EXPECT_NE(res.body.find("-c/--n-ctx"), std::string::npos);
}

// A prompt that does not fit is assembled and refused on the HTTP thread: its 400 does
// not wait for the engine thread (held here for 3 s).
TEST_F(routes_model_test, a_prompt_too_long_is_refused_without_the_engine_thread) {
    engine_held busy(*sched_, 3s);
    std::string big;
    while (big.size() < 40000) big += "a sentence that takes a few tokens to say. ";
    const auto t0 = std::chrono::steady_clock::now();
    http_response res = post("/v1/chat/completions", chat(big, false));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
    EXPECT_EQ(res.status, 400) << res.body;
    EXPECT_NE(res.body.find("-c/--n-ctx"), std::string::npos) << res.body;
}

TEST_F(routes_model_test, chat_answers_json) {
    http_response res = post("/v1/chat/completions", chat("hello", false));
    ASSERT_EQ(res.status, 200) << res.body;
    EXPECT_FALSE(res.stream);
    EXPECT_EQ(res.content_type, "application/json");
    json j = json::parse(res.body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(j["model"], "tiny-f16-seed1");
    EXPECT_NE(metrics().find("warmctx_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1\n"),
              std::string::npos);
}

TEST_F(routes_model_test, stream_frames_sse_and_is_recorded_when_it_ends) {
    http_response res = post("/v1/chat/completions", chat("count", true));
    ASSERT_EQ(res.status, 200) << res.body;
    ASSERT_TRUE(res.stream);
    EXPECT_EQ(res.content_type, "text/event-stream");
    EXPECT_EQ(res.header("Cache-Control"), "no-cache");
    EXPECT_EQ(res.header("X-Accel-Buffering"), "no");
    // Not recorded until the stream ends.
    EXPECT_EQ(metrics().find("route=\"/v1/chat/completions\""), std::string::npos);
    string_sink sink;
    ASSERT_TRUE(drive(res, sink));
    const std::string & t = sink.text;
    ASSERT_GE(t.size(), 20u);
    EXPECT_EQ(t.rfind("data: ", 0), 0u);
    EXPECT_EQ(t.substr(t.size() - 14), "data: [DONE]\n\n");
    std::vector<json> chunks;
    bool unterminated = false;
    for (const cli::sse_event & ev : cli::sse_reader::read_all(t, &unterminated)) {
        ASSERT_EQ(ev.raw.rfind("data: ", 0), 0u) << ev.raw;
        if (ev.done()) continue;
        chunks.push_back(json::parse(ev.data));
    }
    ASSERT_FALSE(unterminated);
    ASSERT_GE(chunks.size(), 3u);  // role, finish, usage
    EXPECT_EQ(chunks.front()["choices"][0]["delta"]["role"], "assistant");
    EXPECT_TRUE(chunks.back()["choices"].empty());
    EXPECT_GT(chunks.back()["usage"]["prompt_tokens"].get<int>(), 0);
    EXPECT_TRUE(chunks[chunks.size() - 2].contains("warmctx"));
    EXPECT_NE(metrics().find("warmctx_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1\n"),
              std::string::npos);
}

TEST_F(routes_model_test, a_client_gone_mid_stream_cancels_the_job_and_records_499) {
    const uint64_t cancelled = sched_->stats().n_cancelled;
    json body = chat("a long story", true);
    body["max_tokens"] = 1500;
    body["temperature"] = 1.0;
    body["seed"] = 7;
    leave_mid_stream(body, cancelled);
    EXPECT_GT(sched_->stats().n_cancelled, cancelled);
    EXPECT_NE(metrics().find("warmctx_requests_total{route=\"/v1/chat/completions\",status=\"499\"} 1\n"),
              std::string::npos);
}

// A client that leaves keeps what its request prefilled: a retry of the same request
// (agents retry after a timeout) starts from the cached blocks, not cold.
TEST_F(routes_model_test, a_retry_after_the_client_left_reuses_what_it_prefilled) {
    std::string sys = "A retried request. ";
    while (sys.size() < 3000) sys += "The agent's system prompt is long and the same every time it is sent. ";
    json body = {{"messages", json::array({{{"role", "system"}, {"content", sys}}, {{"role", "user"}, {"content", "go"}}})},
                 {"max_tokens", 400}, {"temperature", 1.0}, {"seed", 3}, {"stream", true},
                 {"workspace", "retry"}};
    const uint64_t cancelled = sched_->stats().n_cancelled;
    leave_mid_stream(body, cancelled);
    ASSERT_GT(sched_->stats().n_cancelled, cancelled);
    body["stream"] = false;
    body["max_tokens"] = 2;
    http_response again = post("/v1/chat/completions", body);
    ASSERT_EQ(again.status, 200) << again.body;
    const json j = json::parse(again.body);
    EXPECT_GT(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0) << j["warmctx"].dump();
    EXPECT_NE(j["warmctx"]["result"], "cold") << j["warmctx"].dump();
}

TEST_F(routes_model_test, workspace_chat_merges_the_stored_segments) {
    http_request put;
    put.method = "PUT";
    put.path = "/v1/workspaces/m1/segments/rules";
    put.body = R"({"kind": "instructions", "content": "Always run the tests."})";
    ASSERT_EQ(router_->handle(put).status, 201);
    json body = {{"segments", json::array({{{"id", "rules"}, {"kind", "instructions"}, {"content", "Never run them."}},
                                           {{"id", "q"}, {"kind", "user"}, {"content", "Why?"}}})},
                 {"max_tokens", 2}};
    http_response res = post("/v1/workspaces/m1/chat/completions", body);
    ASSERT_EQ(res.status, 200) << res.body;
    EXPECT_EQ(json::parse(res.body)["warmctx"]["workspace"], "m1");
}


// ---- pre-warm and durable workspaces ---------------------------------------------------

http_request put_req(const std::string & ws, const std::string & id, const json & body) {
    http_request r;
    r.method = "PUT";
    r.path = "/v1/workspaces/" + ws + "/segments/" + id;
    r.body = body.dump();
    return r;
}

// A repository map of about `n` tokens of the tiny model's tokenizer.
std::string repo_map_text(int n, int salt) {
    std::string t;
    for (int i = 0; t.size() < (size_t)n * 4; ++i) t += "src/mod" + std::to_string(salt) + "_" + std::to_string(i) + ".cc ";
    return t;
}

uint64_t n_prewarms(scheduler & s) {
    uint64_t n = 0;
    EXPECT_TRUE(s.call([&](context_engine & ce) { n = ce.counters().prewarm.n_prewarms; }).ok());
    return n;
}

bool wait_for_prewarms(scheduler & s, uint64_t n) {
    for (int i = 0; i < 1000; ++i) {
        if (n_prewarms(s) >= n) return true;
        std::this_thread::sleep_for(10ms);
    }
    return false;
}

json user_chat(const std::string & q) {
    return {{"messages", json::array({{{"role", "user"}, {"content", q}}})}, {"max_tokens", 2}, {"temperature", 0}};
}

// PUTs of stable segments start one pre-warm (after the last of them); the chat sent
// after it reuses every cacheable token and its warmctx object says it was served from
// the pre-warm. POST .../prewarm answers 202 (404 without stored segments); explain
// lists the workspace's jobs.
TEST_F(routes_model_test, stored_stable_segments_are_prewarmed_and_the_next_chat_is_a_full_hit) {
    // A quiet period long enough that the two PUTs surely fall inside it, however busy
    // the machine.
    server_options o;
    o.log_requests = false;
    o.prewarm_delay_ms = 1500;
    ctx_ = std::make_unique<route_context>(sched_.get(), o);
    router_ = std::make_unique<router>(*ctx_);
    const uint64_t before = n_prewarms(*sched_);
    ASSERT_EQ(router_->handle(put_req("pw1", "sys", {{"kind", "system"}, {"content", "You are terse."}})).status, 201);
    http_response p = router_->handle(put_req("pw1", "map", {{"kind", "repo_map"}, {"content", repo_map_text(900, 1)}}));
    ASSERT_EQ(p.status, 201) << p.body;
    EXPECT_TRUE(json::parse(p.body)["prewarm"].get<bool>());
    ASSERT_TRUE(wait_for_prewarms(*sched_, before + 1));
    std::this_thread::sleep_for(1600ms);
    EXPECT_EQ(n_prewarms(*sched_), before + 1) << "the two PUTs made one pre-warm";

    http_response res = post("/v1/workspaces/pw1/chat/completions", user_chat("What is here?"));
    ASSERT_EQ(res.status, 200) << res.body;
    const json w = json::parse(res.body)["warmctx"];
    EXPECT_EQ(w["miss"], "full_hit") << w.dump();
    EXPECT_EQ(w["result"], "warm") << w.dump();
    EXPECT_EQ(w["tokens_reused"], w["tokens_cacheable"]);
    ASSERT_TRUE(w["prewarm"].is_object()) << w.dump();
    EXPECT_TRUE(w["prewarm"]["complete"].get<bool>());
    EXPECT_EQ(w["prewarm"]["tokens_cached"], w["tokens_cacheable"]);

    http_response again = post("/v1/workspaces/pw1/prewarm", json::object());
    EXPECT_EQ(again.status, 202) << again.body;
    ASSERT_TRUE(wait_for_prewarms(*sched_, before + 2));
    context_counters c;
    ASSERT_TRUE(sched_->call([&](context_engine & ce) { c = ce.counters(); }).ok());
    EXPECT_GE(c.prewarm.n_already_cached, 1u) << "a pre-warm of a cached prefix does nothing";
    EXPECT_EQ(post("/v1/workspaces/nothing-stored/prewarm", json::object()).status, 404);

    http_request ex;
    ex.method = "GET";
    ex.path = "/v1/workspaces/pw1/explain";
    http_response e = router_->handle(ex);
    ASSERT_EQ(e.status, 200) << e.body;
    EXPECT_TRUE(json::parse(e.body)["jobs"].is_array());
}

// An SDK sends its tools (and system messages) with every request, not as stored
// segments: the pre-warm after a PUT includes the stable segments the workspace's last
// chat carried, so the next chat with the same tools is still a full hit.
TEST_F(routes_model_test, a_prewarm_includes_the_tools_the_last_chat_carried) {
    const uint64_t first = n_prewarms(*sched_);
    ASSERT_EQ(router_->handle(put_req("pw2", "map", {{"kind", "repo_map"}, {"content", repo_map_text(600, 3)}})).status, 201);
    ASSERT_TRUE(wait_for_prewarms(*sched_, first + 1));  // that PUT's pre-warm (no tools known yet) is done
    const json tools = json::array({{{"type", "function"},
                                     {"function", {{"name", "read_file"},
                                                   {"parameters", {{"type", "object"}, {"properties", {{"path", {{"type", "string"}}}}}}}}}}});
    json chat_body = user_chat("Read it.");
    chat_body["tools"] = tools;
    ASSERT_EQ(post("/v1/workspaces/pw2/chat/completions", chat_body).status, 200);
    const uint64_t before = n_prewarms(*sched_);
    ASSERT_EQ(router_->handle(put_req("pw2", "map", {{"kind", "repo_map"}, {"content", repo_map_text(600, 4)}})).status, 200);
    ASSERT_TRUE(wait_for_prewarms(*sched_, before + 1));
    http_response res = post("/v1/workspaces/pw2/chat/completions", chat_body);
    ASSERT_EQ(res.status, 200) << res.body;
    const json w = json::parse(res.body)["warmctx"];
    EXPECT_EQ(w["miss"], "full_hit") << w.dump();
    EXPECT_EQ(w["result"], "warm") << w.dump();
    EXPECT_EQ(w["tokens_reused"], w["tokens_cacheable"]) << w.dump();
    EXPECT_TRUE(w["prewarm"].is_object()) << w.dump();
}

// Tools stored as a segment (id `tools`, as a chat's `tools` field maps), written with
// the client's own spacing and key order: the pre-warm after the PUT renders them as the
// first chat that sends the same tools does, so that chat is a full hit from it.
TEST_F(routes_model_test, stored_tools_in_any_json_layout_make_the_first_chat_with_tools_a_full_hit) {
    const uint64_t before = n_prewarms(*sched_);
    const std::string stored =
        "[ {\"function\": {\"parameters\": {\"type\": \"object\", \"properties\": {\"path\": {\"type\": \"string\"}}},\n"
        "                \"name\": \"read_file\"},\n   \"type\": \"function\"} ]";
    http_response put = router_->handle(put_req("pw3", "tools", {{"kind", "tools"}, {"content", stored}}));
    ASSERT_EQ(put.status, 201) << put.body;
    ASSERT_EQ(router_->handle(put_req("pw3", "map", {{"kind", "repo_map"}, {"content", repo_map_text(600, 5)}})).status, 201);
    ASSERT_TRUE(wait_for_prewarms(*sched_, before + 1));
    const json tools = json::array({{{"type", "function"},
                                     {"function", {{"name", "read_file"},
                                                   {"parameters", {{"type", "object"}, {"properties", {{"path", {{"type", "string"}}}}}}}}}}});
    json chat_body = user_chat("Read it.");
    chat_body["tools"] = tools;
    http_response res = post("/v1/workspaces/pw3/chat/completions", chat_body);
    ASSERT_EQ(res.status, 200) << res.body;
    const json w = json::parse(res.body)["warmctx"];
    EXPECT_EQ(w["miss"], "full_hit") << w.dump();
    EXPECT_EQ(w["result"], "warm") << w.dump();
    EXPECT_EQ(w["tokens_reused"], w["tokens_cacheable"]) << w.dump();
    EXPECT_GT(w["tokens_reused"].get<int>(), 0) << w.dump();
    // GET answers the stored form: the canonical JSON.
    http_request g;
    g.method = "GET";
    g.path = "/v1/workspaces/pw3/segments/tools";
    http_response got = router_->handle(g);
    ASSERT_EQ(got.status, 200) << got.body;
    EXPECT_EQ(json::parse(got.body)["content"], tools.dump());
}

// Durable workspaces: the segment store and the disk tier survive a restart. After it
// the stored workspace is brought warm from the disk tier (a restore, no prefill) and
// its first chat needs no PUT.
TEST(durable_workspaces, a_restart_keeps_stored_workspaces_warm_from_the_disk_tier) {
    char tmpl[] = "/tmp/warmctx-durable-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    auto start = [&](std::unique_ptr<scheduler> & s, std::unique_ptr<route_context> & ctx, std::unique_ptr<router> & r) {
        scheduler_options so = tiny_options();
        so.engine.tiers.cache_dir = dir;
        auto sc = scheduler::start(so);
        ASSERT_TRUE(sc.ok()) << sc.error().to_string();
        s = std::move(*sc);
        server_options o;
        o.log_requests = false;
        o.workspace_dir = dir + "/workspaces";
        ctx = std::make_unique<route_context>(s.get(), o);
        r = std::make_unique<router>(*ctx);
    };
    std::unique_ptr<scheduler> s;
    std::unique_ptr<route_context> ctx;
    std::unique_ptr<router> r;
    start(s, ctx, r);
    ASSERT_EQ(r->handle(put_req("keep", "sys", {{"kind", "system"}, {"content", "You are terse."}})).status, 201);
    ASSERT_EQ(r->handle(put_req("keep", "map", {{"kind", "repo_map"}, {"content", repo_map_text(700, 2)}})).status, 201);
    ASSERT_TRUE(wait_for_prewarms(*s, 1));
    ctx->stop_background();
    r.reset();
    ctx.reset();
    s->stop();
    s.reset();

    start(s, ctx, r);  // the restart: nothing PUT again
    ASSERT_TRUE(wait_for_prewarms(*s, 1));
    context_counters c;
    ASSERT_TRUE(s->call([&](context_engine & ce) { c = ce.counters(); }).ok());
    EXPECT_EQ(c.prewarm.n_prefilled_tokens, 0u) << "brought warm by a restore, not a prefill";
    EXPECT_EQ(c.tiers.n_restores_disk, 1u);
    http_request chat;
    chat.method = "POST";
    chat.path = "/v1/workspaces/keep/chat/completions";
    chat.body = user_chat("And now?").dump();
    http_response res = r->handle(chat);
    ASSERT_EQ(res.status, 200) << res.body;
    const json w = json::parse(res.body)["warmctx"];
    EXPECT_EQ(w["tokens_reused"], w["tokens_cacheable"]) << w.dump();
    ASSERT_TRUE(w["prewarm"].is_object()) << w.dump();
    EXPECT_EQ(w["prewarm"]["found_in"], "disk");
    EXPECT_EQ(w["prewarm"]["tokens_prefilled"], 0);
    ctx->stop_background();
    r.reset();
    ctx.reset();
    s->stop();
    std::filesystem::remove_all(dir);
}

// The stored context's manifest is assembled on the HTTP thread: it answers while the
// engine thread is busy (held 3 s here, as a long prefill chunk would hold it); explain
// tokenizes there too and waits only for the lookup.
TEST_F(routes_model_test, manifest_does_not_wait_on_the_engine_thread) {
    ASSERT_EQ(router_->handle(put_req("mf", "map", {{"kind", "repo_map"}, {"content", repo_map_text(400, 9)}})).status, 201);
    engine_held busy(*sched_, 3s);
    http_request r;
    r.method = "GET";
    r.path = "/v1/workspaces/mf/manifest";
    const auto t0 = std::chrono::steady_clock::now();
    http_response res = router_->handle(r);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
    ASSERT_EQ(res.status, 200) << res.body;
    EXPECT_GT(json::parse(res.body)["n_tokens"].get<int>(), 300);
    busy.join();
    r.path = "/v1/workspaces/mf/explain";
    http_response ex = router_->handle(r);
    ASSERT_EQ(ex.status, 200) << ex.body;
    EXPECT_GT(json::parse(ex.body)["prompt_tokens"].get<int>(), json::parse(res.body)["n_tokens"].get<int>())
        << "the stored context plus the generation prompt";
}


// ---- tools: the template's format, grammars, parsing --------------------------------

// Two tools whose arguments the grammar confines to a few values (the tiny model's
// weights are random: only a grammar makes what it says checkable).
json weather_tools() {
    return json::parse(R"([
      {"type":"function","function":{"name":"get_weather","description":"The weather in a city",
        "parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Rome"]},
                                                    "unit":{"type":"string","enum":["c","f"]}},
                      "required":["city","unit"]}}},
      {"type":"function","function":{"name":"get_time","description":"The time in a city",
        "parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Oslo","Lima"]}},
                      "required":["city"]}}}])");
}

// A call's arguments follow its tool's schema: every required key, each an allowed value.
void expect_valid_call(const json & call, const json & tools) {
    ASSERT_EQ(call["type"], "function");
    ASSERT_TRUE(call["id"].is_string() && !call["id"].get<std::string>().empty());
    const std::string name = call["function"]["name"];
    const json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(args.is_object()) << call.dump();
    const json * schema = nullptr;
    for (const auto & t : tools)
        if (t["function"]["name"] == name) schema = &t["function"]["parameters"];
    ASSERT_NE(schema, nullptr) << "no tool named " << name;
    for (const auto & req : (*schema)["required"]) ASSERT_TRUE(args.contains(req.get<std::string>())) << args.dump();
    for (const auto & [k, v] : args.items()) {
        ASSERT_TRUE((*schema)["properties"].contains(k)) << k;
        const json & allowed = (*schema)["properties"][k]["enum"];
        EXPECT_NE(std::find(allowed.begin(), allowed.end(), v), allowed.end()) << k << " = " << v.dump();
    }
}

json tool_request(const json & tools, json tool_choice, bool stream) {
    return {{"messages", json::array({{{"role", "system"}, {"content", "You call tools."}},
                                      {{"role", "user"}, {"content", "Weather in Paris?"}}})},
            {"tools", tools},
            {"tool_choice", std::move(tool_choice)},
            {"parallel_tool_calls", false},
            {"max_tokens", 200},
            {"temperature", 0},
            {"stream", stream}};
}

// tool_choice "required": the answer is one call (parallel_tool_calls false), parsed from
// the template's format into message.tool_calls, following its schema.
TEST_F(routes_model_test, a_required_tool_call_is_parsed_and_follows_its_schema) {
    const json tools = weather_tools();
    http_response res = post("/v1/chat/completions", tool_request(tools, "required", false));
    ASSERT_EQ(res.status, 200) << res.body;
    const json j = json::parse(res.body);
    const json & msg = j["choices"][0]["message"];
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << res.body;
    EXPECT_TRUE(msg["content"].is_null()) << res.body;
    ASSERT_EQ(msg["tool_calls"].size(), 1u) << res.body;
    expect_valid_call(msg["tool_calls"][0], tools);
}

// A named function is the one called.
TEST_F(routes_model_test, a_named_tool_choice_calls_that_function) {
    const json tools = weather_tools();
    for (const char * name : {"get_time", "get_weather"}) {
        http_response res =
            post("/v1/chat/completions", tool_request(tools, {{"type", "function"}, {"function", {{"name", name}}}}, false));
        ASSERT_EQ(res.status, 200) << res.body;
        const json j = json::parse(res.body);
        ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u) << res.body;
        EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["name"], name);
        expect_valid_call(j["choices"][0]["message"]["tool_calls"][0], tools);
    }
    // A function that is not among the tools is a 400 naming tool_choice.
    http_response bad =
        post("/v1/chat/completions", tool_request(tools, {{"type", "function"}, {"function", {{"name", "nope"}}}}, false));
    EXPECT_EQ(bad.status, 400) << bad.body;
    EXPECT_EQ(json::parse(bad.body)["error"]["param"], "tool_choice");
}

// Streamed, the call arrives as delta.tool_calls fragments that add up to the same call
// as the whole answer, and the last chunk says finish_reason "tool_calls".
TEST_F(routes_model_test, a_streamed_tool_call_adds_up_to_the_whole_one) {
    const json tools = weather_tools();
    const json whole = json::parse(post("/v1/chat/completions", tool_request(tools, "required", false)).body);
    http_response res = post("/v1/chat/completions", tool_request(tools, "required", true));
    ASSERT_EQ(res.status, 200) << res.body;
    string_sink sink;
    ASSERT_TRUE(drive(res, sink));
    std::string name, args, id, finish, content;
    size_t n_fragments = 0;
    for (const cli::sse_event & ev : cli::sse_reader::read_all(sink.text)) {
        if (ev.data.rfind("{", 0) != 0) continue;
        const json c = json::parse(ev.data);
        if (c["choices"].empty()) continue;
        const json & ch = c["choices"][0];
        if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
        const json & d = ch["delta"];
        if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
        if (!d.contains("tool_calls")) continue;
        for (const auto & f : d["tool_calls"]) {
            ++n_fragments;
            EXPECT_EQ(f["index"], 0);
            if (f.contains("id")) id = f["id"];
            if (f["function"].contains("name")) name = f["function"]["name"];
            if (f["function"].contains("arguments")) args += f["function"]["arguments"].get<std::string>();
        }
    }
    const json & call = whole["choices"][0]["message"]["tool_calls"][0];
    EXPECT_GT(n_fragments, 1u) << "the arguments came in pieces, as they were generated";
    EXPECT_EQ(content, "");
    EXPECT_EQ(name, call["function"]["name"]);
    EXPECT_EQ(args, call["function"]["arguments"]);
    EXPECT_FALSE(id.empty());
    EXPECT_EQ(finish, "tool_calls");
}

// A tool loop: each turn sends the history back with the assistant's calls and the tool
// results. Every turn after the first reuses at least 95% of the previous turn's prompt
// (all of it but the uncached tail: the generation prompt, and on the second turn the
// first question).
TEST_F(routes_model_test, a_tool_loop_reuses_the_previous_turns_prompt) {
    const json tools = weather_tools();
    std::string sys = "You are an agent that answers with tools. ";
    while (sys.size() < 4000) sys += "Check the weather and the time before you answer, and say which tool you used. ";
    json messages = json::array({{{"role", "system"}, {"content", sys}}, {{"role", "user"}, {"content", "Paris?"}}});
    int64_t prev_prompt = 0;
    for (int turn = 0; turn < 5; ++turn) {
        json body = {{"messages", messages}, {"tools", tools}, {"tool_choice", "required"},
                     {"parallel_tool_calls", false}, {"max_tokens", 200}, {"temperature", 0},
                     {"workspace", "tool-loop"}};
        http_response res = post("/v1/chat/completions", body);
        ASSERT_EQ(res.status, 200) << res.body;
        const json j = json::parse(res.body);
        const int64_t prompt = j["usage"]["prompt_tokens"], cached = j["usage"]["prompt_tokens_details"]["cached_tokens"];
        if (turn > 0) EXPECT_GE(cached, prev_prompt * 95 / 100) << "turn " << turn << ": " << j["warmctx"].dump();
        prev_prompt = prompt;
        const json & msg = j["choices"][0]["message"];
        ASSERT_EQ(msg["tool_calls"].size(), 1u) << res.body;
        expect_valid_call(msg["tool_calls"][0], tools);
        messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", msg["tool_calls"]}});
        messages.push_back({{"role", "tool"},
                            {"tool_call_id", msg["tool_calls"][0]["id"]},
                            {"content", "result " + std::to_string(turn) + ": 18 degrees"}});
    }
}

// response_format json_schema: the answer is a JSON object that follows the schema.
TEST_F(routes_model_test, a_json_schema_response_format_is_followed) {
    json body = {{"messages", json::array({{{"role", "user"}, {"content", "Pick."}}})},
                 {"max_tokens", 120},
                 {"temperature", 0},
                 {"response_format",
                  {{"type", "json_schema"},
                   {"json_schema",
                    {{"name", "pick"},
                     {"schema",
                      {{"type", "object"},
                       {"properties", {{"color", {{"type", "string"}, {"enum", {"red", "green"}}}},
                                       {"ok", {{"type", "boolean"}}}}},
                       {"required", {"color", "ok"}},
                       {"additionalProperties", false}}}}}}}};
    http_response res = post("/v1/chat/completions", body);
    ASSERT_EQ(res.status, 200) << res.body;
    const json j = json::parse(res.body);
    ASSERT_EQ(j["choices"][0]["finish_reason"], "stop") << res.body;
    const json out = json::parse(j["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(out.is_object()) << res.body;
    EXPECT_EQ(out.size(), 2u);
    EXPECT_TRUE(out["color"] == "red" || out["color"] == "green") << out.dump();
    EXPECT_TRUE(out["ok"].is_boolean()) << out.dump();
}

// Anthropic's structured output (output_config.format, as Claude Code's title request
// sends it): the text block is JSON that follows the schema; a format that is not a JSON
// schema is a 400 naming the field.
TEST_F(routes_model_test, messages_output_config_format_is_followed) {
    const json schema = {{"type", "object"},
                         {"properties", {{"title", {{"type", "string"}, {"enum", {"Fix a bug", "Add a test"}}}}}},
                         {"required", {"title"}},
                         {"additionalProperties", false}};
    json body = {{"model", "claude-haiku"},
                 {"max_tokens", 60},
                 {"temperature", 0},
                 {"messages", json::array({{{"role", "user"}, {"content", "Title this session."}}})},
                 {"output_config", {{"format", {{"type", "json_schema"}, {"schema", schema}}}}}};
    http_response res = post("/v1/messages", body);
    ASSERT_EQ(res.status, 200) << res.body;
    const json j = json::parse(res.body);
    ASSERT_EQ(j["stop_reason"], "end_turn") << res.body;
    const json out = json::parse(j["content"][0]["text"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(out.is_object()) << res.body;
    EXPECT_TRUE(out["title"] == "Fix a bug" || out["title"] == "Add a test") << out.dump();
    body["output_config"]["format"]["type"] = "text";
    http_response bad = post("/v1/messages", body);
    EXPECT_EQ(bad.status, 400) << bad.body;
    EXPECT_NE(bad.body.find("output_config.format.type"), std::string::npos) << bad.body;
}

// POST /v1/responses: Codex's request shape (instructions, input items, function tools,
// store false, include, reasoning, prompt_cache_key) runs as a chat and answers with a
// function_call item; streamed, its events end in response.completed with the same call.
TEST_F(routes_model_test, the_responses_api_runs_a_tool_call_whole_and_streamed) {
    json body = json::parse(R"({
      "model":"tiny","instructions":"You are a coding agent.",
      "input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"Work in /src."}]},
               {"type":"message","role":"user","content":[{"type":"input_text","text":"List the files."}]}],
      "tools":[{"type":"function","name":"shell","description":"Run a command","strict":true,
                "parameters":{"type":"object","properties":{"cmd":{"type":"string","enum":["ls","pwd"]}},
                              "required":["cmd"],"additionalProperties":false}}],
      "tool_choice":"required","parallel_tool_calls":false,"store":false,
      "include":["reasoning.encrypted_content"],"reasoning":{"effort":"medium","summary":"auto"},
      "prompt_cache_key":"codex-session-1","max_output_tokens":120,"temperature":0})");
    http_response res = post("/v1/responses", body);
    ASSERT_EQ(res.status, 200) << res.body;
    const json r = json::parse(res.body);
    EXPECT_EQ(r["object"], "response");
    EXPECT_EQ(r["status"], "completed");
    ASSERT_EQ(r["output"].size(), 1u) << res.body;
    const json & call = r["output"][0];
    EXPECT_EQ(call["type"], "function_call");
    EXPECT_EQ(call["name"], "shell");
    const json args = json::parse(call["arguments"].get<std::string>());
    EXPECT_TRUE(args["cmd"] == "ls" || args["cmd"] == "pwd") << args.dump();
    EXPECT_EQ(r["warmctx"]["workspace"], "codex-session-1");  // prompt_cache_key names the workspace
    EXPECT_GT(r["usage"]["input_tokens"].get<int64_t>(), 0);

    body["stream"] = true;
    http_response sres = post("/v1/responses", body);
    ASSERT_EQ(sres.status, 200) << sres.body;
    string_sink sink;
    ASSERT_TRUE(drive(sres, sink));
    std::vector<std::string> events;
    json completed;
    std::string args_deltas;
    int64_t seq = -1;
    for (const cli::sse_event & ev : cli::sse_reader::read_all(sink.text)) {
        if (ev.type.empty()) continue;
        events.push_back(ev.type);
        const json data = json::parse(ev.data);
        EXPECT_EQ(data["sequence_number"].get<int64_t>(), seq + 1);
        seq = data["sequence_number"];
        if (events.back() == "response.function_call_arguments.delta") args_deltas += data["delta"].get<std::string>();
        if (events.back() == "response.completed") completed = data["response"];
    }
    ASSERT_GE(events.size(), 5u) << sink.text;
    EXPECT_EQ(events.front(), "response.created");
    EXPECT_EQ(events.back(), "response.completed");
    ASSERT_EQ(completed["output"].size(), 1u) << sink.text;
    EXPECT_EQ(completed["output"][0]["arguments"], call["arguments"]);  // greedy: the same call
    EXPECT_EQ(args_deltas, call["arguments"]);
    EXPECT_GT(completed["usage"]["input_tokens_details"]["cached_tokens"].get<int64_t>(), 0);  // the second time
}
// A chat that is not streamed learns that its client left from the transport
// (http_request::client_gone) while it waits, and its job is cancelled: a client that
// gives up on a long answer no longer leaves the engine generating it (issue 30).
TEST_F(routes_model_test, a_request_whose_client_left_is_cancelled_while_it_waits) {
    const uint64_t cancelled_before = sched_->stats().n_cancelled;
    json body = chat("Write a long story.", false);
    body["max_tokens"] = 2000;  // seconds of generation on the tiny model
    http_request r;
    r.method = "POST";
    r.path = "/v1/chat/completions";
    r.body = body.dump();
    const auto t0 = std::chrono::steady_clock::now();
    r.client_gone = [t0] { return std::chrono::steady_clock::now() - t0 > 300ms; };
    http_response res = router_->handle(r);
    const auto waited = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(res.status, k_status_client_closed) << res.body.substr(0, 200);
    EXPECT_LT(waited, 3s);
    auto deadline = std::chrono::steady_clock::now() + 30s;
    while (sched_->stats().n_cancelled == cancelled_before && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(5ms);
    EXPECT_GT(sched_->stats().n_cancelled, cancelled_before);
    // The engine is free for the next one.
    http_response next = post("/v1/chat/completions", chat("hi", false));
    EXPECT_EQ(next.status, 200) << next.body.substr(0, 200);
}

}  // namespace
}  // namespace warmctx::server_detail
