// The HTTP server's socket: cpp-httplib's set-up, bind/listen/stop, the conversion of its
// requests and responses to the plain types the routes use (route_context.h), and what
// the library does not bound by itself: how long and how much a client may send, and
// who gets a thread. Routes, auth, dispatch and the per-request record are the router's
// (router.h). See warmctx/server.h and docs/api.md.
//
// Each connection is served by our own loop (guarded_server::process_and_close_socket)
// over our own stream (conn_stream), so that every byte the library reads passes one
// place that knows what the connection is doing (conn_phase):
//
//   idle      waiting for the next request (keep-alive)      sheddable
//   headers   request line + headers: a deadline from the first byte, a byte cap
//   routing   headers parsed, nothing read until a handler asks (a body the library
//             would read on its own, e.g. for a method we route nowhere, fails)
//   body      a handler reads the body: a deadline, a wire-byte cap, and the handler's
//             running count of decoded bytes against max_body_bytes
//   handling  the route runs and answers                        never shed
//   closing   after a refused body: a short drain so that the client sees the answer
//
// The thread pool (conn_pool) starts threads on demand up to the limit; when a new
// connection finds none free, it takes the thread of the sheddable connection that has
// waited longest (conn_registry::shed_one), so trickling clients cannot starve /health.
//
// Built against Debian's cpp-httplib 0.11 and llama.cpp's vendored one (0.5x): their
// Stream and process_request differ, the rest is the same API.
#include "warmctx/server.h"

#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

#include "http_connections.h"
#include "http_framing.h"
#include "router.h"


namespace warmctx {

using namespace server_detail;

size_t min_http_threads(uint32_t n_parallel, size_t max_queue) {
    return static_cast<size_t>(n_parallel) + max_queue + static_cast<size_t>(k_http_thread_headroom);
}

namespace {

using namespace server_detail::transport;

// The client closed its side, or the connection broke: a peek finds the end of the stream
// (bytes it pipelined behind the request are no sign of leaving).
bool peer_gone(socket_t fd) {
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP)) return true;
    char b;
    return ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

uint64_t content_length(const httplib::Request & req, bool & valid) {
    valid = true;
    if (!req.has_header("Content-Length")) return 0;
    const std::string v = req.get_header_value("Content-Length");
    char * end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    valid = !v.empty() && end && *end == '\0' && errno == 0 && v.find('-') == std::string::npos;
    return valid ? n : 0;
}

// The server with our connection loop.
class guarded_server final : public httplib::Server {
  public:
    guarded_server(conn_registry & reg, const server_options & o) : reg_(reg), opts_(o) {}

    // The answer to a head check_request_head refused, and to a connection shed while a
    // request was on its way (set once, before listening).
    std::function<std::string(const std::string & reason)> refused_head_answer;
    std::function<std::string()> busy_answer;

  private:
    bool process_and_close_socket(socket_t sock) override {
        conn_state c;
        c.fd = sock;
        reg_.add(c);
        bool ret = false;
        t_conn = &c;
        try {
            ret = serve_connection(c);
        } catch (...) {
            ret = false;  // a throw outside routing (e.g. in a stream's writer): drop this connection only
        }
        t_conn = nullptr;
        if (c.body_framed && !c.body_consumed && !c.shed.load()) linger(c);
        reg_.remove(c);
        ::shutdown(sock, SHUT_RDWR);
        ::close(sock);
        return ret;
    }

    bool serve_connection(conn_state & c) {
        using std::chrono::seconds;
        using std::chrono::microseconds;
        const auto rt =
            std::chrono::duration_cast<milliseconds>(seconds(read_timeout_sec_) + microseconds(read_timeout_usec_));
        const auto wt =
            std::chrono::duration_cast<milliseconds>(seconds(write_timeout_sec_) + microseconds(write_timeout_usec_));
        conn_stream strm(c, svr_sock_, rt, wt);
#if WARMCTX_HTTPLIB_V2
        std::string remote_addr, local_addr;
        int remote_port = 0, local_port = 0;
        strm.get_remote_ip_and_port(remote_addr, remote_port);
        strm.get_local_ip_and_port(local_addr, local_port);
#endif
        const auto setup = [this, &c](httplib::Request & req) { on_headers(c, req); };
        bool ret = false;
        for (size_t count = keep_alive_max_count_; count > 0; --count) {
            // A connection waiting for a thread gets this one rather than a keep-alive
            // that has not sent its next request.
            if (count != keep_alive_max_count_ && reg_.starved.load() && !strm.input_now()) {
                close_idle(strm, c);
                break;
            }
            if (!strm.wait_request(std::chrono::duration_cast<milliseconds>(seconds(keep_alive_timeout_sec_)))) {
                // Shed before its first request, or with the next one arriving: a 503,
                // never a silent close. An idle keep-alive closes (close_idle).
                if (c.shed.load() && c.n_requests == 0) answer_busy(strm, c);
                else if (c.shed.load()) close_idle(strm, c);
                break;
            }
            reg_.enter(c, conn_phase::headers, milliseconds(opts_.header_timeout_ms), k_max_header_bytes);
            c.body_framed = c.body_consumed = c.said_close = false;
            // Framing the library could read otherwise than a proxy in front of us:
            // refused, and the connection ends, so no byte after the head is ever
            // taken for a request.
            const head_verdict hv = strm.read_head();
            if (hv.kind == head_verdict::refused) {
                reg_.enter(c, conn_phase::handling);
                write_all(strm, refused_head_answer(hv.reason));
                c.body_framed = true;  // whatever follows is unread: linger, then close
                ret = false;
                break;
            }
            if (hv.kind == head_verdict::incomplete && c.shed.load()) {
                answer_busy(strm, c);
                ret = false;
                break;
            }
            bool connection_closed = false;
#if WARMCTX_HTTPLIB_V2
            ret = process_request(strm, remote_addr, remote_port, local_addr, local_port, count == 1,
                                  connection_closed, setup);
#else
            ret = process_request(strm, count == 1, connection_closed, setup);
#endif
            ++c.n_requests;
            reg_.enter(c, conn_phase::idle);
            if (!ret || connection_closed) break;
            if (c.must_close()) {  // shed while the answer went out: it did not say close
                if (!c.said_close) close_idle(strm, c);
                break;
            }
        }
        return ret;
    }

    static void write_all(conn_stream & strm, const std::string & data) {
        for (size_t off = 0; off < data.size();) {
            const ssize_t n = strm.write(data.data() + off, data.size() - off);
            if (n <= 0) break;
            off += static_cast<size_t>(n);
        }
    }

    // A shed connection with a request on its way: 503 with Retry-After, then a drain of
    // what is already on its way (10 ms at most: another connection waits for this
    // thread), so that closing sends a FIN after the answer rather than a reset that
    // could overtake it.
    void answer_busy(conn_stream & strm, conn_state & c) {
        reg_.enter(c, conn_phase::handling);
        write_all(strm, busy_answer());
        ::shutdown(c.fd, SHUT_WR);
        const auto until = steady_clock::now() + milliseconds(10);  // what is on its way; the thread is wanted
        size_t drained = 0;
        char buf[16384];
        while (drained < (64u << 10) && wait_fd(c.fd, POLLIN, until, [] { return false; })) {
            const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            drained += static_cast<size_t>(n);
        }
    }

    // A kept-alive connection given up between requests. Its client may have sent the next
    // request already, before it could see a close: that request gets a 503 with
    // Retry-After rather than a connection closed under it. It is looked for a moment
    // (k_idle_grace), a request sent at once after the last answer is here by then; a
    // client that sends later finds the connection closed before it writes, and opens a
    // new one, as HTTP clients do.
    void close_idle(conn_stream & strm, conn_state & c) {
        if (strm.input_now() ||
            wait_fd(c.fd, POLLIN, steady_clock::now() + k_idle_grace, [] { return false; }))
            answer_busy(strm, c);
    }

    // The headers are in: nothing more is read until a handler asks for the body.
    void on_headers(conn_state & c, httplib::Request & req) {
        reg_.enter(c, conn_phase::routing);
        bool valid = true;
        c.body_framed = req.has_header("Transfer-Encoding") || content_length(req, valid) > 0 || !valid;
        // Bodies are read as JSON (the router checks the label): the library must not
        // read a form (8 KB limit) or split multipart parts.
        c.content_type = req.get_header_value("Content-Type");
        req.headers.erase("Content-Type");
    }

    // After answering a request whose body was not read: stop sending, then read and
    // drop what the client still sends for a moment, so that it sees the answer rather
    // than a reset.
    void linger(conn_state & c) {
        reg_.enter(c, conn_phase::closing);
        ::shutdown(c.fd, SHUT_WR);
        const auto until = steady_clock::now() + k_linger;
        size_t drained = 0;
        char buf[16384];
        while (drained < k_linger_bytes &&
               wait_fd(c.fd, POLLIN, until, [&c] { return c.shed.load(); })) {
            const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            drained += static_cast<size_t>(n);
        }
    }

    conn_registry & reg_;
    const server_options & opts_;
};

http_request from_httplib(const httplib::Request & req) {
    http_request r;
    r.method = req.method;
    r.path = req.path;
    for (size_t i = 1; i < req.matches.size(); ++i) r.params.push_back(req.matches[i].str());
    for (const auto & [k, v] : req.params) r.query.emplace(k, v);  // a key's first value wins
    r.authorization = req.get_header_value("Authorization");
    r.api_key = req.get_header_value("x-api-key");
    r.session_id = req.get_header_value("x-claude-code-session-id");
    r.origin = req.get_header_value("Origin");
    r.accept = req.get_header_value("Accept");
    r.cors_request_headers = req.get_header_value("Access-Control-Request-Headers");
    r.host = req.get_header_value("Host");
    if (t_conn) {
        r.content_type = t_conn->content_type;
        r.has_body = t_conn->body_framed;
    }
    return r;
}

// httplib's connection, as the routes' chunk_sink.
class data_sink_adapter final : public chunk_sink {
  public:
    explicit data_sink_adapter(httplib::DataSink & s) : s_(s) {}
    bool write(std::string_view data) override { return s_.write(data.data(), data.size()); }
    void done() override { s_.done(); }

  private:
    httplib::DataSink & s_;
};

void to_httplib(http_response && r, httplib::Response & res) {
    res.status = r.status;
    for (const auto & [k, v] : r.headers) res.set_header(k, v);
    if (!r.stream) {
        if (!r.content_type.empty()) res.set_content(r.body, r.content_type);
        return;
    }
    res.set_chunked_content_provider(
        r.content_type,
        [stream = std::move(r.stream)](size_t /*offset*/, httplib::DataSink & sink) {
            data_sink_adapter s(sink);
            return stream(s);
        },
        [end = std::move(r.stream_end)](bool /*success*/) {
            if (end) end();
        });
}

}  // namespace

struct http_server::impl {
    explicit impl(server_options o) : ctx(std::move(o)), routes(ctx), reg(ctx.metrics), svr(reg, ctx.opts) {}

    route_context ctx;
    router routes;
    conn_registry reg;
    guarded_server svr;
    std::atomic<size_t> max_threads{1};
    int bound_port = 0;
    std::thread listener;
    std::atomic<bool> listener_done{false};
    int listen_fd = -1;  // the listening socket, from httplib's socket-options hook

    std::mutex stop_mu;  // serialises stop() and attach(); guards stopped, attached
    std::condition_variable stop_cv;
    bool stopped = false;
    bool attached = false;

    // Reads the body of a request to `r` through a running count; an error (nothing
    // dispatched) when it is too large, too slow, or not readable.
    maybe_error read_body(conn_state & c, const httplib::Request & req, httplib::Response & res,
                          const httplib::ContentReader & reader, std::string & body) {
        const size_t max = ctx.opts.max_body_bytes;
        const auto too_large = [&] {
            return payload_too_large("request body larger than " + std::to_string(max) + " bytes");
        };
        bool valid = true;
        if (content_length(req, valid) > max) return too_large();
        // The wire may carry a little more than the body: chunk-size lines.
        reg.enter(c, conn_phase::body, milliseconds(ctx.opts.body_timeout_ms), max + max / 4 + (64u << 10));
        bool over = false;
        const bool ok = reader([&](const char * data, size_t n) {
            if (n > max - body.size()) {
                over = true;
                return false;
            }
            body.append(data, n);
            return true;
        });
        reg.enter(c, conn_phase::handling);
        if (over || c.over_cap || res.status == 413) return too_large();
        if (c.shed.load()) return busy_error();
        if (c.timed_out)
            return request_timeout("the request body did not arrive within " +
                                   std::to_string(ctx.opts.body_timeout_ms) + " ms");
        if (!ok) {
            if (res.status == 415) {
                api_error e = bad_request("unsupported_content_encoding", "unsupported Content-Encoding");
                e.http_status = 415;
                return e;
            }
            return bad_request("bad_request", "the request body could not be read (malformed chunked encoding, "
                                              "or the connection closed before its end)");
        }
        c.body_consumed = true;
        return std::nullopt;
    }

    // Every routed request. `reader`: the route takes a body (POST, PUT, DELETE).
    void serve(const route & r, const httplib::Request & req, httplib::Response & res,
               const httplib::ContentReader * reader) {
        http_request in = from_httplib(req);
        http_response out;
        conn_state * c = t_conn;
        if (c && c->body_framed) {
            if (routes.refuse_early(r, in, out)) return answer(std::move(out), res);
            if (reader) {
                if (auto e = read_body(*c, req, res, *reader, in.body)) {
                    routes.refuse(r, in, *e, out);
                    return answer(std::move(out), res);
                }
            }
        }
        if (c) {
            reg.enter(*c, conn_phase::handling);
            // A route that waits for its answer asks, and cancels its job when the
            // client has left (the library never tells a handler).
            in.client_gone = [fd = c->fd] { return peer_gone(fd); };
        }
        routes.dispatch(r, in, out);
        answer(std::move(out), res);
    }

    void answer(http_response && out, httplib::Response & res) {
        // A refused request (malformed, too large, too slow) ends its connection: what
        // the client sent after it is never read as another request.
        const bool refused = out.status == 400 || out.status == 408 || out.status == 413 || out.status == 431;
        to_httplib(std::move(out), res);
        if (t_conn && refused) t_conn->close_after = true;
        // Another connection waits for a thread: this one says it closes with this answer,
        // so its client opens a new connection rather than writing into one being closed.
        // So does one shed while its request was read.
        if (t_conn && (reg.starved.load() || t_conn->shed.load())) t_conn->close_after = true;
        // Whatever ends the connection after this answer (a body left unread too) is said
        // in it: the client never writes into a connection being closed.
        if (t_conn && t_conn->must_close()) {
            res.set_header("Connection", "close");
            t_conn->said_close = true;
        }
    }

    static api_error busy_error() {
        api_error e = unavailable("too many connections: this one was closed to serve another; retry after "
                                  "Retry-After seconds",
                                  1);
        e.code = "server_busy";
        return e;
    }

    // The whole answer (status line to body) to a connection shed with a request coming.
    std::string busy_answer() { return raw_answer(busy_error(), "busy"); }

    // The whole answer (status line to body) to a head that check_request_head refused.
    std::string refused_head_answer(const std::string & reason) {
        return raw_answer(bad_request("malformed_request", "malformed HTTP request: " + reason), "malformed");
    }

    std::string raw_answer(const api_error & e, const char * label) {
        http_response out;
        routes.refuse_head(e, out, label);
        std::string a = "HTTP/1.1 " + std::to_string(out.status) +
                        (out.status == 503 ? " Service Unavailable\r\n" : " Bad Request\r\n");
        for (const auto & [k, v] : out.headers) a += k + ": " + v + "\r\n";
        a += "Content-Type: " + out.content_type + "\r\nContent-Length: " + std::to_string(out.body.size()) +
             "\r\nConnection: close\r\n\r\n" + out.body;
        return a;
    }

    // Any path and method no route takes (the body is never read).
    void serve_unmatched(const httplib::Request & req, httplib::Response & res) {
        if (t_conn) reg.enter(*t_conn, conn_phase::handling);
        http_request in = from_httplib(req);
        http_response out;
        if (req.method == "OPTIONS") {
            routes.preflight(in, out);
        } else {
            out.status = 404;
            routes.unmatched(in, out);
        }
        answer(std::move(out), res);
    }

    // httplib's own error responses (no route, bad request line, headers too slow)
    // arrive here with an empty body: give them the OpenAI shape.
    void on_http_error(const httplib::Request & req, httplib::Response & res) {
        if (!res.body.empty()) return;  // ours, already counted and logged
        http_response out;
        out.status = t_conn && t_conn->timed_out ? 408 : res.status;
        routes.unmatched(from_httplib(req), out);
        answer(std::move(out), res);
    }

    void set_threads(size_t n_parallel) {
        const size_t need = min_http_threads(n_parallel, ctx.opts.max_queue);
        max_threads = std::max<size_t>(static_cast<size_t>(std::max(0, ctx.opts.n_http_threads)), need);
    }
};

result<std::unique_ptr<http_server>> http_server::start(server_options opts) {
    if (opts.port < 0 || opts.port > 65535) return invalid_argument("port must be in [0, 65535]");
    if (opts.n_http_threads < 0 || opts.n_http_threads > k_max_http_threads)
        return invalid_argument("HTTP threads must be in [0, " + std::to_string(k_max_http_threads) +
                                "] (0 = derived)");
    if (opts.max_body_bytes == 0) return invalid_argument("max body bytes must be positive");
    if (opts.host.empty()) return invalid_argument("host is empty");
    if (opts.header_timeout_ms <= 0 || opts.body_timeout_ms <= 0) return invalid_argument("timeouts must be positive");

    // A client that disconnects mid-stream must be a failed write, not a signal.
    std::signal(SIGPIPE, SIG_IGN);

    auto p = std::make_unique<impl>(std::move(opts));
    impl & s = *p;
    const server_options & o = s.ctx.opts;
    s.set_threads(1);  // until attach() says how many sequences the scheduler has
    s.svr.new_task_queue = [&s] { return new conn_pool(s.reg, s.max_threads); };
    s.svr.refused_head_answer = [&s](const std::string & reason) { return s.refused_head_answer(reason); };
    s.svr.busy_answer = [&s] { return s.busy_answer(); };
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
    // The routes count body bytes themselves (impl::read_body); the library's own limit
    // stays as a second line.
    s.svr.set_payload_max_length(o.max_body_bytes);
    s.svr.set_write_timeout(10, 0);
    s.svr.set_keep_alive_timeout(5);
    s.svr.set_error_handler([&s](const httplib::Request & req, httplib::Response & res) { s.on_http_error(req, res); });
    s.svr.set_exception_handler([](const httplib::Request &, httplib::Response & res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
            if (ep) std::rethrow_exception(ep);
        } catch (const std::exception & e) {
            what += std::string(": ") + e.what();
        } catch (...) {
        }
        http_response out;
        request_log log;
        respond_error(out, log, server_error(what));
        to_httplib(std::move(out), res);
    });
    for (const route & r : s.routes.routes()) {
        const route * rp = &r;
        auto plain = [&s, rp](const httplib::Request & req, httplib::Response & res) {
            s.serve(*rp, req, res, nullptr);
        };
        auto with_body = [&s, rp](const httplib::Request & req, httplib::Response & res,
                                  const httplib::ContentReader & reader) { s.serve(*rp, req, res, &reader); };
        if (r.method == "GET") s.svr.Get(r.regex_text, plain);
        else if (r.method == "POST") s.svr.Post(r.regex_text, with_body);
        else if (r.method == "PUT") s.svr.Put(r.regex_text, with_body);
        else if (r.method == "DELETE") s.svr.Delete(r.regex_text, with_body);
    }
    // What no route takes: answered without reading a body (the library would read it
    // whole before its own 404).
    auto unmatched_body = [&s](const httplib::Request & req, httplib::Response & res, const httplib::ContentReader &) {
        s.serve_unmatched(req, res);
    };
    s.svr.Post(".*", unmatched_body);
    s.svr.Put(".*", unmatched_body);
    s.svr.Delete(".*", unmatched_body);
    s.svr.Patch(".*", unmatched_body);
    s.svr.Options(".*", [&s](const httplib::Request & req, httplib::Response & res) { s.serve_unmatched(req, res); });

    if (o.port == 0) {
        int port = s.svr.bind_to_any_port(o.host);
        if (port < 0) return io_error("cannot bind " + o.host + " (any port)");
        s.bound_port = port;
    } else {
        if (!s.svr.bind_to_port(o.host, o.port))
            return io_error("cannot bind " + o.host + ":" + std::to_string(o.port) +
                            " (in use, or not an address of this machine)");
        s.bound_port = o.port;
    }
    // Debian's httplib listens with a backlog of 5 (compiled in): a burst of clients
    // then overflows the accept queue and connections are dropped. listen() again on the
    // bound socket raises the backlog.
    if (s.listen_fd >= 0) ::listen(s.listen_fd, SOMAXCONN);
    s.listener = std::thread([&s] {
        s.svr.listen_after_bind();
        s.listener_done = true;
    });
    // httplib's stop() only acts on a server that is running (it sets that flag on the
    // listener thread): return once it is, or a stop() right after start() is lost and
    // the listener serves on with nobody left to stop it.
    while (!s.svr.is_running() && !s.listener_done.load()) std::this_thread::sleep_for(milliseconds(1));
    if (!s.svr.is_running()) {
        s.listener.join();
        return io_error("cannot listen on " + o.host + ":" + std::to_string(s.bound_port));
    }
    return std::unique_ptr<http_server>(new http_server(std::move(p)));
}

result<std::unique_ptr<http_server>> http_server::start(scheduler & sched, server_options opts) {
    auto h = start(std::move(opts));
    if (!h) return h.error();
    if (status st = (*h)->attach(sched); !st.ok()) return st;
    return h;
}

status http_server::attach(scheduler & sched) {
    std::lock_guard<std::mutex> lk(p_->stop_mu);
    if (p_->stopped) return failed_precondition("the server is stopped");
    if (p_->attached) return failed_precondition("the server already serves a scheduler");
    const size_t need = min_http_threads(sched.n_parallel(), p_->ctx.opts.max_queue);
    if (need > static_cast<size_t>(k_max_http_threads))
        return invalid_argument(std::to_string(sched.n_parallel()) + " parallel sequences + a queue of " +
                                std::to_string(p_->ctx.opts.max_queue) + " + " +
                                std::to_string(k_http_thread_headroom) + " need " + std::to_string(need) +
                                " HTTP threads, more than the " + std::to_string(k_max_http_threads) +
                                " allowed: lower the queue");
    p_->set_threads(sched.n_parallel());
    p_->ctx.attach(sched);
    p_->attached = true;
    return status::ok_status();
}

http_server::http_server(std::unique_ptr<impl> p) : p_(std::move(p)) {}

http_server::~http_server() { stop(); }

int http_server::port() const { return p_->bound_port; }

server_options http_server::options() const {
    server_options o = p_->ctx.opts;
    o.n_http_threads = static_cast<int>(p_->max_threads.load());
    return o;
}

void http_server::stop() {
    std::unique_lock<std::mutex> lk(p_->stop_mu);
    if (p_->stopped) return;
    // Requests waiting (for the scheduler, for their grammar) are answered 503 first; then
    // no pre-warm is queued and the grammar builds still running are waited for.
    p_->ctx.stop_channels("the server is shutting down");
    p_->ctx.stop_background();
    p_->svr.stop();
    p_->reg.shed_all();  // idle and half-received connections end now, not at their timeouts
    if (p_->listener.joinable()) p_->listener.join();
    p_->stopped = true;
    p_->stop_cv.notify_all();
}

void http_server::wait() {
    std::unique_lock<std::mutex> lk(p_->stop_mu);
    p_->stop_cv.wait(lk, [&] { return p_->stopped; });
}

}  // namespace warmctx
