// server/metrics.h - the server's Prometheus metrics (text exposition format 0.0.4).
//
// The HTTP layer counts requests, tokens and latencies itself; the cache and
// scheduler gauges are read at scrape time (scheduler::stats(), and the context
// engine's counters through scheduler::call). Every metric is listed in docs/api.md.
//
// Invariants: each histogram's +Inf bucket == its _count; requests_total summed over
// labels == the number of finished requests (a streamed request finishes when its
// stream ends).
//
// Thread safety: every member is safe to call from any thread; `mu_` guards it all.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "warmctx/context_engine.h"
#include "warmctx/scheduler.h"

namespace warmctx::server_detail {

class histogram {
  public:
    // Upper bounds in seconds, ascending: 5 ms .. 60 s.
    static constexpr std::array<double, 14> k_bounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                         1,     2.5,  5,     10,   20,  30,  60};
    void observe(double v);
    // Appends the _bucket/_sum/_count lines of `name` (labels-free).
    void render(std::string & out, const std::string & name) const;

  private:
    std::array<uint64_t, k_bounds.size()> buckets_{};  // non-cumulative
    uint64_t count_ = 0;
    double sum_ = 0;
};

// One request as it finished: what the log line and the metrics record.
struct request_outcome {
    std::string route;           // the route pattern, e.g. "/v1/workspaces/{id}/segments"
    int status = 0;
    double duration_s = 0;
    double ttft_s = -1;          // < 0: no token generated
    int64_t prompt_tokens = 0;
    int64_t cached_tokens = 0;
    int64_t prefilled_tokens = 0;
    int64_t completion_tokens = 0;
};

// What a scrape reads from the engine side.
struct engine_snapshot {
    scheduler_stats sched;
    uint32_t n_parallel = 0;
    bool have_counters = false;  // false when the engine thread could not be reached
    context_counters counters;
    size_t store_workspaces = 0, store_segments = 0, store_bytes = 0;
    uint64_t store_write_failures = 0;
};

// `text` (the exposition format) with name="value" added to every sample's labels;
// `text` itself when value is empty. The value is escaped as the format asks.
std::string with_label(const std::string & text, const std::string & name, const std::string & value);

class server_metrics {
  public:
    void record(const request_outcome & o);
    // A connection closed to free its thread for another (it was idle or still sending).
    void count_shed_connection();
    std::string render(const engine_snapshot & snap) const;

  private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;  // (route, status) -> count
    uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, prefilled_tokens_ = 0, completion_tokens_ = 0;
    uint64_t shed_connections_ = 0;
    histogram ttft_, duration_;
};

}  // namespace warmctx::server_detail
