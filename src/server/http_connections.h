// server/http_connections.h - the transport's connections (http_server.cpp): each
// connection's phase and limits (conn_state), the registry that sheds the sheddable one
// that has waited longest when a new connection finds no thread (conn_registry), the
// thread pool that starts threads on demand (conn_pool), and the stream every byte the
// library reads passes through (conn_stream). Included by http_server.cpp only: it needs
// cpp-httplib and WARMCTX_HTTPLIB_V2 as that file sets them.
#pragma once

#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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
thread_local conn_state * t_conn = nullptr;

int shed_rank(conn_phase p) {
    switch (p) {
        case conn_phase::closing: return 0;
        case conn_phase::idle: return 1;
        case conn_phase::headers: return 2;
        case conn_phase::body: return 3;
        default: return -1;  // routing, handling: a request is being answered
    }
}

class conn_registry {
  public:
    explicit conn_registry(server_metrics & m) : metrics_(m) {}

    void add(conn_state & c) {
        std::lock_guard<std::mutex> lk(mu_);
        live_.push_back(&c);
    }
    // Before the socket is closed: a shed never reaches a closed (reused) descriptor.
    void remove(conn_state & c) {
        std::lock_guard<std::mutex> lk(mu_);
        live_.remove(&c);
    }
    void enter(conn_state & c, conn_phase p, milliseconds timeout = milliseconds(0), size_t cap = 0) {
        std::lock_guard<std::mutex> lk(mu_);
        c.phase = p;
        c.since = steady_clock::now();
        c.deadline = timeout.count() > 0 ? c.since + timeout : steady_clock::time_point::max();
        c.cap = cap;
        c.phase_bytes = 0;
    }
    // Takes the thread of the connection that waits longest without a request being
    // answered: draining first, then idle, then sending headers, then sending a body.
    bool shed_one() {
        std::lock_guard<std::mutex> lk(mu_);
        conn_state * best = nullptr;
        for (conn_state * c : live_) {
            const int r = shed_rank(c->phase);
            if (r < 0 || c->shed.load()) continue;
            if (!best || r < shed_rank(best->phase) || (r == shed_rank(best->phase) && c->since < best->since))
                best = c;
        }
        if (!best) return false;
        // Its thread sees the flag within k_slice (every wait looks each slice) and
        // answers 503 with Retry-After when a request was on its way, rather than
        // closing with no answer (a burst of new clients lost connections that way).
        best->shed = true;
        metrics_.count_shed_connection();
        return true;
    }
    // Connections shed whose threads have not let go yet.
    size_t shedding() const {
        std::lock_guard<std::mutex> lk(mu_);
        return static_cast<size_t>(
            std::count_if(live_.begin(), live_.end(), [](conn_state * c) { return c->shed.load(); }));
    }
    // The server stops: every connection not answering a request is closed now.
    void shed_all() {
        std::lock_guard<std::mutex> lk(mu_);
        for (conn_state * c : live_) {
            if (shed_rank(c->phase) < 0 || c->shed.load()) continue;
            c->shed = true;
            ::shutdown(c->fd, SHUT_RDWR);
        }
    }

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

    void shutdown() override {
        std::vector<std::thread> threads;
        {
            std::lock_guard<std::mutex> lk(mu_);
            shutdown_ = true;
            threads.swap(threads_);
        }
        cv_.notify_all();
        for (auto & t : threads) t.join();
    }

  private:
    void add(std::function<void()> fn) {
        std::unique_lock<std::mutex> lk(mu_);
        jobs_.push_back(std::move(fn));
        if (jobs_.size() > free_threads() && n_threads_ < max_threads_.load()) {
            threads_.emplace_back([this] { work(); });
            ++n_threads_;
        } else {
            shed_for_waiting();
        }
        lk.unlock();
        cv_.notify_one();
    }

    // Threads not running a connection (waiting for one, or just started). Holds mu_.
    size_t free_threads() const { return n_threads_ - busy_; }

    // Connections wait for a thread, none is free or about to be, and no more may
    // start: free one. Called again each time a thread takes a connection, so that a
    // queue of waiting connections (trickling clients that reconnect, say) drains at
    // once rather than one per new arrival. Holds mu_.
    void shed_for_waiting() {
        const bool starved = !jobs_.empty() && n_threads_ >= max_threads_.load() && jobs_.size() > free_threads();
        reg_.starved = starved;
        if (starved && jobs_.size() > free_threads() + reg_.shedding()) reg_.shed_one();
    }

    void work() {
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
            cv_.wait(lk, [&] { return shutdown_ || !jobs_.empty(); });
            if (jobs_.empty()) return;  // shutting down, nothing left
            std::function<void()> fn = std::move(jobs_.front());
            jobs_.pop_front();
            ++busy_;
            shed_for_waiting();
            lk.unlock();
            fn();
            lk.lock();
            --busy_;
            reg_.starved = !jobs_.empty() && jobs_.size() > free_threads();
        }
    }

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

void address_of(socket_t fd, bool peer, std::string & ip, int & port) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if ((peer ? ::getpeername(fd, reinterpret_cast<sockaddr *>(&addr), &len)
              : ::getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len)) != 0)
        return;
    char host[NI_MAXHOST] = "";
    char serv[NI_MAXSERV] = "";
    if (::getnameinfo(reinterpret_cast<sockaddr *>(&addr), len, host, sizeof host, serv, sizeof serv,
                      NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
        ip = host;
        port = std::atoi(serv);
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

    ssize_t read(char * ptr, size_t size) override {
        if (!c_.reads_allowed()) return -1;
        if (c_.phase_bytes >= c_.cap) {
            c_.over_cap = true;
            return -1;
        }
        size = std::min(size, c_.cap - c_.phase_bytes);
        if (!buffered()) {
            if (!wait_input()) return -1;
            ssize_t n;
            do {
                n = ::recv(c_.fd, buf_.data(), buf_.size(), 0);
            } while (n < 0 && errno == EINTR);
            if (n <= 0) return n;  // 0: the peer closed (or the connection was shed)
            off_ = 0;
            len_ = static_cast<size_t>(n);
        }
        const size_t n = std::min(size, len_ - off_);
        std::memcpy(ptr, buf_.data() + off_, n);
        off_ += n;
        c_.phase_bytes += n;
        return static_cast<ssize_t>(n);
    }

    ssize_t write(const char * ptr, size_t size) override {
        if (!wait_output()) return -1;
        ssize_t n;
        do {
            n = ::send(c_.fd, ptr, size, MSG_NOSIGNAL);
        } while (n < 0 && errno == EINTR);
        return n;
    }

    void get_remote_ip_and_port(std::string & ip, int & port) const override { address_of(c_.fd, true, ip, port); }
    void get_local_ip_and_port(std::string & ip, int & port) const override { address_of(c_.fd, false, ip, port); }
    socket_t socket() const override { return c_.fd; }

    bool buffered() const { return off_ < len_; }

    // Reads (in the headers phase) until the buffer holds a whole request head, the
    // head is refused, or no more comes in time or within the phase's cap: the
    // verdict, incomplete in the last case (the library's own read then meets the same
    // end and answers as before: 408, or the connection closes). Nothing is consumed:
    // the library parses the same bytes.
    head_verdict read_head() {
        size_t scanned = 0;
        for (;;) {
            const std::string_view pending(buf_.data() + off_, len_ - off_);
            head_verdict v = check_request_head(pending, scanned);
            if (v.kind != head_verdict::incomplete) return v;
            scanned = pending.size();
            if (scanned >= c_.cap || !fill()) return v;
        }
    }
    // Bytes to read right now (buffered, or in the socket).
    bool input_now() const {
        pollfd p{c_.fd, POLLIN, 0};
        return buffered() || ::poll(&p, 1, 0) > 0;
    }

    // Waits for the next request (keep-alive): false on timeout, a shed or a stop.
    // A request already here is served even on a shed connection (then it closes).
    bool wait_request(milliseconds timeout) const {
        return input_now() || wait_fd(c_.fd, POLLIN, steady_clock::now() + timeout, [this] { return stopped(); });
    }

  private:
    bool stopped() const { return listening_.load() == INVALID_SOCKET || c_.shed.load(); }

    // Data (or EOF) to read within the read timeout and the phase's deadline.
    bool wait_input() const {
        auto limit = steady_clock::now() + read_timeout_;
        const bool by_deadline = c_.deadline < limit;
        if (by_deadline) limit = c_.deadline;
        if (wait_fd(c_.fd, POLLIN, limit, [this] { return stopped(); })) return true;
        if (by_deadline && steady_clock::now() >= c_.deadline) c_.timed_out = true;
        return false;
    }
    bool wait_output() const {
        // A shed stops reads, not the answer to what was read (a 503 on a shed).
        return wait_fd(c_.fd, POLLOUT, steady_clock::now() + write_timeout_, [] { return false; });
    }

    conn_state & c_;
    const std::atomic<socket_t> & listening_;
    const milliseconds read_timeout_;
    const milliseconds write_timeout_;
    const steady_clock::time_point created_ = steady_clock::now();
    // Appends what the socket has to the buffer (waiting as read() does): false on EOF,
    // an error, a timeout or a stop.
    bool fill() {
        if (off_ > 0) {
            std::memmove(buf_.data(), buf_.data() + off_, len_ - off_);
            len_ -= off_;
            off_ = 0;
        }
        if (buf_.size() - len_ < 4096) buf_.resize(buf_.size() * 2);
        if (!wait_input()) return false;
        ssize_t n;
        do {
            n = ::recv(c_.fd, buf_.data() + len_, buf_.size() - len_, 0);
        } while (n < 0 && errno == EINTR);
        if (n <= 0) return false;
        len_ += static_cast<size_t>(n);
        return true;
    }

    std::vector<char> buf_ = std::vector<char>(16384);
    size_t off_ = 0;
    size_t len_ = 0;
};

}  // namespace warmctx::server_detail::transport
