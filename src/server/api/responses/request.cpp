// The Responses API's request side (responses.h): a Responses body -> the chat request
// it means, and chat errors renamed to the Responses field they came from.
#include <cmath>
#include <limits>
#include <utility>

#include "json_util.h"
#include "request_fields.h"
#include "responses.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

api_error refuse(std::string_view param, std::string_view why) {
    return bad_request("unsupported_parameter", std::string(param) + " is not supported: " + std::string(why),
                       std::string(param));
}

api_error missing(std::string_view param) {
    return bad_request("missing_field", std::string(param) + " is required", std::string(param));
}

std::string sub(std::string_view base, std::string_view name) { return std::string(base) + "." + std::string(name); }
std::string idx(std::string_view base, size_t i) { return std::string(base) + "[" + std::to_string(i) + "]"; }

// The fields a value must have as a string: absent or null is "missing".
maybe_error need_string(const json & obj, const char * key, std::string_view param, std::string & out) {
    std::optional<std::string> v;
    if (auto e = get_string(obj, key, param, v)) return e;
    if (!v) return missing(param);
    out = std::move(*v);
    return std::nullopt;
}

// Text content: a string, or an array of text parts (input_text, output_text, text),
// joined with "\n" as the chat side joins its parts. Images, files and audio are
// refused by name. `param` names the content ("input[2].content", "input[4].output").
maybe_error text_content(const json & v, std::string_view param, std::string & out) {
    out.clear();
    if (v.is_string()) { out = v.get<std::string>(); return std::nullopt; }
    if (!v.is_array()) return wrong_type(param, "a string or an array of content parts", v);
    for (size_t j = 0; j < v.size(); ++j) {
        const json & part = v[j];
        const std::string pp = idx(param, j);
        if (!part.is_object()) return wrong_type(pp, "an object", part);
        std::string type;
        if (auto e = need_string(part, "type", sub(pp, "type"), type)) return e;
        if (type == "input_image" || type == "input_file" || type == "input_audio")
            return refuse(sub(pp, "type"), "'" + type + "' parts (this server reads text only)");
        if (type != "input_text" && type != "output_text" && type != "text")
            return bad_request("invalid_value",
                               sub(pp, "type") + ": unknown content part type '" + type.substr(0, 40) +
                                   "' (expected input_text or output_text)",
                               sub(pp, "type"));
        std::string text;
        if (auto e = need_string(part, "text", sub(pp, "text"), text)) return e;
        if (j > 0) out += "\n";
        out += text;
    }
    return std::nullopt;
}

// tools[i] -> the chat tool. Only function tools: everything else is hosted by OpenAI.
maybe_error translate_tool(const json & t, size_t i, json & out) {
    const std::string p = idx("tools", i);
    if (!t.is_object()) return wrong_type(p, "an object", t);
    std::string type;
    if (auto e = need_string(t, "type", sub(p, "type"), type)) return e;
    if (type == "custom")
        return refuse(sub(p, "type"),
                      "custom (freeform) tools: the model's output is not constrained to a tool's grammar here; "
                      "declare the tool as {\"type\": \"function\"} with JSON parameters instead");
    if (type != "function")
        return refuse(sub(p, "type"), "'" + type.substr(0, 40) +
                                          "' is a tool OpenAI hosts; this server runs function tools only");
    json fn = json::object();
    std::string name;
    if (auto e = need_string(t, "name", sub(p, "name"), name)) return e;
    fn["name"] = name;
    std::optional<std::string> description;
    if (auto e = get_string(t, "description", sub(p, "description"), description)) return e;
    if (description) fn["description"] = *description;
    if (const json * params = field(t, "parameters")) {
        if (!params->is_object()) return wrong_type(sub(p, "parameters"), "an object (a JSON schema)", *params);
        fn["parameters"] = *params;
    }
    std::optional<bool> strict;
    if (auto e = get_bool(t, "strict", sub(p, "strict"), strict)) return e;
    if (strict) fn["strict"] = *strict;
    out = {{"type", "function"}, {"function", std::move(fn)}};
    return std::nullopt;
}

// The input array -> chat messages (appended to `messages`, their sources to `sources`).
maybe_error translate_items(const json & input, json & messages, std::vector<std::string> & sources) {
    // True while the last message is an assistant message that a function_call item
    // joins (it came from an assistant message item or from function_call items).
    bool assistant_open = false;
    for (size_t i = 0; i < input.size(); ++i) {
        const json & item = input[i];
        const std::string p = idx("input", i);
        if (!item.is_object()) return wrong_type(p, "an object", item);
        std::string type = "message";  // an "easy input message" has no type
        if (const json * t = field(item, "type")) {
            if (!t->is_string()) return wrong_type(sub(p, "type"), "a string", *t);
            type = t->get<std::string>();
        }

        if (type == "message") {
            std::string role;
            if (auto e = need_string(item, "role", sub(p, "role"), role)) return e;
            if (role != "user" && role != "assistant" && role != "system" && role != "developer")
                return bad_request("unknown_role",
                                   sub(p, "role") + ": unknown role '" + role.substr(0, 40) +
                                       "' (expected user, assistant, system or developer)",
                                   sub(p, "role"));
            const json * c = field(item, "content");
            if (!c) return missing(sub(p, "content"));
            std::string text;
            if (auto e = text_content(*c, sub(p, "content"), text)) return e;
            messages.push_back({{"role", role}, {"content", std::move(text)}});
            sources.push_back(p);
            assistant_open = role == "assistant";
        } else if (type == "function_call") {
            std::string call_id, name, arguments;
            if (auto e = need_string(item, "call_id", sub(p, "call_id"), call_id)) return e;
            if (auto e = need_string(item, "name", sub(p, "name"), name)) return e;
            if (auto e = need_string(item, "arguments", sub(p, "arguments"), arguments)) return e;
            json call = {{"id", call_id},
                         {"type", "function"},
                         {"function", {{"name", name}, {"arguments", arguments}}}};
            if (!assistant_open) {
                messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array()}});
                sources.push_back(p);
                assistant_open = true;
            }
            json & m = messages.back();
            if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
            m["tool_calls"].push_back(std::move(call));
        } else if (type == "function_call_output") {
            std::string call_id, output;
            if (auto e = need_string(item, "call_id", sub(p, "call_id"), call_id)) return e;
            const json * o = field(item, "output");
            if (!o) return missing(sub(p, "output"));
            if (auto e = text_content(*o, sub(p, "output"), output)) return e;
            messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(output)}});
            sources.push_back(p);
            assistant_open = false;
        } else if (type == "reasoning") {
            // Accepted and skipped: a hosted model's (encrypted) reasoning means nothing
            // to a local one. Function calls on either side of it still merge.
        } else if (type == "item_reference") {
            return refuse(sub(p, "type"), "item_reference: nothing is stored here, send the item itself");
        } else {
            return bad_request("unsupported_parameter",
                               sub(p, "type") + ": input items of type '" + type.substr(0, 40) +
                                   "' are not supported (message, function_call, function_call_output and "
                                   "reasoning are)",
                               sub(p, "type"));
        }
    }
    return std::nullopt;
}

// The text.format object -> chat's response_format (null for plain text), and the
// normalized format to echo.
maybe_error translate_format(const json & fmt, json & response_format, json & echo) {
    const std::string p = "text.format";
    if (!fmt.is_object()) return wrong_type(p, "an object", fmt);
    std::string type;
    if (auto e = need_string(fmt, "type", sub(p, "type"), type)) return e;
    if (type == "text") {
        response_format = nullptr;
        echo = {{"type", "text"}};
    } else if (type == "json_object") {
        response_format = {{"type", "json_object"}};
        echo = {{"type", "json_object"}};
    } else if (type == "json_schema") {
        json js = json::object();
        std::string name;
        if (auto e = need_string(fmt, "name", sub(p, "name"), name)) return e;
        js["name"] = name;
        const json * schema = field(fmt, "schema");
        if (!schema) return missing(sub(p, "schema"));
        if (!schema->is_object()) return wrong_type(sub(p, "schema"), "an object (a JSON schema)", *schema);
        js["schema"] = *schema;
        std::optional<bool> strict;
        if (auto e = get_bool(fmt, "strict", sub(p, "strict"), strict)) return e;
        if (strict) js["strict"] = *strict;
        std::optional<std::string> description;
        if (auto e = get_string(fmt, "description", sub(p, "description"), description)) return e;
        if (description) js["description"] = *description;
        response_format = {{"type", "json_schema"}, {"json_schema", js}};
        echo = js;
        echo["type"] = "json_schema";
    } else {
        return bad_request("invalid_value",
                           sub(p, "type") + ": unknown format '" + type.substr(0, 40) +
                               "' (expected text, json_object or json_schema)",
                           sub(p, "type"));
    }
    return std::nullopt;
}

// The fields accepted and ignored, each type-checked so that a malformed body is still
// a 400 naming the field.
maybe_error check_ignored(const json & body) {
    if (const json * v = field(body, "include")) {
        if (!v->is_array()) return wrong_type("include", "an array of strings", *v);
        for (size_t i = 0; i < v->size(); ++i)
            if (!(*v)[i].is_string()) return wrong_type(idx("include", i), "a string", (*v)[i]);
    }
    std::optional<std::string> s;
    for (const char * name : {"service_tier", "prompt_cache_retention"})
        if (auto e = get_string(body, name, name, s)) return e;
    if (const json * v = field(body, "stream_options"); v && !v->is_object())
        return wrong_type("stream_options", "an object", *v);
    std::optional<int64_t> n;
    if (auto e = get_int(body, "max_tool_calls", "max_tool_calls", n)) return e;
    return std::nullopt;
}

// The fields that ask for what a stateless local server does not have: refused by name.
maybe_error check_refused(const json & body) {
    std::optional<bool> store, background;
    if (auto e = get_bool(body, "store", "store", store)) return e;
    if (store.value_or(false))
        return refuse("store", "true: this server stores no responses (send store: false, and the whole input "
                               "with each request)");
    if (field(body, "previous_response_id"))
        return refuse("previous_response_id", "this server stores no responses; send the whole conversation in "
                                              "`input`");
    if (field(body, "conversation"))
        return refuse("conversation", "this server stores no conversations; send the whole conversation in `input`");
    if (auto e = get_bool(body, "background", "background", background)) return e;
    if (background.value_or(false)) return refuse("background", "true: responses run in the foreground only");
    std::optional<std::string> truncation;
    if (auto e = get_string(body, "truncation", "truncation", truncation)) return e;
    if (truncation && *truncation == "auto")
        return refuse("truncation", "\"auto\": the input is never dropped; a request that does not fit is a 400");
    if (truncation && *truncation != "disabled")
        return bad_request("invalid_value", "truncation must be \"auto\" or \"disabled\"", "truncation");
    if (field(body, "prompt"))
        return refuse("prompt", "stored prompt templates live on OpenAI's platform; send instructions and input");
    std::optional<int64_t> top_logprobs;
    if (auto e = get_int(body, "top_logprobs", "top_logprobs", top_logprobs)) return e;
    if (top_logprobs.value_or(0) != 0)
        return refuse("top_logprobs", "log probabilities are not returned on /v1/responses");
    return std::nullopt;
}

// Rewrites "<from>..." to "<to>..." when `param` starts with `from` as a whole field.
bool rename_prefix(std::string & param, std::string_view from, std::string_view to) {
    if (param.compare(0, from.size(), from) != 0) return false;
    if (param.size() > from.size() && param[from.size()] != '.' && param[from.size()] != '[') return false;
    param = std::string(to) + param.substr(from.size());
    return true;
}

}  // namespace

namespace {

// tools, tool_choice, parallel_tool_calls.
maybe_error translate_tools(const json & body, json & chat_body, responses_request_info & info) {
    if (const json * tools = field(body, "tools")) {
        if (!tools->is_array()) return wrong_type("tools", "an array", *tools);
        json chat_tools = json::array();
        for (size_t i = 0; i < tools->size(); ++i) {
            const json & tool = (*tools)[i];
            // A namespace only groups function tools (Codex sends one): its tools join the
            // list under their own names.
            if (tool.is_object() && tool.value("type", json()) == "namespace") {
                const json * inner = field(tool, "tools");
                if (!inner || !inner->is_array())
                    return bad_request("missing_field", idx("tools", i) + ".tools must be an array of function tools",
                                       idx("tools", i) + ".tools");
                for (size_t k = 0; k < inner->size(); ++k) {
                    json t;
                    if (auto e = translate_tool((*inner)[k], k, t)) {
                        e->param = idx("tools", i) + "." + e->param;
                        e->message = idx("tools", i) + "." + e->message;
                        return e;
                    }
                    chat_tools.push_back(std::move(t));
                }
                continue;
            }
            json t;
            if (auto e = translate_tool(tool, i, t)) return e;
            chat_tools.push_back(std::move(t));
        }
        info.tools = *tools;
        if (!chat_tools.empty()) chat_body["tools"] = std::move(chat_tools);
    }
    if (const json * tc = field(body, "tool_choice")) {
        if (tc->is_string()) {
            const std::string s = tc->get<std::string>();
            if (s != "auto" && s != "none" && s != "required")
                return bad_request("invalid_value", "tool_choice must be \"auto\", \"none\", \"required\" or "
                                                    "{\"type\": \"function\", \"name\": ...}",
                                   "tool_choice");
            chat_body["tool_choice"] = s;
        } else if (tc->is_object()) {
            std::string type;
            if (auto e = need_string(*tc, "type", "tool_choice.type", type)) return e;
            if (type != "function")
                return refuse("tool_choice.type", "'" + type.substr(0, 40) +
                                                      "': only a function can be named (hosted tools and "
                                                      "allowed_tools are not available here)");
            std::string name;
            if (auto e = need_string(*tc, "name", "tool_choice.name", name)) return e;
            chat_body["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
        } else {
            return wrong_type("tool_choice", "a string or an object", *tc);
        }
        info.tool_choice = *tc;
    }
    std::optional<bool> parallel;
    if (auto e = get_bool(body, "parallel_tool_calls", "parallel_tool_calls", parallel)) return e;
    if (parallel) {
        info.parallel_tool_calls = *parallel;
        chat_body["parallel_tool_calls"] = *parallel;
    }

    return std::nullopt;
}

// Sampling, output length, streaming and text.format.
maybe_error translate_output(const json & body, json & chat_body, responses_request_info & info) {
    if (auto e = get_number(body, "temperature", "temperature", info.temperature)) return e;
    if (info.temperature) chat_body["temperature"] = *info.temperature;
    if (auto e = get_number(body, "top_p", "top_p", info.top_p)) return e;
    if (info.top_p) chat_body["top_p"] = *info.top_p;
    if (auto e = get_int(body, "max_output_tokens", "max_output_tokens", info.max_output_tokens)) return e;
    if (info.max_output_tokens) {
        if (*info.max_output_tokens < 1)
            return bad_request("invalid_value", "max_output_tokens must be at least 1", "max_output_tokens");
        chat_body["max_tokens"] = *info.max_output_tokens;
    }
    if (const json * seed = field(body, "seed")) chat_body["seed"] = *seed;  // the chat parser checks it

    std::optional<bool> stream;
    if (auto e = get_bool(body, "stream", "stream", stream)) return e;
    info.stream = stream.value_or(false);
    if (stream) chat_body["stream"] = *stream;
    if (info.stream) chat_body["stream_options"] = {{"include_usage", true}};  // the final event's usage

    if (const json * text = field(body, "text")) {
        if (!text->is_object()) return wrong_type("text", "an object", *text);
        if (const json * fmt = field(*text, "format")) {
            json response_format, echo;
            if (auto e = translate_format(*fmt, response_format, echo)) return e;
            if (!response_format.is_null()) chat_body["response_format"] = std::move(response_format);
            info.text["format"] = std::move(echo);
        }
        std::optional<std::string> verbosity;
        if (auto e = get_string(*text, "verbosity", "text.verbosity", verbosity)) return e;
        if (verbosity) info.text["verbosity"] = *verbosity;
    }

    return std::nullopt;
}

// What the response echoes (and the chat request's user, prompt_cache_key, workspace).
maybe_error translate_echoed(const json & body, json & chat_body, responses_request_info & info) {
    if (const json * r = field(body, "reasoning")) {
        if (!r->is_object()) return wrong_type("reasoning", "an object", *r);
        if (auto e = get_string(*r, "effort", "reasoning.effort", info.reasoning_effort)) return e;
        if (auto e = get_string(*r, "summary", "reasoning.summary", info.reasoning_summary)) return e;
        if (!info.reasoning_summary)
            if (auto e = get_string(*r, "generate_summary", "reasoning.generate_summary", info.reasoning_summary))
                return e;
    }
    if (const json * m = field(body, "metadata")) {
        if (!m->is_object()) return wrong_type("metadata", "an object of string values", *m);
        info.metadata = *m;
    }
    if (auto e = get_string(body, "user", "user", info.user)) return e;
    if (info.user) chat_body["user"] = *info.user;
    if (auto e = get_string(body, "safety_identifier", "safety_identifier", info.safety_identifier)) return e;
    if (auto e = get_string(body, "prompt_cache_key", "prompt_cache_key", info.prompt_cache_key)) return e;
    if (info.prompt_cache_key) chat_body["prompt_cache_key"] = *info.prompt_cache_key;

    // warmctx's own extensions: a named workspace and a cache salt (the chat parser
    // validates them).
    if (const json * ws = field(body, "workspace")) chat_body["workspace"] = *ws;
    if (const json * salt = field(body, "cache_salt")) chat_body["cache_salt"] = *salt;
    return std::nullopt;
}

}  // namespace

maybe_error responses_to_chat(const json & body, json & chat_body, responses_request_info & info) {
    info = responses_request_info{};
    chat_body = json::object();
    if (!body.is_object()) return wrong_type("body", "a JSON object", body);

    if (auto e = check_refused(body)) return e;
    if (auto e = check_ignored(body)) return e;

    std::optional<std::string> model;
    if (auto e = get_string(body, "model", "model", model)) return e;
    if (model) {
        info.model = *model;
        chat_body["model"] = *model;
    }

    // ---- input -> messages ----
    json messages = json::array();
    std::optional<std::string> instructions;
    if (auto e = get_string(body, "instructions", "instructions", instructions)) return e;
    if (instructions) {
        info.instructions = *instructions;
        if (!instructions->empty()) {
            messages.push_back({{"role", "system"}, {"content", *instructions}});
            info.message_sources.push_back("instructions");
        }
    }
    const json * input = field(body, "input");
    if (!input) return missing("input");
    if (input->is_string()) {
        messages.push_back({{"role", "user"}, {"content", input->get<std::string>()}});
        info.message_sources.push_back("input");
    } else if (input->is_array()) {
        if (auto e = translate_items(*input, messages, info.message_sources)) return e;
    } else {
        return wrong_type("input", "a string or an array of input items", *input);
    }
    if (messages.empty() || info.message_sources.back() == "instructions")
        return bad_request("invalid_value", "input has no message to answer", "input");
    chat_body["messages"] = std::move(messages);

    if (auto e = translate_tools(body, chat_body, info)) return e;
    if (auto e = translate_output(body, chat_body, info)) return e;
    return translate_echoed(body, chat_body, info);
}

void chat_error_to_responses(api_error & e, const responses_request_info & info) {
    std::string & p = e.param;
    if (p.empty()) return;
    if (p.rfind("messages", 0) == 0) {
        // messages[k]...: the whole item it came from (its fields have other names here).
        std::string to = "input";
        if (p.size() > 9 && p[8] == '[') {
            const size_t close = p.find(']');
            if (close != std::string::npos) {
                const std::string digits = p.substr(9, close - 9);
                size_t k = 0;
                bool ok = !digits.empty() && digits.size() < 10;
                for (char c : digits) ok = ok && c >= '0' && c <= '9';
                if (ok) k = std::stoul(digits);
                if (ok && k < info.message_sources.size()) to = info.message_sources[k];
            }
        }
        p = to;
        return;
    }
    if (rename_prefix(p, "max_tokens", "max_output_tokens")) return;
    if (rename_prefix(p, "max_completion_tokens", "max_output_tokens")) return;
    if (p.rfind("response_format", 0) == 0) { p = "text.format"; return; }
    if (p.rfind("tool_choice.function.", 0) == 0) { p = "tool_choice." + p.substr(21); return; }
    if (p.rfind("tools[", 0) == 0) {
        const size_t close = p.find(']');
        const std::string fn = ".function";
        if (close != std::string::npos && p.compare(close + 1, fn.size(), fn) == 0)
            p = p.substr(0, close + 1) + p.substr(close + 1 + fn.size());
    }
}

}  // namespace warmctx::server_detail
