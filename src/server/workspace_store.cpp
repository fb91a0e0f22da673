#include "workspace_store.h"

#include <set>

#include "segments_json.h"

namespace warmctx::server_detail {

result<store_load_report> workspace_store::load(const kind_table & kinds) {
    return warmctx::segment_store::load(kinds, [](std::string_view id) { return !validate_workspace_id(id); });
}

maybe_error workspace_store::put(const std::string & ws, segment seg, bool & created, bool * changed) {
    store_refusal refusal = store_refusal::none;
    status st = warmctx::segment_store::put(ws, std::move(seg), created, changed, &refusal);
    switch (refusal) {
        case store_refusal::none: break;
        case store_refusal::segment_too_large: return payload_too_large(st.message());
        case store_refusal::store_full: return too_many_requests("store_full", st.message(), 0);
        case store_refusal::workspace_full: return too_many_requests("workspace_full", st.message(), 0);
        case store_refusal::write_failed: return store_write_error(st);
    }
    if (!st.ok()) return store_write_error(st);
    return std::nullopt;
}

api_error store_write_error(const status & st) {
    return api_error{507,
                     "server_error",
                     "store_write_failed",
                     "the workspace store could not be written, nothing changed: " + without_paths(st.message()),
                     "",
                     0};
}

std::vector<segment> merge_stored_segments(std::vector<segment> stored, std::vector<segment> request) {
    std::set<std::string> ids;
    for (const segment & s : request) ids.insert(s.id);
    std::vector<segment> merged;
    for (segment & s : stored)
        if (!ids.count(s.id)) merged.push_back(std::move(s));
    for (segment & s : request) merged.push_back(std::move(s));
    return merged;
}

}  // namespace warmctx::server_detail
