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
//   - start() binds the socket and serves before it returns. Without a scheduler
//     (start(options)), GET /health answers 503 {"status":"loading"} and every other
//     route but /metrics 503 (code "loading") until attach(); start(scheduler, ...)
//     is start + attach, so GET /health answers 200 from the first request on.
//   - The scheduler must outlive the server. stop() (or the destructor) returns only
//     when no HTTP thread runs any more; requests still waiting for the scheduler are
//     answered 503 (streams end with an error chunk) and their jobs cancelled.
//   - Bad input never affects other requests: every handler catches everything at
//     its boundary and answers an OpenAI error object.
//   - No request body larger than max_body_bytes is ever held, whatever its framing
//     (Content-Length, chunked, compressed): it is read through a running count and
//     refused with 413 at the first byte past the limit. A request the server refuses
//     on its headers alone (no or a wrong API key, a Content-Length over the limit, the
//     model still loading) is answered before its body is read, and its connection
//     closed. A body is read as JSON whatever its Content-Type. A request with neither
//     Content-Length nor Transfer-Encoding has no body (RFC 9112 6.3).
//   - Slow clients cannot hold the HTTP threads: a request's line and headers must
//     arrive within header_timeout_ms of its first byte and its body within
//     body_timeout_ms of its headers (else the connection is closed, 408 for a body);
//     and when every thread is busy, a new connection takes the thread of the
//     connection that has waited longest for its next request or is still sending
//     one. Threads answering a request are never taken.
//   - start() sets SIGPIPE to SIG_IGN for the process: a client that disconnects
//     mid-stream must be a failed write, not a killed server.
//
// Thread safety: start/attach/stop/port/wait may be called from any thread; stop is
// idempotent; attach is called at most once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "warmctx/kind_table.h"
#include "warmctx/scheduler.h"
#include "warmctx/status.h"

namespace warmctx {

// Bounds on what one chat request may ask for, checked while its body is parsed: before
// any template, tokenizer or grammar work, each answered 400 naming the bound (and its
// flag). docs/api.md, "Limits", has the table.
struct request_bounds {
    size_t max_messages = 4096;          // messages (chat) or input items (Responses); at most 10,000
    size_t max_tools = 128;              // function tools, a Responses namespace's counted one by one (OpenAI's 128)
    size_t max_tools_bytes = 512u << 10; // the tools array as canonical JSON (keys sorted, no spaces)
    size_t max_enum_values =
        256;  // enum values over every schema of the request (tools' parameters, response_format):
              // each costs a check of every candidate token per sampled token, on the engine thread
    // Optional properties of one object schema: llama.cpp's converter writes a rule for
    // every suffix of their order, so its time grows with their square (3,000 took 53 s,
    // 300 0.6 s on 2 cores, off the engine thread but holding a core and the request).
    size_t max_optional_properties = 128;
    // anyOf/oneOf alternatives over every schema of the request: each is a grammar stack
    // every candidate token is checked against, per sampled token, on the engine thread
    // (3,000 took 19 s for 4 tokens, every other request waiting).
    size_t max_schema_alternatives = 256;
    // The grammar a request's schemas become, estimated before it is built: every object
    // schema counts its properties plus the square of its optional ones, over every schema
    // of the request (the converter's work; 64 objects of 128 optional properties, about
    // 1.06 million, took 1.1 s on 2 cores). Claude Code's 24 tools count 279.
    size_t max_schema_cost = 262144;
    // The grammar as built (GBNF text), before llama.cpp parses it into a sampler.
    size_t max_grammar_bytes = 4u << 20;
    size_t max_pattern_bytes = 1024;     // one `pattern` of a schema
    size_t max_pattern_nesting = 32;     // parentheses (and brackets) open at once in one `pattern`
};

struct server_options {
    std::string host = "127.0.0.1";
    int port = 8080;                       // 0 = an ephemeral port (tests); see port()
    std::string api_key;                   // non-empty: every route but /health, / and /ui needs
                                           // "Authorization: Bearer <api_key>"
    size_t max_body_bytes = 8u << 20;      // larger request bodies get 413
    // What request bodies may become as parsed JSON (json_parsed_bytes_estimate, checked
    // before parsing): one body (more: 413), and all bodies being read or held at once
    // (more: 503 with Retry-After), so that many large bodies at once cannot take the
    // process's memory.
    uint64_t max_body_json_bytes = uint64_t{128} << 20;
    uint64_t max_json_bytes_in_flight = uint64_t{1} << 30;
    // HTTP threads (each connection holds one while it is open). The scheduler's
    // queue, not the thread pool, must say 429: every job the scheduler holds
    // (n_parallel decoding + max_queue waiting) needs its thread, plus headroom for
    // /health, /metrics and quick answers: min_http_threads(). 0 = exactly that; an
    // explicit value below it is raised to it (options() tells the value in force).
    // Threads start on demand.
    int n_http_threads = 0;
    size_t max_queue = 64;                 // the scheduler's max_queue (scheduler_options)
    std::string cors_origin;               // "" = no CORS; "*" or a comma-separated list
                                           // of origins: OPTIONS preflights are answered
                                           // and responses carry Access-Control-* headers
    // Without an API key, the Host names a request may carry besides IP addresses and
    // localhost (DNS rebinding): "*" = any, or names separated by commas. Unused with a key.
    std::string allowed_hosts;
    int header_timeout_ms = 10000;         // request line + headers, from their first byte
    int body_timeout_ms = 60000;           // the body, from the end of the headers
    int sse_keep_alive_ms = 3000;          // a waiting stream: headers after at most this, then
                                           // an SSE comment (": keep-alive") this often
    std::string model_name;                // id in /v1/models and responses ("" = the
                                           // model file's name without directory)
    int32_t default_max_tokens = 0;        // when a request names no max_tokens (0: to the end of the context)
    int32_t reasoning_budget = -1;         // reasoning tokens of a request that names no budget (-1: none)
    int32_t draft_max = -1;                // draft tokens of a request that names no speculative.n_max
                                           // (0: no drafts; -1: default_draft_max, warmctx/drafts.h)
    bool log_requests = true;              // one JSON line per request on stderr
    // An answer's grammar (tools, a JSON schema) is built off the engine thread, at most
    // grammar_builds at once (0 = half the cores, at least one). A request whose grammar is
    // not built within grammar_deadline_ms (waiting for a turn included) answers 503; one
    // whose client leaves, or whose server stops, stops waiting at once. A build already
    // running is not interrupted (llama.cpp's converter cannot be): the bounds above keep
    // it short, and stop() waits for it.
    int grammar_deadline_ms = 10000;
    unsigned grammar_builds = 0;
    request_bounds bounds;                 // what one chat request may ask for (above)

    // The segment kind table the scheduler's context engine uses (validates PUT
    // segments early; the scheduler checks again when it assembles).
    kind_table kinds;

    // Server-side workspace store bounds (PUT answers 413 for one segment too large,
    // 429 when the store is full).
    size_t max_workspaces = 1024;
    size_t max_segments_per_workspace = 4096;
    size_t max_segment_bytes = 4u << 20;
    size_t max_store_bytes = 256u << 20;   // content + path of every stored segment
    // Where the segment store persists ("" = memory only: a restart forgets it). Loaded
    // when the scheduler is attached; `serve` uses <cache dir>/workspaces.
    std::string workspace_dir;
    // Other servers use workspace_dir too (replicas behind a load balancer sharing one
    // directory): the store re-reads a workspace's files (store/segment_store.h, "Shared").
    bool shared_workspace_dir = false;
    // A label replica="<name>" on every sample of /metrics ("" = none), so that one
    // dashboard tells the replicas behind a load balancer apart.
    std::string replica;
    // Pre-warm a workspace whose stored stable segments changed, this long after its
    // last change (POST .../prewarm: at once), and every stored workspace on start.
    bool prewarm = true;
    int prewarm_delay_ms = 250;
    // Each workspace's prefix cache apart: every request's blocks are salted with its
    // workspace (a request's own cache_salt wins), so no request reuses, or can time,
    // another workspace's blocks. Off: blocks are shared by content (docs/api.md).
    bool isolate_workspaces = false;
};

// Threads /health, /metrics and quick answers (401, 404, 429, the workspace routes)
// get beyond the scheduler's jobs.
inline constexpr int k_http_thread_headroom = 4;
// The fewest HTTP threads for a scheduler with these bounds: n_parallel + max_queue +
// k_http_thread_headroom.
size_t min_http_threads(uint32_t n_parallel, size_t max_queue);

class http_server {
  public:
    static constexpr int k_max_http_threads = 1024;

    // Binds host:port and serves on a background thread, answering 503 "loading" until
    // attach(). Errors: invalid_argument (bad option), io_error (the address cannot be
    // bound, e.g. the port is in use).
    static result<std::unique_ptr<http_server>> start(server_options opts);
    // start(opts), then attach(sched).
    static result<std::unique_ptr<http_server>> start(scheduler & sched, server_options opts);
    ~http_server();  // stop()
    http_server(const http_server &) = delete;
    http_server & operator=(const http_server &) = delete;

    // Serves with `sched` from now on. Errors: invalid_argument (min_http_threads is
    // above k_max_http_threads), failed_precondition (already attached, or stopped).
    // On error the server keeps answering "loading".
    status attach(scheduler & sched);

    // The bound port (the ephemeral one when options.port was 0).
    int port() const;
    // The options in force (n_http_threads resolved by attach()).
    server_options options() const;

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
