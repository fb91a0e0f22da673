// runtime/answer_memory.h - each workspace's last answers, for drafts (warmctx/drafts.h).
//
// A request sent again (an agent retrying a turn, a client reconnecting) is answered with
// the text of the answer before: kept with the end of its prompt, that answer becomes a
// draft source whose n-grams lead from the prompt's tail straight into it. Bounded: the
// last k_per_workspace answers of at most k_workspaces workspaces (the least recently
// answered goes), each cut to k_max_tokens.
//
// Thread safety: none (the engine thread's).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "warmctx/drafts.h"

namespace warmctx {

class answer_memory {
  public:
    static constexpr size_t k_per_workspace = 4, k_workspaces = 64, k_prompt_tail = 16, k_max_tokens = 4096;

    void remember(const std::string & workspace, std::span<const token_id> prompt, std::span<const token_id> answer);
    // A draft index over `workspace`'s answers with `prompt` as its running text.
    std::unique_ptr<draft_index> index_for(const std::string & workspace, std::span<const token_id> prompt) const;

  private:
    struct entry {
        std::deque<std::vector<token_id>> answers;  // oldest first
        uint64_t t_last = 0;
    };
    std::unordered_map<std::string, entry> by_ws_;
    uint64_t clock_ = 0;
};

}  // namespace warmctx
