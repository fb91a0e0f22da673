// server/turn_history.h - the last turns the server answered, newest last: what reuse did
// for each and where its time went (GET /v1/status and the page at /ui read them).
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "completion_request.h"

namespace warmctx::server_detail {

struct turn_record {
    int64_t unix_ms = 0;  // when it ended
    answer_report report;
    completion_usage usage;
};

class turn_history {
  public:
    static constexpr size_t k_kept = 120;

    void note(turn_record r) {
        std::lock_guard<std::mutex> lk(mu_);
        if (turns_.size() == k_kept) turns_.pop_front();
        turns_.push_back(std::move(r));
    }
    std::vector<turn_record> last() const {
        std::lock_guard<std::mutex> lk(mu_);
        return {turns_.begin(), turns_.end()};
    }

  private:
    mutable std::mutex mu_;
    std::deque<turn_record> turns_;  // guarded by mu_
};

}  // namespace warmctx::server_detail
