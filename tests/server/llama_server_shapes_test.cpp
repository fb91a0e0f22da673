// llama-server's routes answer in llama-server's shapes: each answer has every key of an
// example written after llama.cpp's server documentation (tools/server/README.md; values
// made up), with a value of the same JSON type (null: any). warmctx may add keys (its
// `warmctx` object). On the tiny model, without a socket.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "server/router.h"
#include "warmctx/scheduler.h"

namespace warmctx::server_detail {
namespace {

using json = nlohmann::json;

const char * const k_examples = R"({
  "completion": {
    "content": " Paris.", "id_slot": 0, "stop": true, "model": "gpt-3.5-turbo", "tokens_predicted": 3,
    "tokens_evaluated": 7, "tokens_cached": 6, "stop_type": "limit", "stopping_word": "", "truncated": false,
    "timings": { "cache_n": 6, "prompt_n": 1, "prompt_ms": 8.5, "prompt_per_token_ms": 8.5,
                 "prompt_per_second": 117.6, "predicted_n": 3, "predicted_ms": 30.1,
                 "predicted_per_token_ms": 10.0, "predicted_per_second": 99.7 }
  },
  "completion_chunk": { "content": " Par", "stop": false },
  "tokenize": { "tokens": [123, 456, 789] },
  "tokenize_pieces": { "tokens": [ { "id": 123, "piece": "Hello" } ] },
  "detokenize": { "content": "Hello world" },
  "apply_template": { "prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" },
  "props": {
    "default_generation_settings": { "n_ctx": 4096, "params": { "n_predict": -1, "temperature": 0.8, "top_k": 40,
                                                                "top_p": 0.95 } },
    "total_slots": 1, "model_path": "model.gguf", "chat_template": "{{ messages }}", "bos_token": "<s>",
    "eos_token": "</s>", "build_info": "b1-abc", "modalities": { "vision": false }
  },
  "slot": { "id": 0, "n_ctx": 4096, "is_processing": false }
})";

std::string type_of(const json & v) { return v.is_number() ? "number" : v.type_name(); }

void expect_shape(const json & example, const json & got, const std::string & where) {
    if (example.is_null()) return;
    ASSERT_EQ(type_of(got), type_of(example)) << where << ": " << got.dump().substr(0, 200);
    if (example.is_array()) {
        if (!example.empty() && !got.empty()) expect_shape(example[0], got[0], where + "[0]");
        return;
    }
    if (!example.is_object()) return;
    for (auto it = example.begin(); it != example.end(); ++it) {
        ASSERT_TRUE(got.contains(it.key())) << where << ": no '" << it.key() << "' in " << got.dump().substr(0, 300);
        expect_shape(it.value(), got[it.key()], where + "." + it.key());
    }
}

class llama_server_shapes : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        scheduler_options o;
        o.engine.engine.model_path = WARMCTX_TINY_MODEL;
        o.engine.engine.n_ctx = 2048;
        o.engine.engine.n_threads = 1;
        o.n_parallel = 1;
        auto s = scheduler::start(o);
        ASSERT_TRUE(s.ok()) << s.error().to_string();
        sched_ = std::move(*s);
    }
    static void TearDownTestSuite() {
        if (sched_) sched_->stop();
        sched_.reset();
    }
    void SetUp() override {
        server_options o;
        o.log_requests = false;
        ctx_ = std::make_unique<route_context>(sched_.get(), o);
        router_ = std::make_unique<router>(*ctx_);
    }
    json call(const std::string & method, const std::string & path, const json & body = json()) {
        http_request r;
        r.method = method;
        r.path = path;
        if (!body.is_null()) r.body = body.dump();
        http_response res = router_->handle(r);
        EXPECT_EQ(res.status, 200) << path << ": " << res.body.substr(0, 300);
        return res.status == 200 && !res.stream ? json::parse(res.body) : json();
    }
    static std::unique_ptr<scheduler> sched_;
    std::unique_ptr<route_context> ctx_;
    std::unique_ptr<router> router_;
};

std::unique_ptr<scheduler> llama_server_shapes::sched_;

TEST_F(llama_server_shapes, every_route_answers_with_the_keys_and_types_of_llama_servers_own) {
    const json ex = json::parse(k_examples);
    expect_shape(ex["completion"], call("POST", "/completion", {{"prompt", "The capital of France is"}, {"n_predict", 3}}),
                 "completion");
    expect_shape(ex["tokenize"], call("POST", "/tokenize", {{"content", "Hello world"}}), "tokenize");
    expect_shape(ex["tokenize_pieces"], call("POST", "/tokenize", {{"content", "Hello"}, {"with_pieces", true}}),
                 "tokenize with pieces");
    expect_shape(ex["detokenize"], call("POST", "/detokenize", {{"tokens", json::array({9707, 1879})}}), "detokenize");
    expect_shape(ex["apply_template"],
                 call("POST", "/apply-template", {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}),
                 "apply-template");
    expect_shape(ex["props"], call("GET", "/props"), "props");
    const json slots = call("GET", "/slots");
    ASSERT_TRUE(slots.is_array() && !slots.empty()) << slots.dump();
    expect_shape(ex["slot"], slots[0], "slots[0]");
}

TEST_F(llama_server_shapes, a_streamed_completion_sends_pieces_then_the_whole_answer) {
    const json ex = json::parse(k_examples);
    http_request r;
    r.method = "POST";
    r.path = "/completion";
    r.body = json({{"prompt", "The capital of France is"}, {"n_predict", 3}, {"stream", true}}).dump();
    http_response res = router_->handle(r);
    ASSERT_EQ(res.status, 200) << res.body;
    ASSERT_TRUE(res.stream);
    struct collect final : chunk_sink {
        std::string all;
        bool done_called = false;
        bool write(std::string_view d) override {
            all.append(d);
            return true;
        }
        void done() override { done_called = true; }
    } sink;
    while (!sink.done_called && res.stream(sink)) {}
    if (res.stream_end) res.stream_end();
    std::vector<json> events;
    for (size_t at = 0; (at = sink.all.find("data: ", at)) != std::string::npos;) {
        const size_t end = sink.all.find("\n\n", at);
        events.push_back(json::parse(sink.all.substr(at + 6, end - at - 6)));
        at = end;
    }
    ASSERT_GE(events.size(), 2u) << sink.all;
    for (size_t i = 0; i + 1 < events.size(); ++i) expect_shape(ex["completion_chunk"], events[i], "chunk");
    expect_shape(ex["completion"], events.back(), "last event");
    EXPECT_EQ(events.back()["stop"], true);
}

}  // namespace
}  // namespace warmctx::server_detail
