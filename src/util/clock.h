// util/clock.h - the one clock warmctx times with, and milliseconds between its points.
// Every timing a response, a log line, a metric or a benchmark reports is measured on
// std::chrono::steady_clock (monotonic: a wall-clock step never makes a duration negative).
#pragma once

#include <chrono>

namespace warmctx {

using steady_clock = std::chrono::steady_clock;

// Milliseconds from a to b (negative when b is before a), as a double.
inline double ms_between(steady_clock::time_point a, steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

// Milliseconds from t to now.
inline double ms_since(steady_clock::time_point t) { return ms_between(t, steady_clock::now()); }

}  // namespace warmctx
