// warmctx bench contention - does one long cold prefill stall everything else?
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
#include <atomic>
#include <chrono>
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
    std::vector<std::string> systems = {"warmctx", "llama-server"};
    std::string llama_server = default_tool("llama-server");
    uint64_t seed = 1;
    bool json_out = false;
};

double ms_since(clock_type::time_point t) { return std::chrono::duration<double, std::milli>(clock_type::now() - t).count(); }

struct prompt {
    std::vector<segment> segs;
    std::vector<token_id> tokens;
};

int run_contention(const contention_args & a) {
    if (a.cold_tokens < 512 || a.warm_tokens < 256 || a.warm_turns < 1 || a.delay_ms < 0 || a.scrape_ms < 10)
        return fail(invalid_argument("--cold-tokens >= 512, --warm-tokens >= 256, --warm-turns >= 1, --delay-ms >= 0, "
                                     "--scrape-ms >= 10"));
    for (const auto & s : a.systems)
        if (s != "warmctx" && s != "llama-server")
            return fail(invalid_argument("--systems: unknown system '" + s + "' (warmctx, llama-server)"));
    auto pb = prompt_builder::open(a.mf);
    if (!pb) return fail(pb.error());
    progress("building a ~" + std::to_string(a.cold_tokens) + "-token cold workspace and a ~" +
             std::to_string(a.warm_tokens) + "-token warm one");
    workload_generator g(a.seed, (*pb)->counter());
    auto build = [&](std::vector<segment> segs) -> result<prompt> {
        auto t = (*pb)->tokens(segs);
        if (!t) return t.error();
        return prompt{std::move(segs), std::move(*t)};
    };
    auto cold = build(make_workspace(g, a.cold_tokens, 2));
    if (!cold) return fail(cold.error());
    std::vector<prompt> warm;  // [0]: primes W; then one per warm turn (solo, then during)
    const auto w_segs = make_workspace(g, a.warm_tokens, 1);
    for (int i = 0; i < 1 + a.warm_turns + 64; ++i) {
        auto s = w_segs;
        s.back().content = g.question();
        auto p = build(std::move(s));
        if (!p) return fail(p.error());
        warm.push_back(std::move(*p));
    }
    const std::vector<segment> warmup_segs = {{"question", segment_kind::user, "", "", "Say hello."}};
    auto warmup = build(warmup_segs);
    if (!warmup) return fail(warmup.error());
    const std::string model_path = (*pb)->model_path();
    const uint64_t bpt = (*pb)->kv_bytes_per_token();
    pb->reset();

    model_flags mf = a.mf;
    mf.model = model_path;
    const uint32_t chunk = std::max<uint32_t>(1, mf.chunk);
    mf.n_ctx = (uint32_t)((cold->tokens.size() + 64 + chunk - 1) / chunk * chunk);
    const size_t n_chunks = (cold->tokens.size() + chunk - 1) / chunk;

    json rows = json::array();
    for (const auto & name : a.systems) {
        result<std::unique_ptr<bench_system>> sys = invalid_argument("unreachable");
        std::string scrape_path;
        if (name == "warmctx") {
            warmctx_system_options o;
            o.mf = mf;
            o.parallel = 2;
            o.cf.budget_bytes = 4ull << 30;
            sys = start_warmctx_system(o);
            scrape_path = "/metrics";
        } else {
            llama_server_options o;
            o.binary = a.llama_server;
            o.mf = mf;
            o.slots = 2;
            o.kv_bytes_per_token = bpt;
            sys = start_llama_server(o);
            scrape_path = "/health";
        }
        if (!sys) return fail(sys.error());
        bench_system & s = **sys;
        if (auto w = s.send("warmup", warmup->segs, warmup->tokens, 1); !w.ok)
            return fail(engine_error(name + ": warm-up request failed: " + w.error));
        progress(name + ": priming the warm workspace");
        if (auto w = s.send("w", warm[0].segs, warm[0].tokens, 1); !w.ok)
            return fail(engine_error(name + ": priming failed: " + w.error));
        std::vector<double> solo;
        size_t next = 1;
        for (int i = 0; i < a.warm_turns; ++i, ++next) {
            auto t = s.send("w", warm[next].segs, warm[next].tokens, 1);
            if (!t.ok) return fail(engine_error(name + ": warm turn failed: " + t.error));
            solo.push_back(t.ttft_ms);
        }
        progress(name + ": solo warm TTFT " + std::to_string(median(solo)) + " ms; now the cold " +
                 std::to_string(cold->tokens.size()) + "-token prompt");

        std::atomic<bool> cold_done{false};
        turn_timing cold_t;
        std::thread cold_thread([&] {
            cold_t = s.send("cold", cold->segs, cold->tokens, 1);
            cold_done = true;
        });
        std::vector<double> scrapes;
        std::atomic<bool> stop_scraping{false};
        std::thread scraper([&] {
            httplib::Client c("127.0.0.1", s.port());
            c.set_read_timeout(600, 0);
            while (!stop_scraping) {
                const auto t0 = clock_type::now();
                auto r = c.Get(scrape_path);
                const double ms = ms_since(t0);
                if (!cold_done) scrapes.push_back(r && r->status == 200 ? ms : -1.0);
                const double left = a.scrape_ms - ms;
                if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(left));
            }
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(a.delay_ms));
        std::vector<double> during;
        int during_cached = 0, during_prompt = 0;
        std::string failure;
        while (!cold_done && next < warm.size()) {
            auto t = s.send("w", warm[next].segs, warm[next].tokens, 1);
            ++next;
            if (!t.ok) { failure = name + ": warm turn during the cold prefill failed: " + t.error; break; }
            if (cold_done) break;  // finished after the cold one: not "during" it
            during.push_back(t.ttft_ms);
            during_cached = t.cached_tokens;
            during_prompt = t.prompt_tokens;
        }
        cold_thread.join();
        stop_scraping = true;
        scraper.join();
        if (!failure.empty()) return fail(engine_error(failure));
        if (!cold_t.ok) return fail(engine_error(name + ": the cold request failed: " + cold_t.error));
        int failed_scrapes = 0;
        std::vector<double> ok_scrapes;
        for (double x : scrapes) (x < 0 ? (void)++failed_scrapes : ok_scrapes.push_back(x));
        // One chunk's prefill time: the cold prompt's own prefill over its chunks (its
        // TTFT bounds it from above: the cold request also shared the machine).
        const double chunk_ms = cold_t.ttft_ms / (double)n_chunks;
        const double solo_ms = median(solo);
        json row = {{"system", name},
                    {"config", s.describe()},
                    {"solo_warm_ttft_ms", solo_ms},
                    {"solo_warm_ttft_ms_all", solo},
                    {"cold_prompt_tokens", cold_t.prompt_tokens},
                    {"cold_ttft_ms", cold_t.ttft_ms},
                    {"cold_chunks", n_chunks},
                    {"one_chunk_ms", chunk_ms},
                    {"warm_turns_during_cold", during.size()},
                    {"warm_ttft_during_cold_ms_all", during},
                    {"warm_during_cached_tokens", during_cached},
                    {"warm_during_prompt_tokens", during_prompt},
                    {"scrape_path", scrape_path},
                    {"scrapes_during_cold", scrapes.size()},
                    {"scrapes_failed", failed_scrapes}};
        if (!during.empty()) {
            const double first = during.front();
            row["warm_ttft_during_cold_ms"] = first;
            row["warm_ttft_during_cold_ms_max"] = *std::max_element(during.begin(), during.end());
            row["target_ms"] = solo_ms + chunk_ms;
            row["target_met"] = first <= solo_ms + chunk_ms;
        }
        if (!ok_scrapes.empty()) {
            row["scrape_ms_p50"] = percentile(ok_scrapes, 0.50);
            row["scrape_ms_p99"] = percentile(ok_scrapes, 0.99);
            row["scrape_ms_max"] = *std::max_element(ok_scrapes.begin(), ok_scrapes.end());
        }
        progress(name + ": cold " + std::to_string(cold_t.ttft_ms) + " ms; warm during it " +
                 (during.empty() ? std::string("(none: the cold prompt finished first)")
                                 : std::to_string(during.front()) + " ms") +
                 "; " + scrape_path + " p99 " + std::to_string(row.value("scrape_ms_p99", 0.0)) + " ms");
        rows.push_back(std::move(row));
    }
    json out = {{"bench", "contention"}, {"model", model_path}, {"backend", backend_name()},
                {"cold_tokens_target", a.cold_tokens}, {"warm_tokens_target", a.warm_tokens},
                {"chunk", chunk}, {"n_ctx", mf.n_ctx}, {"delay_ms", a.delay_ms}, {"rows", rows}};
    if (a.json_out) { std::printf("%s\n", out.dump(2).c_str()); return 0; }
    std::printf("%-13s %10s %12s %12s %10s %10s %12s\n", "system", "solo warm", "warm during", "target", "cold ms",
                "scrape p99", "scrape max");
    for (const auto & r : rows)
        std::printf("%-13s %10.1f %12.1f %12.1f %10.1f %10.1f %12.1f\n", r["system"].get<std::string>().c_str(),
                    r["solo_warm_ttft_ms"].get<double>(), r.value("warm_ttft_during_cold_ms", 0.0),
                    r.value("target_ms", 0.0), r["cold_ttft_ms"].get<double>(), r.value("scrape_ms_p99", 0.0),
                    r.value("scrape_ms_max", 0.0));
    return 0;
}

}  // namespace

void register_contention_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<contention_args>();
    auto * c = bench.add_subcommand(
        "contention", "a warm turn and /metrics scrapes while another workspace's long cold prompt prefills, warmctx next to llama-server (2 sequences each)");
    a->mf.add_to(*c, false);
    c->add_option("--cold-tokens", a->cold_tokens, "the cold workspace's stable prefix, tokens")->capture_default_str();
    c->add_option("--warm-tokens", a->warm_tokens, "the warm workspace's stable prefix, tokens")->capture_default_str();
    c->add_option("--warm-turns", a->warm_turns, "solo warm turns (the median is the reference)")->capture_default_str();
    c->add_option("--delay-ms", a->delay_ms, "wait after sending the cold prompt before the warm turns")->capture_default_str();
    c->add_option("--scrape-ms", a->scrape_ms, "scrape interval during the cold prefill")->capture_default_str();
    c->add_option("--systems", a->systems, "systems to run: warmctx, llama-server")->delimiter(',')->capture_default_str();
    c->add_option("--llama-server", a->llama_server, "llama-server binary")->capture_default_str();
    c->add_option("--seed", a->seed, "workspace content seed")->capture_default_str();
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_contention(*a); });
}

}  // namespace warmctx::cli
