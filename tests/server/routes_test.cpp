// The route handlers without a socket and without a model: requests as plain structs
// through the router (auth, dispatch, the record), answers as plain structs. Routes
// that reach the engine are in routes_model_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/json.h"
#include "server/json_util.h"
#include "server/router.h"
#include "server/workspace_store.h"

namespace warmctx::server_detail {
namespace {

using json = nlohmann::json;

http_request request(std::string method, std::string path, std::string body = {}) {
    http_request r;
    r.method = std::move(method);
    r.path = std::move(path);
    r.body = std::move(body);
    return r;
}

// The answer to a bad body before bodies went through parse_json: the old parse_body,
// verbatim, so that these tests pin "the same status, code and message as before".
api_error old_body_error(const std::string & body) {
    if (size_t bad = find_invalid_utf8(body); bad != k_utf8_valid)
        return bad_request("invalid_utf8", "request body is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
    if (json_nesting_depth(body) > k_max_json_depth)
        return bad_request("invalid_json",
                           "request body nests arrays/objects deeper than " + std::to_string(k_max_json_depth) + " levels");
    try {
        json parsed = json::parse(body);
        ADD_FAILURE() << "the body is valid JSON: " << parsed.dump().substr(0, 80);
        return {};
    } catch (const json::exception & e) {
        return bad_request("invalid_json", std::string("request body is not valid JSON: ") + e.what());
    }
}

class routes_test : public ::testing::Test {
  protected:
    explicit routes_test(std::string api_key = {}) {
        server_options o;
        o.log_requests = false;
        o.api_key = std::move(api_key);
        ctx_ = std::make_unique<route_context>(nullptr, o);
        router_ = std::make_unique<router>(*ctx_);
    }
    http_response call(std::string method, std::string path, std::string body = {}) {
        return router_->handle(request(std::move(method), std::move(path), std::move(body)));
    }
    http_response put(const std::string & ws, const std::string & id, const json & body) {
        return call("PUT", "/v1/workspaces/" + ws + "/segments/" + id, body.dump());
    }
    static json parse(const http_response & r) {
        json j = json::parse(r.body, nullptr, false);
        EXPECT_FALSE(j.is_discarded()) << r.body;
        return j;
    }
    // requests_total of (route, status), from the metrics text.
    uint64_t count(const std::string & route, int status) const {
        const std::string series =
            "warmctx_requests_total{route=\"" + route + "\",status=\"" + std::to_string(status) + "\"} ";
        std::string t = ctx_->metrics.render(engine_snapshot{});
        size_t p = t.find(series);
        return p == std::string::npos ? 0 : std::stoull(t.substr(p + series.size()));
    }

    std::unique_ptr<route_context> ctx_;
    std::unique_ptr<router> router_;
};

TEST_F(routes_test, segment_put_get_delete_round_trip) {
    http_response p1 = put("proj", "src/map.txt", {{"kind", "repo_map"}, {"content", "a.cc"}, {"path", "src/map.txt"}});
    EXPECT_EQ(p1.status, 201) << p1.body;
    EXPECT_EQ(p1.content_type, "application/json");
    // No scheduler in this test: nothing is pre-warmed.
    EXPECT_EQ(p1.body,
              R"({"changed":true,"content_bytes":4,"created":true,"id":"src/map.txt","kind":"repo_map","prewarm":false,"workspace":"proj"})");
    http_response p2 = put("proj", "src/map.txt", {{"kind", "repo_map"}, {"content", "a.cc b.cc"}});
    EXPECT_EQ(p2.status, 200) << p2.body;
    EXPECT_FALSE(parse(p2)["created"].get<bool>());
    EXPECT_TRUE(parse(p2)["changed"].get<bool>());
    http_response p3 = put("proj", "src/map.txt", {{"kind", "repo_map"}, {"content", "a.cc b.cc"}});
    EXPECT_EQ(p3.status, 200) << p3.body;
    EXPECT_FALSE(parse(p3)["changed"].get<bool>()) << "the same content again changes nothing";
    EXPECT_EQ(put("proj", "rules", {{"kind", "instructions"}, {"content", "test it"}}).status, 201);

    http_response g = call("GET", "/v1/workspaces/proj/segments/src/map.txt");
    EXPECT_EQ(g.status, 200) << g.body;
    EXPECT_EQ(g.body, R"({"content":"a.cc b.cc","id":"src/map.txt","kind":"repo_map","workspace":"proj"})");
    http_response list = call("GET", "/v1/workspaces/proj/segments");
    ASSERT_EQ(list.status, 200) << list.body;
    ASSERT_EQ(parse(list)["data"].size(), 2u);
    EXPECT_EQ(parse(list)["data"][0]["id"], "rules");  // ordered by id
    http_response ws = call("GET", "/v1/workspaces/proj");
    EXPECT_EQ(ws.body, R"({"content_bytes":16,"id":"proj","object":"workspace","segments":["rules","src/map.txt"]})");
    EXPECT_EQ(call("GET", "/v1/workspaces").body, R"({"data":[{"id":"proj","object":"workspace"}],"object":"list"})");

    http_response d = call("DELETE", "/v1/workspaces/proj/segments/src/map.txt");
    EXPECT_EQ(d.status, 200) << d.body;
    EXPECT_EQ(d.body, R"({"deleted":true,"id":"src/map.txt","workspace":"proj"})");
    http_response gone = call("GET", "/v1/workspaces/proj/segments/src/map.txt");
    EXPECT_EQ(gone.status, 404);
    EXPECT_EQ(gone.body, error_from_status(not_found("no segment 'src/map.txt' in workspace 'proj'")).body());
    EXPECT_EQ(call("DELETE", "/v1/workspaces/proj/segments/src/map.txt").status, 404);
    EXPECT_EQ(call("DELETE", "/v1/workspaces/proj/segments/rules").status, 200);
    http_response empty = call("GET", "/v1/workspaces/proj/segments");  // a workspace exists while it stores one
    EXPECT_EQ(empty.status, 404);
    EXPECT_EQ(empty.body, error_from_status(not_found("workspace 'proj' has no stored segments")).body());

    // Each request is recorded under its route pattern.
    EXPECT_EQ(count("/v1/workspaces/{id}/segments/{segment}", 201), 2u);
    EXPECT_EQ(count("/v1/workspaces/{id}/segments/{segment}", 404), 2u);
}

TEST_F(routes_test, segment_put_refusals) {
    http_response user = put("proj", "q", {{"kind", "user"}, {"content", "no"}});
    EXPECT_EQ(user.status, 400);
    EXPECT_EQ(parse(user)["error"]["code"], "invalid_kind");
    EXPECT_EQ(parse(put("proj", "x", {{"kind", "system"}}))["error"]["param"], "content");
    http_response big = put("proj", "big", {{"kind", "system"}, {"content", std::string((4u << 20) + 1, 'x')}});
    EXPECT_EQ(big.status, 413);
    EXPECT_EQ(call("GET", "/v1/workspaces/proj").status, 404);  // nothing was stored
}

// Every route under /v1/workspaces/{id}: a bad id is the same 400 before anything else
// (so no route reaches the store or the engine with it).
TEST_F(routes_test, bad_workspace_id_is_400_on_every_workspace_route) {
    const std::string expected =
        R"({"error":{"code":"invalid_workspace","message":"invalid workspace id '.hidden': starts with '.'","param":"path","type":"invalid_request_error"}})";
    size_t n = 0;
    for (const route & r : router_->routes()) {
        if (r.pattern.find("{id}") == std::string::npos) continue;
        std::string path = r.pattern;
        path.replace(path.find("{id}"), 4, ".hidden");
        if (size_t s = path.find("{segment}"); s != std::string::npos) path.replace(s, 9, "a/b");
        http_response res = call(r.method, path, "{}");
        EXPECT_EQ(res.status, 400) << r.method << " " << r.pattern;
        EXPECT_EQ(res.body, expected) << r.method << " " << r.pattern;
        ++n;
    }
    EXPECT_EQ(n, 16u);  // every workspace route but the list
    EXPECT_EQ(parse(call("GET", "/v1/workspaces/a%20b/manifest"))["error"]["code"], "invalid_workspace");
    EXPECT_EQ(call("GET", "/v1/workspaces/" + std::string(65, 'w') + "/segments").status, 400);

    http_response seg = call("PUT", "/v1/workspaces/ok/segments/a/../c", R"({"kind":"system","content":"x"})");
    EXPECT_EQ(seg.status, 400);
    EXPECT_EQ(parse(seg)["error"]["code"], "invalid_segment_id");
    EXPECT_EQ(parse(seg)["error"]["param"], "path");
    http_response seg8 = call("GET", "/v1/workspaces/ok/segments/caf\xC3\x28");
    EXPECT_EQ(seg8.body,
              R"({"error":{"code":"invalid_segment_id","message":"segment id is not valid UTF-8","param":"path","type":"invalid_request_error"}})");
}

TEST_F(routes_test, bad_bodies_are_400_exactly_as_before) {
    const std::vector<std::string> bodies = {
        "{\"messages\": [}",
        "",
        "{\"a\": 1} trailing",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"caf\xC3\x28 \xFF\"}]}",  // not UTF-8
        R"({"messages": [{"role": "user", "content": "\ud800"}]})",                   // a lone surrogate escape
        std::string(101, '[') + std::string(101, ']'),                                // one level too deep
        R"({"tools": )" + std::string(100000, '[') + "}",
    };
    const std::vector<std::pair<std::string, std::string>> routes = {
        {"POST", "/v1/chat/completions"},
        {"POST", "/v1/completions"},
        {"PUT", "/v1/workspaces/w/segments/s"},
        {"POST", "/v1/workspaces/w/chat/completions"},
        {"POST", "/v1/workspaces/w/branch"},
    };
    for (const auto & [method, path] : routes) {
        for (const std::string & body : bodies) {
            const api_error want = old_body_error(body);
            http_response res = call(method, path, body);
            EXPECT_EQ(res.status, 400) << method << " " << path << " " << body.substr(0, 40);
            EXPECT_EQ(res.body, want.body()) << method << " " << path;
        }
    }
    EXPECT_EQ(old_body_error(bodies[3]).code, "invalid_utf8");
    EXPECT_EQ(old_body_error(bodies[5]).code, "invalid_json");
}

// The branch route read its body with nlohmann's own parser, past the UTF-8 and depth
// guards; it now reads it as every route does.
TEST_F(routes_test, branch_refuses_an_8_MiB_nesting_bomb_quickly) {
    const std::string bomb(8u << 20, '[');
    auto t0 = std::chrono::steady_clock::now();
    http_response res = call("POST", "/v1/workspaces/w1/branch", bomb);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(res.status, 400);
    EXPECT_EQ(parse(res)["error"]["code"], "invalid_json");
    EXPECT_EQ(parse(res)["error"]["message"], "request body nests arrays/objects deeper than 100 levels");
    EXPECT_LT(s, 2.0);
    // A valid body of the wrong shape is still the branch route's own 400.
    http_response shape = call("POST", "/v1/workspaces/w1/branch", R"({"to": 3})");
    EXPECT_EQ(shape.status, 400);
    EXPECT_EQ(parse(shape)["error"]["code"], "invalid_request");
    http_response to = call("POST", "/v1/workspaces/w1/branch", R"({"to": "../x"})");
    EXPECT_EQ(to.status, 400);
    EXPECT_EQ(parse(to)["error"]["param"], "to");
}

TEST_F(routes_test, unknown_route_and_wrong_method) {
    http_response none = call("GET", "/v1/nothing-here");
    EXPECT_EQ(none.status, 404);
    EXPECT_EQ(none.body, not_found_route("no route GET /v1/nothing-here").body());
    http_response wrong = call("POST", "/v1/workspaces/w/segments/a");
    EXPECT_EQ(wrong.status, 405);
    EXPECT_EQ(wrong.header("Allow"), "PUT, GET, DELETE");
    EXPECT_EQ(parse(wrong)["error"]["code"], "method_not_allowed");
    EXPECT_EQ(count("unmatched", 404), 1u);
    EXPECT_EQ(count("/v1/workspaces/{id}/segments/{segment}", 405), 1u);

    http_response too_big;  // what the transport answers itself
    too_big.status = 413;
    router_->unmatched(request("POST", "/v1/chat/completions"), too_big);
    EXPECT_EQ(too_big.status, 413);
    EXPECT_EQ(parse(too_big)["error"]["code"], "payload_too_large");
}

TEST_F(routes_test, workspace_chat_checks_before_the_engine) {
    // No stored segments: 404, naming what to do.
    http_response none = call("POST", "/v1/workspaces/w/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})");
    EXPECT_EQ(none.status, 404);
    EXPECT_NE(parse(none)["error"]["message"].get<std::string>().find("PUT /v1/workspaces/{id}/segments/{segment}"),
              std::string::npos);
    ASSERT_EQ(put("w", "rules", {{"kind", "instructions"}, {"content", "r"}}).status, 201);
    http_response other = call("POST", "/v1/workspaces/w/chat/completions",
                               R"({"workspace": "v", "messages": [{"role": "user", "content": "hi"}]})");
    EXPECT_EQ(other.status, 400);
    EXPECT_EQ(parse(other)["error"]["code"], "invalid_workspace");
    EXPECT_EQ(parse(other)["error"]["param"], "workspace");
    // A body segment with a stored id replaces it (no duplicate-id 400): the request
    // passes validation and reaches for the engine, of which this test has none.
    http_response replaced = call("POST", "/v1/workspaces/w/chat/completions",
                                  R"({"segments": [{"id": "rules", "kind": "instructions", "content": "s"}]})");
    EXPECT_EQ(replaced.status, 503) << replaced.body;
    EXPECT_EQ(ctx_->store.get("w", "rules")->content, "r");  // the store is unchanged
}

// The server's request bounds (server_options::bounds) hold on every chat route, before
// the engine: a request over one is a 400 naming it, one within them reaches for the
// engine (503 here, with none).
// What bodies become as parsed JSON is bounded across all requests at once: a body that
// would take more than max_body_json_bytes alone is 413 before it is parsed; one that
// would pass what is left of max_json_bytes_in_flight (others' bodies still held) is 503
// with Retry-After; once they are gone it is read. 24 bodies of [{},{},...] at once
// aborted the server (std::bad_alloc inside the JSON value's destructor).
TEST(routes_bounds_test, parsed_bodies_are_bounded_across_requests) {
    server_options o;
    o.log_requests = false;
    o.max_body_json_bytes = 4u << 20;
    o.max_json_bytes_in_flight = 6u << 20;
    route_context ctx(nullptr, o);
    router r(ctx);
    auto body_of = [](int n) {  // a chat with an unknown field of n empty objects
        std::string b = R"({"messages":[{"role":"user","content":"hi"}],"junk":[)";
        for (int i = 0; i < n; ++i) b += i ? ",{}" : "{}";
        return b + "]}";
    };
    const std::string empties = body_of(40000), bigger = body_of(80000);
    ASSERT_LT(json_parsed_bytes_estimate(empties), o.max_body_json_bytes);
    ASSERT_GT(json_parsed_bytes_estimate(empties), 3u << 20);
    ASSERT_GT(json_parsed_bytes_estimate(bigger), o.max_body_json_bytes);

    http_response too_big = r.handle(request("POST", "/v1/chat/completions", bigger));
    EXPECT_EQ(too_big.status, 413) << too_big.body;
    EXPECT_NE(json::parse(too_big.body)["error"]["message"].get<std::string>().find("as parsed JSON"), std::string::npos);
    {
        // Another request's body is held: what is left does not hold this one.
        json_budget::ticket other;
        ASSERT_TRUE(ctx.json_memory.take(3u << 20, other));
        http_response busy = r.handle(request("POST", "/v1/chat/completions", empties));
        EXPECT_EQ(busy.status, 503) << busy.body;
        bool retry_after = false;
        for (const auto & [k, v] : busy.headers) retry_after |= k == "Retry-After";
        EXPECT_TRUE(retry_after);
        // Every route that reads a body takes its share (the Messages route too).
        http_response messages = r.handle(request("POST", "/v1/messages", empties));
        EXPECT_EQ(messages.status, 503) << messages.body;
    }
    // The other body is gone: read (then 503 only because this test has no engine), and
    // its share is given back once answered.
    http_response read = r.handle(request("POST", "/v1/chat/completions", empties));
    EXPECT_EQ(read.status, 503);
    EXPECT_EQ(json::parse(read.body)["error"]["message"].get<std::string>().find("large request bodies"), std::string::npos)
        << read.body;
    EXPECT_EQ(ctx.json_memory.used(), 0u);
}

// Schemas that cost the converter or the sampler without bound: an object with more
// optional properties than max_optional_properties (3,000 took 53 s to convert), more
// anyOf/oneOf alternatives than max_schema_alternatives over the request (3,000 took
// 19 s for four tokens on the engine thread). Refused before the grammar is built.
TEST(routes_bounds_test, schemas_the_grammar_cannot_afford_are_refused) {
    server_options o;
    o.log_requests = false;
    o.bounds.max_optional_properties = 4;
    o.bounds.max_schema_alternatives = 3;
    route_context ctx(nullptr, o);
    router r(ctx);
    auto post = [&](const json & schema) {
        json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                     {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}};
        return r.handle(request("POST", "/v1/chat/completions", body.dump()));
    };
    auto code = [](const http_response & res) { return json::parse(res.body)["error"]["code"].get<std::string>(); };
    json props = json::object();
    for (int i = 0; i < 6; ++i) props["p" + std::to_string(i)] = {{"type", "string"}};
    http_response optional = post({{"type", "object"}, {"properties", props}});
    EXPECT_EQ(optional.status, 400) << optional.body;
    EXPECT_EQ(code(optional), "too_many_optional_properties");
    // Required ones cost the converter nothing more: 6 properties, 2 optional.
    http_response required = post({{"type", "object"}, {"properties", props}, {"required", {"p0", "p1", "p2", "p3"}}});
    EXPECT_EQ(required.status, 503) << required.body;  // past the bounds: no engine here
    json alts = json::array();
    for (int i = 0; i < 2; ++i) alts.push_back({{"type", "integer"}});
    http_response two = post({{"anyOf", alts}, {"properties", {{"a", {{"oneOf", alts}}}}}, {"required", {"a"}}});
    EXPECT_EQ(two.status, 400) << two.body;  // 2 + 2 alternatives over the request
    EXPECT_EQ(code(two), "too_many_alternatives");
    EXPECT_EQ(post({{"anyOf", alts}}).status, 503);
}

// The converter's work is estimated before it runs: every object schema counts its
// properties plus its optional ones squared, over the request (48 objects of 128 optional
// properties took about a second on 2 cores, each alone within max_optional_properties).
TEST(routes_bounds_test, schemas_whose_grammar_would_cost_the_converter_too_much_are_refused) {
    server_options o;
    o.log_requests = false;
    o.bounds.max_schema_cost = 100;
    route_context ctx(nullptr, o);
    router r(ctx);
    auto object = [](int n, int n_required) {
        json props = json::object(), required = json::array();
        for (int i = 0; i < n; ++i) props["p" + std::to_string(i)] = {{"type", "string"}};
        for (int i = 0; i < n_required; ++i) required.push_back("p" + std::to_string(i));
        return json{{"type", "object"}, {"properties", props}, {"required", required}};
    };
    auto post = [&](const json & schema) {
        json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                     {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}};
        return r.handle(request("POST", "/v1/chat/completions", body.dump()));
    };
    // 10 properties, 9 optional: 10 + 81 = 91; two of them nested: 2 + 182 = 184.
    EXPECT_EQ(post(object(10, 1)).status, 503);  // past the bounds: no engine here
    json two = {{"type", "object"},
                {"properties", {{"a", object(10, 1)}, {"b", object(10, 1)}}},
                {"required", {"a", "b"}}};
    http_response res = post(two);
    EXPECT_EQ(res.status, 400) << res.body;
    EXPECT_EQ(json::parse(res.body)["error"]["code"], "schema_too_costly");
    EXPECT_NE(json::parse(res.body)["error"]["message"].get<std::string>().find("--max-schema-cost"), std::string::npos);
    // Required properties count once each: 40 of them, none optional.
    EXPECT_EQ(post(object(40, 40)).status, 503);
    // The tools' schemas too.
    json tools = json::array();
    for (int i = 0; i < 2; ++i)
        tools.push_back({{"type", "function"}, {"function", {{"name", "f" + std::to_string(i)}, {"parameters", object(10, 1)}}}});
    json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"tools", tools}};
    http_response t = r.handle(request("POST", "/v1/chat/completions", body.dump()));
    EXPECT_EQ(t.status, 400) << t.body;
    EXPECT_EQ(json::parse(t.body)["error"]["code"], "schema_too_costly");
}

// Without a key, a body that is not application/json is refused (a page of any origin can
// send one) - but on Ollama's routes a request with no Origin (curl -d, as Ollama's own
// documentation sends it; no browser) is read as JSON. Errors there are Ollama's shape.
TEST(routes_ollama_test, a_form_body_without_an_origin_is_read_as_json_on_ollamas_routes_only) {
    server_options o;
    o.log_requests = false;
    route_context ctx(nullptr, o);
    router r(ctx);
    auto post = [&](const std::string & path, const std::string & origin) {
        http_request q = request("POST", path, R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
        q.content_type = "application/x-www-form-urlencoded";
        q.has_body = true;
        q.origin = origin;
        return r.handle(q);
    };
    http_response ollama = post("/api/chat", "");
    EXPECT_EQ(ollama.status, 503) << ollama.body;  // read, mapped, then no engine here
    EXPECT_TRUE(json::parse(ollama.body)["error"].is_string()) << ollama.body;  // {"error": message}
    EXPECT_EQ(post("/api/chat", "http://evil.example").status, 415);
    EXPECT_EQ(post("/v1/chat/completions", "").status, 415);
}

TEST(routes_bounds_test, the_servers_bounds_hold_on_every_chat_route_before_the_engine) {
    server_options o;
    o.log_requests = false;
    o.bounds.max_tools = 2;
    o.bounds.max_messages = 3;
    route_context ctx(nullptr, o);
    router r(ctx);
    auto post = [&](const std::string & path, const json & body) {
        return r.handle(request("POST", path, body.dump()));
    };
    auto code = [](const http_response & res) { return json::parse(res.body)["error"]["code"].get<std::string>(); };
    json tools = json::array();
    for (int i = 0; i < 3; ++i) tools.push_back({{"type", "function"}, {"function", {{"name", "f" + std::to_string(i)}}}});
    const json user = json::array({{{"role", "user"}, {"content", "hi"}}});

    http_response many = post("/v1/chat/completions", {{"messages", user}, {"tools", tools}});
    EXPECT_EQ(many.status, 400) << many.body;
    EXPECT_EQ(code(many), "too_many_tools");
    json two = tools;
    two.erase(two.begin());
    EXPECT_EQ(post("/v1/chat/completions", {{"messages", user}, {"tools", two}}).status, 503);

    json msgs = json::array();
    for (int i = 0; i < 4; ++i) msgs.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "m"}});
    http_response long_chat = post("/v1/chat/completions", {{"messages", msgs}});
    EXPECT_EQ(long_chat.status, 400);
    EXPECT_EQ(code(long_chat), "too_many_messages");

    // Responses: a namespace's tools count one by one.
    json ns = json::array({{{"type", "namespace"}, {"name", "n"},
                            {"tools", json::array({{{"type", "function"}, {"name", "a"}},
                                                   {{"type", "function"}, {"name", "b"}},
                                                   {{"type", "function"}, {"name", "c"}}})}}});
    http_response resp = post("/v1/responses", {{"input", "hi"}, {"tools", ns}});
    EXPECT_EQ(resp.status, 400) << resp.body;
    EXPECT_EQ(code(resp), "too_many_tools");
    EXPECT_EQ(json::parse(resp.body)["error"]["param"], "tools");

    // A stored tools segment: checked after the merge.
    ASSERT_EQ(r.handle(request("PUT", "/v1/workspaces/w/segments/tools",
                               json{{"kind", "tools"}, {"content", tools.dump()}}.dump()))
                  .status,
              201);
    http_response stored = post("/v1/workspaces/w/chat/completions", {{"messages", user}});
    EXPECT_EQ(stored.status, 400) << stored.body;
    EXPECT_EQ(code(stored), "too_many_tools");
}

class routes_auth_test : public routes_test {
  protected:
    routes_auth_test() : routes_test("s3cret-key") {}
};

TEST_F(routes_auth_test, missing_or_wrong_api_key_is_401) {
    const std::string expected = unauthorized("missing or wrong API key: send \"Authorization: Bearer <key>\"").body();
    http_response missing = call("GET", "/v1/workspaces");
    EXPECT_EQ(missing.status, 401);
    EXPECT_EQ(missing.body, expected);
    EXPECT_EQ(parse(missing)["error"]["type"], "authentication_error");
    for (const char * h : {"Bearer wrong-key!", "Bearer s3cret-ke", "s3cret-key", "Basic s3cret-key"}) {
        http_request r = request("PUT", "/v1/workspaces/w/segments/s", R"({"kind":"system","content":"x"})");
        r.authorization = h;
        http_response res = router_->handle(r);
        EXPECT_EQ(res.status, 401) << h;
        EXPECT_EQ(res.body, expected) << h;
    }
    EXPECT_FALSE(ctx_->store.get("w", "s"));  // refused before the handler ran
    EXPECT_EQ(count("/v1/workspaces/{id}/segments/{segment}", 401), 4u);

    http_request ok = request("GET", "/v1/workspaces");
    ok.authorization = "bearer   s3cret-key";  // the scheme in any case, spaces after it
    EXPECT_EQ(router_->handle(ok).status, 200);
    EXPECT_EQ(call("GET", "/health").status, 200);  // never needs the key
    EXPECT_TRUE(authorized("", ""));
    EXPECT_FALSE(authorized("Bearer ", "k"));
}

// Anthropic's clients send the key as x-api-key; the Messages routes refuse in Anthropic's
// error shape; GET / answers without the key.
TEST_F(routes_auth_test, x_api_key_and_the_messages_routes_error_shape) {
    http_request with_key = request("GET", "/v1/workspaces");
    with_key.api_key = "s3cret-key";
    EXPECT_EQ(router_->handle(with_key).status, 200);
    with_key.api_key = "s3cret-ke";
    EXPECT_EQ(router_->handle(with_key).status, 401);

    http_response m = call("POST", "/v1/messages", R"({"model":"m","max_tokens":1,"messages":[]})");
    EXPECT_EQ(m.status, 401);
    json j = parse(m);
    EXPECT_EQ(j["type"], "error");
    EXPECT_EQ(j["error"]["type"], "authentication_error");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("x-api-key"), std::string::npos);
    EXPECT_EQ(call("POST", "/v1/messages/count_tokens", "{}").status, 401);
    http_response root = call("GET", "/");
    EXPECT_EQ(root.status, 200) << root.body;
    EXPECT_EQ(parse(root)["status"], "ok");
}

// A Messages request refused before the engine: Anthropic's shape, the field named.
TEST_F(routes_test, messages_refusals_are_in_anthropics_shape) {
    http_response r = call("POST", "/v1/messages", R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
    EXPECT_EQ(r.status, 400);
    json j = parse(r);
    EXPECT_EQ(j["type"], "error");
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos);
    http_response bad = call("POST", "/v1/messages", "{not json");
    EXPECT_EQ(bad.status, 400);
    EXPECT_EQ(parse(bad)["error"]["type"], "invalid_request_error");
}

TEST(routes_log_test, one_line_per_request_with_the_error_code) {
    server_options o;
    o.log_requests = true;
    route_context ctx(nullptr, o);
    router rt(ctx);
    ::testing::internal::CaptureStderr();
    http_response res = rt.handle(request("PUT", "/v1/workspaces/logged/segments/s", "{oops"));
    std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(res.status, 400);
    ASSERT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    json line = json::parse(err);
    EXPECT_EQ(line["method"], "PUT");
    EXPECT_EQ(line["route"], "/v1/workspaces/{id}/segments/{segment}");
    EXPECT_EQ(line["status"], 400);
    EXPECT_EQ(line["workspace"], "logged");
    EXPECT_EQ(line["error"], "invalid_json");
    for (const char * f : {"prompt_tokens", "tokens_reused", "tokens_prefilled", "completion_tokens", "ttft_ms"})
        EXPECT_TRUE(line[f].is_null()) << f;
    EXPECT_TRUE(line["duration_ms"].is_number());
    EXPECT_TRUE(line["ts"].is_string());
    EXPECT_FALSE(line.contains("path")) << "a matched route's pattern says it";
    // A request no route matches: its path, in the line (the route label stays bounded).
    ::testing::internal::CaptureStderr();
    http_response none;
    none.status = 404;
    rt.unmatched(request("GET", "/v1/no-such/thing"), none);
    line = json::parse(::testing::internal::GetCapturedStderr());
    EXPECT_EQ(line["route"], "unmatched");
    EXPECT_EQ(line["status"], 404);
    EXPECT_EQ(line["path"], "/v1/no-such/thing");
}

// The router while the model loads: /health and /metrics answer, everything else is
// 503 "loading" before its handler (or its body) is reached; the key still comes first
// for nothing, since loading answers first.
TEST(routes_loading_test, only_health_and_metrics_answer_while_loading) {
    server_options o;
    o.log_requests = false;
    route_context ctx(o);  // loading until attach()
    router r(ctx);
    ASSERT_TRUE(ctx.loading());
    http_response health = r.handle(request("GET", "/health"));
    EXPECT_EQ(health.status, 503);
    EXPECT_EQ(json::parse(health.body)["status"], "loading");
    EXPECT_EQ(health.header("Retry-After"), "1");
    EXPECT_EQ(r.handle(request("GET", "/metrics")).status, 200);
    for (auto [method, path] : {std::pair{"POST", "/v1/chat/completions"}, {"GET", "/v1/models"},
                                {"PUT", "/v1/workspaces/w/segments/s"}, {"GET", "/v1/workspaces"}}) {
        http_response res = r.handle(request(method, path, R"({"kind":"instructions","content":"x"})"));
        EXPECT_EQ(res.status, 503) << method << " " << path;
        EXPECT_EQ(json::parse(res.body)["error"]["code"], "loading") << res.body;
        EXPECT_EQ(res.header("Retry-After"), "1");
    }
    EXPECT_EQ(ctx.store.n_segments(), 0u);  // the PUT never ran
    // The transport's question before it reads a body gets the same answer.
    http_response early;
    EXPECT_TRUE(r.refuse_early(r.routes()[2], request("POST", "/v1/chat/completions"), early));
    EXPECT_EQ(early.status, 503);
}

// CORS off: OPTIONS is 405 with Allow, no Access-Control-* header anywhere.
TEST_F(routes_test, cors_off_by_default) {
    http_request pre = request("OPTIONS", "/v1/chat/completions");
    pre.origin = "http://app.test";
    http_response res = router_->handle(pre);
    EXPECT_EQ(res.status, 405);
    EXPECT_EQ(res.header("Allow"), "POST");
    EXPECT_EQ(res.header("Access-Control-Allow-Origin"), "");
    http_request get = request("GET", "/health");
    get.origin = "http://app.test";
    EXPECT_EQ(router_->handle(get).header("Access-Control-Allow-Origin"), "");
}

TEST(routes_cors_test, preflight_and_response_headers) {
    server_options o;
    o.log_requests = false;
    o.api_key = "k";
    o.cors_origin = " http://a.test ,http://b.test";
    route_context ctx(nullptr, o);
    router r(ctx);
    http_request pre = request("OPTIONS", "/v1/workspaces/w/segments/s");
    pre.origin = "http://b.test";
    http_response res = r.handle(pre);
    EXPECT_EQ(res.status, 204);
    EXPECT_EQ(res.header("Access-Control-Allow-Origin"), "http://b.test");
    EXPECT_EQ(res.header("Access-Control-Allow-Methods"), "PUT, GET, DELETE, OPTIONS");
    EXPECT_EQ(res.header("Access-Control-Allow-Headers"), "Authorization, Content-Type");
    EXPECT_EQ(res.header("Access-Control-Max-Age"), "600");
    pre.cors_request_headers = "authorization,x-custom";
    EXPECT_EQ(r.handle(pre).header("Access-Control-Allow-Headers"), "authorization,x-custom");
    // An unknown path or another origin: no preflight.
    http_request nowhere = request("OPTIONS", "/nowhere");
    nowhere.origin = "http://a.test";
    EXPECT_EQ(r.handle(nowhere).status, 404);
    pre.origin = "http://c.test";
    EXPECT_EQ(r.handle(pre).status, 405);
    // Every answer to an allowed origin carries it, a 401 included.
    http_request get = request("GET", "/v1/workspaces");
    get.origin = "http://a.test";
    http_response denied = r.handle(get);
    EXPECT_EQ(denied.status, 401);
    EXPECT_EQ(denied.header("Access-Control-Allow-Origin"), "http://a.test");
    EXPECT_EQ(denied.header("Vary"), "Origin");
    get.authorization = "Bearer k";
    EXPECT_EQ(r.handle(get).header("Access-Control-Allow-Origin"), "http://a.test");
    get.origin = "http://c.test";
    EXPECT_EQ(r.handle(get).header("Access-Control-Allow-Origin"), "");
}

}  // namespace
}  // namespace warmctx::server_detail
