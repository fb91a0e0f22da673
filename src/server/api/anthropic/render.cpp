// The Anthropic Messages renderer (completion.h): a whole `message`, or the Messages
// stream events (message_start, content_block_start/delta/stop, message_delta,
// message_stop; ping while the prompt is queued or prefilled). See docs/api.md.
#include "anthropic.h"
#include "completion.h"
#include "json_util.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

std::string event(std::string_view name, const json & data) {
    return "event: " + std::string(name) + "\ndata: " + dump_json(data) + "\n\n";
}

class anthropic_renderer final : public renderer {
  public:
    explicit anthropic_renderer(std::shared_ptr<const anthropic_request_info> info)
        : info_(std::move(info)), id_(make_message_id()) {}

    void begin(const response_meta & meta, const completion_request &) override {
        model_ = info_->model.empty() ? meta.model : info_->model;
    }

    void error_response(http_response & res, request_log & log, api_error e) override {
        chat_error_to_anthropic(e, *info_);
        respond_anthropic_error(res, log, e);
    }

    json whole(const whole_answer & a) override {
        json content = json::array();
        // A reasoning model's reasoning, as a thinking block before the answer (unsigned:
        // a local model has nothing to sign; a later request may send it back, and it is
        // dropped there).
        if (a.parsed && !a.parsed->reasoning.empty())
            content.push_back({{"type", "thinking"}, {"thinking", a.parsed->reasoning}, {"signature", ""}});
        const std::string & text = a.parsed ? a.parsed->content : a.text;
        if (!text.empty()) content.push_back({{"type", "text"}, {"text", text}});
        if (a.parsed)
            for (const parsed_tool_call & c : a.parsed->tool_calls) {
                auto input = parse_json(c.arguments);
                content.push_back({{"type", "tool_use"},
                                   {"id", c.id},
                                   {"name", c.name},
                                   {"input", input.ok() ? *input : json::object()}});
            }
        const anthropic_stop stop = stop_of(a.end);
        return {{"id", id_},
                {"type", "message"},
                {"role", "assistant"},
                {"model", model_},
                {"content", std::move(content)},
                {"stop_reason", stop.reason},
                {"stop_sequence", stop.sequence},
                {"usage", usage_of(a.end)},
                {"warmctx", warmctx_json(a.end.report)}};
    }

    std::string open() override {
        json message = {{"id", id_},
                        {"type", "message"},
                        {"role", "assistant"},
                        {"model", model_},
                        {"content", json::array()},
                        {"stop_reason", nullptr},
                        {"stop_sequence", nullptr},
                        {"usage", anthropic_usage(0, 0, 0, 0)}};
        return event("message_start", {{"type", "message_start"}, {"message", std::move(message)}});
    }

    std::string waiting(const std::string &) override { return event("ping", {{"type", "ping"}}); }

    std::string delta(const answer_delta & d) override {
        std::string out;
        if (!d.reasoning.empty()) {
            if (open_kind_ != block::thinking)
                out += start_block(block::thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
            out += event("content_block_delta", {{"type", "content_block_delta"},
                                                 {"index", index_},
                                                 {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
        }
        if (!d.text.empty()) {
            if (open_kind_ != block::text) out += start_block(block::text, {{"type", "text"}, {"text", ""}});
            out += event("content_block_delta", {{"type", "content_block_delta"},
                                                 {"index", index_},
                                                 {"delta", {{"type", "text_delta"}, {"text", d.text}}}});
        }
        for (const call_fragment & c : d.calls) {
            if (c.head) {
                out += start_block(block::tool_use,
                                   {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", json::object()}});
                call_index_ = c.index;
            }
            if (c.arguments.empty() || open_kind_ != block::tool_use || c.index != call_index_) continue;
            out += event("content_block_delta",
                         {{"type", "content_block_delta"},
                          {"index", index_},
                          {"delta", {{"type", "input_json_delta"}, {"partial_json", c.arguments}}}});
        }
        return out;
    }

    std::string finish(const answer_end & e) override {
        std::string out = close_block();
        const anthropic_stop stop = stop_of(e);
        out += event("message_delta", {{"type", "message_delta"},
                                       {"delta", {{"stop_reason", stop.reason}, {"stop_sequence", stop.sequence}}},
                                       {"usage", usage_of(e)},
                                       {"warmctx", warmctx_json(e.report)}});
        return out + event("message_stop", {{"type", "message_stop"}});
    }

    std::string stream_error(const api_error & e) override {
        api_error mapped = e;
        chat_error_to_anthropic(mapped, *info_);
        return event("error", anthropic_error_json(mapped));
    }

  private:
    enum class block { none, thinking, text, tool_use };

    std::string close_block() {
        if (open_kind_ == block::none) return {};
        std::string out;
        // A thinking block ends with its signature, as Anthropic's do (empty: unsigned).
        if (open_kind_ == block::thinking)
            out = event("content_block_delta", {{"type", "content_block_delta"},
                                                {"index", index_},
                                                {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
        open_kind_ = block::none;
        return out + event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
    }
    std::string start_block(block kind, json content_block) {
        std::string out = close_block();
        if (started_any_) ++index_;
        started_any_ = true;
        open_kind_ = kind;
        return out +
               event("content_block_start",
                     {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(content_block)}});
    }

    anthropic_stop stop_of(const answer_end & e) const {
        if (e.tool_calls) return {"tool_use"};
        if (e.finish == finish_reason::length || e.finish == finish_reason::context_full) return {"max_tokens"};
        if (e.finish == finish_reason::stop && !info_->stop_sequences.empty()) {
            // The engine ends at a stop string without saying which; with one, it is that.
            anthropic_stop s{"stop_sequence"};
            if (info_->stop_sequences.size() == 1) s.sequence = info_->stop_sequences[0];
            return s;
        }
        return {"end_turn"};
    }

    static json usage_of(const answer_end & e) {
        return anthropic_usage(e.usage.prompt_tokens, e.usage.cached_tokens, e.report.explain.n_cacheable,
                               e.usage.completion_tokens);
    }

    std::shared_ptr<const anthropic_request_info> info_;
    std::string id_;
    std::string model_;
    block open_kind_ = block::none;
    bool started_any_ = false;
    int64_t index_ = 0;
    size_t call_index_ = 0;
};

}  // namespace

std::shared_ptr<renderer> make_anthropic_renderer(std::shared_ptr<const anthropic_request_info> info) {
    return std::make_shared<anthropic_renderer>(std::move(info));
}

}  // namespace warmctx::server_detail
