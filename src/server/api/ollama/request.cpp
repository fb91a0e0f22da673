// The Ollama request mappers (ollama.h): /api/chat and /api/generate bodies -> the OpenAI
// bodies they mean, and the OpenAI mapper's errors back in Ollama's field names.
#include <chrono>
#include <cstdio>
#include <ctime>
#include <utility>

#include "json_util.h"
#include "ollama.h"
#include "request_fields.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

api_error unsupported(const std::string & param, const std::string & why) {
    return bad_request("unsupported_parameter", param + ": " + why, param);
}

// A message's images: a text model reads none; an empty array is nothing.
maybe_error no_images(const json & obj, const std::string & param) {
    const json * images = field(obj, "images");
    if (!images) return std::nullopt;
    if (!images->is_array()) return wrong_type(param, "an array", *images);
    if (!images->empty()) return unsupported(param, "this server serves a text model; images cannot be read");
    return std::nullopt;
}

// An Ollama message -> an OpenAI one: tool calls with their arguments as an object and
// an id each (Ollama's carry none), a tool result by name; `thinking` is not sent back.
maybe_error map_message(const json & m, size_t i, json & out) {
    const std::string p = index_param("messages", i);
    if (!m.is_object()) return wrong_type(p, "an object", m);
    if (auto e = no_images(m, p + ".images")) return e;
    out = json::object();
    for (const char * k : {"role", "content"})
        if (const json * v = field(m, k)) out[k] = *v;
    if (!out.contains("content")) out["content"] = "";
    if (const json * calls = field(m, "tool_calls")) {
        if (!calls->is_array()) return wrong_type(p + ".tool_calls", "an array", *calls);
        json arr = json::array();
        for (size_t k = 0; k < calls->size(); ++k) {
            const json & c = (*calls)[k];
            const std::string cp = index_param(p + ".tool_calls", k);
            if (!c.is_object()) return wrong_type(cp, "an object", c);
            const json * fn = field(c, "function");
            if (!fn) return bad_request("missing_field", cp + ".function is required", cp + ".function");
            if (!fn->is_object()) return wrong_type(cp + ".function", "an object", *fn);
            json f = {{"name", field(*fn, "name") ? *field(*fn, "name") : json()}};
            if (const json * args = field(*fn, "arguments"))
                f["arguments"] = *args;
            else
                f["arguments"] = json::object();
            const json * id = field(c, "id");
            char made[48];
            std::snprintf(made, sizeof made, "call_%zu_%zu", i, k);
            arr.push_back({{"id", id && id->is_string() ? id->get<std::string>() : std::string(made)},
                           {"type", "function"},
                           {"function", std::move(f)}});
        }
        if (!arr.empty()) {
            out["tool_calls"] = std::move(arr);
            // A call with no text: no content, as OpenAI clients send it (a template may
            // render an empty string otherwise).
            if (out["content"] == "") out["content"] = nullptr;
        }
    }
    if (const json * name = field(m, "tool_name"); name && name->is_string()) out["name"] = *name;
    return std::nullopt;
}

// options, format, think, logprobs, stream: the parts /api/chat and /api/generate share.
maybe_error map_common(const json & body, json & out) {
    std::optional<bool> stream;
    if (auto e = get_bool(body, "stream", "stream", stream)) return e;
    out["stream"] = stream.value_or(true);  // Ollama streams unless told not to
    if (const json * opts = field(body, "options")) {
        if (!opts->is_object()) return wrong_type("options", "an object", *opts);
        for (const char * k :
             {"temperature", "top_k", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty"})
            if (const json * v = field(*opts, k)) out[k] = *v;
        if (const json * n = field(*opts, "num_predict")) {
            if (!n->is_number_integer()) return wrong_type("options.num_predict", "an integer", *n);
            if (n->get<int64_t>() >= 0) out["max_tokens"] = *n;  // -1: no limit, -2: fill the context
        }
    }
    if (const json * f = field(body, "format")) {
        if (f->is_string()) {
            const std::string & s = f->get_ref<const std::string &>();
            if (s == "json")
                out["response_format"] = {{"type", "json_object"}};
            else if (!s.empty())
                return bad_request("invalid_value", "format must be \"json\" or a JSON schema", "format");
        } else if (f->is_object()) {
            out["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "format"}, {"schema", *f}}}};
        } else {
            return wrong_type("format", "\"json\" or a JSON schema object", *f);
        }
    }
    if (const json * think = field(body, "think")) {
        if (!think->is_boolean() && !think->is_string()) return wrong_type("think", "a boolean or a level", *think);
        if (think->is_boolean() && !think->get<bool>()) out["reasoning_budget_tokens"] = 0;  // ends it at once
    }
    for (const char * k : {"logprobs", "top_logprobs"})
        if (const json * v = field(body, k)) out[k] = *v;
    return std::nullopt;
}

std::string model_of(const json & body) {
    const json * m = field(body, "model");
    return m && m->is_string() ? m->get<std::string>() : std::string();
}

}  // namespace

maybe_error ollama_chat_to_openai(const json & body, json & chat_body, bool & load_only, ollama_request_info & info) {
    if (!body.is_object()) return wrong_type("body", "an object", body);
    info.generate = false;
    info.model = model_of(body);
    chat_body = json::object();
    const json * messages = field(body, "messages");
    if (!messages) return bad_request("missing_field", "messages is required", "messages");
    if (!messages->is_array()) return wrong_type("messages", "an array", *messages);
    load_only = messages->empty();
    json msgs = json::array();
    for (size_t i = 0; i < messages->size(); ++i) {
        json m;
        if (auto e = map_message((*messages)[i], i, m)) return e;
        msgs.push_back(std::move(m));
    }
    chat_body["messages"] = std::move(msgs);
    if (const json * tools = field(body, "tools")) chat_body["tools"] = *tools;
    return map_common(body, chat_body);
}

maybe_error ollama_generate_to_openai(const json & body, json & out, body_mode & mode, bool & load_only,
                                      ollama_request_info & info) {
    if (!body.is_object()) return wrong_type("body", "an object", body);
    info.generate = true;
    info.model = model_of(body);
    out = json::object();
    if (auto e = no_images(body, "images")) return e;
    if (const json * t = field(body, "template"); t && !(t->is_string() && t->get_ref<const std::string &>().empty()))
        return unsupported("template", "prompts are rendered with the model's own chat template");
    if (const json * c = field(body, "context"); c && !(c->is_array() && c->empty()))
        return unsupported("context", "send the conversation as /api/chat messages (every prompt's prefix is reused)");
    std::optional<std::string> prompt, system, suffix;
    std::optional<bool> raw;
    if (auto e = get_string(body, "prompt", "prompt", prompt)) return e;
    if (auto e = get_string(body, "system", "system", system)) return e;
    if (auto e = get_string(body, "suffix", "suffix", suffix)) return e;
    if (auto e = get_bool(body, "raw", "raw", raw)) return e;
    load_only = prompt.value_or("").empty() && suffix.value_or("").empty();
    if (raw.value_or(false)) {
        if (system && !system->empty()) return unsupported("system", "a raw prompt is sent as given, with no system");
        mode = body_mode::text;
        out["prompt"] = prompt.value_or("");
        if (suffix && !suffix->empty()) out["suffix"] = *suffix;
    } else {
        if (suffix && !suffix->empty())
            return unsupported("suffix", "a suffix needs \"raw\": true (fill-in-the-middle)");
        mode = body_mode::chat;
        json msgs = json::array();
        if (system && !system->empty()) msgs.push_back({{"role", "system"}, {"content", *system}});
        msgs.push_back({{"role", "user"}, {"content", prompt.value_or("")}});
        out["messages"] = std::move(msgs);
    }
    return map_common(body, out);
}

void openai_error_to_ollama(api_error & e) {
    static const std::pair<const char *, const char *> names[] = {
        {"max_tokens", "options.num_predict"},
        {"temperature", "options.temperature"},
        {"top_k", "options.top_k"},
        {"top_p", "options.top_p"},
        {"seed", "options.seed"},
        {"stop", "options.stop"},
        {"presence_penalty", "options.presence_penalty"},
        {"frequency_penalty", "options.frequency_penalty"},
        {"response_format", "format"},
        {"reasoning_budget_tokens", "think"},
    };
    // response_format.json_schema.schema is `format` itself.
    static const std::string schema = "response_format.json_schema.schema";
    if (e.param.rfind(schema, 0) == 0) {
        if (e.message.rfind(schema, 0) == 0) e.message = "format" + e.message.substr(schema.size());
        e.param = "format" + e.param.substr(schema.size());
        return;
    }
    for (const auto & [openai, ollama] : names) {
        const std::string o(openai);
        if (e.param != o && e.param.rfind(o + ".", 0) != 0) continue;
        e.param = std::string(ollama) + e.param.substr(o.size());
        if (e.message.rfind(o, 0) == 0) e.message = std::string(ollama) + e.message.substr(o.size());
        return;
    }
}

json ollama_error_json(const api_error & e) { return {{"error", e.message}}; }

std::string ollama_time(int64_t unix_seconds) {
    const std::time_t t = static_cast<std::time_t>(unix_seconds);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string ollama_time_now() {
    const auto now = std::chrono::system_clock::now();
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
    const std::time_t t = static_cast<std::time_t>(us / 1000000);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[48];
    const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    std::snprintf(buf + n, sizeof buf - n, ".%06lldZ", static_cast<long long>(us % 1000000));
    return buf;
}

json ollama_model_details(const model_info & m) {
    // llama_model_desc: "<arch> <size label> <type>", e.g. "qwen2 1B Q4_0".
    std::string quant;
    if (const size_t sp = m.description.rfind(' '); sp != std::string::npos) quant = m.description.substr(sp + 1);
    char size[32];
    const double n = static_cast<double>(m.n_params);
    if (n >= 1e9)
        std::snprintf(size, sizeof size, "%.2fB", n / 1e9);
    else if (n >= 1e6)
        std::snprintf(size, sizeof size, "%.2fM", n / 1e6);
    else
        std::snprintf(size, sizeof size, "%.2fK", n / 1e3);
    return {{"parent_model", ""},       {"format", "gguf"},
            {"family", m.architecture}, {"families", json::array({m.architecture})},
            {"parameter_size", size},   {"quantization_level", quant}};
}

}  // namespace warmctx::server_detail
