#include "server/json_util.h"

#include <algorithm>

namespace warmctx::server_detail {

size_t find_invalid_utf8(std::string_view s) {
    const auto * p = reinterpret_cast<const unsigned char *>(s.data());
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        const unsigned char c = p[i];
        if (c < 0x80) { ++i; continue; }
        size_t len = 0;
        unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
        if (c >= 0xC2 && c <= 0xDF) { len = 2; }
        else if (c == 0xE0) { len = 3; lo = 0xA0; }           // no overlong 3-byte forms
        else if (c >= 0xE1 && c <= 0xEC) { len = 3; }
        else if (c == 0xED) { len = 3; hi = 0x9F; }           // no surrogates
        else if (c >= 0xEE && c <= 0xEF) { len = 3; }
        else if (c == 0xF0) { len = 4; lo = 0x90; }           // no overlong 4-byte forms
        else if (c >= 0xF1 && c <= 0xF3) { len = 4; }
        else if (c == 0xF4) { len = 4; hi = 0x8F; }           // nothing above U+10FFFF
        else return i;                                        // 0x80..0xC1, 0xF5..0xFF
        if (i + len > n) return i;
        if (p[i + 1] < lo || p[i + 1] > hi) return i;
        for (size_t k = 2; k < len; ++k)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
        i += len;
    }
    return k_utf8_valid;
}


std::string dump_json(const nlohmann::json & j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace warmctx::server_detail
