// check_request_head (server/http_framing.h): what a strict HTTP/1.1 parser refuses, so
// that no framing is read one way by a proxy and another by the server (issue 30, item 4).
#include <gtest/gtest.h>

#include <string>

#include "server/http_framing.h"

namespace warmctx::server_detail {
namespace {

head_verdict check(const std::string & s) { return check_request_head(s); }

TEST(http_framing, accepts_ordinary_heads) {
    for (const std::string h : {"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n",
                                "GET /health HTTP/1.0\r\n\r\n",
                                "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length:  12 \r\n"
                                "Content-Type: application/json\r\n\r\n",
                                "PUT /v1/workspaces/w/segments/s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n",
                                "GET /v1/workspaces?x=%20 HTTP/1.1\r\nHost: x\r\nX-Empty:\r\nX-Tab:\tv\r\n\r\n"}) {
        SCOPED_TRACE(h);
        const head_verdict v = check(h + "trailing body bytes");
        EXPECT_EQ(v.kind, head_verdict::complete) << v.reason;
        EXPECT_EQ(v.length, h.size());
    }
    EXPECT_EQ(check("GET /health HTTP/1.1\r\nHost: a.b:1\r\n\r\n").host, "a.b:1");
}

TEST(http_framing, waits_for_the_blank_line) {
    EXPECT_EQ(check("").kind, head_verdict::incomplete);
    EXPECT_EQ(check("GET /health HTTP/1.1\r\nHost: x\r\n").kind, head_verdict::incomplete);
    EXPECT_EQ(check("GET /health HTTP/1.1\r\nHost: x\r\n\r").kind, head_verdict::incomplete);
    // An incremental scan finds the end across calls.
    const std::string h = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    EXPECT_EQ(check_request_head(h, h.size() - 1).kind, head_verdict::complete);
}

// RFC 9112, 3.2: an HTTP/1.1 request without a Host header is a 400; HTTP/1.0 needs none.
TEST(http_framing, an_http11_request_needs_a_host) {
    const head_verdict v = check("GET /health HTTP/1.1\r\nAccept: */*\r\n\r\n");
    EXPECT_EQ(v.kind, head_verdict::refused);
    EXPECT_NE(v.reason.find("Host"), std::string::npos) << v.reason;
    EXPECT_EQ(check("GET /health HTTP/1.0\r\n\r\n").kind, head_verdict::complete);
}

TEST(http_framing, refuses_ambiguous_or_malformed_framing) {
    const std::string rl = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n";
    for (const std::string h : {
             rl + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",  // CL + TE
             rl + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n",
             rl + "Content-Length: 0\r\nContent-Length: 40\r\n\r\n",  // duplicate CL
             rl + "Content-Length: 4\r\ncontent-length: 4\r\n\r\n",
             rl + "Content-Length: 4, 4\r\n\r\n",  // malformed CL
             rl + "Content-Length: +4\r\n\r\n",
             rl + "Content-Length: -1\r\n\r\n",
             rl + "Content-Length: 0x10\r\n\r\n",
             rl + "Content-Length: \r\n\r\n",
             rl + "Content-Length: 99999999999999999999\r\n\r\n",
             rl + "Transfer-Encoding: xchunked\r\n\r\n",  // obfuscated TE
             rl + "Transfer-Encoding : chunked\r\n\r\n",
             rl + "Transfer-Encoding: chunked, identity\r\n\r\n",
             rl + "Transfer-Encoding: gzip, chunked\r\n\r\n",
             rl + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
             rl + "Transfer-Encoding:\x0b" "chunked\r\n\r\n",
             rl + " Transfer-Encoding: chunked\r\n\r\n",
             rl + "Transfer-Encoding:\r\n chunked\r\n\r\n",  // folded
             rl + "X-A: b\r\n\tc\r\n\r\n",
             rl + "Content-Length: 4\nX: y\r\n\r\n",  // bare LF
             rl + "X: a\rb\r\n\r\n",                  // bare CR
             rl + "No colon\r\n\r\n",
             rl + "Host: y\r\n\r\n",  // two Host
             std::string("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
             std::string("GET /health HTTP/1.1 x\r\n\r\n"),  // bad request lines
             std::string("GET  /health HTTP/1.1\r\n\r\n"),
             std::string("GET /health\r\n\r\n"),
             std::string("GET /health HTTP/2.0\r\n\r\n"),
             std::string("GET /health http/1.1\r\n\r\n"),
             std::string("G(T /health HTTP/1.1\r\n\r\n"),
             std::string("GET /he\x7fllo HTTP/1.1\r\n\r\n"),
             std::string("\r\nGET /health HTTP/1.1\r\n\r\n"),
         }) {
        SCOPED_TRACE(h);
        const head_verdict v = check(h);
        EXPECT_EQ(v.kind, head_verdict::refused);
        EXPECT_FALSE(v.reason.empty());
    }
    // A bare LF is refused before the head ends.
    EXPECT_EQ(check("GET / HTTP/1.1\n").kind, head_verdict::refused);
}

}  // namespace
}  // namespace warmctx::server_detail
