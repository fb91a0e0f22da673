// bench soak's verdicts without a server: the RSS rule and the status classes.
#include "soak_verdict.h"

#include <gtest/gtest.h>

#include <vector>

namespace warmctx::cli {
namespace {

std::vector<rss_sample> series(std::vector<double> mib) {
    std::vector<rss_sample> out;
    for (size_t i = 0; i < mib.size(); ++i) out.push_back({10.0 * (double)i, (uint64_t)(mib[i] * (1 << 20)), 0});
    return out;
}

TEST(soak_verdict, TooFewSamplesAreNotJudged) {
    rss_verdict v = judge_rss(series({100, 200, 400, 800, 1600}));
    EXPECT_FALSE(v.evaluated);
    EXPECT_TRUE(v.flat);
}

TEST(soak_verdict, WarmUpGrowthIsNotJudged) {
    // Doubles during the first third, then stays.
    rss_verdict v = judge_rss(series({100, 150, 200, 200, 201, 200, 202, 201, 200}));
    ASSERT_TRUE(v.evaluated);
    EXPECT_EQ(v.n_warmup, 3u);
    EXPECT_EQ(v.n_middle, 3u);
    EXPECT_EQ(v.n_last, 3u);
    EXPECT_TRUE(v.flat);
    EXPECT_NEAR(v.change, 0.0, 0.01);
}

TEST(soak_verdict, SteadyGrowthAfterWarmUpIsNotFlat) {
    // +4% a sample: the last third's median is ~12% above the middle third's.
    std::vector<double> mib;
    double x = 200;
    for (int i = 0; i < 12; ++i, x *= 1.04) mib.push_back(x);
    rss_verdict v = judge_rss(series(mib));
    ASSERT_TRUE(v.evaluated);
    EXPECT_FALSE(v.flat);
    EXPECT_GT(v.change, 0.10);
    EXPECT_GT(v.slope_bytes_per_min, 0);
}

TEST(soak_verdict, TheLimitIsTenPercentUpAndAFallIsFine) {
    EXPECT_TRUE(judge_rss(series({1, 1, 100, 100, 109.9, 109.9})).flat);  // +9.9%
    EXPECT_FALSE(judge_rss(series({1, 1, 100, 100, 111, 111})).flat);   // +11%
    EXPECT_TRUE(judge_rss(series({1, 1, 300, 300, 100, 100})).flat);    // memory given back
}

TEST(soak_verdict, LastThirdTakesTheRemainder) {
    rss_verdict v = judge_rss(series({1, 1, 2, 2, 3, 3, 3, 3}));
    EXPECT_EQ(v.n_warmup, 2u);
    EXPECT_EQ(v.n_middle, 2u);
    EXPECT_EQ(v.n_last, 4u);
}

TEST(soak_verdict, ReadsThisProcesssRssAndHeap) {
    EXPECT_GT(read_rss_bytes(), 0u);
#if defined(__GLIBC__)
    EXPECT_GT(read_heap_bytes(), 0u);
#endif
}

TEST(soak_verdict, StatusClasses) {
    EXPECT_EQ(status_class(200), "2xx");
    EXPECT_EQ(status_class(201), "2xx");
    EXPECT_EQ(status_class(404), "4xx");
    EXPECT_EQ(status_class(429), "4xx");
    EXPECT_EQ(status_class(500), "5xx");
    EXPECT_EQ(status_class(503), "5xx");
    EXPECT_EQ(status_class(0), "other");
    EXPECT_EQ(status_class(100), "other");
    EXPECT_EQ(status_class(600), "other");
}

}  // namespace
}  // namespace warmctx::cli
