#include "prewarmer.h"

#include <algorithm>

#include "route_context.h"

namespace warmctx::server_detail {

namespace {
constexpr auto k_flush_every = std::chrono::seconds(30);
}  // namespace

void prewarmer::start() {
    std::lock_guard<std::mutex> lk(mu_);
    if (started_ || stopping_) return;
    started_ = true;
    thread_ = std::thread([this] { loop(); });
}

void prewarmer::stop() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void prewarmer::mark(const std::string & ws, bool at_once) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (at_once) {
            due_.erase(ws);
            if (std::find(now_.begin(), now_.end(), ws) == now_.end()) now_.push_back(ws);
        } else {
            due_[ws] = clock::now() + delay_;  // a later change moves it later
        }
    }
    cv_.notify_all();
}

void prewarmer::mark_all(const std::vector<std::string> & in_order) {
    for (const std::string & ws : in_order) mark(ws, true);
}

prewarmer::counters prewarmer::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return ctr_;
}

void prewarmer::run_one(const std::string & ws) {
    auto segs = ctx_.store.list(ws);
    bool queued = false;
    std::string why;
    if (segs && ctx_.sched) {
        turn_request tr;
        tr.workspace = ws;
        tr.cache_salt = ctx_.cache_salt(ws, "");
        // With the stable segments its last chat carried (its tools, say).
        tr.segments = merge_stored_segments(std::move(*segs), ctx_.carried(ws));
        auto prompt = ctx_.sched->assemble(tr);  // here, not on the engine thread
        if (prompt.ok()) {
            tr.assembled = std::make_shared<const assembled_prompt>(std::move(*prompt));
            status st = ctx_.sched->prewarm(std::move(tr));
            queued = st.ok();
            if (!st.ok()) why = st.message();
        } else {
            why = prompt.error().message();
        }
    } else {
        why = "no stored segments";
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        (queued ? ctr_.n_queued : ctr_.n_skipped)++;
    }
    if (!queued && why != "no stored segments")
        ctx_.log_event({{"event", "prewarm_skipped"}, {"workspace", ws}, {"reason", why}});
}

void prewarmer::loop() {
    auto next_flush = clock::now() + k_flush_every;
    std::unique_lock<std::mutex> lk(mu_);
    while (!stopping_) {
        std::string ws;
        if (!now_.empty()) {
            ws = std::move(now_.front());
            now_.pop_front();
        } else {
            auto first = std::min_element(due_.begin(), due_.end(),
                                          [](const auto & a, const auto & b) { return a.second < b.second; });
            const auto wake = first == due_.end() ? next_flush : std::min(next_flush, first->second);
            if (clock::now() < wake) {
                cv_.wait_until(lk, wake);
                continue;
            }
            if (first != due_.end() && first->second <= clock::now()) {
                ws = first->first;
                due_.erase(first);
            }
        }
        lk.unlock();
        if (!ws.empty()) run_one(ws);
        if (clock::now() >= next_flush) {
            (void)ctx_.store.flush_uses();
            next_flush = clock::now() + k_flush_every;
        }
        lk.lock();
    }
    lk.unlock();
    (void)ctx_.store.flush_uses();
}

}  // namespace warmctx::server_detail
