// warmctx-bench trace - a seeded multi-workspace coding-agent trace (agent_trace.h)
// replayed turn by turn through HTTP against warmctx with semantic eviction, warmctx
// with plain LRU, and llama-server with its RAM prompt cache, all allocating the same
// KV bytes A (every stream, slot, pool and cache counted whole, not what they use):
//   - warmctx-*: one work stream of n_ctx cells (serve allocates no other stream), and
//     a pool of cached prefixes of --budget-bytes A - 1 stream;
//   - llama-server: one slot of the same n_ctx and --cache-ram A - 1 slot (at least
//     1 MiB; --server-cache-ram-mib overrides).
// And each system at its own defaults (what a user meets): warmctx-defaults (serve's
// defaults: automatic n_ctx, the default byte budget, the device tier on a GPU, and its
// disk tier, in a fresh directory) and llama-server-defaults (no -c,
// -np, --cache-ram, batch or KV-type flags).
// Each turn is sent once, in trace order, by one client; llama-server gets the exact
// tokens warmctx assembles, so both prefill the same prompt.
// --history-window N gives every turn the last N messages of its workspace's
// conversation (agent_trace.h); --messages plain sends warmctx each turn as a plain
// OpenAI chat (system, history, user; no workspace, no segments) and llama-server the
// tokens warmctx's chat route assembles from those messages.
// Reported per system: prefilled tokens, the client TTFT distribution, warm turns (at most
// k_warm_max_prefill tokens prefilled), and for warmctx the sums of every phase of the
// responses' warmctx.timings and what they leave of the client TTFT unaccounted.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "bench_harness.h"
#include "workload/agent_trace.h"
#include "warmctx/scheduler.h"

namespace warmctx::cli {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

struct trace_args {
    model_flags mf;
    agent_trace_options t;
    double budget_mib = 0;          // allocated KV of every system; 0 = two streams + 40% of
                                    // the KV of all workspaces' stable prompts
    double server_cache_ram_mib = 0; // 0 = budget_mib less llama-server's slot
    std::vector<std::string> systems = {"warmctx-semantic", "warmctx-lru", "llama-server", "warmctx-defaults",
                                        "llama-server-defaults"};
    std::string llama_server = default_tool("llama-server");
    std::string messages = "segments";  // how warmctx is sent a turn: segments | plain
    int32_t resident_streams = -1;      // warmctx-defaults' --resident-streams (-1: serve's default)
    bool quick = false;
    bool json_out = false;
};

// A warm turn prefills at most this many tokens (its tail, not a context).
constexpr int k_warm_max_prefill = 300;

json ms_or_null(const std::vector<double> & v, double p) { return v.empty() ? json(nullptr) : json(percentile(v, p)); }
json max_or_null(const std::vector<double> & v) {
    return v.empty() ? json(nullptr) : json(*std::max_element(v.begin(), v.end()));
}

// Counts of TTFTs at most each edge (ms), 1-2-5 steps; the last bucket has no bound.
json ttft_histogram(const std::vector<double> & v) {
    static const double edges[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};
    json le = json::array(), counts = json::array();
    std::vector<int> n(std::size(edges) + 1, 0);
    for (double x : v) {
        size_t b = 0;
        while (b < std::size(edges) && x > edges[b]) ++b;
        ++n[b];
    }
    for (size_t b = 0; b <= std::size(edges); ++b) {
        le.push_back(b < std::size(edges) ? json(edges[b]) : json(nullptr));
        counts.push_back(n[b]);
    }
    return {{"le_ms", le}, {"counts", counts}};
}

// A trace's prompts as each system is sent them, with what the report says of them.
struct trace_prompts {
    std::vector<std::vector<token_id>> tokens;  // per turn: what warmctx assembles
    std::vector<json> chats;                     // per turn (plain): its chat messages
    size_t max_prompt = 0, total_prompt = 0;
    std::vector<size_t> stable_prompt;           // per workspace: its stable prompt's tokens
    int n_edits = 0;
    json history_of_turn = json::array();
    uint64_t bpt = 0;                            // KV bytes per token
    std::string model_path, model_desc;
};

// The KV bytes every system allocates (a stream or slot + a pool or --cache-ram).
struct trace_budget {
    model_flags mf;  // the model, and n_ctx fitting the longest prompt
    uint64_t stream_bytes = 0;
    double stream_mib = 0, budget_mib = 0, slot_mib = 0;
    int server_cache_ram_mib = 0;
    uint64_t budget_bytes = 0, allocated_bytes = 0;
    size_t stable_sum = 0;
};

// --quick's sizes, then the flags' checks.
status check_trace_args(trace_args & a) {
    if (a.quick) {
        a.t.n_workspaces = 4;
        a.t.n_turns = 24;
        a.t.stable_tokens = 1536;
        a.t.tail_tokens = 200;
    }
    for (const auto & s : a.systems)
        if (s != "warmctx-semantic" && s != "warmctx-lru" && s != "llama-server" && s != "warmctx-defaults" &&
            s != "llama-server-defaults") {
            return invalid_argument("--systems: unknown system '" + s +
                                    "' (warmctx-semantic, warmctx-lru, llama-server, warmctx-defaults, "
                                    "llama-server-defaults)");
        }
    if (a.server_cache_ram_mib < 0) return invalid_argument("--server-cache-ram-mib must be >= 0");
    if (a.budget_mib < 0) return invalid_argument("--budget-mib must be >= 0");
    if (a.messages != "segments" && a.messages != "plain")
        return invalid_argument("--messages must be segments or plain");
    return {};
}

// What each turn sends: its segments, or (plain) its chat messages; and the tokens
// warmctx assembles from them, which llama-server gets.
result<trace_prompts> build_trace_prompts(prompt_builder & pb, const agent_trace & tr, size_t n_workspaces,
                                          bool plain) {
    trace_prompts p;
    p.stable_prompt.assign(n_workspaces, 0);
    for (const auto & turn : tr.turns) {
        std::vector<segment> segs = turn.segments;
        // the stable part: the stable segments, or (plain) the system message
        std::vector<segment> stable(turn.segments.begin(), turn.segments.begin() + (std::ptrdiff_t)turn.n_stable);
        if (plain) {
            json msgs = json::array();
            for (const auto & m : trace_chat_messages(turn)) msgs.push_back({{"role", m.role}, {"content", m.content}});
            auto cs = chat_segments(msgs);
            if (!cs) return cs.error();
            segs = std::move(*cs);
            auto ss = chat_segments(json::array({msgs[0]}));
            if (!ss) return ss.error();
            stable = std::move(*ss);
            p.chats.push_back(std::move(msgs));
        }
        auto t = pb.tokens(segs);
        if (!t) return t.error();
        p.max_prompt = std::max(p.max_prompt, t->size());
        p.total_prompt += t->size();
        if (p.stable_prompt[(size_t)turn.workspace] == 0) {
            auto st = pb.tokens(stable);
            if (st) p.stable_prompt[(size_t)turn.workspace] = st->size();
        }
        if (!turn.edited.empty()) ++p.n_edits;
        p.history_of_turn.push_back(turn.n_history);
        p.tokens.push_back(std::move(*t));
    }
    p.bpt = pb.kv_bytes_per_token();
    p.model_path = pb.model_path();
    p.model_desc = pb.model_description();
    return p;
}

result<trace_budget> make_trace_budget(const trace_args & a, const trace_prompts & p) {
    trace_budget b;
    for (size_t s : p.stable_prompt) b.stable_sum += s;
    b.mf = a.mf;
    b.mf.model = p.model_path;
    const uint32_t chunk = std::max<uint32_t>(1, b.mf.chunk);
    b.mf.n_ctx = (uint32_t)((p.max_prompt + 64 + chunk - 1) / chunk * chunk);
    // llama.cpp pads a stream to a multiple of 256 cells.
    b.stream_bytes = (uint64_t)((b.mf.n_ctx + 255) / 256 * 256) * p.bpt;
    b.stream_mib = (double)b.stream_bytes / (1 << 20);

    // Every system allocates the same KV bytes: warmctx its work stream + its pool,
    // llama-server its slot + --cache-ram. (The default A is what it was when warmctx
    // also allocated a cold stream: two streams + 40% of the stable prompts' KV.)
    b.budget_mib = a.budget_mib;
    if (b.budget_mib == 0)
        b.budget_mib = std::ceil(2 * b.stream_mib + 0.4 * (double)(b.stable_sum * p.bpt) / (1 << 20));
    if ((uint64_t)(b.budget_mib * (1 << 20)) <= b.stream_bytes)
        return invalid_argument("--budget-mib " + std::to_string(b.budget_mib) + " does not exceed one KV stream (" +
                                std::to_string(b.stream_mib) + " MiB)");
    b.slot_mib = b.stream_mib;
    // llama-server takes --cache-ram in whole MiB; warmctx's pool gets exactly as many
    // bytes, so both allocate the same A (a little under --budget-mib).
    b.server_cache_ram_mib = a.server_cache_ram_mib > 0 ? (int)std::ceil(a.server_cache_ram_mib)
                                                        : std::max(1, (int)std::floor(b.budget_mib - b.slot_mib));
    b.budget_bytes = (uint64_t)b.server_cache_ram_mib << 20;  // warmctx's pool
    b.allocated_bytes = b.stream_bytes + b.budget_bytes;
    return b;
}

// The report's head: the model, the trace and the budget.
json trace_report_head(const trace_args & a, const agent_trace & tr, const trace_prompts & p, const trace_budget & b) {
    const uint64_t bpt = p.bpt;
    json out = {{"bench", "trace"},
                {"model", p.model_path},
                {"model_desc", p.model_desc},
                {"backend", backend_name()},
                {"trace",
                 {{"seed", a.t.seed},
                  {"workspaces", a.t.n_workspaces},
                  {"turns", a.t.n_turns},
                  {"zipf_s", a.t.zipf_s},
                  {"stable_tokens_mean", a.t.stable_tokens},
                  {"edit_prob", a.t.edit_prob},
                  {"tail_tokens_mean", a.t.tail_tokens},
                  {"stable_prompt_tokens", p.stable_prompt},
                  {"history_window", a.t.history_window},
                  {"messages", a.messages},
                  {"edits", p.n_edits},
                  {"prompt_tokens_total", p.total_prompt},
                  {"max_prompt_tokens", p.max_prompt}}},
                {"budget",
                 {{"mib", b.budget_mib},
                  {"allocated_bytes", b.allocated_bytes},
                  {"bytes", b.budget_bytes},
                  {"kv_bytes_per_token", bpt},
                  {"tokens", bpt ? b.budget_bytes / bpt : 0},
                  {"stream_bytes", b.stream_bytes},
                  {"warmctx_allocated_bytes", b.stream_bytes + b.budget_bytes},
                  {"llama_server_slot_mib", b.slot_mib},
                  {"llama_server_cache_ram_mib", b.server_cache_ram_mib},
                  {"llama_server_allocated_bytes", b.stream_bytes + (uint64_t)b.server_cache_ram_mib * (1 << 20)},
                  {"stable_kv_fraction",
                   b.stable_sum ? (double)(b.budget_bytes / std::max<uint64_t>(1, bpt)) / (double)b.stable_sum : 0.0}}},
                {"n_ctx", b.mf.n_ctx}};
    json workspace_of = json::array();
    for (const auto & turn : tr.turns) workspace_of.push_back(turn.workspace);
    out["trace"]["workspace_of_turn"] = workspace_of;
    // What reuse exact to the token of each workspace's previous prompt (in the kind
    // table's order, as llama-server is sent it) would prefill: the first turn of a
    // workspace whole, every later one from its first changed token on. Reuse across
    // workspaces can go below it; a different order (warmctx's learned one) too.
    uint64_t floor = 0;
    json floor_of = json::array();
    std::map<int, size_t> last_of;
    for (size_t i = 0; i < tr.turns.size(); ++i) {
        const auto & t = p.tokens[i];
        size_t common = 0;
        if (auto it = last_of.find(tr.turns[i].workspace); it != last_of.end()) {
            const auto & prev = p.tokens[it->second];
            common = (size_t)(std::mismatch(prev.begin(), prev.end(), t.begin(), t.end()).first - prev.begin());
        }
        last_of[tr.turns[i].workspace] = i;
        floor += t.size() - common;
        floor_of.push_back(t.size() - common);
    }
    out["trace"]["same_workspace_floor_tokens"] = floor;
    out["trace"]["same_workspace_floor_tokens_of_turn"] = floor_of;
    out["trace"]["history_messages_of_turn"] = p.history_of_turn;
    out["warm_turn_max_prefilled_tokens"] = k_warm_max_prefill;
    return out;
}

// Starts one of the systems: llama-server (under the budget, or at its defaults) or
// warmctx (semantic, LRU, or at serve's defaults).
result<std::unique_ptr<bench_system>> start_trace_system(const std::string & name, const trace_args & a,
                                                         const trace_prompts & p, const trace_budget & b) {
    if (name == "llama-server" || name == "llama-server-defaults") {
        llama_server_options o;
        o.name = name;
        o.binary = a.llama_server;
        o.mf = b.mf;
        o.slots = 1;
        o.cache_ram_mib = b.server_cache_ram_mib;
        o.defaults = name == "llama-server-defaults";
        o.kv_bytes_per_token = p.bpt;
        return start_llama_server(o);
    }
    warmctx_system_options o;
    o.name = name;
    o.mf = b.mf;
    if (name == "warmctx-defaults") {
        o.mf.n_ctx = a.mf.n_ctx;  // as given (0: automatic), like serve
        o.cf = cache_flags{};     // the default byte budget
        o.parallel = scheduler_options{}.n_parallel;  // serve's default --parallel
        o.resident_streams = a.resident_streams;      // and --resident-streams
        o.default_disk = true;                        // and its disk tier
    } else {
        o.cf.budget_bytes = b.budget_bytes;
        o.cf.policy = name == "warmctx-lru" ? "lru" : "semantic";
        o.padding_within_n_ctx = true;  // one stream of the slot's cells (n_ctx has room for the padding)
    }
    return start_warmctx_system(o);
}

// One system's replay as it goes: the series and sums its report is made of.
struct trace_replay {
    std::vector<double> ttft, warm_ttft, unaccounted;
    json per_turn_ttft = json::array(), per_turn_cached = json::array(), per_turn_prompt = json::array();
    json per_turn_unaccounted = json::array(), per_turn_timings = json::array(), per_turn_reason = json::array();
    std::map<std::string, double> phase_sum;  // every numeric key of warmctx.timings
    uint64_t prompt_total = 0, cached_total = 0;
    // warmctx: prompt tokens not shared with the workspace's previous prompt, in its own
    // order (warmctx.tokens_common_with_previous_turn; a workspace's first turn whole).
    uint64_t own_floor = 0;
    bool has_own_floor = false;
    int mismatches = 0;

    void add(const turn_timing & r) {
        ttft.push_back(r.ttft_ms);
        if (r.prompt_tokens - std::max(0, r.cached_tokens) <= k_warm_max_prefill) warm_ttft.push_back(r.ttft_ms);
        if (r.timings.is_object()) {
            // Each numeric key is a phase, whatever the server names; the rest of the
            // client's TTFT is unaccounted (negative when the phases overlap or
            // exceed it: reported as is).
            double sum = 0;
            for (auto it = r.timings.begin(); it != r.timings.end(); ++it) {
                if (!it.value().is_number()) continue;
                const double v = it.value().get<double>();
                phase_sum[it.key()] += v;
                sum += v;
            }
            unaccounted.push_back(r.ttft_ms - sum);
            per_turn_unaccounted.push_back(r.ttft_ms - sum);
            per_turn_timings.push_back(r.timings);
            per_turn_reason.push_back(r.reason);
        } else {
            per_turn_unaccounted.push_back(nullptr);
            per_turn_timings.push_back(nullptr);
            per_turn_reason.push_back(nullptr);
        }
        per_turn_ttft.push_back(r.ttft_ms);
        per_turn_cached.push_back(r.cached_tokens);
        per_turn_prompt.push_back(r.prompt_tokens);
        prompt_total += (uint64_t)r.prompt_tokens;
        cached_total += (uint64_t)std::max(0, r.cached_tokens);
        if (r.timings.is_object()) {
            has_own_floor = true;
            own_floor += (uint64_t)(r.prompt_tokens - std::clamp(r.common_tokens, 0, r.prompt_tokens));
        }
    }

    json report(const std::string & name, double wall_ms, bench_system & sys) const {
        json s = {
            {"name", name},
            {"prefilled_tokens", prompt_total - cached_total},
            {"cached_tokens", cached_total},
            {"prompt_tokens", prompt_total},
            {"cached_ratio", prompt_total ? (double)cached_total / (double)prompt_total : 0.0},
            {"ttft_p50_ms", percentile(ttft, 0.5)},
            {"ttft_p95_ms", percentile(ttft, 0.95)},
            {"ttft_mean_ms", summarize(ttft).mean},
            {"ttft_max_ms", max_or_null(ttft)},
            {"ttft_histogram", ttft_histogram(ttft)},
            {"warm_turns", warm_ttft.size()},
            {"warm_ttft_p50_ms", ms_or_null(warm_ttft, 0.5)},
            {"warm_ttft_p95_ms", ms_or_null(warm_ttft, 0.95)},
            {"warm_ttft_max_ms", max_or_null(warm_ttft)},
            {"prompt_token_mismatches", mismatches},
            {"wall_ms", wall_ms},
            {"config", sys.describe()},
            {"end_state", sys.state()},
            {"per_turn",
             {{"ttft_ms", per_turn_ttft}, {"cached_tokens", per_turn_cached}, {"prompt_tokens", per_turn_prompt}}}};
        if (!unaccounted.empty()) {
            json sums = json::object();
            double total = 0, unaccounted_sum = 0;
            for (const auto & [k, v] : phase_sum) { sums[k] = v; total += v; }
            for (double x : unaccounted) unaccounted_sum += x;
            s["phases"] = {{"turns", unaccounted.size()}, {"sum_ms", sums}, {"total_ms", total}};
            s["unaccounted"] = {{"sum_ms", unaccounted_sum},
                                {"p50_ms", percentile(unaccounted, 0.5)},
                                {"p95_ms", percentile(unaccounted, 0.95)},
                                {"max_ms", max_or_null(unaccounted)},
                                {"min_ms", *std::min_element(unaccounted.begin(), unaccounted.end())}};
            s["per_turn"]["unaccounted_ms"] = per_turn_unaccounted;
            s["per_turn"]["timings"] = per_turn_timings;
            s["per_turn"]["reason"] = per_turn_reason;
        }
        if (has_own_floor) s["own_order_floor_tokens"] = own_floor;
        return s;
    }
};

// Sends every turn, in trace order, to one system; its entry of the report.
result<json> replay_trace(const std::string & name, bench_system & sys, const agent_trace & tr,
                          const trace_prompts & p, bool plain) {
    progress(name + ": replaying " + std::to_string(tr.turns.size()) + " turns");
    trace_replay rp;
    const auto t0 = clock_type::now();
    for (size_t i = 0; i < tr.turns.size(); ++i) {
        const auto & turn = tr.turns[i];
        auto r = plain ? sys.send_chat(p.chats[i], p.tokens[i], 1)
                       : sys.send(tr.workspace_ids[(size_t)turn.workspace], turn.segments, p.tokens[i], 1);
        if (!r.ok) return engine_error(name + ": turn " + std::to_string(i) + " failed: " + r.error);
        if ((size_t)r.prompt_tokens != p.tokens[i].size()) {
            ++rp.mismatches;
            progress(name + ": turn " + std::to_string(i) + " reports " + std::to_string(r.prompt_tokens) +
                     " prompt tokens, expected " + std::to_string(p.tokens[i].size()));
        }
        rp.add(r);
        if ((i + 1) % 10 == 0 || i + 1 == tr.turns.size())
            progress(name + ": " + std::to_string(i + 1) + "/" + std::to_string(tr.turns.size()) + " turns");
    }
    const double wall_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
    json s = rp.report(name, wall_ms, sys);
    progress(name + ": prefilled " + std::to_string(rp.prompt_total - rp.cached_total) + " tokens, TTFT p50 " +
             std::to_string(percentile(rp.ttft, 0.5)) + " ms");
    return s;
}

// The targets, stated as ratios the report can check.
json trace_ratios(const json & systems) {
    auto find = [&](const std::string & n) -> const json * {
        for (const auto & s : systems) if (s["name"] == n) return &s;
        return nullptr;
    };
    json ratios = json::object();
    if (auto * sem = find("warmctx-semantic")) {
        if (auto * lru = find("warmctx-lru"); lru && (*lru)["prefilled_tokens"].get<uint64_t>() > 0)
            ratios["semantic_over_lru_prefilled"] =
                (double)(*sem)["prefilled_tokens"].get<uint64_t>() / (double)(*lru)["prefilled_tokens"].get<uint64_t>();
        if (auto * ls = find("llama-server"); ls && (*ls)["ttft_p50_ms"].get<double>() > 0)
            ratios["semantic_over_llama_server_ttft_p50"] =
                (*sem)["ttft_p50_ms"].get<double>() / (*ls)["ttft_p50_ms"].get<double>();
    }
    return ratios;
}

// The report as text: the budget, one line per system, the phases and the ratios.
void print_trace_report(const trace_args & a, const trace_prompts & p, const trace_budget & b, const json & systems,
                        const json & ratios) {
    const bool plain = a.messages == "plain";
    std::printf("allocated KV %.0f MiB each (warmctx: 1 stream of %.1f MiB + a pool of %llu tokens; llama-server: "
                "slot %.1f MiB + --cache-ram %d MiB); %d turns over %d workspaces, %d edits\n",
                b.budget_mib, b.stream_mib, (unsigned long long)(p.bpt ? b.budget_bytes / (p.bpt + 12) : 0),
                b.slot_mib, b.server_cache_ram_mib, a.t.n_turns, a.t.n_workspaces, p.n_edits);
    if (a.t.history_window != 0 || plain)
        std::printf("history window %s, sent as %s\n",
                    a.t.history_window < 0 ? "all" : std::to_string(a.t.history_window).c_str(),
                    plain ? "plain chat messages" : "segments");
    // A number to one decimal, or "-" where there is none (no warm turn).
    auto ms = [](const json & v) {
        char buf[32];
        if (!v.is_number()) return std::string("-");
        std::snprintf(buf, sizeof buf, "%.1f", v.get<double>());
        return std::string(buf);
    };
    std::printf("%-21s %10s %7s %10s %10s %10s %5s %10s %10s %8s\n", "system", "prefilled", "cached", "TTFT p50",
                "TTFT p95", "TTFT max", "warm", "warm p50", "warm p95", "wall s");
    for (const auto & s : systems)
        std::printf("%-21s %10llu %7.3f %10.1f %10.1f %10s %5d %10s %10s %8.1f\n", s["name"].get<std::string>().c_str(),
                    (unsigned long long)s["prefilled_tokens"].get<uint64_t>(), s["cached_ratio"].get<double>(),
                    s["ttft_p50_ms"].get<double>(), s["ttft_p95_ms"].get<double>(), ms(s["ttft_max_ms"]).c_str(),
                    s["warm_turns"].get<int>(), ms(s["warm_ttft_p50_ms"]).c_str(), ms(s["warm_ttft_p95_ms"]).c_str(),
                    s["wall_ms"].get<double>() / 1000);
    std::printf("(TTFT at the client, ms; warm: turns that prefilled <= %d tokens)\n", k_warm_max_prefill);
    for (const auto & s : systems) {
        if (!s.contains("phases")) continue;
        std::printf("%s: sums over %d turns of warmctx.timings, ms:", s["name"].get<std::string>().c_str(),
                    s["phases"]["turns"].get<int>());
        for (auto it = s["phases"]["sum_ms"].begin(); it != s["phases"]["sum_ms"].end(); ++it)
            std::printf(" %s %.1f", it.key().c_str(), it.value().get<double>());
        const json & u = s["unaccounted"];
        std::printf("; unaccounted (TTFT - phases) sum %.1f, per turn p50 %.2f p95 %.2f max %.2f\n",
                    u["sum_ms"].get<double>(), u["p50_ms"].get<double>(), u["p95_ms"].get<double>(),
                    u["max_ms"].get<double>());
    }
    for (auto it = ratios.begin(); it != ratios.end(); ++it)
        std::printf("%s: %.3f\n", it.key().c_str(), it.value().get<double>());
}

int run_trace(trace_args a) {
    if (auto st = check_trace_args(a); !st.ok()) return fail(st);
    const bool plain = a.messages == "plain";
    auto pb = prompt_builder::open(a.mf);
    if (!pb) return fail(pb.error());
    progress("generating the trace: " + std::to_string(a.t.n_workspaces) + " workspaces, " +
             std::to_string(a.t.n_turns) + " turns");
    auto tr = make_agent_trace(a.t, (*pb)->counter());
    if (!tr) return fail(tr.error());
    auto prompts = build_trace_prompts(**pb, *tr, (size_t)a.t.n_workspaces, plain);
    if (!prompts) return fail(prompts.error());
    pb->reset();
    auto budget = make_trace_budget(a, *prompts);
    if (!budget) return fail(budget.error());

    json out = trace_report_head(a, *tr, *prompts, *budget);
    json systems = json::array();
    for (const auto & name : a.systems) {
        auto sys = start_trace_system(name, a, *prompts, *budget);
        if (!sys) return fail(sys.error());
        auto s = replay_trace(name, **sys, *tr, *prompts, plain);
        if (!s) return fail(s.error());
        systems.push_back(std::move(*s));
    }
    out["systems"] = systems;
    const json ratios = trace_ratios(systems);
    out["ratios"] = ratios;
    if (a.json_out) { std::printf("%s\n", out.dump(2).c_str()); return 0; }
    print_trace_report(a, *prompts, *budget, systems, ratios);
    return 0;
}

}  // namespace

void register_trace_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<trace_args>();
    auto * c = bench.add_subcommand("trace",
                                    "replay a seeded multi-workspace agent trace against warmctx (semantic, LRU) and "
                                    "llama-server under one KV budget");
    a->mf.add_to(*c, false);
    c->add_option("--workspaces", a->t.n_workspaces, "workspaces")->capture_default_str();
    c->add_option("--turns", a->t.n_turns, "turns")->capture_default_str();
    c->add_option("--zipf", a->t.zipf_s, "Zipf exponent of workspace popularity")->capture_default_str();
    c->add_option("--stable-tokens", a->t.stable_tokens, "mean stable context per workspace, tokens (0.5x..1.5x)")
        ->capture_default_str();
    c->add_option("--tail-tokens", a->t.tail_tokens, "mean diff + test output per turn, tokens")->capture_default_str();
    c->add_option("--edit-prob", a->t.edit_prob, "chance per turn that a stable segment changes")
        ->capture_default_str();
    c->add_option("--seed", a->t.seed, "trace seed")->capture_default_str();
    c->add_option("--resident-streams", a->resident_streams,
                  "warmctx-defaults' --resident-streams (-1: serve's default, sized from memory)")
        ->capture_default_str()
        ->check(CLI::Range(-1, 255));
    c->add_option("--budget-mib", a->budget_mib,
                  "KV every system allocates, MiB: streams/slots + pool/--cache-ram (0 = two streams + 40% of all "
                  "stable prompts' KV)")
        ->capture_default_str();
    c->add_option("--server-cache-ram-mib", a->server_cache_ram_mib,
                  "llama-server's --cache-ram, MiB (0 = the budget less its slot)")
        ->capture_default_str();
    c->add_option("--systems", a->systems,
                  "systems: warmctx-semantic, warmctx-lru, llama-server (equal allocated KV), warmctx-defaults, "
                  "llama-server-defaults")
        ->delimiter(',')
        ->capture_default_str();
    c->add_option("--llama-server", a->llama_server, "llama-server binary")->capture_default_str();
    c->add_option("--history-window", a->t.history_window,
                  "earlier messages of its workspace's conversation each turn sends, the last N (the window "
                  "slides); 0 = none, the stateless trace; -1 = all")
        ->check(CLI::Range(-1, 1 << 20))
        ->capture_default_str();
    c->add_option("--messages", a->messages,
                  "how warmctx is sent a turn: segments (typed, with the workspace) or plain (OpenAI chat "
                  "messages: system, history, user; no workspace or segments); llama-server gets the tokens "
                  "warmctx assembles either way")
        ->check(CLI::IsMember({"segments", "plain"}))
        ->capture_default_str();
    c->add_flag("--quick", a->quick, "a small trace (4 workspaces, 24 turns, ~1.5k-token stable contexts)");
    c->add_flag("--json", a->json_out,
                "print JSON (per system: TTFT p50/p95/max/histogram and per-turn series, warm turns' count and "
                "TTFT p50/p95; warmctx: the sum of each warmctx.timings phase and the unaccounted TTFT)");
    on_run(c, rc, [a] { return run_trace(*a); });
}

}  // namespace warmctx::cli
