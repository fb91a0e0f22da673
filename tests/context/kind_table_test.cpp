#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "warmctx/kind_table.h"

namespace warmctx {
namespace {

struct expected_row {
    segment_kind kind;
    stability how_stable;
    retention_class retention;
    int order;
    const char * role;
};

TEST(KindTable, DefaultsAreTheDesignTable) {
    using enum segment_kind;
    using st = stability;
    using rc = retention_class;
    const expected_row rows[] = {
        {system, st::stable, rc::highest, 1, "system"},      {tools, st::stable, rc::highest, 2, "system"},
        {instructions, st::stable, rc::highest, 3, "system"}, {repo_map, st::stable, rc::high, 4, "system"},
        {pinned_file, st::stable, rc::high, 5, "system"},     {task_summary, st::stable_ish, rc::high, 6, "system"},
        {history, st::volatile_, rc::low, 7, "user"},        {diff, st::volatile_, rc::medium, 8, "user"},
        {test_output, st::volatile_, rc::medium, 9, "user"}, {terminal_log, st::volatile_, rc::low, 10, "user"},
        {snippet, st::volatile_, rc::low, 11, "user"},       {user, st::volatile_, rc::none, 12, "user"},
    };
    static_assert(std::size(rows) == k_segment_kind_count);
    const kind_table t;
    for (const auto & r : rows) {
        const auto & p = t.policy(r.kind);
        SCOPED_TRACE(std::string(segment_kind_name(r.kind)));
        EXPECT_EQ(p.how_stable, r.how_stable);
        EXPECT_EQ(p.retention, r.retention);
        EXPECT_EQ(p.order, r.order);
        EXPECT_EQ(p.role, r.role);
        EXPECT_EQ(p.role_from_segment, r.kind == history);
        EXPECT_EQ(p.header, r.kind != history && r.kind != user);
    }
}

TEST(KindTable, OverridesChangeOnlyWhatTheyName) {
    auto t = kind_table::from_json(
        R"({"kinds":{"repo_map":{"retention":"highest","order":2},
                     "history":{"segment_role":false,"header":true,"stability":"stable_ish","role":"system"}}})");
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    const kind_table d;
    EXPECT_EQ(t->policy(segment_kind::repo_map).retention, retention_class::highest);
    EXPECT_EQ(t->policy(segment_kind::repo_map).order, 2);
    EXPECT_EQ(t->policy(segment_kind::repo_map).how_stable, stability::stable);  // untouched
    EXPECT_EQ(t->policy(segment_kind::repo_map).role, "system");
    const auto & h = t->policy(segment_kind::history);
    EXPECT_FALSE(h.role_from_segment);
    EXPECT_TRUE(h.header);
    EXPECT_EQ(h.how_stable, stability::stable_ish);
    EXPECT_EQ(h.role, "system");
    for (auto k : {segment_kind::system, segment_kind::diff, segment_kind::user})
        EXPECT_EQ(t->policy(k), d.policy(k)) << segment_kind_name(k);
}

TEST(KindTable, EmptyDocumentsAreTheDefaults) {
    for (const char * doc : {"{}", R"({"kinds":{}})", R"({"kinds":{"diff":{}}})"}) {
        auto t = kind_table::from_json(std::string_view(doc));
        ASSERT_TRUE(t.ok()) << doc;
        EXPECT_EQ(*t, kind_table{}) << doc;
    }
}

TEST(KindTable, ToJsonRoundTrips) {
    auto t = kind_table::from_json(R"({"kinds":{"snippet":{"retention":"high","order":0}}})");
    ASSERT_TRUE(t.ok());
    auto back = kind_table::from_json_value(t->to_json());
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(*back, *t);
    EXPECT_EQ(t->to_json()["kinds"]["snippet"]["retention"], "high");
}

TEST(KindTable, BadConfigIsAClearError) {
    struct bad_case {
        const char * doc;
        const char * must_mention;
    };
    const bad_case cases[] = {
        {"{", "not valid JSON"},
        {"[]", "JSON object"},
        {R"({"kinds":{}, "extra":1})", "'extra'"},
        {R"({"kinds":[]})", "\"kinds\" must be an object"},
        {R"({"kinds":{"readme":{}}})", "'readme'"},
        {R"({"kinds":{"diff":7}})", "kind 'diff'"},
        {R"({"kinds":{"diff":{"colour":"red"}}})", "'colour'"},
        {R"({"kinds":{"diff":{"retention":"forever"}}})", "'forever'"},
        {R"({"kinds":{"diff":{"retention":3}}})", "must be a string"},
        {R"({"kinds":{"diff":{"stability":"rock"}}})", "'rock'"},
        {R"({"kinds":{"diff":{"order":"1"}}})", "must be an integer"},
        {R"({"kinds":{"diff":{"order":1.5}}})", "must be an integer"},
        {R"({"kinds":{"diff":{"order":-1}}})", "outside"},
        {R"({"kinds":{"diff":{"role":"narrator"}}})", "'narrator'"},
        {R"({"kinds":{"diff":{"header":"yes"}}})", "true or false"},
        {R"({"kinds":{"diff":{"segment_role":1}}})", "true or false"},
        // `user` must stay strictly last
        {R"({"kinds":{"user":{"order":5}}})", "'user'"},
        {R"({"kinds":{"snippet":{"order":12}}})", "kind 'snippet' has order 12"},
        {R"({"kinds":{"diff":{"order":99}}})", "kind 'diff' has order 99"},
    };
    for (const auto & c : cases) {
        auto t = kind_table::from_json(std::string_view(c.doc));
        ASSERT_FALSE(t.ok()) << c.doc;
        EXPECT_EQ(t.error().code(), status_code::invalid_argument) << c.doc;
        EXPECT_NE(t.error().message().find(c.must_mention), std::string::npos)
            << c.doc << " -> " << t.error().message();
    }
}

TEST(KindTable, UserMayMoveIfItStaysLast) {
    auto t = kind_table::from_json(R"({"kinds":{"user":{"order":50},"snippet":{"order":49}}})");
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    EXPECT_EQ(t->policy(segment_kind::user).order, 50);
}

TEST(KindTable, ParseStabilityAndRoles) {
    EXPECT_EQ(*parse_stability("stable_ish"), stability::stable_ish);
    EXPECT_EQ(*parse_stability("volatile"), stability::volatile_);
    EXPECT_FALSE(parse_stability("volatile_").ok());
    for (auto s : {stability::stable, stability::stable_ish, stability::volatile_})
        EXPECT_EQ(*parse_stability(stability_name(s)), s);
    EXPECT_TRUE(is_chat_role("assistant"));
    EXPECT_FALSE(is_chat_role("System"));
}

}  // namespace
}  // namespace warmctx
