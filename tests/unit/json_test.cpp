#include <gtest/gtest.h>

#include <string>

#include "warmctx/json.h"

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
