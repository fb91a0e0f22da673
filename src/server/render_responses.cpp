// The Responses renderer (completion.h): a whole `response` object, or the Responses
// stream events (responses.h's responses_stream). See docs/api.md.
#include <ctime>

#include "completion.h"
#include "responses.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

std::string events_text(const std::vector<responses_event> & events) {
    std::string text;
    for (const auto & e : events) text += sse_text(e);
    return text;
}

// The chat finish reason the Responses status follows ("tool_calls" when it called one).
std::string_view finish_name(const answer_end & e) {
    return e.tool_calls ? std::string_view("tool_calls") : openai_finish_reason(e.finish);
}

class responses_renderer final : public renderer {
  public:
    explicit responses_renderer(std::shared_ptr<const responses_request_info> info)
        : info_(std::move(info)),
          id_(make_response_id()),
          created_(static_cast<int64_t>(std::time(nullptr))),
          stream_(*info_, id_, created_) {}

    void begin(const response_meta &, const completion_request &) override {}

    void error_response(http_response & res, request_log & log, api_error e) override {
        chat_error_to_responses(e, *info_);
        respond_error(res, log, e);
    }

    json whole(const whole_answer & a) override {
        std::vector<response_call> calls;
        if (a.parsed)
            for (const parsed_tool_call & c : a.parsed->tool_calls) calls.push_back({c.id, c.name, c.arguments});
        return answer_to_response(*info_, id_, created_, a.parsed ? a.parsed->content : a.text, calls,
                                  finish_name(a.end), usage_json(a.end.usage), a.end.warmctx,
                                  a.parsed ? a.parsed->reasoning : std::string());
    }

    std::string open() override { return events_text(stream_.start()); }

    // The comment, and before the answer begins a response.in_progress event too
    // (Codex's idle timer counts events only).
    std::string waiting(const std::string & comment) override { return comment + events_text(stream_.heartbeat()); }

    std::string delta(const answer_delta & d) override {
        std::string out = events_text(stream_.reasoning(d.reasoning));
        out += events_text(stream_.text(d.text));
        for (const call_fragment & c : d.calls)
            out += events_text(stream_.call(static_cast<int64_t>(c.index), c.id, c.name, c.arguments));
        return out;
    }

    std::string finish(const answer_end & e) override {
        return events_text(stream_.finish(finish_name(e), usage_json(e.usage), e.warmctx));
    }

    std::string stream_error(const api_error & e) override {
        api_error mapped = e;
        chat_error_to_responses(mapped, *info_);
        return events_text(stream_.error(mapped));
    }

  private:
    std::shared_ptr<const responses_request_info> info_;
    std::string id_;
    int64_t created_ = 0;
    responses_stream stream_;
};

}  // namespace

std::shared_ptr<renderer> make_responses_renderer(std::shared_ptr<const responses_request_info> info) {
    return std::make_shared<responses_renderer>(std::move(info));
}

}  // namespace warmctx::server_detail
