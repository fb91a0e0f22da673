// The HTTP server's socket: cpp-httplib's set-up, bind/listen/stop, and the conversion
// of its requests and responses to the plain types the routes use (route_context.h).
// Routes, auth, dispatch and the per-request record are the router's (router.h). See
// warmctx/server.h and docs/api.md.
#include "warmctx/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>

#include "router.h"

namespace warmctx {

using namespace server_detail;

namespace {

http_request from_httplib(const httplib::Request & req) {
    http_request r;
    r.method = req.method;
    r.path = req.path;
    for (size_t i = 1; i < req.matches.size(); ++i) r.params.push_back(req.matches[i].str());
    for (const auto & [k, v] : req.params) r.query.emplace(k, v);  // a key's first value wins
    r.authorization = req.get_header_value("Authorization");
    r.body = req.body;
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
    impl(scheduler & s, server_options o) : ctx(&s, std::move(o)), routes(ctx) {}

    route_context ctx;
    router routes;

    httplib::Server svr;
    int bound_port = 0;
    std::thread listener;
    int listen_fd = -1;  // the listening socket, from httplib's socket-options hook

    std::mutex stop_mu;  // serialises stop(); guards stopped
    std::condition_variable stop_cv;
    bool stopped = false;

    void serve(const route & r, const httplib::Request & req, httplib::Response & res) {
        http_response out;
        routes.dispatch(r, from_httplib(req), out);
        to_httplib(std::move(out), res);
    }

    // httplib's own error responses (no route, wrong method, body too large, bad
    // request line) arrive here with an empty body: give them the OpenAI shape.
    void on_http_error(const httplib::Request & req, httplib::Response & res) {
        if (!res.body.empty()) return;  // ours, already counted and logged
        http_response out;
        out.status = res.status;
        routes.unmatched(req.method, req.path, out);
        to_httplib(std::move(out), res);
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
    const server_options & o = s.ctx.opts;
    const int n_threads = o.n_http_threads;
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
        auto h = [&s, rp](const httplib::Request & req, httplib::Response & res) { s.serve(*rp, req, res); };
        if (r.method == "GET") s.svr.Get(r.regex_text, h);
        else if (r.method == "POST") s.svr.Post(r.regex_text, h);
        else if (r.method == "PUT") s.svr.Put(r.regex_text, h);
        else if (r.method == "DELETE") s.svr.Delete(r.regex_text, h);
    }

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
    s.listener = std::thread([&s] { s.svr.listen_after_bind(); });
    return std::unique_ptr<http_server>(new http_server(std::move(p)));
}

http_server::http_server(std::unique_ptr<impl> p) : p_(std::move(p)) {}

http_server::~http_server() { stop(); }

int http_server::port() const { return p_->bound_port; }

const server_options & http_server::options() const { return p_->ctx.opts; }

void http_server::stop() {
    std::unique_lock<std::mutex> lk(p_->stop_mu);
    if (p_->stopped) return;
    p_->ctx.stop_channels("the server is shutting down");
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
