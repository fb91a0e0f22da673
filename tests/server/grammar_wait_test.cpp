// A request waits for its answer's grammar with a deadline, stops waiting when its client
// leaves or the server stops (the build left to finish on its own thread), and a grammar
// larger than --max-grammar-bytes as built is refused before llama.cpp parses it. On the
// tiny model, without a socket.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/router.h"
#include "warmctx/scheduler.h"

namespace warmctx::server_detail {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

class grammar_wait_test : public ::testing::Test {
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
    void serve(server_options o) {
        o.log_requests = false;
        router_.reset();
        ctx_ = std::make_unique<route_context>(sched_.get(), o);
        router_ = std::make_unique<router>(*ctx_);
    }
    static http_request chat(const json & schema) {
        json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                     {"max_tokens", 2},
                     {"temperature", 0}};
        if (!schema.is_null())
            body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}};
        http_request r;
        r.method = "POST";
        r.path = "/v1/chat/completions";
        r.body = body.dump();
        return r;
    }
    // 48 objects of 128 optional properties: about 0.8 million units of the converter's
    // work (a second or so on 2 cores), past the default --max-schema-cost.
    static json costly_schema() {
        json props = json::object();
        for (int i = 0; i < 48; ++i) {
            json inner = json::object();
            for (int j = 0; j < 128; ++j) inner["p" + std::to_string(i) + "_" + std::to_string(j)] = {{"type", "string"}};
            props["o" + std::to_string(i)] = {{"type", "object"}, {"properties", inner}};
        }
        return {{"type", "object"}, {"properties", props}};
    }
    static server_options costly_allowed() {
        server_options o;
        o.bounds.max_schema_cost = size_t{1} << 30;
        o.grammar_builds = 1;
        return o;
    }
    static std::string code(const http_response & res) {
        return json::parse(res.body)["error"]["code"].get<std::string>();
    }

    static std::unique_ptr<scheduler> sched_;
    std::unique_ptr<route_context> ctx_;
    std::unique_ptr<router> router_;
};

std::unique_ptr<scheduler> grammar_wait_test::sched_;

TEST_F(grammar_wait_test, the_default_bound_refuses_a_schema_that_costs_the_converter_seconds) {
    serve(server_options{});
    http_response res = router_->handle(chat(costly_schema()));
    EXPECT_EQ(res.status, 400) << res.body.substr(0, 300);
    EXPECT_EQ(code(res), "schema_too_costly");
    EXPECT_EQ(ctx_->grammars.running(), 0u);  // nothing was built
}

TEST_F(grammar_wait_test, a_grammar_not_built_by_the_deadline_answers_503_and_the_build_goes_on_alone) {
    server_options o = costly_allowed();
    o.grammar_deadline_ms = 50;
    serve(o);
    const auto t0 = std::chrono::steady_clock::now();
    http_response res = router_->handle(chat(costly_schema()));
    const auto waited = std::chrono::steady_clock::now() - t0;
    ASSERT_EQ(res.status, 503) << res.body.substr(0, 300);
    EXPECT_EQ(code(res), "grammar_timeout");
    EXPECT_EQ(ctx_->grammars.running(), 1u);  // answered while the build still ran
    EXPECT_LT(waited, 5s);
    // A request without a grammar is not held up by it.
    http_response plain = router_->handle(chat(json()));
    EXPECT_EQ(plain.status, 200) << plain.body.substr(0, 300);
}

TEST_F(grammar_wait_test, a_client_that_leaves_while_its_grammar_builds_is_answered_at_once) {
    serve(costly_allowed());
    const uint64_t submitted = sched_->stats().n_submitted;
    http_request r = chat(costly_schema());
    const auto t0 = std::chrono::steady_clock::now();
    r.client_gone = [t0] { return std::chrono::steady_clock::now() - t0 > 30ms; };
    http_response res = router_->handle(r);
    EXPECT_EQ(res.status, k_status_client_closed) << res.body.substr(0, 300);
    EXPECT_EQ(ctx_->grammars.running(), 1u);  // the build was left, not waited for
    EXPECT_EQ(sched_->stats().n_submitted, submitted);  // nothing was queued
}

TEST_F(grammar_wait_test, a_server_stopping_stops_the_wait_and_then_waits_for_the_build) {
    serve(costly_allowed());
    std::thread stopper([this] {
        std::this_thread::sleep_for(50ms);
        ctx_->stop_channels("the server is shutting down");
    });
    http_response res = router_->handle(chat(costly_schema()));
    stopper.join();
    EXPECT_EQ(res.status, 503) << res.body.substr(0, 300);
    EXPECT_EQ(ctx_->grammars.running(), 1u);
    ctx_->stop_background();  // as the server's stop(): returns once the build is done
    EXPECT_EQ(ctx_->grammars.running(), 0u);
    http_response after = router_->handle(chat(json{{"type", "string"}}));
    EXPECT_EQ(after.status, 503) << after.body.substr(0, 300);  // no build starts any more
}

TEST_F(grammar_wait_test, a_grammar_larger_than_the_bound_as_built_is_refused_before_it_is_parsed) {
    server_options o;
    o.bounds.max_grammar_bytes = 1024;
    serve(o);
    json props = json::object();
    for (int i = 0; i < 40; ++i) props["field_" + std::to_string(i)] = {{"type", "string"}};
    json required = json::array();
    for (auto & [k, v] : props.items()) required.push_back(k);
    http_response big = router_->handle(chat({{"type", "object"}, {"properties", props}, {"required", required}}));
    EXPECT_EQ(big.status, 400) << big.body.substr(0, 300);
    EXPECT_EQ(code(big), "grammar_too_large");
    EXPECT_EQ(json::parse(big.body)["error"]["param"], "response_format");
    http_response small = router_->handle(chat({{"type", "string"}}));
    EXPECT_EQ(small.status, 200) << small.body.substr(0, 300);
}

}  // namespace
}  // namespace warmctx::server_detail
