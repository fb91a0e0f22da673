// server/workspace_store.h - segments stored server-side, per workspace, so a client
// sends only the volatile tail each turn (POST /v1/workspaces/{id}/chat/completions).
//
// Bounded: a number of workspaces, segments per workspace, bytes per segment and bytes
// in all (a segment's bytes = id + content + path + role). A PUT that would cross a
// bound is refused with nothing changed: 413 when the one segment is too large, 429
// when the store (or the workspace) is full. Memory only: a restart forgets the store
// (the KV cache is not persisted by this layer either).
//
// Thread safety: every member is safe to call from any thread; `mu_` guards the map.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api_error.h"
#include "warmctx/segments.h"

namespace warmctx::server_detail {

struct store_limits {
    size_t max_workspaces = 1024;
    size_t max_segments_per_workspace = 4096;
    size_t max_segment_bytes = 4u << 20;
    size_t max_store_bytes = 256u << 20;
};

class workspace_store {
  public:
    explicit workspace_store(store_limits limits) : limits_(limits) {}

    // Creates or replaces `seg` in `ws` (REQUIRES: ids already validated). `created`
    // says which. Errors: 413 (segment too large), 429 (a bound is reached).
    maybe_error put(const std::string & ws, segment seg, bool & created);
    std::optional<segment> get(const std::string & ws, const std::string & id) const;
    // The workspace's segments ordered by id; nullopt when it has none stored.
    std::optional<std::vector<segment>> list(const std::string & ws) const;
    // The stored workspace ids, sorted.
    std::vector<std::string> workspaces() const;
    bool erase(const std::string & ws, const std::string & id);
    // Removes the workspace; returns how many segments it held.
    size_t drop(const std::string & ws);

    size_t n_bytes() const;
    size_t n_segments() const;

  private:
    static size_t bytes_of(const segment & s) { return s.id.size() + s.content.size() + s.path.size() + s.role.size(); }

    store_limits limits_;
    mutable std::mutex mu_;
    std::map<std::string, std::map<std::string, segment>> ws_;  // guarded by mu_
    size_t n_bytes_ = 0;                                         // guarded by mu_
    size_t n_segments_ = 0;                                      // guarded by mu_
};

// The segments of a chat on a stored workspace: the stored segments (in their order,
// by id) except those whose id one of the request's segments also has, then the
// request's segments in their order. A request segment replaces the stored one of the
// same id for this request only; the store is not changed. Nothing is validated here
// (validate_segments runs on the result: duplicate ids within the request stay
// duplicates, and are refused there).
std::vector<segment> merge_stored_segments(std::vector<segment> stored, std::vector<segment> request);

}  // namespace warmctx::server_detail
