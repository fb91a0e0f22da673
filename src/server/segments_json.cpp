// The API-neutral parts of a request body (segments_json.h).
#include "segments_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "json_util.h"
#include "request_fields.h"
#include "warmctx/hash.h"
#include "warmctx/kind_table.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {
char hex_digit(unsigned v) { return "0123456789abcdef"[v & 15]; }
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
            if (tok.empty() || tok.size() > 9 || tok.find_first_not_of("0123456789") != std::string::npos)
                return nullptr;
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
                           std::string(param) + " has " + with_commas(n) + " tools; at most " +
                               with_commas(b.max_tools) + " are allowed (the server's --max-tools)",
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
            if ((key == "anyOf" || key == "oneOf") && v.is_array()) {
                tally.alternatives += v.size();
                if (tally.alternatives > b.max_schema_alternatives)
                    return refuse("too_many_alternatives",
                                  "the request's schemas have more than " + with_commas(b.max_schema_alternatives) +
                                      " anyOf/oneOf alternatives in all (the server's --max-schema-alternatives)");
            }
            if (key == "properties" && v.is_object()) {
                size_t required = 0;
                if (auto r = n->find("required"); r != n->end() && r->is_array())
                    for (const json & name : *r)
                        if (name.is_string() && v.contains(name.get_ref<const std::string &>())) ++required;
                if (const size_t optional = v.size() - std::min(required, v.size());
                    optional > b.max_optional_properties)
                    return refuse("too_many_optional_properties",
                                  "an object schema with " + with_commas(optional) + " optional properties; at most " +
                                      with_commas(b.max_optional_properties) +
                                      " are allowed (the server's --max-optional-properties; list the others in "
                                      "\"required\")");
                const size_t optional = v.size() - std::min(required, v.size());
                tally.cost += v.size() + optional * optional;
                if (tally.cost > b.max_schema_cost)
                    return refuse("schema_too_costly",
                                  "the request's schemas would make a grammar of about " + with_commas(tally.cost) +
                                      " units (each object schema counts its properties plus the square of its "
                                      "optional ones); at most " + with_commas(b.max_schema_cost) +
                                      " are allowed (the server's --max-schema-cost; list properties in \"required\" "
                                      "or send fewer object schemas)");
            }
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
        return bad_request("unknown_role", fname("role") + ": unknown role '" + out.role.substr(0, 40) + "'",
                           fname("role"));
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
        // A body's segment may ask for no header line (the Anthropic attribution block is
        // such a segment): stored segments keep theirs.
        std::optional<bool> header;
        if (auto e = get_bool(o, "header", p + ".header", header)) return e;
        s.header = header.value_or(true);
        out.push_back(std::move(s));
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


json segment_json(const segment & s) {
    json j = {{"id", s.id}, {"kind", segment_kind_name(s.kind)}, {"content", s.content}};
    if (!s.path.empty()) j["path"] = s.path;
    if (!s.role.empty()) j["role"] = s.role;
    return j;
}

}  // namespace warmctx::server_detail
