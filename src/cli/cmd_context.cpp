// warmctx demo | verify | assemble
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.h"
#include "warmctx/context_engine.h"
#include "server/explain_format.h"
#include "util/json.h"
#include "runtime/verify.h"
#include "workload/workload.h"

namespace warmctx::cli {
namespace {

// ---- demo -------------------------------------------------------------------

struct demo_args {
    model_flags mf;
    cache_flags cf;
    size_t prefix_tokens = 2048;
    int32_t max_tokens = 4;
    uint64_t seed = 1;
    bool json = false;
};

int run_demo(demo_args a) {
    if (a.prefix_tokens < 256 || a.prefix_tokens > 200000)
        return fail(invalid_argument("--prefix-tokens must be in [256, 200000]"));
    // Enough context for the prefix, the question and the answer.
    const uint32_t need = (uint32_t)a.prefix_tokens + 512 + (uint32_t)a.max_tokens;
    if (a.mf.n_ctx < need) a.mf.n_ctx = need;
    auto eo = a.mf.to_options(1);
    if (!eo) return fail(eo.error());
    context_engine_options co;
    co.engine = *eo;
    co.n_holders = 2;
    if (status st = a.cf.apply(co); !st.ok()) return fail(st);
    progress("loading " + eo->model_path);
    auto ce_r = context_engine::open(co);
    if (!ce_r) return fail(ce_r.error());
    context_engine & ce = **ce_r;
    workload_generator g(a.seed, counter_for(ce));
    progress("building a workspace with a ~" + std::to_string(a.prefix_tokens) + "-token stable prefix");
    std::vector<segment> segs = make_workspace(g, a.prefix_tokens, 2);

    // Warm the runtime with a short unrelated prompt so one-time setup is excluded.
    turn_request warmup;
    warmup.workspace = "warm-up";
    warmup.segments = {{"q", segment_kind::user, "", "", "hello"}};
    warmup.sampling.max_tokens = 1;
    if (auto w = ce.run_cold(warmup); !w) return fail(w.error());

    struct row { std::string turn; turn_result r; };
    std::vector<row> rows;
    auto turn = [&](const std::string & name, std::vector<segment> s) -> status {
        turn_request req;
        req.workspace = "demo";
        req.segments = std::move(s);
        req.sampling.max_tokens = a.max_tokens;
        progress("turn '" + name + "' ...");
        auto r = ce.run_turn(req);
        if (!r) return r.error();
        rows.push_back({name, std::move(r.value())});
        return {};
    };
    if (status st = turn("cold", segs); !st.ok()) return fail(st);
    segs.back().content = g.question();  // same stable prefix, a new question
    if (status st = turn("warm", segs); !st.ok()) return fail(st);
    // Edit one line of the repo map, three turns running: a stable segment changes. The
    // first edit cuts it into finer blocks; the second ranks it as often edited and moves
    // it after the pinned files (the edit re-prefills from there anyway); the third
    // re-prefills only the map from its edited line on (warmctx/volatility.h).
    for (const char * name : {"edited", "edited-2", "edited-3"}) {
        for (auto & s : segs)
            if (s.kind == segment_kind::repo_map) s.content = g.edit_one_line(s.content);
        segs.back().content = g.question();
        if (status st = turn(name, segs); !st.ok()) return fail(st);
    }

    const double cold_ms = rows[0].r.t_total_ms;
    if (a.json) {
        nlohmann::json j;
        j["model"] = eo->model_path;
        j["prefix_tokens_target"] = a.prefix_tokens;
        j["threads"] = ce.context().n_threads;
        j["rows"] = nlohmann::json::array();
        for (const auto & r : rows)
            j["rows"].push_back({{"turn", r.turn}, {"ms", r.r.t_total_ms}, {"ttft_ms", r.r.t_first_token_ms},
                                 {"copy_ms", r.r.t_copy_ms}, {"prefill_ms", r.r.t_prefill_ms},
                                 {"prompt_tokens", r.r.explain.n_prompt_tokens},
                                 {"tokens_reused", r.r.explain.n_reused}, {"tokens_prefilled", r.r.explain.n_prefilled},
                                 {"stable_prefix_hash", r.r.stable_prefix_hash},
                                 {"ratio_to_cold", cold_ms > 0 ? r.r.t_total_ms / cold_ms : 0.0},
                                 {"prefilled_ratio_to_cold",
                                  (double)r.r.explain.n_prefilled / std::max(1, rows[0].r.explain.n_prefilled)},
                                 {"explain", explain_json(r.r.explain)}});
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("\nwarmctx demo: model %s, %d threads, %d-token prompt\n\n", ce.model().description.c_str(),
                ce.context().n_threads, rows[0].r.explain.n_prompt_tokens);
    std::printf("%-8s %10s %10s %8s %10s  %-14s %s\n", "turn", "ms", "ttft ms", "reused", "prefilled", "stable hash",
                "vs cold");
    for (const auto & r : rows)
        std::printf("%-8s %10.1f %10.1f %8d %10d  %-14s %6.3fx\n", r.turn.c_str(), r.r.t_total_ms, r.r.t_first_token_ms,
                    r.r.explain.n_reused, r.r.explain.n_prefilled, r.r.stable_prefix_hash.substr(0, 12).c_str(),
                    cold_ms > 0 ? r.r.t_total_ms / cold_ms : 0.0);
    std::printf("\nexplain, warm turn:\n%s\nexplain, edited turn:\n%s\nexplain, second edit (the order changes):\n%s"
                "\nexplain, third edit:\n%s",
                explain_text(rows[1].r.explain).c_str(), explain_text(rows[2].r.explain).c_str(),
                explain_text(rows[3].r.explain).c_str(), explain_text(rows[4].r.explain).c_str());
    return 0;
}

// ---- verify -----------------------------------------------------------------

struct verify_args {
    model_flags mf;
    cache_flags cf;
    int scenarios = 20;
    uint64_t seed = 1;
    size_t stable_tokens_max = 700;
    int32_t max_tokens = 8;
    int32_t draft_max = -1;
    uint32_t holders = 4;
    bool tiers = true;
    double seconds = 0;
    std::string stream_copies = "auto";
    bool json = false;
};

// Exit code: 0 when every expectation held and (exact mode) every warm turn equalled
// its cold reference, 1 otherwise; an error's code when verify could not run.
int run_verify(const verify_args & a) {
    if (a.scenarios < 1) return fail(invalid_argument("--scenarios must be >= 1"));
    verify_options vo;
    vo.scenarios = a.scenarios;
    vo.seed = a.seed;
    vo.stable_tokens_max = a.stable_tokens_max;
    vo.max_tokens = a.max_tokens;
    vo.draft_max = a.draft_max;
    vo.tiers = a.tiers;
    vo.max_seconds = a.seconds;
    auto eo = a.mf.to_options(1);
    if (!eo) return fail(eo.error());
    vo.engine.engine = *eo;
    vo.engine.n_holders = a.holders;
    vo.engine.stream_copies = a.stream_copies == "on"    ? context_engine_options::stream_copy_mode::on
                              : a.stream_copies == "off" ? context_engine_options::stream_copy_mode::off
                                                         : context_engine_options::stream_copy_mode::automatic;
    if (status st = a.cf.apply(vo.engine); !st.ok()) return fail(st);
    // The cache model expects a checkpoint at every block end; a gap given explicitly checks
    // exactness under it (and no turn's reuse is expected then, only bounded).
    if (a.cf.checkpoint_gap < 0) vo.engine.checkpoint_gap_tokens = 0;
    auto rep = warmctx::run_verify(vo, progress);
    if (!rep) return fail(rep.error());
    const verify_report & r = *rep;
    if (a.json) {
        std::printf("%s\n", r.to_json().dump(2).c_str());
    } else {
        std::printf(
            "mode %s, %s memory%s: %d scenarios%s, %d turns, %d mismatching scenarios (%zu turns), "
            "max |logit diff| %g, token agreement %.4f, %zu expectation failures, %.1f s\n",
            r.mode.c_str(), r.memory.c_str(), r.memory == "unsupported" ? " (no reuse expected)" : "", r.scenarios,
            r.scenarios < r.scenarios_asked
                ? (" of " + std::to_string(r.scenarios_asked) + ", --seconds ran out").c_str()
                : "",
            r.turns, r.mismatched_scenarios, r.mismatches.size(), r.max_logit_diff, r.token_agreement(),
            r.failures.size(), r.elapsed_ms / 1000);
        if (r.n_drafted > 0)
            std::printf(
                "drafts (the turns sent again): %llu of %llu draft tokens chosen, the same tokens as cold, "
                "max |logit diff| %g (rows decoded together)\n",
                (unsigned long long)r.n_draft_accepted, (unsigned long long)r.n_drafted, r.max_drafted_logit_diff);
        for (const auto & f : r.failures) std::printf("  expectation failed: %s\n", f.to_string().c_str());
    }
    return r.passed() ? 0 : 1;
}

// ---- assemble ---------------------------------------------------------------

struct assemble_args {
    model_flags mf;
    cache_flags cf;
    std::string segments_file;
    std::string workspace = "default";
    bool json = false;
};

result<std::vector<segment>> read_segments(const std::string & path) {
    std::ifstream f(path);
    if (!f) return not_found("cannot open segments file '" + path + "'");
    std::stringstream ss;
    ss << f.rdbuf();
    auto doc = parse_json(ss.str());
    if (!doc) return invalid_argument("'" + path + "': " + doc.error().message());
    nlohmann::json j = std::move(*doc);
    if (j.is_object() && j.contains("segments")) j = j["segments"];
    if (!j.is_array()) return invalid_argument("expected a JSON array of segments (or {\"segments\": [...]})");
    std::vector<segment> out;
    for (size_t i = 0; i < j.size(); ++i) {
        const auto & s = j[i];
        const std::string where = "segment #" + std::to_string(i);
        if (!s.is_object()) return invalid_argument(where + " is not an object");
        for (const char * k : {"id", "kind", "content"})
            if (!s.contains(k) || !s[k].is_string())
                return invalid_argument(where + ": missing string field '" + k + "'");
        auto kind = parse_segment_kind(s["kind"].get<std::string>());
        if (!kind) return kind.error().with_context(where);
        segment seg;
        seg.id = s["id"].get<std::string>();
        seg.kind = *kind;
        seg.content = s["content"].get<std::string>();
        if (s.contains("path") && s["path"].is_string()) seg.path = s["path"].get<std::string>();
        if (s.contains("role") && s["role"].is_string()) seg.role = s["role"].get<std::string>();
        out.push_back(std::move(seg));
    }
    return out;
}

int run_assemble(const assemble_args & a) {
    auto segs = read_segments(a.segments_file);
    if (!segs) return fail(segs.error());
    auto eo = a.mf.to_options(1);
    if (!eo) return fail(eo.error());
    context_engine_options co;
    co.engine = *eo;
    co.n_holders = 1;
    if (status st = a.cf.apply(co); !st.ok()) return fail(st);
    auto ce = context_engine::open(co);
    if (!ce) return fail(ce.error());
    turn_request req;
    req.workspace = a.workspace;
    req.segments = *segs;
    auto prompt = (*ce)->assemble_request(req);
    if (!prompt) return fail(prompt.error());
    auto ex = (*ce)->explain(req);
    if (!ex) return fail(ex.error());
    if (a.json) {
        nlohmann::json j = {{"manifest", prompt->prompt_manifest.to_json()}, {"explain", explain_json(*ex)},
                            {"profile", (*ce)->current_profile().to_json()}};
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("%s\n%s", prompt->prompt_manifest.to_table().c_str(), explain_text(*ex).c_str());
    return 0;
}

}  // namespace

void register_context_commands(CLI::App & app, int & rc) {
    auto d = std::make_shared<demo_args>();
    auto * demo = app.add_subcommand("demo", "cold, warm and three stable-edited turns on one workspace, with explain");
    d->mf.add_to(*demo);
    d->cf.add_to(*demo);
    demo->add_option("--prefix-tokens", d->prefix_tokens, "stable prefix size, tokens (up to ~47k and beyond)")
        ->capture_default_str();
    demo->add_option("-n,--max-tokens", d->max_tokens, "tokens generated per turn")
        ->capture_default_str()
        ->check(CLI::Range(1, 4096));
    demo->add_option("--seed", d->seed, "workspace content seed")->capture_default_str();
    demo->add_flag("--json", d->json, "print {\"rows\": [...]} as JSON");
    on_run(demo, rc, [d] { return run_demo(*d); });

    auto v = std::make_shared<verify_args>();
    auto * verify = app.add_subcommand(
        "verify", "replay seeded random workspace scenarios warm and cold; exact mode must match bit for bit");
    v->mf.add_to(*verify);
    v->cf.add_to(*verify);
    verify->add_option("--scenarios", v->scenarios, "number of scenarios")->capture_default_str();
    verify->add_option("--seed", v->seed, "scenario seed")->capture_default_str();
    verify->add_option("--stable-tokens", v->stable_tokens_max, "largest stable prefix of a scenario, tokens")
        ->capture_default_str()
        ->check(CLI::Range(200, 100000));
    verify->add_option("-n,--max-tokens", v->max_tokens, "greedy tokens per turn")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    verify
        ->add_option("--holders", v->holders,
                     "cached prefixes the pool keeps at most (a small number makes scenarios evict)")
        ->capture_default_str()
        ->check(CLI::Range(1, 32));
    verify->add_option("--draft-max", v->draft_max,
                       "draft tokens a warm turn checks per decode, from its workspace's text (0 = none; -1 = serve's "
                       "default: 64 on the CPU, none on a GPU; the cold reference never drafts)")
        ->capture_default_str()
        ->check(CLI::Range(-1, 64));
    verify
        ->add_option("--seconds", v->seconds,
                     "start no scenario after this many seconds (0 = run them all); the report says how many ran")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1e7));
    verify->add_option("--tiers", v->tiers, "also replay host-RAM and disk restores (true/false)")
        ->capture_default_str();
    verify
        ->add_option(
            "--stream-copies", v->stream_copies,
            "serve a prefix another stream holds by copying the stream, as serve does on a GPU: auto (where the "
            "layers run on a GPU), on, off")
        ->check(CLI::IsMember({"auto", "on", "off"}))
        ->capture_default_str();
    verify->add_flag("--json", v->json, "print one JSON object");
    on_run(verify, rc, [v] { return run_verify(*v); });

    auto as = std::make_shared<assemble_args>();
    auto * asm_cmd =
        app.add_subcommand("assemble", "assemble segments from a JSON file; print the manifest and the explain");
    as->mf.add_to(*asm_cmd);
    as->cf.add_to(*asm_cmd);
    asm_cmd
        ->add_option("segments", as->segments_file,
                     "JSON file: [{\"id\",\"kind\",\"content\",\"path\"?,\"role\"?}, ...]")
        ->required();
    asm_cmd->add_option("--workspace", as->workspace, "workspace name")->capture_default_str();
    asm_cmd->add_flag("--json", as->json, "print JSON");
    on_run(asm_cmd, rc, [as] { return run_assemble(*as); });
}

}  // namespace warmctx::cli
