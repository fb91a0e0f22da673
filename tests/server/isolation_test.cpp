// Isolation of the prefix cache (cache_salt, --isolate-workspaces): by default two
// workspaces with the same system prompt share its KV (and a request can tell by its
// cached tokens that another sent it); a salt keeps a request's blocks apart. Tiny model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/route_context.h"
#include "server/router.h"
#include "server_test_util.h"

namespace warmctx::server_detail {
namespace {

using json = nlohmann::json;

std::string system_prompt() {
    std::string s = "You are the build assistant of a large C++ repository. ";
    for (int i = 0; i < 40; ++i) s += "Rule " + std::to_string(i) + ": keep the tree green and the tests fast. ";
    return s;
}

class isolation_test : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        auto s = scheduler::start(testing_http::tiny_scheduler_options(2, 8));
        ASSERT_TRUE(s.ok()) << s.error().to_string();
        sched_ = std::move(*s);
    }
    static void TearDownTestSuite() {
        if (sched_) sched_->stop();
        sched_.reset();
    }

    // The cached tokens of one chat of `ws` (with `salt` when not empty) on a router over `o`.
    static int64_t cached(router & rt, const std::string & ws, const std::string & salt, const std::string & question) {
        json body = {{"messages", json::array({{{"role", "system"}, {"content", system_prompt()}},
                                               {{"role", "user"}, {"content", question}}})},
                     {"max_tokens", 1},
                     {"temperature", 0},
                     {"workspace", ws}};
        if (!salt.empty()) body["cache_salt"] = salt;
        http_request r;
        r.method = "POST";
        r.path = "/v1/chat/completions";
        r.body = body.dump();
        http_response res = rt.handle(r);
        EXPECT_EQ(res.status, 200) << res.body;
        json j = json::parse(res.body, nullptr, false);
        return j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    }

    static std::unique_ptr<scheduler> sched_;
};
std::unique_ptr<scheduler> isolation_test::sched_;

TEST_F(isolation_test, workspaces_share_blocks_by_content_unless_salted) {
    server_options o;
    o.log_requests = false;
    route_context ctx(sched_.get(), o);
    router rt(ctx);
    EXPECT_EQ(cached(rt, "iso-a", "", "first question"), 0);
    // Another workspace, the same system prompt: its blocks are shared.
    EXPECT_GT(cached(rt, "iso-b", "", "second question"), 100);
    // A salt: nothing shared with the unsalted blocks, nor with another salt ...
    EXPECT_EQ(cached(rt, "iso-c", "salt-1", "third question"), 0);
    EXPECT_EQ(cached(rt, "iso-d", "salt-2", "fourth question"), 0);
    // ... but with the same salt.
    EXPECT_GT(cached(rt, "iso-e", "salt-1", "fifth question"), 100);
}

TEST_F(isolation_test, isolate_workspaces_salts_every_request_with_its_workspace) {
    server_options o;
    o.log_requests = false;
    o.isolate_workspaces = true;
    route_context ctx(sched_.get(), o);
    router rt(ctx);
    EXPECT_EQ(cached(rt, "iso-x", "", "first question"), 0);
    EXPECT_EQ(cached(rt, "iso-y", "", "second question"), 0);  // the same prompt, another workspace
    EXPECT_GT(cached(rt, "iso-x", "", "third question"), 100);  // its own workspace's blocks
}

}  // namespace
}  // namespace warmctx::server_detail
