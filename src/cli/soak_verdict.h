// The soak's verdicts, pure so that the unit tests check them without a server:
// is the resident set flat once warmed up, and how a response is tallied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace warmctx::cli {

struct rss_sample {
    double t_s = 0;          // seconds since the clients started
    uint64_t rss_bytes = 0;  // VmRSS of the process
    uint64_t heap_bytes = 0; // bytes malloc has handed out and not had back (0: unknown);
                             // RSS growing while this stays is the allocator keeping
                             // freed memory, not memory still held
};

// The rule: the samples are split in thirds by count; the first third is warm-up
// (allocator pools, the prefix cache and the tokenizer's memo filling up) and is not
// judged; RSS is flat when the median of the last third is at most `tolerance` above
// the median of the middle third (a fall is fine). Fewer than k_min_rss_samples
// samples are not judged (evaluated = false, flat = true).
inline constexpr size_t k_min_rss_samples = 6;
inline constexpr double k_rss_tolerance = 0.10;

struct rss_verdict {
    bool evaluated = false;
    bool flat = true;
    size_t n_warmup = 0, n_middle = 0, n_last = 0;
    double middle_median_bytes = 0, last_median_bytes = 0;
    double change = 0;               // last / middle - 1
    double slope_bytes_per_min = 0;  // least squares over the samples after warm-up
};

rss_verdict judge_rss(const std::vector<rss_sample> & samples, double tolerance = k_rss_tolerance);

// VmRSS of this process from /proc/self/status, in bytes (0 if it cannot be read).
uint64_t read_rss_bytes();
// Bytes in use in malloc's heap, every arena and mmapped blocks (glibc's mallinfo2);
// 0 where that is not available.
uint64_t read_heap_bytes();

// A response's class for the tally: "2xx", "3xx", "4xx", "5xx", or "other" (1xx, or a
// code outside 100..599).
std::string status_class(int http_status);

}  // namespace warmctx::cli
