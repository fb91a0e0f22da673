// server/grammar_builds.h - the threads an answer's grammar (tools, a JSON schema) is
// built on: off the engine thread and off the request's own, at most `slots` at once, so
// that many costly schemas at once leave cores to the engine and to other requests.
//
// A request waits for its build with a deadline and stops waiting when its client leaves
// or the server stops (completion.cpp). A build nobody waits for any more is not
// interrupted - llama.cpp's schema converter and grammar parser cannot be - but one that
// has not started is skipped, and the request bounds (warmctx/server.h) keep a build short.
// stop() refuses new builds and waits for those running, before the scheduler whose chat
// template they use goes away.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

namespace warmctx::server_detail {

class grammar_builds {
  public:
    // slots: builds at once (0: half the cores, at least one).
    explicit grammar_builds(unsigned slots);
    ~grammar_builds();  // stop()
    grammar_builds(const grammar_builds &) = delete;
    grammar_builds & operator=(const grammar_builds &) = delete;

    // Calls work(true) on a thread of its own once a slot is free - or work(false) at once
    // when `abandoned` is set, or the pool stops, before then. False when stopping (work
    // is not called).
    bool start(std::function<void(bool run)> work, std::shared_ptr<const std::atomic<bool>> abandoned);
    // Sets `abandoned` (start's flag): a build that has not started is skipped.
    void abandon(std::atomic<bool> & abandoned);
    // No build starts after this (those waiting for a slot are skipped); waits for those running. Idempotent.
    void stop();

    unsigned slots() const { return slots_; }
    unsigned running() const;  // builds holding a slot now

  private:
    struct build_thread {
        std::thread t;
        bool finished = false;  // guarded by mu_
    };
    void reap_locked();  // joins the finished threads (mu_ held)

    const unsigned slots_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    unsigned busy_ = 0;                // guarded by mu_
    bool stopping_ = false;            // guarded by mu_
    std::list<build_thread> threads_;  // guarded by mu_
};

}  // namespace warmctx::server_detail
