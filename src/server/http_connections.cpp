// The transport's connections (http_connections.h): the registry that sheds, the thread
// pool, and the stream every byte the library reads passes through.
#include "http_connections.h"

#include <netdb.h>

#include <cstdlib>

namespace warmctx::server_detail::transport {

thread_local conn_state * t_conn = nullptr;

namespace {

int shed_rank(conn_phase p) {
    switch (p) {
        case conn_phase::closing: return 0;
        case conn_phase::idle: return 1;
        case conn_phase::headers: return 2;
        case conn_phase::body: return 3;
        default: return -1;  // routing, handling: a request is being answered
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

}  // namespace

// ---- conn_registry -------------------------------------------------------------------------

void conn_registry::add(conn_state & c) {
    std::lock_guard<std::mutex> lk(mu_);
    live_.push_back(&c);
}

void conn_registry::remove(conn_state & c) {
    std::lock_guard<std::mutex> lk(mu_);
    live_.remove(&c);
}

void conn_registry::enter(conn_state & c, conn_phase p, milliseconds timeout, size_t cap) {
    std::lock_guard<std::mutex> lk(mu_);
    c.phase = p;
    c.since = steady_clock::now();
    c.deadline = timeout.count() > 0 ? c.since + timeout : steady_clock::time_point::max();
    c.cap = cap;
    c.phase_bytes = 0;
}

bool conn_registry::shed_one() {
    std::lock_guard<std::mutex> lk(mu_);
    conn_state * best = nullptr;
    for (conn_state * c : live_) {
        const int r = shed_rank(c->phase);
        if (r < 0 || c->shed.load()) continue;
        if (!best || r < shed_rank(best->phase) || (r == shed_rank(best->phase) && c->since < best->since)) best = c;
    }
    if (!best) return false;
    // Its thread sees the flag within k_slice (every wait looks each slice) and
    // answers 503 with Retry-After when a request was on its way, rather than
    // closing with no answer (a burst of new clients lost connections that way).
    best->shed = true;
    metrics_.count_shed_connection();
    return true;
}

size_t conn_registry::shedding() const {
    std::lock_guard<std::mutex> lk(mu_);
    return static_cast<size_t>(
        std::count_if(live_.begin(), live_.end(), [](conn_state * c) { return c->shed.load(); }));
}

void conn_registry::shed_all() {
    std::lock_guard<std::mutex> lk(mu_);
    for (conn_state * c : live_) {
        if (shed_rank(c->phase) < 0 || c->shed.load()) continue;
        c->shed = true;
        ::shutdown(c->fd, SHUT_RDWR);
    }
}

// ---- conn_pool -------------------------------------------------------------------------------

void conn_pool::shutdown() {
    std::vector<std::thread> threads;
    {
        std::lock_guard<std::mutex> lk(mu_);
        shutdown_ = true;
        threads.swap(threads_);
    }
    cv_.notify_all();
    for (auto & t : threads) t.join();
}

void conn_pool::add(std::function<void()> fn) {
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

void conn_pool::shed_for_waiting() {
    const bool starved = !jobs_.empty() && n_threads_ >= max_threads_.load() && jobs_.size() > free_threads();
    reg_.starved = starved;
    if (starved && jobs_.size() > free_threads() + reg_.shedding()) reg_.shed_one();
}

void conn_pool::work() {
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

// ---- conn_stream -----------------------------------------------------------------------------

ssize_t conn_stream::read(char * ptr, size_t size) {
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

ssize_t conn_stream::write(const char * ptr, size_t size) {
    if (!wait_output()) return -1;
    ssize_t n;
    do {
        n = ::send(c_.fd, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
}

void conn_stream::get_remote_ip_and_port(std::string & ip, int & port) const { address_of(c_.fd, true, ip, port); }
void conn_stream::get_local_ip_and_port(std::string & ip, int & port) const { address_of(c_.fd, false, ip, port); }

head_verdict conn_stream::read_head() {
    size_t scanned = 0;
    for (;;) {
        const std::string_view pending(buf_.data() + off_, len_ - off_);
        head_verdict v = check_request_head(pending, scanned);
        if (v.kind != head_verdict::incomplete) return v;
        scanned = pending.size();
        if (scanned >= c_.cap || !fill()) return v;
    }
}

bool conn_stream::input_now() const {
    pollfd p{c_.fd, POLLIN, 0};
    return buffered() || ::poll(&p, 1, 0) > 0;
}

bool conn_stream::wait_request(milliseconds timeout) const {
    return input_now() || wait_fd(c_.fd, POLLIN, steady_clock::now() + timeout, [this] { return stopped(); });
}

bool conn_stream::wait_input() const {
    auto limit = steady_clock::now() + read_timeout_;
    const bool by_deadline = c_.deadline < limit;
    if (by_deadline) limit = c_.deadline;
    if (wait_fd(c_.fd, POLLIN, limit, [this] { return stopped(); })) return true;
    if (by_deadline && steady_clock::now() >= c_.deadline) c_.timed_out = true;
    return false;
}

bool conn_stream::wait_output() const {
    return wait_fd(c_.fd, POLLOUT, steady_clock::now() + write_timeout_, [] { return false; });
}

bool conn_stream::fill() {
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

}  // namespace warmctx::server_detail::transport
