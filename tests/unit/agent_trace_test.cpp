// The agent-trace generator: seeded, Zipf-skewed, with edits that stick.
#include "workload/agent_trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "workload/workload.h"

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
    o = {};
    o.history_window = -2;
    EXPECT_FALSE(make_agent_trace(o, words).ok());
}

// Without a history window (the default) a turn is its stable context, a diff, test
// output and a question: no history segment, nothing carried from earlier turns.
TEST(AgentTrace, NoHistoryWindowNoHistory) {
    agent_trace_options o;
    o.n_turns = 30;
    auto t = make(o);
    for (const auto & turn : t.turns) {
        EXPECT_EQ(turn.n_history, 0u);
        EXPECT_EQ(turn.history_available, 0u);
        ASSERT_EQ(turn.segments.size(), turn.n_stable + 3);
        for (const auto & s : turn.segments) EXPECT_NE(s.kind, segment_kind::history);
        const auto m = trace_chat_messages(turn);
        ASSERT_EQ(m.size(), 2u);
        EXPECT_EQ(m[0].role, "system");
        EXPECT_EQ(m[1].role, "user");
    }
}

// --history-window N: turn k of a workspace carries min(N, 2k) messages of its
// conversation, the LAST ones (the window slides), oldest first, alternating the
// earlier turns' user messages (their diff, tests and question) and the answers; the
// workspace order is the one the trace has without a window.
TEST(AgentTrace, HistoryWindowCarriesTheLastNMessages) {
    for (int window : {1, 4, 5, -1}) {
        agent_trace_options o;
        o.n_workspaces = 3;
        o.n_turns = 60;
        o.stable_tokens = 512;
        o.edit_prob = 0.1;
        o.history_window = window;
        auto t = make(o);
        o.history_window = 0;
        auto plain = make(o);
        std::map<int, std::vector<std::string>> user_texts;  // per workspace, per turn
        std::map<std::string, std::string> answer_of;        // history id -> content
        size_t full_windows = 0;
        for (size_t i = 0; i < t.turns.size(); ++i) {
            const auto & turn = t.turns[i];
            SCOPED_TRACE("window " + std::to_string(window) + ", turn " + std::to_string(i));
            EXPECT_EQ(turn.workspace, plain.turns[i].workspace);
            EXPECT_EQ(turn.n_stable, plain.turns[i].n_stable);
            auto & users = user_texts[turn.workspace];
            const size_t available = 2 * users.size();
            EXPECT_EQ(turn.history_available, available);
            const size_t want = window < 0 ? available : std::min<size_t>((size_t)window, available);
            ASSERT_EQ(turn.n_history, want);
            ASSERT_EQ(turn.segments.size(), turn.n_stable + turn.n_history + 3);
            if (window > 0 && want == (size_t)window) ++full_windows;
            for (size_t k = 0; k < turn.n_history; ++k) {
                const segment & h = turn.segments[turn.n_stable + k];
                const size_t index = available - want + k;  // in the conversation
                char id[32];
                std::snprintf(id, sizeof id, "h%06zu", index);
                EXPECT_EQ(h.id, id);
                EXPECT_EQ(h.kind, segment_kind::history);
                if (index % 2 == 0) {
                    EXPECT_EQ(h.role, "user");
                    EXPECT_EQ(h.content, users[index / 2]);  // that earlier turn's user message
                } else {
                    EXPECT_EQ(h.role, "assistant");
                    EXPECT_FALSE(h.content.empty());
                    auto [it, fresh] = answer_of.emplace(h.id + "@" + std::to_string(turn.workspace), h.content);
                    if (!fresh) {
                        EXPECT_EQ(it->second, h.content);  // the same answer every time it is sent
                    }
                }
            }
            for (size_t s = 0; s < turn.n_stable; ++s) EXPECT_NE(turn.segments[s].kind, segment_kind::history);
            // As plain chat: system, the window, the new user message.
            const auto m = trace_chat_messages(turn);
            ASSERT_EQ(m.size(), turn.n_history + 2);
            EXPECT_EQ(m.front().role, "system");
            EXPECT_NE(m.front().content.find(turn.segments[0].content), std::string::npos);
            for (size_t k = 0; k < turn.n_history; ++k) {
                EXPECT_EQ(m[1 + k].role, turn.segments[turn.n_stable + k].role);
                EXPECT_EQ(m[1 + k].content, turn.segments[turn.n_stable + k].content);
            }
            EXPECT_EQ(m.back().role, "user");
            EXPECT_EQ(m.back().content.rfind(turn.segments[turn.segments.size() - 3].content, 0), 0u);  // the diff first
            EXPECT_EQ(m.back().content.substr(m.back().content.size() - turn.segments.back().content.size()),
                      turn.segments.back().content);  // the question last
            users.push_back(m.back().content);
        }
        if (window > 0) {
            EXPECT_GT(full_windows, 10u);
        }
    }
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
