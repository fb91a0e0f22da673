#include "warmctx/status.h"

#include <gtest/gtest.h>

namespace warmctx {
namespace {

status fails_then_never_reaches(bool & reached) {
    WARMCTX_RETURN_IF_ERROR(invalid_argument("bad flag"));
    reached = true;
    return {};
}

TEST(Status, OkByDefault) {
    status s;
    EXPECT_TRUE(s.ok());
    EXPECT_EQ(s.to_string(), "ok");
}

TEST(Status, CarriesCodeAndMessage) {
    status s = out_of_range("prompt needs 9000 tokens");
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.code(), status_code::out_of_range);
    EXPECT_EQ(s.to_string(), "out_of_range: prompt needs 9000 tokens");
    EXPECT_EQ(s.with_context("prefill").message(), "prefill: prompt needs 9000 tokens");
}

TEST(Status, ReturnIfErrorReturnsEarly) {
    bool reached = false;
    status s = fails_then_never_reaches(reached);
    EXPECT_EQ(s.code(), status_code::invalid_argument);
    EXPECT_FALSE(reached);
}

TEST(Result, HoldsValueOrError) {
    result<int> a = 7;
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(*a, 7);
    EXPECT_TRUE(a.error().ok());
    result<int> b = not_found("x");
    EXPECT_FALSE(b.ok());
    EXPECT_EQ(b.error().code(), status_code::not_found);
}

}  // namespace
}  // namespace warmctx
