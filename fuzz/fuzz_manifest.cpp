// The manifest's JSON (manifest::from_json: the manifest section of every snapshot file)
// on arbitrary bytes, read the way the snapshot reader reads it (the strict reader, at
// most 32 levels deep).
//
// Checks, besides no crash: a refusal is invalid_argument; an accepted manifest has
// sane token ranges, survives to_json -> text -> from_json unchanged, prints as a table,
// and differs from itself in nothing (diff_manifests).
#include <cstddef>
#include <cstdint>

#include "fuzz_common.h"
#include "warmctx/assembler.h"

using namespace warmctx;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    json_read_options opts;
    opts.max_depth = 32;
    auto doc = parse_json(fuzz::as_text(data, size), opts);
    if (!doc.ok()) return 0;
    auto m = manifest::from_json(*doc);
    if (!m.ok()) {
        FUZZ_CHECK(m.error().code() == status_code::invalid_argument);
        return 0;
    }
    for (const manifest_entry & e : m->segments) FUZZ_CHECK(e.token_begin >= 0 && e.token_end >= e.token_begin);
    const std::string text = dump_json(m->to_json());
    fuzz::check_json_text(text);
    auto back = manifest::from_json(*parse_json(text, opts));
    FUZZ_CHECK_MSG(back.ok(), back.error().message() + " reading back " + text.substr(0, 300));
    FUZZ_CHECK(*back == *m);
    (void)m->to_table();
    FUZZ_CHECK(diff_manifests(*m, *back).empty());
    (void)diff_manifests(manifest{}, *m);
    (void)diff_manifests(*m, manifest{});
    return 0;
}
