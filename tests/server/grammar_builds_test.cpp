// The threads answer grammars are built on: at most `slots` at once, a build abandoned
// before it starts is skipped, stop() waits for those running and skips the others.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "server/grammar_builds.h"

namespace warmctx::server_detail {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<std::atomic<bool>> flag() { return std::make_shared<std::atomic<bool>>(false); }

TEST(GrammarBuilds, NoMoreBuildsRunAtOnceThanSlots) {
    grammar_builds b(2);
    std::atomic<int> now{0}, most{0}, done{0};
    for (int i = 0; i < 6; ++i)
        ASSERT_TRUE(b.start(
            [&](bool run) {
                EXPECT_TRUE(run);
                const int n = ++now;
                for (int m = most.load(); n > m && !most.compare_exchange_weak(m, n);) {}
                std::this_thread::sleep_for(30ms);
                --now;
                ++done;
            },
            flag()));
    for (auto until = std::chrono::steady_clock::now() + 10s; done < 6 && std::chrono::steady_clock::now() < until;)
        std::this_thread::sleep_for(5ms);
    EXPECT_EQ(done.load(), 6);
    EXPECT_EQ(most.load(), 2);
}

TEST(GrammarBuilds, ABuildAbandonedWhileItWaitsForASlotIsSkippedAtOnce) {
    grammar_builds b(1);
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    std::promise<bool> first_started, second_ran;
    ASSERT_TRUE(b.start(
        [&](bool) {
            first_started.set_value(true);
            released.wait();
        },
        flag()));
    first_started.get_future().wait();
    auto second = flag();
    ASSERT_TRUE(b.start([&](bool run) { second_ran.set_value(run); }, second));
    auto ran = second_ran.get_future();
    EXPECT_EQ(ran.wait_for(100ms), std::future_status::timeout);  // waits for the slot
    b.abandon(*second);
    ASSERT_EQ(ran.wait_for(5s), std::future_status::ready);  // skipped while the first still runs
    EXPECT_FALSE(ran.get());
    EXPECT_EQ(b.running(), 1u);
    release.set_value();
}

TEST(GrammarBuilds, StopWaitsForTheRunningBuildAndSkipsTheWaitingOnes) {
    auto b = std::make_unique<grammar_builds>(1);
    std::atomic<bool> first_done{false};
    std::atomic<int> skipped{0};
    std::promise<void> started;
    ASSERT_TRUE(b->start(
        [&](bool) {
            started.set_value();
            std::this_thread::sleep_for(200ms);
            first_done = true;
        },
        flag()));
    started.get_future().wait();
    for (int i = 0; i < 3; ++i)
        ASSERT_TRUE(b->start([&](bool run) { skipped += run ? 0 : 1; }, flag()));
    b->stop();
    EXPECT_TRUE(first_done.load());  // stop() returned after it
    EXPECT_EQ(skipped.load(), 3);
    EXPECT_FALSE(b->start([](bool) { ADD_FAILURE() << "ran after stop"; }, flag()));
    b.reset();
}

}  // namespace
}  // namespace warmctx::server_detail
