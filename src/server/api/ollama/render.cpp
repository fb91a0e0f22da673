// The Ollama renderer (completion.h): /api/chat's and /api/generate's answers in Ollama's
// shape, whole and streamed as one JSON object per line (ollama.h).
#include <algorithm>
#include <map>

#include "completion.h"
#include "json_util.h"
#include "ollama.h"
#include "util/json.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

int64_t ns(double ms) { return static_cast<int64_t>(std::max(0.0, ms) * 1e6); }

const char * done_reason(finish_reason f) {
    return f == finish_reason::length || f == finish_reason::context_full ? "length" : "stop";
}

// Ollama's tool call: {"function": {"name", "arguments": {object}}}.
json ollama_call(const std::string & name, const std::string & arguments) {
    auto args = parse_json(arguments);
    return {{"function", {{"name", name}, {"arguments", args.ok() && args->is_object() ? *args : json::object()}}}};
}

class ollama_renderer final : public renderer {
  public:
    explicit ollama_renderer(ollama_request_info info) : info_(std::move(info)) {}

    void begin(const response_meta & meta, const completion_request &) override {
        model_ = info_.model.empty() ? meta.model : info_.model;
    }

    void error_response(http_response & res, request_log & log, api_error e) override {
        openai_error_to_ollama(e);
        respond_ollama_error(res, log, e);
    }

    json whole(const whole_answer & a) override {
        std::string content = a.parsed ? a.parsed->content : a.text;
        json calls = json::array();
        if (a.parsed)
            for (const parsed_tool_call & c : a.parsed->tool_calls) calls.push_back(ollama_call(c.name, c.arguments));
        json j = piece(content, a.parsed ? a.parsed->reasoning : std::string(), std::move(calls));
        finish_into(j, a.end);
        return j;
    }

    const char * stream_content_type() const override { return "application/x-ndjson"; }
    std::string open() override { return {}; }  // a line of JSON is all a client parses
    std::string waiting(const std::string &) override { return {}; }

    std::string delta(const answer_delta & d) override {
        for (const call_fragment & f : d.calls) {
            call & c = calls_[f.index];
            if (f.head) c.name = f.name;
            c.arguments += f.arguments;
        }
        if (d.text.empty() && d.reasoning.empty()) return {};
        return line(piece(d.text, d.reasoning, json::array()));
    }

    std::string finish(const answer_end & e) override {
        std::string out;
        if (!calls_.empty()) {  // Ollama sends a call whole, in one message
            json arr = json::array();
            for (const auto & [i, c] : calls_) arr.push_back(ollama_call(c.name, c.arguments));
            out += line(piece("", "", std::move(arr)));
        }
        json last = piece("", "", json::array());
        finish_into(last, e);
        return out + line(last);
    }

    std::string stream_error(const api_error & e) override {
        api_error o = e;
        openai_error_to_ollama(o);
        return line(ollama_error_json(o));
    }

  private:
    struct call {
        std::string name, arguments;
    };

    static std::string line(const json & j) { return dump_json(j) + "\n"; }

    json piece(const std::string & text, const std::string & reasoning, json calls) const {
        json j = {{"model", model_}, {"created_at", ollama_time_now()}};
        if (info_.generate) {
            j["response"] = text;
            if (!reasoning.empty()) j["thinking"] = reasoning;
        } else {
            json msg = {{"role", "assistant"}, {"content", text}};
            if (!reasoning.empty()) msg["thinking"] = reasoning;
            if (!calls.empty()) msg["tool_calls"] = std::move(calls);
            j["message"] = std::move(msg);
        }
        j["done"] = false;
        return j;
    }

    // The last object's counts and durations (nanoseconds): the prompt's tokens prefilled
    // (those reused are not evaluated) and the prefill's time; the tokens written and the
    // time from the first to the last.
    static void finish_into(json & j, const answer_end & e) {
        const answer_report & r = e.report;
        j["done"] = true;
        j["done_reason"] = done_reason(e.finish);
        j["total_duration"] = ns(r.rt.request_ms + r.t_total_ms);
        j["load_duration"] = 0;
        j["prompt_eval_count"] = std::max<int64_t>(0, e.usage.prompt_tokens - e.usage.cached_tokens);
        j["prompt_eval_duration"] = ns(r.t_prefill_ms);
        j["eval_count"] = e.usage.completion_tokens;
        j["eval_duration"] = ns(r.t_total_ms - r.t_first_token_ms);
        j["warmctx"] = warmctx_json(r);
    }

    ollama_request_info info_;
    std::string model_;
    std::map<size_t, call> calls_;  // a stream's calls by index, as their fragments came
};

}  // namespace

std::shared_ptr<renderer> make_ollama_renderer(ollama_request_info info) {
    return std::make_shared<ollama_renderer>(std::move(info));
}

}  // namespace warmctx::server_detail
