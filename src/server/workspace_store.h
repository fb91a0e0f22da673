// server/workspace_store.h - the workspace store (store/segment_store.h, the store
// layer) as the workspace routes use it: its refusals as HTTP errors (413 for a segment
// too large, 429 store_full / workspace_full for a bound, 507 store_write_failed for a
// durable store that could not write), its directories checked with the API's own rule
// for a workspace id; and the merge of stored segments into a chat's.
#pragma once

#include <string>
#include <vector>

#include "api_error.h"
#include "store/segment_store.h"

namespace warmctx::server_detail {

class workspace_store : public warmctx::segment_store {
  public:
    using warmctx::segment_store::segment_store;

    // warmctx::segment_store::load, a directory whose name is not a workspace id
    // (validate_workspace_id) left alone.
    result<store_load_report> load(const kind_table & kinds);
    // warmctx::segment_store::put, its errors as the HTTP errors above.
    maybe_error put(const std::string & ws, segment seg, bool & created, bool * changed = nullptr);
};

// 507 store_write_failed: a durable store could not write (the disk is full, say).
api_error store_write_error(const status & st);

// The segments of a chat on a stored workspace: the stored segments (in their order,
// by id) except those whose id one of the request's segments also has, then the
// request's segments in their order. A request segment replaces the stored one of the
// same id for this request only; the store is not changed. Nothing is validated here
// (validate_segments runs on the result: duplicate ids within the request stay
// duplicates, and are refused there).
std::vector<segment> merge_stored_segments(std::vector<segment> stored, std::vector<segment> request);

}  // namespace warmctx::server_detail
