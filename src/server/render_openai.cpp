// The OpenAI renderers (completion.h): chat.completion and its chunks, text_completion
// and its chunks, over openai.h's shapes. See docs/api.md.
#include "completion.h"
#include "json_util.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

std::string sse(const json & j) { return "data: " + dump_json(j) + "\n\n"; }

class openai_renderer final : public renderer {
  public:
    void begin(const response_meta & meta, const completion_request & cr) override {
        meta_ = meta;
        include_usage_ = cr.include_usage;
    }

    json whole(const whole_answer & a) override {
        return completion_response(meta_, a.text, a.end.finish, a.end.usage, a.end.warmctx, a.logprobs, a.parsed);
    }

    // A chat opens with its role chunk; a text completion has none, so a comment makes
    // the headers go out at once.
    std::string open() override {
        return meta_.shape == api_shape::chat ? sse(chunk_role(meta_, include_usage_)) : std::string(": keep-alive\n\n");
    }

    std::string delta(const answer_delta & d) override {
        std::string out;
        // Reasoning as llama-server streams it: delta.reasoning_content.
        if (!d.reasoning.empty() && meta_.shape == api_shape::chat)
            out += sse(chunk_reasoning(meta_, d.reasoning, include_usage_));
        if (!d.text.empty())
            out += sse(chunk_delta(meta_, d.text, include_usage_,
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
        std::string out = sse(chunk_finish(meta_, e.finish, include_usage_, e.warmctx, e.tool_calls));
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
