// Native results -> the OpenAI response shapes (openai.h), and the OpenAI renderers
// (completion.h): chat.completion and text_completion, whole and streamed. See docs/api.md.
#include "openai.h"

#include <algorithm>

#include "completion.h"
#include "json_util.h"
#include "server/explain_format.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

// ---- shapes --------------------------------------------------------------------------------

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
                         const completion_usage & usage, json warmctx_ext, json logprobs,
                         const parsed_answer * parsed) {
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
        j["choices"] = json::array(
            {{{"index", 0}, {"text", text}, {"logprobs", std::move(logprobs)}, {"finish_reason", nullptr}}});
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
    j["choices"] =
        json::array({{{"index", 0}, {"delta", {{"tool_calls", std::move(calls)}}}, {"finish_reason", nullptr}}});
    if (include_usage) j["usage"] = nullptr;
    return j;
}

json chunk_finish(const response_meta & m, finish_reason finish, bool include_usage, json warmctx_ext,
                  bool tool_calls) {
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

// ---- the renderers -------------------------------------------------------------------------

namespace {

std::string sse(const json & j) { return "data: " + dump_json(j) + "\n\n"; }

class openai_renderer final : public renderer {
  public:
    void begin(const response_meta & meta, const completion_request & cr) override {
        meta_ = meta;
        include_usage_ = cr.include_usage;
    }

    json whole(const whole_answer & a) override {
        return completion_response(meta_, a.text, a.end.finish, a.end.usage, warmctx_json(a.end.report), a.logprobs,
                                   a.parsed);
    }

    // A chat opens with its role chunk; a text completion has none, so a comment makes
    // the headers go out at once.
    std::string open() override {
        return meta_.shape == api_shape::chat ? sse(chunk_role(meta_, include_usage_))
                                              : std::string(": keep-alive\n\n");
    }

    std::string delta(const answer_delta & d) override {
        std::string out;
        // Reasoning as llama-server streams it: delta.reasoning_content.
        if (!d.reasoning.empty() && meta_.shape == api_shape::chat)
            out += sse(chunk_reasoning(meta_, d.reasoning, include_usage_));
        if (!d.text.empty())
            out +=
                sse(chunk_delta(meta_, d.text, include_usage_,
                                d.logprobs ? logprobs_json(meta_.shape, *d.logprobs, d.text_offset) : json(nullptr)));
        if (d.calls.empty()) return out;
        json frags = json::array();
        for (const call_fragment & c : d.calls) {
            if (c.head)
                frags.push_back({{"index", c.index},
                                 {"id", c.id},
                                 {"type", "function"},
                                 {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
            else
                frags.push_back({{"index", c.index}, {"function", {{"arguments", c.arguments}}}});
        }
        return out + sse(chunk_tool_calls(meta_, std::move(frags), include_usage_));
    }

    std::string finish(const answer_end & e) override {
        std::string out = sse(chunk_finish(meta_, e.finish, include_usage_, warmctx_json(e.report), e.tool_calls));
        if (include_usage_) out += sse(chunk_usage(meta_, e.usage));
        return out + "data: [DONE]\n\n";
    }

    std::string stream_error(const api_error & e) override { return "data: " + e.body() + "\n\ndata: [DONE]\n\n"; }

  private:
    response_meta meta_;
    bool include_usage_ = false;
};

}  // namespace

std::shared_ptr<renderer> make_openai_renderer() { return std::make_shared<openai_renderer>(); }

}  // namespace warmctx::server_detail
