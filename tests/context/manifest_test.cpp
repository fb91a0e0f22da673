#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "fake_text_model.h"
#include "test_workspace.h"
#include "warmctx/assembler.h"

namespace warmctx {
namespace {

using testing::fake_text_model;
using testing::make_segment;
using testing::test_profile;
using testing::typical_workspace;

manifest manifest_of(const std::vector<segment> & segs, const text_model & model = fake_text_model{}) {
    auto r = assemble(segs, kind_table{}, model, test_profile(16), "salt", 16);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? r->prompt_manifest : manifest{};
}

segment & find(std::vector<segment> & segs, std::string_view id) {
    return *std::find_if(segs.begin(), segs.end(), [&](const segment & s) { return s.id == id; });
}

std::vector<std::string> describe(const std::vector<segment_change> & changes) {
    std::vector<std::string> out;
    for (const auto & c : changes) out.push_back(c.to_string());
    return out;
}

TEST(ManifestDiff, IdenticalManifestsHaveNoChanges) {
    const auto m = manifest_of(typical_workspace());
    EXPECT_TRUE(diff_manifests(m, m).empty());
}

TEST(ManifestDiff, NamesTheChangedSegment) {
    auto segs = typical_workspace();
    const auto before = manifest_of(segs);
    find(segs, "pin/src/lex.cc").content = "int lex(const char *t) { return *t; }\n";  // same length
    const auto changes = diff_manifests(before, manifest_of(segs));
    ASSERT_EQ(changes.size(), 1u) << ::testing::PrintToString(describe(changes));
    EXPECT_EQ(changes[0].id, "pin/src/lex.cc");
    EXPECT_EQ(changes[0].what, segment_change_kind::content_changed);
    EXPECT_EQ(changes[0].to_string(), "segment 'pin/src/lex.cc' changed (content)");
}

TEST(ManifestDiff, LongerEditMovesWhatFollowsInCanonicalOrder) {
    auto segs = typical_workspace();
    const auto before = manifest_of(segs);
    find(segs, "tests-out").content += "more output\n";
    const auto after = manifest_of(segs);
    const auto changes = diff_manifests(before, after);
    // tests-out changed; term, snip and q (after it in canonical order) moved.
    ASSERT_EQ(changes.size(), 4u) << ::testing::PrintToString(describe(changes));
    EXPECT_EQ(changes[0].id, "tests-out");
    EXPECT_EQ(changes[0].what, segment_change_kind::content_changed);
    const char * moved[] = {"term", "snip", "q"};
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(changes[i + 1].id, moved[i]);
        EXPECT_EQ(changes[i + 1].what, segment_change_kind::moved);
        EXPECT_EQ(changes[i + 1].after_begin - changes[i + 1].before_begin, 12);
    }
}

TEST(ManifestDiff, AppearedAndDisappearedInCanonicalOrder) {
    auto segs = typical_workspace();
    const auto before = manifest_of(segs);
    segs.erase(std::find_if(segs.begin(), segs.end(), [](const segment & s) { return s.id == "tools"; }));
    segs.push_back(make_segment("pin/src/aaa.cc", segment_kind::pinned_file, "x", "src/aaa.cc"));
    const auto after = manifest_of(segs);
    const auto changes = diff_manifests(before, after);
    ASSERT_GE(changes.size(), 4u) << ::testing::PrintToString(describe(changes));
    EXPECT_EQ(changes[0].id, "tools");
    EXPECT_EQ(changes[0].what, segment_change_kind::disappeared);
    EXPECT_EQ(changes[0].to_string(), "segment 'tools' disappeared");
    // rules and map only moved (tools is gone); the new pinned file sorts before lex.cc
    EXPECT_EQ(changes[1].id, "rules");
    EXPECT_EQ(changes[1].what, segment_change_kind::moved);
    EXPECT_EQ(changes[2].id, "map");
    EXPECT_EQ(changes[3].id, "pin/src/aaa.cc");
    EXPECT_EQ(changes[3].what, segment_change_kind::appeared);
    // everything after moved too
    for (size_t i = 4; i < changes.size(); ++i) EXPECT_EQ(changes[i].what, segment_change_kind::moved);
}

TEST(ManifestDiff, SameContentDifferentTokens) {
    auto segs = typical_workspace();
    const auto before = manifest_of(segs);
    find(segs, "turn-1-a").role = "user";  // the same text rendered as another role
    auto changes = diff_manifests(before, manifest_of(segs));
    ASSERT_FALSE(changes.empty());
    EXPECT_EQ(changes[0].id, "turn-1-a");
    EXPECT_EQ(changes[0].what, segment_change_kind::tokens_changed);
    // "user" is shorter than "assistant": the segments after it only moved
    EXPECT_EQ(changes.size(), 7u);
    for (size_t i = 1; i < changes.size(); ++i) EXPECT_EQ(changes[i].what, segment_change_kind::moved) << changes[i].id;

    // a different chat template changes every segment's tokens, not its content
    fake_text_model other_template;
    other_template.template_tag = " ";
    changes = diff_manifests(before, manifest_of(typical_workspace(), other_template));
    ASSERT_EQ(changes.size(), before.segments.size());
    for (const auto & c : changes) EXPECT_EQ(c.what, segment_change_kind::tokens_changed) << c.id;
}

TEST(Manifest, JsonRoundTrips) {
    const auto m = manifest_of(typical_workspace());
    const nlohmann::json j = nlohmann::json::parse(m.to_json().dump());
    auto back = manifest::from_json(j);
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(*back, m);
    EXPECT_EQ(j["segments"][3]["kind"], "repo_map");
    EXPECT_EQ(j["segments"][3]["class"], "high");
    EXPECT_EQ(j["segments"][3]["path"], "src/map.txt");
    EXPECT_EQ(j["stable_prefix_hash"].get<std::string>().size(), 32u);
    EXPECT_FALSE(j.contains("salt"));
}

TEST(Manifest, FromJsonIsStrict) {
    const nlohmann::json good = manifest_of(typical_workspace()).to_json();
    auto expect_bad = [](const nlohmann::json & j, const char * mention) {
        auto r = manifest::from_json(j);
        ASSERT_FALSE(r.ok()) << j.dump();
        EXPECT_EQ(r.error().code(), status_code::invalid_argument);
        EXPECT_NE(r.error().message().find(mention), std::string::npos) << r.error().message();
    };
    auto j = good;
    j.erase("n_tokens");
    expect_bad(j, "'n_tokens'");
    j = good;
    j["segments"][2]["kind"] = "readme";
    expect_bad(j, "'readme'");
    j = good;
    j["segments"][0]["token_hash"] = "xyz";
    expect_bad(j, "segments[0]");
    j = good;
    j["segments"][1]["class"] = "forever";
    expect_bad(j, "'forever'");
    j = good;
    j["segments"][1]["token_end"] = -5;
    expect_bad(j, "segments[1]");
    j = good;
    j["stable_end"] = 1.5;
    expect_bad(j, "'stable_end'");
}

TEST(Manifest, TableNamesEverySegment) {
    const auto m = manifest_of(typical_workspace());
    const std::string t = m.to_table();
    for (const auto & e : m.segments) {
        EXPECT_NE(t.find(e.id), std::string::npos) << e.id;
        EXPECT_NE(t.find(e.content_hash.short_hex()), std::string::npos) << e.id;
    }
    EXPECT_NE(t.find("map (src/map.txt)"), std::string::npos);
    EXPECT_NE(t.find("(generation)"), std::string::npos);
    EXPECT_NE(t.find(m.stable_prefix_hash.short_hex()), std::string::npos);
    EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), static_cast<long>(m.segments.size() + 3));
}

}  // namespace
}  // namespace warmctx
