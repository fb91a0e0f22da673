// The profile's JSON (profile::from_json: the profile section of every snapshot file) on
// arbitrary bytes, read the way the snapshot reader reads it (the strict reader, at
// most 32 levels deep).
//
// Checks, besides no crash and no undefined conversion: a refusal is invalid_argument;
// an accepted profile survives to_json -> text -> from_json with the same fields and
// the same fingerprint, and drifts from nothing but another profile.
#include <cstddef>
#include <cstdint>

#include "fuzz_common.h"
#include "warmctx/profile.h"

using namespace warmctx;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    json_read_options opts;
    opts.max_depth = 32;
    auto doc = parse_json(fuzz::as_text(data, size), opts);
    if (!doc.ok()) return 0;
    auto p = profile::from_json(*doc);
    if (!p.ok()) {
        FUZZ_CHECK(p.error().code() == status_code::invalid_argument);
        return 0;
    }
    const std::string text = dump_json(p->to_json());
    fuzz::check_json_text(text);
    auto back = profile::from_json(*parse_json(text, opts));
    FUZZ_CHECK_MSG(back.ok(), back.error().message() + " reading back " + text);
    FUZZ_CHECK(*back == *p);
    FUZZ_CHECK(back->fingerprint() == p->fingerprint());
    FUZZ_CHECK(back->drifted_fields(*p).empty());
    FUZZ_CHECK(p->describe_drift(*back).empty());

    static const profile other = fuzz::fixture_profile();
    const auto drifted = p->drifted_fields(other);
    FUZZ_CHECK(drifted.size() == p->describe_drift(other).size());
    FUZZ_CHECK(drifted.empty() == (p->fingerprint() == other.fingerprint()));
    return 0;
}
