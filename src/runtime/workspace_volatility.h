// runtime/workspace_volatility.h - what a context_engine learned per workspace about how
// its stable segments change (warmctx/volatility.h): their learned order and finer
// blocks, read when a request is assembled and updated when a turn finishes; and the
// store that keeps them across restarts. Implemented in context_workspaces.cpp.
//
// Thread safety: assemble reads the states on HTTP threads while finish_turn writes them
// on the engine thread: `states`, `looked_up` and `dirty` are guarded by `mu`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "warmctx/assembler.h"
#include "warmctx/volatility.h"
#include "store/volatility_store.h"

namespace warmctx {

struct workspace_volatility {
    static constexpr uint64_t k_save_every = 16;      // turns: a state is saved at least this often
    static constexpr size_t k_max_looked_up = 65536;  // names in looked_up, at most

    mutable std::mutex mu;
    mutable std::map<std::string, volatility_state> states;
    // Kept beside the disk tier (<cache_dir>/volatility/, store/volatility_store.h), so
    // that a restart keeps each workspace's learned order and finer blocks: read when a
    // workspace is first seen (or again after it was forgotten), written after an answer is
    // out when its order, finer blocks or fusion habit changed (observe_turn), every
    // k_save_every turns, and at close, on the store's own thread. No cache
    // directory: memory only.
    std::unique_ptr<volatility_store> store;
    mutable std::set<std::string> looked_up;  // workspaces whose file was read (or found absent)
    std::set<std::string> dirty;              // workspaces whose state the store has not been given

    // REQUIRES `lock` holds mu. The workspace's state, read from its file the
    // first time (with the lock let go meanwhile: a slow disk holds no other thread that
    // waits for mu, the engine thread's finish_turn among them). The pointer is
    // good while the lock is held. looked_up is cleared past k_max_looked_up names (a
    // client can send any number of workspace names): a name seen again is read again.
    volatility_state * state_of(const std::string & ws, std::unique_lock<std::mutex> & lock) const;
    // A turn of `ws` with `prompt` finished: its state learns from it, and is marked for
    // the store when that changed what it decides, or every k_save_every turns.
    void observe(const std::string & ws, const assembled_prompt & prompt);
    // Hands the dirty states to the store's writer (takes mu to copy them).
    void save();
    // Lets go of what memory holds of `ws` (saved first: its file keeps it).
    void forget(const std::string & ws);
    // `to` starts from what `from` learned (a branch).
    void copy(const std::string & from, const std::string & to);
};

}  // namespace warmctx
