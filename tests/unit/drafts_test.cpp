// The draft index (warmctx/drafts.h) and the answers it drafts from (runtime/answer_memory.h):
// which text a draft proposes, and what it never proposes.
#include <gtest/gtest.h>

#include <numeric>

#include "answer_memory.h"
#include "warmctx/drafts.h"

namespace warmctx {
namespace {

std::vector<token_id> range(token_id from, token_id to) {
    std::vector<token_id> v((size_t)(to - from));
    std::iota(v.begin(), v.end(), from);
    return v;
}

TEST(DraftIndex, ProposesWhatFollowedTheTailBefore) {
    draft_index idx;
    auto text = range(100, 140);           // 100..139
    auto again = range(110, 115);          // 110..114: seen before, then 115.. followed
    idx.extend(text);
    idx.extend(again);
    EXPECT_EQ(idx.propose(4), (std::vector<token_id>{115, 116, 117, 118}));
    EXPECT_EQ(idx.propose(0), std::vector<token_id>{});
    idx.push(7);  // a tail never seen: no draft
    EXPECT_TRUE(idx.propose(4).empty());
}

TEST(DraftIndex, NeedsThreeTokensAndPrefersTheLongestMatch) {
    draft_index idx;
    // "1 2 3 4 5 6 7 8 9 10 11 12 -> 50" long ago; "10 11 12 -> 60" more recently.
    std::vector<token_id> a = range(1, 13);
    a.push_back(50);
    idx.add_source(a);
    idx.add_source(std::vector<token_id>{10, 11, 12, 60});
    idx.extend(range(1, 13));
    EXPECT_EQ(idx.propose(1), std::vector<token_id>{50});  // 12 tokens match there, 3 here
    draft_index shorter;
    shorter.add_source(a);
    shorter.add_source(std::vector<token_id>{10, 11, 12, 60});
    shorter.extend(std::vector<token_id>{99, 11, 12});
    EXPECT_TRUE(shorter.propose(4).empty());  // two tokens are no match
    shorter.push(13);
    EXPECT_TRUE(shorter.propose(4).empty());
}

TEST(DraftIndex, ASourceEndsItsDraft) {
    draft_index idx;
    idx.add_source(std::vector<token_id>{5, 6, 7, 8, 9});
    idx.add_source(std::vector<token_id>{20, 21});
    idx.extend(std::vector<token_id>{5, 6, 7});
    EXPECT_EQ(idx.propose(16), (std::vector<token_id>{8, 9}));  // not on into the next source
}

TEST(DraftIndex, ALoopIsDraftedRoundAndRound) {
    draft_index idx;
    idx.extend(std::vector<token_id>{1, 2, 3, 4, 5, 1, 2, 3});
    EXPECT_EQ(idx.propose(8), (std::vector<token_id>{4, 5, 1, 2, 3, 4, 5, 1}));
}

TEST(DraftIndex, PacesItselfByWhatWasTaken) {
    draft_index idx;
    idx.extend(range(1, 40));
    idx.extend(range(1, 4));                 // 1 2 3: 4..39 followed before
    EXPECT_EQ(idx.propose(64).size(), draft_index::k_first_draft);  // the first at most 16
    idx.record(16, 16);                      // taken whole: twice as long
    EXPECT_EQ(idx.propose(64).size(), 32u);
    idx.record(32, 0);                       // rejected at once: two steps without
    EXPECT_TRUE(idx.propose(16).empty());
    EXPECT_TRUE(idx.propose(16).empty());
    EXPECT_EQ(idx.propose(16).size(), 2u);   // then short ones
    idx.record(2, 2);                        // taken whole: twice as long
    EXPECT_EQ(idx.propose(16).size(), 4u);
    idx.record(4, 1);                        // taken in part: what was taken and one more
    EXPECT_EQ(idx.propose(16).size(), 2u);
    idx.record(2, 0);
    idx.record(2, 0);                        // missed twice in a row: four steps without
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(idx.propose(16).empty()) << i;
    EXPECT_FALSE(idx.propose(16).empty());
}

// A request sent again: its prompt's tail matched by 12 tokens in an earlier answer's
// source, the first draft is as long as asked; a match in the running text is paced.
TEST(DraftIndex, AnEarlierAnswerMatchedWhollyIsDraftedAtOnce) {
    auto source = range(1, 13);
    const auto answer = range(500, 600);
    source.insert(source.end(), answer.begin(), answer.end());
    draft_index again;
    again.add_source(source);
    again.extend(range(1, 13));
    EXPECT_EQ(again.propose(64), range(500, 564));
    again.record(64, 64);  // taken whole: the next up to twice as long as it
    again.extend(range(500, 564));
    EXPECT_EQ(again.propose(1000), range(564, 600));  // the rest of the answer
    draft_index shorter;  // six tokens match: paced
    shorter.add_source(source);
    shorter.extend(std::vector<token_id>{99, 7, 8, 9, 10, 11, 12});
    EXPECT_EQ(shorter.propose(64).size(), draft_index::k_first_draft);
    draft_index running;  // the running text's own: paced
    running.extend(range(1, 40));
    running.extend(range(1, 13));
    EXPECT_EQ(running.propose(64).size(), draft_index::k_first_draft);
}

TEST(AnswerMemory, ARequestSentAgainIsDraftedFromItsAnswer) {
    answer_memory m;
    const auto prompt = range(1000, 1100);
    const auto answer = range(5000, 5040);
    m.remember("ws", prompt, answer);
    auto idx = m.index_for("ws", prompt);
    EXPECT_EQ(idx->propose(8), range(5000, 5008));
    EXPECT_TRUE(m.index_for("other", prompt)->propose(8).empty());  // another workspace's answers are not its own
}

TEST(AnswerMemory, KeepsTheLastAnswersOfAWorkspace) {
    answer_memory m;
    const auto prompt = range(1000, 1100);
    for (token_id a = 0; a <= (token_id)answer_memory::k_per_workspace; ++a)
        m.remember("ws", range(2000 + 100 * a, 2050 + 100 * a), range(9000 + 100 * a, 9010 + 100 * a));
    // The first one's prompt tail no longer leads anywhere; the last one's does.
    EXPECT_TRUE(m.index_for("ws", range(2000, 2050))->propose(4).empty());
    const token_id last = (token_id)answer_memory::k_per_workspace;
    EXPECT_EQ(m.index_for("ws", range(2000 + 100 * last, 2050 + 100 * last))->propose(2),
              (std::vector<token_id>{9000 + 100 * last, 9001 + 100 * last}));
    for (size_t w = 0; w < answer_memory::k_workspaces + 1; ++w) m.remember("w" + std::to_string(w), prompt, range(1, 5));
    EXPECT_TRUE(m.index_for("ws", range(2000 + 100 * last, 2050 + 100 * last))->propose(2).empty());  // least recent went
    (void)prompt;
}

// Serve's and verify's default (-1): drafts on the CPU, none on a GPU, where verify found
// drafted answers parting from plain ones; a number asked for is kept on either.
TEST(DefaultDraftMax, OnTheCpuNotOnAGpuUnlessAskedFor) {
    EXPECT_EQ(default_draft_max(-1, "CPU", true), k_default_draft_max);
    EXPECT_EQ(default_draft_max(-1, "CPU", false), 0) << "a step's rows part alone and among others";
    EXPECT_EQ(default_draft_max(-1, "CUDA", true), 0);
    EXPECT_EQ(default_draft_max(16, "CUDA", false), 16);
    EXPECT_EQ(default_draft_max(0, "CPU", true), 0);
    EXPECT_EQ(default_draft_max(64, "CPU", false), 64);
}

}  // namespace
}  // namespace warmctx
