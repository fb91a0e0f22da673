#include <gtest/gtest.h>

#include <vector>

#include "warmctx/chunking.h"

namespace warmctx {
namespace {

using chunks = std::vector<std::pair<pos_t, pos_t>>;

TEST(PlanChunks, SplitsEveryChunkFromZero) {
    EXPECT_EQ(plan_chunks(0, 10, {}, 4), (chunks{{0, 4}, {4, 8}, {8, 10}}));
}

TEST(PlanChunks, RestartsAtEveryBoundary) {
    std::vector<pos_t> b = {6};
    EXPECT_EQ(plan_chunks(0, 12, b, 4), (chunks{{0, 4}, {4, 6}, {6, 10}, {10, 12}}));
}

TEST(PlanChunks, WarmTailUsesTheColdChunks) {
    // The rule that makes warm == cold: chunks after a boundary do not depend on
    // whether the prefill started at 0 or at the boundary.
    std::vector<pos_t> b = {5, 11, 30};
    const auto cold = plan_chunks(0, 40, b, 4);
    for (pos_t start : b) {
        auto warm = plan_chunks(start, 40 - start, b, 4);
        chunks cold_tail;
        for (auto c : cold)
            if (c.first >= start) cold_tail.push_back(c);
        EXPECT_EQ(warm, cold_tail) << "start " << start;
    }
}

TEST(PlanChunks, NoChunkCrossesABoundary) {
    std::vector<pos_t> b = {3, 7, 8, 20};
    for (auto [s, e] : plan_chunks(0, 25, b, 512))
        for (pos_t x : b) EXPECT_FALSE(s < x && x < e) << s << ".." << e << " crosses " << x;
}

TEST(PlanChunks, UnsortedDuplicateAndOutOfRangeBoundaries) {
    std::vector<pos_t> b = {8, 4, 4, 100};
    EXPECT_EQ(plan_chunks(0, 10, b, 512), (chunks{{0, 4}, {4, 8}, {8, 10}}));
}

TEST(PlanChunks, EmptyInput) { EXPECT_TRUE(plan_chunks(0, 0, {}, 4).empty()); }

}  // namespace
}  // namespace warmctx

namespace warmctx {
namespace {

TEST(IsChunkStart, BoundariesAndMultiplesOfTheChunkAfterThem) {
    std::vector<pos_t> b = {6, 20};
    EXPECT_TRUE(is_chunk_start(0, b, 4));
    EXPECT_TRUE(is_chunk_start(4, b, 4));
    EXPECT_TRUE(is_chunk_start(6, b, 4));
    EXPECT_TRUE(is_chunk_start(10, b, 4));
    EXPECT_FALSE(is_chunk_start(8, b, 4));   // 8 is a multiple of 4 but not from the span start 6
    EXPECT_FALSE(is_chunk_start(5, b, 4));
    EXPECT_TRUE(is_chunk_start(20, b, 4));
    EXPECT_TRUE(is_chunk_start(24, b, 4));
    EXPECT_FALSE(is_chunk_start(-1, b, 4));
    // every chunk plan_chunks makes starts at a chunk start
    for (auto [s, e] : plan_chunks(0, 40, b, 4)) EXPECT_TRUE(is_chunk_start(s, b, 4)) << s;
}

}  // namespace
}  // namespace warmctx
