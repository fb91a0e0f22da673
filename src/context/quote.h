// Internal: user-supplied strings inside error messages.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace warmctx::detail {

// 'text' in single quotes, control and non-ASCII bytes as \xNN, cut after 80 bytes:
// a message must stay one readable line whatever the input was.
inline std::string quote_input(std::string_view s) {
    constexpr size_t k_max_bytes = 80;
    std::string out = "'";
    for (size_t i = 0; i < s.size() && i < k_max_bytes; ++i) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c < 0x20 || c >= 0x7f || c == '\'' || c == '\\') {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    if (s.size() > k_max_bytes) out += "...";
    out += "'";
    return out;
}

}  // namespace warmctx::detail
