// server/http_connections.h - the transport's connections (http_server.cpp): each
// connection's phase and limits (conn_state), the registry that sheds the sheddable one
// that has waited longest when a new connection finds no thread (conn_registry), the
// thread pool that starts threads on demand (conn_pool), and the stream every byte the
// library reads passes through (conn_stream); implemented in http_connections.cpp.
// Included by http_server.cpp and http_connections.cpp only: they need cpp-httplib and
// WARMCTX_HTTPLIB_V2 as set here.
#pragma once

#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

#include "http_framing.h"
#include "metrics.h"
#include "warmctx/server.h"

#if defined(CPPHTTPLIB_VERSION_NUM)
#define WARMCTX_HTTPLIB_V2 1  // the vendored 0.5x: wait_readable/wait_writable, addresses in process_request
#else
#define WARMCTX_HTTPLIB_V2 0  // Debian's 0.11
#endif

namespace warmctx::server_detail::transport {

using steady_clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t k_max_header_bytes = 64u << 10;      // request line + headers
constexpr auto k_slice = milliseconds(100);           // how late a waiting read notices a stop or a shed
constexpr auto k_linger = milliseconds(1000);         // drain after a refused body, at most this long
constexpr auto k_idle_grace =
    milliseconds(5);  // a kept-alive connection given up: a request already sent is looked for
constexpr size_t k_linger_bytes = 8u << 20;           // ... and this many bytes

// ---- connections ---------------------------------------------------------------------------

enum class conn_phase { idle, headers, routing, body, handling, closing };

// One connection's state. The phase and its limits are written by the connection's own
// thread under the registry's mutex (the shedder reads them under it); the flags below
// them by that thread alone.
struct conn_state {
    socket_t fd = INVALID_SOCKET;
    conn_phase phase = conn_phase::idle;
    steady_clock::time_point since = steady_clock::now();      // the phase's start
    steady_clock::time_point deadline = steady_clock::time_point::max();
    size_t cap = 0;          // bytes the phase may deliver
    size_t phase_bytes = 0;  // bytes delivered in the phase
    std::atomic<bool> shed{false};

    bool timed_out = false;      // a read passed the deadline
    bool over_cap = false;       // a read passed the cap
    bool body_framed = false;    // the request has a body (Content-Length > 0 or Transfer-Encoding)
    bool body_consumed = false;  // ... and it was read to its end
    bool said_close = false;     // the last answer carried `Connection: close`
    bool close_after =
        false;  // the answer refused the request (400, 408, 413, 431), or threads ran short: the connection ends
    std::string content_type;    // the request's Content-Type (the library's copy is erased)
    size_t n_requests = 0;       // requests answered on this connection

    bool reads_allowed() const { return phase == conn_phase::headers || phase == conn_phase::body; }
    // The connection cannot carry another request: its stream is not at a request's start.
    bool must_close() const {
        return shed.load() || timed_out || over_cap || close_after || (body_framed && !body_consumed);
    }
};

// The connection this thread serves (handlers run on the connection's thread).
extern thread_local conn_state * t_conn;

class conn_registry {
  public:
    explicit conn_registry(server_metrics & m) : metrics_(m) {}

    void add(conn_state & c);
    // Before the socket is closed: a shed never reaches a closed (reused) descriptor.
    void remove(conn_state & c);
    void enter(conn_state & c, conn_phase p, milliseconds timeout = milliseconds(0), size_t cap = 0);
    // Takes the thread of the connection that waits longest without a request being
    // answered: draining first, then idle, then sending headers, then sending a body.
    bool shed_one();
    // Connections shed whose threads have not let go yet.
    size_t shedding() const;
    // The server stops: every connection not answering a request is closed now.
    void shed_all();

    // Accepted connections wait for a thread and the pool may start no more.
    std::atomic<bool> starved{false};

  private:
    server_metrics & metrics_;
    mutable std::mutex mu_;
    std::list<conn_state *> live_;
};

// Threads on demand up to `max_threads`; a connection that finds none free takes the
// thread of a sheddable connection.
class conn_pool final : public httplib::TaskQueue {
  public:
    conn_pool(conn_registry & reg, const std::atomic<size_t> & max_threads) : reg_(reg), max_threads_(max_threads) {}
    ~conn_pool() override { shutdown(); }

#if WARMCTX_HTTPLIB_V2
    bool enqueue(std::function<void()> fn) override {
        add(std::move(fn));
        return true;
    }
#else
    void enqueue(std::function<void()> fn) override { add(std::move(fn)); }
#endif

    void shutdown() override;

  private:
    void add(std::function<void()> fn);
    // Threads not running a connection (waiting for one, or just started). Holds mu_.
    size_t free_threads() const { return n_threads_ - busy_; }
    // Connections wait for a thread, none is free or about to be, and no more may
    // start: free one. Called again each time a thread takes a connection, so that a
    // queue of waiting connections (trickling clients that reconnect, say) drains at
    // once rather than one per new arrival. Holds mu_.
    void shed_for_waiting();
    void work();

    conn_registry & reg_;
    const std::atomic<size_t> & max_threads_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::list<std::function<void()>> jobs_;
    std::vector<std::thread> threads_;
    size_t n_threads_ = 0;  // started (they end only at shutdown)
    size_t busy_ = 0;       // running a connection
    bool shutdown_ = false;
};

// Waits until `fd` is ready for `events`, `limit` passes (false), or `stop()` says so
// (false), looking every k_slice.
template <typename Stop>
bool wait_fd(socket_t fd, short events, steady_clock::time_point limit, const Stop & stop) {
    for (;;) {
        if (stop()) return false;
        const auto now = steady_clock::now();
        if (now >= limit) return false;
        const auto left = std::chrono::ceil<milliseconds>(limit - now);
        pollfd p{fd, events, 0};
        const int r = ::poll(&p, 1, static_cast<int>(std::min(left, milliseconds(k_slice)).count()));
        if (r > 0) return true;  // ready, or an error/hang-up the next recv/send reports
        if (r < 0 && errno != EINTR) return false;
    }
}

// The library's view of a connection: reads only in the phases that read, within the
// phase's deadline and cap; buffered, and kept across the connection's requests.
class conn_stream final : public httplib::Stream {
  public:
    conn_stream(conn_state & c, const std::atomic<socket_t> & listening, milliseconds read_timeout,
                milliseconds write_timeout)
        : c_(c), listening_(listening), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

#if WARMCTX_HTTPLIB_V2
    bool is_readable() const override { return buffered(); }
    bool wait_readable() const override { return buffered() || wait_input(); }
    bool wait_writable() const override { return wait_output(); }
    time_t duration() const override {
        return std::chrono::duration_cast<milliseconds>(steady_clock::now() - created_).count();
    }
#else
    bool is_readable() const override { return buffered() || wait_input(); }
    bool is_writable() const override { return wait_output(); }
#endif

    ssize_t read(char * ptr, size_t size) override;
    ssize_t write(const char * ptr, size_t size) override;
    void get_remote_ip_and_port(std::string & ip, int & port) const override;
    void get_local_ip_and_port(std::string & ip, int & port) const override;
    socket_t socket() const override { return c_.fd; }

    bool buffered() const { return off_ < len_; }

    // Reads (in the headers phase) until the buffer holds a whole request head, the
    // head is refused, or no more comes in time or within the phase's cap: the
    // verdict, incomplete in the last case (the library's own read then meets the same
    // end and answers as before: 408, or the connection closes). Nothing is consumed:
    // the library parses the same bytes.
    head_verdict read_head();
    // Bytes to read right now (buffered, or in the socket).
    bool input_now() const;
    // Waits for the next request (keep-alive): false on timeout, a shed or a stop.
    // A request already here is served even on a shed connection (then it closes).
    bool wait_request(milliseconds timeout) const;

  private:
    bool stopped() const { return listening_.load() == INVALID_SOCKET || c_.shed.load(); }
    // Data (or EOF) to read within the read timeout and the phase's deadline.
    bool wait_input() const;
    // A shed stops reads, not the answer to what was read (a 503 on a shed).
    bool wait_output() const;
    // Appends what the socket has to the buffer (waiting as read() does): false on EOF,
    // an error, a timeout or a stop.
    bool fill();

    conn_state & c_;
    const std::atomic<socket_t> & listening_;
    const milliseconds read_timeout_;
    const milliseconds write_timeout_;
    const steady_clock::time_point created_ = steady_clock::now();
    std::vector<char> buf_ = std::vector<char>(16384);
    size_t off_ = 0;
    size_t len_ = 0;
};

}  // namespace warmctx::server_detail::transport
