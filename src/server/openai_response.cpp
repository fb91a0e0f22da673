// Native results -> the OpenAI response shapes (openai.h): whole responses, streamed
// chunks, usage, logprobs and the `warmctx` extension object.
#include <algorithm>

#include "json_util.h"
#include "openai.h"
#include "warmctx/explain_format.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

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
            // The prompt's token prefix shared with the workspace's last turn (-1: none):
            // what reuse exact to the token could keep at most.
            {"tokens_common_with_previous_turn", ex.n_common_tokens},
            {"result", miss_kind_name(ex.kind)},
            {"tier", kv_tier_name(ex.tier)},
            {"reason", ex.reason},
            {"missed_segment", ex.missed_segment},
            {"stable_prefix_hash", ex.stable_prefix_hash},
            {"prewarm", prewarm_json(ex.prewarm)},
            // Drafts from the workspace (warmctx/drafts.h): tokens decoded ahead, and the
            // ones sampling chose.
            {"drafts", {{"steps", done.drafts.n_steps}, {"drafted", done.drafts.n_drafted}, {"accepted", done.drafts.n_accepted}}},
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

json chunk_reasoning(const response_meta & m, const std::string & text, bool include_usage) {
    json j = chunk_base(m);
    j["choices"] = json::array({{{"index", 0}, {"delta", {{"reasoning_content", text}}}, {"finish_reason", nullptr}}});
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
