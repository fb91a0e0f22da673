#include "util/text_stream.h"

#include <algorithm>

namespace warmctx {

size_t utf8_complete_prefix(std::string_view s) {
    // Walk back over at most 3 continuation bytes to the lead byte of the last character.
    size_t n = s.size();
    size_t i = n;
    int back = 0;
    while (i > 0 && back < 4) {
        unsigned char c = (unsigned char)s[i - 1];
        if ((c & 0xC0) != 0x80) {  // a lead byte (or ASCII)
            size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
            return (n - (i - 1)) >= need ? n : i - 1;
        }
        --i;
        ++back;
    }
    return n;  // only continuation bytes: invalid either way, do not hold back forever
}

text_stream::text_stream(std::vector<std::string> stop_strings) {
    for (auto & s : stop_strings)
        if (!s.empty()) stops_.push_back(std::move(s));
}

std::string text_stream::push(std::string_view piece) {
    if (stopped_) return {};
    text_ += piece;
    // A completed stop string: cut the text before the earliest one.
    size_t cut = std::string::npos;
    for (const auto & s : stops_) {
        // Search from where a new occurrence can start (text already emitted cannot hold one).
        size_t from = n_emitted_ > s.size() ? n_emitted_ - s.size() : 0;
        size_t at = text_.find(s, from);
        if (at != std::string::npos) cut = std::min(cut, at);
    }
    if (cut != std::string::npos) {
        text_.resize(cut);
        stopped_ = true;
        std::string out = cut > n_emitted_ ? text_.substr(n_emitted_) : std::string();
        n_emitted_ = text_.size();
        return out;
    }
    // Hold back a suffix that could still grow into a stop string.
    size_t hold = 0;
    for (const auto & s : stops_) {
        for (size_t k = std::min(s.size() - 1, text_.size()); k > 0; --k) {
            if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
                hold = std::max(hold, k);
                break;
            }
        }
    }
    size_t safe = text_.size() - hold;
    safe = utf8_complete_prefix(std::string_view(text_).substr(0, safe));
    if (safe <= n_emitted_) return {};
    std::string out = text_.substr(n_emitted_, safe - n_emitted_);
    n_emitted_ = safe;
    return out;
}

std::string text_stream::finish() {
    std::string out = n_emitted_ < text_.size() ? text_.substr(n_emitted_) : std::string();
    n_emitted_ = text_.size();
    return out;
}

}  // namespace warmctx
