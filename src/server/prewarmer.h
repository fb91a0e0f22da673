// server/prewarmer.h - background pre-warm of stored workspaces.
//
// When a workspace's stored stable segments are created, changed or deleted (PUT/DELETE
// of a segment of class high or highest), or on POST /v1/workspaces/{id}/prewarm, the
// workspace is marked; after `delay_ms` without another change (a client PUTting many
// segments gets one pre-warm, of the last version) this thread assembles its stored
// segments and queues a pre-warm with the scheduler (scheduler::prewarm: lowest
// priority, preempted by any chat). On start, every stored workspace is marked, most
// used first, with no delay: each is brought warm from the disk tier (a restore) or,
// failing that, prefilled, while the server already answers.
//
// The pre-warm's segments are the stored ones plus the stable segments (tools, system)
// the workspace's last chat carried in its request (route_context::carried): an SDK sends
// its tools with every request, and the next chat's prefix includes them.
//
// Assembly and tokenization run on this thread, never on the engine thread or an HTTP
// thread. The use counts of the store are flushed from here too (every 30 s and at stop).
//
// Thread safety: every member is safe to call from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace warmctx::server_detail {

class route_context;

class prewarmer {
  public:
    prewarmer(route_context & ctx, int delay_ms) : ctx_(ctx), delay_(delay_ms) {}
    ~prewarmer() { stop(); }
    prewarmer(const prewarmer &) = delete;
    prewarmer & operator=(const prewarmer &) = delete;

    void start();
    // Ends the thread (idempotent); what is still marked is not pre-warmed.
    void stop();
    // Pre-warm `ws` once it has been left alone for the delay (or at once).
    void mark(const std::string & ws, bool at_once = false);
    // Pre-warm these at once, in this order (after a restart: most used first).
    void mark_all(const std::vector<std::string> & in_order);

    struct counters {
        uint64_t n_queued = 0;   // handed to the scheduler
        uint64_t n_skipped = 0;  // no stored segments any more, or the prompt does not fit
    };
    counters stats() const;

  private:
    using clock = std::chrono::steady_clock;
    void loop();
    void run_one(const std::string & ws);

    route_context & ctx_;
    const std::chrono::milliseconds delay_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::map<std::string, clock::time_point> due_;  // guarded by mu_: workspace -> when
    std::deque<std::string> now_;                    // guarded by mu_: in this order, at once
    bool stopping_ = false;                          // guarded by mu_
    bool started_ = false;                           // guarded by mu_
    counters ctr_;                                   // guarded by mu_
    std::thread thread_;
};

}  // namespace warmctx::server_detail
