#include "workload/workload.h"

#include <algorithm>
#include <sstream>

namespace warmctx {

namespace {
const char * const k_words[] = {
    "buffer", "index", "request", "token", "cache", "segment", "parse", "render", "queue", "thread", "budget",
    "holder", "snapshot", "manifest", "profile", "config", "error", "status", "result", "stream", "socket",
    "handle", "reader", "writer", "layout", "offset", "length", "cursor", "window", "engine", "planner", "policy",
    "worker", "session", "context", "prompt", "vector", "matrix", "schema", "router", "module", "plugin"};
constexpr size_t k_n_words = sizeof(k_words) / sizeof(k_words[0]);
const char * const k_types[] = {"int", "size_t", "std::string", "bool", "double", "Status", "Result<T>", "void"};
}  // namespace

std::string workload_generator::words(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) {
        if (i) s += ' ';
        s += k_words[rng_() % k_n_words];
    }
    return s;
}

std::string workload_generator::identifier() {
    std::string a = k_words[rng_() % k_n_words], b = k_words[rng_() % k_n_words];
    return a + "_" + b + std::to_string(rng_() % 100);
}

std::string workload_generator::fill_to_tokens(size_t target_tokens, const std::function<std::string()> & next_line) {
    // Lines are added in batches sized from the measured tokens per line, then the
    // text is cut back to the last line that keeps it at or under the target.
    std::vector<std::string> lines;
    std::string text;
    size_t tokens = 0;
    while (tokens < target_tokens) {
        size_t per_line = lines.empty() ? 12 : std::max<size_t>(1, tokens / lines.size());
        size_t batch = std::max<size_t>(1, (target_tokens - tokens) / per_line);
        for (size_t i = 0; i < batch; ++i) {
            lines.push_back(next_line());
            text += lines.back();
        }
        tokens = count_(text);
    }
    while (lines.size() > 1 && tokens > target_tokens) {
        text.resize(text.size() - lines.back().size());
        lines.pop_back();
        tokens = count_(text);
    }
    return text;
}

std::string workload_generator::system_prompt() {
    return "You are a careful coding agent working in the user's repository. Read the repository map and the "
           "pinned files before answering. Prefer small, reviewable changes; run the tests after each change; "
           "explain every edit in one sentence. Never invent APIs that the repository does not have.\n";
}

std::string workload_generator::tool_schemas(int n_tools) {
    std::ostringstream o;
    o << "[";
    for (int i = 0; i < n_tools; ++i) {
        std::string name = identifier();
        o << (i ? ",\n" : "\n") << R"({"type":"function","function":{"name":")" << name << R"(","description":")"
          << words(12) << R"(","parameters":{"type":"object","properties":{"path":{"type":"string"},")"
          << identifier() << R"(":{"type":"integer"}},"required":["path"]}}})";
    }
    o << "\n]\n";
    return o.str();
}

std::string workload_generator::repo_rules() {
    std::ostringstream o;
    o << "Repository rules:\n";
    for (int i = 1; i <= 8; ++i) o << i << ". " << words(10) << ".\n";
    return o.str();
}

std::string workload_generator::repo_map(size_t target_tokens) {
    int file = 0, line = 0;
    return fill_to_tokens(target_tokens, [&] {
        if (line++ % 12 == 0) ++file;
        std::ostringstream o;
        o << "src/" << k_words[file % k_n_words] << "/" << k_words[(file * 7) % k_n_words] << file << ".cc:"
          << (line * 17) % 900 + 1 << ": " << k_types[rng_() % 8] << " " << identifier() << "("
          << k_types[rng_() % 8] << " " << identifier() << ")\n";
        return o.str();
    });
}

std::string workload_generator::source_file(const std::string & path, size_t target_tokens) {
    int n = 0;
    std::string head = "// " + path + "\n";
    return head + fill_to_tokens(target_tokens, [&] {
               std::ostringstream o;
               if (n++ % 6 == 0)
                   o << k_types[rng_() % 8] << " " << identifier() << "(" << k_types[rng_() % 8] << " x) {\n";
               else if (n % 6 == 5)
                   o << "}\n";
               else
                   o << "    auto " << identifier() << " = " << identifier() << "(x, " << rng_() % 1000 << ");\n";
               return o.str();
           });
}

std::string workload_generator::diff(const std::string & path, int n_hunks) {
    std::ostringstream o;
    o << "--- a/" << path << "\n+++ b/" << path << "\n";
    for (int h = 0; h < n_hunks; ++h) {
        int at = (int)(rng_() % 400) + 1;
        o << "@@ -" << at << ",3 +" << at << ",4 @@\n";
        o << "     auto " << identifier() << " = " << identifier() << "();\n";
        o << "-    return " << identifier() << "(x);\n";
        o << "+    if (!" << identifier() << ") return Status::error(\"" << words(4) << "\");\n";
        o << "+    return " << identifier() << "(x, " << rng_() % 100 << ");\n";
    }
    return o.str();
}

std::string workload_generator::test_output(int n_failures) {
    std::ostringstream o;
    o << "[==========] Running " << 40 + n_failures << " tests.\n";
    for (int i = 0; i < n_failures; ++i) {
        std::string t = identifier();
        o << "[ RUN      ] " << t << "\nsrc/" << identifier() << ".cc:" << rng_() % 500 << ": Failure\nExpected: "
          << rng_() % 100 << "\n  Actual: " << rng_() % 100 << "\n[  FAILED  ] " << t << "\n";
    }
    o << "[  PASSED  ] 40 tests.\n";
    return o.str();
}

std::string workload_generator::terminal_log(int n_lines) {
    std::ostringstream o;
    for (int i = 0; i < n_lines; ++i) o << "$ " << words(3) << "\n" << words(8) << "\n";
    return o.str();
}

std::string workload_generator::question() {
    return "Why does " + identifier() + " fail when the " + words(2) + " is empty? Propose a fix.";
}

std::string workload_generator::edit_one_line(const std::string & text) {
    // Replace a line near the middle with a new one of the same shape.
    size_t mid = text.size() / 2;
    // On a line's end, the line it ends (else [b, e) would run backwards).
    if (mid > 0 && mid < text.size() && text[mid] == '\n') --mid;
    size_t b = text.rfind('\n', mid);
    b = b == std::string::npos ? 0 : b + 1;
    size_t e = text.find('\n', mid);
    if (e == std::string::npos) e = text.size();
    if (e < b) e = b;  // an empty line
    // A tool schema line (tool_schemas) is replaced by another tool, so that the array
    // stays valid JSON and a template still renders it as tools.
    const std::string line = text.substr(b, e - b);
    if (line.rfind(R"({"type":"function")", 0) == 0) {
        const std::string one = tool_schemas(1);  // "[\n{...}\n]\n"
        const size_t ob = one.find('{'), oe = one.rfind('}');
        const bool comma = !line.empty() && line.back() == ',';
        return text.substr(0, b) + one.substr(ob, oe - ob + 1) + (comma ? "," : "") + text.substr(e);
    }
    return text.substr(0, b) + "// edited: " + words(6) + text.substr(e);
}

std::vector<segment> make_workspace(workload_generator & g, size_t stable_tokens, int n_pinned_files) {
    // Chat markup and the one-line header add a few tokens per segment.
    constexpr size_t k_overhead_tokens = 12;
    std::vector<segment> s;
    s.push_back({"system", segment_kind::system, "", "", g.system_prompt()});
    s.push_back({"tools", segment_kind::tools, "", "", g.tool_schemas(4)});
    s.push_back({"rules", segment_kind::instructions, "", "", g.repo_rules()});
    size_t used = 0;
    for (const auto & x : s) used += g.count(x.content) + k_overhead_tokens;
    // Pinned files take a quarter of what is left, the repo map the rest.
    const size_t left = stable_tokens > used ? stable_tokens - used : 0;
    const size_t per_file = n_pinned_files > 0 ? left / 4 / (size_t)n_pinned_files : 0;
    for (int i = 0; i < n_pinned_files && per_file > 2 * k_overhead_tokens; ++i) {
        std::string path = "src/pinned_" + std::to_string(i) + ".cc";
        s.push_back({"pin-" + std::to_string(i), segment_kind::pinned_file, path, "",
                     g.source_file(path, per_file - k_overhead_tokens)});
        used += g.count(s.back().content) + k_overhead_tokens;
    }
    const size_t map_tokens =
        stable_tokens > used + 2 * k_overhead_tokens ? stable_tokens - used - k_overhead_tokens : 16;
    s.push_back({"repo-map", segment_kind::repo_map, "", "", g.repo_map(map_tokens)});
    s.push_back({"question", segment_kind::user, "", "", g.question()});
    return s;
}

}  // namespace warmctx
