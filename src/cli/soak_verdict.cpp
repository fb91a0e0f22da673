#include "soak_verdict.h"

#include <algorithm>
#include <fstream>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace warmctx::cli {
namespace {

double median_of(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

rss_verdict judge_rss(const std::vector<rss_sample> & samples, double tolerance) {
    rss_verdict v;
    const size_t n = samples.size();
    if (n < k_min_rss_samples) return v;
    v.evaluated = true;
    v.n_warmup = n / 3;
    v.n_middle = n / 3;
    v.n_last = n - v.n_warmup - v.n_middle;
    std::vector<double> middle, last;
    for (size_t i = v.n_warmup; i < v.n_warmup + v.n_middle; ++i) middle.push_back((double)samples[i].rss_bytes);
    for (size_t i = v.n_warmup + v.n_middle; i < n; ++i) last.push_back((double)samples[i].rss_bytes);
    v.middle_median_bytes = median_of(middle);
    v.last_median_bytes = median_of(last);
    v.change = v.middle_median_bytes > 0 ? v.last_median_bytes / v.middle_median_bytes - 1 : 0;
    v.flat = v.last_median_bytes <= v.middle_median_bytes * (1 + tolerance);
    // Least-squares slope over middle and last thirds: how fast it grows, for the report.
    double st = 0, sr = 0, stt = 0, str = 0, k = 0;
    for (size_t i = v.n_warmup; i < n; ++i) {
        const double t = samples[i].t_s / 60, r = (double)samples[i].rss_bytes;
        st += t; sr += r; stt += t * t; str += t * r; k += 1;
    }
    const double den = k * stt - st * st;
    v.slope_bytes_per_min = den > 0 ? (k * str - st * sr) / den : 0;
    return v;
}

uint64_t read_rss_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("VmRSS:", 0) != 0) continue;
        uint64_t kib = 0;
        for (char ch : line.substr(6))
            if (ch >= '0' && ch <= '9') kib = kib * 10 + (uint64_t)(ch - '0');
        return kib * 1024;
    }
    return 0;
}

uint64_t read_heap_bytes() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    const struct mallinfo2 mi = mallinfo2();
    return (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
#else
    return 0;
#endif
}

std::string status_class(int http_status) {
    if (http_status >= 200 && http_status < 600) return std::to_string(http_status / 100) + "xx";
    return "other";
}

}  // namespace warmctx::cli
