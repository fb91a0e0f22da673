// warmctx demo | verify | assemble | bench warm-overhead
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.h"
#include "warmctx/context_engine.h"
#include "warmctx/explain_format.h"
#include "warmctx/snapshot_store.h"
#include "warmctx/workload.h"

namespace warmctx::cli {
namespace {

using clock_type = std::chrono::steady_clock;

token_counter counter_for(engine & e) {
    return [&e](const std::string & s) -> size_t {
        auto t = e.tokenize(s, true);
        return t.ok() ? t->size() : s.size() / 4;
    };
}

// ---- demo -------------------------------------------------------------------

struct demo_args {
    model_flags mf;
    cache_flags cf;
    size_t prefix_tokens = 2048;
    int32_t max_tokens = 4;
    uint64_t seed = 1;
    bool json = false;
};

void run_demo(demo_args a) {
    if (a.prefix_tokens < 256 || a.prefix_tokens > 200000) {
        g_exit_code = fail(invalid_argument("--prefix-tokens must be in [256, 200000]"));
        return;
    }
    // Enough context for the prefix, the question and the answer.
    const uint32_t need = (uint32_t)a.prefix_tokens + 512 + (uint32_t)a.max_tokens;
    if (a.mf.n_ctx < need) a.mf.n_ctx = need;
    auto eo = a.mf.to_options(1);
    if (!eo) { g_exit_code = fail(eo.error()); return; }
    context_engine_options co;
    co.engine = *eo;
    co.n_holders = 2;
    if (status st = a.cf.apply(co); !st.ok()) { g_exit_code = fail(st); return; }
    progress("loading " + eo->model_path);
    auto ce_r = context_engine::open(co);
    if (!ce_r) { g_exit_code = fail(ce_r.error()); return; }
    context_engine & ce = **ce_r;
    workload_generator g(a.seed, counter_for(ce.raw_engine()));
    progress("building a workspace with a ~" + std::to_string(a.prefix_tokens) + "-token stable prefix");
    std::vector<segment> segs = make_workspace(g, a.prefix_tokens, 2);

    // Warm the runtime with a short unrelated prompt so one-time setup is excluded.
    turn_request warmup;
    warmup.workspace = "warm-up";
    warmup.segments = {{"q", segment_kind::user, "", "", "hello"}};
    warmup.sampling.max_tokens = 1;
    if (auto w = ce.run_cold(warmup); !w) { g_exit_code = fail(w.error()); return; }

    struct row { std::string turn; turn_result r; };
    std::vector<row> rows;
    auto turn = [&](const std::string & name, std::vector<segment> s) -> bool {
        turn_request req;
        req.workspace = "demo";
        req.segments = std::move(s);
        req.sampling.max_tokens = a.max_tokens;
        progress("turn '" + name + "' ...");
        auto r = ce.run_turn(req);
        if (!r) { g_exit_code = fail(r.error()); return false; }
        rows.push_back({name, std::move(r.value())});
        return true;
    };
    if (!turn("cold", segs)) return;
    segs.back().content = g.question();  // same stable prefix, a new question
    if (!turn("warm", segs)) return;
    for (auto & s : segs)  // edit one line of the repo map: a stable segment changes
        if (s.kind == segment_kind::repo_map) s.content = g.edit_one_line(s.content);
    segs.back().content = g.question();
    if (!turn("edited", segs)) return;

    const double cold_ms = rows[0].r.t_total_ms;
    if (a.json) {
        nlohmann::json j;
        j["model"] = eo->model_path;
        j["prefix_tokens_target"] = a.prefix_tokens;
        j["threads"] = ce.raw_engine().context().n_threads;
        j["rows"] = nlohmann::json::array();
        for (const auto & r : rows)
            j["rows"].push_back({{"turn", r.turn}, {"ms", r.r.t_total_ms}, {"ttft_ms", r.r.t_first_token_ms},
                                 {"copy_ms", r.r.t_copy_ms}, {"prefill_ms", r.r.t_prefill_ms},
                                 {"prompt_tokens", r.r.explain.n_prompt_tokens},
                                 {"tokens_reused", r.r.explain.n_reused}, {"tokens_prefilled", r.r.explain.n_prefilled},
                                 {"stable_prefix_hash", r.r.stable_prefix_hash},
                                 {"ratio_to_cold", cold_ms > 0 ? r.r.t_total_ms / cold_ms : 0.0},
                                 {"explain", explain_json(r.r.explain)}});
        std::printf("%s\n", j.dump(2).c_str());
        return;
    }
    std::printf("\nwarmctx demo: model %s, %d threads, %d-token prompt\n\n", ce.raw_engine().model().description.c_str(),
                ce.raw_engine().context().n_threads, rows[0].r.explain.n_prompt_tokens);
    std::printf("%-8s %10s %10s %8s %10s  %-14s %s\n", "turn", "ms", "ttft ms", "reused", "prefilled", "stable hash",
                "vs cold");
    for (const auto & r : rows)
        std::printf("%-8s %10.1f %10.1f %8d %10d  %-14s %6.3fx\n", r.turn.c_str(), r.r.t_total_ms, r.r.t_first_token_ms,
                    r.r.explain.n_reused, r.r.explain.n_prefilled, r.r.stable_prefix_hash.substr(0, 12).c_str(),
                    cold_ms > 0 ? r.r.t_total_ms / cold_ms : 0.0);
    std::printf("\nexplain, warm turn:\n%s\nexplain, edited turn:\n%s", explain_text(rows[1].r.explain).c_str(),
                explain_text(rows[2].r.explain).c_str());
}

// ---- verify -----------------------------------------------------------------

struct verify_args {
    model_flags mf;
    cache_flags cf;
    int scenarios = 20;
    uint64_t seed = 1;
    size_t stable_tokens_max = 700;
    int32_t max_tokens = 8;
    uint32_t holders = 4;
    bool tiers = true;
    bool json = false;
};

struct compare_out {
    bool tokens_equal = false;
    bool logits_equal = false;
    float max_diff = 0;
    size_t n_agree = 0, n_tokens = 0;
};

compare_out compare(const turn_result & w, const turn_result & c) {
    compare_out o;
    o.tokens_equal = w.gen.tokens == c.gen.tokens;
    o.n_tokens = c.gen.tokens.size();
    for (size_t i = 0; i < std::min(w.gen.tokens.size(), c.gen.tokens.size()); ++i) o.n_agree += w.gen.tokens[i] == c.gen.tokens[i];
    auto diff = [&](const std::vector<float> & a, const std::vector<float> & b) {
        for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) o.max_diff = std::max(o.max_diff, std::fabs(a[i] - b[i]));
    };
    diff(w.prompt_logits, c.prompt_logits);
    // Generation logits compare only while the tokens agree (after a divergence the
    // prompts differ and so must the logits).
    size_t n_vocab = w.prompt_logits.size();
    size_t same = o.tokens_equal ? w.gen_logits.size() : std::min(w.gen_logits.size(), (o.n_agree + 1) * n_vocab);
    diff(std::vector<float>(w.gen_logits.begin(), w.gen_logits.begin() + (long)std::min(same, w.gen_logits.size())),
         std::vector<float>(c.gen_logits.begin(), c.gen_logits.begin() + (long)std::min(same, c.gen_logits.size())));
    o.logits_equal = w.prompt_logits.size() == c.prompt_logits.size() && w.gen_logits.size() == c.gen_logits.size() &&
                     std::memcmp(w.prompt_logits.data(), c.prompt_logits.data(), w.prompt_logits.size() * sizeof(float)) == 0 &&
                     std::memcmp(w.gen_logits.data(), c.gen_logits.data(), w.gen_logits.size() * sizeof(float)) == 0;
    return o;
}

void run_verify(verify_args a) {
    if (a.scenarios < 1) { g_exit_code = fail(invalid_argument("--scenarios must be >= 1")); return; }
    const uint32_t need = (uint32_t)a.stable_tokens_max + 2048;
    if (a.mf.n_ctx < need) a.mf.n_ctx = need;
    auto eo = a.mf.to_options(1);
    if (!eo) { g_exit_code = fail(eo.error()); return; }
    context_engine_options co;
    co.engine = *eo;
    co.n_holders = a.holders;
    if (status st = a.cf.apply(co); !st.ok()) { g_exit_code = fail(st); return; }
    // Scenarios also go through host-RAM and disk restores (a private directory
    // unless --cache-dir names one).
    std::string tmp_dir;
    if (a.tiers) {
        if (co.tiers.host_budget_bytes == 0) co.tiers.host_budget_bytes = 1ull << 30;
        if (co.tiers.cache_dir.empty()) {
            char templ[] = "/tmp/warmctx-verify-XXXXXX";
            if (!mkdtemp(templ)) { g_exit_code = fail(io_error("cannot create a temporary cache directory")); return; }
            tmp_dir = co.tiers.cache_dir = templ;
        }
    }
    struct dir_cleanup {
        std::string d;
        ~dir_cleanup() { if (!d.empty()) { std::error_code ec; std::filesystem::remove_all(d, ec); } }
    } cleanup{tmp_dir};
    auto ce_r = context_engine::open(co);
    if (!ce_r) { g_exit_code = fail(ce_r.error()); return; }
    context_engine & ce = **ce_r;
    const bool exact = eo->mode == kv_mode::exact;
    const uint32_t chunk = ce.raw_engine().context().chunk_tokens;
    auto t_start = clock_type::now();

    int mismatched_scenarios = 0, turns = 0, turn_mismatches = 0;
    float max_diff = 0;
    size_t agree = 0, n_tok = 0;
    uint64_t reused = 0, prefilled = 0;
    std::vector<std::string> failures;  // expectation failures: edits/drift that were not misses
    std::map<std::string, int> by_kind;

    for (int sc = 0; sc < a.scenarios; ++sc) {
        workload_generator g(a.seed * 1000003ull + (uint64_t)sc, counter_for(ce.raw_engine()));
        auto & rng = g.rng();
        const std::string ws = "scenario-" + std::to_string(sc);
        const size_t stable = 150 + rng() % std::max<size_t>(1, a.stable_tokens_max - 150);
        std::vector<segment> segs = make_workspace(g, stable, (int)(rng() % 3));
        bool scenario_mismatch = false;
        int n_hist = 0;

        // Each step mutates segs, then runs warm and cold and checks expectations.
        auto step = [&](const std::string & what, pos_t expect_min_reuse, pos_t expect_max_reuse,
                        bool expect_drift, const char * expect_tier = nullptr) -> bool {
            std::vector<segment> shuffled = segs;
            std::shuffle(shuffled.begin(), shuffled.end(), rng);  // input order must not matter
            turn_request req;
            req.workspace = ws;
            req.segments = shuffled;
            req.sampling.max_tokens = a.max_tokens;
            req.keep_logits = true;
            auto w = ce.run_turn(req);
            if (!w) { g_exit_code = fail(w.error().with_context(ws + " " + what)); return false; }
            auto c = ce.run_cold(req);
            if (!c) { g_exit_code = fail(c.error().with_context(ws + " " + what + " (cold)")); return false; }
            ++turns;
            compare_out cmp = compare(*w, *c);
            max_diff = std::max(max_diff, cmp.max_diff);
            agree += cmp.n_agree;
            n_tok += cmp.n_tokens;
            const bool same = cmp.tokens_equal && cmp.logits_equal;
            if (!same) { ++turn_mismatches; scenario_mismatch = true; }
            const auto & ex = w->explain;
            reused += (uint64_t)ex.n_reused;
            prefilled += (uint64_t)ex.n_prefilled;
            by_kind[std::string(miss_kind_name(ex.kind))]++;
            auto expect = [&](bool ok, const std::string & msg) {
                if (!ok) failures.push_back(ws + " " + what + ": " + msg + " (reused " + std::to_string(ex.n_reused) +
                                            ", " + ex.reason + ")");
            };
            if (expect_min_reuse >= 0) expect(ex.n_reused >= expect_min_reuse, "expected a hit of at least " + std::to_string(expect_min_reuse) + " tokens");
            if (expect_max_reuse >= 0) expect(ex.n_reused <= expect_max_reuse, "expected a miss at token " + std::to_string(expect_max_reuse));
            if (expect_tier) expect(kv_tier_name(ex.tier) == expect_tier, std::string("expected a restore from the ") + expect_tier + " tier, got " + std::string(kv_tier_name(ex.tier)));
            if (expect_drift) {
                expect(ex.kind == miss_kind::profile_drift, "expected the miss to be explained as profile drift");
                bool named = false;
                for (const auto & f : ex.drifted_fields) named |= f.rfind("chunk_tokens", 0) == 0;
                expect(named, "expected explain to name the drifted field chunk_tokens");
            }
            return true;
        };
        auto stable_end = [&]() -> pos_t {
            turn_request r;
            r.workspace = ws;
            r.segments = segs;
            auto ap = ce.assemble_request(r);
            return ap.ok() ? ap->stable_end : 0;
        };
        auto begin_of = [&](const std::string & id) -> pos_t {
            turn_request r;
            r.workspace = ws;
            r.segments = segs;
            auto ap = ce.assemble_request(r);
            if (!ap.ok()) return 0;
            for (const auto & e : ap->man.segments) if (e.id == id) return e.token_begin;
            return 0;
        };
        auto add_history = [&] {
            ++n_hist;
            char id[32];
            std::snprintf(id, sizeof id, "h%04d", n_hist);
            segs.push_back({std::string(id) + "a", segment_kind::history, "", "user", g.question()});
            segs.push_back({std::string(id) + "b", segment_kind::history, "", "assistant", g.terminal_log(2)});
        };

        if (!step("cold turn", -1, -1, false)) return;
        segs.back().content = g.question();
        if (!step("new question", stable_end(), -1, false)) return;
        if (a.tiers) {
            // Evicted from the engine: served from host RAM, then (host gone) from disk.
            ce.drop_engine_cache();
            segs.back().content = g.question();
            if (!step("host-RAM restore", stable_end(), -1, false, "host")) return;
            ce.drop_engine_cache();
            ce.clear_host_tier();
            segs.back().content = g.question();
            if (!step("disk restore", stable_end(), -1, false, "disk")) return;
        }
        add_history();
        segs.push_back({"diff", segment_kind::diff, "", "", g.diff("src/x.cc", 2)});
        if (!step("history + diff", stable_end(), -1, false)) return;
        add_history();
        for (auto & s : segs) if (s.id == "diff") s.content = g.diff("src/y.cc", 1);  // volatile edit
        segs.push_back({"tests", segment_kind::test_output, "", "", g.test_output(1)});
        if (!step("volatile edit", stable_end(), -1, false)) return;
        // A stable edit: one line of a random stable segment.
        std::vector<size_t> stable_idx;
        for (size_t i = 0; i < segs.size(); ++i)
            if (segs[i].kind == segment_kind::tools || segs[i].kind == segment_kind::repo_map || segs[i].kind == segment_kind::pinned_file)
                stable_idx.push_back(i);
        segment & edited = segs[stable_idx[rng() % stable_idx.size()]];
        edited.content = g.edit_one_line(edited.content);
        segs.back().content = g.test_output(2);
        if (!step("stable edit of '" + edited.id + "'", -1, begin_of(edited.id), false)) return;
        if (rng() % 2 == 0) {
            // Profile drift: a different chunk size computes different KV bits. Each
            // scenario drifts to its own size, so no earlier scenario's drifted turn can
            // legitimately serve this one.
            const uint32_t drifted = std::max<uint32_t>(1, chunk - 1 - (uint32_t)sc % std::max<uint32_t>(1, chunk / 2));
            if (status st = ce.set_chunk_tokens(drifted); !st.ok()) { g_exit_code = fail(st); return; }
            bool ok = step("profile drift", -1, 0, true);
            if (status st = ce.set_chunk_tokens(chunk); !st.ok()) { g_exit_code = fail(st); return; }
            if (!ok) return;
        }
        if (scenario_mismatch) ++mismatched_scenarios;
        progress("scenario " + std::to_string(sc + 1) + "/" + std::to_string(a.scenarios) + ": " +
                 (scenario_mismatch ? "MISMATCH" : "ok"));
    }
    const double elapsed_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t_start).count();
    nlohmann::json j = {
        {"mode", exact ? "exact" : "shared"}, {"model", eo->model_path}, {"scenarios", a.scenarios}, {"turns", turns},
        {"mismatches", mismatched_scenarios}, {"turn_mismatches", turn_mismatches}, {"max_logit_diff", max_diff},
        {"token_agreement", n_tok ? (double)agree / (double)n_tok : 1.0}, {"expectation_failures", failures.size()},
        {"failures", failures}, {"tokens_reused", reused}, {"tokens_prefilled", prefilled}, {"results", by_kind},
        {"elapsed_ms", elapsed_ms}, {"seed", a.seed}, {"policy", a.cf.policy},
        {"budget_tokens", a.cf.budget_tokens},
    };
    {
        auto c = ce.counters().cache;
        nlohmann::json ev;
        for (int k = 1; k < k_retention_class_count; ++k)
            ev[std::string(retention_class_name((retention_class)k))] = c.evictions_by_class[(size_t)k];
        j["evictions_by_class"] = ev;
        j["whole_holder_evictions"] = c.n_whole_holder_evictions;
    }
    if (a.json) std::printf("%s\n", j.dump(2).c_str());
    else {
        std::printf("mode %s: %d scenarios, %d turns, %d mismatching scenarios (%d turns), max |logit diff| %g, "
                    "token agreement %.4f, %zu expectation failures, %.1f s\n",
                    exact ? "exact" : "shared", a.scenarios, turns, mismatched_scenarios, turn_mismatches, max_diff,
                    n_tok ? (double)agree / (double)n_tok : 1.0, failures.size(), elapsed_ms / 1000);
        for (const auto & f : failures) std::printf("  expectation failed: %s\n", f.c_str());
    }
    if ((exact && mismatched_scenarios > 0) || !failures.empty()) g_exit_code = 1;
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
    auto j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_discarded()) return invalid_argument("'" + path + "' is not valid JSON");
    if (j.is_object() && j.contains("segments")) j = j["segments"];
    if (!j.is_array()) return invalid_argument("expected a JSON array of segments (or {\"segments\": [...]})");
    std::vector<segment> out;
    for (size_t i = 0; i < j.size(); ++i) {
        const auto & s = j[i];
        const std::string where = "segment #" + std::to_string(i);
        if (!s.is_object()) return invalid_argument(where + " is not an object");
        for (const char * k : {"id", "kind", "content"})
            if (!s.contains(k) || !s[k].is_string()) return invalid_argument(where + ": missing string field '" + k + "'");
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

void run_assemble(const assemble_args & a) {
    auto segs = read_segments(a.segments_file);
    if (!segs) { g_exit_code = fail(segs.error()); return; }
    auto eo = a.mf.to_options(1);
    if (!eo) { g_exit_code = fail(eo.error()); return; }
    context_engine_options co;
    co.engine = *eo;
    co.n_holders = 1;
    if (status st = a.cf.apply(co); !st.ok()) { g_exit_code = fail(st); return; }
    auto ce = context_engine::open(co);
    if (!ce) { g_exit_code = fail(ce.error()); return; }
    turn_request req;
    req.workspace = a.workspace;
    req.segments = *segs;
    auto ap = (*ce)->assemble_request(req);
    if (!ap) { g_exit_code = fail(ap.error()); return; }
    auto ex = (*ce)->explain(req);
    if (!ex) { g_exit_code = fail(ex.error()); return; }
    if (a.json) {
        nlohmann::json j = {{"manifest", ap->man.to_json()}, {"explain", explain_json(*ex)},
                            {"profile", (*ce)->current_profile().to_json()}};
        std::printf("%s\n", j.dump(2).c_str());
        return;
    }
    std::printf("%s\n%s", ap->man.to_table().c_str(), explain_text(*ex).c_str());
}

// ---- bench warm-overhead ----------------------------------------------------

struct overhead_args {
    model_flags mf;
    size_t prefix_tokens = 2048;
    int reps = 5;
    bool json = false;
};

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

void run_overhead(overhead_args a) {
    if (a.reps < 1) { g_exit_code = fail(invalid_argument("--reps must be >= 1")); return; }
    const uint32_t need = (uint32_t)a.prefix_tokens + 1024;
    if (a.mf.n_ctx < need) a.mf.n_ctx = need;
    auto eo = a.mf.to_options(1);
    if (!eo) { g_exit_code = fail(eo.error()); return; }
    context_engine_options co;
    co.engine = *eo;
    co.n_holders = 2;
    auto ce_r = context_engine::open(co);
    if (!ce_r) { g_exit_code = fail(ce_r.error()); return; }
    context_engine & ce = **ce_r;
    engine & e = ce.raw_engine();
    workload_generator g(7, counter_for(e));
    std::vector<segment> segs = make_workspace(g, a.prefix_tokens, 2);
    turn_request req;
    req.workspace = "bench";
    req.segments = segs;
    req.sampling.max_tokens = 1;
    progress("priming the cache with a " + std::to_string(a.prefix_tokens) + "-token prefix");
    if (auto r = ce.run_turn(req); !r) { g_exit_code = fail(r.error()); return; }
    std::vector<double> warm_prefill, warm_ttft, manual_copy_prefill, nocopy_prefill, fresh_prefill;
    pos_t tail_tokens = 0, reused = 0;
    auto timed_prefill = [&](seq_id seq, std::span<const token_id> toks, pos_t pos0, const std::vector<pos_t> & bounds,
                             double & ms) -> status {
        std::vector<float> logits;
        auto t0 = clock_type::now();
        status st = e.prefill(seq, toks, pos0, bounds, &logits);
        ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
        return st;
    };
    for (int i = 0; i < a.reps; ++i) {
        req.segments.back().content = g.question();
        // 1. The warm turn, end to end through the context engine.
        auto w = ce.run_turn(req);
        if (!w) { g_exit_code = fail(w.error()); return; }
        warm_prefill.push_back(w->t_prefill_ms);
        warm_ttft.push_back(w->t_first_token_ms);
        tail_tokens = w->explain.n_prefilled;
        reused = w->explain.n_reused;
        auto ap = ce.assemble_request(req);
        if (!ap) { g_exit_code = fail(ap.error()); return; }
        std::span<const token_id> tail(ap->tokens.data() + reused, ap->tokens.size() - (size_t)reused);
        auto holders = ce.cache().holders();
        if (holders.empty()) { g_exit_code = fail(internal_error("no holder after a warm turn")); return; }
        // 2. The same steps by hand: copy the holder, trim, prefill the tail. llama.cpp
        //    performs a sequence copy lazily inside the next decode, so the copy's cost
        //    lands in this prefill...
        double ms = 0;
        e.clear_seq(1);
        if (status st = e.copy_seq(holders[0].seq, 1); !st.ok()) { g_exit_code = fail(st); return; }
        if (status st = e.trim_seq(1, reused); !st.ok()) { g_exit_code = fail(st); return; }
        if (status st = timed_prefill(1, tail, reused, ap->boundaries, ms); !st.ok()) { g_exit_code = fail(st); return; }
        manual_copy_prefill.push_back(ms);
        // 3. ...and the same tail once more on the now-resident prefix, with no copy
        //    pending: the difference is the copy.
        if (status st = e.trim_seq(1, reused); !st.ok()) { g_exit_code = fail(st); return; }
        if (status st = timed_prefill(1, tail, reused, ap->boundaries, ms); !st.ok()) { g_exit_code = fail(st); return; }
        nocopy_prefill.push_back(ms);
        // 4. The same tail tokens alone in a fresh sequence, same chunking.
        std::vector<pos_t> bounds;
        for (pos_t b : ap->boundaries) if (b > reused) bounds.push_back(b - reused);
        e.clear_seq(1);
        if (status st = timed_prefill(1, tail, 0, bounds, ms); !st.ok()) { g_exit_code = fail(st); return; }
        fresh_prefill.push_back(ms);
        e.clear_seq(1);
    }
    const double wp = median(warm_prefill), fp = median(fresh_prefill), np = median(nocopy_prefill);
    const double wc = std::max(0.0, median(manual_copy_prefill) - np);
    nlohmann::json j = {
        {"model", eo->model_path}, {"threads", e.context().n_threads}, {"reps", a.reps},
        {"prefix_tokens_reused", reused}, {"tail_tokens", tail_tokens},
        {"warm_prefill_ms_median", wp}, {"warm_ttft_ms_median", median(warm_ttft)},
        {"copy_ms_median", wc}, {"resident_prefix_tail_prefill_ms_median", np},
        {"fresh_tail_prefill_ms_median", fp}, {"ratio_warm_prefill_to_fresh", fp > 0 ? wp / fp : 0.0},
        {"target", "warm_prefill <= 1.10 * fresh_tail_prefill + copy"},
        {"target_ms", 1.10 * fp + wc}, {"met", wp <= 1.10 * fp + wc},
        {"warm_prefill_ms", warm_prefill}, {"copy_then_prefill_ms", manual_copy_prefill},
        {"resident_prefix_tail_prefill_ms", nocopy_prefill}, {"fresh_tail_prefill_ms", fresh_prefill},
    };
    if (a.json) { std::printf("%s\n", j.dump(2).c_str()); return; }
    std::printf("reused %d tokens, tail %d tokens: warm prefill %.1f ms (copy %.1f ms of it; tail on a resident "
                "prefix %.1f ms) vs the tail alone in a fresh sequence %.1f ms: target %.1f ms, %s\n",
                reused, tail_tokens, wp, wc, np, fp, 1.10 * fp + wc, wp <= 1.10 * fp + wc ? "met" : "not met");
}

}  // namespace

void register_context_commands(CLI::App & app) {
    auto d = std::make_shared<demo_args>();
    auto * demo = app.add_subcommand("demo", "cold, warm and stable-edited turns on one workspace, with explain");
    d->mf.add_to(*demo);
    d->cf.add_to(*demo);
    demo->add_option("--prefix-tokens", d->prefix_tokens, "stable prefix size, tokens (up to ~47k and beyond)")->capture_default_str();
    demo->add_option("-n,--max-tokens", d->max_tokens, "tokens generated per turn")->capture_default_str()->check(CLI::Range(1, 4096));
    demo->add_option("--seed", d->seed, "workspace content seed")->capture_default_str();
    demo->add_flag("--json", d->json, "print {\"rows\": [...]} as JSON");
    demo->callback([d] { run_demo(*d); });

    auto v = std::make_shared<verify_args>();
    auto * verify = app.add_subcommand("verify", "replay seeded random workspace scenarios warm and cold; exact mode must match bit for bit");
    v->mf.add_to(*verify);
    v->cf.add_to(*verify);
    verify->add_option("--scenarios", v->scenarios, "number of scenarios")->capture_default_str();
    verify->add_option("--seed", v->seed, "scenario seed")->capture_default_str();
    verify->add_option("--stable-tokens", v->stable_tokens_max, "largest stable prefix of a scenario, tokens")->capture_default_str()->check(CLI::Range(200, 100000));
    verify->add_option("-n,--max-tokens", v->max_tokens, "greedy tokens per turn")->capture_default_str()->check(CLI::Range(1, 1024));
    verify->add_option("--holders", v->holders, "cached prefixes kept resident")->capture_default_str()->check(CLI::Range(1, 32));
    verify->add_option("--tiers", v->tiers, "also replay host-RAM and disk restores (true/false)")->capture_default_str();
    verify->add_flag("--json", v->json, "print one JSON object");
    verify->callback([v] { run_verify(*v); });

    auto as = std::make_shared<assemble_args>();
    auto * asm_cmd = app.add_subcommand("assemble", "assemble segments from a JSON file; print the manifest and the explain");
    as->mf.add_to(*asm_cmd);
    as->cf.add_to(*asm_cmd);
    asm_cmd->add_option("segments", as->segments_file, "JSON file: [{\"id\",\"kind\",\"content\",\"path\"?,\"role\"?}, ...]")->required();
    asm_cmd->add_option("--workspace", as->workspace, "workspace name")->capture_default_str();
    asm_cmd->add_flag("--json", as->json, "print JSON");
    asm_cmd->callback([as] { run_assemble(*as); });
}

void register_restore_bench(CLI::App & bench);

void register_overhead_bench(CLI::App & bench) {
    auto o = std::make_shared<overhead_args>();
    auto * c = bench.add_subcommand("warm-overhead", "warm turn's tail prefill next to the same tail prefilled in a fresh sequence");
    o->mf.add_to(*c);
    c->add_option("--prefix-tokens", o->prefix_tokens, "stable prefix size, tokens")->capture_default_str();
    c->add_option("--reps", o->reps, "repetitions")->capture_default_str();
    c->add_flag("--json", o->json, "print JSON");
    c->callback([o] { run_overhead(*o); });
    register_restore_bench(bench);
}

}  // namespace warmctx::cli

// ---- bench restore ------------------------------------------------------------

namespace warmctx::cli {
namespace {

struct restore_args {
    model_flags mf;
    std::vector<size_t> prefix_tokens = {2048, 8192};
    std::string cache_dir;
    bool json = false;
};

// Drops the file's pages from the page cache (no root needed): the next read hits the disk.
void drop_page_cache(const std::string & path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
}

// Sequential read rate of `path` from the disk, MB/s (page cache dropped first).
double disk_read_mb_s(const std::string & path) {
    drop_page_cache(path);
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return 0;
    std::vector<char> buf(4 << 20);
    size_t total = 0;
    auto t0 = clock_type::now();
    ssize_t n;
    while ((n = ::read(fd, buf.data(), buf.size())) > 0) total += (size_t)n;
    ::close(fd);
    double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    return s > 0 ? (double)total / 1e6 / s : 0;
}

void run_restore(restore_args a) {
    nlohmann::json rows = nlohmann::json::array();
    std::string root = a.cache_dir;
    std::string made;
    if (root.empty()) {
        char templ[] = "/var/tmp/warmctx-restore-XXXXXX";  // on disk, not tmpfs
        if (!mkdtemp(templ)) { g_exit_code = fail(io_error("cannot create a cache directory")); return; }
        root = made = templ;
    }
    for (size_t prefix : a.prefix_tokens) {
        model_flags mf = a.mf;
        mf.n_ctx = std::max<uint32_t>(mf.n_ctx, (uint32_t)prefix + 1024);
        auto eo = mf.to_options(1);
        if (!eo) { g_exit_code = fail(eo.error()); return; }
        const std::string dir = root + "/p" + std::to_string(prefix);
        context_engine_options co;
        co.engine = *eo;
        co.n_holders = 2;
        co.tiers.cache_dir = dir;
        co.tiers.host_budget_bytes = 8ull << 30;
        std::vector<segment> segs;
        turn_request req;
        req.workspace = "bench";
        req.sampling.max_tokens = 1;
        nlohmann::json row;
        row["prefix_tokens_target"] = prefix;
        {
            auto ce_r = context_engine::open(co);
            if (!ce_r) { g_exit_code = fail(ce_r.error()); return; }
            context_engine & ce = **ce_r;
            workload_generator g(11 + prefix, counter_for(ce.raw_engine()));
            segs = make_workspace(g, prefix, 2);
            req.segments = segs;
            progress("prefix " + std::to_string(prefix) + ": cold turn");
            auto cold = ce.run_turn(req);
            if (!cold) { g_exit_code = fail(cold.error()); return; }
            row["prompt_tokens"] = cold->explain.n_prompt_tokens;
            row["cold_ttft_ms"] = cold->t_first_token_ms;
            // From host RAM: the engine's KV is gone, the host tier has the prefix.
            ce.drop_engine_cache();
            req.segments.back().content = g.question();
            auto ram = ce.run_turn(req);
            if (!ram) { g_exit_code = fail(ram.error()); return; }
            row["ram_tier"] = kv_tier_name(ram->explain.tier);
            row["ram_reused_tokens"] = ram->explain.n_reused;
            row["ram_restore_ms"] = ram->t_restore_ms;
            row["ram_ttft_ms"] = ram->t_first_token_ms;
            // From disk: engine and host emptied, the file's pages dropped.
            ce.drop_engine_cache();
            ce.clear_host_tier();
            uint64_t file_bytes = 0;
            std::string file;
            for (const auto & e : ce.disk_tier()->list()) {
                file = ce.disk_tier()->path_of(e.file_name);
                file_bytes = e.file_bytes;
                drop_page_cache(file);
            }
            req.segments.back().content = g.question();
            auto disk = ce.run_turn(req);
            if (!disk) { g_exit_code = fail(disk.error()); return; }
            row["disk_tier"] = kv_tier_name(disk->explain.tier);
            row["disk_reused_tokens"] = disk->explain.n_reused;
            row["disk_restore_ms"] = disk->t_restore_ms;
            row["disk_ttft_ms"] = disk->t_first_token_ms;
            row["snapshot_bytes"] = file_bytes;
            row["restore_mb_s"] = disk->t_restore_ms > 0 ? (double)file_bytes / 1e6 / (disk->t_restore_ms / 1000) : 0.0;
            row["disk_sequential_read_mb_s"] = file.empty() ? 0.0 : disk_read_mb_s(file);
        }
        {
            // Restart: a new process state on the same directory. The first turn of the
            // workspace restores its prefix from disk instead of prefilling it.
            auto t_open = clock_type::now();
            auto ce_r = context_engine::open(co);
            if (!ce_r) { g_exit_code = fail(ce_r.error()); return; }
            const double open_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t_open).count();
            context_engine & ce = **ce_r;
            for (const auto & e : ce.disk_tier()->list()) drop_page_cache(ce.disk_tier()->path_of(e.file_name));
            req.segments.back().content = "first question after the restart";
            auto first = ce.run_turn(req);
            if (!first) { g_exit_code = fail(first.error()); return; }
            row["restart_open_ms"] = open_ms;
            row["restart_tier"] = kv_tier_name(first->explain.tier);
            row["restart_first_turn_ttft_ms"] = first->t_first_token_ms;
            row["restart_ratio_to_cold"] = first->t_first_token_ms / row["cold_ttft_ms"].get<double>();
        }
        rows.push_back(row);
    }
    if (!made.empty()) { std::error_code ec; std::filesystem::remove_all(made, ec); }
    nlohmann::json j = {{"model", a.mf.model.empty() ? "default" : a.mf.model}, {"rows", rows},
                        {"page_cache", "dropped per file with posix_fadvise(POSIX_FADV_DONTNEED) after fdatasync"}};
    if (a.json) { std::printf("%s\n", j.dump(2).c_str()); return; }
    std::printf("%8s %10s %12s %12s %12s %10s %10s %12s\n", "prefix", "cold ms", "RAM ttft", "disk ttft", "restart",
                "MB/s", "disk MB/s", "restart/cold");
    for (const auto & r : rows)
        std::printf("%8d %10.1f %12.1f %12.1f %12.1f %10.0f %10.0f %12.4f\n", r["prompt_tokens"].get<int>(),
                    r["cold_ttft_ms"].get<double>(), r["ram_ttft_ms"].get<double>(), r["disk_ttft_ms"].get<double>(),
                    r["restart_first_turn_ttft_ms"].get<double>(), r["restore_mb_s"].get<double>(),
                    r["disk_sequential_read_mb_s"].get<double>(), r["restart_ratio_to_cold"].get<double>());
}

}  // namespace

void register_restore_bench(CLI::App & bench) {
    auto o = std::make_shared<restore_args>();
    auto * c = bench.add_subcommand("restore", "cold prefill vs restore from disk and from host RAM, and the first turn after a restart");
    o->mf.add_to(*c, false);
    c->add_option("--prefix-tokens", o->prefix_tokens, "stable prefix sizes, tokens")->capture_default_str()->delimiter(',');
    c->add_option("--cache-dir", o->cache_dir, "where the snapshots go (default: a fresh directory under /var/tmp)");
    c->add_flag("--json", o->json, "print JSON");
    c->callback([o] { run_restore(*o); });
}

}  // namespace warmctx::cli
