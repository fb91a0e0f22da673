// The llama-server renderer (completion.h): /completion's answer in llama-server's shape,
// whole and streamed (llama_server.h).
#include <algorithm>

#include "completion.h"
#include "json_util.h"
#include "llama_server.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

json llama_timings_json(const answer_report & r, const completion_usage & u) {
    // prompt: the tokens prefilled (not those reused) and the prefill's time; predicted:
    // the tokens written and the time from the first token to the last.
    const int64_t prompt_n = std::max<int64_t>(0, u.prompt_tokens - u.cached_tokens);
    const double prompt_ms = r.t_prefill_ms;
    const int64_t predicted_n = u.completion_tokens;
    const double predicted_ms = std::max(0.0, r.t_total_ms - r.t_first_token_ms);
    auto per_token = [](double ms, int64_t n) { return n > 0 ? ms / (double)n : 0.0; };
    auto per_second = [](double ms, int64_t n) { return ms > 0 ? 1000.0 * (double)n / ms : 0.0; };
    return {{"cache_n", u.cached_tokens},
            {"prompt_n", prompt_n},
            {"prompt_ms", prompt_ms},
            {"prompt_per_token_ms", per_token(prompt_ms, prompt_n)},
            {"prompt_per_second", per_second(prompt_ms, prompt_n)},
            {"predicted_n", predicted_n},
            {"predicted_ms", predicted_ms},
            {"predicted_per_token_ms", per_token(predicted_ms, predicted_n)},
            {"predicted_per_second", per_second(predicted_ms, predicted_n)}};
}

namespace {

std::string sse(const json & j) { return "data: " + dump_json(j) + "\n\n"; }

// "eos" (the model ended), "word" (a stop string), "limit" (max tokens, the context's end).
const char * stop_type(finish_reason f) {
    switch (f) {
        case finish_reason::eos: return "eos";
        case finish_reason::stop: return "word";
        case finish_reason::length:
        case finish_reason::context_full: return "limit";
    }
    return "eos";
}

class llama_server_renderer final : public renderer {
  public:
    void begin(const response_meta & meta, const completion_request &) override { meta_ = meta; }

    json whole(const whole_answer & a) override { return final_object(a.text, a.end); }

    std::string open() override { return ": keep-alive\n\n"; }

    std::string delta(const answer_delta & d) override {
        if (d.text.empty()) return {};
        return sse({{"content", d.text}, {"stop", false}, {"id_slot", 0}, {"index", 0}});
    }

    std::string finish(const answer_end & e) override { return sse(final_object("", e)); }

    // llama-server's stream error: one event with the error object.
    std::string stream_error(const api_error & e) override { return "data: " + e.body() + "\n\n"; }

  private:
    json final_object(const std::string & text, const answer_end & e) const {
        return {{"content", text},
                {"id_slot", 0},
                {"index", 0},
                {"stop", true},
                {"model", meta_.model},
                {"tokens_predicted", e.usage.completion_tokens},
                {"tokens_evaluated", e.usage.prompt_tokens},
                {"tokens_cached", e.usage.cached_tokens},
                {"stop_type", stop_type(e.finish)},
                {"stopping_word", ""},
                {"truncated", false},
                {"timings", llama_timings_json(e.report, e.usage)},
                {"warmctx", warmctx_json(e.report)}};
    }

    response_meta meta_;
};

}  // namespace

std::shared_ptr<renderer> make_llama_server_renderer() { return std::make_shared<llama_server_renderer>(); }

}  // namespace warmctx::server_detail
