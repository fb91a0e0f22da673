// verify's oracle without a model: the cache model's bound and every expectation check.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/verify.h"

namespace warmctx {
namespace {

// A prompt's blocks: chains rooted at `root` (a profile), ends at `ends`, all of class
// high unless `none_from` says where the uncacheable tail starts.
std::vector<block> path(uint64_t root, std::vector<pos_t> ends, size_t none_from = 1000) {
    std::vector<block> out;
    hash128 h{root, root};
    pos_t begin = 0;
    for (size_t i = 0; i < ends.size(); ++i) {
        h = hash_combine(h, &ends[i], sizeof ends[i]);
        out.push_back({h, begin, ends[i], i >= none_from ? retention_class::none : retention_class::high, (int)i});
        begin = ends[i];
    }
    return out;
}

TEST(verify_oracle, NothingCachedBoundsReuseAtZero) {
    cache_model m;
    EXPECT_EQ(m.max_reuse(path(1, {10, 20, 30}), 30), 0);
}

TEST(verify_oracle, BoundIsTheLongestCachedLeadingRunBeforeTheLastToken) {
    cache_model m;
    m.note_cached(path(1, {10, 20, 30, 40}, 3));  // the last block is the uncacheable question
    EXPECT_EQ(m.size(), 4u);
    // Which the work stream still holds: the next turn that carries it may reuse it.
    EXPECT_EQ(m.max_reuse(path(1, {10, 20, 30, 40, 50}), 50), 40);
    // Same prefix, another question: everything cacheable may be reused.
    EXPECT_EQ(m.max_reuse(path(1, {10, 20, 30, 45}), 45), 30);
    // The last token is always computed: a prompt that ends inside cached blocks.
    EXPECT_EQ(m.max_reuse(path(1, {10, 20, 30}), 30), 20);
    // A changed second block: only the first may be reused.
    auto edited = path(1, {10, 20, 30, 40});
    edited[1].chain = hash128{7, 7};
    edited[2].chain = hash128{8, 8};
    EXPECT_EQ(m.max_reuse(edited, 40), 10);
}

TEST(verify_oracle, APrefixCachedUnderOneProfileNeverBoundsAnother) {
    cache_model m;
    m.note_cached(path(1, {10, 20, 30}));
    EXPECT_EQ(m.max_reuse(path(2, {10, 20, 30, 40}), 40), 0);   // another profile root
    m.note_cached(path(2, {10, 20}));                           // cached under it too
    EXPECT_EQ(m.max_reuse(path(2, {10, 20, 30, 40}), 40), 20);
}

turn_expectation want_of(pos_t min_reuse, pos_t max_reuse, pos_t max_cached, std::string tier = "",
                         std::string drifted_field = "") {
    turn_expectation w;
    w.min_reuse = min_reuse;
    w.max_reuse = max_reuse;
    w.max_cached = max_cached;
    w.tier = std::move(tier);
    w.drifted_field = std::move(drifted_field);
    return w;
}

explain_report report(pos_t reused, pos_t cacheable, miss_kind kind, std::string tier = "engine") {
    explain_report r;
    r.n_reused = reused;
    r.n_cacheable = cacheable;
    r.n_prompt_tokens = cacheable + 10;
    r.kind = kind;
    r.tier = tier == "disk" ? kv_tier::disk : tier == "none" ? kv_tier::none : kv_tier::engine;
    return r;
}

TEST(verify_oracle, AllExpectationsHeld) {
    turn_expectation want = want_of(50, 100, 80, "disk");
    EXPECT_TRUE(check_turn(want, report(80, 120, miss_kind::segment_changed, "disk")).empty());
    want = want_of(50, 100, 80, "engine");
    want.in_place = 1;
    auto ex = report(80, 120, miss_kind::segment_changed);
    ex.in_place = true;
    EXPECT_TRUE(check_turn(want, ex).empty());
    EXPECT_TRUE(check_turn({}, report(0, 120, miss_kind::cold)).empty());
}

TEST(verify_oracle, EachBrokenExpectationIsReported) {
    EXPECT_EQ(check_turn(want_of(50, -1, -1), report(40, 120, miss_kind::evicted)),
              std::vector<std::string>{"expected a hit of at least 50 tokens"});
    EXPECT_EQ(check_turn(want_of(-1, 30, -1), report(40, 120, miss_kind::segment_changed)),
              std::vector<std::string>{"expected a miss at token 30"});
    EXPECT_EQ(check_turn(want_of(-1, -1, 30), report(40, 120, miss_kind::segment_changed)),
              std::vector<std::string>{"reused more than the 30 tokens ever cached for this prompt under this profile"});
    EXPECT_EQ(check_turn(want_of(-1, -1, 0), report(40, 120, miss_kind::segment_changed)).size(), 1u);
    EXPECT_EQ(check_turn(want_of(-1, -1, -1, "disk"), report(40, 120, miss_kind::full_hit, "engine")),
              std::vector<std::string>{"expected a restore from the disk tier, got engine"});
    turn_expectation in_place = want_of(-1, -1, -1);
    in_place.in_place = 1;
    EXPECT_EQ(check_turn(in_place, report(40, 120, miss_kind::full_hit)),
              std::vector<std::string>{"expected the turn to reuse its work stream in place"});
    auto moved = report(40, 120, miss_kind::full_hit);
    moved.in_place = true;
    in_place.in_place = 0;
    EXPECT_EQ(check_turn(in_place, moved),
              std::vector<std::string>{"expected the prefix loaded into the work stream, not in place"});
}

TEST(verify_oracle, AnEditMustBeExplainedAsAChangeOfThatSegment) {
    turn_expectation want = want_of(64, 64, -1);
    want.changed_segment = "repo-map";
    auto ex = report(64, 120, miss_kind::segment_changed);
    ex.missed_segment = "repo-map";
    EXPECT_TRUE(check_turn(want, ex).empty());
    ex.missed_segment = "tools";
    EXPECT_EQ(check_turn(want, ex),
              std::vector<std::string>{"expected the miss to be explained as a change of segment 'repo-map'"});
    ex.missed_segment = "repo-map";
    ex.kind = miss_kind::evicted;
    EXPECT_EQ(check_turn(want, ex).size(), 1u);
    ex.kind = miss_kind::segment_changed;
    ex.n_reused = 128;  // reuse past the edit: KV of the old content
    EXPECT_EQ(check_turn(want, ex), std::vector<std::string>{"expected a miss at token 64"});
    ex.n_reused = 0;    // stopped before the edit: a block that was cached was not reused
    EXPECT_EQ(check_turn(want, ex), std::vector<std::string>{"expected a hit of at least 64 tokens"});
}

TEST(verify_oracle, DriftThatStopsReuseShortMustBeExplainedAndNamed) {
    const turn_expectation want = want_of(-1, -1, 20, "", "chunk_tokens");
    auto ex = report(20, 120, miss_kind::profile_drift);
    ex.drifted_fields = {"chunk_tokens: \"512\" -> \"509\""};
    EXPECT_TRUE(check_turn(want, ex).empty());  // a legitimate hit under the drifted profile
    ex.n_reused = 0;
    EXPECT_TRUE(check_turn(want, ex).empty());  // or a miss
    ex.drifted_fields = {"kv_type: \"f16\" -> \"q8_0\""};
    EXPECT_EQ(check_turn(want, ex), std::vector<std::string>{"expected explain to name the drifted field chunk_tokens"});
    ex.kind = miss_kind::cold;
    ex.drifted_fields.clear();
    EXPECT_EQ(check_turn(want, ex).size(), 2u);
    // More than was ever cached under the drifted profile: wrong KV.
    ex = report(40, 120, miss_kind::profile_drift);
    ex.drifted_fields = {"chunk_tokens: \"512\" -> \"509\""};
    EXPECT_EQ(check_turn(want, ex).size(), 1u);
}

TEST(verify_oracle, DriftWithAFullHitNeedsNoDriftExplanation) {
    // Reuse reached the cacheable end: nothing stopped short, so nothing to explain.
    auto ex = report(120, 120, miss_kind::full_hit);
    EXPECT_TRUE(check_turn(want_of(-1, -1, 120, "", "chunk_tokens"), ex).empty());
}

TEST(verify_oracle, ExactModeFailsOnAnyMismatchSharedModeOnlyOnExpectations) {
    verify_report r;
    r.mode = "exact";
    EXPECT_TRUE(r.passed());
    r.mismatches.push_back({});
    EXPECT_FALSE(r.passed());
    r.mode = "shared";
    EXPECT_TRUE(r.passed());
    r.failures.push_back({});
    EXPECT_FALSE(r.passed());
}

TEST(verify_oracle, ReportJsonKeepsTheCommandsKeys) {
    verify_report r;
    r.mode = "exact";
    r.scenarios = 2;
    r.failures.push_back({1, "profile drift", "expected a miss at token 0", 12, "why"});
    const auto j = r.to_json();
    for (const char * k : {"mode", "model", "scenarios", "scenarios_asked", "turns", "mismatches", "turn_mismatches",
                           "max_logit_diff", "token_agreement", "expectation_failures", "failures", "tokens_reused",
                           "tokens_prefilled", "results", "elapsed_ms", "seed", "policy", "budget_tokens",
                           "evictions_by_class", "whole_holder_evictions", "backend", "stream_copies",
                           "n_stream_copies", "n_branches_parked", "n_pool_loads", "n_write_backs", "n_padded_decodes",
                           "n_fused_turns", "n_fused_conversations", "memory", "n_drafted", "n_draft_accepted",
                           "max_drafted_logit_diff"})
        EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_EQ(j.size(), 33u);
    EXPECT_EQ(j["expectation_failures"], 1);
    EXPECT_EQ(j["failures"][0], "scenario-1 profile drift: expected a miss at token 0 (reused 12, why)");
    EXPECT_EQ(j["token_agreement"], 1.0);
}

}  // namespace
}  // namespace warmctx
