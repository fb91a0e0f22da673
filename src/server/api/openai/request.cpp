// An OpenAI request body -> a completion_request (openai.h): the messages mapping, then
// the sampling, output and tools fields.
#include "openai.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>

#include "json_util.h"
#include "request_fields.h"
#include "warmctx/hash.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

// ---- messages -> segments ------------------------------------------------------------------

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
        if (text == part.end() || !text->is_string())
            return wrong_type(pp + ".text", "a string", text == part.end() ? json() : *text);
        if (k > 0) out += "\n";
        out += text->get<std::string>();
    }
    return std::nullopt;
}

std::string padded(char prefix, size_t i, int width) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%c%0*zu", prefix, width, i);
    return buf;
}

}  // namespace

maybe_error map_messages(const json & messages, const json * tools, std::vector<segment> & out,
                         const request_bounds & bounds, std::string * continuation) {
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
            s.header = false;  // as sent
            // Five digits: ids order the system messages, and a request holds at most
            // 10,000 messages (request_bounds::max_messages).
            char buf[32];
            std::snprintf(buf, sizeof buf, "system-%05zu", n_system++);
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
                        if (!fn || !fn->is_object())
                            return bad_request("missing_field", cp + ".function is required", cp + ".function");
                        const json * name = field(*fn, "name");
                        if (!name || !name->is_string())
                            return bad_request("missing_field", cp + ".function.name must be a string",
                                               cp + ".function.name");
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
            if (last && role == "assistant" && continuation && s.tool_calls.empty() && !content.empty()) {
                *continuation = std::move(content);  // a prefill: the answer continues it
                continue;
            }
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
                if (!fn || !fn->is_object())
                    return bad_request("missing_field", tp + ".function is required", tp + ".function");
                const json * name = field(*fn, "name");
                if (!name || !name->is_string() || name->get<std::string>().empty())
                    return bad_request("missing_field", tp + ".function.name must be a non-empty string",
                                       tp + ".function.name");
                if (const json * params = field(*fn, "parameters")) {
                    // A schema is an object: anything else would fail later, when the
                    // answer's grammar is built, and be blamed on tool_choice.
                    if (!params->is_object() && !params->is_null())
                        return wrong_type(tp + ".function.parameters", "an object (a JSON schema)", *params);
                    if (auto e = check_schema_bounds(*params, tp + ".function.parameters", bounds, tally)) return e;
                }
            }
            s.content = dump_json(*tools);
            if (auto e = check_tools_bytes(s.content.size(), "tools", bounds)) return e;
            out.push_back(std::move(s));
        }
    }
    return std::nullopt;
}

// ---- the request body ----------------------------------------------------------------------

namespace {

// response_format json_object: llama.cpp's grammars/json.gbnf (MIT), a JSON object.
const char * const k_json_object_grammar = R"gbnf(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
)gbnf";

}  // namespace

namespace {

// /v1/completions' prompt: the text as given, no chat template (OpenAI's and
// llama-server's meaning): one user segment; and what only it may carry (suffix).
maybe_error parse_prompt(const json & body, completion_request & out) {
    const json * prompt = field(body, "prompt");
    if (!prompt) return bad_request("missing_field", "prompt is required", "prompt");
    std::string text;
    if (prompt->is_string()) {
        text = prompt->get<std::string>();
    } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
        text = (*prompt)[0].get<std::string>();
    } else if (prompt->is_array()) {
        return bad_request("unsupported_prompt", "prompt must be a string or an array of exactly one string", "prompt");
    } else {
        return wrong_type("prompt", "a string", *prompt);
    }
    if (text.empty()) return bad_request("invalid_value", "prompt is empty", "prompt");
    segment s;
    s.kind = segment_kind::user;
    s.id = "prompt";
    s.content = std::move(text);
    out.segments.push_back(std::move(s));
    out.raw = true;
    if (field(body, "tools"))
        return bad_request("unsupported_parameter", "tools is not supported by /v1/completions (use chat)", "tools");
    if (field(body, "segments"))
        return bad_request("unsupported_parameter",
                           "segments is not supported by /v1/completions: its prompt is raw text", "segments");
    if (const json * sf = field(body, "suffix")) {
        if (!sf->is_string()) return wrong_type("suffix", "a string", *sf);
        if (!sf->get<std::string>().empty()) out.suffix = sf->get<std::string>();
    }
    return std::nullopt;
}

// The content: a prompt, or a chat's messages (and tools) and the `segments` extension;
// then the workspace.
maybe_error parse_content(const json & body, body_mode mode, const request_limits & limits, completion_request & out) {
    const json * messages = field(body, "messages");
    const json * segs = field(body, "segments");
    const json * tools = field(body, "tools");
    if (mode == body_mode::text) {
        if (auto e = parse_prompt(body, out)) return e;
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
            if (auto e = map_messages(*messages, tools, out.segments, limits.bounds, &out.continuation)) return e;
            if (!out.continuation.empty())
                out.continuation_param = "messages[" + std::to_string(messages->size() - 1) + "]";
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
    std::optional<std::string> salt;
    if (auto e = get_string(body, "cache_salt", "cache_salt", salt)) return e;
    if (salt) {
        if (salt->size() > 256)
            return bad_request("invalid_value", "cache_salt is longer than 256 bytes", "cache_salt");
        out.cache_salt = *salt;
    }
    return std::nullopt;
}

maybe_error parse_logit_bias(const json & body, const request_limits & limits, sampling_params & sp) {
    const json * lb = field(body, "logit_bias");
    if (!lb) return std::nullopt;
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
        if (b < -100 || b > 100)
            return bad_request("invalid_value", "a logit_bias value must be in [-100, 100]", param);
        sp.logit_bias.emplace_back(static_cast<token_id>(id), static_cast<float>(b));
    }
    return std::nullopt;
}

maybe_error parse_max_tokens(const json & body, const request_limits & limits, sampling_params & sp) {
    std::optional<int64_t> max_tokens, max_completion_tokens;
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
    return std::nullopt;
}

// max_tokens, temperature, top_p, top_k, seed, n, penalties, logit_bias.
maybe_error parse_sampling(const json & body, const request_limits & limits, sampling_params & sp) {
    if (auto e = parse_max_tokens(body, limits, sp)) return e;
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
    std::optional<int64_t> seed, n, top_k;
    if (auto e = get_int(body, "top_k", "top_k", top_k)) return e;
    if (top_k && (*top_k < 0 || *top_k > 1000000))
        return bad_request("invalid_value", "top_k must be in [0, 1000000]", "top_k");
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

    // llama-server's names for a reasoning budget (-1: none, 0: end reasoning at once).
    std::optional<int64_t> budget;
    const char * budget_name =
        field(body, "reasoning_budget_tokens") ? "reasoning_budget_tokens" : "thinking_budget_tokens";
    if (auto e = get_int(body, budget_name, budget_name, budget)) return e;
    if (budget && (*budget < -1 || *budget > std::numeric_limits<int32_t>::max()))
        return bad_request("invalid_value", std::string(budget_name) + " must be -1 (no budget) or a number of tokens",
                           budget_name);
    sp.reasoning_budget = budget && *budget >= 0 ? static_cast<int32_t>(*budget) : limits.default_reasoning_budget;
    // llama-server's name for the most tokens a draft holds (0: no drafts for this request).
    std::optional<int64_t> draft_max;
    if (auto e = get_int(body, "speculative.n_max", "speculative.n_max", draft_max)) return e;
    if (draft_max && (*draft_max < 0 || *draft_max > k_max_draft_tokens))
        return bad_request("invalid_value",
                           "speculative.n_max must be in [0, " + std::to_string(k_max_draft_tokens) + "]",
                           "speculative.n_max");
    sp.draft_max = static_cast<int32_t>(draft_max.value_or(limits.default_draft_max));
    return parse_logit_bias(body, limits, sp);
}

// logprobs: chat `logprobs: true` with `top_logprobs` 0..20; text `logprobs: k` (0..20).
maybe_error parse_logprobs(const json & body, body_mode mode, sampling_params & sp) {
    if (const json * v = field(body, "logprobs")) {
        if (mode == body_mode::text) {
            if (!v->is_number_integer()) return wrong_type("logprobs", "an integer", *v);
            const int64_t k = v->get<int64_t>();
            if (k < 0 || k > 20) return bad_request("invalid_value", "logprobs must be in [0, 20]", "logprobs");
            sp.n_logprobs = static_cast<int32_t>(k);
        } else {
            if (!v->is_boolean()) return wrong_type("logprobs", "true or false", *v);
            if (v->get<bool>()) sp.n_logprobs = 0;
        }
    }
    if (const json * v = field(body, "top_logprobs")) {
        if (mode == body_mode::text)
            return bad_request("invalid_value", "top_logprobs is a chat field", "top_logprobs");
        if (!v->is_number_integer()) return wrong_type("top_logprobs", "an integer", *v);
        const int64_t k = v->get<int64_t>();
        if (k < 0 || k > 20) return bad_request("invalid_value", "top_logprobs must be in [0, 20]", "top_logprobs");
        if (sp.n_logprobs < 0) return bad_request("invalid_value", "top_logprobs needs logprobs: true", "top_logprobs");
        sp.n_logprobs = static_cast<int32_t>(k);
    }
    return std::nullopt;
}

// response_format: json_object is a grammar, json_schema a schema (bounded before it is
// converted on another thread or sampled on the engine's).
maybe_error parse_response_format(const json & body, const request_limits & limits, completion_request & out) {
    const json * v = field(body, "response_format");
    if (!v) return std::nullopt;
    if (!v->is_object() || !v->contains("type") || !(*v)["type"].is_string())
        return wrong_type("response_format", "an object with a string `type`", *v);
    if ((*v)["type"] == "json_object") {
        out.sampling.grammar = k_json_object_grammar;
    } else if ((*v)["type"] == "json_schema") {
        const json * js = field(*v, "json_schema");
        if (!js || !js->is_object()) return wrong_type("response_format.json_schema", "an object", js ? *js : json());
        const json * schema = field(*js, "schema");
        if (!schema || !schema->is_object())
            return bad_request("missing_field", "response_format.json_schema.schema must be an object",
                               "response_format.json_schema.schema");
        schema_tally tally;
        if (auto e = check_schema_bounds(*schema, "response_format.json_schema.schema", limits.bounds, tally)) return e;
        out.json_schema = dump_json(*schema);
    } else if ((*v)["type"] != "text") {
        return bad_request("invalid_value", "response_format.type must be text, json_object or json_schema",
                           "response_format.type");
    }
    return std::nullopt;
}

// tool_choice and parallel_tool_calls, over the tools the content carries.
maybe_error parse_tool_choice(const json & body, completion_request & out) {
    for (const segment & s : out.segments)
        if (s.kind == segment_kind::tools && s.id == "tools") out.tools_json = s.content;
    if (const json * v = field(body, "tool_choice")) {
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
    if (const json * v = field(body, "parallel_tool_calls")) {
        if (!v->is_boolean()) return wrong_type("parallel_tool_calls", "true or false", *v);
        out.parallel_tool_calls = v->get<bool>();
    }
    return std::nullopt;
}

maybe_error parse_stop(const json & body, sampling_params & sp) {
    const json * stop = field(body, "stop");
    if (!stop) return std::nullopt;
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
    return std::nullopt;
}

// Not implemented: refused by name, never silently ignored.
api_error refuse(const char * param, const std::string & why) {
    return bad_request("unsupported_parameter", std::string(param) + " is not supported: " + why, param);
}

// logprobs, response_format, tools, stop strings, streaming.
maybe_error parse_output(const json & body, body_mode mode, const request_limits & limits, completion_request & out) {
    if (auto e = parse_logprobs(body, mode, out.sampling)) return e;
    if (auto e = parse_response_format(body, limits, out)) return e;
    if (auto e = parse_tool_choice(body, out)) return e;
    if (!out.json_schema.empty() && !out.tools_json.empty() && out.tool_choice != tool_choice_mode::none)
        return refuse("response_format", "a json_schema together with tools (use one or the other)");
    if (mode == body_mode::text) {
        if (const json * v = field(body, "echo"); v && v->is_boolean() && v->get<bool>())
            return refuse("echo", "the prompt is not echoed back");
        if (const json * v = field(body, "best_of"); v && v->is_number_integer() && v->get<int64_t>() > 1)
            return refuse("best_of", "only best_of = 1");
    }
    if (auto e = parse_stop(body, out.sampling)) return e;

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

}  // namespace

maybe_error parse_completion_request(const json & body, body_mode mode, const request_limits & limits,
                                     completion_request & out) {
    if (!body.is_object()) return wrong_type("body", "a JSON object", body);
    out = completion_request{};
    out.shape = mode == body_mode::text ? api_shape::text : api_shape::chat;
    if (auto e = parse_content(body, mode, limits, out)) return e;
    if (auto e = parse_sampling(body, limits, out.sampling)) return e;
    return parse_output(body, mode, limits, out);
}

}  // namespace warmctx::server_detail
