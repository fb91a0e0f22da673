#include "api_error.h"

#include <nlohmann/json.hpp>

#include "json_util.h"

namespace warmctx::server_detail {

std::string api_error::body() const {
    nlohmann::json e = {{"message", message}, {"type", type}, {"code", code}};
    e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
    return dump_json({{"error", std::move(e)}});
}

std::string without_paths(std::string m) {
    for (size_t pos = 0; (pos = m.find("'/", pos)) != std::string::npos;) {
        const size_t end = m.find('\'', pos + 1);
        if (end == std::string::npos) break;
        const size_t slash = m.rfind('/', end);
        m.erase(pos + 1, slash + 1 - (pos + 1));
        pos = m.find('\'', pos + 1) + 1;
    }
    return m;
}

api_error error_from_status(const status & st, std::string param) {
    // A full disk is 507 wherever it happens (an explicit snapshot answered 500).
    if (is_disk_full(st))
        return api_error{507, "server_error", "insufficient_storage",
                         "the disk is full: " + without_paths(st.message()), std::move(param), 0};
    api_error e;
    e.code = std::string(status_code_name(st.code()));
    e.message = st.message();
    e.param = std::move(param);
    switch (st.code()) {
        case status_code::invalid_argument:
        case status_code::out_of_range:
            e.http_status = 400;
            e.type = "invalid_request_error";
            break;
        case status_code::not_found:
            e.http_status = 404;
            e.type = "not_found_error";
            break;
        case status_code::failed_precondition:
            e.http_status = 409;
            e.type = "invalid_request_error";
            break;
        case status_code::resource_exhausted:
            e.http_status = 429;
            e.type = "rate_limit_error";
            e.retry_after_s = 1;
            break;
        case status_code::cancelled:
            e.http_status = 503;
            e.type = "unavailable_error";
            break;
        case status_code::ok:  // a bug in the caller; still answer something sane
        case status_code::io_error:
        case status_code::corrupt:
        case status_code::engine_error:
        case status_code::internal:
            e.http_status = 500;
            e.type = "server_error";
            break;
    }
    return e;
}

namespace {
api_error make(int http, std::string type, std::string code, std::string message,
               std::string param = {}, int retry_after_s = 0) {
    api_error e;
    e.http_status = http;
    e.type = std::move(type);
    e.code = std::move(code);
    e.message = std::move(message);
    e.param = std::move(param);
    e.retry_after_s = retry_after_s;
    return e;
}
}  // namespace

api_error bad_request(std::string code, std::string message, std::string param) {
    return make(400, "invalid_request_error", std::move(code), std::move(message), std::move(param));
}
api_error unauthorized(std::string message) {
    return make(401, "authentication_error", "invalid_api_key", std::move(message));
}
api_error not_found_route(std::string message) {
    return make(404, "not_found_error", "unknown_route", std::move(message));
}
api_error method_not_allowed(std::string message) {
    return make(405, "invalid_request_error", "method_not_allowed", std::move(message));
}
api_error payload_too_large(std::string message) {
    return make(413, "invalid_request_error", "payload_too_large", std::move(message));
}
api_error request_timeout(std::string message) {
    return make(408, "invalid_request_error", "request_timeout", std::move(message));
}
api_error too_many_requests(std::string code, std::string message, int retry_after_s) {
    return make(429, "rate_limit_error", std::move(code), std::move(message), {}, retry_after_s);
}
api_error unavailable(std::string message, int retry_after_s) {
    return make(503, "unavailable_error", "unavailable", std::move(message), {}, retry_after_s);
}
api_error server_error(std::string message) {
    return make(500, "server_error", "internal", std::move(message));
}

}  // namespace warmctx::server_detail
