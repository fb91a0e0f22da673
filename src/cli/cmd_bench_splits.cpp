// warmctx-bench splits - whether a prompt's KV depends on how its tokens are split into
// decode calls: the same random tokens prefilled in several splits (each a list of call
// sizes, e.g. 512+512+76), each call one engine::prefill (small calls padded where the
// engine pads them: all of them where it splits freely), and each split's last logits compared
// with the first's. Where every split gives the same bits, a later turn could resume at
// any token and still equal the cold prefill, whatever calls that one made; where they
// differ, the cold run and the warm run must cut alike (docs/internals.md, "Chunk runs").
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_harness.h"
#include "cli.h"
#include "warmctx/engine.h"

namespace warmctx::cli {
namespace {

using json = nlohmann::json;

struct splits_args {
    model_flags mf;
    // The first is the reference. Calls of 64 rows or more; then calls under 64 rows.
    std::vector<std::string> plans = {"512+512+76",    "256+256+256+256+76", "300+212+400+112+76", "64+448+512+76",
                                      "512+500+12+76", "512+512+40+36",      "512+512+20+20+20+16"};
    bool json_out = false;
};

result<std::vector<int>> parse_plan(const std::string & plan) {
    std::vector<int> out;
    std::stringstream ss(plan);
    std::string part;
    while (std::getline(ss, part, '+')) {
        int n = 0;
        try {
            size_t used = 0;
            n = std::stoi(part, &used);
            if (used != part.size()) n = 0;
        } catch (...) {
            n = 0;
        }
        if (n < 1) return invalid_argument("--plans: '" + plan + "' is not call sizes joined by '+' (e.g. 512+76)");
        out.push_back(n);
    }
    if (out.empty()) return invalid_argument("--plans: an empty plan");
    return out;
}

int run_splits(const splits_args & a) {
    std::vector<std::vector<int>> plans;
    int total = -1;
    for (const auto & p : a.plans) {
        auto r = parse_plan(p);
        if (!r) return fail(r.error());
        int n = 0;
        for (int c : *r) n += c;
        if (total >= 0 && n != total)
            return fail(invalid_argument("--plans: every plan must add up to the same tokens (" + p + ": " +
                                         std::to_string(n) + ", the first: " + std::to_string(total) + ")"));
        for (int c : *r)
            if ((uint32_t)c > a.mf.chunk)
                return fail(invalid_argument("--plans: a call of " + std::to_string(c) + " tokens exceeds --chunk"));
        total = n;
        plans.push_back(std::move(*r));
    }
    if (plans.size() < 2) return fail(invalid_argument("--plans: at least two plans to compare"));
    auto eo = a.mf.to_options(1);
    if (!eo) return fail(eo.error());
    eo->n_ctx = (uint32_t)((total + engine::k_pad_cells + 255) / 256 * 256);
    auto eng_r = engine::open(*eo);
    if (!eng_r) return fail(eng_r.error());
    engine & eng = **eng_r;
    std::mt19937 rng(11);
    std::uniform_int_distribution<token_id> dist(0, eng.model().n_vocab - 1);
    std::vector<token_id> toks((size_t)total);
    for (auto & t : toks) t = dist(rng);

    std::vector<float> ref;
    json rows = json::array();
    for (size_t p = 0; p < plans.size(); ++p) {
        std::vector<pos_t> starts;
        int at = 0;
        for (int c : plans[p]) {
            if (at > 0) starts.push_back(at);
            at += c;
        }
        eng.clear_seq(0);
        const uint64_t padded0 = eng.padded_decodes();
        std::vector<float> logits;
        // One prefill a call: where the engine splits freely, one prefill of the whole
        // would make its own calls whatever the boundaries.
        pos_t from = 0;
        for (int c : plans[p]) {
            const bool last = (size_t)(from + c) == toks.size();
            std::span<const token_id> part(toks.data() + from, (size_t)c);
            if (status st = eng.prefill(0, part, from, starts, last ? &logits : nullptr); !st.ok()) return fail(st);
            from += c;
        }
        float max_diff = 0;
        if (p == 0) ref = logits;
        for (size_t i = 0; i < logits.size() && i < ref.size(); ++i)
            max_diff = std::max(max_diff, std::abs(logits[i] - ref[i]));
        int smallest = plans[p].front();
        for (int c : plans[p]) smallest = std::min(smallest, c);
        rows.push_back(
            {{"plan", a.plans[p]},
             {"smallest_call", smallest},
             {"padded_calls", eng.padded_decodes() - padded0},
             {"max_logit_diff", max_diff},
             {"bit_identical", p == 0 || (logits.size() == ref.size() &&
                                          std::memcmp(logits.data(), ref.data(), ref.size() * sizeof(float)) == 0)}});
    }
    const auto & ci = eng.context();
    json out = {{"bench", "splits"},
                {"backend", ci.backend},
                {"model", eo->model_path},
                {"model_desc", eng.model().description},
                {"tokens", total},
                {"kv_type", ci.kv_type},
                {"flash_attn", ci.flash_attn},
                {"pads_small_batches", ci.pads_rows},
                {"splits_freely", ci.splits_freely},
                {"rows", rows}};
    if (a.json_out) {
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    std::printf("%u tokens, %s, %s KV; the first plan is the reference\n%-28s %8s %7s %14s\n", (unsigned)total,
                ci.backend.c_str(), ci.kv_type.c_str(), "plan", "smallest", "padded", "max |diff|");
    for (const auto & r : rows)
        std::printf("%-28s %8d %7llu %14g%s\n", r["plan"].get<std::string>().c_str(), r["smallest_call"].get<int>(),
                    (unsigned long long)r["padded_calls"].get<uint64_t>(), r["max_logit_diff"].get<double>(),
                    r["bit_identical"].get<bool>() ? "  (the same bits)" : "");
    return 0;
}

}  // namespace

void register_splits_bench(CLI::App & bench, int & rc) {
    auto a = std::make_shared<splits_args>();
    auto * c =
        bench.add_subcommand("splits", "whether a prompt's logits depend on how its tokens are split into calls");
    a->mf.add_to(*c, false);
    c->add_option("--plans", a->plans, "call sizes joined by '+', each plan the same tokens (the first: the reference)")
        ->delimiter(',')
        ->capture_default_str();
    c->add_flag("--json", a->json_out, "print JSON");
    on_run(c, rc, [a] { return run_splits(*a); });
}

}  // namespace warmctx::cli
