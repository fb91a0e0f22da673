// llama-server's request bodies -> native types (llama_server.h): /completion as the
// /v1/completions body it means, /tokenize and /detokenize.
#include "llama_server.h"

#include <algorithm>
#include <limits>

#include "json_util.h"
#include "request_fields.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

api_error unsupported(const std::string & param, const std::string & why) {
    return bad_request("unsupported_parameter", param + ": " + why, param);
}

maybe_error optional_bool(const json & body, const char * key, bool & out) {
    const json * v = field(body, key);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_boolean()) return wrong_type(key, "a boolean", *v);
    out = v->get<bool>();
    return std::nullopt;
}

}  // namespace

maybe_error completion_to_openai(const json & body, json & text_body) {
    if (!body.is_object()) return wrong_type("body", "an object", body);
    const json * prompt = field(body, "prompt");
    if (!prompt) return bad_request("missing_field", "prompt is required", "prompt");
    // Token ids would have to be turned back into text to be assembled: refused, not guessed.
    auto is_ids = [](const json & p) {
        return p.is_array() && !p.empty() &&
               std::all_of(p.begin(), p.end(), [](const json & x) { return x.is_number(); });
    };
    if (is_ids(*prompt) || (prompt->is_array() && !prompt->empty() && is_ids((*prompt)[0])))
        return unsupported("prompt", "a prompt of token ids is not supported; send its text");
    for (const char * k : {"grammar", "json_schema"})
        if (const json * v = field(body, k); v && !v->is_null())
            return unsupported(k, "not supported on /completion; use /v1/chat/completions with response_format");
    text_body = json::object();
    text_body["prompt"] = *prompt;
    for (const char * k : {"temperature", "top_k", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty",
                           "stream", "max_tokens", "logit_bias"})
        if (const json * v = field(body, k); v && !v->is_null()) text_body[k] = *v;
    if (const json * n = field(body, "n_predict"); n && !n->is_null()) {
        if (!n->is_number_integer()) return wrong_type("n_predict", "an integer", *n);
        const int64_t v = n->get<int64_t>();
        if (v < -1) return bad_request("invalid_value", "n_predict must be -1 (no limit) or more", "n_predict");
        if (v >= 0) text_body["max_tokens"] = v;  // -1: to the end of the context, as max_tokens absent
    }
    return std::nullopt;
}

maybe_error parse_tokenize(const json & body, tokenize_request & out) {
    if (!body.is_object()) return wrong_type("body", "an object", body);
    const json * c = field(body, "content");
    if (!c) return bad_request("missing_field", "content is required", "content");
    if (!c->is_string()) return wrong_type("content", "a string", *c);
    out.content = c->get<std::string>();
    if (auto e = optional_bool(body, "add_special", out.add_special)) return e;
    if (auto e = optional_bool(body, "parse_special", out.parse_special)) return e;
    if (auto e = optional_bool(body, "with_pieces", out.with_pieces)) return e;
    return std::nullopt;
}

maybe_error parse_detokenize(const json & body, std::vector<token_id> & out) {
    if (!body.is_object()) return wrong_type("body", "an object", body);
    const json * t = field(body, "tokens");
    if (!t) return bad_request("missing_field", "tokens is required", "tokens");
    if (!t->is_array()) return wrong_type("tokens", "an array of token ids", *t);
    out.reserve(t->size());
    for (size_t i = 0; i < t->size(); ++i) {
        const json & v = (*t)[i];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())
            return wrong_type(index_param("tokens", i), "a token id", v);
        out.push_back((token_id)v.get<int64_t>());
    }
    return std::nullopt;
}

}  // namespace warmctx::server_detail
