// server/api_error.h - an HTTP error in OpenAI's shape, and THE table from warmctx
// status codes to HTTP statuses.
//
//   {"error": {"message": "...", "type": "invalid_request_error",
//              "param": "messages[1].role", "code": "invalid_argument"}}
//
// `type` follows llama-server's vocabulary (what OpenAI clients already handle);
// `code` is a stable machine-readable name (a status_code name or one of the
// HTTP-layer codes below); `param` names the offending request field or is null.
#pragma once

#include <optional>
#include <string>

#include "warmctx/status.h"

namespace warmctx::server_detail {

struct api_error {
    int http_status = 500;
    std::string type;          // invalid_request_error, authentication_error, ...
    std::string code;          // invalid_argument, invalid_json, queue_full, ...
    std::string message;
    std::string param;         // "" = null
    int retry_after_s = 0;     // > 0: send a Retry-After header

    // The body: {"error": {...}} as compact JSON (invalid UTF-8 replaced).
    std::string body() const;
};

// The one mapping from a warmctx status to an HTTP error:
//
//   status_code          HTTP  type                   note
//   invalid_argument     400   invalid_request_error
//   out_of_range         400   invalid_request_error  e.g. prompt longer than the context
//   not_found            404   not_found_error
//   failed_precondition  409   invalid_request_error  valid, but not in this state
//   resource_exhausted   429   rate_limit_error       Retry-After: 1
//   cancelled            503   unavailable_error      server shutting down
//   io_error, corrupt,
//   engine_error,
//   internal             500   server_error
//
// REQUIRES: !st.ok().
api_error error_from_status(const status & st, std::string param = {});

using warmctx::is_disk_full;  // warmctx/status.h
// `message` with each quoted absolute path ('/a/b/c') cut to its last name ('c'): an
// answer never tells a client where the server keeps its files.
std::string without_paths(std::string message);

// HTTP-layer errors that have no status_code behind them.
api_error bad_request(std::string code, std::string message, std::string param = {});
api_error unauthorized(std::string message);
api_error not_found_route(std::string message);
api_error method_not_allowed(std::string message);
api_error payload_too_large(std::string message);
api_error request_timeout(std::string message);
api_error too_many_requests(std::string code, std::string message, int retry_after_s);
api_error unavailable(std::string message, int retry_after_s);
api_error server_error(std::string message);

// Helper for parsers: an optional error, empty on success.
using maybe_error = std::optional<api_error>;

}  // namespace warmctx::server_detail
