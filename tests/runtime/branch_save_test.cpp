// The rule that gives up a trimmed branch rather than copy its whole stream into the pool
// on a turn's way (kv_pool.h, save_costs_more_than_prefill; stream_moves::save_branch).
#include <gtest/gtest.h>

#include "kv_pool.h"

namespace warmctx {
namespace {

kv_pool_counters saved(uint64_t bytes, double ms) {
    kv_pool_counters c;
    c.n_saves = 1;
    c.saved_bytes = bytes;
    c.save_ms = ms;
    return c;
}

// On an H100, a 19k-token prefix of a 4B shape (1.5 GB) took ~2 s into the pool; its
// ~1,000-token tail prefills again in ~100 ms: not saved.
TEST(BranchSave, AWholePrefixOutOfADeviceCostsMoreThanItsTailAgain) {
    EXPECT_TRUE(save_costs_more_than_prefill(1.5e9, saved(1500000000, 2000), 1000, 10));
}

// On 2 cores, a tiny model's 5k-token stream (5 MB) saves in ~2 ms; 300 tokens take ~20 ms
// to prefill again, and a 7B's 1.8 GB in ~0.5 s against ~10 s for 1,000 tokens: saved.
TEST(BranchSave, AStreamInHostMemoryIsCheaperThanItsTailAgain) {
    EXPECT_FALSE(save_costs_more_than_prefill(5e6, saved(5000000, 2), 300, 15));
    EXPECT_FALSE(save_costs_more_than_prefill(1.8e9, saved(1800000000, 500), 1000, 0.1));
}

// The rate of the pool's saves scales to the stream at hand.
TEST(BranchSave, TheMeasuredRateScalesToTheStream) {
    const auto c = saved(100000000, 100);                          // 1 ms a MB
    EXPECT_FALSE(save_costs_more_than_prefill(50e6, c, 600, 10));  // 50 ms against 60
    EXPECT_TRUE(save_costs_more_than_prefill(70e6, c, 600, 10));   // 70 ms against 60
}

// Before the pool has saved anything, or before a prefill was timed, the branch is saved.
TEST(BranchSave, WithoutARateTheBranchIsSaved) {
    EXPECT_FALSE(save_costs_more_than_prefill(1.5e9, kv_pool_counters{}, 1000, 10));
    EXPECT_FALSE(save_costs_more_than_prefill(1.5e9, saved(1500000000, 2000), 1000, 0));
}

}  // namespace
}  // namespace warmctx
