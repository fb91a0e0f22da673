#include "warmctx/status.h"

namespace warmctx {

std::string_view status_code_name(status_code code) {
    switch (code) {
        case status_code::ok: return "ok";
        case status_code::invalid_argument: return "invalid_argument";
        case status_code::not_found: return "not_found";
        case status_code::out_of_range: return "out_of_range";
        case status_code::failed_precondition: return "failed_precondition";
        case status_code::resource_exhausted: return "resource_exhausted";
        case status_code::io_error: return "io_error";
        case status_code::corrupt: return "corrupt";
        case status_code::engine_error: return "engine_error";
        case status_code::cancelled: return "cancelled";
        case status_code::internal: return "internal";
    }
    return "unknown";
}

std::string status::to_string() const {
    if (ok()) return "ok";
    std::string s(status_code_name(code_));
    s += ": ";
    s += message_;
    return s;
}

status status::with_context(std::string_view context) const {
    if (ok()) return *this;
    std::string m(context);
    m += ": ";
    m += message_;
    return {code_, std::move(m)};
}

}  // namespace warmctx
