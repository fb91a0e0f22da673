// The scheduler's admission policy (runtime/admission.h), without a model or a thread.
#include <gtest/gtest.h>

#include "admission.h"

namespace warmctx {
namespace {

using action = admission_step::action;

admission_input streams(uint32_t n_parallel, std::vector<bool> busy) {
    admission_input in;
    in.n_parallel = n_parallel;
    in.stream_busy = std::move(busy);
    return in;
}

TEST(Admission, NothingQueuedAdmitsNothing) {
    EXPECT_EQ(plan_admission(streams(2, {false, false})).what, action::wait);
}

TEST(Admission, AChatMayTakeEveryFreeStream) {
    auto in = streams(2, {false, true, false});
    in.next_chat = "a";
    const auto step = plan_admission(in);
    EXPECT_EQ(step.what, action::admit_chat);
    EXPECT_EQ(step.preempt_stream, -1);
    EXPECT_EQ(step.streams, (std::vector<seq_id>{0, 2}));
}

TEST(Admission, AtMostNParallelJobsRunThoughStreamsAreFree) {
    // Four streams (two of them resident), two jobs running: the chat waits.
    auto in = streams(2, {true, false, true, false});
    in.next_chat = "a";
    EXPECT_EQ(plan_admission(in).what, action::wait);
    in.prewarm_waiting = true;
    in.next_chat.reset();
    EXPECT_EQ(plan_admission(in).what, action::wait);
}

TEST(Admission, BeyondNParallelAChatTakesTheIdleStreamHoldingItsOwnPrefix) {
    // Four streams (two of them resident), two jobs running: the chat whose workspace's
    // prefix sits in idle stream 3 starts there at once; one with none waits.
    auto in = streams(2, {true, false, true, false});
    in.next_chat = "a";
    in.next_chat_stream = 3;
    auto step = plan_admission(in);
    EXPECT_EQ(step.what, action::admit_chat);
    EXPECT_EQ(step.streams, (std::vector<seq_id>{3}));
    in.next_chat_stream = -1;
    EXPECT_EQ(plan_admission(in).what, action::wait);
    // Not a stream a job holds, and not for a pre-warm.
    in.next_chat_stream = 2;
    EXPECT_EQ(plan_admission(in).what, action::wait);
    in.next_chat.reset();
    in.next_chat_stream = 3;
    in.prewarm_waiting = true;
    EXPECT_EQ(plan_admission(in).what, action::wait);
    // Below n_parallel every free stream is offered, as before.
    in = streams(3, {true, false, false});
    in.next_chat = "a";
    in.next_chat_stream = 2;
    EXPECT_EQ(plan_admission(in).streams, (std::vector<seq_id>{1, 2}));
}

TEST(Admission, AChatGoesBeforeAPrewarm) {
    auto in = streams(1, {false});
    in.next_chat = "a";
    in.prewarm_waiting = true;
    EXPECT_EQ(plan_admission(in).what, action::admit_chat);
}

TEST(Admission, APrewarmOnlyIntoAFreeStreamAndOneAtATime) {
    auto in = streams(2, {false, false});
    in.prewarm_waiting = true;
    auto step = plan_admission(in);
    EXPECT_EQ(step.what, action::admit_prewarm);
    EXPECT_EQ(step.streams, (std::vector<seq_id>{0, 1}));
    in.stream_busy = {true, false};
    in.prewarm_stream = 0;
    in.prewarm_workspace = "p";
    EXPECT_EQ(plan_admission(in).what, action::wait);  // one runs already
}

TEST(Admission, AChatWithNoFreeStreamStopsTheRunningPrewarmFirst) {
    auto in = streams(1, {true, false});  // n_parallel reached: stream 1 is not free
    in.prewarm_stream = 0;
    in.prewarm_workspace = "p";
    in.next_chat = "a";
    const auto step = plan_admission(in);
    EXPECT_EQ(step.what, action::make_room);
    EXPECT_EQ(step.preempt_stream, 0);
    EXPECT_TRUE(step.streams.empty());
}

TEST(Admission, AChatWithNoFreeStreamAndNoPrewarmWaits) {
    auto in = streams(1, {true});
    in.next_chat = "a";
    EXPECT_EQ(plan_admission(in).what, action::wait);
}

TEST(Admission, AChatOfThePrewarmsWorkspaceStopsItAndMayTakeItsStream) {
    auto in = streams(2, {true, false});
    in.prewarm_stream = 0;
    in.prewarm_workspace = "a";
    in.next_chat = "a";
    auto step = plan_admission(in);
    EXPECT_EQ(step.what, action::admit_chat);
    EXPECT_EQ(step.preempt_stream, 0);
    EXPECT_EQ(step.streams, (std::vector<seq_id>{1, 0}));
    // With no free stream it takes the pre-warm's.
    in.n_parallel = 1;
    step = plan_admission(in);
    EXPECT_EQ(step.what, action::admit_chat);
    EXPECT_EQ(step.preempt_stream, 0);
    EXPECT_EQ(step.streams, (std::vector<seq_id>{0}));
}

TEST(Admission, AChatOfAnotherWorkspaceLeavesARunningPrewarmWhileAStreamIsFree) {
    auto in = streams(2, {true, false});
    in.prewarm_stream = 0;
    in.prewarm_workspace = "p";
    in.next_chat = "a";
    const auto step = plan_admission(in);
    EXPECT_EQ(step.what, action::admit_chat);
    EXPECT_EQ(step.preempt_stream, -1);
    EXPECT_EQ(step.streams, (std::vector<seq_id>{1}));
}

TEST(ChooseStream, AWorkspaceGoesToTheStreamItsLastTurnLeft) {
    std::vector<stream_view> v = {{false, true, "", 0}, {false, false, "b", 1}, {false, false, "a", 5}};
    const std::vector<seq_id> all = {0, 1, 2};
    EXPECT_EQ(choose_stream("a", v, all), 2);
    EXPECT_EQ(choose_stream("b", v, all), 1);
}

TEST(ChooseStream, ElseAnEmptyStreamElseTheOneLeftLongestAgo) {
    std::vector<stream_view> v = {{false, false, "x", 7}, {false, true, "", 0}, {false, false, "y", 3}};
    EXPECT_EQ(choose_stream("new", v, std::vector<seq_id>{0, 1, 2}), 1);
    EXPECT_EQ(choose_stream("new", v, std::vector<seq_id>{0, 2}), 2);
}

TEST(ChooseStream, AnEmptyStreamThatHeldTheWorkspaceIsJustEmpty) {
    // A stream remembers whose turn left it only while it holds a prefix.
    std::vector<stream_view> v = {{false, false, "x", 1}, {false, true, "a", 9}};
    EXPECT_EQ(choose_stream("a", v, std::vector<seq_id>{0, 1}), 1);
}

TEST(ChooseStream, BusyAndUnknownStreamsAreSkipped) {
    std::vector<stream_view> v = {{true, false, "a", 1}, {false, false, "b", 2}};
    EXPECT_EQ(choose_stream("a", v, std::vector<seq_id>{0, 1, 7, -1}), 1);
    EXPECT_EQ(choose_stream("a", v, std::vector<seq_id>{0}), -1);
    EXPECT_EQ(choose_stream("a", v, std::vector<seq_id>{}), -1);
}

}  // namespace
}  // namespace warmctx
