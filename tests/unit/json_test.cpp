#include <gtest/gtest.h>

#include <malloc.h>

#include <string>
#include <vector>

#include "util/json.h"

namespace warmctx {
namespace {

TEST(Json, ParsesOneValue) {
    auto j = parse_json(R"({"a": [1, 2, {"b": "c"}]})");
    ASSERT_TRUE(j.ok()) << j.error().to_string();
    EXPECT_EQ((*j)["a"][2]["b"], "c");
}

TEST(Json, RefusesTrailingGarbageAndEmptyText) {
    json_error why = json_error::none;
    EXPECT_FALSE(parse_json(R"({"a": 1} x)", {}, &why).ok());
    EXPECT_EQ(why, json_error::syntax);
    EXPECT_FALSE(parse_json("").ok());
    EXPECT_FALSE(parse_json("   ").ok());
}

// A NUL byte ends nothing: text after it, or a NUL first, is not one JSON value.
TEST(Json, RefusesANulByteAnywhere) {
    using namespace std::string_view_literals;
    for (std::string_view t : {"{\"x\":1}\0garbage"sv, "\0{\"x\":1}"sv, "[1,\0 2]"sv, "{\"x\":1}\0"sv}) {
        auto r = parse_json(t);
        ASSERT_FALSE(r.ok()) << "accepted a text with a NUL byte, size " << t.size();
        EXPECT_NE(r.error().message().find("NUL"), std::string::npos) << r.error().message();
    }
}

// What the server charges a body before parsing it (server_options::max_body_json_bytes)
// is within a factor of two of what its parsed value takes from the allocator, for the
// shapes that cost the most memory per byte of text and for plain ones.
TEST(Json, TheParsedSizeEstimateIsWithinTwiceWhatTheValueTakes) {
    auto heap = [] {
        const struct mallinfo2 m = mallinfo2();
        return m.uordblks + m.hblkhd;
    };
    auto repeat = [](const std::string & open, const std::string & item, const std::string & close) {
        std::string s = open;
        for (int i = 0; s.size() < (1u << 20); ++i) s += (i ? "," : "") + item;
        return s + close;
    };
    std::string keys = "{";
    for (int i = 0; keys.size() < (1u << 20); ++i) keys += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":{}";
    keys += "}";
    const std::vector<std::string> texts = {
        repeat("[", "{}", "]"), repeat("[", "[]", "]"), repeat("[", "1", "]"), repeat("[", "{\"a\":{}}", "]"),
        keys, repeat("[", "\"" + std::string(1000, 'x') + "\"", "]"), repeat("{\"m\":[", "{\"role\":\"user\",\"content\":\"hello there\"}", "]}")};
    for (const auto & t : texts) {
        const size_t before = heap();
        auto j = parse_json(t);
        ASSERT_TRUE(j.ok()) << t.substr(0, 40);
        const double took = (double)(heap() - before), est = (double)json_parsed_bytes_estimate(t);
        EXPECT_GE(est, took / 2) << t.substr(0, 40) << ": took " << took << ", estimated " << est;
        EXPECT_LE(est, took * 2) << t.substr(0, 40) << ": took " << took << ", estimated " << est;
    }
}

TEST(Json, RefusesInvalidUtf8WithItsOffset) {
    json_error why = json_error::none;
    const std::string text = "{\"a\": \"x\xC0\xAFy\"}";  // an overlong '/'
    auto j = parse_json(text, {}, &why);
    ASSERT_FALSE(j.ok());
    EXPECT_EQ(j.error().code(), status_code::invalid_argument);
    EXPECT_EQ(why, json_error::invalid_utf8);
    EXPECT_NE(j.error().message().find("byte offset 8"), std::string::npos) << j.error().message();
    // a surrogate encoded in UTF-8, and a truncated sequence
    EXPECT_FALSE(parse_json("\"\xED\xA0\x80\"").ok());
    EXPECT_FALSE(parse_json("\"\xE2\x82\"").ok());
    EXPECT_TRUE(parse_json("\"\xE2\x82\xAC\"").ok());  // the euro sign
}

TEST(Json, RefusesDeepNestingBeforeParsing) {
    json_error why = json_error::none;
    const std::string deep(1'000'000, '[');
    auto j = parse_json(deep, {}, &why);
    ASSERT_FALSE(j.ok());
    EXPECT_EQ(why, json_error::too_deep);
    // the limit is the caller's
    json_read_options o;
    o.max_depth = 3;
    EXPECT_TRUE(parse_json("[[[1]]]", o).ok());
    EXPECT_FALSE(parse_json("[[[[1]]]]", o).ok());
    // brackets inside strings do not count
    EXPECT_TRUE(parse_json("\"[[[[[[\"", o).ok());
}

// parse_json reads through simdjson first; whatever that fast reader returns must be what
// nlohmann's parser builds from the same text - types, numbers, repeated keys - and what
// it does not accept (beyond 64-bit integers, lone surrogates, depth) it leaves to the
// slow reader rather than answering differently.
TEST(Json, FastReaderBuildsWhatNlohmannBuilds) {
    const std::vector<std::string> same = {
        R"({"a": [1, -2, 3.5, -0.0, 1e2, true, false, null, "x\u00e9\ud83d\ude00\n"], "b": {}})",
        R"({"a": 1, "a": 2})",  // the last value of a repeated key
        "18446744073709551615", "-9223372036854775808", "1e-400", "0", "\"\\u0000\"",
        R"([[], {}, [[{"k": [""]}]]])", "  [1]  ", "\"\xE2\x82\xAC\""};
    for (const auto & t : same) {
        auto fast = parse_json_fast(t);
        ASSERT_TRUE(fast.has_value()) << t;
        const auto slow = nlohmann::json::parse(t);
        EXPECT_EQ(*fast, slow) << t;
        EXPECT_EQ(fast->dump(), slow.dump()) << t;
        EXPECT_EQ(fast->type(), slow.type()) << t;
    }
    EXPECT_TRUE(parse_json_fast("1")->is_number_unsigned());  // as nlohmann: non-negative is unsigned
    EXPECT_TRUE(parse_json_fast("-1")->is_number_integer());
    EXPECT_EQ(*parse_json_fast("-0"), 0);  // nlohmann's is signed, this one unsigned: the same zero
    // Left to nlohmann's parser: integers past 64 bits (it reads them as floats) ...
    EXPECT_FALSE(parse_json_fast("18446744073709551616").has_value());
    auto big = parse_json("18446744073709551616");
    ASSERT_TRUE(big.ok());
    EXPECT_TRUE(big->is_number_float());
    // ... and everything refused, which parse_json refuses with nlohmann's reason.
    for (const std::string t : {"\"\\ud800\"", "\"\\udc00\"", "[1,]", "01", "1E400", "{\"a\" 1}", "\"\xC0\xAF\""}) {
        EXPECT_FALSE(parse_json_fast(t).has_value()) << t;
        EXPECT_FALSE(parse_json(t).ok()) << t;
    }
    // A text over k_fast_json_max_bytes (a dense one would hold simdjson's buffers and the
    // value at once) is read by nlohmann's parser alone.
    std::string large = "[";
    while (large.size() <= k_fast_json_max_bytes) large += "1,";
    large += "1]";
    EXPECT_FALSE(parse_json_fast(large).has_value());
    auto read = parse_json(large);
    ASSERT_TRUE(read.ok());
    EXPECT_EQ(read->size(), (large.size() - 1) / 2);
    // The depth limit holds on the fast path too.
    EXPECT_TRUE(parse_json_fast("[[[1]]]", 3).has_value());
    EXPECT_FALSE(parse_json_fast("[[[[1]]]]", 3).has_value());
    EXPECT_FALSE(parse_json_fast(R"({"a": {"b": {"c": {}}}})", 3).has_value());
}

TEST(Json, DumpNeverThrowsOnInvalidUtf8) {
    nlohmann::json j = {{"piece", std::string("a\xFF" "b")}};
    EXPECT_EQ(dump_json(j), "{\"piece\":\"a\xEF\xBF\xBD" "b\"}");
}

TEST(Json, TypedReadsNameWhereAndWhat) {
    const auto j = *parse_json(R"({"s": "x", "i": 7, "big": 18446744073709551615, "b": true, "f": 1.5})");
    EXPECT_EQ(*json_as_string(j["s"], "t"), "x");
    EXPECT_EQ(*json_as_int(j["i"], "t", 0, 10), 7);
    EXPECT_TRUE(*json_as_bool(j["b"], "t"));
    EXPECT_EQ(*json_as_number(j["f"], "t"), 1.5);
    EXPECT_EQ(json_as_string(j["i"], "doc: field 'i'").error().message(), "doc: field 'i': must be a string, not an integer");
    EXPECT_EQ(json_as_int(j["i"], "w", 0, 5).error().message(), "w: 7 is outside [0, 5]");
    EXPECT_FALSE(json_as_int(j["big"], "w", 0, 5).ok());
    EXPECT_FALSE(json_as_int(j["f"], "w", 0, 5).ok());
    EXPECT_EQ(json_as_bool(j["s"], "w").error().message(), "w: must be true or false, not a string");
    EXPECT_EQ(json_field(j, "nope", "doc").error().message(), "doc: missing field 'nope'");
    EXPECT_EQ(*json_field(j, "s", "doc"), &j["s"]);
}

}  // namespace
}  // namespace warmctx
