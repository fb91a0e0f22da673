// The threads answer grammars are built on (grammar_builds.h).
#include "grammar_builds.h"

#include <algorithm>
#include <vector>

namespace warmctx::server_detail {

grammar_builds::grammar_builds(unsigned slots)
    : slots_(slots ? slots : std::max(1u, std::thread::hardware_concurrency() / 2)) {}

grammar_builds::~grammar_builds() { stop(); }

unsigned grammar_builds::running() const {
    std::lock_guard<std::mutex> lk(mu_);
    return busy_;
}

void grammar_builds::reap_locked() {
    for (auto it = threads_.begin(); it != threads_.end();) {
        if (!it->finished) {
            ++it;
            continue;
        }
        it->t.join();  // its last step was to set `finished` under mu_: returns at once
        it = threads_.erase(it);
    }
}

bool grammar_builds::start(std::function<void(bool run)> work, std::shared_ptr<const std::atomic<bool>> abandoned) {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return false;
    reap_locked();
    threads_.emplace_back();
    build_thread * self = &threads_.back();  // list nodes stay put
    self->t = std::thread([this, self, work = std::move(work), abandoned = std::move(abandoned)] {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return busy_ < slots_ || abandoned->load() || stopping_; });
        const bool run = !abandoned->load() && !stopping_;
        if (run) ++busy_;
        l.unlock();
        work(run);
        l.lock();
        if (run) --busy_;
        self->finished = true;
        cv_.notify_all();  // a build waiting for the slot, or stop()
    });
    return true;
}

void grammar_builds::abandon(std::atomic<bool> & abandoned) {
    std::lock_guard<std::mutex> lk(mu_);
    abandoned = true;
    cv_.notify_all();  // its build, if it waits for a slot, gives up now
}

void grammar_builds::stop() {
    std::unique_lock<std::mutex> lk(mu_);
    stopping_ = true;
    cv_.notify_all();  // the builds waiting for a slot give up
    cv_.wait(lk, [&] {
        return std::all_of(threads_.begin(), threads_.end(), [](const build_thread & b) { return b.finished; });
    });
    reap_locked();
}

}  // namespace warmctx::server_detail
