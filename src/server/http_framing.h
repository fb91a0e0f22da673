// server/http_framing.h - a strict check of a request's head (request line and header
// fields) before the HTTP library parses it, so that a request whose framing two
// parsers could read differently is refused rather than guessed at (request smuggling).
//
// The library (cpp-httplib) is lenient where RFC 9112 asks a server to refuse: it skips
// a header line it cannot parse, lets Transfer-Encoding win over a Content-Length, takes
// the first of two Content-Lengths, and after its 400 goes on reading the same
// connection, so the bytes after a refused head were answered as a second request. The
// transport (http_server.cpp) runs this check on the buffered head of every request and
// answers a refused one with 400 and closes the connection.
//
// Refused (RFC 9112 sections 3, 5, 6.1, 6.3):
//   - a request line other than `method SP target SP HTTP/1.x CRLF` (token method, a
//     target of visible characters, HTTP/1.0 or HTTP/1.1)
//   - a line ended by a bare LF, a CR not followed by LF, a NUL or other control byte
//   - a folded header line (obs-fold: a line starting with a space or tab)
//   - a field name that is not a token or has white space before its colon
//   - Content-Length and Transfer-Encoding together; two Content-Length fields; a
//     Content-Length that is not decimal digits (a list, a sign, 20 digits or more)
//   - a Transfer-Encoding that is not exactly "chunked" (other codings, a list, two
//     fields), or any Transfer-Encoding on an HTTP/1.0 request
//   - two Host fields
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace warmctx::server_detail {

struct head_verdict {
    enum kind_t { incomplete, complete, refused } kind = incomplete;
    size_t length = 0;   // complete: the head's bytes, its blank line included
    std::string reason;  // refused: what was wrong, for the 400's message
    std::string host;    // complete: the Host field's value ("" when absent)
};

// Checks the head at the start of `buffered`. incomplete: no blank line yet and nothing
// wrong so far (a bare LF is refused as soon as it arrives). `scan_from`: the bytes
// before it were seen incomplete by an earlier call (so that a head arriving a byte at
// a time is scanned once, not once per byte).
head_verdict check_request_head(std::string_view buffered, size_t scan_from = 0);

}  // namespace warmctx::server_detail
