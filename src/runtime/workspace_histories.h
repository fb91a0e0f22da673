// runtime/workspace_histories.h - what a context_engine remembers of each workspace's
// last turn (workspace_history, explain.h): what explain compares the next turn with,
// where pins and snapshots find its prefix, and its last pre-warm. Bounded by the
// caller, least recently used first (context_engine::impl::remember). Implemented in
// context_workspaces.cpp.
//
// Thread safety: none (the engine thread's).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include "explain.h"
#include "warmctx/context_engine.h"

namespace warmctx {

struct workspace_histories {
    std::map<std::string, workspace_history> by_name;
    size_t n_tokens = 0;  // sum of their last_tokens

    const workspace_history * find(const std::string & ws) const {
        auto it = by_name.find(ws);
        return it == by_name.end() ? nullptr : &it->second;
    }
    // Records `t` as `ws`'s last turn (under `prof`, the profile now).
    void record(const std::string & ws, const pending_turn & t, const profile & prof);
    // Adds `ws` with history `h` (a branch of another's).
    void add(const std::string & ws, workspace_history h);
    void erase(const std::string & ws);
    // The workspace used longest ago other than `keep`, if any.
    std::optional<std::string> least_recent_except(const std::string & keep) const;
};

}  // namespace warmctx
