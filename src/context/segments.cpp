// Names of the segment enums. The names are part of the public JSON (configuration,
// manifests, the server's segment API), so they never change once published.
#include "warmctx/segments.h"

#include <array>
#include <string>

#include "quote.h"

namespace warmctx {
namespace {

constexpr std::array<std::string_view, k_segment_kind_count> k_kind_names = {
    "system", "tools", "instructions", "repo_map", "pinned_file", "task_summary",
    "history", "diff", "test_output", "terminal_log", "snippet", "user",
};

constexpr std::array<std::string_view, k_retention_class_count> k_class_names = {
    "none", "low", "medium", "high", "highest",
};

template <size_t N>
std::string expected_list(const std::array<std::string_view, N> & names) {
    std::string s;
    for (size_t i = 0; i < N; ++i) {
        if (i) s += ", ";
        s += names[i];
    }
    return s;
}

}  // namespace

std::string_view segment_kind_name(segment_kind k) {
    const auto i = static_cast<size_t>(k);
    return i < k_kind_names.size() ? k_kind_names[i] : "unknown";
}

result<segment_kind> parse_segment_kind(std::string_view s) {
    for (size_t i = 0; i < k_kind_names.size(); ++i)
        if (k_kind_names[i] == s) return static_cast<segment_kind>(i);
    return invalid_argument("unknown segment kind " + detail::quote_input(s) + " (expected one of " +
                            expected_list(k_kind_names) + ")");
}

std::string_view stability_name(stability s) {
    switch (s) {
        case stability::stable: return "stable";
        case stability::stable_ish: return "stable_ish";
        case stability::volatile_: return "volatile";
    }
    return "unknown";
}

std::string_view retention_class_name(retention_class r) {
    const auto i = static_cast<size_t>(r);
    return i < k_class_names.size() ? k_class_names[i] : "unknown";
}

result<retention_class> parse_retention_class(std::string_view s) {
    for (size_t i = 0; i < k_class_names.size(); ++i)
        if (k_class_names[i] == s) return static_cast<retention_class>(i);
    return invalid_argument("unknown retention class " + detail::quote_input(s) + " (expected one of " +
                            expected_list(k_class_names) + ")");
}

}  // namespace warmctx
