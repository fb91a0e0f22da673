// warmctx-bench soak - many clients against an in-process server for a long time, with
// the mix of requests a server meets: chats streamed and not, clients that leave
// mid-answer, many workspaces (agent set-ups, the `segments` extension, the workspace
// API), a few prompts of thousands of tokens, and bad requests. It answers two
// questions: does any request get a 5xx (or lose its connection), and does the
// process's memory stay flat? Exit code 0 only when no request got a 5xx, none an
// answer other than the one it must get, none lost its connection, and RSS is flat
// (soak_verdict.h states the rule). The clients and their request mix are soak_client.h's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench_harness.h"
#include "cli.h"
#include "soak_client.h"
#include "soak_verdict.h"
#include "util/json.h"
#include "warmctx/scheduler.h"
#include "warmctx/server.h"

namespace warmctx::cli {
namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;
using namespace soak;

// --- the run -------------------------------------------------------------------------

json tally_json(const type_tally & t) {
    json classes = json::object();
    for (const char * c : {"2xx", "3xx", "4xx", "5xx", "other"})
        classes[c] = t.by_class.count(c) ? t.by_class.at(c) : 0;
    return {{"requests", t.n},
            {"by_status_class", classes},
            {"connection_errors", t.conn_errors},
            {"abandoned", t.abandoned},
            {"stream_errors", t.stream_errors},
            {"unexpected_status", t.unexpected},
            {"latency_ms_p50", percentile(t.ms, 0.5)},
            {"latency_ms_p99", percentile(t.ms, 0.99)},
            {"latency_ms_max", t.ms.empty() ? 0.0 : *std::max_element(t.ms.begin(), t.ms.end())},
            {"max_prompt_tokens", t.max_prompt_tokens}};
}

// The clients' run: each client in a thread until the deadline, and RSS sampled from
// their start every sample_s until they stop. `wall_s`: how long the clients ran.
std::vector<rss_sample> run_clients(const soak_args & a, int port, const std::vector<std::string> & large_files,
                                    std::vector<client_tally> & tallies, double & wall_s) {
    std::vector<rss_sample> samples;
    std::mutex mu;
    std::condition_variable cv;
    bool stop_sampling = false;
    const auto t_start = clock_type::now();
    const auto deadline =
        t_start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(a.duration_s));
    std::thread sampler([&] {
        std::unique_lock<std::mutex> lk(mu);
        for (int i = 0;; ++i) {
            const auto at = t_start + std::chrono::duration_cast<clock_type::duration>(
                                          std::chrono::duration<double>(a.sample_s * i));
            if (at > deadline) break;
            if (cv.wait_until(lk, at, [&] { return stop_sampling; })) break;
            samples.push_back({std::chrono::duration<double>(clock_type::now() - t_start).count(), read_rss_bytes(),
                               read_heap_bytes()});
            if (i % std::max(1, (int)(60 / a.sample_s)) == 0)
                progress("soak: " + std::to_string((int)samples.back().t_s) + " s, RSS " +
                         std::to_string(samples.back().rss_bytes >> 20) + " MiB");
        }
    });

    progress("soak: " + std::to_string(a.clients) + " clients for " + std::to_string((int)a.duration_s) +
             " s on port " + std::to_string(port));
    tallies.assign((size_t)a.clients, client_tally{});
    std::vector<std::thread> threads;
    for (int c = 0; c < a.clients; ++c)
        threads.emplace_back([&, c] { run_client(c, port, a, large_files, deadline, tallies[(size_t)c]); });
    for (auto & t : threads) t.join();
    wall_s = std::chrono::duration<double>(clock_type::now() - t_start).count();
    {
        std::lock_guard<std::mutex> lk(mu);
        stop_sampling = true;
    }
    cv.notify_all();
    sampler.join();
    return samples;
}

// Every client's counts, per request type and over all of them; the first failures.
struct soak_totals {
    type_tally all, types[k_n_types];
    std::vector<json> failures;
};

soak_totals merge(const std::vector<client_tally> & tallies) {
    soak_totals m;
    for (const auto & ct : tallies) {
        for (int i = 0; i < k_n_types; ++i) {
            const type_tally & x = ct.types[i];
            for (type_tally * t : {&m.types[i], &m.all}) {
                t->n += x.n; t->conn_errors += x.conn_errors; t->abandoned += x.abandoned;
                t->stream_errors += x.stream_errors; t->unexpected += x.unexpected;
                for (const auto & [k, v] : x.by_class) t->by_class[k] += v;
                t->ms.insert(t->ms.end(), x.ms.begin(), x.ms.end());
                t->max_prompt_tokens = std::max(t->max_prompt_tokens, x.max_prompt_tokens);
            }
        }
        for (const auto & f : ct.failures)
            if (keep_failure(m.failures.size(), f.value("broken", false))) m.failures.push_back(f);
    }
    return m;
}

// What the run measured, judged: the JSON report.
struct soak_result {
    const soak_args & a;
    std::string model_path;
    double wall_s = 0;
    json server;                     // the server's configuration, for the report
    scheduler_stats sched;
    soak_totals totals;
    std::vector<rss_sample> samples;
    rss_verdict rv, hv;              // RSS, and the heap in use under the same rule
    uint64_t n_5xx = 0;
    std::vector<std::string> failed; // the checks that failed
};

json rss_json(const soak_result & r) {
    json rss_samples = json::array();
    for (const auto & x : r.samples) rss_samples.push_back({{"t_s", std::round(x.t_s * 10) / 10},
                               {"rss_mib", (double)x.rss_bytes / (1 << 20)},
                               {"heap_in_use_mib", (double)x.heap_bytes / (1 << 20)}});
    const rss_verdict & rv = r.rv, & hv = r.hv;
    return {{"sample_every_s", r.a.sample_s},
            {"samples", rss_samples},
            {"rule",
             "samples split in thirds by count; the first is warm-up; flat when the last third's median is at most " +
                 std::to_string((int)(k_rss_tolerance * 100)) + "% above the middle third's (at least " +
                 std::to_string(k_min_rss_samples) + " samples, else not judged)"},
            {"evaluated", rv.evaluated},
            {"middle_median_mib", rv.middle_median_bytes / (1 << 20)},
            {"last_median_mib", rv.last_median_bytes / (1 << 20)},
            {"change", rv.change},
            {"slope_mib_per_min_after_warmup", rv.slope_bytes_per_min / (1 << 20)},
            {"rss_flat", rv.flat},
            {"heap_in_use",
             {{"middle_median_mib", hv.middle_median_bytes / (1 << 20)},
              {"last_median_mib", hv.last_median_bytes / (1 << 20)},
              {"change", hv.change},
              {"slope_mib_per_min_after_warmup", hv.slope_bytes_per_min / (1 << 20)}}}};
}

json report_json(const soak_result & r) {
    const soak_args & a = r.a;
    const scheduler_stats & st = r.sched;
    json by_type = json::array();
    for (int i = 0; i < k_n_types; ++i) {
        json t = tally_json(r.totals.types[i]);
        t["type"] = k_type_names[i];
        t["what"] = k_type_what[i];
        by_type.push_back(std::move(t));
    }
    return {
        {"model", r.model_path},
        {"clients", a.clients},
        {"duration_s", a.duration_s},
        {"wall_s", r.wall_s},
        {"seed", a.seed},
        {"server", r.server},
        {"mix_per_mille",
         [&] {
             json m = json::object();
             for (int i = 0; i < k_n_types; ++i) m[k_type_names[i]] = k_weights[i];
             return m;
         }()},
        {"requests", tally_json(r.totals.all)},
        {"requests_per_s", (double)r.totals.all.n / r.wall_s},
        {"n_5xx", r.n_5xx},
        {"by_type", by_type},
        {"scheduler",
         {{"submitted", st.n_submitted},
          {"completed", st.n_completed},
          {"cancelled", st.n_cancelled},
          {"failed", st.n_failed},
          {"rejected", st.n_rejected},
          {"batched_steps", st.n_batched_steps}}},
        {"rss", rss_json(r)},
        {"failures", r.totals.failures},
        {"failed_checks", r.failed},
        {"pass", r.failed.empty()},
    };
}

void print_text(const soak_result & r, const json & j) {
    const soak_args & a = r.a;
    const rss_verdict & rv = r.rv, & hv = r.hv;
    std::printf("%-15s %9s %8s %6s %5s %8s %9s %10s %6s %10s %10s\n", "type", "requests", "2xx", "4xx", "5xx",
                "conn err", "abandoned", "unexpected", "stream", "p50 ms", "p99 ms");
    auto row = [](const char * name, const json & t) {
        const json & c = t["by_status_class"];
        std::printf("%-15s %9llu %8llu %6llu %5llu %8llu %9llu %10llu %6llu %10.1f %10.1f\n", name,
                    (unsigned long long)t["requests"].get<uint64_t>(), (unsigned long long)c["2xx"].get<uint64_t>(),
                    (unsigned long long)c["4xx"].get<uint64_t>(), (unsigned long long)c["5xx"].get<uint64_t>(),
                    (unsigned long long)t["connection_errors"].get<uint64_t>(),
                    (unsigned long long)t["abandoned"].get<uint64_t>(),
                    (unsigned long long)t["unexpected_status"].get<uint64_t>(),
                    (unsigned long long)t["stream_errors"].get<uint64_t>(), t["latency_ms_p50"].get<double>(),
                    t["latency_ms_p99"].get<double>());
    };
    for (const auto & t : j["by_type"]) row(t["type"].get<std::string>().c_str(), t);
    row("all", j["requests"]);
    std::printf("\n%.0f requests/s over %.0f s, %d clients\nRSS (MiB) every %.0f s:", (double)r.totals.all.n / r.wall_s,
                r.wall_s, a.clients, a.sample_s);
    for (const auto & x : r.samples) std::printf(" %.0f", (double)x.rss_bytes / (1 << 20));
    std::printf("\nheap in use (MiB):");
    for (const auto & x : r.samples) std::printf(" %.0f", (double)x.heap_bytes / (1 << 20));
    if (rv.evaluated)
        std::printf(
            "\nrss_flat: %s (last-third median %.1f MiB vs middle-third %.1f MiB: %+.1f%%, limit +%.0f%%; %+.2f "
            "MiB/min after warm-up)\n",
            rv.flat ? "yes" : "NO", rv.last_median_bytes / (1 << 20), rv.middle_median_bytes / (1 << 20),
            rv.change * 100, k_rss_tolerance * 100, rv.slope_bytes_per_min / (1 << 20));
    if (rv.evaluated)
        std::printf(
            "heap in use: last-third median %.1f MiB vs middle-third %.1f MiB: %+.1f%%; %+.2f MiB/min after warm-up\n",
            hv.last_median_bytes / (1 << 20), hv.middle_median_bytes / (1 << 20), hv.change * 100,
            hv.slope_bytes_per_min / (1 << 20));
    else
        std::printf("\nrss_flat: not judged (fewer than %zu samples)\n", k_min_rss_samples);
    for (const auto & f : r.totals.failures) std::printf("failure: %s\n", dump_json(f).c_str());
    std::printf("verdict: %s\n", r.failed.empty() ? "PASS" : "FAIL");
}

// The verdicts: RSS flat, and no 5xx, lost connection, unexpected status or broken stream.
void judge(soak_result & r) {
    r.rv = judge_rss(r.samples);
    // The same rule over the heap in use, for the report: where RSS grows, does what the
    // program holds grow with it?
    std::vector<rss_sample> heap_series;
    for (const auto & x : r.samples) heap_series.push_back({x.t_s, x.heap_bytes, 0});
    r.hv = judge_rss(heap_series);
    const type_tally & all = r.totals.all;
    r.n_5xx = all.by_class.count("5xx") ? all.by_class.at("5xx") : 0;
    if (r.n_5xx > 0) r.failed.push_back("5xx");
    if (all.conn_errors > 0) r.failed.push_back("connection_errors");
    if (all.unexpected > 0) r.failed.push_back("unexpected_status");
    if (all.stream_errors > 0) r.failed.push_back("stream_errors");
    if (!r.rv.flat) r.failed.push_back("rss_not_flat");
}

int run_soak(const soak_args & a) {
    if (a.clients < 1 || a.duration_s <= 0 || a.sample_s <= 0)
        return fail(invalid_argument("--clients, --duration-s and --sample-s must be positive"));
    if (a.mf.n_ctx == 0)
        return fail(
            invalid_argument("bench soak needs an explicit -c (one of its bad requests is a prompt twice as long)"));
    scheduler_options so;
    so.engine.n_holders = a.holders;
    if (status st = a.cf.apply(so.engine); !st.ok()) return fail(st);
    so.n_parallel = a.parallel;
    so.max_queue = a.queue;
    auto eo = a.mf.to_options(2 + a.holders + a.parallel);
    if (!eo) return fail(eo.error());
    so.engine.engine = *eo;
    progress("soak: loading " + eo->model_path);
    auto s = scheduler::start(so);
    if (!s) return fail(s.error());
    server_options sv;
    sv.port = 0;
    sv.log_requests = false;
    sv.max_queue = so.max_queue;  // n_http_threads 0: parallel + queue + headroom
    sv.kinds = so.engine.kinds;
    auto h = http_server::start(**s, sv);
    if (!h) return fail(h.error());
    const int port = (*h)->port();

    std::vector<std::string> large_files;
    for (uint64_t k = 0; k < 3; ++k) large_files.push_back(code_text(900000 + k, a.large_prompt_tokens));
    soak_result r{a};
    r.model_path = eo->model_path;
    std::vector<client_tally> tallies;
    r.samples = run_clients(a, port, large_files, tallies, r.wall_s);
    r.sched = (*s)->stats();
    (*h)->stop();
    (*s)->stop();
    r.server = {{"parallel", a.parallel},
                {"queue", a.queue},
                {"holders", a.holders},
                {"n_ctx_per_sequence", (*s)->context().n_ctx_seq},
                {"http_threads", (*h)->options().n_http_threads}};
    r.totals = merge(tallies);
    judge(r);

    const json j = report_json(r);
    if (a.json_out) std::printf("%s\n", dump_json(j, 2).c_str());
    else print_text(r, j);
    if (!r.failed.empty()) {
        std::string why;
        for (const auto & f : r.failed) why += (why.empty() ? "" : ", ") + f;
        progress("soak: FAILED (" + why + ")");
        return 1;
    }
    return 0;
}

}  // namespace

void register_soak_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<soak_args>();
    auto * c = bench.add_subcommand(
        "soak", "many clients, a realistic request mix, for a long time: no 5xx, flat RSS (loopback)");
    a->mf.n_ctx = 8192;  // a fixed context: one of the bad requests is a prompt twice as long
    a->mf.add_to(*c);
    a->cf.add_to(*c);
    c->add_option("--clients", a->clients, "concurrent clients")->capture_default_str()->check(CLI::Range(1, 512));
    c->add_option("--duration-s", a->duration_s, "how long the clients send (seconds)")
        ->capture_default_str()
        ->check(CLI::Range(1.0, 86400.0));
    c->add_option("--sample-s", a->sample_s, "RSS sampling period (seconds)")
        ->capture_default_str()
        ->check(CLI::Range(0.1, 3600.0));
    c->add_option("--setups", a->setups, "agent set-ups (distinct system prompts)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000));
    c->add_option("--segment-workspaces", a->segment_workspaces, "workspaces named in requests with `segments`")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000));
    c->add_option("--large-prompt-tokens", a->large_prompt_tokens, "about how many tokens a large prompt's file has")
        ->capture_default_str()
        ->check(CLI::Range(100, 1000000));
    c->add_option("--think-ms", a->think_ms, "a client waits 0..this between requests")
        ->capture_default_str()
        ->check(CLI::Range(0, 60000));
    c->add_option("--parallel", a->parallel, "work sequences (jobs decoded at once)")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    c->add_option("--queue", a->queue, "jobs waiting for a work sequence (beyond it 429)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000));
    c->add_option("--holders", a->holders, "cached prefixes kept resident")
        ->capture_default_str()
        ->check(CLI::Range(1, 256));
    c->add_option("--seed", a->seed, "the clients' choices")->capture_default_str();
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_soak(*a); });
}

}  // namespace warmctx::cli

