// The learned order of a workspace's stable segments and its finer blocks
// (warmctx/volatility.h), and how assemble applies them.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include <nlohmann/json.hpp>

#include "fake_text_model.h"
#include "test_workspace.h"
#include "warmctx/assembler.h"
#include "warmctx/text_model.h"
#include "warmctx/volatility.h"

namespace warmctx {
namespace {

using testing::fake_text_model;
using testing::make_segment;
using testing::test_profile;
using testing::typical_workspace;

std::vector<std::string> ids_of(const std::vector<const segment *> & order) {
    std::vector<std::string> out;
    for (const segment * s : order) out.push_back(s->id);
    return out;
}

// A workspace of a system prompt, a repo map and three pinned files, sized in bytes.
std::vector<segment> workspace(const std::string & map_version = "v0", const std::string & pin_b = "b0") {
    using enum segment_kind;
    return {make_segment("sys", system, std::string(400, 's')),
            make_segment("map", repo_map, map_version + std::string(2000, 'm')),
            make_segment("pin-a", pinned_file, std::string(1000, 'a'), "src/a.cc"),
            make_segment("pin-b", pinned_file, pin_b + std::string(1000, 'b'), "src/b.cc"),
            make_segment("pin-c", pinned_file, std::string(1000, 'c'), "src/c.cc"),
            make_segment("q", user, "why?")};
}

// One turn as the runtime runs it: decide, assemble in that order, observe.
order_decision turn(volatility_state & st, const std::vector<segment> & segs, const volatility_options & o = {},
                    bool * learned = nullptr) {
    static const kind_table kinds;
    order_decision d = decide_order(st, segs, kinds, o);
    manifest prompt_manifest;
    std::optional<size_t> first_chat;
    for (const segment * s : ordered_segments(segs, kinds, d.hints.order)) {
        if (!first_chat && is_chat_message(*s)) first_chat = prompt_manifest.segments.size();
        manifest_entry e;
        e.id = s->id;
        e.kind = s->kind;
        e.how_stable = kinds.policy(s->kind).how_stable;
        e.content_hash = segment_content_hash(*s);
        e.content_bytes = s->content.size();
        prompt_manifest.segments.push_back(e);
    }
    const bool l = observe_turn(st, prompt_manifest, first_chat);
    if (learned) *learned = l;
    return d;
}

TEST(LineBlockCuts, CutAtLineStartsEveryBlockAndKeepTheHeadsCutsAfterAnEdit) {
    std::string text;
    for (int i = 0; i < 300; ++i) text += "line_" + std::to_string(i) + " = " + std::to_string(i * 13) + ";\n";
    const auto cuts = line_block_cuts(text, 128);
    ASSERT_GT(cuts.size(), 10u);
    size_t last = 0;
    for (size_t c : cuts) {
        EXPECT_TRUE(is_line_cut(text, c));
        EXPECT_GE(c - last, 128u);
        last = c;
    }
    // An edit in the middle: every cut before it stays.
    std::string edited = text;
    const size_t at = text.size() / 2;
    edited.insert(edited.find('\n', at) + 1, "inserted_line = 1;\n");
    const auto cuts2 = line_block_cuts(edited, 128);
    for (size_t c : cuts)
        if (c <= at) {
            EXPECT_NE(std::find(cuts2.begin(), cuts2.end(), c), cuts2.end()) << c;
        }
    // Lines that start with something other than a letter or digit are no cut points.
    EXPECT_TRUE(line_block_cuts(std::string(1000, ' ') + "\n  x\n", 10).empty());
}

// Most lines of code are indented: with `any_line` (a tokenizer that allows it) a file
// made only of indented lines and blank ones is still cut every block, before indented
// lines and never before a blank one; without it, it is not cut at all.
TEST(LineBlockCuts, WithAnyLineCutAlsoBeforeIndentedLinesNeverBeforeBlankOnes) {
    std::string text = "namespace x {\n";
    for (int i = 0; i < 200; ++i)
        text += (i % 5 == 4 ? std::string("    \n") : i % 7 == 0 ? std::string("\n") : std::string("")) + "    int v_" +
                std::to_string(i) + " = f(" + std::to_string(i) + ");\n\t\tg();\n";
    const auto plain = line_block_cuts(text, 128);
    EXPECT_TRUE(plain.empty()) << "only the first line starts with a letter";
    const auto cuts = line_block_cuts(text, 128, true);
    ASSERT_GT(cuts.size(), 20u);
    size_t last = 0;
    for (size_t c : cuts) {
        EXPECT_TRUE(is_any_line_cut(text, c));
        EXPECT_NE(text[c], '\n');
        EXPECT_NE(text.substr(c, 5), "    \n") << "a blank line with spaces is no cut point";
        EXPECT_GE(c - last, 128u);
        last = c;
    }
    // An edit keeps every cut before it.
    std::string edited = text;
    const size_t at = text.find("int v_150");
    edited.insert(at, "edited(); ");
    const auto cuts2 = line_block_cuts(edited, 128, true);
    for (size_t c : cuts)
        if (c <= at) {
            EXPECT_NE(std::find(cuts2.begin(), cuts2.end(), c), cuts2.end()) << c;
        }
    // What is_any_line_cut accepts: a line start whose line goes on, after spaces and tabs,
    // with printable ASCII.
    EXPECT_TRUE(is_any_line_cut("a\n  }", 2));
    EXPECT_TRUE(is_any_line_cut("a\n\t// x", 2));
    EXPECT_FALSE(is_any_line_cut("a\n  \n", 2));
    EXPECT_FALSE(is_any_line_cut("a\n  ", 2));
    EXPECT_FALSE(is_any_line_cut("a\n \r\n", 2));
    EXPECT_FALSE(is_any_line_cut("a\n \xc2\xa0x", 2));
    EXPECT_FALSE(is_any_line_cut("ab  }", 2)) << "not a line start";
}

TEST(LearnedOrder, ReordersOnlyInsideARunOfStableSegmentsOfOneClass) {
    const kind_table kinds;
    auto segs = typical_workspace();
    const std::vector<std::string> canonical = ids_of(ordered_segments(segs, kinds));
    // The repo map and the pinned files are one run (stable, high); the system prompt,
    // the tools and the rules another (stable, highest). A learned order never moves a
    // segment out of its run: the map stays after the system prompt although it is named
    // first.
    const std::vector<std::string> learned = {"map", "sys", "pin/src/parse.cc"};
    const auto got = ids_of(ordered_segments(segs, kinds, learned));
    auto pos = [&](const std::vector<std::string> & v, std::string_view id) {
        return std::find(v.begin(), v.end(), id) - v.begin();
    };
    EXPECT_LT(pos(got, "sys"), pos(got, "map"));
    // The tools never move (the template writes them in its own place): they split the
    // system prompt and the rules into runs of one.
    EXPECT_EQ(pos(got, "tools"), pos(canonical, "tools"));
    EXPECT_LT(pos(got, "sys"), pos(got, "tools"));
    // Inside a run: the segments it does not name first (in the kind order), then its order.
    EXPECT_LT(pos(got, "pin/src/lex.cc"), pos(got, "map"));
    EXPECT_LT(pos(got, "map"), pos(got, "pin/src/parse.cc"));
    // Everything outside the runs keeps its place.
    for (const char * id : {"summary", "turn-1-a", "turn-1-u", "diff-1", "tests-out", "q"})
        EXPECT_EQ(pos(got, id), pos(canonical, id)) << id;
    // Input order never matters.
    std::mt19937 rng(7);
    for (int i = 0; i < 5; ++i) {
        std::shuffle(segs.begin(), segs.end(), rng);
        EXPECT_EQ(ids_of(ordered_segments(segs, kinds, learned)), got);
    }
}

TEST(LearnedOrder, AssembleUsesTheHintsAndTheInputOrderStillDoesNotMatter) {
    const kind_table kinds;
    fake_text_model model;
    auto segs = workspace();
    assembly_hints h;
    h.order = {"pin-a", "pin-c", "map", "pin-b"};
    auto a = assemble(segs, kinds, model, test_profile(), "s", 16, true, h);
    std::reverse(segs.begin(), segs.end());
    auto b = assemble(segs, kinds, model, test_profile(), "s", 16, true, h);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->tokens, b->tokens);
    std::vector<std::string> ids;
    for (const auto & e : a->prompt_manifest.segments) ids.push_back(e.id);
    EXPECT_EQ(ids, (std::vector<std::string>{"sys", "pin-a", "pin-c", "map", "pin-b", "q"}));
    EXPECT_EQ(a->hints, h);
}

TEST(LearnedOrder, NoHistoryKeepsTheKindOrderAndWholeChunks) {
    volatility_state st;
    const order_decision d = turn(st, workspace());
    EXPECT_FALSE(d.reordered);
    EXPECT_TRUE(d.hints.fine.empty());
    EXPECT_EQ(d.hints.order, (std::vector<std::string>{"sys", "map", "pin-a", "pin-b", "pin-c"}));
    EXPECT_TRUE(d.note.empty());
}

TEST(LearnedOrder, ASegmentEditedTwiceMovesLastInItsClassAtItsEditAndOneEditOnlyCutsItFiner) {
    volatility_state st;
    turn(st, workspace("v0"));
    turn(st, workspace("v0"));
    order_decision d1 = turn(st, workspace("v1"));  // one edit: an event
    EXPECT_FALSE(d1.reordered);
    EXPECT_EQ(d1.hints.fine, (std::vector<std::string>{"map"}));
    turn(st, workspace("v1"));
    order_decision d2 = turn(st, workspace("v2"));  // two: a habit, and moving it costs nothing now
    EXPECT_TRUE(d2.reordered) << d2.note;
    EXPECT_EQ(d2.hints.order, (std::vector<std::string>{"sys", "pin-a", "pin-b", "pin-c", "map"}));
    EXPECT_NE(d2.note.find("'map' (changed in 2 of the last 4 turns)"), std::string::npos) << d2.note;
    EXPECT_EQ(st.order, d2.hints.order);
    // It stays there while nothing else changes, cut finer even once its changes have
    // left the window (going back to whole chunks would be a miss of its own).
    for (int i = 0; i < 40; ++i) {
        const order_decision d = turn(st, workspace("v2"));
        EXPECT_FALSE(d.reordered);
        EXPECT_EQ(d.hints.fine, (std::vector<std::string>{"map"}));
    }
    EXPECT_EQ(st.order.back(), "map");
}

TEST(LearnedOrder, TheStateReadsBackFromItsJsonAndDecidesTheSame) {
    volatility_state st;
    turn(st, workspace("v0"));
    turn(st, workspace("v1"));
    turn(st, workspace("v2"));  // the map: twice, moved last and cut finer
    const std::string text = volatility_to_json(st);
    auto back = volatility_from_json(text);
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(back->order, st.order);
    EXPECT_EQ(back->n_turns, st.n_turns);
    ASSERT_EQ(back->segs.size(), st.segs.size());
    for (const auto & [id, v] : st.segs) {
        const segment_volatility & w = back->segs.at(id);
        EXPECT_EQ(w.content_hash, v.content_hash) << id;
        EXPECT_EQ(w.content_bytes, v.content_bytes) << id;
        EXPECT_EQ(w.changed_bits, v.changed_bits) << id;
        EXPECT_EQ(w.n_observed, v.n_observed) << id;
        EXPECT_EQ(w.fine, v.fine) << id;
    }
    static const kind_table kinds;
    const order_decision a = decide_order(st, workspace("v3"), kinds, {});
    const order_decision b = decide_order(*back, workspace("v3"), kinds, {});
    EXPECT_EQ(a.hints, b.hints);
    EXPECT_EQ(b.hints.order.back(), "map");
    // What is not this format is refused, never half read.
    for (std::string_view bad : {"", "{}", "[1]", "{\"format\":\"warmctx-volatility-v0\"}",
                                 "{\"format\":\"warmctx-volatility-v1\",\"n_turns\":-1,\"order\":[],\"segs\":{}}",
                                 "{\"format\":\"warmctx-volatility-v1\",\"n_turns\":1,\"order\":[2],\"segs\":{}}"})
        EXPECT_FALSE(volatility_from_json(bad).ok()) << bad;
    std::string torn = text.substr(0, text.size() / 2);
    EXPECT_FALSE(volatility_from_json(torn).ok());
}

// The generation prompt joins the last segment's piece (one decode call for the tail)
// once two turns in a row (the request at hand included) did not carry their last
// segment forward, and not on or after a turn that did; what was learned survives the JSON, and a file written before
// it was kept reads as nothing learned.
TEST(LearnedOrder, TheGenerationPromptIsFusedOnlyWhereTurnsDoNotCarryTheirLastSegmentForward) {
    auto with_question = [](const std::string & q) {
        auto segs = workspace();
        segs.back().content = q;
        return segs;
    };
    volatility_state st;
    EXPECT_FALSE(turn(st, with_question("first?")).hints.fuse_generation_prompt) << "nothing observed";
    EXPECT_FALSE(turn(st, with_question("second?")).hints.fuse_generation_prompt) << "one turn is not a habit";
    EXPECT_TRUE(turn(st, with_question("third?")).hints.fuse_generation_prompt);
    EXPECT_TRUE(turn(st, with_question("fourth?")).hints.fuse_generation_prompt);
    // The same question again (a retry): carried, at its place; then one new question is
    // not yet a habit again.
    EXPECT_FALSE(turn(st, with_question("fourth?")).hints.fuse_generation_prompt);
    EXPECT_FALSE(turn(st, with_question("fifth?")).hints.fuse_generation_prompt);
    EXPECT_TRUE(turn(st, with_question("sixth?")).hints.fuse_generation_prompt);
    // An appending agent: the last question comes back as history at its index.
    volatility_state app;
    auto a = with_question("q0");
    for (int t = 1; t <= 4; ++t) {
        EXPECT_FALSE(turn(app, a).hints.fuse_generation_prompt) << t;
        segment asked = a.back();
        asked.id = "h" + std::to_string(2 * t);
        asked.kind = segment_kind::history;
        asked.role = "user";
        segment answer =
            make_segment("h" + std::to_string(2 * t + 1), segment_kind::history, "answer " + std::to_string(t));
        answer.role = "assistant";
        a.back() = asked;
        a.push_back(answer);
        a.push_back(make_segment("q", segment_kind::user, "q" + std::to_string(t)));
    }
    // JSON keeps it.
    const std::string text = volatility_to_json(st);
    auto back = volatility_from_json(text);
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(back->tail, st.tail);
    EXPECT_EQ(back->head, st.head);
    static const kind_table kinds;
    EXPECT_EQ(decide_order(*back, with_question("x"), kinds, {}).hints,
              decide_order(st, with_question("x"), kinds, {}).hints);
    auto j = nlohmann::json::parse(text);
    j.erase("tail_carried_bits");
    j.erase("tail_observed");
    j.erase("last_tail");
    auto old = volatility_from_json(j.dump());
    ASSERT_TRUE(old.ok()) << old.error().to_string();
    EXPECT_EQ(old->tail.observed, 0u);
    EXPECT_FALSE(decide_order(*old, with_question("x"), kinds, {}).hints.fuse_generation_prompt);
    j["tail_observed"] = -1;
    j["tail_carried_bits"] = 0;
    EXPECT_FALSE(volatility_from_json(j.dump()).ok());
}

// observe_turn says when the state a restart needs changed, so that the runtime writes it
// at once: the order, finer blocks, and the fusion habit both ways; not an ordinary turn.
TEST(LearnedOrder, ObservingATurnSaysWhenTheOrderBlocksOrFusionHabitChanged) {
    auto with = [](const std::string & q, const std::string & pin_b = "b0") {
        auto segs = workspace("v0", pin_b);
        segs.back().content = q;
        return segs;
    };
    volatility_state st;
    bool learned = false;
    turn(st, with("first?"), {}, &learned);
    EXPECT_TRUE(learned) << "the first order";
    turn(st, with("second?"), {}, &learned);
    EXPECT_TRUE(learned) << "a turn that did not carry the question: fusing from now on";
    EXPECT_TRUE(st.tail.habit());
    turn(st, with("third?"), {}, &learned);
    EXPECT_FALSE(learned) << "nothing a restart would miss";
    turn(st, with("third?"), {}, &learned);
    EXPECT_TRUE(learned) << "a retry carried it: the habit is broken";
    EXPECT_FALSE(st.tail.habit());
    turn(st, with("fourth?"), {}, &learned);
    EXPECT_TRUE(learned) << "and learned again";
    turn(st, with("fifth?", "edited "), {}, &learned);
    EXPECT_TRUE(learned) << "pin-b changed: its finer blocks";
    turn(st, with("sixth?", "edited "), {}, &learned);
    EXPECT_FALSE(learned);
}

// With fuse_generation_prompt the prompt's tokens are the same and its last block runs
// from the last segment through the generation prompt: no block ends between them.
TEST(LearnedOrder, AFusedGenerationPromptSharesTheLastSegmentsBlock) {
    const kind_table kinds;
    fake_text_model model;
    const auto segs = workspace();
    assembly_hints h;
    auto apart = assemble(segs, kinds, model, test_profile(), "s", 16, true, h);
    h.fuse_generation_prompt = true;
    auto fused = assemble(segs, kinds, model, test_profile(), "s", 16, true, h);
    ASSERT_TRUE(apart.ok() && fused.ok());
    EXPECT_EQ(apart->tokens, fused->tokens);
    const pos_t g = fused->prompt_manifest.generation_prompt_begin;
    ASSERT_GT(g, fused->prompt_manifest.segments.back().token_begin);
    auto ends_at = [](const assembled_prompt & p, pos_t at) {
        return std::any_of(p.blocks.begin(), p.blocks.end(), [&](const block & b) { return b.end == at; });
    };
    EXPECT_TRUE(ends_at(*apart, g));
    EXPECT_FALSE(ends_at(*fused, g));
    EXPECT_TRUE(ends_at(*fused, (pos_t)fused->tokens.size()));
    // Everything before the last segment's piece is chunked alike.
    const pos_t q = fused->prompt_manifest.segments.back().token_begin;
    for (const block & b : apart->blocks)
        if (b.end <= q) {
            EXPECT_TRUE(ends_at(*fused, b.end)) << b.end;
        }
}

// A workspace with a conversation: the system prompt and pinned files, the history
// messages given (user and assistant alternating), and a question.
std::vector<segment> conversation(int first, int last, const std::string & q) {
    auto segs = workspace();
    segs.back().content = q;
    for (int m = first; m <= last; ++m) {
        segment h = make_segment("m" + std::to_string(1000 + m), segment_kind::history,
                                 "message " + std::to_string(m) + std::string(40, 'x'));
        h.role = m % 2 == 0 ? "user" : "assistant";
        segs.push_back(h);
    }
    return segs;
}

// An agent that sends the last four messages: once two turns in a row (this request
// included) did not carry the first message forward at its place, the conversation is
// fused; an agent that appends (or a request that carries it again) is not.
TEST(LearnedOrder, ASlidingWindowsConversationIsFusedAndAnAppendedOneIsNot) {
    volatility_state win, app;
    for (int t = 0; t < 8; ++t) {
        const order_decision w = turn(win, conversation(std::max(0, 2 * t - 3), 2 * t, "q" + std::to_string(t)));
        const order_decision a = turn(app, conversation(0, 2 * t, "q" + std::to_string(t)));
        // Turns 0-1 append (the window is not full yet); turn 2 is the first that slides.
        EXPECT_EQ(w.hints.fuse_conversation, t >= 3) << t;
        EXPECT_FALSE(a.hints.fuse_conversation) << t;
    }
    EXPECT_TRUE(win.head.habit());
    // The window's state survives the JSON.
    auto back = volatility_from_json(volatility_to_json(win));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->head, win.head);
    // A request that carries the first message again (the agent went back to appending)
    // is not fused, whatever the habit.
    EXPECT_FALSE(turn(win, conversation(std::max(0, 2 * 7 - 3), 2 * 8, "q8")).hints.fuse_conversation);
}

// At an edit, the segments after the edited one are re-prefilled anyway: sorting only them
// by their rates is free, and taken even where sorting everything (moving a segment from
// before the edit) would not pay or would pay less.
TEST(LearnedOrder, AtAnEditWhatFollowsTheEditedSegmentIsSortedForFree) {
    using enum segment_kind;
    std::vector<segment> segs;
    for (int i = 0; i < 5; ++i)
        segs.push_back(make_segment("p" + std::to_string(i), pinned_file, std::string(2000, char('a' + i)),
                                    "src/p" + std::to_string(i) + ".cc"));
    segs.push_back(make_segment("q", user, "why?"));
    volatility_state st;
    st.order = {"p0", "p1", "p2", "p3", "p4"};
    // Changes in the last 32 turns: p0 2 (a habit, barely), p3 16, p4 4; p1 and p2 none.
    const std::map<std::string, uint64_t> bits = {
        {"p0", 0x00010001ull}, {"p3", 0x55555555ull}, {"p4", 0x11110000ull}, {"p1", 0}, {"p2", 0}};
    for (const segment & s : segs) {
        if (s.kind != pinned_file) continue;
        segment_volatility v;
        v.content_hash = segment_content_hash(s);
        v.content_bytes = s.content.size();
        v.changed_bits = bits.at(s.id);
        v.n_observed = 32;
        v.fine = v.changed_bits != 0;
        st.segs[s.id] = v;
    }
    st.n_turns = 33;
    segs[2].content[1000] = 'z';  // this turn edits p2, in its middle
    const order_decision d = decide_order(st, segs, kind_table{}, {});
    EXPECT_TRUE(d.reordered) << d.note;
    EXPECT_EQ(d.hints.order, (std::vector<std::string>{"p0", "p1", "p2", "p4", "p3"})) << d.note;
    EXPECT_NE(d.note.find("cost of 0 bytes"), std::string::npos) << d.note;
}

// What is not a conversation is never fused: a question alone (each turn's question is
// new, so nothing is carried, but there is no message boundary to save), and history
// segments without a role (each its own run in the assembler), however they slide.
TEST(LearnedOrder, AQuestionAloneOrRolelessHistoryIsNotAFusedConversation) {
    volatility_state alone, roleless;
    for (int t = 0; t < 6; ++t) {
        EXPECT_FALSE(turn(alone, conversation(1, 0, "q" + std::to_string(t))).hints.fuse_conversation) << t;
        auto segs = conversation(std::max(0, 2 * t - 3), 2 * t, "q" + std::to_string(t));
        for (segment & s : segs) s.role.clear();
        EXPECT_FALSE(turn(roleless, segs).hints.fuse_conversation) << t;
    }
    // The question alone was watched and never carried: a habit, and yet not fused.
    EXPECT_TRUE(alone.head.habit());
}

// Where a segment's finer blocks begin and its digest survive the JSON; a digest that is
// not 16 hex digits per block, or a fine_from that is not a count, is refused; a file
// written before they were kept reads as finer blocks from the start and no digest.
TEST(LearnedOrder, FineFromAndTheDigestReadBackFromTheJson) {
    volatility_state st;
    std::vector<segment> ws = workspace();
    order_decision d = decide_order(st, ws, kind_table{}, {});
    manifest prompt_manifest;
    for (const segment * sp : ordered_segments(ws, kind_table{}, d.hints.order)) {
        manifest_entry e;
        e.id = sp->id;
        e.kind = sp->kind;
        e.how_stable = kind_table{}.policy(sp->kind).how_stable;
        e.content_hash = segment_content_hash(*sp);
        prompt_manifest.segments.push_back(e);
    }
    observe_turn(st, prompt_manifest, std::nullopt, d.hints, d.digests);
    ASSERT_EQ(st.segs.at("pin-b").digest, content_digest(ws[3].content));
    EXPECT_EQ(content_digest(std::string(2 * k_edit_digest_bytes + 1, 'x')).size(), 3u);
    st.segs.at("pin-b").fine = true;
    st.segs.at("pin-b").fine_from = 768;
    auto back = volatility_from_json(volatility_to_json(st));
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(back->segs.at("pin-b").fine_from, 768u);
    EXPECT_EQ(back->segs.at("pin-b").digest, st.segs.at("pin-b").digest);
    auto j = nlohmann::json::parse(volatility_to_json(st));
    for (const char * bad : {"xyz", "0123456789abcde", "0123456789abcdeg"}) {
        auto k = j;
        k["segs"]["pin-b"]["digest"] = bad;
        EXPECT_FALSE(volatility_from_json(k.dump()).ok()) << bad;
    }
    auto k = j;
    k["segs"]["pin-b"]["fine_from"] = -3;
    EXPECT_FALSE(volatility_from_json(k.dump()).ok());
    k = j;
    k["segs"]["pin-b"].erase("fine_from");
    k["segs"]["pin-b"].erase("digest");
    auto old = volatility_from_json(k.dump());
    ASSERT_TRUE(old.ok());
    EXPECT_EQ(old->segs.at("pin-b").fine_from, 0u);
    EXPECT_TRUE(old->segs.at("pin-b").digest.empty());
}

// With fuse_conversation the tokens are the same, the stable prefix is chunked alike, and
// from the first chat message on the blocks are of class none and end only at chunk cuts.
TEST(LearnedOrder, AFusedConversationIsOneRunOfClassNone) {
    const kind_table kinds;
    fake_text_model model;
    const auto segs = conversation(3, 9, "why?");
    assembly_hints h;
    auto apart = assemble(segs, kinds, model, test_profile(), "s", 16, true, h);
    h.fuse_conversation = true;
    h.fuse_generation_prompt = true;
    auto fused = assemble(segs, kinds, model, test_profile(), "s", 16, true, h);
    ASSERT_TRUE(apart.ok()) << apart.error().to_string();
    ASSERT_TRUE(fused.ok()) << fused.error().to_string();
    EXPECT_EQ(apart->tokens, fused->tokens);
    pos_t chat = 0;
    for (const auto & e : fused->prompt_manifest.segments)
        if (e.kind == segment_kind::history) {
            chat = e.token_begin;
            break;
        }
    ASSERT_GT(chat, 0);
    size_t n_apart = 0, n_fused = 0;
    for (const block & b : apart->blocks) n_apart += b.begin >= chat;
    for (const block & b : fused->blocks) {
        if (b.end <= chat) {
            EXPECT_TRUE(std::any_of(apart->blocks.begin(), apart->blocks.end(),
                                    [&](const block & x) { return x.chain == b.chain; }))
                << "the stable prefix's block ending at " << b.end;
            continue;
        }
        ++n_fused;
        EXPECT_EQ(b.retention, retention_class::none) << b.begin;
        if (b.end < (pos_t)fused->tokens.size()) {
            EXPECT_EQ(b.end - b.begin, 16) << "a cut inside the run that is not the chunk size";
        }
    }
    EXPECT_LT(n_fused, n_apart) << "fewer decode calls";
}

TEST(LearnedOrder, AReorderThatCostsMoreThanItSavesWaitsForAnEditOfTheSegment) {
    volatility_state st;
    volatility_options o;
    auto ws = [](int map_v, int b_v) { return workspace("v" + std::to_string(map_v), "b" + std::to_string(b_v)); };
    // pin-b changes twice early, then often enough to rank, but not this turn.
    turn(st, ws(0, 0), o);
    turn(st, ws(0, 1), o);
    turn(st, ws(0, 1), o);
    for (int i = 0; i < 12; ++i) turn(st, ws(0, 1), o);
    // A second change of pin-b would move it after pin-c; when pin-b itself changes, the
    // move is free.
    order_decision d = turn(st, ws(0, 2), o);
    EXPECT_TRUE(d.reordered) << d.note;
    EXPECT_EQ(d.hints.order.back(), "pin-b");
    // The map changes once: it is only cut finer.
    volatility_state st2 = st;
    order_decision e1 = turn(st2, ws(1, 2), o);
    EXPECT_FALSE(e1.reordered);
    EXPECT_EQ(e1.hints.fine, (std::vector<std::string>{"map", "pin-b"}));
    // Its second change ranks it (as often as pin-b: after the files that never change,
    // before pin-b). Moving it costs its unchanged head (finer blocks would have kept
    // it): over 8 turns that pays, over 1 it does not.
    volatility_state st3 = st2, st4 = st2;
    volatility_options impatient = o;
    impatient.horizon_turns = 1;
    const order_decision kept = turn(st3, ws(2, 2), impatient);
    EXPECT_FALSE(kept.reordered);
    EXPECT_NE(kept.note.find("stable order kept"), std::string::npos) << kept.note;
    EXPECT_NE(kept.note.find("reorder cost"), std::string::npos) << kept.note;
    const order_decision moved = turn(st4, ws(2, 2), o);
    EXPECT_TRUE(moved.reordered) << moved.note;
    EXPECT_EQ(moved.hints.order, (std::vector<std::string>{"sys", "pin-a", "pin-c", "map", "pin-b"}));
}

TEST(LearnedOrder, DisabledGivesNoHints) {
    volatility_state st;
    turn(st, workspace("v0"));
    turn(st, workspace("v1"));
    turn(st, workspace("v2"));
    volatility_options off;
    off.enabled = false;
    EXPECT_TRUE(decide_order(st, workspace("v3"), kind_table{}, off).hints.empty());
}

}  // namespace
}  // namespace warmctx
