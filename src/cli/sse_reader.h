// Reads a server-sent-event stream (text/event-stream) as warmctx and llama-server write
// it, for the benchmarks and the tests: one event per "data: <payload>" line (after an
// "event: <type>" line in the Responses API), a blank line after each, "data: [DONE]" at
// the end of an OpenAI stream, and comment lines (": ...", warmctx's ": keep-alive" and
// ": keep-alive prefill P/N") that clients skip.
//
// Header-only and standard C++ only: warmctx-bench and the test binaries include it; the
// warmctx command does not (the server writes its streams, it never reads one).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace warmctx::cli {

// One event: the lines between two blank lines.
struct sse_event {
    std::string raw;                    // its lines as they came, each but the last ended by
                                        // its own "\n" (a "\r" before it kept); the blank
                                        // line after them left out
    std::string type;                   // its "event: <type>" line's type ("" = none; the
                                        // Responses API names every event)
    std::string data;                   // the payloads of its "data: " lines, joined by '\n'
    int n_data_lines = 0;
    std::vector<std::string> comments;  // its comment lines, ':' included (": keep-alive")
    int n_other_lines = 0;              // lines of any other field ("id:", "error:", "data:x")

    // "data: [DONE]": the end of an OpenAI stream.
    bool done() const { return n_data_lines == 1 && data == "[DONE]"; }
    // Only comments: what a client skips.
    bool comment_only() const { return n_data_lines == 0 && n_other_lines == 0 && !comments.empty(); }
};

// Feed it the bytes as they arrive, in pieces of any size; it hands over each event as its
// blank line arrives. A line ends at "\n" or "\r\n". A data line is "data: " with the space,
// the form both servers write.
class sse_reader {
  public:
    // Appends `bytes`; calls on_event(const sse_event &) for every event they complete.
    // on_event returns false to stop reading: feed returns false at once, and the rest of
    // the bytes stay unread.
    template <class F>
    bool feed(std::string_view bytes, F && on_event) {
        buf_.append(bytes);
        size_t start = 0, nl;
        while ((nl = buf_.find('\n', start)) != std::string::npos) {
            const std::string_view as_sent(buf_.data() + start, nl - start);
            start = nl + 1;
            std::string_view line = as_sent;
            if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
            if (!line.empty()) {
                if (has_event_) ev_.raw += '\n';
                ev_.raw.append(as_sent);
                add_line(line);
                continue;
            }
            if (!has_event_) continue;  // blank lines between events
            sse_event ev = std::move(ev_);
            ev_ = {};
            has_event_ = false;
            if (!on_event(ev)) {
                buf_.erase(0, start);
                return false;
            }
        }
        buf_.erase(0, start);
        return true;
    }

    // True while bytes of an event without its blank line are held: a stream that ended
    // there was cut.
    bool pending() const { return has_event_ || !buf_.empty(); }

    // Every event of a whole body. `unterminated` (optional) is set when the body ends inside
    // an event, which is then left out.
    static std::vector<sse_event> read_all(std::string_view body, bool * unterminated = nullptr) {
        std::vector<sse_event> out;
        sse_reader r;
        r.feed(body, [&out](const sse_event & e) {
            out.push_back(e);
            return true;
        });
        if (unterminated) *unterminated = r.pending();
        return out;
    }

  private:
    void add_line(std::string_view line) {
        has_event_ = true;
        if (line.front() == ':') {
            ev_.comments.emplace_back(line);
        } else if (line.substr(0, 7) == "event: " && ev_.type.empty()) {
            ev_.type = line.substr(7);
        } else if (line.substr(0, 6) == "data: ") {
            if (ev_.n_data_lines++ > 0) ev_.data += '\n';
            ev_.data.append(line.substr(6));
        } else {
            ++ev_.n_other_lines;
        }
    }

    std::string buf_;  // bytes after the last complete line
    sse_event ev_;     // the event being read
    bool has_event_ = false;
};

}  // namespace warmctx::cli
