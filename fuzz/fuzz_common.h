// fuzz/fuzz_common.h - what the harnesses share: a check that aborts (libFuzzer saves the
// input as a crash), and the fixtures a harness runs its input against.
//
// A harness never trusts the code under test to notice its own mistakes: besides "no
// crash, no sanitizer report", each one checks properties the contracts promise (a
// value read back equals the value written, an error body is valid JSON, input order
// does not change an assembled prompt).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "util/json.h"
#include "warmctx/profile.h"

#define FUZZ_CHECK(cond)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            std::fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            std::abort();                                                                     \
        }                                                                                     \
    } while (0)

// FUZZ_CHECK with a message (a status's text, say) printed on failure.
#define FUZZ_CHECK_MSG(cond, msg)                                                                      \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            std::fprintf(stderr, "fuzz check failed: %s (%s:%d): %s\n", #cond, __FILE__, __LINE__,       \
                         std::string(msg).c_str());                                                    \
            std::abort();                                                                              \
        }                                                                                              \
    } while (0)

namespace warmctx::fuzz {

inline std::string_view as_text(const uint8_t * data, size_t size) {
    return {reinterpret_cast<const char *>(data), size};
}

// An error body (api_error::body()): dump_json's output, so JSON by construction; what
// could go wrong is a message that cut a character of the input in half.
inline void check_error_body(const std::string & body) {
    FUZZ_CHECK_MSG(find_invalid_utf8(body) == k_utf8_valid, body);
    FUZZ_CHECK(body.rfind("{\"error\":{", 0) == 0);
}

// Text that warmctx writes as JSON must read back through the strict reader.
inline void check_json_text(const std::string & text) {
    FUZZ_CHECK(find_invalid_utf8(text) == k_utf8_valid);
    auto back = parse_json(text);
    FUZZ_CHECK_MSG(back.ok(), back.error().message() + " in " + text.substr(0, 200));
}

// A profile like the engine's (chunk size small so short prompts have several blocks).
inline profile fixture_profile() {
    profile p;
    p.model_digest = "00112233445566778899aabbccddeeff";
    p.tokenizer_digest = "ffeeddccbbaa99887766554433221100";
    p.chat_template_digest = "0123456789abcdef0123456789abcdef";
    p.llama_commit = "80fb11ac73e66d89eae2c6a91d8a77428fa733ed";
    p.backend = "CPU";
    p.rope_freq_base = 1000000.0f;
    p.rope_freq_scale = 1.0f;
    p.kv_type = "f16";
    p.chunk_tokens = 16;
    p.kv_mode = "exact";
    return p;
}

}  // namespace warmctx::fuzz
