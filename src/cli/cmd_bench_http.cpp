// warmctx-bench http - the server's own overhead per request next to the engine's
// time, and throughput with 1, 4 and 16 concurrent clients, over loopback.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli.h"
#include "util/json.h"
#include "warmctx/scheduler.h"
#include "warmctx/server.h"

namespace warmctx::cli {
namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;

struct http_bench_args {
    model_flags mf;
    std::vector<int> clients = {1, 4, 16};
    int requests_per_client = 8;
    int max_tokens = 8;
    uint32_t parallel = 4;
    bool json_out = false;
};

double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(p * (double)(v.size() - 1) + 0.5))];
}

int run_http_bench(http_bench_args a) {
    auto eo = a.mf.to_options(1);
    if (!eo) return fail(eo.error());
    scheduler_options so;
    so.engine.engine = *eo;
    so.engine.n_holders = 4;
    so.n_parallel = a.parallel;
    so.max_queue = 256;
    auto s = scheduler::start(so);
    if (!s) return fail(s.error());
    server_options sv;
    sv.port = 0;
    sv.log_requests = false;
    sv.max_queue = so.max_queue;  // n_http_threads 0: parallel + queue + headroom
    auto h = http_server::start(**s, sv);
    if (!h) return fail(h.error());
    const int port = (*h)->port();
    const std::string system = "You are a careful coding agent. Follow the repository rules. "
                               "Prefer small changes and run the tests after each one.";
    auto one_request = [&](httplib::Client & c, int k, double & wall_ms, double & engine_ms, int & completion) -> bool {
        json body = {
            {"model", "warmctx"},
            {"max_tokens", a.max_tokens},
            {"temperature", 0},
            {"messages", json::array({json{{"role", "system"}, {"content", system}},
                                      json{{"role", "user"}, {"content", "question number " + std::to_string(k)}}})}};
        auto t0 = clock_type::now();
        auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
        wall_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
        if (!r || r->status != 200) return false;
        auto j = parse_json(r->body);
        if (!j) return false;
        engine_ms = (*j)["warmctx"].value("total_ms", 0.0);
        completion = (*j)["usage"].value("completion_tokens", 0);
        return true;
    };
    {  // warm-up: model buffers and the shared system prompt's KV
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(600, 0);
        double w, e;
        int n;
        one_request(c, -1, w, e, n);
    }
    json rows = json::array();
    for (int n_clients : a.clients) {
        std::mutex mu;
        std::vector<double> walls, engines, overheads;
        std::atomic<int> failures{0}, tokens{0};
        auto t0 = clock_type::now();
        std::vector<std::thread> threads;
        for (int c = 0; c < n_clients; ++c) {
            threads.emplace_back([&, c] {
                httplib::Client cl("127.0.0.1", port);
                cl.set_read_timeout(600, 0);
                for (int i = 0; i < a.requests_per_client; ++i) {
                    double w = 0, e = 0;
                    int n = 0;
                    if (!one_request(cl, c * 1000 + i, w, e, n)) { failures++; continue; }
                    tokens += n;
                    std::lock_guard<std::mutex> lk(mu);
                    walls.push_back(w);
                    engines.push_back(e);
                    overheads.push_back(w - e);
                }
            });
        }
        for (auto & t : threads) t.join();
        const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
        rows.push_back({{"clients", n_clients},
                        {"requests", (int)walls.size()},
                        {"failures", failures.load()},
                        {"seconds", secs},
                        {"requests_per_s", (double)walls.size() / secs},
                        {"completion_tokens_per_s", tokens.load() / secs},
                        {"latency_ms_p50", pct(walls, 0.5)},
                        {"latency_ms_p95", pct(walls, 0.95)},
                        {"engine_ms_p50", pct(engines, 0.5)},
                        {"server_overhead_ms_p50", pct(overheads, 0.5)},
                        {"server_overhead_ms_p95", pct(overheads, 0.95)}});
        progress(std::to_string(n_clients) + " clients: " + std::to_string(walls.size()) + " requests in " +
                 std::to_string(secs) + " s");
    }
    auto st = (*s)->stats();
    (*h)->stop();
    (*s)->stop();
    json j = {{"model", eo->model_path}, {"parallel", a.parallel}, {"max_tokens", a.max_tokens},
              {"requests_per_client", a.requests_per_client}, {"batched_steps", st.n_batched_steps},
              {"note", "engine_ms is submit..done inside the server; overhead = client wall time - engine_ms "
                       "(HTTP, JSON, queue hand-off)"},
              {"rows", rows}};
    if (a.json_out) { std::printf("%s\n", j.dump(2).c_str()); return 0; }
    std::printf("%8s %9s %10s %12s %12s %12s %14s\n", "clients", "req/s", "tok/s", "p50 ms", "p95 ms", "engine p50",
                "overhead p50");
    for (const auto & r : rows)
        std::printf("%8d %9.2f %10.1f %12.1f %12.1f %12.1f %14.2f\n", r["clients"].get<int>(),
                    r["requests_per_s"].get<double>(), r["completion_tokens_per_s"].get<double>(),
                    r["latency_ms_p50"].get<double>(), r["latency_ms_p95"].get<double>(),
                    r["engine_ms_p50"].get<double>(), r["server_overhead_ms_p50"].get<double>());
    return 0;
}

}  // namespace

void register_http_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<http_bench_args>();
    auto * c =
        bench.add_subcommand("http", "server overhead per request and throughput with concurrent clients (loopback)");
    a->mf.add_to(*c);
    c->add_option("--clients", a->clients, "concurrent clients per round")->delimiter(',')->capture_default_str();
    c->add_option("--requests", a->requests_per_client, "requests per client")
        ->capture_default_str()
        ->check(CLI::Range(1, 100000));
    c->add_option("-n,--max-tokens", a->max_tokens, "tokens per completion")
        ->capture_default_str()
        ->check(CLI::Range(1, 4096));
    c->add_option("--parallel", a->parallel, "work sequences (jobs decoded at once)")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_http_bench(*a); });
}

}  // namespace warmctx::cli
