// server/router.h - the transport's half that needs no socket: the route table, the
// API key, dispatch (the boundary that catches everything a handler throws), the
// OpenAI-shaped answer to what no route takes, and each request's record (metrics and
// the log line).
//
// http_server.cpp hands it the requests its HTTP library already matched (dispatch)
// and the errors that library answers itself (unmatched); tests hand it a request
// (handle) and match as the library does.
//
// Thread safety: dispatch, handle and unmatched may be called from any thread; the
// table is fixed once constructed.
#pragma once

#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "route_context.h"

namespace warmctx::server_detail {

// "Bearer <key>" (scheme case-insensitive, spaces after it ignored) against `api_key`,
// compared in constant time. An empty api_key lets everyone in.
bool authorized(const std::string & authorization, const std::string & api_key);

class router {
  public:
    // Registers every route: /health and /metrics, then the OpenAI routes, then the
    // workspace routes (the order the transport tries them in).
    explicit router(route_context & ctx);
    router(const router &) = delete;
    router & operator=(const router &) = delete;

    const std::vector<route> & routes() const { return routes_; }

    // One request to `r`: 503 while the model loads (but /health and /metrics), auth,
    // the handler, a 500 for anything it throws, the CORS headers; the request is
    // recorded here unless it became a stream (whose end records it).
    void dispatch(const route & r, const http_request & req, http_response & res);

    // What the transport asks before it reads a body: answers (and records) a request
    // that its headers alone refuse, as dispatch would: 503 "loading", 401. True:
    // answered, the body must not be read.
    bool refuse_early(const route & r, const http_request & req, http_response & res);
    // A request to `r` refused by the transport while reading its body (413, 408, 400):
    // answered with `e` and recorded.
    void refuse(const route & r, const http_request & req, const api_error & e, http_response & res);

    // Matches `req` as the transport does (the first route of its method whose
    // pattern matches the whole path), fills req.params and dispatches; OPTIONS goes
    // to preflight; no route: unmatched with 404.
    http_response handle(http_request req);

    // OPTIONS: with CORS on (server_options::cors_origin) and an allowed Origin on a
    // known path, the preflight answer (204, Access-Control-Allow-Methods/-Headers);
    // otherwise as unmatched (405 with Allow on a known path, 404 elsewhere).
    void preflight(const http_request & req, http_response & res);

    // An error the transport answers itself (res.status preset: 404 no route, 413
    // body too large, 400 malformed request, 5xx): an OpenAI error object, 405 with
    // Allow when the path is known under another method; recorded.
    void unmatched(const http_request & req, http_response & res);

    // A request the transport refused before parsing it: malformed or ambiguous framing
    // (400, route "malformed"), or a connection shed for another when every thread was
    // busy (503, route "busy"). Answered with `e` and recorded under `label`.
    void refuse_head(const api_error & e, http_response & res, const char * label = "malformed");

  private:
    bool answered_on_headers(const route & r, const http_request & req, http_response & res, request_log & log) const;
    bool cors_allows(const std::string & origin) const;
    // Without an API key: whether the Host header names this server as a web page on
    // this machine would (an IP address, localhost, --allowed-hosts), not a name a
    // rebinding page points here.
    bool host_allowed(const std::string & host) const;
    // Access-Control-Allow-Origin (and Vary, -Expose-Headers) when `req` comes from an
    // allowed origin.
    void add_cors(const http_request & req, http_response & res) const;

  private:
    route_context & ctx_;
    std::vector<route> routes_;
    std::vector<std::regex> res_;  // routes_[i]'s compiled regex_text
    bool cors_any_ = false;                  // --cors-origin '*'
    std::vector<std::string> cors_origins_;  // or these origins exactly
    bool hosts_any_ = false;                 // --allowed-hosts '*'
    std::vector<std::string> hosts_;         // or these names (lower case)
};

}  // namespace warmctx::server_detail
