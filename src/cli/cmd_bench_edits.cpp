// warmctx-bench edits - what an edit of a stable segment costs: a workspace of ten pinned
// files and a repository map, one segment edited per turn with a skew (a few files are
// edited often, most rarely), sent to warmctx (its learned order and finer blocks), to
// warmctx with --fixed-order (the kind table's order and whole chunks) and to
// llama-server (the prompt in the kind table's order, as an agent sends it; its prompt
// cache reuses up to the first changed token), one after another in one run. The files
// are generated, or with --files-from the heads of real source files.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench_harness.h"

namespace warmctx::cli {
namespace {

using json = nlohmann::json;

struct edits_args {
    model_flags mf;
    int n_files = 10;
    size_t file_tokens = 600;
    size_t map_tokens = 2000;
    int turns = 40;
    double skew = 1.2;  // Zipf exponent of the segments' edit frequencies
    std::vector<std::string> systems = {"warmctx", "warmctx-fixed", "llama-server"};
    std::string llama_server = default_tool("llama-server");
    uint64_t seed = 5;
    std::string files_from;  // a directory of real source files ("": generated files)
    bool json_out = false;
};

// One turn of the workload: its segments, the one stable segment it edited ("" on the
// first) and that segment's tokens.
struct edit_turn {
    std::vector<segment> segs;
    std::vector<token_id> tokens;  // in the kind table's order (llama-server's prompt)
    std::string edited;
    size_t edited_tokens = 0;
    size_t edited_at = 0;     // byte offset of the edited line in the segment
    size_t edited_bytes = 0;  // the segment's bytes after the edit
};

// Replaces one line at a random place of `text` with a line of the same shape.
std::string edit_random_line(workload_generator & g, const std::string & text, size_t & at_line) {
    at_line = 0;
    if (text.empty()) return "// edited\n";
    size_t at = g.rng()() % text.size();
    size_t b = text.rfind('\n', at == 0 ? 0 : at - 1);
    b = b == std::string::npos ? 0 : b + 1;
    at_line = b;
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    return text.substr(0, b) + "    edited_" + std::to_string(g.rng()() % 100000) + "(); // " +
           std::to_string(g.rng()() % 1000) + text.substr(e);
}

// --files-from: `n` source files under `dir` (by extension, at least 2 KiB), spread evenly
// over their sorted paths, each cut at a line end to about `tokens` tokens. Their paths
// are relative to `dir`.
result<std::vector<std::pair<std::string, std::string>>> real_files(const std::string & dir, int n, size_t tokens,
                                                                     const workload_generator & g) {
    namespace fs = std::filesystem;
    static const std::vector<std::string> exts = {".cc", ".cpp", ".c",  ".h",  ".hpp", ".py",
                                                  ".ts", ".js",  ".go", ".rs", ".java"};
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return invalid_argument("--files-from: '" + dir + "' is not a directory");
    std::vector<std::string> paths;
    for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (!it->is_regular_file(ec)) continue;
        const std::string ext = it->path().extension().string();
        if (std::find(exts.begin(), exts.end(), ext) == exts.end() || it->file_size(ec) < 2048) continue;
        paths.push_back(fs::relative(it->path(), dir, ec).generic_string());
    }
    std::sort(paths.begin(), paths.end());
    if ((int)paths.size() < n)
        return invalid_argument("--files-from: '" + dir + "' has " + std::to_string(paths.size()) +
                                " source files of at least 2 KiB, --files asks for " + std::to_string(n));
    std::vector<std::pair<std::string, std::string>> out;
    for (int i = 0; i < n; ++i) {
        const std::string & rel = paths[(size_t)i * paths.size() / (size_t)n];
        std::ifstream f(fs::path(dir) / rel, std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        std::string text = ss.str();
        // Cut at a line end where the head reaches `tokens` (bisected over line ends).
        if (g.count(text) > tokens) {
            size_t lo = 0, hi = text.size();
            while (hi - lo > 64) {
                const size_t mid = text.rfind('\n', lo + (hi - lo) / 2);
                if (mid == std::string::npos || mid <= lo) break;
                (g.count(text.substr(0, mid + 1)) > tokens ? hi : lo) = mid + 1;
            }
            text.resize(lo > 0 ? lo : std::min(text.size(), tokens * 3));
        }
        out.emplace_back(rel, std::move(text));
    }
    return out;
}

result<std::vector<edit_turn>> build_edit_turns(const edits_args & a, prompt_builder & pb) {
    workload_generator g(a.seed, pb.counter());
    std::vector<segment> segs;
    segs.push_back({"system", segment_kind::system, "", "", g.system_prompt()});
    segs.push_back({"tools", segment_kind::tools, "", "", g.tool_schemas(4)});
    segs.push_back({"rules", segment_kind::instructions, "", "", g.repo_rules()});
    segs.push_back({"repo-map", segment_kind::repo_map, "", "", g.repo_map(a.map_tokens)});
    std::vector<size_t> editable = {3};
    std::vector<std::pair<std::string, std::string>> real;
    if (!a.files_from.empty()) {
        auto r = real_files(a.files_from, a.n_files, a.file_tokens, g);
        if (!r) return r.error();
        real = std::move(*r);
    }
    for (int i = 0; i < a.n_files; ++i) {
        char path[64];
        std::snprintf(path, sizeof path, "src/module_%02d.cc", i);
        const std::string id = "pin-" + std::to_string(i);
        if (real.empty()) segs.push_back({id, segment_kind::pinned_file, path, "", g.source_file(path, a.file_tokens)});
        else segs.push_back({id, segment_kind::pinned_file, real[(size_t)i].first, "", real[(size_t)i].second});
        editable.push_back(segs.size() - 1);
    }
    segs.push_back({"question", segment_kind::user, "", "", g.question()});
    // Which segment each rank of the Zipf distribution is: the files in a shuffled order,
    // the repository map among them.
    std::shuffle(editable.begin(), editable.end(), g.rng());
    std::vector<double> w;
    for (size_t r = 0; r < editable.size(); ++r) w.push_back(1.0 / std::pow((double)r + 1, a.skew));
    std::discrete_distribution<size_t> pick(w.begin(), w.end());

    std::vector<edit_turn> turns;
    for (int t = 0; t < a.turns; ++t) {
        edit_turn et;
        if (t > 0) {
            segment & s = segs[editable[pick(g.rng())]];
            s.content = edit_random_line(g, s.content, et.edited_at);
            et.edited_bytes = s.content.size();
            et.edited = s.id;
            et.edited_tokens = g.count(s.content);
        }
        segs.back().content = g.question();
        et.segs = segs;
        auto toks = pb.tokens(segs);
        if (!toks) return toks.error();
        et.tokens = std::move(*toks);
        turns.push_back(std::move(et));
    }
    return turns;
}

result<std::unique_ptr<bench_system>> start_edits_system(const std::string & name, const edits_args & a,
                                                         const model_flags & mf, uint64_t bpt) {
    if (name == "warmctx" || name == "warmctx-fixed") {
        warmctx_system_options o;
        o.name = name;
        o.mf = mf;
        o.holders = 8;
        o.cf.fixed_order = name == "warmctx-fixed";
        return start_warmctx_system(o);
    }
    llama_server_options o;
    o.binary = a.llama_server;
    o.mf = mf;
    o.kv_bytes_per_token = bpt;
    return start_llama_server(o);
}

// The tokens a turn must prefill at least when reuse keeps the last turn's prompt up to
// its first changed token, no further (exact reuse of any kind recomputes every token
// after a change): warmctx says what its own prompt shares with the last one (its order
// is its own); another system is sent `et.tokens`, so the bench knows.
size_t floor_tokens(const edit_turn * prev, const edit_turn & et, const turn_timing & r) {
    const size_t n = (size_t)std::max(0, r.prompt_tokens);
    if (r.common_tokens >= 0) return n - std::min(n, (size_t)r.common_tokens);
    if (!prev) return n;
    const auto & a = prev->tokens;
    const auto & b = et.tokens;
    const size_t common = (size_t)(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
    return n - std::min(n, common);
}

// One system through every turn: per turn its prefilled tokens and time to first token.
result<json> run_edits_system(const std::string & name, const edits_args & a, const model_flags & mf, uint64_t bpt,
                              const std::vector<edit_turn> & turns) {
    auto sys = start_edits_system(name, a, mf, bpt);
    if (!sys) return sys.error();
    json prefilled = json::array(), ttft = json::array(), ratio = json::array(), timings = json::array();
    json reasons = json::array();  // warmctx: why each turn reused what it did
    json floors = json::array();   // floor_tokens of each turn
    std::vector<double> edited_ratio, edited_prefilled, edited_ratio_late, edited_ttft, floor_ratio;
    for (size_t t = 0; t < turns.size(); ++t) {
        const edit_turn & et = turns[t];
        auto r = (*sys)->send("edits", et.segs, et.tokens, 1);
        if (!r.ok) return engine_error(name + ": turn " + std::to_string(t) + " failed: " + r.error);
        const int n = r.prompt_tokens - r.cached_tokens;
        prefilled.push_back(n);
        ttft.push_back(r.ttft_ms);
        timings.push_back(r.timings);  // warmctx: where its first_token_ms went (null for llama-server)
        reasons.push_back(r.reason.empty() ? json() : json(r.reason));
        const size_t floor_n = floor_tokens(t > 0 ? &turns[t - 1] : nullptr, et, r);
        floors.push_back(floor_n);
        const double x = et.edited_tokens > 0 ? (double)n / (double)et.edited_tokens : 0.0;
        ratio.push_back(x);
        if (t > 0) {
            if (et.edited_tokens > 0) floor_ratio.push_back((double)floor_n / (double)et.edited_tokens);
            edited_ratio.push_back(x);
            edited_prefilled.push_back(n);
            edited_ttft.push_back(r.ttft_ms);
            if (t * 2 >= turns.size()) edited_ratio_late.push_back(x);
        }
        if (t % 10 == 0) progress(name + ": turn " + std::to_string(t) + ", prefilled " + std::to_string(n));
    }
    double total = 0;
    for (double p : edited_prefilled) total += p;
    return json{{"name", name},
                {"config", (*sys)->describe()},
                {"cold_prefilled_tokens", prefilled[0]},
                {"cold_ttft_ms", ttft[0]},
                {"edited_turns", edited_prefilled.size()},
                {"edited_prefilled_tokens_total", total},
                {"edited_prefilled_tokens_median", median(edited_prefilled)},
                {"edited_ttft_ms_median", median(edited_ttft)},
                {"edited_ttft_ms_p95", percentile(edited_ttft, 0.95)},
                {"prefilled_over_segment_tokens_median", median(edited_ratio)},
                {"prefilled_over_segment_tokens_median_second_half", median(edited_ratio_late)},
                // The same for floor_tokens: what reuse exact to the token would have
                // prefilled in this system's order.
                {"floor_over_segment_tokens_median", median(floor_ratio)},
                {"per_turn",
                 {{"prefilled_tokens", prefilled}, {"floor_tokens", floors}, {"ttft_ms", ttft},
                  {"prefilled_over_segment_tokens", ratio}, {"timings", timings}, {"reason", reasons}}}};
}

json edits_ratios(const json & systems) {
    json r = json::object();
    auto find = [&](const std::string & n) -> const json * {
        for (const auto & s : systems)
            if (s["name"] == n) return &s;
        return nullptr;
    };
    const json * w = find("warmctx");
    for (const char * other : {"llama-server", "warmctx-fixed"}) {
        const json * o = find(other);
        if (!w || !o) continue;
        const std::string k =
            std::string("warmctx_over_") + (std::string(other) == "llama-server" ? "llama_server" : "fixed");
        std::vector<double> per_turn;
        for (size_t t = 1; t < (*w)["per_turn"]["prefilled_tokens"].size(); ++t) {
            const double d = (*o)["per_turn"]["prefilled_tokens"][t].get<double>();
            per_turn.push_back(d > 0 ? (*w)["per_turn"]["prefilled_tokens"][t].get<double>() / d : 0.0);
        }
        r[k + "_prefilled_total"] = (*o)["edited_prefilled_tokens_total"].get<double>() > 0
                                        ? (*w)["edited_prefilled_tokens_total"].get<double>() /
                                              (*o)["edited_prefilled_tokens_total"].get<double>()
                                        : 0.0;
        r[k + "_prefilled_median"] = (*o)["edited_prefilled_tokens_median"].get<double>() > 0
                                         ? (*w)["edited_prefilled_tokens_median"].get<double>() /
                                               (*o)["edited_prefilled_tokens_median"].get<double>()
                                         : 0.0;
        r[k + "_prefilled_per_turn_median"] = median(per_turn);
    }
    return r;
}

int run_edits(const edits_args & a) {
    if (a.n_files < 1 || a.turns < 2 || a.file_tokens < 32 || a.map_tokens < 32)
        return fail(invalid_argument("--files >= 1, --turns >= 2, --file-tokens and --map-tokens >= 32"));
    for (const auto & s : a.systems)
        if (s != "warmctx" && s != "warmctx-fixed" && s != "llama-server")
            return fail(
                invalid_argument("--systems: unknown system '" + s + "' (warmctx, warmctx-fixed, llama-server)"));
    auto pb = prompt_builder::open(a.mf);
    if (!pb) return fail(pb.error());
    progress("building " + std::to_string(a.turns) + " turns of edits");
    auto turns = build_edit_turns(a, **pb);
    if (!turns) return fail(turns.error());
    model_flags mf = a.mf;
    mf.model = (*pb)->model_path();
    const std::string desc = (*pb)->model_description();
    const uint64_t bpt = (*pb)->kv_bytes_per_token();
    pb->reset();
    size_t longest = 0;
    for (const auto & t : *turns) longest = std::max(longest, t.tokens.size());
    const uint32_t chunk = std::max<uint32_t>(1, mf.chunk);
    mf.n_ctx = (uint32_t)((longest + 64 + chunk - 1) / chunk * chunk);

    json systems = json::array();
    for (const auto & name : a.systems) {
        auto r = run_edits_system(name, a, mf, bpt, *turns);
        if (!r) return fail(r.error());
        systems.push_back(std::move(*r));
    }
    json edited = json::array();
    json seg_tokens = json::array(), at = json::array(), seg_bytes = json::array();
    for (const auto & t : *turns) {
        edited.push_back(t.edited);
        seg_tokens.push_back(t.edited_tokens);
        seg_bytes.push_back(t.edited_bytes);
        at.push_back(t.edited_bytes > 0 ? (double)t.edited_at / (double)t.edited_bytes : 0.0);
    }
    json out = {{"bench", "edits"},
                {"model", mf.model},
                {"model_desc", desc},
                {"backend", backend_name()},
                {"workload",
                 {{"files", a.n_files},
                  {"file_tokens", a.file_tokens},
                  {"files_from", a.files_from},
                  {"map_tokens", a.map_tokens},
                  {"turns", a.turns},
                  {"skew", a.skew},
                  {"seed", a.seed},
                  {"prompt_tokens_first", (*turns)[0].tokens.size()},
                  {"edited_segment_of_turn", edited},
                  {"edited_segment_tokens_of_turn", seg_tokens},
                  {"edited_segment_bytes_of_turn", seg_bytes},
                  {"edited_line_at_fraction_of_turn", at}}},
                {"systems", systems},
                {"ratios", edits_ratios(systems)}};
    if (a.json_out) {
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    std::printf("%-14s %10s %14s %14s %16s %14s %12s\n", "system", "cold", "edited median", "edited total",
                "median/segment", "floor/segment", "ttft p50 ms");
    for (const auto & s : systems)
        std::printf("%-14s %10d %14.0f %14.0f %16.3f %14.3f %12.1f\n", s["name"].get<std::string>().c_str(),
                    s["cold_prefilled_tokens"].get<int>(), s["edited_prefilled_tokens_median"].get<double>(),
                    s["edited_prefilled_tokens_total"].get<double>(),
                    s["prefilled_over_segment_tokens_median"].get<double>(),
                    s["floor_over_segment_tokens_median"].get<double>(), s["edited_ttft_ms_median"].get<double>());
    std::printf("%s\n", out["ratios"].dump().c_str());
    return 0;
}

}  // namespace

void register_edits_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<edits_args>();
    auto * c = bench.add_subcommand(
        "edits", "one stable segment edited per turn (a few files often): prefilled tokens per edit, warmctx (learned "
                 "order, finer blocks), warmctx --fixed-order and llama-server");
    a->mf.add_to(*c, false);
    c->add_option("--files", a->n_files, "pinned files")->capture_default_str();
    c->add_option("--file-tokens", a->file_tokens, "tokens per pinned file")->capture_default_str();
    c->add_option("--map-tokens", a->map_tokens, "tokens of the repository map")->capture_default_str();
    c->add_option("--turns", a->turns, "turns (the first cold, each later one edits one segment)")
        ->capture_default_str();
    c->add_option("--skew", a->skew, "Zipf exponent of the segments' edit frequencies")->capture_default_str();
    c->add_option("--systems", a->systems, "systems to run: warmctx, warmctx-fixed, llama-server")
        ->delimiter(',')
        ->capture_default_str();
    c->add_option("--llama-server", a->llama_server, "llama-server binary")->capture_default_str();
    c->add_option("--seed", a->seed, "workload seed")->capture_default_str();
    c->add_option("--files-from", a->files_from,
                  "take the pinned files from this directory's source files (spread over its sorted paths, each "
                  "cut at a line end to about --file-tokens) instead of generating them");
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_edits(*a); });
}

}  // namespace warmctx::cli
