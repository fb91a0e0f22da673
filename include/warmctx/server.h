// warmctx/server.h - the HTTP layer: OpenAI-compatible routes and the workspace API
// over a running scheduler.
//
//   HTTP threads (httplib's pool)            engine thread (scheduler)
//   parse + validate JSON -> native types
//   map messages -> segments
//   scheduler::submit(job) ──────────────▶  admit, prefill, batched decode
//   wait on a per-request event queue ◀────  sink(event) pushes a copy
//   format JSON / SSE chunks, write
//
// All JSON lives in this layer; the scheduler sees only turn_request. Every route is
// documented in docs/api.md (request and response shapes, the error table, metrics,
// and how a plain `messages` array becomes segments).
//
// Contracts
//   - start() binds the socket and begins serving before it returns; the scheduler
//     must already be started (it is: a scheduler exists only once started), so
//     GET /health answers 200 from the first request on.
//   - The scheduler must outlive the server. stop() (or the destructor) returns only
//     when no HTTP thread runs any more; requests still waiting for the scheduler are
//     answered 503 (streams end with an error chunk) and their jobs cancelled.
//   - Bad input never affects other requests: every handler catches everything at
//     its boundary and answers an OpenAI error object.
//   - start() sets SIGPIPE to SIG_IGN for the process: a client that disconnects
//     mid-stream must be a failed write, not a killed server.
//
// Thread safety: start/stop/port/wait may be called from any thread; stop is idempotent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "warmctx/kind_table.h"
#include "warmctx/scheduler.h"
#include "warmctx/status.h"

namespace warmctx {

struct server_options {
    std::string host = "127.0.0.1";
    int port = 8080;                       // 0 = an ephemeral port (tests); see port()
    std::string api_key;                   // non-empty: every route but /health needs
                                           // "Authorization: Bearer <api_key>"
    size_t max_body_bytes = 8u << 20;      // larger request bodies get 413
    int n_http_threads = 8;                // concurrent requests being handled; keep it
                                           // above n_parallel + max_queue so the
                                           // scheduler's queue, not the pool, says 429
    std::string model_name;                // id in /v1/models and responses ("" = the
                                           // model file's name without directory)
    int32_t default_max_tokens = 256;      // when a request names no max_tokens
    bool log_requests = true;              // one JSON line per request on stderr

    // The segment kind table the scheduler's context engine uses (validates PUT
    // segments early; the scheduler checks again when it assembles).
    kind_table kinds;

    // Server-side workspace store bounds (PUT answers 413 for one segment too large,
    // 429 when the store is full).
    size_t max_workspaces = 1024;
    size_t max_segments_per_workspace = 4096;
    size_t max_segment_bytes = 4u << 20;
    size_t max_store_bytes = 256u << 20;   // content + path of every stored segment
};

class http_server {
  public:
    // Binds host:port and serves on a background thread. Errors: invalid_argument
    // (bad option), io_error (the address cannot be bound, e.g. the port is in use).
    static result<std::unique_ptr<http_server>> start(scheduler & sched, server_options opts);
    ~http_server();  // stop()
    http_server(const http_server &) = delete;
    http_server & operator=(const http_server &) = delete;

    // The bound port (the ephemeral one when options.port was 0).
    int port() const;
    const server_options & options() const;

    // Stops accepting connections, answers requests still waiting for the scheduler
    // with 503, waits for the HTTP threads (idempotent). /health answers 503 from the
    // moment stop() is called until the socket closes. Does NOT stop the scheduler.
    void stop();
    // Blocks until stop() has completed (from any thread).
    void wait();

  private:
    struct impl;
    explicit http_server(std::unique_ptr<impl> p);
    std::unique_ptr<impl> p_;
};

}  // namespace warmctx
