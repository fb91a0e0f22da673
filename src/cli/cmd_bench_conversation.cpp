// warmctx-bench conversation - one long chat of many short messages, as an agent's
// history of small tool calls and results is, sent whole to each system as a plain
// OpenAI chat: the cold request (nothing of it cached anywhere), then warm turns that
// each append an answer and a new message (append-only, what an agent's next request
// is). Each system at its own defaults, side by side in one run; llama-server takes the
// tokens warmctx assembles from the same messages.
#include <nlohmann/json.hpp>

#include "bench_harness.h"
#include "warmctx/scheduler.h"

namespace warmctx::cli {
namespace {

using json = nlohmann::json;

struct conversation_args {
    model_flags mf;
    std::vector<int> counts = {1000, 2000};
    int warm_turns = 3;
    int reps = 1;
    int max_tokens = 1;
    std::vector<std::string> systems = {"warmctx-defaults", "llama-server-defaults"};
    std::string llama_server = default_tool("llama-server");
    bool json_out = false;
};

// A short message, different for each index (a few words, ~8-12 tokens).
std::string short_message(int i, bool assistant) {
    static const char * const verbs[] = {"read", "ran", "checked", "opened", "listed", "grepped", "built", "tested"};
    static const char * const things[] = {"src/main.cc", "the tests", "CMakeLists.txt", "utils.h", "the log",
                                          "README.md", "parser.cc", "the config"};
    if (assistant)
        return std::string("I ") + verbs[i % 8] + " " + things[(i / 8) % 8] + " (step " + std::to_string(i) + ").";
    return "ok: " + std::string(things[(i / 3) % 8]) + " line " + std::to_string(i * 7 % 997) + " looks fine";
}

// `n_system` system messages no other conversation of the run shares (so each cold
// request is cold on every system), then `n` messages, alternating user and assistant,
// ending with a user's.
json conversation(int n, int nonce, int n_system) {
    json m = json::array();
    m.push_back({{"role", "system"},
                 {"content", "You are a coding agent (session " + std::to_string(nonce) + "). Answer briefly."}});
    for (int i = 1; i < n_system; ++i)
        m.push_back({{"role", "system"}, {"content", "Note " + std::to_string(i) + ": keep answers short."}});
    for (int i = 0; i < n; ++i) {
        const bool assistant = (n - 1 - i) % 2 == 1;
        m.push_back({{"role", assistant ? "assistant" : "user"}, {"content", short_message(i, assistant)}});
    }
    return m;
}

result<std::unique_ptr<bench_system>> start_system(const std::string & name, const conversation_args & a,
                                                   uint64_t bpt) {
    if (name == "llama-server-defaults") {
        llama_server_options o;
        o.name = name;
        o.binary = a.llama_server;
        o.mf = a.mf;
        o.defaults = true;
        o.kv_bytes_per_token = bpt;
        return start_llama_server(o);
    }
    warmctx_system_options o;  // serve's defaults, as the trace's warmctx-defaults
    o.name = name;
    o.mf = a.mf;
    o.cf = cache_flags{};
    o.parallel = scheduler_options{}.n_parallel;
    o.resident_streams = -1;
    o.default_disk = true;
    return start_warmctx_system(o);
}

json timing_json(const turn_timing & t) {
    return {{"ok", t.ok}, {"error", t.error}, {"ttft_ms", t.ttft_ms}, {"total_ms", t.total_ms},
            {"prompt_tokens", t.prompt_tokens}, {"cached_tokens", t.cached_tokens}, {"timings", t.timings}};
}

result<json> run_system(const std::string & name, const conversation_args & a, prompt_builder & pb) {
    progress("starting " + name);
    auto sys = start_system(name, a, pb.kv_bytes_per_token());
    if (!sys) return sys.error();
    json rows = json::array();
    int nonce = 0;
    for (int n : a.counts) {
      json reps = json::array();
      std::vector<double> colds, warms;
      for (int rep = 0; rep < a.reps; ++rep) {
        // One system message more each rep: the template renders the assembler remembers
        // are of its skeleton (roles and message positions, not contents), so another
        // conversation of the same shape would find them made (cold in its KV only).
        json msgs = conversation(n, ++nonce, 1 + rep);
        auto send = [&](const json & m) -> result<turn_timing> {
            auto segs = chat_segments(m);
            if (!segs) return segs.error();
            auto toks = pb.tokens(*segs);
            if (!toks) return toks.error();
            turn_timing t = (*sys)->send_chat(m, *toks, a.max_tokens);
            if (!t.ok) return io_error(name + ": " + t.error);
            return t;
        };
        progress(name + ": " + std::to_string(n) + " messages, cold (rep " + std::to_string(rep + 1) + ")");
        auto cold = send(msgs);
        if (!cold) return cold.error();
        json warm = json::array();
        for (int k = 0; k < a.warm_turns; ++k) {
            msgs.push_back({{"role", "assistant"}, {"content", short_message(n + 2 * k, true)}});
            msgs.push_back({{"role", "user"}, {"content", short_message(n + 2 * k + 1, false)}});
            auto w = send(msgs);
            if (!w) return w.error();
            warms.push_back(w->ttft_ms);
            warm.push_back(timing_json(*w));
        }
        colds.push_back(cold->total_ms);
        progress(name + ": " + std::to_string(n) + " messages: cold " + std::to_string((int)cold->total_ms) + " ms, " +
                 std::to_string(cold->prompt_tokens) + " tokens");
        reps.push_back({{"cold", timing_json(*cold)}, {"warm", warm}});
      }
      rows.push_back({{"messages", n}, {"reps", reps}, {"cold_total_ms_median", median(colds)},
                      {"cold_prompt_tokens", reps[0]["cold"]["prompt_tokens"]},
                      {"warm_ttft_p50_ms", warms.empty() ? 0.0 : median(warms)}});
    }
    // What each allocated: `describe` (llama-server at its defaults: its slots' KV as it
    // chose them), `state` (warmctx: its KV streams, pool and tiers after the run).
    return json{{"name", name}, {"describe", (*sys)->describe()}, {"state", (*sys)->state()}, {"rows", rows}};
}

int run_conversation(const conversation_args & a) {
    for (int n : a.counts)
        if (n < 1 || n > 100000) return fail(invalid_argument("--counts: each in [1, 100000]"));
    for (const auto & s : a.systems)
        if (s != "warmctx-defaults" && s != "llama-server-defaults")
            return fail(invalid_argument("--systems: unknown system '" + s +
                                         "' (warmctx-defaults, llama-server-defaults)"));
    auto pb = prompt_builder::open(a.mf);
    if (!pb) return fail(pb.error());
    json out = {{"bench", "conversation"}, {"backend", backend_name()}, {"model", (*pb)->model_path()},
                {"model_desc", (*pb)->model_description()}, {"threads", a.mf.threads},
                {"warm_turns", a.warm_turns}, {"max_tokens", a.max_tokens}};
    json systems = json::array();
    for (const auto & name : a.systems) {
        auto s = run_system(name, a, **pb);
        if (!s) return fail(s.error());
        systems.push_back(std::move(*s));
    }
    out["systems"] = systems;
    // warmctx / llama-server, per count: the cold request's wall time and the warm TTFT p50.
    if (systems.size() == 2) {
        json ratios = json::array();
        for (size_t i = 0; i < a.counts.size(); ++i) {
            const json & w = systems[0]["rows"][i];
            const json & l = systems[1]["rows"][i];
            const double lc = l["cold_total_ms_median"].get<double>(), lw = l["warm_ttft_p50_ms"].get<double>();
            ratios.push_back({{"messages", a.counts[i]},
                              {"cold_total", lc > 0 ? w["cold_total_ms_median"].get<double>() / lc : 0.0},
                              {"warm_ttft_p50", lw > 0 ? w["warm_ttft_p50_ms"].get<double>() / lw : 0.0}});
        }
        out["ratios"] = ratios;
    }
    if (a.json_out) {
        std::printf("%s\n", out.dump(2).c_str());
    } else {
        for (const auto & s : systems)
            for (const auto & r : s["rows"])
                std::printf("%-22s %6d messages: cold %9.1f ms (median, %d tokens), warm TTFT p50 %8.1f ms\n",
                            s["name"].get<std::string>().c_str(), r["messages"].get<int>(),
                            r["cold_total_ms_median"].get<double>(), r["cold_prompt_tokens"].get<int>(),
                            r["warm_ttft_p50_ms"].get<double>());
    }
    return 0;
}

}  // namespace

void register_conversation_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<conversation_args>();
    auto * c = bench.add_subcommand("conversation",
                                    "one long chat of many short messages, cold then appended to, against llama-server "
                                    "(each at its defaults)");
    a->mf.add_to(*c);
    c->add_option("--counts", a->counts, "messages in the conversation, one run each")
        ->delimiter(',')
        ->capture_default_str();
    c->add_option("--warm-turns", a->warm_turns, "appended turns after each cold request")
        ->check(CLI::Range(0, 100))
        ->capture_default_str();
    c->add_option("--reps", a->reps,
                  "conversations of each count (each new, cold everywhere: rep r has r system messages more); the "
                  "median is reported")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    c->add_option("--max-tokens", a->max_tokens, "tokens each request writes")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    c->add_option("--systems", a->systems, "systems: warmctx-defaults, llama-server-defaults")
        ->delimiter(',')
        ->capture_default_str();
    c->add_option("--llama-server", a->llama_server, "llama-server binary")->capture_default_str();
    c->add_flag("--json", a->json_out,
                "print JSON (per system and count: each rep's cold request and warm turns, the medians)");
    on_run(c, rc, [a] { return run_conversation(*a); });
}

}  // namespace warmctx::cli
