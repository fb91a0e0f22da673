// The strict JSON reader (src/util/json.h) on arbitrary bytes: every JSON text
// that reaches warmctx - request bodies, kind tables, snapshot sections - goes through it.
//
// Checks: parse_json never throws or crashes; what it accepts is valid UTF-8, nests at
// most max_depth levels, and survives a dump and a second read unchanged; what it refuses
// carries the reason its pre-checks give (invalid UTF-8 first, then depth). Its fast reader
// (simdjson) accepts only what nlohmann's parser accepts, and builds the same value.
#include <cstddef>
#include <cstdint>

#include "fuzz_common.h"

using namespace warmctx;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string_view text = fuzz::as_text(data, size);
    const size_t bad_utf8 = find_invalid_utf8(text);
    const size_t depth = json_nesting_depth(text);
    if (bad_utf8 != k_utf8_valid) FUZZ_CHECK(bad_utf8 < size);

    json_error why = json_error::syntax;
    auto j = parse_json(text, json_read_options{}, &why);
    if (!j.ok()) {
        FUZZ_CHECK(j.error().code() == status_code::invalid_argument);
        if (bad_utf8 != k_utf8_valid) FUZZ_CHECK(why == json_error::invalid_utf8);
        else if (depth > k_max_json_depth) FUZZ_CHECK(why == json_error::too_deep);
        else FUZZ_CHECK(why == json_error::syntax);
    } else {
        FUZZ_CHECK(why == json_error::none);
        FUZZ_CHECK(bad_utf8 == k_utf8_valid);
        FUZZ_CHECK(depth <= k_max_json_depth);
        // What was read is written back as valid UTF-8 JSON that reads back the same.
        for (int indent : {-1, 2}) {
            const std::string out = dump_json(*j, indent);
            FUZZ_CHECK(find_invalid_utf8(out) == k_utf8_valid);
            FUZZ_CHECK(json_nesting_depth(out) <= depth);  // less: a repeated key keeps its last value
            auto again = parse_json(out);
            FUZZ_CHECK_MSG(again.ok(), again.error().message());
            FUZZ_CHECK(*again == *j);
        }
    }

    if (auto fast = parse_json_fast(text)) {
        FUZZ_CHECK(j.ok());
        FUZZ_CHECK(*fast == *j);
        nlohmann::json slow;
        try {
            slow = nlohmann::json::parse(text);  // at most k_max_json_depth deep: the fast reader said so
        } catch (const std::exception & e) {
            FUZZ_CHECK_MSG(false, std::string("accepted by simdjson, refused by nlohmann: ") + e.what());
        }
        FUZZ_CHECK(*fast == slow);
        FUZZ_CHECK(dump_json(*fast) == dump_json(slow));
    }

    // A lower limit refuses exactly the valid-UTF-8 texts deeper than it, before parsing.
    for (size_t max_depth : {size_t{32}, size_t{1}}) {
        if (bad_utf8 != k_utf8_valid || depth <= max_depth) continue;
        json_read_options opts;
        opts.max_depth = max_depth;
        json_error w = json_error::none;
        FUZZ_CHECK(!parse_json(text, opts, &w).ok());
        FUZZ_CHECK(w == json_error::too_deep);
    }

    // Without the UTF-8 check nothing may throw either, and dump_json must still produce
    // valid UTF-8 from whatever bytes the strings hold.
    if (bad_utf8 != k_utf8_valid) {
        json_read_options lax;
        lax.check_utf8 = false;
        auto l = parse_json(text, lax);
        if (l.ok()) FUZZ_CHECK(find_invalid_utf8(dump_json(*l)) == k_utf8_valid);
    }
    return 0;
}
