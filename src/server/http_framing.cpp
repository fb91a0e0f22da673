// See http_framing.h.
#include "http_framing.h"

#include <cctype>
#include <vector>

namespace warmctx::server_detail {

namespace {

bool is_tchar(unsigned char c) {
    if (std::isalnum(c)) return true;
    switch (c) {
        case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-': case '.':
        case '^': case '_': case '`': case '|': case '~':
            return true;
        default:
            return false;
    }
}

bool is_token(std::string_view s) {
    if (s.empty()) return false;
    for (unsigned char c : s)
        if (!is_tchar(c)) return false;
    return true;
}

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
            return false;
    return true;
}

std::string_view trim_ows(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

head_verdict refuse(std::string why) {
    head_verdict v;
    v.kind = head_verdict::refused;
    v.reason = std::move(why);
    return v;
}

std::string shown(std::string_view s) {
    std::string out;
    for (unsigned char c : s.substr(0, 40)) {
        if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
        else out += '?';
    }
    return out;
}

}  // namespace

head_verdict check_request_head(std::string_view b, size_t scan_from) {
    // Where the head ends; a bare LF is refused at once.
    size_t end = std::string_view::npos;
    for (size_t i = scan_from > 3 ? scan_from - 3 : 0; i < b.size(); ++i) {
        if (b[i] != '\n') continue;
        if (i == 0 || b[i - 1] != '\r') return refuse("a line ends with a bare LF (CRLF required)");
        if (i >= 3 && b[i - 2] == '\n' && b[i - 3] == '\r') {
            end = i + 1;
            break;
        }
    }
    if (end == std::string_view::npos) return {};
    const std::string_view head = b.substr(0, end - 2);  // lines, each ending with CRLF

    // Split into lines (each line's CRLF removed); a CR anywhere else is refused.
    std::vector<std::string_view> lines;
    for (size_t pos = 0; pos < head.size();) {
        const size_t lf = head.find('\n', pos);  // always found: head ends with CRLF
        lines.push_back(head.substr(pos, lf - 1 - pos));
        pos = lf + 1;
    }
    for (std::string_view line : lines)
        for (unsigned char c : line)
            if ((c < 0x20 && c != '\t') || c == 0x7f) return refuse("a control character in the request head");

    // The request line.
    const std::string_view rl = lines.empty() ? std::string_view() : lines[0];
    const size_t sp1 = rl.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : rl.find(' ', sp1 + 1);
    if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
        rl.find(' ', sp2 + 1) != std::string_view::npos)
        return refuse("malformed request line \"" + shown(rl) + "\" (method SP target SP HTTP-version)");
    const std::string_view method = rl.substr(0, sp1);
    const std::string_view target = rl.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string_view version = rl.substr(sp2 + 1);
    if (!is_token(method)) return refuse("malformed method in the request line");
    if (target.empty()) return refuse("empty request target");
    for (unsigned char c : target)
        if (c <= 0x20 || c >= 0x7f) return refuse("a request target may hold only visible ASCII characters");
    if (version != "HTTP/1.1" && version != "HTTP/1.0")
        return refuse("unsupported HTTP version \"" + shown(version) + "\" (HTTP/1.1 or HTTP/1.0)");

    // The header fields.
    int n_length = 0, n_te = 0, n_host = 0;
    std::string_view length, te, host;
    for (size_t i = 1; i < lines.size(); ++i) {
        const std::string_view line = lines[i];
        if (line.empty()) return refuse("an empty header line");
        if (line[0] == ' ' || line[0] == '\t') return refuse("a folded header line (obs-fold) is not accepted");
        const size_t colon = line.find(':');
        if (colon == std::string_view::npos) return refuse("a header line without a colon: \"" + shown(line) + "\"");
        const std::string_view name = line.substr(0, colon);
        if (!is_token(name))
            return refuse("malformed header name \"" + shown(name) + "\" (no white space before the colon)");
        const std::string_view value = trim_ows(line.substr(colon + 1));
        if (iequals(name, "Content-Length")) {
            ++n_length;
            length = value;
        } else if (iequals(name, "Transfer-Encoding")) {
            ++n_te;
            te = value;
        } else if (iequals(name, "Host")) {
            ++n_host;
            host = value;
        }
    }
    if (n_length > 1) return refuse("more than one Content-Length header");
    if (n_te > 1) return refuse("more than one Transfer-Encoding header");
    if (n_length && n_te) return refuse("both Content-Length and Transfer-Encoding: the body's length is ambiguous");
    if (n_length) {
        if (length.empty() || length.size() > 19) return refuse("malformed Content-Length");
        for (unsigned char c : length)
            if (c < '0' || c > '9')
                return refuse("malformed Content-Length \"" + shown(length) + "\" (decimal digits only)");
    }
    if (n_te) {
        if (version == "HTTP/1.0") return refuse("Transfer-Encoding on an HTTP/1.0 request");
        if (!iequals(te, "chunked"))
            return refuse("unsupported Transfer-Encoding \"" + shown(te) + "\" (only \"chunked\")");
    }
    if (n_host > 1) return refuse("more than one Host header");
    if (n_host == 0 && version == "HTTP/1.1")
        return refuse("an HTTP/1.1 request without a Host header (RFC 9112, 3.2)");

    head_verdict v;
    v.kind = head_verdict::complete;
    v.length = end;
    v.host = std::string(host);
    return v;
}

}  // namespace warmctx::server_detail
