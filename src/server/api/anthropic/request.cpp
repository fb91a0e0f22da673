// The Anthropic Messages API's request mapper and answer shapes (anthropic.h).
#include "anthropic.h"

#include <algorithm>
#include <random>

#include "json_util.h"
#include "request_fields.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

std::string idx(std::string_view base, size_t i) { return std::string(base) + "[" + std::to_string(i) + "]"; }

api_error unsupported(std::string param, std::string why) {
    return bad_request("unsupported_parameter", param + " is not supported: " + why, param);
}

// The text of a string or of an array of text blocks (joined with "\n"); other blocks
// are refused by name.
maybe_error text_of(const json & v, const std::string & param, std::string & out) {
    if (v.is_string()) {
        out = v.get<std::string>();
        return std::nullopt;
    }
    if (!v.is_array()) return wrong_type(param, "a string or an array of text blocks", v);
    out.clear();
    for (size_t i = 0; i < v.size(); ++i) {
        const json & b = v[i];
        const std::string p = idx(param, i);
        if (!b.is_object()) return wrong_type(p, "an object", b);
        std::optional<std::string> type, text;
        if (auto e = get_string(b, "type", p + ".type", type)) return e;
        if (type != "text")
            return unsupported(p, "only text blocks here (got '" + type.value_or("").substr(0, 40) + "')");
        if (auto e = get_string(b, "text", p + ".text", text)) return e;
        if (!text) return bad_request("missing_field", p + ".text is required", p + ".text");
        if (!out.empty()) out += "\n";
        out += *text;
    }
    return std::nullopt;
}

// One Messages message -> chat messages (a user message's tool results come first, as
// `tool` messages, then its text).
maybe_error translate_message(const json & m, size_t i, json & messages, std::vector<std::string> & sources) {
    const std::string p = idx("messages", i);
    if (!m.is_object()) return wrong_type(p, "an object", m);
    std::optional<std::string> role;
    if (auto e = get_string(m, "role", p + ".role", role)) return e;
    if (!role) return bad_request("missing_field", p + ".role is required", p + ".role");
    if (*role != "user" && *role != "assistant" && *role != "system")
        return bad_request("invalid_value", p + ".role must be \"user\" or \"assistant\"", p + ".role");
    const json * content = field(m, "content");
    if (!content) return bad_request("missing_field", p + ".content is required", p + ".content");
    if (content->is_string()) {
        messages.push_back({{"role", *role}, {"content", content->get<std::string>()}});
        sources.push_back(p);
        return std::nullopt;
    }
    if (!content->is_array()) return wrong_type(p + ".content", "a string or an array of content blocks", *content);
    std::string text;
    json calls = json::array();
    for (size_t k = 0; k < content->size(); ++k) {
        const json & b = (*content)[k];
        const std::string bp = idx(p + ".content", k);
        if (!b.is_object()) return wrong_type(bp, "an object", b);
        std::optional<std::string> type;
        if (auto e = get_string(b, "type", bp + ".type", type)) return e;
        if (!type) return bad_request("missing_field", bp + ".type is required", bp + ".type");
        if (*type == "text") {
            std::optional<std::string> t;
            if (auto e = get_string(b, "text", bp + ".text", t)) return e;
            if (!text.empty() && t && !t->empty()) text += "\n";
            text += t.value_or("");
        } else if (*type == "tool_use" && *role == "assistant") {
            std::optional<std::string> id, name;
            if (auto e = get_string(b, "id", bp + ".id", id)) return e;
            if (auto e = get_string(b, "name", bp + ".name", name)) return e;
            if (!id || !name) return bad_request("missing_field", bp + " needs an id and a name", bp);
            const json * input = field(b, "input");
            calls.push_back(
                {{"id", *id},
                 {"type", "function"},
                 {"function", {{"name", *name}, {"arguments", dump_json(input ? *input : json::object())}}}});
        } else if (*type == "tool_result" && *role == "user") {
            std::optional<std::string> id;
            if (auto e = get_string(b, "tool_use_id", bp + ".tool_use_id", id)) return e;
            if (!id) return bad_request("missing_field", bp + ".tool_use_id is required", bp + ".tool_use_id");
            std::string out;
            if (const json * c = field(b, "content"))
                if (auto e = text_of(*c, bp + ".content", out)) return e;
            std::optional<bool> is_error;
            if (auto e = get_bool(b, "is_error", bp + ".is_error", is_error)) return e;
            if (is_error.value_or(false)) out = "Error: " + out;
            messages.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", out}});
            sources.push_back(bp);
        } else if (*type == "thinking" || *type == "redacted_thinking") {
            continue;  // a local model has no signed reasoning to replay
        } else if (*type == "image" || *type == "document" || *type == "search_result") {
            return bad_request("unsupported_content",
                               bp + ": " + *type + " blocks are not supported (this server runs a text model)", bp);
        } else {
            return unsupported(bp, "a '" + type->substr(0, 40) + "' block in a " + *role + " message");
        }
    }
    if (text.empty() && calls.empty()) return std::nullopt;  // only tool results (or thinking)
    json msg = {{"role", *role}, {"content", text}};
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    messages.push_back(std::move(msg));
    sources.push_back(p);
    return std::nullopt;
}

// system: a string or text blocks; an attribution block goes to `segments`.
maybe_error translate_system(const json & sys, json & messages, json & segments, std::vector<std::string> & sources) {
    auto add = [&](const std::string & text, const std::string & source) {
        if (text.rfind(k_attribution_prefix, 0) == 0) {
            // Each its own segment, in order ("attribution", "attribution-2", ...): a
            // client may send more than one.
            const std::string id =
                segments.empty() ? "attribution" : "attribution-" + std::to_string(segments.size() + 1);
            segments.push_back({{"id", id}, {"kind", "task_summary"}, {"content", text}, {"header", false}});
            return;
        }
        messages.push_back({{"role", "system"}, {"content", text}});
        sources.push_back(source);
    };
    if (sys.is_string()) {
        if (!sys.get<std::string>().empty()) add(sys.get<std::string>(), "system");
        return std::nullopt;
    }
    if (!sys.is_array()) return wrong_type("system", "a string or an array of text blocks", sys);
    for (size_t i = 0; i < sys.size(); ++i) {
        std::string text;
        if (auto e = text_of(json::array({sys[i]}), "system", text)) {
            // text_of saw a one-block array: its "system[0]" is block i.
            const std::string at = idx("system", i);
            if (e->param.rfind("system[0]", 0) == 0) e->param = at + e->param.substr(9);
            if (e->message.rfind("system[0]", 0) == 0) e->message = at + e->message.substr(9);
            return e;
        }
        if (!text.empty()) add(text, idx("system", i));
    }
    return std::nullopt;
}

maybe_error translate_tools(const json & body, json & chat_body) {
    if (const json * tools = field(body, "tools")) {
        if (!tools->is_array()) return wrong_type("tools", "an array", *tools);
        json out = json::array();
        for (size_t i = 0; i < tools->size(); ++i) {
            const json & t = (*tools)[i];
            const std::string p = idx("tools", i);
            if (!t.is_object()) return wrong_type(p, "an object", t);
            std::optional<std::string> type, name, description;
            if (auto e = get_string(t, "type", p + ".type", type)) return e;
            if (type && *type != "custom")
                return unsupported(p + ".type", "'" + type->substr(0, 60) + "' (server tools run at Anthropic; only "
                                                                          "client tools with an input_schema here)");
            if (auto e = get_string(t, "name", p + ".name", name)) return e;
            if (!name) return bad_request("missing_field", p + ".name is required", p + ".name");
            if (auto e = get_string(t, "description", p + ".description", description)) return e;
            const json * schema = field(t, "input_schema");
            if (!schema) return bad_request("missing_field", p + ".input_schema is required", p + ".input_schema");
            json fn = {{"name", *name}, {"parameters", *schema}};
            if (description) fn["description"] = *description;
            out.push_back({{"type", "function"}, {"function", std::move(fn)}});
        }
        if (!out.empty()) chat_body["tools"] = std::move(out);
    }
    if (const json * tc = field(body, "tool_choice")) {
        if (!tc->is_object()) return wrong_type("tool_choice", "an object", *tc);
        std::optional<std::string> type, name;
        if (auto e = get_string(*tc, "type", "tool_choice.type", type)) return e;
        if (type == "auto") chat_body["tool_choice"] = "auto";
        else if (type == "any") chat_body["tool_choice"] = "required";
        else if (type == "none") chat_body["tool_choice"] = "none";
        else if (type == "tool") {
            if (auto e = get_string(*tc, "name", "tool_choice.name", name)) return e;
            if (!name) return bad_request("missing_field", "tool_choice.name is required", "tool_choice.name");
            chat_body["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
        } else {
            return bad_request("invalid_value", "tool_choice.type must be auto, any, tool or none", "tool_choice.type");
        }
        std::optional<bool> no_parallel;
        if (auto e = get_bool(*tc, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use", no_parallel))
            return e;
        if (no_parallel) chat_body["parallel_tool_calls"] = !*no_parallel;
    }
    return std::nullopt;
}

maybe_error translate_sampling(const json & body, int32_t max_tokens_cap, json & chat_body,
                               anthropic_request_info & info) {
    std::optional<int64_t> max_tokens, top_k;
    if (auto e = get_int(body, "max_tokens", "max_tokens", max_tokens)) return e;
    if (!max_tokens) return bad_request("missing_field", "max_tokens is required", "max_tokens");
    if (*max_tokens < 1) return bad_request("invalid_value", "max_tokens must be at least 1", "max_tokens");
    chat_body["max_tokens"] = std::min<int64_t>(*max_tokens, std::max<int32_t>(1, max_tokens_cap));
    std::optional<double> temperature, top_p;
    if (auto e = get_number(body, "temperature", "temperature", temperature)) return e;
    if (temperature) {
        if (*temperature < 0 || *temperature > 1)
            return bad_request("invalid_value", "temperature must be in [0, 1]", "temperature");
        chat_body["temperature"] = *temperature;
    }
    if (auto e = get_number(body, "top_p", "top_p", top_p)) return e;
    if (top_p) chat_body["top_p"] = *top_p;
    if (auto e = get_int(body, "top_k", "top_k", top_k)) return e;
    if (top_k) chat_body["top_k"] = *top_k;
    if (const json * ss = field(body, "stop_sequences")) {
        if (!ss->is_array()) return wrong_type("stop_sequences", "an array of strings", *ss);
        for (size_t i = 0; i < ss->size(); ++i) {
            if (!(*ss)[i].is_string()) return wrong_type(idx("stop_sequences", i), "a string", (*ss)[i]);
            info.stop_sequences.push_back((*ss)[i].get<std::string>());
        }
        if (!ss->empty()) chat_body["stop"] = *ss;
    }
    // thinking {type: "enabled", budget_tokens}: the reasoning budget (as llama-server reads it).
    if (const json * th = field(body, "thinking")) {
        if (!th->is_object()) return wrong_type("thinking", "an object", *th);
        std::optional<std::string> type;
        if (auto e = get_string(*th, "type", "thinking.type", type)) return e;
        if (type && *type == "enabled") {
            std::optional<int64_t> budget;
            if (auto e = get_int(*th, "budget_tokens", "thinking.budget_tokens", budget)) return e;
            if (budget && (*budget < 0 || *budget > std::numeric_limits<int32_t>::max()))
                return bad_request("invalid_value", "thinking.budget_tokens must be a number of tokens",
                                   "thinking.budget_tokens");
            if (budget) chat_body["thinking_budget_tokens"] = *budget;
        }
    }
    std::optional<bool> stream;
    if (auto e = get_bool(body, "stream", "stream", stream)) return e;
    info.stream = stream.value_or(false);
    if (info.stream) chat_body["stream"] = true;
    return std::nullopt;
}

// Structured output: output_config.format (or the earlier top-level output_format)
// {"type": "json_schema", "schema"} as chat's response_format json_schema: the answer's
// text is JSON that follows the schema (Claude Code asks so for a session's title).
maybe_error translate_output_format(const json & body, json & chat_body) {
    std::string param = "output_config.format";
    const json * f = nullptr;
    if (const json * oc = field(body, "output_config")) {
        if (!oc->is_object()) return wrong_type("output_config", "an object", *oc);
        f = field(*oc, "format");
    }
    if (!f) {
        f = field(body, "output_format");
        param = "output_format";
    }
    if (!f) return std::nullopt;
    if (!f->is_object()) return wrong_type(param, "an object", *f);
    const json * type = field(*f, "type");
    if (!type || *type != "json_schema")
        return bad_request("invalid_value", param + ".type must be \"json_schema\"", param + ".type");
    const json * schema = field(*f, "schema");
    if (!schema || !schema->is_object())
        return bad_request("missing_field", param + ".schema must be a JSON schema object", param + ".schema");
    chat_body["response_format"] = {{"type", "json_schema"},
                                    {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
    return std::nullopt;
}

// Claude Code's metadata.user_id: "user_<hash>_account_<uuid>_session_<uuid>" (or a JSON
// object text with a session_id): the session's part, "" when there is none.
std::string session_of_user_id(const std::string & user_id) {
    const size_t at = user_id.rfind("session_");
    if (at != std::string::npos) return user_id.substr(at + 8);
    auto j = parse_json(user_id);
    if (j.ok() && j->is_object())
        if (const json * s = field(*j, "session_id"); s && s->is_string()) return s->get<std::string>();
    return {};
}

}  // namespace

maybe_error anthropic_to_chat(const json & body, std::string_view session, int32_t max_tokens_cap, json & chat_body,
                              anthropic_request_info & info) {
    info = anthropic_request_info{};
    chat_body = json::object();
    if (!body.is_object()) return wrong_type("body", "a JSON object", body);
    std::optional<std::string> model;
    if (auto e = get_string(body, "model", "model", model)) return e;
    info.model = model.value_or("");

    json messages = json::array(), segments = json::array();
    if (const json * sys = field(body, "system"))
        if (auto e = translate_system(*sys, messages, segments, info.message_sources)) return e;
    const json * msgs = field(body, "messages");
    if (!msgs) return bad_request("missing_field", "messages is required", "messages");
    if (!msgs->is_array()) return wrong_type("messages", "an array", *msgs);
    if (msgs->empty()) return bad_request("invalid_value", "messages is empty", "messages");
    for (size_t i = 0; i < msgs->size(); ++i)
        if (auto e = translate_message((*msgs)[i], i, messages, info.message_sources)) return e;
    chat_body["messages"] = std::move(messages);
    if (!segments.empty()) chat_body["segments"] = std::move(segments);

    if (auto e = translate_tools(body, chat_body)) return e;
    if (auto e = translate_sampling(body, max_tokens_cap, chat_body, info)) return e;
    if (auto e = translate_output_format(body, chat_body)) return e;

    std::string key(session);
    if (key.empty())
        if (const json * md = field(body, "metadata"); md && md->is_object())
            if (const json * uid = field(*md, "user_id"); uid && uid->is_string())
                key = session_of_user_id(uid->get<std::string>());
    if (!key.empty()) chat_body["prompt_cache_key"] = key;
    return std::nullopt;
}

void chat_error_to_anthropic(api_error & e, const anthropic_request_info & info) {
    std::string & p = e.param;
    if (p.rfind("messages[", 0) == 0) {
        const size_t close = p.find(']');
        size_t k = 0;
        bool ok = close != std::string::npos && close > 9 && close - 9 < 10;
        for (size_t i = 9; ok && i < close; ++i) ok = p[i] >= '0' && p[i] <= '9';
        if (ok) k = std::stoul(p.substr(9, close - 9));
        p = ok && k < info.message_sources.size() ? info.message_sources[k] : std::string("messages");
    } else if (p.rfind("tools[", 0) == 0) {
        const size_t at = p.find(".function.parameters");
        if (at != std::string::npos) p = p.substr(0, at) + ".input_schema" + p.substr(at + 20);
        else if ((at == std::string::npos) && p.find(".function") != std::string::npos)
            p = p.substr(0, p.find(".function")) + p.substr(p.find(".function") + 9);
    } else if (p == "stop") {
        p = "stop_sequences";
    } else if (p.rfind("response_format", 0) == 0) {
        p = "output_config.format" + (p.rfind("response_format.json_schema.schema", 0) == 0 ? ".schema" + p.substr(34)
                                                                                            : std::string());
    } else if (p.rfind("tool_choice.function.", 0) == 0) {
        p = "tool_choice." + p.substr(21);
    }
}

std::string_view anthropic_error_type(int s) {
    switch (s) {
        case 400:
        case 409:
        case 415:
        case 422: return "invalid_request_error";
        case 401: return "authentication_error";
        case 403: return "permission_error";
        case 404: return "not_found_error";
        case 413: return "request_too_large";
        case 429: return "rate_limit_error";
        case 503:
        case 529: return "overloaded_error";
        default: return "api_error";
    }
}

json anthropic_error_json(const api_error & e) {
    std::string message = e.message;
    if (!e.param.empty() && message.find(e.param) == std::string::npos) message = e.param + ": " + message;
    return {{"type", "error"}, {"error", {{"type", anthropic_error_type(e.http_status)}, {"message", message}}}};
}

std::string make_message_id() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::string id = "msg_";
    const uint64_t a = rng(), b = rng();
    for (int i = 60; i >= 0; i -= 4) id.push_back("0123456789abcdef"[(a >> i) & 15]);
    for (int i = 28; i >= 0; i -= 4) id.push_back("0123456789abcdef"[(b >> i) & 15]);
    return id;
}

json anthropic_usage(int64_t prompt_tokens, int64_t reused, int64_t cacheable, int64_t output_tokens) {
    const int64_t read = std::max<int64_t>(0, reused);
    const int64_t created = std::max<int64_t>(0, std::min(cacheable, prompt_tokens) - read);
    return {{"input_tokens", std::max<int64_t>(0, prompt_tokens - read - created)},
            {"cache_creation_input_tokens", created},
            {"cache_read_input_tokens", read},
            {"output_tokens", output_tokens}};
}

}  // namespace warmctx::server_detail
