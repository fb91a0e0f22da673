// A typical agent workspace: every kind, several of some, for the context tests.
#pragma once

#include <string>
#include <vector>

#include "warmctx/assembler.h"

namespace warmctx::testing {

inline segment make_segment(std::string id, segment_kind kind, std::string content, std::string path = {},
                            std::string role = {}) {
    segment s;
    s.id = std::move(id);
    s.kind = kind;
    s.content = std::move(content);
    s.path = std::move(path);
    s.role = std::move(role);
    return s;
}

// Deliberately listed out of canonical order.
inline std::vector<segment> typical_workspace() {
    using enum segment_kind;
    return {
        make_segment("q", user, "Why does test_parse fail?"),
        make_segment("diff-1", diff, "--- a/src/parse.cc\n+++ b/src/parse.cc\n@@ -1 +1 @@\n-int x;\n+long x;\n"),
        make_segment("pin/src/parse.cc", pinned_file, "int parse(const char *s) { return s[0]; }\n", "src/parse.cc"),
        make_segment("sys", system, "You are a careful coding agent."),
        make_segment("turn-1-a", history, "I looked at the parser.", {}, "assistant"),
        make_segment("turn-1-u", history, "Please check the tests.", {}, "user"),
        make_segment("tools", tools, "[{\"name\":\"read_file\"},{\"name\":\"run_tests\"}]"),
        make_segment("rules", instructions, "Use snake_case. Never throw across modules."),
        make_segment("map", repo_map, "src/\n  parse.cc\n  lex.cc\ntests/\n  parse_test.cc\n", "src/map.txt"),
        make_segment("pin/src/lex.cc", pinned_file, "int lex(const char *s) { return *s; }\n", "src/lex.cc"),
        make_segment("summary", task_summary, "Task: make parse() accept long input."),
        make_segment("tests-out", test_output, "FAILED test_parse: expected 7, got 0\n"),
        make_segment("term", terminal_log, "$ ninja\n[1/1] Linking\n"),
        make_segment("snip", snippet, "for (;;) {}\n"),
    };
}

inline profile test_profile(uint32_t chunk_tokens = 16) {
    profile p;
    p.model_digest = "00112233445566778899aabbccddeeff";
    p.tokenizer_digest = "tok";
    p.chat_template_digest = "chatml";
    p.llama_commit = "80fb11ac73e66d89eae2c6a91d8a77428fa733ed";
    p.backend = "CPU";
    p.rope_freq_base = 1000000.0f;
    p.rope_freq_scale = 1.0f;
    p.kv_type = "f16";
    p.chunk_tokens = chunk_tokens;
    p.kv_mode = "exact";
    return p;
}

}  // namespace warmctx::testing
