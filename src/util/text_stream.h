// util/text_stream.h - turns generated token pieces into text that is safe to emit.
//
// Two things must never reach a client: part of a stop string (it may complete on the
// next token, and then must not have been shown), and part of a UTF-8 character (a
// token piece may end in the middle of one). push() returns only the text that can no
// longer change; finish() returns the rest.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace warmctx {

class text_stream {
  public:
    explicit text_stream(std::vector<std::string> stop_strings = {});

    // Appends a piece; returns the newly safe text (possibly empty). After a stop
    // string completes, stopped() is true, the text is cut before it, and further
    // pushes return nothing.
    std::string push(std::string_view piece);
    // Everything not yet returned (held-back text when generation ends without a stop).
    std::string finish();

    bool stopped() const { return stopped_; }
    // The whole text so far, cut before a completed stop string.
    const std::string & text() const { return text_; }

  private:
    std::vector<std::string> stops_;
    std::string text_;
    size_t n_emitted_ = 0;
    bool stopped_ = false;
};

// Length of the longest prefix of `s` that ends on a UTF-8 character boundary.
size_t utf8_complete_prefix(std::string_view s);

}  // namespace warmctx
