#include "util/text_stream.h"

#include <gtest/gtest.h>

namespace warmctx {
namespace {

TEST(TextStream, PassesTextThroughWithoutStops) {
    text_stream t;
    EXPECT_EQ(t.push("hel"), "hel");
    EXPECT_EQ(t.push("lo"), "lo");
    EXPECT_EQ(t.finish(), "");
    EXPECT_EQ(t.text(), "hello");
}

TEST(TextStream, HoldsBackAPossibleStopPrefixAndCutsAtTheStop) {
    text_stream t({"END"});
    EXPECT_EQ(t.push("abc E"), "abc ");   // "E" may start "END"
    EXPECT_EQ(t.push("N"), "");           // "EN" still may
    EXPECT_EQ(t.push("D and more"), "");  // completed: nothing after the stop
    EXPECT_TRUE(t.stopped());
    EXPECT_EQ(t.text(), "abc ");
    EXPECT_EQ(t.push("x"), "");
}

TEST(TextStream, ReleasesAHeldPrefixThatDidNotBecomeAStop) {
    text_stream t({"END"});
    EXPECT_EQ(t.push("E"), "");
    EXPECT_EQ(t.push("X"), "EX");
    EXPECT_FALSE(t.stopped());
}

TEST(TextStream, StopInsideOnePiece) {
    text_stream t({"\n\n", "STOP"});
    EXPECT_EQ(t.push("one STOP two"), "one ");
    EXPECT_TRUE(t.stopped());
}

TEST(TextStream, NeverSplitsAUtf8Character) {
    text_stream t;
    const std::string euro = "\xE2\x82\xAC";  // U+20AC, 3 bytes
    EXPECT_EQ(t.push("a" + euro.substr(0, 2)), "a");
    EXPECT_EQ(t.push(euro.substr(2)), euro);
    EXPECT_EQ(utf8_complete_prefix("x\xF0\x9F"), 1u);
    EXPECT_EQ(utf8_complete_prefix("x\xF0\x9F\x98\x80"), 5u);
}

TEST(TextStream, FinishReturnsHeldBackText) {
    text_stream t({"END"});
    EXPECT_EQ(t.push("xE"), "x");
    EXPECT_EQ(t.finish(), "E");
}

}  // namespace
}  // namespace warmctx
