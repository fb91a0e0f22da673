// warmctx-bench contention - does one long cold prefill stall everything else?
//
// Per system (warmctx with 2 work sequences; llama-server with 2 slots), in one run:
//   1. a warm-up request, then a warm workspace W is primed (its first, cold turn) and
//      its solo warm TTFT measured (the median of --warm-turns turns, new questions);
//   2. a cold request of a new workspace with a --cold-tokens stable prefix is sent;
//      after --delay-ms, while it prefills, W's warm turns are sent one after another
//      until the cold request has its first token, and a scraper requests /metrics
//      (llama-server: /health, its /metrics is off by default) every --scrape-ms;
//   3. reported: W's TTFT during the cold prefill against its solo TTFT plus one
//      prefill chunk (the cold prompt's prefill time over its chunks), and the scrape
//      latencies (p50, p99, max).
// Then, warmctx only (llama-server has no stored workspaces; its answer is the cold
// TTFT above), with the disk tier and the durable store where serve keeps them:
//   4. pre-warm: the stable segments of a new workspace P (--prewarm-tokens) are PUT;
//      once the pre-warm has run, a chat on P must reuse >= 95% of the cacheable prefix;
//   5. a chat sent during the pre-warm of another workspace Q (half-way through it,
//      by the times P's took) must reuse exactly what the pre-warm had done;
//   6. restart: the server is stopped and started again on the same directories; the
//      first chat on P, sent at once and with no PUT, must be served from the disk tier
//      (restored by the start-up pre-warm or by the chat itself), not prefilled.
#include <atomic>
#include <chrono>

#include "util/clock.h"
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include <httplib.h>

#include "bench_harness.h"

namespace warmctx::cli {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

struct contention_args {
    model_flags mf;
    size_t cold_tokens = 8192;
    size_t warm_tokens = 1024;
    int warm_turns = 3;
    int delay_ms = 1000;
    int scrape_ms = 100;
    size_t prewarm_tokens = 4096;
    std::vector<std::string> systems = {"warmctx", "llama-server"};
    std::string llama_server = default_tool("llama-server");
    uint64_t seed = 1;
    bool json_out = false;
};

struct prompt {
    std::vector<segment> segs;
    std::vector<token_id> tokens;
};

// ---- the pre-warm and restart phases (warmctx's HTTP API) ------------------------------

json segment_body(const segment & s) {
    json j = {{"kind", segment_kind_name(s.kind)}, {"content", s.content}};
    if (!s.path.empty()) j["path"] = s.path;
    if (!s.role.empty()) j["role"] = s.role;
    return j;
}

// PUTs every stored segment (all but the question) of `segs` into workspace `ws`.
status put_workspace(int port, const std::string & ws, const std::vector<segment> & segs) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(600, 0);
    for (const segment & s : segs) {
        if (s.kind == segment_kind::user) continue;
        auto r = c.Put("/v1/workspaces/" + ws + "/segments/" + s.id, segment_body(s).dump(), "application/json");
        if (!r || r->status >= 300)
            return engine_error("PUT of segment '" + s.id +
                                "' failed: " + (r ? r->body : httplib::to_string(r.error())));
    }
    return {};
}

// A metric's value in /metrics (-1 when absent).
double scrape_metric(int port, const std::string & name) {
    httplib::Client c("127.0.0.1", port);
    auto r = c.Get("/metrics");
    if (!r || r->status != 200) return -1;
    const std::string key = "\n" + name + " ";
    const size_t at = r->body.find(key);
    return at == std::string::npos ? -1 : std::atof(r->body.c_str() + at + key.size());
}

// Waits until /metrics counts at least `n` pre-warms; the time waited, or -1.
double wait_prewarms(int port, double n, double timeout_s) {
    const auto t0 = clock_type::now();
    while (ms_since(t0) < timeout_s * 1000) {
        if (scrape_metric(port, "warmctx_prewarms_total") >= n) return ms_since(t0);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
}

// One chat on the stored workspace `ws` (one token); its warmctx object and times.
json stored_chat(int port, const std::string & ws, const std::string & question) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(600, 0);
    json body = {
        {"messages", json::array({{{"role", "user"}, {"content", question}}})}, {"max_tokens", 1}, {"temperature", 0}};
    const auto t0 = clock_type::now();
    auto r = c.Post("/v1/workspaces/" + ws + "/chat/completions", body.dump(), "application/json");
    const double wall = ms_since(t0);
    if (!r || r->status != 200) return {{"ok", false}, {"error", r ? r->body : httplib::to_string(r.error())}};
    json w = json::parse(r->body, nullptr, false).value("warmctx", json::object());
    const double reused = w.value("tokens_reused", 0),
                 cacheable = std::max(1.0, (double)w.value("tokens_cacheable", 0));
    return {{"ok", true},
            {"wall_ms", wall},
            {"first_token_ms", w.value("first_token_ms", -1.0)},
            {"tokens_reused", w.value("tokens_reused", 0)},
            {"tokens_prefilled", w.value("tokens_prefilled", 0)},
            {"tokens_cacheable", w.value("tokens_cacheable", 0)},
            {"reused_fraction", reused / cacheable},
            {"tier", w.value("tier", "")},
            {"restore_ms", w.value("timings", json::object()).value("restore_ms", 0.0)},
            {"prewarm", w.value("prewarm", json())}};
}

// Every prompt of a run, built before any system starts.
struct contention_prompts {
    prompt cold;
    std::vector<prompt> warm;  // [0]: primes W; then one per warm turn (solo, then during)
    prompt warmup;
    std::vector<segment> p_segs, q_segs;  // P and Q: the pre-warmed workspaces
    size_t prewarm_prompt_tokens = 0;
};

status check_contention_args(const contention_args & a) {
    if (a.cold_tokens < 512 || a.warm_tokens < 256 || a.warm_turns < 1 || a.delay_ms < 0 || a.scrape_ms < 10)
        return invalid_argument("--cold-tokens >= 512, --warm-tokens >= 256, --warm-turns >= 1, --delay-ms >= 0, "
                                "--scrape-ms >= 10");
    for (const auto & s : a.systems)
        if (s != "warmctx" && s != "llama-server")
            return invalid_argument("--systems: unknown system '" + s + "' (warmctx, llama-server)");
    return {};
}

result<contention_prompts> build_contention_prompts(const contention_args & a, prompt_builder & pb,
                                                    workload_generator & g) {
    auto build = [&](std::vector<segment> segs) -> result<prompt> {
        auto t = pb.tokens(segs);
        if (!t) return t.error();
        return prompt{std::move(segs), std::move(*t)};
    };
    contention_prompts p;
    auto cold = build(make_workspace(g, a.cold_tokens, 2));
    if (!cold) return cold.error();
    p.cold = std::move(*cold);
    const auto w_segs = make_workspace(g, a.warm_tokens, 1);
    for (int i = 0; i < 1 + a.warm_turns + 64; ++i) {
        auto s = w_segs;
        s.back().content = g.question();
        auto w = build(std::move(s));
        if (!w) return w.error();
        p.warm.push_back(std::move(*w));
    }
    const std::vector<segment> warmup_segs = {{"question", segment_kind::user, "", "", "Say hello."}};
    auto warmup = build(warmup_segs);
    if (!warmup) return warmup.error();
    p.warmup = std::move(*warmup);
    // P and Q: the pre-warmed workspaces (stable segments only are stored).
    if (a.prewarm_tokens > 0) {
        p.p_segs = make_workspace(g, a.prewarm_tokens, 1);
        p.q_segs = make_workspace(g, a.prewarm_tokens, 1);
        for (const auto * segs : {&p.p_segs, &p.q_segs}) {
            auto t = pb.tokens(*segs);
            if (!t) return t.error();
            p.prewarm_prompt_tokens = std::max(p.prewarm_prompt_tokens, t->size());
        }
    }
    return p;
}

// Starts warmctx (2 work sequences, a disk tier and the durable store under `cache_dir`:
// its options go to `warmctx_opts`, for the restart) or llama-server (2 slots).
result<std::unique_ptr<bench_system>> start_contention_system(const std::string & name, const contention_args & a,
                                                              const model_flags & mf, const std::string & cache_dir,
                                                              uint64_t bpt, warmctx_system_options & warmctx_opts) {
    if (name == "warmctx") {
        warmctx_system_options o;
        o.mf = mf;
        o.parallel = 2;
        o.cf.budget_bytes = 4ull << 30;
        // Where serve keeps them by default: a disk tier (8 GiB) and the durable store.
        o.cf.cache_dir = cache_dir;
        o.cf.disk_budget_bytes = 8ull << 30;
        o.workspace_dir = cache_dir + "/workspaces";
        warmctx_opts = o;
        return start_warmctx_system(o);
    }
    llama_server_options o;
    o.binary = a.llama_server;
    o.mf = mf;
    o.slots = 2;
    o.kv_bytes_per_token = bpt;
    return start_llama_server(o);
}

// What W's warm turns and the scraper saw while the cold prompt prefilled.
struct during_cold {
    turn_timing cold_t;
    std::vector<double> during;  // warm TTFTs that finished before the cold one
    int during_cached = 0, during_prompt = 0;
    std::vector<double> scrapes;  // -1: a failed scrape
    std::string failure;
};

// 2. The cold request; after --delay-ms, W's warm turns from warm[next] on one after
// another until it has its first token, and a scraper of `scrape_path` every --scrape-ms.
during_cold run_during_cold(const std::string & name, bench_system & s, const contention_args & a,
                            const contention_prompts & p, size_t next, const std::string & scrape_path) {
    during_cold d;
    std::atomic<bool> cold_done{false};
    std::thread cold_thread([&] {
        d.cold_t = s.send("cold", p.cold.segs, p.cold.tokens, 1);
        cold_done = true;
    });
    std::atomic<bool> stop_scraping{false};
    std::thread scraper([&] {
        httplib::Client c("127.0.0.1", s.port());
        c.set_read_timeout(600, 0);
        while (!stop_scraping) {
            const auto t0 = clock_type::now();
            auto r = c.Get(scrape_path);
            const double ms = ms_since(t0);
            if (!cold_done) d.scrapes.push_back(r && r->status == 200 ? ms : -1.0);
            const double left = a.scrape_ms - ms;
            if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(left));
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(a.delay_ms));
    while (!cold_done && next < p.warm.size()) {
        auto t = s.send("w", p.warm[next].segs, p.warm[next].tokens, 1);
        ++next;
        if (!t.ok) { d.failure = name + ": warm turn during the cold prefill failed: " + t.error; break; }
        if (cold_done) break;  // finished after the cold one: not "during" it
        d.during.push_back(t.ttft_ms);
        d.during_cached = t.cached_tokens;
        d.during_prompt = t.prompt_tokens;
    }
    cold_thread.join();
    stop_scraping = true;
    scraper.join();
    return d;
}

// 1-3. for one system: its solo warm TTFT, then warm turns and scrapes during the cold
// prefill; its row of the report.
result<json> measure_contention(const std::string & name, bench_system & s, const contention_args & a,
                                const contention_prompts & p, size_t n_chunks, const std::string & scrape_path) {
    if (auto w = s.send("warmup", p.warmup.segs, p.warmup.tokens, 1); !w.ok)
        return engine_error(name + ": warm-up request failed: " + w.error);
    progress(name + ": priming the warm workspace");
    if (auto w = s.send("w", p.warm[0].segs, p.warm[0].tokens, 1); !w.ok)
        return engine_error(name + ": priming failed: " + w.error);
    std::vector<double> solo;
    size_t next = 1;
    for (int i = 0; i < a.warm_turns; ++i, ++next) {
        auto t = s.send("w", p.warm[next].segs, p.warm[next].tokens, 1);
        if (!t.ok) return engine_error(name + ": warm turn failed: " + t.error);
        solo.push_back(t.ttft_ms);
    }
    progress(name + ": solo warm TTFT " + std::to_string(median(solo)) + " ms; now the cold " +
             std::to_string(p.cold.tokens.size()) + "-token prompt");

    const during_cold d = run_during_cold(name, s, a, p, next, scrape_path);
    if (!d.failure.empty()) return engine_error(d.failure);
    if (!d.cold_t.ok) return engine_error(name + ": the cold request failed: " + d.cold_t.error);
    int failed_scrapes = 0;
    std::vector<double> ok_scrapes;
    for (double x : d.scrapes) (x < 0 ? (void)++failed_scrapes : ok_scrapes.push_back(x));
    // One chunk's prefill time: the cold prompt's own prefill over its chunks (its
    // TTFT bounds it from above: the cold request also shared the machine).
    const double chunk_ms = d.cold_t.ttft_ms / (double)n_chunks;
    const double solo_ms = median(solo);
    json row = {{"system", name},
                {"config", s.describe()},
                {"solo_warm_ttft_ms", solo_ms},
                {"solo_warm_ttft_ms_all", solo},
                {"cold_prompt_tokens", d.cold_t.prompt_tokens},
                {"cold_ttft_ms", d.cold_t.ttft_ms},
                {"cold_chunks", n_chunks},
                {"one_chunk_ms", chunk_ms},
                {"warm_turns_during_cold", d.during.size()},
                {"warm_ttft_during_cold_ms_all", d.during},
                {"warm_during_cached_tokens", d.during_cached},
                {"warm_during_prompt_tokens", d.during_prompt},
                {"scrape_path", scrape_path},
                {"scrapes_during_cold", d.scrapes.size()},
                {"scrapes_failed", failed_scrapes}};
    if (!d.during.empty()) {
        const double first = d.during.front();
        row["warm_ttft_during_cold_ms"] = first;
        row["warm_ttft_during_cold_ms_max"] = *std::max_element(d.during.begin(), d.during.end());
        row["target_ms"] = solo_ms + chunk_ms;
        row["target_met"] = first <= solo_ms + chunk_ms;
    }
    if (!ok_scrapes.empty()) {
        row["scrape_ms_p50"] = percentile(ok_scrapes, 0.50);
        row["scrape_ms_p99"] = percentile(ok_scrapes, 0.99);
        row["scrape_ms_max"] = *std::max_element(ok_scrapes.begin(), ok_scrapes.end());
    }
    progress(name + ": cold " + std::to_string(d.cold_t.ttft_ms) + " ms; warm during it " +
             (d.during.empty() ? std::string("(none: the cold prompt finished first)")
                               : std::to_string(d.during.front()) + " ms") +
             "; " + scrape_path + " p99 " + std::to_string(row.value("scrape_ms_p99", 0.0)) + " ms");
    return row;
}

// 4-6. warmctx only: the pre-warm of P, a chat during Q's, and the restart (which
// replaces `sys`); the report's "prewarm" object.
result<json> prewarm_and_restart(std::unique_ptr<bench_system> & sys, const contention_args & a,
                                 const contention_prompts & p, workload_generator & g,
                                 const warmctx_system_options & warmctx_opts) {
    bench_system & s = *sys;
    // 4. Pre-warm: PUT, let it run, then chat.
    json pw;
    const double before = scrape_metric(s.port(), "warmctx_prewarms_total");
    progress("warmctx: PUT a ~" + std::to_string(a.prewarm_tokens) + "-token workspace, waiting for its pre-warm");
    if (status st = put_workspace(s.port(), "P", p.p_segs); !st.ok()) return st;
    const auto t_put = clock_type::now();
    if (wait_prewarms(s.port(), before + 1, 1800) < 0) return engine_error("the pre-warm of P did not run");
    const double prewarm_ms = ms_since(t_put);
    json after = stored_chat(s.port(), "P", g.question());
    if (!after.value("ok", false)) return engine_error("chat on P failed: " + after.dump());
    pw["prewarm_ms"] = prewarm_ms;
    pw["chat_after_prewarm"] = after;
    pw["chat_after_prewarm_target_met"] = after["reused_fraction"].get<double>() >= 0.95;
    progress("warmctx: pre-warm of P took " + std::to_string(prewarm_ms) + " ms; the chat after it reused " +
             std::to_string(after["tokens_reused"].get<int>()) + " of " +
             std::to_string(after["tokens_cacheable"].get<int>()));

    // 5. A chat during Q's pre-warm, half-way through it.
    if (status st = put_workspace(s.port(), "Q", p.q_segs); !st.ok()) return st;
    // Half-way through its prefill: the wait before P's pre-warm started (the quiet
    // period after the last PUT, assembly) plus half of how long P's ran.
    const double p_run_ms = after["prewarm"].is_object() ? after["prewarm"].value("duration_ms", 0.0) : 0.0;
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(prewarm_ms - p_run_ms / 2));
    json during_pw = stored_chat(s.port(), "Q", g.question());
    if (!during_pw.value("ok", false)) return engine_error("chat on Q failed: " + during_pw.dump());
    pw["chat_during_prewarm"] = during_pw;
    const json & qp = during_pw["prewarm"];
    pw["chat_during_prewarm_target_met"] =
        qp.is_object() && during_pw["tokens_reused"].get<int>() == qp.value("tokens_cached", -1) &&
        during_pw["tokens_reused"].get<int>() > 0;
    progress("warmctx: a chat half-way through Q's pre-warm reused " +
             std::to_string(during_pw["tokens_reused"].get<int>()) + " tokens" +
             (qp.is_object() ? " (the pre-warm had cached " + std::to_string(qp.value("tokens_cached", 0)) + ")" : ""));

    // 6. Restart on the same directories; the first chat on P at once, no PUT.
    sys.reset();
    const auto t_start = clock_type::now();
    auto again = start_warmctx_system(warmctx_opts);
    if (!again) return again.error();
    const double start_ms = ms_since(t_start);
    json first = stored_chat((*again)->port(), "P", g.question());
    if (!first.value("ok", false)) return engine_error("chat on P after the restart failed: " + first.dump());
    pw["restart_start_ms"] = start_ms;
    pw["chat_after_restart"] = first;
    const json & fp = first["prewarm"];
    const bool from_disk = first.value("tier", "") == "disk" || (fp.is_object() && fp.value("found_in", "") == "disk" &&
                                                                 fp.value("tokens_prefilled", -1) == 0);
    pw["chat_after_restart_from_disk"] = from_disk;
    pw["chat_after_restart_target_met"] = from_disk && first["reused_fraction"].get<double>() >= 0.95;
    progress("warmctx: restarted in " + std::to_string(start_ms) + " ms; the first chat on P (no PUT) reused " +
             std::to_string(first["tokens_reused"].get<int>()) + " of " +
             std::to_string(first["tokens_cacheable"].get<int>()) +
             (from_disk ? ", from the disk tier" : ", NOT from disk") + ", TTFT " +
             std::to_string(first["wall_ms"].get<double>()) + " ms");
    return pw;
}

void print_contention(const json & rows, const json & prewarm_report) {
    std::printf("%-13s %10s %12s %12s %10s %10s %12s\n", "system", "solo warm", "warm during", "target", "cold ms",
                "scrape p99", "scrape max");
    for (const auto & r : rows)
        std::printf("%-13s %10.1f %12.1f %12.1f %10.1f %10.1f %12.1f\n", r["system"].get<std::string>().c_str(),
                    r["solo_warm_ttft_ms"].get<double>(), r.value("warm_ttft_during_cold_ms", 0.0),
                    r.value("target_ms", 0.0), r["cold_ttft_ms"].get<double>(), r.value("scrape_ms_p99", 0.0),
                    r.value("scrape_ms_max", 0.0));
    if (prewarm_report.is_object()) std::printf("warmctx pre-warm and restart: %s\n", prewarm_report.dump().c_str());
}

int run_contention(const contention_args & a) {
    if (status st = check_contention_args(a); !st.ok()) return fail(st);
    auto pb = prompt_builder::open(a.mf);
    if (!pb) return fail(pb.error());
    progress("building a ~" + std::to_string(a.cold_tokens) + "-token cold workspace and a ~" +
             std::to_string(a.warm_tokens) + "-token warm one");
    workload_generator g(a.seed, (*pb)->counter());
    auto prompts = build_contention_prompts(a, **pb, g);
    if (!prompts) return fail(prompts.error());
    const std::string model_path = (*pb)->model_path();
    const uint64_t bpt = (*pb)->kv_bytes_per_token();
    pb->reset();

    model_flags mf = a.mf;
    mf.model = model_path;
    const uint32_t chunk = std::max<uint32_t>(1, mf.chunk);
    const size_t cold_tokens = prompts->cold.tokens.size();
    mf.n_ctx = (uint32_t)((std::max(cold_tokens, prompts->prewarm_prompt_tokens) + 64 + chunk - 1) / chunk * chunk);
    const size_t n_chunks = (cold_tokens + chunk - 1) / chunk;

    auto dir = make_owned_dir("/tmp", "warmctx-contention");
    if (!dir) return fail(dir.error());
    const std::string cache_dir = dir->path();
    warmctx_system_options warmctx_opts;

    json rows = json::array();
    json prewarm_report;
    for (const auto & name : a.systems) {
        auto sys = start_contention_system(name, a, mf, cache_dir, bpt, warmctx_opts);
        if (!sys) return fail(sys.error());
        const std::string scrape_path = name == "warmctx" ? "/metrics" : "/health";
        auto row = measure_contention(name, **sys, a, *prompts, n_chunks, scrape_path);
        if (!row) return fail(row.error());
        rows.push_back(std::move(*row));
        if (name != "warmctx" || a.prewarm_tokens == 0) continue;
        auto pw = prewarm_and_restart(*sys, a, *prompts, g, warmctx_opts);
        if (!pw) return fail(pw.error());
        prewarm_report = std::move(*pw);
    }
    json out = {{"bench", "contention"}, {"model", model_path}, {"backend", backend_name()},
                {"cold_tokens_target", a.cold_tokens}, {"warm_tokens_target", a.warm_tokens},
                {"chunk", chunk}, {"n_ctx", mf.n_ctx}, {"delay_ms", a.delay_ms}, {"rows", rows},
                {"prewarm_tokens_target", a.prewarm_tokens}, {"prewarm", prewarm_report}};
    if (a.json_out) { std::printf("%s\n", out.dump(2).c_str()); return 0; }
    print_contention(rows, prewarm_report);
    return 0;
}

}  // namespace

void register_contention_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<contention_args>();
    auto * c = bench.add_subcommand("contention",
                                    "a warm turn and /metrics scrapes while another workspace's long cold prompt "
                                    "prefills, warmctx next to llama-server (2 sequences each)");
    a->mf.add_to(*c, false);
    c->add_option("--cold-tokens", a->cold_tokens, "the cold workspace's stable prefix, tokens")->capture_default_str();
    c->add_option("--warm-tokens", a->warm_tokens, "the warm workspace's stable prefix, tokens")->capture_default_str();
    c->add_option("--warm-turns", a->warm_turns, "solo warm turns (the median is the reference)")
        ->capture_default_str();
    c->add_option("--delay-ms", a->delay_ms, "wait after sending the cold prompt before the warm turns")
        ->capture_default_str();
    c->add_option("--scrape-ms", a->scrape_ms, "scrape interval during the cold prefill")->capture_default_str();
    c->add_option("--prewarm-tokens", a->prewarm_tokens,
                  "warmctx: the stored workspaces of the pre-warm and restart phases, tokens (0 = skip them)")
        ->capture_default_str();
    c->add_option("--systems", a->systems, "systems to run: warmctx, llama-server")
        ->delimiter(',')
        ->capture_default_str();
    c->add_option("--llama-server", a->llama_server, "llama-server binary")->capture_default_str();
    c->add_option("--seed", a->seed, "workspace content seed")->capture_default_str();
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_contention(*a); });
}

}  // namespace warmctx::cli
