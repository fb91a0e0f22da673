// warmctx/status.h - the error type of every fallible warmctx call.
//
// warmctx never throws across a module boundary. A fallible call returns a
// `status` (or a `result<T>`, a value or a status), and bad input from a user
// is always a status with a message, never an abort. Asserts are reserved for
// our own invariants.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace warmctx {

enum class status_code {
    ok = 0,
    invalid_argument,   // the caller's input is wrong (bad flag, empty prompt, unknown KV type)
    not_found,          // a file, model, sequence or workspace does not exist
    out_of_range,       // a size limit was crossed (prompt longer than the context, budget)
    failed_precondition,// the call is valid but not now (sequence busy, not at a boundary)
    resource_exhausted, // no KV slot / memory / queue space; retry later may work
    io_error,           // the OS said no (read, write, fsync, rename)
    corrupt,            // a file failed its magic, version or checksum check
    engine_error,       // llama.cpp returned an error code
    cancelled,          // the caller asked to stop
    internal,           // a bug in warmctx
};

// The stable lower-case name of a code, e.g. "invalid_argument".
std::string_view status_code_name(status_code code);

class [[nodiscard]] status {
  public:
    status() = default;  // ok
    status(status_code code, std::string message) : code_(code), message_(std::move(message)) {}

    static status ok_status() { return {}; }

    bool ok() const { return code_ == status_code::ok; }
    status_code code() const { return code_; }
    const std::string & message() const { return message_; }

    // "invalid_argument: prompt is empty"
    std::string to_string() const;

    // Prefix the message with where it happened: "loading model: ...".
    status with_context(std::string_view context) const;

  private:
    status_code code_ = status_code::ok;
    std::string message_;
};

inline status invalid_argument(std::string m) { return {status_code::invalid_argument, std::move(m)}; }
inline status not_found(std::string m) { return {status_code::not_found, std::move(m)}; }
inline status out_of_range(std::string m) { return {status_code::out_of_range, std::move(m)}; }
inline status failed_precondition(std::string m) { return {status_code::failed_precondition, std::move(m)}; }
inline status resource_exhausted(std::string m) { return {status_code::resource_exhausted, std::move(m)}; }
inline status io_error(std::string m) { return {status_code::io_error, std::move(m)}; }
inline status corrupt(std::string m) { return {status_code::corrupt, std::move(m)}; }
inline status engine_error(std::string m) { return {status_code::engine_error, std::move(m)}; }
inline status internal_error(std::string m) { return {status_code::internal, std::move(m)}; }

// An I/O error that says the disk is full (ENOSPC, "No space left on device").
inline bool is_disk_full(const status & st) {
    return st.code() == status_code::io_error && st.message().find("No space left on device") != std::string::npos;
}

// A value or the status that explains why there is none.
// REQUIRES: a result built from a status is built from a non-ok status.
template <typename T>
class [[nodiscard]] result {
  public:
    result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
    result(status s) : v_(std::move(s)) {}     // NOLINT(google-explicit-constructor)

    bool ok() const { return std::holds_alternative<T>(v_); }
    explicit operator bool() const { return ok(); }

    // REQUIRES: ok()
    T & value() & { return std::get<T>(v_); }
    const T & value() const & { return std::get<T>(v_); }
    T && value() && { return std::get<T>(std::move(v_)); }
    T * operator->() { return &value(); }
    const T * operator->() const { return &value(); }
    T & operator*() & { return value(); }
    const T & operator*() const & { return value(); }

    // The error; an ok status when the result holds a value.
    status error() const { return ok() ? status{} : std::get<status>(v_); }

  private:
    std::variant<T, status> v_;
};

}  // namespace warmctx

// Return early from the enclosing function when `expr` yields a non-ok status.
#define WARMCTX_RETURN_IF_ERROR(expr)                 \
    do {                                              \
        ::warmctx::status _wc_st = (expr);            \
        if (!_wc_st.ok()) return _wc_st;              \
    } while (0)
