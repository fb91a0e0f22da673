// The kind table's JSON (kind_table::from_json: `warmctx --kinds FILE`, and the server's
// table) on arbitrary bytes.
//
// Checks, besides no crash: a refusal is invalid_argument; an accepted table keeps
// `user` strictly last, reads the same from text and from a parsed value, and survives
// to_json -> from_json unchanged (and so does its text through the strict reader).
#include <cstddef>
#include <cstdint>

#include "fuzz_common.h"
#include "warmctx/kind_table.h"

using namespace warmctx;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string_view text = fuzz::as_text(data, size);
    auto t = kind_table::from_json(text);
    auto doc = parse_json(text);
    FUZZ_CHECK(!t.ok() || doc.ok());  // only what parses can be a table
    if (doc.ok()) {
        auto v = kind_table::from_json_value(*doc);
        FUZZ_CHECK(v.ok() == t.ok());
        if (v.ok()) FUZZ_CHECK(*v == *t);
        else FUZZ_CHECK(v.error().message() == t.error().message());
    }
    if (!t.ok()) {
        FUZZ_CHECK(t.error().code() == status_code::invalid_argument);
        return 0;
    }
    const int user_order = t->policy(segment_kind::user).order;
    for (int i = 0; i < k_segment_kind_count; ++i) {
        const auto k = static_cast<segment_kind>(i);
        const kind_policy & p = t->policy(k);
        if (k != segment_kind::user) FUZZ_CHECK(p.order < user_order);
        FUZZ_CHECK(p.order >= 0 && p.order <= 1000000);
        FUZZ_CHECK(is_chat_role(p.role));
        FUZZ_CHECK(static_cast<int>(p.retention) < k_retention_class_count);
    }
    const std::string out = dump_json(t->to_json());
    fuzz::check_json_text(out);
    auto back = kind_table::from_json(out);
    FUZZ_CHECK_MSG(back.ok(), back.error().message());
    FUZZ_CHECK(*back == *t);
    return 0;
}
