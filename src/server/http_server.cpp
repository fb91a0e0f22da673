// The HTTP server: routes, auth, the request -> job -> response flow, streaming,
// metrics and the per-request log line. See warmctx/server.h and docs/api.md.
#include "warmctx/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <thread>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/json_util.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/request_channel.h"
#include "server/workspace_store.h"
#include "warmctx/assembler.h"

namespace warmctx {

using namespace server_detail;
using json = nlohmann::json;
using steady = std::chrono::steady_clock;

namespace {

// How long a waiting HTTP thread sleeps between looks at its channel. Events wake it
// at once; the timeout only bounds how late it notices a dead client or a stop.
constexpr auto k_poll = std::chrono::milliseconds(100);

// Not an HTTP status a server sends: the metrics/log status of a stream whose client
// went away before it ended (nginx's convention).
constexpr int k_status_client_closed = 499;

// What one request did, for its log line and the metrics. Filled by the handler; a
// stream's is finished by the stream's end, not by the handler's return.
struct request_log {
    std::string method;
    std::string route;               // the route pattern (bounded label set)
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

std::string iso8601_now() {
    auto now = std::chrono::system_clock::now();
    std::time_t t = std::chrono::system_clock::to_time_t(now);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[64];
    size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms));
    return buf;
}

double ms_between(steady::time_point a, steady::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

// Compares without an early exit, so the time taken does not tell how many leading
// bytes of a guessed key were right.
bool constant_time_equal(std::string_view a, std::string_view b) {
    volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
    const size_t n = std::max(a.size(), b.size());
    for (size_t i = 0; i < n; ++i) {
        unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff = diff | static_cast<unsigned char>(x ^ y);
    }
    return diff == 0;
}

void send_json(httplib::Response & res, int http_status, const json & j) {
    res.status = http_status;
    res.set_content(dump_json(j), "application/json");
}

std::string sse(const json & j) { return "data: " + dump_json(j) + "\n\n"; }

std::string model_name_from_path(const std::string & path) {
    auto slash = path.find_last_of('/');
    std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
    auto dot = base.rfind(".gguf");
    if (dot != std::string::npos && dot + 5 == base.size()) base.resize(dot);
    return base.empty() ? "warmctx" : base;
}

}  // namespace

struct http_server::impl {
    using handler_fn = std::function<void(const httplib::Request &, httplib::Response &,
                                          const std::shared_ptr<request_log> &)>;
    struct route {
        std::string method;
        std::string pattern;     // the label in metrics, e.g. /v1/workspaces/{id}/segments
        std::string regex_text;  // what httplib matches (whole path)
        std::regex re;
        bool auth = true;
        handler_fn fn;
    };

    impl(scheduler & s, server_options o)
        : sched(s), opts(std::move(o)),
          store(store_limits{opts.max_workspaces, opts.max_segments_per_workspace, opts.max_segment_bytes,
                             opts.max_store_bytes}) {
        limits.max_tokens_cap = static_cast<int32_t>(std::max<uint32_t>(1, sched.context().n_ctx_seq));
        limits.default_max_tokens = std::max(1, opts.default_max_tokens);
        model_name = opts.model_name.empty() ? model_name_from_path(sched.model().path) : opts.model_name;
        t_created = static_cast<int64_t>(std::time(nullptr));
        id_salt = std::random_device{}();
        id_salt = (id_salt << 32) ^ std::random_device{}();
    }

    scheduler & sched;
    server_options opts;
    request_limits limits;
    std::string model_name;
    int64_t t_created = 0;
    uint64_t id_salt = 0;
    std::atomic<uint64_t> next_id{1};

    httplib::Server svr;
    int bound_port = 0;
    std::thread listener;
    int listen_fd = -1;  // the listening socket, from httplib's socket-options hook

    std::mutex stop_mu;               // serialises stop(); guards stopped
    std::condition_variable stop_cv;
    bool stopped = false;
    std::atomic<bool> stopping{false};

    // Channels of requests still waiting for the scheduler; stop() aborts them.
    std::mutex live_mu;
    std::unordered_set<std::shared_ptr<request_channel>> live;  // guarded by live_mu

    workspace_store store;
    server_metrics metrics;
    std::mutex log_mu;                // one log line at a time
    std::vector<route> routes;

    // ---- plumbing ------------------------------------------------------------

    std::string next_request_id(const char * prefix) {
        uint64_t v = (next_id.fetch_add(1) * 0x9E3779B97F4A7C15ull) ^ id_salt;
        char buf[48];
        std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(v));
        return buf;
    }

    void respond_error(httplib::Response & res, request_log & log, const api_error & e) {
        res.status = e.http_status;
        if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
        res.set_content(e.body(), "application/json");
        log.error_code = e.code;
    }

    bool authorized(const httplib::Request & req) const {
        if (opts.api_key.empty()) return true;
        const std::string h = req.get_header_value("Authorization");
        constexpr std::string_view scheme = "bearer ";
        if (h.size() < scheme.size()) return false;
        for (size_t i = 0; i < scheme.size(); ++i)
            if (std::tolower(static_cast<unsigned char>(h[i])) != scheme[i]) return false;
        std::string_view key = std::string_view(h).substr(scheme.size());
        while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
        return constant_time_equal(key, opts.api_key);
    }

    // Records the request in the metrics and writes its log line (once).
    void finish(request_log & log, int http_status) {
        if (log.finished) return;
        log.finished = true;
        const double duration_ms = ms_between(log.t_start, steady::now());
        request_outcome o;
        o.route = log.route;
        o.status = http_status;
        o.duration_s = duration_ms / 1000.0;
        o.ttft_s = log.ttft_ms >= 0 ? log.ttft_ms / 1000.0 : -1;
        o.prompt_tokens = log.prompt_tokens;
        o.cached_tokens = log.tokens_reused;
        o.prefilled_tokens = log.tokens_prefilled;
        o.completion_tokens = log.completion_tokens;
        metrics.record(o);
        if (!opts.log_requests) return;
        auto opt_int = [](int64_t v) { return v < 0 ? json(nullptr) : json(v); };
        json line = {{"ts", iso8601_now()},
                     {"method", log.method},
                     {"route", log.route},
                     {"status", http_status},
                     {"workspace", log.workspace.empty() ? json(nullptr) : json(log.workspace)},
                     {"prompt_tokens", opt_int(log.prompt_tokens)},
                     {"tokens_reused", opt_int(log.tokens_reused)},
                     {"tokens_prefilled", opt_int(log.tokens_prefilled)},
                     {"completion_tokens", opt_int(log.completion_tokens)},
                     {"ttft_ms", log.ttft_ms < 0 ? json(nullptr) : json(std::round(log.ttft_ms * 1000) / 1000)},
                     {"duration_ms", std::round(duration_ms * 1000) / 1000}};
        if (!log.error_code.empty()) line["error"] = log.error_code;
        std::string s = dump_json(line) + "\n";
        std::lock_guard<std::mutex> lk(log_mu);
        std::fputs(s.c_str(), stderr);
        std::fflush(stderr);
    }

    void dispatch(const route & r, const httplib::Request & req, httplib::Response & res) {
        auto log = std::make_shared<request_log>();
        log->method = req.method;
        log->route = r.pattern;
        try {
            if (r.auth && !authorized(req)) {
                respond_error(res, *log, unauthorized("missing or wrong API key: send \"Authorization: Bearer <key>\""));
            } else {
                r.fn(req, res, log);
            }
        } catch (const std::exception & e) {
            // Nothing a client sends should land here (parsers check types first);
            // this is the boundary that keeps one bad request from hurting others.
            res = httplib::Response{};
            log->deferred = false;
            respond_error(res, *log, server_error(std::string("internal error: ") + e.what()));
        } catch (...) {
            res = httplib::Response{};
            log->deferred = false;
            respond_error(res, *log, server_error("internal error"));
        }
        if (!log->deferred) finish(*log, res.status);
    }

    // httplib's own error responses (no route, wrong method, body too large, bad
    // request line) arrive here with an empty body: give them the OpenAI shape.
    void on_http_error(const httplib::Request & req, httplib::Response & res) {
        if (!res.body.empty()) return;  // ours, already counted and logged
        request_log log;
        log.method = req.method;
        log.route = "unmatched";
        std::string allow;
        for (const auto & r : routes) {
            if (!std::regex_match(req.path, r.re)) continue;
            log.route = r.pattern;
            if (r.method != req.method && allow.find(r.method) == std::string::npos)
                allow += (allow.empty() ? "" : ", ") + r.method;
        }
        api_error e;
        if (res.status == 404 && !allow.empty()) {
            e = method_not_allowed("method " + req.method + " is not allowed on " + log.route + " (allowed: " + allow + ")");
            res.set_header("Allow", allow);
        } else if (res.status == 404) {
            e = not_found_route("no route " + req.method + " " + req.path.substr(0, 200));
        } else if (res.status == 413) {
            e = payload_too_large("request body larger than " + std::to_string(opts.max_body_bytes) + " bytes");
        } else if (res.status >= 500) {
            e = server_error("HTTP error " + std::to_string(res.status));
        } else {
            e = bad_request("bad_request", "malformed HTTP request (status " + std::to_string(res.status) + ")");
            e.http_status = res.status;
        }
        respond_error(res, log, e);
        finish(log, res.status);
    }

    bool register_channel(const std::shared_ptr<request_channel> & ch) {
        std::lock_guard<std::mutex> lk(live_mu);
        if (stopping.load()) return false;
        live.insert(ch);
        return true;
    }
    void unregister_channel(const std::shared_ptr<request_channel> & ch) {
        std::lock_guard<std::mutex> lk(live_mu);
        live.erase(ch);
    }

    maybe_error parse_body(const httplib::Request & req, json & out) {
        if (size_t bad = find_invalid_utf8(req.body); bad != k_utf8_valid)
            return bad_request("invalid_utf8", "request body is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
        if (json_nesting_depth(req.body) > k_max_json_depth)
            return bad_request("invalid_json",
                               "request body nests arrays/objects deeper than " + std::to_string(k_max_json_depth) + " levels");
        try {
            out = json::parse(req.body);
        } catch (const json::exception & e) {
            return bad_request("invalid_json", std::string("request body is not valid JSON: ") + e.what());
        }
        return std::nullopt;
    }

    // Runs fn on the engine thread. A refused call, or one the scheduler dropped
    // because it stopped meanwhile (call() then returns without running fn), is 503.
    maybe_error engine_call(const std::function<void(context_engine &)> & fn) {
        bool ran = false;
        status st = sched.call([&](context_engine & ce) {
            fn(ce);
            ran = true;
        });
        if (st.ok() && ran) return std::nullopt;
        if (st.ok() || st.code() == status_code::failed_precondition)
            return unavailable("the engine is stopping" + (st.ok() ? std::string() : ": " + st.message()), 1);
        return error_from_status(st);
    }

    // ---- completions ---------------------------------------------------------

    struct stream_state {
        impl * self = nullptr;
        std::shared_ptr<request_channel> ch;
        std::shared_ptr<request_log> log;
        response_meta meta;
        bool include_usage = false;
        std::deque<timed_event> pending;
        bool role_sent = false;
        bool finished = false;     // the stream's last chunk was written, or the client left
        completion_usage usage;
    };

    // Writes `data`; on failure (the client went away) cancels the job.
    static bool write_or_cancel(stream_state & st, httplib::DataSink & sink, const std::string & data) {
        if (sink.write(data.data(), data.size())) return true;
        st.ch->cancel();
        st.finished = true;
        st.self->finish(*st.log, k_status_client_closed);
        return false;
    }

    void note_event(request_log & log, const timed_event & te) {
        const completion_event & ev = te.ev;
        if (ev.what == completion_event::kind::delta && log.ttft_ms < 0) log.ttft_ms = ms_between(log.t_start, te.at);
        if (ev.what == completion_event::kind::started || ev.what == completion_event::kind::done) {
            log.prompt_tokens = ev.usage.prompt_tokens;
            log.tokens_reused = ev.usage.cached_tokens;
            log.tokens_prefilled = ev.explain.n_prefilled;
        }
        if (ev.what == completion_event::kind::done) {
            log.completion_tokens = ev.usage.completion_tokens;
            if (log.ttft_ms < 0 && ev.usage.completion_tokens > 0) log.ttft_ms = ev.t_first_token_ms;
        }
    }

    api_error job_error(const status & st) {
        if (st.code() == status_code::cancelled) return unavailable("request cancelled: " + st.message(), 1);
        return error_from_status(st);
    }

    void handle_completion(const httplib::Request & req, httplib::Response & res,
                           const std::shared_ptr<request_log> & log, body_mode mode, const std::string * path_ws) {
        json body;
        if (auto e = parse_body(req, body)) return respond_error(res, *log, *e);
        completion_request cr;
        if (auto e = parse_completion_request(body, mode, limits, cr)) return respond_error(res, *log, *e);
        if (path_ws) {
            if (!cr.workspace.empty() && cr.workspace != *path_ws)
                return respond_error(res, *log,
                                     bad_request("invalid_workspace",
                                                 "the body names workspace '" + cr.workspace + "' but the path names '" +
                                                     *path_ws + "'",
                                                 "workspace"));
            auto stored = store.list(*path_ws);
            if (!stored)
                return respond_error(res, *log,
                                     error_from_status(not_found("workspace '" + *path_ws +
                                                                 "' has no stored segments: PUT "
                                                                 "/v1/workspaces/{id}/segments/{segment} first")));
            cr.segments = merge_stored_segments(std::move(*stored), std::move(cr.segments));
            cr.workspace = *path_ws;
        }
        if (status st = validate_segments(cr.segments, opts.kinds); !st.ok())
            return respond_error(res, *log, error_from_status(st));
        if (cr.workspace.empty()) cr.workspace = derive_workspace(cr.segments);
        log->workspace = cr.workspace;

        auto ch = std::make_shared<request_channel>();
        completion_job job;
        job.turn.workspace = cr.workspace;
        job.turn.segments = std::move(cr.segments);
        job.turn.sampling = cr.sampling;
        job.sink = [ch](const completion_event & ev) { return ch->push(ev); };
        if (!register_channel(ch)) return respond_error(res, *log, unavailable("the server is shutting down", 1));
        // Unregisters on every path out of this function, unless a stream takes over.
        std::shared_ptr<request_channel> registered = ch;
        struct unregister_guard {
            impl * self;
            std::shared_ptr<request_channel> * ch;
            ~unregister_guard() {
                if (*ch) self->unregister_channel(*ch);
            }
        } guard{this, &registered};

        if (status st = sched.submit(std::move(job)); !st.ok()) {
            if (st.code() == status_code::resource_exhausted)
                return respond_error(res, *log,
                                     too_many_requests("queue_full", "the request queue is full: " + st.message() +
                                                                         "; retry after a second", 1));
            if (st.code() == status_code::failed_precondition)
                return respond_error(res, *log, unavailable("the engine is stopping: " + st.message(), 1));
            return respond_error(res, *log, error_from_status(st));
        }

        // Wait for the first event: an error before anything was generated (prompt too
        // long, bad segment) is still a plain HTTP error, even for a stream.
        std::deque<timed_event> pending;
        while (pending.empty())
            for (auto & te : ch->pop_all(k_poll)) pending.push_back(std::move(te));
        if (pending.front().ev.what == completion_event::kind::error)
            return respond_error(res, *log, job_error(pending.front().ev.error));

        response_meta meta;
        meta.shape = cr.shape;
        meta.id = next_request_id(cr.shape == api_shape::chat ? "chatcmpl-" : "cmpl-");
        meta.created = static_cast<int64_t>(std::time(nullptr));
        meta.model = model_name;

        if (!cr.stream) {
            std::string text;
            for (;;) {
                while (!pending.empty()) {
                    timed_event te = std::move(pending.front());
                    pending.pop_front();
                    note_event(*log, te);
                    const completion_event & ev = te.ev;
                    switch (ev.what) {
                        case completion_event::kind::started: break;
                        case completion_event::kind::delta: text += ev.text; break;
                        case completion_event::kind::error: return respond_error(res, *log, job_error(ev.error));
                        case completion_event::kind::done:
                            send_json(res, 200,
                                      completion_response(meta, text, ev.finish, ev.usage,
                                                          warmctx_json(cr.workspace, ev.explain, ev)));
                            return;
                    }
                }
                for (auto & te : ch->pop_all(k_poll)) pending.push_back(std::move(te));
            }
        }

        // Streamed: the provider runs on this HTTP thread after the handler returns;
        // the channel stays registered until the stream ends (the releaser).
        auto st = std::make_shared<stream_state>();
        st->self = this;
        st->ch = ch;
        st->log = log;
        st->meta = meta;
        st->include_usage = cr.include_usage;
        st->pending = std::move(pending);
        log->deferred = true;
        registered.reset();  // the releaser unregisters
        const std::string workspace = cr.workspace;
        res.status = 200;
        res.set_header("Cache-Control", "no-cache");
        res.set_header("X-Accel-Buffering", "no");
        res.set_chunked_content_provider(
            "text/event-stream",
            [st, workspace](size_t /*offset*/, httplib::DataSink & sink) -> bool {
                if (st->finished) return false;
                if (!st->role_sent) {
                    st->role_sent = true;
                    if (st->meta.shape == api_shape::chat &&
                        !write_or_cancel(*st, sink, sse(chunk_role(st->meta, st->include_usage))))
                        return false;
                }
                if (st->pending.empty()) {
                    for (auto & te : st->ch->pop_all(k_poll)) st->pending.push_back(std::move(te));
                    if (st->pending.empty()) return true;  // nothing yet: httplib calls again
                }
                while (!st->pending.empty()) {
                    timed_event te = std::move(st->pending.front());
                    st->pending.pop_front();
                    st->self->note_event(*st->log, te);
                    const completion_event & ev = te.ev;
                    switch (ev.what) {
                        case completion_event::kind::started: break;
                        case completion_event::kind::delta:
                            if (!ev.text.empty() &&
                                !write_or_cancel(*st, sink, sse(chunk_delta(st->meta, ev.text, st->include_usage))))
                                return false;
                            break;
                        case completion_event::kind::done: {
                            std::string out = sse(chunk_finish(st->meta, ev.finish, st->include_usage,
                                                               warmctx_json(workspace, ev.explain, ev)));
                            if (st->include_usage) out += sse(chunk_usage(st->meta, ev.usage));
                            out += "data: [DONE]\n\n";
                            if (!write_or_cancel(*st, sink, out)) return false;
                            st->finished = true;
                            sink.done();
                            st->self->finish(*st->log, 200);
                            return true;
                        }
                        case completion_event::kind::error: {
                            // Headers are sent: the error travels as a data chunk.
                            api_error e = st->self->job_error(ev.error);
                            st->log->error_code = e.code;
                            std::string out = "data: " + e.body() + "\n\ndata: [DONE]\n\n";
                            if (!write_or_cancel(*st, sink, out)) return false;
                            st->finished = true;
                            sink.done();
                            st->self->finish(*st->log, 200);
                            return true;
                        }
                    }
                }
                return true;
            },
            [st](bool /*success*/) {
                // Called once the response is done with, however it ended.
                if (!st->finished) {
                    st->finished = true;
                    st->ch->cancel();
                    st->self->finish(*st->log, k_status_client_closed);
                }
                st->self->unregister_channel(st->ch);
            });
    }

    // ---- workspace routes ----------------------------------------------------

    // The workspace id of a /v1/workspaces/{id}/... path, validated.
    maybe_error path_workspace(const httplib::Request & req, std::string & ws) {
        ws = req.matches.size() > 1 ? std::string(req.matches[1]) : std::string();
        return validate_workspace_id(ws, "path");
    }

    maybe_error path_segment(const httplib::Request & req, std::string & id) {
        id = req.matches.size() > 2 ? std::string(req.matches[2]) : std::string();
        if (size_t bad = find_invalid_utf8(id); bad != k_utf8_valid)
            return bad_request("invalid_segment_id", "segment id is not valid UTF-8", "path");
        if (status st = validate_segment_id(id); !st.ok()) return bad_request("invalid_segment_id", st.message(), "path");
        return std::nullopt;
    }

    std::optional<std::vector<segment>> stored_or_error(const std::string & ws, httplib::Response & res,
                                                        request_log & log) {
        auto segs = store.list(ws);
        if (!segs)
            respond_error(res, log, error_from_status(not_found("workspace '" + ws + "' has no stored segments")));
        return segs;
    }

    void register_routes() {
        auto add = [this](const char * method, const char * pattern, const char * regex, bool auth, handler_fn fn) {
            routes.push_back(route{method, pattern, regex, std::regex(regex), auth, std::move(fn)});
        };
        using req_t = const httplib::Request &;
        using res_t = httplib::Response &;
        using log_t = const std::shared_ptr<request_log> &;

        add("GET", "/health", "/health", false, [this](req_t, res_t res, log_t) {
            if (stopping.load()) send_json(res, 503, {{"status", "stopping"}});
            else send_json(res, 200, {{"status", "ok"}});
        });

        add("GET", "/metrics", "/metrics", true, [this](req_t, res_t res, log_t) {
            engine_snapshot snap;
            snap.sched = sched.stats();
            snap.n_parallel = sched.n_parallel();
            snap.have_counters = !engine_call([&](context_engine & ce) { snap.counters = ce.counters(); });
            snap.store_workspaces = store.workspaces().size();
            snap.store_segments = store.n_segments();
            snap.store_bytes = store.n_bytes();
            res.status = 200;
            res.set_content(metrics.render(snap), "text/plain; version=0.0.4; charset=utf-8");
        });

        auto model_json = [this] {
            const model_info & m = sched.model();
            const context_info & c = sched.context();
            return json{{"id", model_name},
                        {"object", "model"},
                        {"created", t_created},
                        {"owned_by", "warmctx"},
                        {"meta",
                         {{"description", m.description},
                          {"n_params", m.n_params},
                          {"size_bytes", m.size_bytes},
                          {"n_ctx_train", m.n_ctx_train},
                          {"n_ctx_seq", c.n_ctx_seq},
                          {"n_parallel", sched.n_parallel()},
                          {"chunk_tokens", c.chunk_tokens},
                          {"kv_type", c.kv_type},
                          {"kv_mode", kv_mode_name(c.mode)},
                          {"backend", c.backend}}}};
        };
        add("GET", "/v1/models", "/v1/models", true, [model_json](req_t, res_t res, log_t) {
            send_json(res, 200, {{"object", "list"}, {"data", json::array({model_json()})}});
        });
        add("GET", "/v1/models/{model}", "/v1/models/([^/]+)", true, [this, model_json](req_t req, res_t res, log_t log) {
            if (std::string(req.matches[1]) != model_name)
                return respond_error(res, *log, error_from_status(not_found("no model '" + std::string(req.matches[1]).substr(0, 100) +
                                                                            "' (this server serves '" + model_name + "')"),
                                                                  "model"));
            send_json(res, 200, model_json());
        });

        add("POST", "/v1/chat/completions", "/v1/chat/completions", true, [this](req_t req, res_t res, log_t log) {
            handle_completion(req, res, log, body_mode::chat, nullptr);
        });
        add("POST", "/v1/completions", "/v1/completions", true, [this](req_t req, res_t res, log_t log) {
            handle_completion(req, res, log, body_mode::text, nullptr);
        });

        // -- workspaces --
        add("GET", "/v1/workspaces", "/v1/workspaces", true, [this](req_t, res_t res, log_t) {
            json data = json::array();
            for (const std::string & ws : store.workspaces()) data.push_back({{"id", ws}, {"object", "workspace"}});
            send_json(res, 200, {{"object", "list"}, {"data", std::move(data)}});
        });
        add("GET", "/v1/workspaces/{id}", "/v1/workspaces/([^/]+)", true, [this](req_t req, res_t res, log_t log) {
            std::string ws;
            if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
            log->workspace = ws;
            auto segs = stored_or_error(ws, res, *log);
            if (!segs) return;
            json ids = json::array();
            size_t bytes = 0;
            for (const segment & s : *segs) {
                ids.push_back(s.id);
                bytes += s.content.size();
            }
            send_json(res, 200, {{"id", ws}, {"object", "workspace"}, {"segments", std::move(ids)}, {"content_bytes", bytes}});
        });
        add("DELETE", "/v1/workspaces/{id}", "/v1/workspaces/([^/]+)", true, [this](req_t req, res_t res, log_t log) {
            std::string ws;
            if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
            log->workspace = ws;
            size_t n = store.drop(ws);
            if (auto e = engine_call([&](context_engine & ce) { ce.drop_workspace(ws); })) return respond_error(res, *log, *e);
            send_json(res, 200, {{"id", ws}, {"object", "workspace"}, {"deleted", true}, {"segments_deleted", n}});
        });
        add("GET", "/v1/workspaces/{id}/segments", "/v1/workspaces/([^/]+)/segments", true,
            [this](req_t req, res_t res, log_t log) {
                std::string ws;
                if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
                log->workspace = ws;
                auto segs = stored_or_error(ws, res, *log);
                if (!segs) return;
                json data = json::array();
                for (const segment & s : *segs) data.push_back(segment_json(s));
                send_json(res, 200, {{"object", "list"}, {"workspace", ws}, {"data", std::move(data)}});
            });
        add("PUT", "/v1/workspaces/{id}/segments/{segment}", "/v1/workspaces/([^/]+)/segments/(.+)", true,
            [this](req_t req, res_t res, log_t log) {
                std::string ws, id;
                if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
                log->workspace = ws;
                if (auto e = path_segment(req, id)) return respond_error(res, *log, *e);
                json body;
                if (auto e = parse_body(req, body)) return respond_error(res, *log, *e);
                segment seg;
                if (auto e = parse_segment_body(body, id, "", seg)) return respond_error(res, *log, *e);
                if (seg.kind == segment_kind::user)
                    return respond_error(res, *log,
                                         bad_request("invalid_kind",
                                                     "a stored segment cannot be of kind user (this turn's question "
                                                     "travels with the chat request)",
                                                     "kind"));
                if (status st = validate_segments(std::span<const segment>(&seg, 1), opts.kinds); !st.ok())
                    return respond_error(res, *log, error_from_status(st));
                bool created = false;
                json summary = {{"workspace", ws},
                                {"id", seg.id},
                                {"kind", segment_kind_name(seg.kind)},
                                {"content_bytes", seg.content.size()}};
                if (auto e = store.put(ws, std::move(seg), created)) return respond_error(res, *log, *e);
                summary["created"] = created;
                send_json(res, created ? 201 : 200, summary);
            });
        add("GET", "/v1/workspaces/{id}/segments/{segment}", "/v1/workspaces/([^/]+)/segments/(.+)", true,
            [this](req_t req, res_t res, log_t log) {
                std::string ws, id;
                if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
                log->workspace = ws;
                if (auto e = path_segment(req, id)) return respond_error(res, *log, *e);
                auto seg = store.get(ws, id);
                if (!seg)
                    return respond_error(res, *log,
                                         error_from_status(not_found("no segment '" + id + "' in workspace '" + ws + "'")));
                json j = segment_json(*seg);
                j["workspace"] = ws;
                send_json(res, 200, j);
            });
        add("DELETE", "/v1/workspaces/{id}/segments/{segment}", "/v1/workspaces/([^/]+)/segments/(.+)", true,
            [this](req_t req, res_t res, log_t log) {
                std::string ws, id;
                if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
                log->workspace = ws;
                if (auto e = path_segment(req, id)) return respond_error(res, *log, *e);
                if (!store.erase(ws, id))
                    return respond_error(res, *log,
                                         error_from_status(not_found("no segment '" + id + "' in workspace '" + ws + "'")));
                send_json(res, 200, {{"workspace", ws}, {"id", id}, {"deleted", true}});
            });
        add("GET", "/v1/workspaces/{id}/manifest", "/v1/workspaces/([^/]+)/manifest", true,
            [this](req_t req, res_t res, log_t log) {
                std::string ws;
                if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
                log->workspace = ws;
                auto segs = stored_or_error(ws, res, *log);
                if (!segs) return;
                turn_request tr;
                tr.workspace = ws;
                tr.segments = std::move(*segs);
                tr.add_generation_prompt = false;  // the stored context itself
                std::optional<result<assembled_prompt>> r;
                if (auto e = engine_call([&](context_engine & ce) { r.emplace(ce.assemble_request(tr)); }))
                    return respond_error(res, *log, *e);
                if (!r->ok()) return respond_error(res, *log, error_from_status(r->error()));
                json j = (*r)->man.to_json();
                j["workspace"] = ws;
                send_json(res, 200, j);
            });
        add("GET", "/v1/workspaces/{id}/explain", "/v1/workspaces/([^/]+)/explain", true,
            [this](req_t req, res_t res, log_t log) {
                std::string ws;
                if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
                log->workspace = ws;
                auto segs = stored_or_error(ws, res, *log);
                if (!segs) return;
                turn_request tr;
                tr.workspace = ws;
                tr.segments = std::move(*segs);
                if (req.has_param("question")) {
                    std::string q = req.get_param_value("question");
                    if (find_invalid_utf8(q) != k_utf8_valid)
                        return respond_error(res, *log, bad_request("invalid_utf8", "question is not valid UTF-8", "question"));
                    if (!q.empty()) tr.segments.push_back(segment{"user", segment_kind::user, "", "", std::move(q)});
                }
                std::optional<result<explain_report>> r;
                if (auto e = engine_call([&](context_engine & ce) { r.emplace(ce.explain(tr)); }))
                    return respond_error(res, *log, *e);
                if (!r->ok()) return respond_error(res, *log, error_from_status(r->error()));
                send_json(res, 200, (*r)->to_json());
            });
        for (bool pin : {true, false}) {
            add("POST", pin ? "/v1/workspaces/{id}/pin" : "/v1/workspaces/{id}/unpin",
                pin ? "/v1/workspaces/([^/]+)/pin" : "/v1/workspaces/([^/]+)/unpin", true,
                [this, pin](req_t req, res_t res, log_t log) {
                    std::string ws;
                    if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
                    log->workspace = ws;
                    status st;
                    if (auto e = engine_call([&](context_engine & ce) { st = ce.pin_workspace(ws, pin); }))
                        return respond_error(res, *log, *e);
                    if (!st.ok()) return respond_error(res, *log, error_from_status(st));
                    send_json(res, 200, {{"workspace", ws}, {"pinned", pin}});
                });
        }
        // Tiers: snapshot now, suspend (snapshot + drop from the engine), resume.
        struct tier_op {
            const char * route;
            const char * regex;
            const char * name;
            status (context_engine::*fn)(const std::string &);
        };
        static const tier_op k_tier_ops[] = {
            {"/v1/workspaces/{id}/snapshot", "/v1/workspaces/([^/]+)/snapshot", "snapshot", &context_engine::snapshot_workspace},
            {"/v1/workspaces/{id}/suspend", "/v1/workspaces/([^/]+)/suspend", "suspend", &context_engine::suspend_workspace},
            {"/v1/workspaces/{id}/resume", "/v1/workspaces/([^/]+)/resume", "resume", &context_engine::resume_workspace},
        };
        for (const tier_op & op : k_tier_ops) {
            add("POST", op.route, op.regex, true, [this, &op](req_t req, res_t res, log_t log) {
                std::string ws;
                if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
                log->workspace = ws;
                status st;
                if (auto e = engine_call([&](context_engine & ce) { st = (ce.*op.fn)(ws); }))
                    return respond_error(res, *log, *e);
                if (!st.ok()) return respond_error(res, *log, error_from_status(st));
                send_json(res, 200, {{"workspace", ws}, {"done", op.name}});
            });
        }
        // Branch: a new workspace starting from this one's last turn and stored segments;
        // body {"to": "<new id>"}.
        add("POST", "/v1/workspaces/{id}/branch", "/v1/workspaces/([^/]+)/branch", true,
            [this](req_t req, res_t res, log_t log) {
                std::string ws;
                if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
                log->workspace = ws;
                json body = json::parse(req.body, nullptr, false);
                if (body.is_discarded() || !body.is_object() || !body.contains("to") || !body["to"].is_string())
                    return respond_error(res, *log, bad_request("invalid_request", "body must be {\"to\": \"<workspace id>\"}", "to"));
                const std::string to = body["to"].get<std::string>();
                if (auto e = validate_workspace_id(to, "to")) return respond_error(res, *log, *e);
                status st;
                if (auto e = engine_call([&](context_engine & ce) { st = ce.branch_workspace(ws, to); }))
                    return respond_error(res, *log, *e);
                if (!st.ok()) return respond_error(res, *log, error_from_status(st));
                if (auto segs = store.list(ws)) {
                    for (auto & sg : *segs) {
                        bool created = false;
                        if (auto e = store.put(to, sg, created)) return respond_error(res, *log, *e);
                    }
                }
                send_json(res, 200, {{"workspace", ws}, {"branch", to}});
            });
        add("POST", "/v1/workspaces/{id}/chat/completions", "/v1/workspaces/([^/]+)/chat/completions", true,
            [this](req_t req, res_t res, log_t log) {
                std::string ws;
                if (auto e = path_workspace(req, ws)) return respond_error(res, *log, *e);
                log->workspace = ws;
                handle_completion(req, res, log, body_mode::workspace_chat, &ws);
            });

        for (size_t i = 0; i < routes.size(); ++i) {
            const route * r = &routes[i];
            auto h = [this, r](const httplib::Request & req, httplib::Response & res) { dispatch(*r, req, res); };
            if (r->method == "GET") svr.Get(r->regex_text, h);
            else if (r->method == "POST") svr.Post(r->regex_text, h);
            else if (r->method == "PUT") svr.Put(r->regex_text, h);
            else if (r->method == "DELETE") svr.Delete(r->regex_text, h);
        }
    }
};

result<std::unique_ptr<http_server>> http_server::start(scheduler & sched, server_options opts) {
    if (opts.port < 0 || opts.port > 65535) return invalid_argument("port must be in [0, 65535]");
    if (opts.n_http_threads < 1 || opts.n_http_threads > 1024) return invalid_argument("HTTP threads must be in [1, 1024]");
    if (opts.max_body_bytes == 0) return invalid_argument("max body bytes must be positive");
    if (opts.host.empty()) return invalid_argument("host is empty");

    // A client that disconnects mid-stream must be a failed write, not a signal.
    std::signal(SIGPIPE, SIG_IGN);

    auto p = std::make_unique<impl>(sched, std::move(opts));
    impl & s = *p;
    const int n_threads = s.opts.n_http_threads;
    s.svr.new_task_queue = [n_threads] { return new httplib::ThreadPool(static_cast<size_t>(n_threads)); };
    // httplib's default sets SO_REUSEPORT, which lets a second server bind the same port
    // and silently take half the connections; SO_REUSEADDR alone still allows a quick
    // restart (TIME_WAIT) but makes a port in use an error.
    s.svr.set_socket_options([&s](socket_t sock) {
        int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
        s.listen_fd = sock;
    });
    // Responses and SSE chunks are small writes: without TCP_NODELAY, Nagle's algorithm
    // meets the client's delayed ACK and each one waits ~40 ms.
    s.svr.set_tcp_nodelay(true);
    s.svr.set_payload_max_length(s.opts.max_body_bytes);
    s.svr.set_write_timeout(10, 0);
    s.svr.set_keep_alive_timeout(5);
    s.svr.set_error_handler([&s](const httplib::Request & req, httplib::Response & res) { s.on_http_error(req, res); });
    s.svr.set_exception_handler([&s](const httplib::Request &, httplib::Response & res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
            if (ep) std::rethrow_exception(ep);
        } catch (const std::exception & e) {
            what += std::string(": ") + e.what();
        } catch (...) {
        }
        request_log log;
        s.respond_error(res, log, server_error(what));
    });
    s.register_routes();

    if (s.opts.port == 0) {
        int port = s.svr.bind_to_any_port(s.opts.host);
        if (port < 0) return io_error("cannot bind " + s.opts.host + " (any port)");
        s.bound_port = port;
    } else {
        if (!s.svr.bind_to_port(s.opts.host, s.opts.port))
            return io_error("cannot bind " + s.opts.host + ":" + std::to_string(s.opts.port) +
                            " (in use, or not an address of this machine)");
        s.bound_port = s.opts.port;
    }
    // Debian's httplib listens with a backlog of 5 (compiled in): a burst of clients
    // then overflows the accept queue and connections are dropped. listen() again on the
    // bound socket raises the backlog.
    if (s.listen_fd >= 0) ::listen(s.listen_fd, SOMAXCONN);
    s.listener = std::thread([&s] { s.svr.listen_after_bind(); });
    return std::unique_ptr<http_server>(new http_server(std::move(p)));
}

http_server::http_server(std::unique_ptr<impl> p) : p_(std::move(p)) {}

http_server::~http_server() { stop(); }

int http_server::port() const { return p_->bound_port; }

const server_options & http_server::options() const { return p_->opts; }

void http_server::stop() {
    std::unique_lock<std::mutex> lk(p_->stop_mu);
    if (p_->stopped) return;
    {
        std::lock_guard<std::mutex> lk2(p_->live_mu);
        p_->stopping = true;
        for (const auto & ch : p_->live) ch->abort("the server is shutting down");
    }
    p_->svr.stop();
    if (p_->listener.joinable()) p_->listener.join();
    p_->stopped = true;
    p_->stop_cv.notify_all();
}

void http_server::wait() {
    std::unique_lock<std::mutex> lk(p_->stop_mu);
    p_->stop_cv.wait(lk, [&] { return p_->stopped; });
}

}  // namespace warmctx
