// The agent-trace generator: seeded, Zipf-skewed, with edits that stick.
#include "warmctx/agent_trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "warmctx/workload.h"

namespace warmctx {
namespace {

size_t words(const std::string & s) { return s.size() / 4 + 1; }  // a stand-in tokenizer

agent_trace make(agent_trace_options o) {
    auto t = make_agent_trace(o, words);
    EXPECT_TRUE(t.ok()) << t.error().to_string();
    return std::move(*t);
}

TEST(AgentTrace, SameSeedSameTraceOtherSeedOtherTrace) {
    agent_trace_options o;
    o.n_turns = 40;
    auto a = make(o), b = make(o);
    ASSERT_EQ(a.turns.size(), 40u);
    for (size_t i = 0; i < a.turns.size(); ++i) {
        EXPECT_EQ(a.turns[i].workspace, b.turns[i].workspace);
        ASSERT_EQ(a.turns[i].segments.size(), b.turns[i].segments.size());
        for (size_t s = 0; s < a.turns[i].segments.size(); ++s)
            EXPECT_EQ(a.turns[i].segments[s].content, b.turns[i].segments[s].content);
    }
    o.seed = 2;
    auto c = make(o);
    bool differs = false;
    for (size_t i = 0; i < a.turns.size(); ++i) differs |= a.turns[i].segments.back().content != c.turns[i].segments.back().content;
    EXPECT_TRUE(differs);
}

TEST(AgentTrace, PopularityFollowsZipf) {
    agent_trace_options o;
    o.n_workspaces = 5;
    o.n_turns = 2000;
    o.stable_tokens = 256;
    o.zipf_s = 1.0;
    auto t = make(o);
    std::map<int, int> n;
    for (const auto & turn : t.turns) ++n[turn.workspace];
    // P(k) = (1/(k+1)) / H_5, H_5 = 2.2833: 876, 438, 292, 219, 175 of 2000.
    const double expect[] = {876, 438, 292, 219, 175};
    for (int k = 0; k < 5; ++k) EXPECT_NEAR(n[k], expect[k], 0.2 * expect[k] + 10) << "workspace " << k;
    for (int k = 1; k < 5; ++k) EXPECT_GT(n[k - 1], n[k]);
}

TEST(AgentTrace, StableContextRepeatsTailChangesEditsStick) {
    agent_trace_options o;
    o.n_workspaces = 2;
    o.n_turns = 200;
    o.edit_prob = 0.2;
    o.stable_tokens = 512;
    auto t = make(o);
    std::map<int, std::vector<segment>> last;
    int edits = 0;
    for (const auto & turn : t.turns) {
        ASSERT_GE(turn.segments.size(), 7u);
        const auto & q = turn.segments.back();
        EXPECT_EQ(q.kind, segment_kind::user);
        auto it = last.find(turn.workspace);
        if (it != last.end()) {
            const auto & prev = it->second;
            ASSERT_EQ(prev.size(), turn.segments.size());
            for (size_t s = 0; s + 3 < prev.size(); ++s) {  // the stable part
                const bool edited = prev[s].id == turn.edited;
                EXPECT_EQ(prev[s].content == turn.segments[s].content, !edited) << prev[s].id;
                if (edited) {
                    ++edits;
                    EXPECT_TRUE(prev[s].kind == segment_kind::repo_map || prev[s].kind == segment_kind::pinned_file);
                }
            }
            EXPECT_NE(prev.back().content + prev[prev.size() - 3].content,
                      turn.segments.back().content + turn.segments[turn.segments.size() - 3].content);
        }
        last[turn.workspace] = turn.segments;
    }
    EXPECT_GT(edits, 10);
    EXPECT_LT(edits, 80);
}

TEST(AgentTrace, BadOptionsAreErrors) {
    agent_trace_options o;
    o.n_workspaces = 0;
    EXPECT_FALSE(make_agent_trace(o, words).ok());
    o = {};
    o.edit_prob = 1.5;
    EXPECT_FALSE(make_agent_trace(o, words).ok());
    o = {};
    o.stable_tokens = 10;
    EXPECT_FALSE(make_agent_trace(o, words).ok());
    o = {};
    o.n_turns = 0;
    EXPECT_FALSE(make_agent_trace(o, words).ok());
}


// A stable edit of tool schemas keeps them a JSON array of tools (a template renders them
// as tools), whichever line the middle of the text falls on - a line's end included.
TEST(WorkloadEdit, AToolSchemaEditStaysATextOfValidTools) {
    for (uint64_t seed = 1; seed <= 400; ++seed) {
        workload_generator g(seed, words);
        const std::string tools = g.tool_schemas(1 + (int)(seed % 5));
        const std::string edited = g.edit_one_line(tools);
        EXPECT_NE(edited, tools) << seed;
        const nlohmann::json j = nlohmann::json::parse(edited, nullptr, false);
        ASSERT_TRUE(j.is_array()) << seed << ":\n" << edited;
        ASSERT_EQ(j.size(), nlohmann::json::parse(tools).size()) << seed;
        for (const auto & t : j) EXPECT_TRUE(t["function"]["name"].is_string()) << seed;
    }
    // The middle exactly on a line's end ("aa|\nbb") edits the line it ends, and the rest
    // stays as it was; in a line, that line.
    workload_generator g(1, words);
    const std::string a = g.edit_one_line("aa\nbb");
    EXPECT_EQ(a.rfind("// edited: ", 0), 0u) << a;
    EXPECT_EQ(a.substr(a.size() - 3), "\nbb") << a;
    EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), 1) << a;
    const std::string e = g.edit_one_line("abc\ndef\n");
    EXPECT_EQ(e.rfind("abc\n// edited: ", 0), 0u) << e;
    EXPECT_EQ(e.back(), '\n');
}

}  // namespace
}  // namespace warmctx
