// What the loopback tests of the server share: the tiny model's scheduler options, a
// poll-until helper, a raw socket (for what httplib's client cannot do: trickle bytes,
// stop mid-body, close mid-stream) and the process's peak memory.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "warmctx/scheduler.h"

namespace warmctx::testing_http {

using namespace std::chrono_literals;

inline scheduler_options tiny_scheduler_options(uint32_t n_parallel = 4, size_t max_queue = 64) {
    scheduler_options o;
    o.engine.engine.model_path = WARMCTX_TINY_MODEL;
    o.engine.engine.n_ctx = 2048;
    o.engine.engine.chunk_tokens = 64;
    o.engine.engine.n_threads = 1;
    o.engine.n_holders = 4;
    o.n_parallel = n_parallel;
    o.max_queue = max_queue;
    return o;
}

// Polls `pred` until it holds or `deadline` passes (synchronisation without sleeps
// that guess how long something takes).
inline bool eventually(const std::function<bool()> & pred, std::chrono::milliseconds deadline = 30s) {
    auto end = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < end) {
        if (pred()) return true;
        std::this_thread::sleep_for(5ms);
    }
    return pred();
}

// A raw socket to 127.0.0.1:port.
class raw_connection {
  public:
    explicit raw_connection(int port) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ok_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
    }
    ~raw_connection() { close(); }
    raw_connection(const raw_connection &) = delete;
    raw_connection & operator=(const raw_connection &) = delete;

    bool ok() const { return ok_; }
    bool send_all(const std::string & s) {
        size_t off = 0;
        while (off < s.size()) {
            ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
            if (n <= 0) return false;
            off += static_cast<size_t>(n);
        }
        return true;
    }
    // Reads until `needle` appears (true) or the peer closes (false).
    bool read_until(const std::string & needle, std::string & got) {
        return read_until(needle, got, std::chrono::hours(1));
    }
    // ... or `timeout` passes (false).
    bool read_until(const std::string & needle, std::string & got, std::chrono::milliseconds timeout) {
        const auto end = std::chrono::steady_clock::now() + timeout;
        while (got.find(needle) == std::string::npos)
            if (!recv_some(got, end)) return false;
        return true;
    }
    // A whole response: the head, then Content-Length bytes of body (false: closed or
    // timed out first).
    bool read_response(std::string & head, std::string & body, std::chrono::milliseconds timeout = 10s) {
        const auto end = std::chrono::steady_clock::now() + timeout;
        std::string got;
        while (got.find("\r\n\r\n") == std::string::npos) {
            if (!recv_some(got, end)) {
                head = got;
                return false;
            }
        }
        const size_t sep = got.find("\r\n\r\n");
        head = got.substr(0, sep);
        body = got.substr(sep + 4);
        size_t len = 0;
        for (const std::string name : {"\r\nContent-Length: ", "\r\ncontent-length: "}) {
            size_t p = head.find(name);
            if (p != std::string::npos) len = std::stoul(head.substr(p + name.size()));
        }
        while (body.size() < len)
            if (!recv_some(body, end)) return false;
        return true;
    }
    // True once the peer has closed (EOF or reset) within `timeout`; what arrives
    // before goes to `got`.
    bool closed_within(std::chrono::milliseconds timeout, std::string * got = nullptr) {
        const auto end = std::chrono::steady_clock::now() + timeout;
        std::string sink;
        for (;;) {
            if (std::chrono::steady_clock::now() >= end) return false;
            if (!recv_some(got ? *got : sink, end)) return std::chrono::steady_clock::now() < end;
        }
    }
    // What an HTTP client checks before it reuses a kept-alive connection: has the peer
    // closed it (EOF or reset waiting to be read)?
    bool peer_closed() const {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 0) <= 0) return false;
        char c;
        return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;
    }
    void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

  private:
    // Appends what arrives before `end`; false when the peer closed or `end` passed.
    bool recv_some(std::string & out, std::chrono::steady_clock::time_point end) {
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
            if (left.count() <= 0) return false;
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
            char buf[4096];
            ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) return false;
            out.append(buf, static_cast<size_t>(n));
            return true;
        }
    }

    int fd_ = -1;
    bool ok_ = false;
};

// The HTTP status of a response head ("HTTP/1.1 413 ..."), -1 when there is none.
inline int status_of(const std::string & head) {
    if (head.rfind("HTTP/1.", 0) != 0 || head.size() < 12) return -1;
    return std::atoi(head.c_str() + 9);
}

// The process's peak resident memory (VmHWM), bytes; reset_peak_rss() starts a new
// peak (Linux: "5" to /proc/self/clear_refs) and says whether it could.
inline uint64_t peak_rss_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    return 0;
}
inline bool reset_peak_rss() {
    std::ofstream f("/proc/self/clear_refs");
    f << "5";
    f.flush();
    return static_cast<bool>(f);
}

}  // namespace warmctx::testing_http
