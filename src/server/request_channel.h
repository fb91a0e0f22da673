// server/request_channel.h - the per-request queue between the engine thread (which
// pushes completion events from the job's sink) and the HTTP thread that answers.
//
// States: open -> (cancelled | aborted). The HTTP side cancels when its client went
// away; the server aborts when it stops. Either way the next push returns false, so
// the scheduler drops the job and frees its sequence.
//
// Thread safety: every member is safe to call from any thread; `mu_` guards the
// queue and the flags.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

#include "warmctx/scheduler.h"

namespace warmctx::server_detail {

struct timed_event {
    completion_event ev;
    std::chrono::steady_clock::time_point at;  // when the engine thread pushed it
};

class request_channel {
  public:
    // `streamed`: the HTTP thread sends each event on as it comes. A whole answer needs
    // only the end: its HTTP thread is not woken for each token (on a machine whose cores
    // the model's threads use, each such wake holds a decode up), and takes the text when
    // the end, or its own poll for a client gone, wakes it.
    explicit request_channel(bool streamed = true) : streamed_(streamed) {}

    // Engine thread (the job's sink). Returns false once cancelled or aborted: the
    // event is dropped and the scheduler cancels the job.
    bool push(const completion_event & ev) {
        std::lock_guard<std::mutex> lk(mu_);
        if (cancelled_) return false;
        const bool was_empty = q_.empty();
        q_.push_back({ev, std::chrono::steady_clock::now()});
        const bool last = ev.what == completion_event::kind::done || ev.what == completion_event::kind::error;
        if (last) finished_ = true;
        const bool text = ev.what == completion_event::kind::delta || ev.what == completion_event::kind::progress;
        // Whoever drains the queue takes all of it: one wake per batch of events.
        if (last || (was_empty && (streamed_ || !text))) cv_.notify_all();
        return true;
    }

    // HTTP thread: everything queued, waiting up to `timeout` for at least one event.
    // Empty on timeout.
    std::vector<timed_event> pop_all(std::chrono::milliseconds timeout) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait_for(lk, timeout, [&] { return !q_.empty(); });
        std::vector<timed_event> out(std::make_move_iterator(q_.begin()), std::make_move_iterator(q_.end()));
        q_.clear();
        return out;
    }

    // The client went away: stop the job (the next push returns false).
    void cancel() {
        std::lock_guard<std::mutex> lk(mu_);
        cancelled_ = true;
    }

    // The server is stopping: stop the job and wake the HTTP thread with an error
    // event (code cancelled), unless the request already got its last event.
    void abort(const std::string & why) {
        std::lock_guard<std::mutex> lk(mu_);
        if (cancelled_ || finished_) return;
        cancelled_ = true;
        completion_event ev;
        ev.what = completion_event::kind::error;
        ev.error = status(status_code::cancelled, why);
        q_.push_back({std::move(ev), std::chrono::steady_clock::now()});
        cv_.notify_all();
    }

    bool cancelled() const {
        std::lock_guard<std::mutex> lk(mu_);
        return cancelled_;
    }

  private:
    const bool streamed_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<timed_event> q_;  // guarded by mu_
    bool cancelled_ = false;     // guarded by mu_
    bool finished_ = false;      // the last event (done or error) was pushed; guarded by mu_
};

}  // namespace warmctx::server_detail
