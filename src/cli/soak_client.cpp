// warmctx-bench soak's clients: the request mix, and each request's expected status.
//
// Each client owns some state so that every request's expected status is known
// exactly: its own workspace in the workspace API (stored or not, with a turn or not),
// which it alone changes. Everything else it sends is shared: the agent set-ups'
// system prompts (derived workspaces) and the `segments` workspaces.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "bench_harness.h"
#include "soak_client.h"
#include "soak_verdict.h"
#include "sse_reader.h"
#include "util/clock.h"
#include "util/json.h"
#include "warmctx/scheduler.h"
#include "warmctx/server.h"

namespace warmctx::cli::soak {

std::string code_text(uint64_t salt, int n_tokens) {
    std::string s;
    const int lines = std::max(1, n_tokens / 14);
    for (int i = 0; i < lines; ++i)
        s += "    int v" + std::to_string(i) + " = step_" + std::to_string((salt * 7919 + (uint64_t)i) % 10007) + "(v" +
             std::to_string(i > 0 ? i - 1 : 0) + ", " + std::to_string((salt + (uint64_t)i * 31) % 997) + ");\n";
    return s;
}

namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;

// --- content -------------------------------------------------------------------------


std::string system_prompt(int setup) {
    std::string s = "You are coding agent number " + std::to_string(setup) +
                    ". Follow the repository rules, prefer small changes, run the tests after each one, and say "
                    "what you changed and why.\n";
    for (int i = 0; i < 8; ++i)
        s += "Rule " + std::to_string(i + 1) + " of set " + std::to_string(setup) +
             ": keep functions short, name what they count, check every status, never swallow an error.\n";
    return s;
}

json tools_for(int setup) {
    return json::array(
        {json{{"type", "function"},
              {"function",
               {{"name", "run_tests_" + std::to_string(setup)},
                {"description", "Runs the test suite and returns its output."},
                {"parameters",
                 {{"type", "object"},
                  {"properties", {{"filter", {{"type", "string"}, {"description", "a test name pattern"}}}}},
                  {"required", json::array()}}}}}}});
}

json msg(const std::string & role, std::string content) { return {{"role", role}, {"content", std::move(content)}}; }
json seg(const std::string & id, const std::string & kind, std::string content) {
    return {{"id", id}, {"kind", kind}, {"content", std::move(content)}};
}

// --- one client ----------------------------------------------------------------------

class soak_client {
  public:
    soak_client(int id, int port, const soak_args & a, const std::vector<std::string> & large_files)
        : id_(id), port_(port), a_(a), large_files_(large_files), rng_(a.seed * 1000003 + (uint64_t)id),
          http_("127.0.0.1", port), own_ws_("soak-own-" + std::to_string(id)) {
        http_.set_keep_alive(id % 2 == 0);  // half keep their connection, half open one per request
        http_.set_read_timeout(600, 0);
        http_.set_write_timeout(60, 0);
        http_.set_connection_timeout(30, 0);
    }

    void run(clock_type::time_point deadline, client_tally & out) {
        std::discrete_distribution<int> pick(std::begin(k_weights), std::end(k_weights));
        std::uniform_int_distribution<int> think(0, std::max(0, a_.think_ms));
        while (clock_type::now() < deadline) {
            const auto t = (req_type)pick(rng_);
            one(t, out);
            if (a_.think_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(think(rng_)));
        }
    }

  private:
    int id_, port_;
    const soak_args & a_;
    const std::vector<std::string> & large_files_;
    std::mt19937_64 rng_;
    httplib::Client http_;
    std::string own_ws_;
    bool base_stored_ = false;  // own workspace holds rules, src/map.txt and summary
    bool diff_stored_ = false;  // ... and a diff
    bool had_turn_ = false;  // own workspace has had a chat turn since it was (re)created
    uint64_t n_sent_ = 0;

    int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
    bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

    std::string question() {
        return "Question " + std::to_string(id_) + "." + std::to_string(n_sent_) + ": why does test_" +
               std::to_string(uniform(0, 400)) + " fail after the change to step_" + std::to_string(uniform(0, 10000)) +
               "?";
    }

    json sampling(json body, int max_lo = 4, int max_hi = 24) {
        body["max_tokens"] = uniform(max_lo, max_hi);
        if (coin(0.7)) {
            body["temperature"] = 0;
        } else {
            body["temperature"] = 0.8;
            body["top_p"] = 0.9;
            body["seed"] = uniform(0, 1 << 20);
        }
        return body;
    }

    json agent_chat_body() {
        const int setup = uniform(0, a_.setups - 1);
        json messages = json::array({msg("system", system_prompt(setup))});
        const int turns = uniform(0, 3);
        for (int i = 0; i < turns; ++i) {
            messages.push_back(
                msg("user", "Earlier question " + std::to_string(i) + " of set-up " + std::to_string(setup)));
            messages.push_back(msg(
                "assistant", "Earlier answer " + std::to_string(i) + ": I changed step_" + std::to_string(i) + "."));
        }
        messages.push_back(msg("user", question()));
        json body = {{"messages", std::move(messages)}};
        if (setup % 2 == 0) body["tools"] = tools_for(setup);
        return sampling(std::move(body));
    }

    json diff_segment() {
        return seg("diff", "diff",
                   "--- a/src/step.cc\n+++ b/src/step.cc\n@@ -" + std::to_string(uniform(1, 500)) +
                       " +1 @@\n-    return v;\n+    return v + " + std::to_string(uniform(0, 99999)) + ";\n");
    }

    json segments_chat_body() {
        const int k = uniform(0, a_.segment_workspaces - 1);
        json segs =
            json::array({seg("rules", "instructions",
                             "Workspace " + std::to_string(k) + " rules: always run ctest; keep commits small."),
                         seg("map", "repo_map", code_text(1000 + (uint64_t)k, 300)), diff_segment()});
        if (coin(0.5))
            segs.push_back(seg("t1", "test_output",
                               "1 test failed: test_" + std::to_string(uniform(0, 400)) + " (exit " +
                                   std::to_string(uniform(1, 3)) + ")"));
        json body = {{"workspace", "soak-seg-" + std::to_string(k)},
                     {"messages", json::array({msg("user", question())})},
                     {"segments", std::move(segs)}};
        return sampling(std::move(body));
    }

    // --- the transport ---

    // A plain request on the client's connection.
    outcome plain(const std::string & method, const std::string & path, const std::string & body = "") {
        outcome o;
        const auto t0 = clock_type::now();
        httplib::Result r = method == "GET"      ? http_.Get(path.c_str())
                            : method == "DELETE" ? http_.Delete(path.c_str())
                            : method == "PUT"    ? http_.Put(path.c_str(), body, "application/json")
                                                 : http_.Post(path.c_str(), body, "application/json");
        o.ms = ms_since(t0);
        if (!r) {
            o.conn_error = true;
            o.note = method + " " + path + ": " + httplib::to_string(r.error());
            return o;
        }
        o.status = r->status;
        if (o.status == 200 && path.find("completions") != std::string::npos) {
            auto j = parse_json(r->body);
            if (j && j->contains("usage")) o.prompt_tokens = (*j)["usage"].value("prompt_tokens", 0);
        }
        if (o.status != 200 && o.status != 201)
            o.note = method + " " + path + " -> " + std::to_string(o.status) + ": " + r->body.substr(0, 300);
        return o;
    }

    // A streamed POST read event by event; leaves after `leave_after` data events (0: reads to the end).
    outcome stream(const std::string & path, const json & body, int leave_after = 0) {
        outcome o;
        httplib::Client fresh("127.0.0.1", port_);  // leaving must close a connection of its own
        httplib::Client & c = leave_after > 0 ? fresh : http_;
        fresh.set_read_timeout(600, 0);
        httplib::Request req;
        req.method = "POST";
        req.path = path;
        req.body = body.dump();
        req.set_header("Content-Type", "application/json");
        std::string error_body;
        sse_reader events;
        int n_events = 0;
        bool done = false, left = false;
        req.response_handler = [&](const httplib::Response & r) {
            o.status = r.status;
            return true;
        };
        req.content_receiver = [&](const char * d, size_t n, uint64_t, uint64_t) {
            if (o.status != 200) {
                error_body.append(d, std::min(n, (size_t)300));
                return true;
            }
            return events.feed({d, n}, [&](const sse_event & ev) {
                if (ev.n_data_lines == 0) return true;
                const std::string & payload = ev.data;
                if (ev.done()) { done = true; return true; }
                auto j = parse_json(payload);
                if (!j) { o.stream_error = true; o.note = "unparsable event: " + payload.substr(0, 200); return true; }
                if (j->contains("error")) { o.stream_error = true; o.note = "error event: " + payload.substr(0, 300); }
                if (j->contains("usage") && (*j)["usage"].is_object())
                    o.prompt_tokens = (*j)["usage"].value("prompt_tokens", 0);
                if (leave_after > 0 && ++n_events >= leave_after) { left = true; return false; }
                return true;
            });
        };
        httplib::Response res;
        httplib::Error err = httplib::Error::Success;
        const auto t0 = clock_type::now();
        const bool sent = c.send(req, res, err);
        o.ms = ms_since(t0);
        if (left) {
            o.abandoned = true;
            return o;
        }
        if (!sent) {
            o.conn_error = true;
            o.note = "POST " + path + " (stream): " + httplib::to_string(err);
            return o;
        }
        if (o.status != 200) {
            o.note = "POST " + path + " (stream) -> " + std::to_string(o.status) + ": " + error_body;
        } else if (!done && !o.stream_error) {
            o.stream_error = true;
            o.note = "POST " + path + " (stream): ended without [DONE]";
        }
        return o;
    }

    outcome chat(const std::string & path, json body, bool streamed) {
        if (!streamed) return plain("POST", path, body.dump());
        body["stream"] = true;
        body["stream_options"] = {{"include_usage", true}};
        return stream(path, body);
    }

    // --- the request types ---

    void record(client_tally & out, req_type t, outcome o, int expect_lo, int expect_hi = 0) {
        if (expect_hi == 0) expect_hi = expect_lo;
        type_tally & tt = out.types[(int)t];
        tt.n++;
        if (o.conn_error) tt.conn_errors++;
        else if (o.abandoned) tt.abandoned++;
        if (o.status > 0) {
            tt.by_class[status_class(o.status)]++;
            tt.ms.push_back(o.ms);
            if (!o.abandoned && (o.status < expect_lo || o.status > expect_hi)) {
                o.unexpected = true;
                tt.unexpected++;
            }
        }
        if (o.stream_error) tt.stream_errors++;
        tt.max_prompt_tokens = std::max(tt.max_prompt_tokens, o.prompt_tokens);
        if ((o.conn_error || o.unexpected || o.stream_error || o.status >= 500) &&
            keep_failure(out.failures.size(), o.conn_error || o.stream_error))
            out.failures.push_back({{"type", k_type_names[(int)t]}, {"client", id_}, {"status", o.status},
                                    {"note", o.note}, {"broken", o.conn_error || o.stream_error}});
    }

    bool stored() const { return base_stored_ || diff_stored_; }  // the workspace exists

    void ensure_stored(client_tally & out) {
        if (base_stored_) return;
        const std::string base = "/v1/workspaces/" + own_ws_ + "/segments/";
        record(out, req_type::workspace_api,
               plain("PUT", base + "rules",
                     json{{"kind", "instructions"},
                          {"content", "Client " + std::to_string(id_) + " rules: run ctest first."}}
                         .dump()),
               201);
        record(
            out, req_type::workspace_api,
            plain("PUT", base + "src/map.txt",
                  json{{"kind", "repo_map"}, {"content", code_text(5000 + (uint64_t)id_, 400)}, {"path", "src/map.txt"}}
                      .dump()),
            201);
        record(out, req_type::workspace_api,
               plain("PUT", base + "summary",
                     json{{"kind", "task_summary"}, {"content", "Make test_" + std::to_string(id_) + " pass."}}.dump()),
               201);
        base_stored_ = true;
    }

    void workspace_op(client_tally & out) {
        const std::string ws = "/v1/workspaces/" + own_ws_;
        const int missing = 404;
        switch (uniform(0, 8)) {
        case 0: {  // a new diff (created or replaced)
            auto o = plain("PUT", ws + "/segments/diff",
                           json{{"kind", "diff"}, {"content", diff_segment()["content"]}}.dump());
            record(out, req_type::workspace_api, o, diff_stored_ ? 200 : 201);
            if (o.status / 100 == 2) diff_stored_ = true;
            break;
        }
        case 1: record(out, req_type::workspace_api, plain("GET", ws + "/segments"), stored() ? 200 : missing); break;
        case 2: record(out, req_type::workspace_api, plain("GET", ws + "/manifest"), stored() ? 200 : missing); break;
        case 3:
            record(out, req_type::workspace_api, plain("GET", ws + "/explain?question=what%20next"),
                   stored() ? 200 : missing);
            break;
        case 4: {
            record(out, req_type::workspace_api, plain("DELETE", ws + "/segments/diff"), diff_stored_ ? 200 : missing);
            diff_stored_ = false;
            break;
        }
        case 5: {  // pin then unpin (pins are counted; leave none behind)
            record(out, req_type::workspace_api, plain("POST", ws + "/pin"), had_turn_ ? 200 : missing);
            record(out, req_type::workspace_api, plain("POST", ws + "/unpin"), had_turn_ ? 200 : missing);
            break;
        }
        case 6: {  // branch, then drop the branch
            const std::string to = own_ws_ + "-branch";
            record(out, req_type::workspace_api, plain("POST", ws + "/branch", json{{"to", to}}.dump()),
                   had_turn_ ? 200 : missing);
            record(out, req_type::workspace_api, plain("DELETE", "/v1/workspaces/" + to), 200);
            break;
        }
        case 7: record(out, req_type::workspace_api, plain("GET", "/v1/workspaces"), 200); break;
        default: {  // drop the workspace now and then: store, history and cached KV
            if (!coin(0.3)) { record(out, req_type::workspace_api, plain("GET", ws), stored() ? 200 : missing); break; }
            record(out, req_type::workspace_api, plain("DELETE", ws), 200);
            base_stored_ = diff_stored_ = had_turn_ = false;
            break;
        }
        }
    }

    void bad_request(client_tally & out) {
        const std::string chat = "/v1/chat/completions";
        const json user = json::array({msg("user", "hi")});
        switch (uniform(0, 12)) {
            case 0:
                record(out, req_type::bad_request,
                       plain("POST", chat, "{\"messages\": [{\"role\": \"user\", \"content\": "), 400);
                break;
            case 1:
                record(out, req_type::bad_request,
                       plain("POST", chat, "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}"), 400);
                break;
            case 2:
                record(out, req_type::bad_request,
                       plain("POST", chat, json{{"messages", json::array({msg("wizard", "hi")})}}.dump()), 400);
                break;
            case 3:
                record(out, req_type::bad_request,
                       plain("POST", chat, json{{"workspace", "no spaces allowed"}, {"messages", user}}.dump()), 400);
                break;
            case 4:
                record(
                    out, req_type::bad_request,
                    plain("POST", chat,
                          json{{"messages", user}, {"segments", json::array({seg("u2", "user", "and this")})}}.dump()),
                    400);
                break;
            case 5:
                record(out, req_type::bad_request, plain("POST", chat, json{{"messages", user}, {"n", 2}}.dump()), 400);
                break;
            case 6:
                record(out, req_type::bad_request,
                       plain("POST", chat, json{{"messages", user}, {"temperature", -1}}.dump()), 400);
                break;
            case 7: {  // longer than the context: refused after assembly, before any prefill
                const int n = 2 * (int)a_.mf.n_ctx;  // tokens, by code_text's rough count
                record(out, req_type::bad_request,
                       plain("POST", chat,
                             json{{"messages", json::array({msg("system", code_text(77, n)), msg("user", "hi")})},
                                  {"max_tokens", 4}}
                                 .dump()),
                       400);
                break;
        }
        case 8:
            record(out, req_type::bad_request,
                   plain("PUT", "/v1/workspaces/" + own_ws_ + "/segments/q",
                         json{{"kind", "user"}, {"content", "stored question"}}.dump()),
                   400);
            break;
        case 9:
            record(out, req_type::bad_request, plain("GET", "/v1/workspaces/" + own_ws_ + "/segments/no-such-segment"),
                   404);
            break;
        case 10: record(out, req_type::bad_request, plain("GET", "/v1/no/such/route"), 404); break;
        case 11: record(out, req_type::bad_request, plain("DELETE", chat), 405); break;
        default:
            record(out, req_type::bad_request,
                   plain("POST", "/v1/completions", json{{"prompt", json::array({"a", "b"})}}.dump()), 400);
            break;
        }
    }

    void one(req_type t, client_tally & out) {
        ++n_sent_;
        switch (t) {
        case req_type::chat: record(out, t, chat("/v1/chat/completions", agent_chat_body(), false), 200); break;
        case req_type::chat_stream: record(out, t, chat("/v1/chat/completions", agent_chat_body(), true), 200); break;
        case req_type::chat_segments:
            record(out, t, chat("/v1/chat/completions", segments_chat_body(), coin(0.5)), 200);
            break;
        case req_type::workspace_chat: {
            ensure_stored(out);
            json body = sampling(json{{"messages", json::array({msg("user", question())})}});
            if (coin(0.5)) body["segments"] = json::array({diff_segment()});
            auto o = chat("/v1/workspaces/" + own_ws_ + "/chat/completions", std::move(body), coin(0.5));
            if (o.status == 200 && !o.stream_error) had_turn_ = true;
            record(out, t, std::move(o), 200);
            break;
        }
        case req_type::large_prompt: {
            // One of three shared files (cached across clients) or, one time in three, a new one.
            const bool fresh = coin(1.0 / 3);
            std::string file = fresh ? code_text(1000000 + (uint64_t)id_ * 100000 + n_sent_, a_.large_prompt_tokens)
                                     : large_files_[(size_t)uniform(0, (int)large_files_.size() - 1)];
            json body = {{"messages", json::array({msg("system", system_prompt(0)), msg("user", question())})},
                         {"segments", json::array({json{{"id", "src/big.cc"},
                                                        {"kind", "pinned_file"},
                                                        {"path", "src/big.cc"},
                                                        {"content", std::move(file)}}})}};
            record(out, t, chat("/v1/chat/completions", sampling(std::move(body), 4, 8), coin(0.5)), 200);
            break;
        }
        case req_type::abandoned: {
            json body = agent_chat_body();
            body["max_tokens"] = 64;
            if (coin(0.75)) {
                body["stream"] = true;
                record(out, t, stream("/v1/chat/completions", body, uniform(1, 3)), 200);
            } else {  // a client timeout: the server still runs it to its end, bounded by max_tokens
                httplib::Client c("127.0.0.1", port_);
                c.set_read_timeout(0, 50000);
                outcome o;
                const auto t0 = clock_type::now();
                auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
                o.ms = ms_since(t0);
                if (r) o.status = r->status;
                else if (r.error() == httplib::Error::Read) o.abandoned = true;
                else { o.conn_error = true; o.note = "timed-out chat: " + httplib::to_string(r.error()); }
                if (r && r->status != 200)
                    o.note = "timed-out chat -> " + std::to_string(r->status) + ": " + r->body.substr(0, 300);
                record(out, t, std::move(o), 200);
            }
            break;
        }
        case req_type::workspace_api: workspace_op(out); break;
        case req_type::bad_request: bad_request(out); break;
        case req_type::monitoring: {
            static const char * paths[] = {"/health", "/metrics", "/v1/models"};
            record(out, t, plain("GET", paths[uniform(0, 2)]), 200);
            break;
        }
        }
    }
};

}  // namespace

void run_client(int id, int port, const soak_args & a, const std::vector<std::string> & large_files,
                clock_type::time_point deadline, client_tally & out) {
    soak_client cl(id, port, a, large_files);
    cl.run(deadline, out);
}

}  // namespace warmctx::cli::soak
