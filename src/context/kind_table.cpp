#include "warmctx/kind_table.h"
#include "util/json.h"

#include <nlohmann/json.hpp>

#include "quote.h"

namespace warmctx {

using detail::quote_input;

namespace {

constexpr int k_max_order = 1000000;

kind_policy make_policy(stability how_stable, retention_class retention, int order, const char * role,
                        bool role_from_segment = false, bool header = true) {
    kind_policy p;
    p.how_stable = how_stable;
    p.retention = retention;
    p.order = order;
    p.role = role;
    p.role_from_segment = role_from_segment;
    p.header = header;
    return p;
}

// `user` must come strictly after every other kind: a segment after the question
// would be re-prefilled every turn and would separate the question from the answer.
status check_user_last(const kind_table & t) {
    const int user_order = t.policy(segment_kind::user).order;
    for (int i = 0; i < k_segment_kind_count; ++i) {
        const auto k = static_cast<segment_kind>(i);
        if (k == segment_kind::user) continue;
        if (t.policy(k).order >= user_order)
            return invalid_argument("kind table: kind '" + std::string(segment_kind_name(k)) + "' has order " +
                                    std::to_string(t.policy(k).order) + ", but 'user' (order " +
                                    std::to_string(user_order) + ") must stay strictly last");
    }
    return {};
}

}  // namespace

result<stability> parse_stability(std::string_view s) {
    if (s == "stable") return stability::stable;
    if (s == "stable_ish") return stability::stable_ish;
    if (s == "volatile") return stability::volatile_;
    return invalid_argument("unknown stability " + quote_input(s) + " (expected one of stable, stable_ish, volatile)");
}

bool is_chat_role(std::string_view role) {
    return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

kind_table::kind_table() {
    using enum segment_kind;
    using st = stability;
    using rc = retention_class;
    auto set = [this](segment_kind k, kind_policy p) { policies_[static_cast<size_t>(k)] = std::move(p); };
    set(system, make_policy(st::stable, rc::highest, 1, "system"));
    set(tools, make_policy(st::stable, rc::highest, 2, "system"));
    set(instructions, make_policy(st::stable, rc::highest, 3, "system"));
    set(repo_map, make_policy(st::stable, rc::high, 4, "system"));
    set(pinned_file, make_policy(st::stable, rc::high, 5, "system"));
    set(task_summary, make_policy(st::stable_ish, rc::high, 6, "system"));
    // Earlier turns are the conversation itself: their own role, no header.
    set(history, make_policy(st::volatile_, rc::low, 7, "user", /*role_from_segment=*/true, /*header=*/false));
    set(diff, make_policy(st::volatile_, rc::medium, 8, "user"));
    set(test_output, make_policy(st::volatile_, rc::medium, 9, "user"));
    set(terminal_log, make_policy(st::volatile_, rc::low, 10, "user"));
    set(snippet, make_policy(st::volatile_, rc::low, 11, "user"));
    set(user, make_policy(st::volatile_, rc::none, 12, "user", false, /*header=*/false));
}

result<kind_table> kind_table::from_json(std::string_view json_text) {
    auto doc = parse_json(json_text);
    // no exception leaves the module: a parse error is the caller's bad input
    if (!doc) return invalid_argument("kind table: " + doc.error().message());
    return from_json_value(*doc);
}

result<kind_table> kind_table::from_json_value(const nlohmann::json & doc) {
    if (!doc.is_object()) return invalid_argument("kind table: the document must be a JSON object");
    kind_table t;
    for (const auto & [key, value] : doc.items()) {
        if (key != "kinds")
            return invalid_argument("kind table: unknown key " + quote_input(key) + " (expected \"kinds\")");
        if (!value.is_object())
            return invalid_argument("kind table: \"kinds\" must be an object of kind name -> overrides");
    }
    if (!doc.contains("kinds")) return t;

    for (const auto & [kind_name, fields] : doc.at("kinds").items()) {
        auto kind = parse_segment_kind(kind_name);
        if (!kind.ok()) return kind.error().with_context("kind table");
        const std::string where = "kind table: kind '" + kind_name + "'";
        if (!fields.is_object()) return invalid_argument(where + ": overrides must be a JSON object");

        kind_policy & p = t.policies_[static_cast<size_t>(*kind)];
        for (const auto & [field, v] : fields.items()) {
            const std::string at = where + ", field '" + field + "'";
            if (field == "stability") {
                auto str = json_as_string(v, at);
                if (!str.ok()) return str.error();
                auto s = parse_stability(*str);
                if (!s.ok()) return s.error().with_context(at);
                p.how_stable = *s;
            } else if (field == "retention") {
                auto str = json_as_string(v, at);
                if (!str.ok()) return str.error();
                auto r = parse_retention_class(*str);
                if (!r.ok()) return r.error().with_context(at);
                p.retention = *r;
            } else if (field == "order") {
                auto o = json_as_int(v, at, 0, k_max_order);
                if (!o.ok()) return o.error();
                p.order = static_cast<int>(*o);
            } else if (field == "role") {
                auto str = json_as_string(v, at);
                if (!str.ok()) return str.error();
                const std::string role = *str;
                if (!is_chat_role(role))
                    return invalid_argument(at + ": unknown chat role " + quote_input(role) +
                                            " (expected one of system, user, assistant, tool)");
                p.role = role;
            } else if (field == "segment_role") {
                auto b = json_as_bool(v, at);
                if (!b.ok()) return b.error();
                p.role_from_segment = *b;
            } else if (field == "header") {
                auto b = json_as_bool(v, at);
                if (!b.ok()) return b.error();
                p.header = *b;
            } else {
                return invalid_argument(where + ": unknown field " + quote_input(field) +
                                        " (expected stability, retention, order, role, segment_role, header)");
            }
        }
    }
    WARMCTX_RETURN_IF_ERROR(check_user_last(t));
    return t;
}

nlohmann::json kind_table::to_json() const {
    nlohmann::json kinds = nlohmann::json::object();
    for (int i = 0; i < k_segment_kind_count; ++i) {
        const auto k = static_cast<segment_kind>(i);
        const kind_policy & p = policy(k);
        kinds[std::string(segment_kind_name(k))] = {
            {"stability", stability_name(p.how_stable)},
            {"retention", retention_class_name(p.retention)},
            {"order", p.order},
            {"role", p.role},
            {"segment_role", p.role_from_segment},
            {"header", p.header},
        };
    }
    return {{"kinds", std::move(kinds)}};
}

}  // namespace warmctx
