#include "openai.h"

#include "warmctx/explain_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>

#include "json_util.h"
#include "request_fields.h"
#include "warmctx/assembler.h"
#include "warmctx/hash.h"
#include "warmctx/kind_table.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

// A message's content: a string, null, or an array of text parts.
maybe_error message_content(const json & msg, std::string_view param, std::string & out) {
    out.clear();
    auto it = msg.find("content");
    if (it == msg.end() || it->is_null()) return std::nullopt;
    if (it->is_string()) { out = it->get<std::string>(); return std::nullopt; }
    if (!it->is_array()) return wrong_type(param, "a string, null or an array of text parts", *it);
    for (size_t k = 0; k < it->size(); ++k) {
        const json & part = (*it)[k];
        std::string pp = index_param(param, k);
        if (!part.is_object()) return wrong_type(pp, "an object", part);
        auto type = part.find("type");
        if (type == part.end() || !type->is_string() || type->get<std::string>() != "text")
            return bad_request("unsupported_content", pp + ": only {\"type\": \"text\"} content parts are supported",
                               pp + ".type");
        auto text = part.find("text");
        if (text == part.end() || !text->is_string()) return wrong_type(pp + ".text", "a string", text == part.end() ? json() : *text);
        if (k > 0) out += "\n";
        out += text->get<std::string>();
    }
    return std::nullopt;
}

char hex_digit(unsigned v) { return "0123456789abcdef"[v & 15]; }

std::string padded(char prefix, size_t i, int width) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%c%0*zu", prefix, width, i);
    return buf;
}

}  // namespace

maybe_error validate_workspace_id(std::string_view id, std::string_view param) {
    auto fail = [&](const std::string & why) {
        return bad_request("invalid_workspace", "invalid workspace id '" + std::string(id.substr(0, 80)) + "': " + why,
                           std::string(param));
    };
    if (id.empty()) return fail("empty");
    if (id.size() > 64) return fail("longer than 64 characters");
    if (id.front() == '.') return fail("starts with '.'");
    for (char c : id) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                  c == '_' || c == '-';
        if (!ok) return fail("only A-Z a-z 0-9 . _ - are allowed");
    }
    return std::nullopt;
}

namespace {

std::string with_commas(size_t v) {
    std::string d = std::to_string(v), out;
    for (size_t i = 0; i < d.size(); ++i) {
        if (i > 0 && (d.size() - i) % 3 == 0) out += ',';
        out += d[i];
    }
    return out;
}

// A tools array's count and canonical size against the bounds (the count first: it
// costs nothing).
maybe_error check_tools_count(size_t n, std::string_view param, const request_bounds & b) {
    if (n > b.max_tools)
        return bad_request("too_many_tools",
                           std::string(param) + " has " + with_commas(n) + " tools; at most " + with_commas(b.max_tools) +
                               " are allowed (the server's --max-tools)",
                           std::string(param));
    return std::nullopt;
}
maybe_error check_tools_bytes(size_t bytes, std::string_view param, const request_bounds & b) {
    if (bytes > b.max_tools_bytes)
        return bad_request("tools_too_large",
                           std::string(param) + " is " + with_commas(bytes) + " bytes as canonical JSON; at most " +
                               with_commas(b.max_tools_bytes) + " are allowed (the server's --max-tools-bytes)",
                           std::string(param));
    return std::nullopt;
}

// The deepest nesting of groups, `(...)`, and classes, `[...]`, in a regular expression
// (escapes skipped; a class holds no group).
size_t pattern_nesting(std::string_view p) {
    size_t depth = 0, deepest = 0;
    bool in_class = false;
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c == '\\') {
            ++i;
            continue;
        }
        if (in_class) {
            if (c == ']') in_class = false, --depth;
            continue;
        }
        if (c == '[') in_class = true, deepest = std::max(deepest, ++depth);
        else if (c == '(') deepest = std::max(deepest, ++depth);
        else if (c == ')' && depth > 0) --depth;
    }
    return deepest;
}

// A local JSON pointer ("#/$defs/a") inside `root`, or nullptr.
const json * resolve_pointer(const json & root, std::string_view ref) {
    if (ref.substr(0, 2) != "#/" && ref != "#") return nullptr;
    const json * at = &root;
    size_t i = 1;
    while (i < ref.size()) {
        size_t j = ref.find('/', i + 1);
        if (j == std::string_view::npos) j = ref.size();
        std::string tok(ref.substr(i + 1, j - i - 1));
        for (size_t k; (k = tok.find("~1")) != std::string::npos;) tok.replace(k, 2, "/");
        for (size_t k; (k = tok.find("~0")) != std::string::npos;) tok.replace(k, 2, "~");
        if (at->is_object()) {
            auto it = at->find(tok);
            if (it == at->end()) return nullptr;
            at = &*it;
        } else if (at->is_array()) {
            if (tok.empty() || tok.size() > 9 || tok.find_first_not_of("0123456789") != std::string::npos) return nullptr;
            const size_t n = std::stoul(tok);
            if (n >= at->size()) return nullptr;
            at = &(*at)[n];
        } else {
            return nullptr;
        }
        i = j;
    }
    return at;
}

}  // namespace

maybe_error check_schema_bounds(const json & schema, std::string_view param, const request_bounds & b,
                                schema_tally & tally) {
    const std::string p(param);
    auto refuse = [&](const char * code, const std::string & why) {
        return bad_request(code, p + ": " + why, p);
    };
    // Every node, iteratively (the body's depth is bounded, but so is this stack).
    std::vector<const json *> todo{&schema};
    while (!todo.empty()) {
        const json * n = todo.back();
        todo.pop_back();
        if (n->is_array()) {
            for (const json & v : *n) todo.push_back(&v);
            continue;
        }
        if (!n->is_object()) continue;
        for (auto it = n->begin(); it != n->end(); ++it) {
            const std::string & key = it.key();
            const json & v = it.value();
            if (key == "enum" && v.is_array()) {
                tally.enum_values += v.size();
                if (tally.enum_values > b.max_enum_values)
                    return refuse("too_many_enum_values",
                                  "the request's schemas have more than " + with_commas(b.max_enum_values) +
                                      " enum values in all (the server's --max-enum-values)");
                continue;  // values, not schemas
            }
            if (key == "const") continue;
            if (key == "pattern" && v.is_string()) {
                const std::string & pat = v.get_ref<const std::string &>();
                if (pat.size() > b.max_pattern_bytes)
                    return refuse("pattern_too_long", "a pattern of " + with_commas(pat.size()) + " bytes; at most " +
                                                          with_commas(b.max_pattern_bytes) +
                                                          " are allowed (the server's --max-pattern-bytes)");
                if (const size_t d = pattern_nesting(pat); d > b.max_pattern_nesting)
                    return refuse("pattern_too_deep", "a pattern nested " + std::to_string(d) + " deep; at most " +
                                                          std::to_string(b.max_pattern_nesting) +
                                                          " are allowed (the server's --max-pattern-nesting)");
                continue;
            }
            if (key == "$ref") {
                if (!v.is_string()) return refuse("unsupported_schema", "$ref must be a string");
                const std::string & ref = v.get_ref<const std::string &>();
                // Only a pointer into this schema: a remote one would be fetched by
                // nobody, and the converter would accept any value in its place.
                const json * target = resolve_pointer(schema, ref);
                if (!target)
                    return refuse("unsupported_schema",
                                  "$ref '" + ref.substr(0, 80) +
                                      "' is not a pointer into this schema (\"#/...\"; remote references are not "
                                      "fetched)");
                // A chain of references that only refer on comes back to itself: no
                // value can ever match it.
                std::vector<const json *> seen{n};
                for (const json * t = target; t && t->is_object() && t->contains("$ref");) {
                    if (std::find(seen.begin(), seen.end(), t) != seen.end() || seen.size() > 64)
                        return refuse("unsupported_schema", "$ref '" + ref.substr(0, 80) +
                                                                "' refers to itself through references only");
                    seen.push_back(t);
                    const json & r = (*t)["$ref"];
                    t = r.is_string() ? resolve_pointer(schema, r.get_ref<const std::string &>()) : nullptr;
                }
                continue;
            }
            if (v.is_object() || v.is_array()) todo.push_back(&v);
        }
    }
    return std::nullopt;
}

maybe_error check_tools_segments(const std::vector<segment> & segs, const request_bounds & b) {
    for (const segment & s : segs) {
        if (s.kind != segment_kind::tools) continue;
        const std::string param = s.id == "tools" ? "tools" : "segments." + s.id.substr(0, 64);
        // Free text that describes tools renders as a message: the content's own bounds
        // hold it. An OpenAI tools array is rendered by the template and becomes a grammar.
        const size_t b0 = s.content.find_first_not_of(" \t\r\n");
        if (b0 == std::string::npos || s.content[b0] != '[') continue;
        if (auto e = check_tools_bytes(s.content.size(), param, b)) return e;
        auto arr = parse_json(s.content);
        if (!arr.ok() || !arr->is_array()) continue;
        if (auto e = check_tools_count(arr->size(), param, b)) return e;
        schema_tally tally;
        for (size_t k = 0; k < arr->size(); ++k)
            if (const json * fn = field((*arr)[k], "function"))
                if (const json * params = field(*fn, "parameters"))
                    if (auto e = check_schema_bounds(*params, index_param(param, k, "function.parameters"), b, tally))
                        return e;
    }
    return std::nullopt;
}

maybe_error map_messages(const json & messages, const json * tools, std::vector<segment> & out,
                         const request_bounds & bounds) {
    if (!messages.is_array()) return wrong_type("messages", "an array", messages);
    const size_t max_messages = std::min(bounds.max_messages, k_max_messages);
    if (messages.size() > max_messages)
        return bad_request("too_many_messages",
                           "messages has " + with_commas(messages.size()) + " messages; at most " +
                               with_commas(max_messages) + " are allowed (the server's --max-messages)",
                           "messages");
    if (tools && tools->is_array())
        if (auto e = check_tools_count(tools->size(), "tools", bounds)) return e;
    size_t n_system = 0, n_history = 0;
    for (size_t i = 0; i < messages.size(); ++i) {
        const json & m = messages[i];
        const std::string p = index_param("messages", i);
        if (!m.is_object()) return wrong_type(p, "an object", m);
        auto r = m.find("role");
        if (r == m.end() || r->is_null()) return bad_request("missing_field", p + ".role is required", p + ".role");
        if (!r->is_string()) return wrong_type(p + ".role", "a string", *r);
        const std::string role = r->get<std::string>();
        std::string content;
        if (auto e = message_content(m, p + ".content", content)) return e;

        segment s;
        if (role == "system" || role == "developer") {
            s.kind = segment_kind::system;
            char buf[32];
            std::snprintf(buf, sizeof buf, "system-%03zu", n_system++);
            s.id = buf;
        } else if (role == "user" || role == "assistant" || role == "tool") {
            if (role == "assistant") {
                if (const json * tc = field(m, "tool_calls"); tc && !tc->is_null()) {
                    if (!tc->is_array()) return wrong_type(p + ".tool_calls", "an array", *tc);
                    for (size_t k = 0; k < tc->size(); ++k) {
                        const json & c = (*tc)[k];
                        const std::string cp = index_param(p + ".tool_calls", k);
                        if (!c.is_object()) return wrong_type(cp, "an object", c);
                        const json * fn = field(c, "function");
                        if (!fn || !fn->is_object()) return bad_request("missing_field", cp + ".function is required", cp + ".function");
                        const json * name = field(*fn, "name");
                        if (!name || !name->is_string())
                            return bad_request("missing_field", cp + ".function.name must be a string", cp + ".function.name");
                        const json * args = field(*fn, "arguments");
                        if (args && !args->is_string() && !args->is_object())
                            return wrong_type(cp + ".function.arguments", "a string of JSON", *args);
                    }
                    if (!tc->empty()) s.tool_calls = dump_json(*tc);  // std::map keys: sorted, canonical
                }
            }
            if (role == "tool") {
                if (const json * id = field(m, "tool_call_id"); id && !id->is_null()) {
                    if (!id->is_string()) return wrong_type(p + ".tool_call_id", "a string", *id);
                    s.tool_call_id = id->get<std::string>();
                }
            }
            const bool last = i + 1 == messages.size();
            if (last && role == "user") {
                s.kind = segment_kind::user;
                s.id = "user";
            } else {
                s.kind = segment_kind::history;
                s.id = padded('h', n_history++, 4);
                s.role = role;
            }
        } else {
            return bad_request("unknown_role",
                               p + ".role: unknown role '" + role.substr(0, 40) +
                                   "' (expected system, developer, user, assistant or tool)",
                               p + ".role");
        }
        s.content = std::move(content);
        out.push_back(std::move(s));
    }
    if (tools) {
        if (!tools->is_array()) return wrong_type("tools", "an array", *tools);
        if (!tools->empty()) {
            segment s;
            s.kind = segment_kind::tools;
            s.id = "tools";
            schema_tally tally;  // enum values over every tool's parameters
            for (size_t k = 0; k < tools->size(); ++k) {
                const json & t = (*tools)[k];
                const std::string tp = index_param("tools", k);
                if (!t.is_object()) return wrong_type(tp, "an object", t);
                const json * type = field(t, "type");
                if (!type || *type != "function")
                    return bad_request("unsupported_parameter", tp + ".type: only \"function\" tools are supported",
                                       tp + ".type");
                const json * fn = field(t, "function");
                if (!fn || !fn->is_object()) return bad_request("missing_field", tp + ".function is required", tp + ".function");
                const json * name = field(*fn, "name");
                if (!name || !name->is_string() || name->get<std::string>().empty())
                    return bad_request("missing_field", tp + ".function.name must be a non-empty string",
                                       tp + ".function.name");
                if (const json * params = field(*fn, "parameters"))
                    if (auto e = check_schema_bounds(*params, tp + ".function.parameters", bounds, tally)) return e;
            }
            s.content = dump_json(*tools);
            if (auto e = check_tools_bytes(s.content.size(), "tools", bounds)) return e;
            out.push_back(std::move(s));
        }
    }
    return std::nullopt;
}

maybe_error parse_segment_body(const json & obj, std::string id, std::string_view param, segment & out) {
    const std::string p(param);
    if (!obj.is_object()) return wrong_type(p, "an object", obj);
    if (status st = validate_segment_id(id); !st.ok())
        return bad_request("invalid_segment_id", st.message(), p.empty() ? "id" : p + ".id");
    out.id = std::move(id);
    auto fname = [&](const char * f) { return p.empty() ? std::string(f) : p + "." + f; };

    const json * kind = field(obj, "kind");
    if (!kind) return bad_request("missing_field", fname("kind") + " is required", fname("kind"));
    if (!kind->is_string()) return wrong_type(fname("kind"), "a string", *kind);
    auto k = parse_segment_kind(kind->get<std::string>());
    if (!k.ok()) return bad_request("invalid_kind", k.error().message(), fname("kind"));
    out.kind = *k;

    const json * content = field(obj, "content");
    if (!content) return bad_request("missing_field", fname("content") + " is required", fname("content"));
    if (!content->is_string()) return wrong_type(fname("content"), "a string", *content);
    out.content = content->get<std::string>();

    std::optional<std::string> path, role;
    if (auto e = get_string(obj, "path", fname("path"), path)) return e;
    if (auto e = get_string(obj, "role", fname("role"), role)) return e;
    out.path = path.value_or("");
    out.role = role.value_or("");
    if (!out.role.empty() && !is_chat_role(out.role))
        return bad_request("unknown_role", fname("role") + ": unknown role '" + out.role.substr(0, 40) + "'", fname("role"));
    return std::nullopt;
}

void canonicalize_stored_tools(segment & s) {
    if (s.kind != segment_kind::tools) return;
    auto arr = parse_json(s.content);
    if (arr.ok() && arr->is_array()) s.content = dump_json(*arr);
}

maybe_error parse_segments(const json & arr, std::string_view param, std::vector<segment> & out) {
    if (!arr.is_array()) return wrong_type(param, "an array", arr);
    if (arr.size() > k_max_request_segments)
        return bad_request("too_many_segments", "at most " + std::to_string(k_max_request_segments) + " segments",
                           std::string(param));
    for (size_t i = 0; i < arr.size(); ++i) {
        const std::string p = index_param(param, i);
        const json & o = arr[i];
        if (!o.is_object()) return wrong_type(p, "an object", o);
        const json * id = field(o, "id");
        if (!id) return bad_request("missing_field", p + ".id is required", p + ".id");
        if (!id->is_string()) return wrong_type(p + ".id", "a string", *id);
        segment s;
        if (auto e = parse_segment_body(o, id->get<std::string>(), p, s)) return e;
        out.push_back(std::move(s));
    }
    return std::nullopt;
}

// response_format json_object: llama.cpp's grammars/json.gbnf (MIT), a JSON object.
const char * const k_json_object_grammar = R"gbnf(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)gbnf";

maybe_error parse_completion_request(const json & body, body_mode mode, const request_limits & limits,
                                     completion_request & out) {
    if (!body.is_object()) return wrong_type("body", "a JSON object", body);
    out = completion_request{};
    out.shape = mode == body_mode::text ? api_shape::text : api_shape::chat;

    // ---- content ----
    const json * messages = field(body, "messages");
    const json * segs = field(body, "segments");
    const json * tools = field(body, "tools");
    if (mode == body_mode::text) {
        const json * prompt = field(body, "prompt");
        if (!prompt) return bad_request("missing_field", "prompt is required", "prompt");
        std::string text;
        if (prompt->is_string()) {
            text = prompt->get<std::string>();
        } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
            text = (*prompt)[0].get<std::string>();
        } else if (prompt->is_array()) {
            return bad_request("unsupported_prompt", "prompt must be a string or an array of exactly one string",
                               "prompt");
        } else {
            return wrong_type("prompt", "a string", *prompt);
        }
        if (text.empty()) return bad_request("invalid_value", "prompt is empty", "prompt");
        // The prompt as given, no chat template (OpenAI's and llama-server's meaning).
        segment s;
        s.kind = segment_kind::user;
        s.id = "prompt";
        s.content = std::move(text);
        out.segments.push_back(std::move(s));
        out.raw = true;
        if (tools && !tools->is_null())
            return bad_request("unsupported_parameter", "tools is not supported by /v1/completions (use chat)", "tools");
        if (segs && !segs->is_null())
            return bad_request("unsupported_parameter",
                               "segments is not supported by /v1/completions: its prompt is raw text", "segments");
        if (const json * sf = field(body, "suffix"); sf && !sf->is_null()) {
            if (!sf->is_string()) return wrong_type("suffix", "a string", *sf);
            if (!sf->get<std::string>().empty()) out.suffix = sf->get<std::string>();
        }
    } else {
        if (!messages && !(mode == body_mode::workspace_chat && segs)) {
            return bad_request("missing_field",
                               mode == body_mode::chat ? "messages is required"
                                                       : "messages or segments is required (the volatile tail)",
                               "messages");
        }
        if (messages) {
            if (!messages->is_array()) return wrong_type("messages", "an array", *messages);
            if (messages->empty() && !segs) return bad_request("invalid_value", "messages is empty", "messages");
            if (auto e = map_messages(*messages, tools, out.segments, limits.bounds)) return e;
        } else if (tools) {
            if (auto e = map_messages(json::array(), tools, out.segments, limits.bounds)) return e;
        }
    }
    if (segs && mode != body_mode::text) {
        if (auto e = parse_segments(*segs, "segments", out.segments)) return e;
        // A body's own tools segment: the same bounds as a chat's `tools`.
        if (auto e = check_tools_segments(out.segments, limits.bounds)) return e;
    }
    if (out.segments.empty()) return bad_request("invalid_value", "the request has no content", "messages");

    std::optional<std::string> ws;
    if (auto e = get_string(body, "workspace", "workspace", ws)) return e;
    if (ws) {
        if (auto e = validate_workspace_id(*ws)) return e;
        out.workspace = *ws;
    }
    // OpenAI's prompt_cache_key (requests that share a prefix) names the workspace when
    // the request names none: itself when it is a valid workspace id, else "key-" and
    // 16 hex digits of its hash.
    std::optional<std::string> pck;
    if (auto e = get_string(body, "prompt_cache_key", "prompt_cache_key", pck)) return e;
    if (pck && !pck->empty() && out.workspace.empty()) {
        if (!validate_workspace_id(*pck)) out.workspace = *pck;
        else out.workspace = "key-" + hash_string(*pck).hex().substr(0, 16);
        out.workspace_from_cache_key = true;
    }

    // ---- sampling ----
    sampling_params & sp = out.sampling;
    std::optional<int64_t> max_tokens, max_completion_tokens, seed, n, top_k;
    if (auto e = get_int(body, "max_tokens", "max_tokens", max_tokens)) return e;
    if (auto e = get_int(body, "max_completion_tokens", "max_completion_tokens", max_completion_tokens)) return e;
    const char * mt_name = max_completion_tokens ? "max_completion_tokens" : "max_tokens";
    std::optional<int64_t> mt = max_completion_tokens ? max_completion_tokens : max_tokens;
    if (mt) {
        if (*mt < 1) return bad_request("invalid_value", std::string(mt_name) + " must be at least 1", mt_name);
        if (*mt > limits.max_tokens_cap)
            return bad_request("invalid_value",
                               std::string(mt_name) + " must be at most " + std::to_string(limits.max_tokens_cap) +
                                   " (the context per sequence)",
                               mt_name);
        sp.max_tokens = static_cast<int32_t>(*mt);
    } else {
        // As OpenAI and llama-server: to the end (of the context), unless the server
        // sets a default.
        sp.max_tokens = limits.default_max_tokens > 0 ? std::min(limits.default_max_tokens, limits.max_tokens_cap)
                                                      : limits.max_tokens_cap;
    }

    std::optional<double> temperature, top_p;
    if (auto e = get_number(body, "temperature", "temperature", temperature)) return e;
    if (temperature && (*temperature < 0 || *temperature > 2))
        return bad_request("invalid_value", "temperature must be in [0, 2]", "temperature");
    sp.temperature = static_cast<float>(temperature.value_or(1.0));
    if (auto e = get_number(body, "top_p", "top_p", top_p)) return e;
    if (top_p && (*top_p <= 0 || *top_p > 1)) return bad_request("invalid_value", "top_p must be in (0, 1]", "top_p");
    // A positive top_p below float's smallest normal value rounds to 0 or to a denormal
    // (0 where denormals are flushed), which the engine refuses after queueing the job;
    // the smallest normal float keeps the same one most likely token.
    sp.top_p = std::max(static_cast<float>(top_p.value_or(1.0)), std::numeric_limits<float>::min());
    if (auto e = get_int(body, "top_k", "top_k", top_k)) return e;
    if (top_k && (*top_k < 0 || *top_k > 1000000)) return bad_request("invalid_value", "top_k must be in [0, 1000000]", "top_k");
    sp.top_k = static_cast<int32_t>(top_k.value_or(0));

    if (auto e = get_int(body, "seed", "seed", seed)) return e;
    if (seed) {
        // Any integer is accepted; the sampler takes 32 bits of it.
        sp.seed = static_cast<uint32_t>(static_cast<uint64_t>(*seed));
    } else {
        thread_local std::mt19937 rng{std::random_device{}()};
        sp.seed = static_cast<uint32_t>(rng());
    }

    if (auto e = get_int(body, "n", "n", n)) return e;
    if (n && *n != 1) return bad_request("unsupported_value", "only n = 1 is supported", "n");

    std::optional<double> presence, frequency;
    if (auto e = get_number(body, "presence_penalty", "presence_penalty", presence)) return e;
    if (presence && (*presence < -2 || *presence > 2))
        return bad_request("invalid_value", "presence_penalty must be in [-2, 2]", "presence_penalty");
    if (auto e = get_number(body, "frequency_penalty", "frequency_penalty", frequency)) return e;
    if (frequency && (*frequency < -2 || *frequency > 2))
        return bad_request("invalid_value", "frequency_penalty must be in [-2, 2]", "frequency_penalty");
    sp.presence_penalty = static_cast<float>(presence.value_or(0));
    sp.frequency_penalty = static_cast<float>(frequency.value_or(0));
    if (const json * lb = field(body, "logit_bias")) {
        if (!lb->is_object()) return wrong_type("logit_bias", "an object of token id -> bias", *lb);
        if (lb->size() > 1024) return bad_request("invalid_value", "at most 1024 logit_bias entries", "logit_bias");
        for (const auto & [key, v] : lb->items()) {
            const std::string param = "logit_bias." + key.substr(0, 32);
            char * end = nullptr;
            const long id = std::strtol(key.c_str(), &end, 10);
            if (key.empty() || *end != '\0' || id < 0 || (limits.n_vocab > 0 && id >= limits.n_vocab))
                return bad_request("invalid_value",
                                   "logit_bias keys must be token ids of this model (0.." +
                                       std::to_string(std::max(0, limits.n_vocab - 1)) + ")",
                                   param);
            if (!v.is_number()) return wrong_type(param, "a number", v);
            const double b = v.get<double>();
            if (b < -100 || b > 100) return bad_request("invalid_value", "a logit_bias value must be in [-100, 100]", param);
            sp.logit_bias.emplace_back(static_cast<token_id>(id), static_cast<float>(b));
        }
    }

    // Not implemented yet: refused by name, never silently ignored.
    auto refuse = [](const char * param, const std::string & why) {
        return bad_request("unsupported_parameter", std::string(param) + " is not supported: " + why, param);
    };
    // logprobs: chat `logprobs: true` with `top_logprobs` 0..20; text `logprobs: k` (0..20).
    if (const json * v = field(body, "logprobs"); v && !v->is_null()) {
        if (mode == body_mode::text) {
            if (!v->is_number_integer()) return wrong_type("logprobs", "an integer", *v);
            const int64_t k = v->get<int64_t>();
            if (k < 0 || k > 20) return bad_request("invalid_value", "logprobs must be in [0, 20]", "logprobs");
            sp.n_logprobs = static_cast<int32_t>(k);
        } else {
            if (!v->is_boolean()) return wrong_type("logprobs", "a boolean", *v);
            if (v->get<bool>()) sp.n_logprobs = 0;
        }
    }
    if (const json * v = field(body, "top_logprobs"); v && !v->is_null()) {
        if (mode == body_mode::text) return bad_request("invalid_value", "top_logprobs is a chat field", "top_logprobs");
        if (!v->is_number_integer()) return wrong_type("top_logprobs", "an integer", *v);
        const int64_t k = v->get<int64_t>();
        if (k < 0 || k > 20) return bad_request("invalid_value", "top_logprobs must be in [0, 20]", "top_logprobs");
        if (sp.n_logprobs < 0)
            return bad_request("invalid_value", "top_logprobs needs logprobs: true", "top_logprobs");
        sp.n_logprobs = static_cast<int32_t>(k);
    }
    if (const json * v = field(body, "response_format"); v && !v->is_null()) {
        if (!v->is_object() || !v->contains("type") || !(*v)["type"].is_string())
            return wrong_type("response_format", "an object with a string `type`", *v);
        if ((*v)["type"] == "json_object") {
            sp.grammar = k_json_object_grammar;
        } else if ((*v)["type"] == "json_schema") {
            const json * js = field(*v, "json_schema");
            if (!js || !js->is_object()) return wrong_type("response_format.json_schema", "an object", js ? *js : json());
            const json * schema = field(*js, "schema");
            if (!schema || !schema->is_object())
                return bad_request("missing_field", "response_format.json_schema.schema must be an object",
                                   "response_format.json_schema.schema");
            // Bounded before it is converted (on another thread) or sampled (on the engine's).
            schema_tally tally;
            if (auto e = check_schema_bounds(*schema, "response_format.json_schema.schema", limits.bounds, tally))
                return e;
            out.json_schema = dump_json(*schema);
        } else if ((*v)["type"] != "text") {
            return bad_request("invalid_value", "response_format.type must be text, json_object or json_schema",
                               "response_format.type");
        }
    }
    for (const segment & s : out.segments)
        if (s.kind == segment_kind::tools && s.id == "tools") out.tools_json = s.content;
    if (const json * v = field(body, "tool_choice"); v && !v->is_null()) {
        if (v->is_string() && *v == "auto") {
            out.tool_choice = tool_choice_mode::auto_;
        } else if (v->is_string() && *v == "none") {
            out.tool_choice = tool_choice_mode::none;
        } else if (v->is_string() && *v == "required") {
            out.tool_choice = tool_choice_mode::required;
        } else if (v->is_object() && field(*v, "function") && (*v)["function"].is_object() &&
                   (*v)["function"].contains("name") && (*v)["function"]["name"].is_string()) {
            out.tool_choice = tool_choice_mode::required;
            out.tool_choice_name = (*v)["function"]["name"].get<std::string>();
        } else {
            return bad_request("invalid_value",
                               "tool_choice must be \"auto\", \"none\", \"required\" or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                               "tool_choice");
        }
        if (out.tool_choice == tool_choice_mode::required && out.tools_json.empty())
            return bad_request("invalid_value", "tool_choice requires a tool call but the request has no tools",
                               "tool_choice");
    }
    if (const json * v = field(body, "parallel_tool_calls"); v && !v->is_null()) {
        if (!v->is_boolean()) return wrong_type("parallel_tool_calls", "a boolean", *v);
        out.parallel_tool_calls = v->get<bool>();
    }
    if (!out.json_schema.empty() && !out.tools_json.empty() && out.tool_choice != tool_choice_mode::none)
        return refuse("response_format", "a json_schema together with tools (use one or the other)");
    if (mode == body_mode::text) {
        if (const json * v = field(body, "echo"); v && v->is_boolean() && v->get<bool>())
            return refuse("echo", "the prompt is not echoed back");
        if (const json * v = field(body, "best_of"); v && v->is_number_integer() && v->get<int64_t>() > 1)
            return refuse("best_of", "only best_of = 1");
    }

    if (const json * stop = field(body, "stop")) {
        if (stop->is_string()) {
            sp.stop.push_back(stop->get<std::string>());
        } else if (stop->is_array()) {
            if (stop->size() > k_max_stop_strings)
                return bad_request("invalid_value", "at most " + std::to_string(k_max_stop_strings) + " stop strings",
                                   "stop");
            for (size_t i = 0; i < stop->size(); ++i) {
                if (!(*stop)[i].is_string()) return wrong_type(index_param("stop", i), "a string", (*stop)[i]);
                sp.stop.push_back((*stop)[i].get<std::string>());
            }
        } else {
            return wrong_type("stop", "a string or an array of strings", *stop);
        }
        for (size_t i = 0; i < sp.stop.size(); ++i)
            if (sp.stop[i].empty()) return bad_request("invalid_value", "stop strings must not be empty", "stop");
    }

    std::optional<bool> stream;
    if (auto e = get_bool(body, "stream", "stream", stream)) return e;
    out.stream = stream.value_or(false);
    if (const json * so = field(body, "stream_options")) {
        if (!so->is_object()) return wrong_type("stream_options", "an object", *so);
        std::optional<bool> iu;
        if (auto e = get_bool(*so, "include_usage", "stream_options.include_usage", iu)) return e;
        out.include_usage = iu.value_or(false);
    }
    return std::nullopt;
}

std::string derive_workspace(const std::vector<segment> & segs) {
    hash128 h;
    bool any = false;
    // Segments in a fixed order (they are already in input order; system ids are
    // ordered and there is one tools segment), length-prefixed so that no two
    // different set-ups hash the same bytes.
    for (const segment & s : segs) {
        if (s.kind != segment_kind::system && s.kind != segment_kind::tools) continue;
        any = true;
        for (const std::string * part : {&s.id, &s.content}) {
            uint64_t n = part->size();
            h = hash_combine(h, &n, sizeof n);
            h = hash_combine(h, part->data(), part->size());
        }
    }
    if (!any) return "default";
    std::string hex = "auto-";
    for (int i = 60; i >= 0; i -= 4) hex.push_back(hex_digit(static_cast<unsigned>(h.hi >> i)));
    return hex;
}

// ---- responses -------------------------------------------------------------------

std::string_view openai_finish_reason(finish_reason r) {
    switch (r) {
        case finish_reason::stop:
        case finish_reason::eos: return "stop";
        case finish_reason::length:
        case finish_reason::context_full: return "length";
    }
    return "stop";
}

json usage_json(const completion_usage & u) {
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json segment_json(const segment & s) {
    json j = {{"id", s.id}, {"kind", segment_kind_name(s.kind)}, {"content", s.content}};
    if (!s.path.empty()) j["path"] = s.path;
    if (!s.role.empty()) j["role"] = s.role;
    return j;
}

json warmctx_json(const std::string & workspace, const explain_report & ex, const completion_event & done,
                  const request_timings & rt) {
    return {{"workspace", workspace},
            {"tokens_reused", ex.n_reused},
            {"tokens_prefilled", ex.n_prefilled},
            {"tokens_cacheable", ex.n_cacheable},
            {"result", miss_kind_name(ex.kind)},
            {"tier", kv_tier_name(ex.tier)},
            {"reason", ex.reason},
            {"missed_segment", ex.missed_segment},
            {"stable_prefix_hash", ex.stable_prefix_hash},
            {"prewarm", prewarm_json(ex.prewarm)},
            {"queue_ms", done.t_queue_ms},
            {"first_token_ms", done.t_first_token_ms},
            {"total_ms", done.t_total_ms},
            {"request_ms", rt.request_ms},
            // Every phase of the wait for the first token, each once: their sum is
            // request_ms + first_token_ms less the engine thread's bookkeeping.
            {"timings",
             {{"parse_ms", std::max(0.0, rt.request_ms - rt.assemble_ms - rt.answer_wait_ms)},
              {"assemble_ms", rt.assemble_ms + done.t_assemble_ms},
              {"answer_wait_ms", rt.answer_wait_ms},
              {"queue_ms", done.t_queue_ms},
              {"sampler_ms", done.t_sampler_ms},
              {"write_back_ms", done.t_write_back_ms},
              {"lookup_ms", done.t_lookup_ms},
              {"restore_ms", done.t_restore_ms},
              {"copy_ms", done.t_copy_ms},
              {"prefill_ms", done.t_prefill_ms},
              {"interleave_ms", done.t_interleave_ms}}}};
}

namespace {
json chunk_base(const response_meta & m) {
    return {{"id", m.id},
            {"object", m.shape == api_shape::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", m.created},
            {"model", m.model}};
}
}  // namespace

namespace {
json bytes_of(const std::string & piece) {
    json b = json::array();
    for (unsigned char c : piece) b.push_back((int)c);
    return b;
}
}  // namespace

json logprobs_json(api_shape shape, const std::vector<token_logprobs> & lps, size_t offset) {
    if (shape == api_shape::chat) {
        json content = json::array();
        for (const token_logprobs & t : lps) {
            json top = json::array();
            for (const token_logprob & a : t.top)
                top.push_back({{"token", a.piece}, {"logprob", a.logprob}, {"bytes", bytes_of(a.piece)}});
            content.push_back({{"token", t.chosen.piece},
                               {"logprob", t.chosen.logprob},
                               {"bytes", bytes_of(t.chosen.piece)},
                               {"top_logprobs", std::move(top)}});
        }
        return {{"content", std::move(content)}};
    }
    json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
    for (const token_logprobs & t : lps) {
        tokens.push_back(t.chosen.piece);
        token_lps.push_back(t.chosen.logprob);
        json top = json::object();
        for (const token_logprob & a : t.top) top[a.piece] = a.logprob;
        tops.push_back(std::move(top));
        offsets.push_back(offset);
        offset += t.chosen.piece.size();
    }
    return {{"tokens", std::move(tokens)},
            {"token_logprobs", std::move(token_lps)},
            {"top_logprobs", std::move(tops)},
            {"text_offset", std::move(offsets)}};
}

json tool_call_json(const parsed_tool_call & c, int index) {
    json j = {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
    if (index >= 0) j["index"] = index;
    return j;
}

json completion_response(const response_meta & m, const std::string & text, finish_reason finish,
                         const completion_usage & usage, json warmctx_ext, json logprobs, const parsed_answer * parsed) {
    json choice = {{"index", 0}, {"finish_reason", openai_finish_reason(finish)}};
    if (m.shape == api_shape::chat && parsed) {
        json msg = {{"role", "assistant"}};
        const bool calls = !parsed->tool_calls.empty();
        msg["content"] = calls && parsed->content.empty() ? json(nullptr) : json(parsed->content);
        if (!parsed->reasoning.empty()) msg["reasoning_content"] = parsed->reasoning;
        if (calls) {
            json arr = json::array();
            for (const auto & c : parsed->tool_calls) arr.push_back(tool_call_json(c));
            msg["tool_calls"] = std::move(arr);
            if (finish != finish_reason::length && finish != finish_reason::context_full)
                choice["finish_reason"] = "tool_calls";
        }
        choice["message"] = std::move(msg);
    } else if (m.shape == api_shape::chat) {
        choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
        choice["text"] = text;
    }
    choice["logprobs"] = std::move(logprobs);
    return {{"id", m.id},
            {"object", m.shape == api_shape::chat ? "chat.completion" : "text_completion"},
            {"created", m.created},
            {"model", m.model},
            {"choices", json::array({std::move(choice)})},
            {"usage", usage_json(usage)},
            {"warmctx", std::move(warmctx_ext)}};
}

json chunk_role(const response_meta & m, bool include_usage) {
    json j = chunk_base(m);
    j["choices"] = json::array(
        {{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}}});
    if (include_usage) j["usage"] = nullptr;
    return j;
}

json chunk_delta(const response_meta & m, const std::string & text, bool include_usage, json logprobs) {
    json j = chunk_base(m);
    if (m.shape == api_shape::chat) {
        json choice = {{"index", 0}, {"delta", {{"content", text}}}, {"finish_reason", nullptr}};
        if (!logprobs.is_null()) choice["logprobs"] = std::move(logprobs);
        j["choices"] = json::array({std::move(choice)});
    } else {
        j["choices"] = json::array({{{"index", 0}, {"text", text}, {"logprobs", std::move(logprobs)}, {"finish_reason", nullptr}}});
    }
    if (include_usage) j["usage"] = nullptr;
    return j;
}

json chunk_tool_calls(const response_meta & m, json calls, bool include_usage) {
    json j = chunk_base(m);
    j["choices"] = json::array({{{"index", 0}, {"delta", {{"tool_calls", std::move(calls)}}}, {"finish_reason", nullptr}}});
    if (include_usage) j["usage"] = nullptr;
    return j;
}

json chunk_finish(const response_meta & m, finish_reason finish, bool include_usage, json warmctx_ext, bool tool_calls) {
    json j = chunk_base(m);
    if (m.shape == api_shape::chat)
        j["choices"] = json::array({{{"index", 0},
                                     {"delta", json::object()},
                                     {"finish_reason", tool_calls ? std::string_view("tool_calls")
                                                                  : openai_finish_reason(finish)}}});
    else
        j["choices"] = json::array(
            {{{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", openai_finish_reason(finish)}}});
    if (include_usage) j["usage"] = nullptr;
    j["warmctx"] = std::move(warmctx_ext);
    return j;
}

json chunk_usage(const response_meta & m, const completion_usage & usage) {
    json j = chunk_base(m);
    j["choices"] = json::array();
    j["usage"] = usage_json(usage);
    return j;
}

}  // namespace warmctx::server_detail
