// server/route_context.h - what every route handler works with: a plain request, a plain
// response, the request's record, and the server state the routes share. No HTTP
// library here: a handler can be called without a socket (tests/server/routes_test.cpp).
//
// The server's layers:
//   http_server.cpp      the socket (the HTTP library): bind, listen, stop; converts its
//                        requests and responses to and from the types below
//   router.{h,cpp}       the route table, auth, dispatch, the request log line and the
//                        metrics record; the shared plumbing of route_context
//   api/<api>/           one folder per API, each a request mapper (request.cpp), a
//                        renderer (render.cpp) and its routes (routes.cpp): openai
//                        (/v1/chat/completions, /v1/completions, /v1/models), responses
//                        (/v1/responses), anthropic (/v1/messages, count_tokens, GET /),
//                        llama_server (/completion, /tokenize, /detokenize,
//                        /apply-template, /props, /slots), ollama (/api/chat,
//                        /api/generate, /api/tags, /api/show, /api/ps, /api/version)
//   workspace_routes.cpp /v1/workspaces/...: the segment store, explain, pins, tiers
//   completion.{h,cpp}   the one completion path every completion route runs on, over the
//                        API-neutral request (completion_request.h)
//
// Thread safety: route_context's members are safe to call from any HTTP thread (its
// state is atomics, the mutex-guarded store/metrics/channel set, and constants).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "api_error.h"
#include "metrics.h"
#include "completion_request.h"
#include "grammar_builds.h"
#include "prewarmer.h"
#include "request_channel.h"
#include "turn_history.h"
#include "workspace_store.h"
#include "warmctx/scheduler.h"
#include "warmctx/server.h"

namespace warmctx::server_detail {

struct http_request {
    std::string method;                        // GET, POST, PUT, DELETE
    std::string path;                          // without the query
    std::vector<std::string> params;           // the route's captures in order ({id}, {segment}, {model})
    std::map<std::string, std::string> query;  // ?key=value (a key's first value)
    std::string authorization;                 // the Authorization header, "" when absent
    std::string api_key;                       // the x-api-key header (Anthropic's clients), "" when absent
    std::string session_id;                    // the x-claude-code-session-id header, "" when absent
    std::string origin;                        // the Origin header (CORS), "" when absent
    std::string cors_request_headers;          // Access-Control-Request-Headers (preflight)
    std::string host;                          // the Host header, "" when absent
    std::string accept;                        // the Accept header, "" when absent
    // The Content-Type header as the transport received it ("" when absent); nullopt
    // when the request did not come through the transport (a test calling the router),
    // and then no media type is required.
    std::optional<std::string> content_type;
    bool has_body = false;                     // framed: Content-Length > 0, or chunked
    std::string body;
    // True once the client is gone (its connection closed), where the transport can tell;
    // unset: never known. A chat that is not streamed polls it while it waits (a stream
    // learns it at its next write) and cancels its job.
    std::function<bool()> client_gone;
};

// Where a streamed body goes (the transport's connection).
class chunk_sink {
  public:
    virtual ~chunk_sink() = default;
    virtual bool write(std::string_view data) = 0;  // false: the client went away
    virtual void done() = 0;                        // the body is complete
};

struct http_response {
    int status = 200;
    std::vector<std::pair<std::string, std::string>> headers;  // besides Content-Type
    std::string content_type;
    std::string body;
    // A streamed (chunked) body instead of `body`, when set: the transport calls
    // `stream` until it calls done() (the body is complete) or returns false (abandon
    // the response), then `stream_end` exactly once, however the response ended.
    std::function<bool(chunk_sink &)> stream;
    std::function<void()> stream_end;

    // The value of header `name` (exact spelling), "" when absent.
    std::string header(std::string_view name) const;
};

using steady = std::chrono::steady_clock;

// What one request did, for its log line and the metrics. Filled by the handler; a
// stream's is finished by the stream's end, not by the handler's return.
struct request_log {
    std::string method;
    std::string route;               // the route pattern (bounded label set)
    std::string path;                // an unmatched request's path, its first 200 bytes (log line only)
    steady::time_point t_start = steady::now();
    std::string workspace;
    std::string error_code;          // for status >= 400
    int64_t prompt_tokens = -1;      // -1: not a completion (null in the log)
    int64_t tokens_reused = -1;
    int64_t tokens_prefilled = -1;
    int64_t completion_tokens = -1;
    double ttft_ms = -1;
    bool deferred = false;           // a stream: its end calls finish()
    bool finished = false;
};

// Not an HTTP status a server sends: the metrics/log status of a stream whose client
// went away before it ended (nginx's convention).
inline constexpr int k_status_client_closed = 499;

// The state the routes share. One per server (or per test).
// The memory request bodies take as parsed JSON, all at once (estimated before parsing:
// json_parsed_bytes_estimate). A body is parsed only with a ticket for its share, held as
// long as its parsed value lives.
class json_budget {
  public:
    explicit json_budget(uint64_t limit) : limit_(limit) {}
    class ticket {
      public:
        ticket() = default;
        ticket(ticket && o) noexcept : b_(std::exchange(o.b_, nullptr)), n_(o.n_) {}
        ticket & operator=(ticket && o) noexcept {
            if (this != &o) release(), b_ = std::exchange(o.b_, nullptr), n_ = o.n_;
            return *this;
        }
        ticket(const ticket &) = delete;
        ticket & operator=(const ticket &) = delete;
        ~ticket() { release(); }
        void release() noexcept {
            if (b_) b_->used_.fetch_sub(n_, std::memory_order_relaxed);
            b_ = nullptr;
        }

      private:
        friend class json_budget;
        json_budget * b_ = nullptr;
        uint64_t n_ = 0;
    };
    // A share of n bytes into t (releasing what t held), or false when it would pass the limit.
    bool take(uint64_t n, ticket & t) {
        t.release();
        uint64_t used = used_.load(std::memory_order_relaxed);
        do {
            if (n > limit_ || used > limit_ - n) return false;
        } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
        t.b_ = this;
        t.n_ = n;
        return true;
    }
    uint64_t used() const { return used_.load(std::memory_order_relaxed); }
    uint64_t limit() const { return limit_; }

  private:
    const uint64_t limit_;
    std::atomic<uint64_t> used_{0};
};

class route_context {
  public:
    // Serving at once. `sched` is null only in tests of routes that need no engine:
    // engine_call and a completion then answer 503; the /v1/models routes must not be
    // called.
    route_context(scheduler * sched, server_options opts);
    // Loading: the router answers 503 "loading" (but /health and /metrics) until
    // attach().
    explicit route_context(server_options opts);

    // The scheduler is ready: sets sched, limits and model_name, then ends loading.
    // Once, before any handler but /health's and /metrics' runs.
    void attach(scheduler & s);
    // True until attach() (acquire: once false, sched, limits and model_name are set).
    bool loading() const { return loading_.load(std::memory_order_acquire); }

    // The cache salt of a turn of workspace `ws`: the request's own, else the workspace
    // under --isolate-workspaces, else none (blocks shared by content).
    std::string cache_salt(const std::string & ws, const std::string & request_salt) const {
        if (!request_salt.empty()) return "req:" + request_salt;
        return opts.isolate_workspaces ? "ws:" + ws : std::string();
    }

    // Written once, by the constructor or by attach() before loading() turns false;
    // read by handlers only once loading() is false (the router sees to it).
    scheduler * sched = nullptr;
    const server_options opts;
    request_limits limits;
    std::string model_name;
    int64_t t_created = 0;
    workspace_store store;
    server_metrics metrics;
    json_budget json_memory{opts.max_json_bytes_in_flight};  // parse_body's shares
    std::atomic<bool> stopping{false};
    // The last turns answered (GET /v1/status, the page).
    turn_history turns;
    // The threads answer grammars are built on (stopped by stop_background()).
    grammar_builds grammars{opts.grammar_builds};
    // Background pre-warm (null until attach(), or when opts.prewarm is off).
    std::unique_ptr<prewarmer> prewarm;

    // The stable segments (class high or highest: tools, system) a workspace's last chat
    // carried in its request, so that a pre-warm assembles what the next chat will send
    // (an SDK sends its tools with every request). Bounded: max_workspaces entries and
    // max_segment_bytes per workspace (more is not remembered); forget_carried on DELETE.
    void remember_carried(const std::string & ws, std::vector<segment> segs);
    std::vector<segment> carried(const std::string & ws) const;
    void forget_carried(const std::string & ws);

    ~route_context();
    // Stops the pre-warm thread and the grammar builds (before the scheduler stops).
    void stop_background();
    // One JSON line on the request log (stderr), with a timestamp, unless logging is off.
    void log_event(nlohmann::json line);

    // "chatcmpl-" + 16 hex digits, unique in this process and unpredictable across runs.
    std::string next_request_id(const char * prefix);

    // Runs fn on the engine thread. A refused call, or one the scheduler dropped
    // because it stopped meanwhile, is 503.
    maybe_error engine_call(const std::function<void(context_engine &)> & fn);

    // Channels of requests still waiting for the scheduler; stop_channels() (the
    // server stopping) refuses new ones and aborts those registered.
    bool register_channel(const std::shared_ptr<request_channel> & ch);
    void unregister_channel(const std::shared_ptr<request_channel> & ch);
    void stop_channels(const std::string & why);

    // Records the request in the metrics and writes its log line, once (route_context.cpp).
    void finish(request_log & log, int http_status);

  private:
    uint64_t make_disk_room(uint64_t bytes);  // the store's make_room (route_context.cpp)
    std::atomic<bool> loading_{false};
    uint64_t id_salt_ = 0;
    std::atomic<uint64_t> next_id_{1};
    std::mutex live_mu_;
    std::unordered_set<std::shared_ptr<request_channel>> live_;  // guarded by live_mu_
    std::mutex log_mu_;                                          // one log line at a time
    mutable std::mutex carried_mu_;
    std::map<std::string, std::vector<segment>> carried_;        // guarded by carried_mu_
};

// ---- answering -----------------------------------------------------------------------

void send_json(http_response & res, int http_status, const nlohmann::json & j);
// The error object (with Retry-After when the error has one); the log keeps its code.
void respond_error(http_response & res, request_log & log, const api_error & e);
// The same with the body in another API's error shape.
void respond_error_as(http_response & res, request_log & log, const api_error & e, std::string body);

// The error in Anthropic's shape ({"type":"error","error":{"type","message"}}).
void respond_anthropic_error(http_response & res, request_log & log, const api_error & e);
// The error in Ollama's shape ({"error": message}; api/ollama/routes.cpp).
void respond_ollama_error(http_response & res, request_log & log, const api_error & e);

// The request body as JSON, through warmctx::parse_json (UTF-8, nesting depth, exactly
// one value): 400 invalid_utf8 or invalid_json otherwise. Every route that reads a body
// reads it here. Before it is parsed, what it would take in memory is taken from
// ctx.json_memory into `held` (more than opts.max_body_json_bytes alone: 413; more than is
// left: 503 with Retry-After), times `copies` for a route that converts the body into
// another JSON value of its size; `held` must outlive `out` (declare it first).
maybe_error parse_body(route_context & ctx, const http_request & req, nlohmann::json & out, json_budget::ticket & held,
                       unsigned copies = 1);

// ---- the route table -------------------------------------------------------------------

using route_handler =
    std::function<void(const http_request &, http_response &, const std::shared_ptr<request_log> &)>;

// The error shape of a route's API: OpenAI's {"error": {message, type, code, param}},
// Anthropic's {"type": "error", "error": {type, message}}, Ollama's {"error": message}.
enum class error_style { openai, anthropic, ollama };

struct route {
    std::string method;
    std::string pattern;     // the label in metrics, e.g. /v1/workspaces/{id}/segments
    std::string regex_text;  // what the transport matches (the whole path); captures = params
    bool auth = true;        // needs the API key (when the server has one)
    route_handler fn;
    error_style errors = error_style::openai;  // the shape of the router's own refusals
};

using route_table = std::vector<route>;

// Each group appends its routes in the order the transport matches them.
void add_openai_routes(route_table & t, route_context & ctx);
void add_workspace_routes(route_table & t, route_context & ctx);
void add_anthropic_routes(route_table & t, route_context & ctx);
void add_responses_routes(route_table & t, route_context & ctx);
void add_llama_server_routes(route_table & t, route_context & ctx);
void add_ollama_routes(route_table & t, route_context & ctx);
void add_ui_routes(route_table & t, route_context & ctx);  // ui/routes.cpp: /, /ui, /v1/status

// The request -> job -> response flow of every completion route. `path_ws`: the
// workspace of a /v1/workspaces/{id}/chat/completions path (already validated); its
// stored segments are merged in (merge_stored_segments).
void run_completion(route_context & ctx, const http_request & req, http_response & res,
                    const std::shared_ptr<request_log> & log, body_mode mode, const std::string * path_ws);

}  // namespace warmctx::server_detail
