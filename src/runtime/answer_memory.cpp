#include "answer_memory.h"

#include <algorithm>

namespace warmctx {

void answer_memory::remember(const std::string & workspace, std::span<const token_id> prompt,
                             std::span<const token_id> answer) {
    if (answer.empty()) return;
    if (!by_ws_.contains(workspace) && by_ws_.size() >= k_workspaces) {
        auto oldest = std::min_element(by_ws_.begin(), by_ws_.end(), [](const auto & a, const auto & b) {
            return a.second.t_last < b.second.t_last;
        });
        by_ws_.erase(oldest);
    }
    entry & e = by_ws_[workspace];
    e.t_last = ++clock_;
    const auto tail = prompt.last(std::min(prompt.size(), k_prompt_tail));
    std::vector<token_id> text(tail.begin(), tail.end());
    text.insert(text.end(), answer.begin(), answer.begin() + (long)std::min(answer.size(), k_max_tokens));
    e.answers.push_back(std::move(text));
    while (e.answers.size() > k_per_workspace) e.answers.pop_front();
}

std::unique_ptr<draft_index> answer_memory::index_for(const std::string & workspace,
                                                      std::span<const token_id> prompt) const {
    auto idx = std::make_unique<draft_index>();
    if (auto it = by_ws_.find(workspace); it != by_ws_.end())
        for (const auto & a : it->second.answers) idx->add_source(a);
    idx->extend(prompt);
    return idx;
}

}  // namespace warmctx
