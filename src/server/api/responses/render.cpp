// Native answers -> the Responses API (responses.h): its objects, its stream of typed
// events, and the Responses renderer (completion.h). See docs/api.md.
#include "responses.h"

#include <cmath>
#include <ctime>
#include <limits>
#include <random>
#include <utility>

#include "completion.h"
#include "json_util.h"
#include "request_fields.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

// ---- the Responses objects and stream events -----------------------------------------------

namespace {

std::string id_suffix(const std::string & response_id) {
    return response_id.rfind("resp_", 0) == 0 ? response_id.substr(5) : response_id;
}

std::string message_id(const std::string & suffix, int n) {
    return n == 0 ? "msg_" + suffix : "msg_" + suffix + "_" + std::to_string(n);
}

std::string call_item_id(const std::string & suffix, int n) { return "fc_" + suffix + "_" + std::to_string(n); }

std::string reasoning_item_id(const std::string & suffix, int n) { return "rs_" + suffix + "_" + std::to_string(n); }

// A reasoning item as OpenAI's open-weight models return it: the text itself as one
// reasoning_text part (no summary, nothing encrypted).
json reasoning_item(const std::string & id, const std::string & text, std::string_view status, bool with_content) {
    json content = json::array();
    if (with_content) content.push_back({{"type", "reasoning_text"}, {"text", text}});
    return {{"type", "reasoning"},
            {"id", id},
            {"status", status},
            {"summary", json::array()},
            {"content", std::move(content)}};
}

json output_text_part(const std::string & text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
}

json message_item(const std::string & id, const std::string & text, std::string_view status, bool with_content) {
    json content = json::array();
    if (with_content) content.push_back(output_text_part(text));
    return {
        {"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
}

json call_item(const std::string & id, const std::string & call_id, const std::string & name,
               const std::string & arguments, std::string_view status) {
    return {{"type", "function_call"}, {"id", id},           {"call_id", call_id},
            {"name", name},            {"arguments", arguments}, {"status", status}};
}

// Status and incomplete_details of a finished response from the chat finish reason.
// Cut short (the length limit, the context's end): incomplete.
bool cut_short(finish_reason f) { return f == finish_reason::length || f == finish_reason::context_full; }

void set_finish(json & r, finish_reason f) {
    if (cut_short(f)) {
        r["status"] = "incomplete";
        r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    } else {
        r["status"] = "completed";
    }
}

}  // namespace


std::string make_response_id() {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::string id = "resp_";
    for (int half = 0; half < 2; ++half) {
        const uint64_t v = rng();
        for (int i = 60; i >= 0; i -= 4) id.push_back("0123456789abcdef"[(v >> i) & 15]);
    }
    return id;
}

json response_object(const responses_request_info & info, const std::string & response_id, int64_t created_at,
                     std::string_view status) {
    json r = {{"id", response_id},
              {"object", "response"},
              {"created_at", created_at},
              {"status", status},
              {"background", false},
              {"error", nullptr},
              {"incomplete_details", nullptr},
              {"instructions", info.instructions},
              {"max_output_tokens", info.max_output_tokens ? json(*info.max_output_tokens) : json(nullptr)},
              {"max_tool_calls", nullptr},
              {"model", info.model},
              {"output", json::array()},
              {"parallel_tool_calls", info.parallel_tool_calls},
              {"previous_response_id", nullptr},
              {"prompt_cache_key", info.prompt_cache_key ? json(*info.prompt_cache_key) : json(nullptr)},
              {"reasoning",
               {{"effort", info.reasoning_effort ? json(*info.reasoning_effort) : json(nullptr)},
                {"summary", info.reasoning_summary ? json(*info.reasoning_summary) : json(nullptr)}}},
              {"safety_identifier", info.safety_identifier ? json(*info.safety_identifier) : json(nullptr)},
              {"service_tier", "default"},
              {"store", false},
              {"temperature", info.temperature.value_or(1.0)},
              {"text", info.text},
              {"tool_choice", info.tool_choice},
              {"tools", info.tools},
              {"top_logprobs", 0},
              {"top_p", info.top_p.value_or(1.0)},
              {"truncation", "disabled"},
              {"usage", nullptr},
              {"user", info.user ? json(*info.user) : json(nullptr)},
              {"metadata", info.metadata}};
    return r;
}

json responses_usage(const completion_usage & u) {
    return {{"input_tokens", u.prompt_tokens},
            {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
            {"output_tokens", u.completion_tokens},
            {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json answer_to_response(const responses_request_info & info, const std::string & response_id, int64_t created_at,
                        const std::string & text, const std::vector<response_call> & calls,
                        finish_reason finish, const completion_usage & usage, const json & warmctx,
                        const std::string & reasoning) {
    json r = response_object(info, response_id, created_at, "completed");
    const std::string suffix = id_suffix(response_id);
    set_finish(r, finish);
    json & output = r["output"];
    if (!reasoning.empty())
        output.push_back(reasoning_item(reasoning_item_id(suffix, 0), reasoning, "completed", true));
    if (!text.empty()) output.push_back(message_item(message_id(suffix, 0), text, "completed", true));
    for (size_t k = 0; k < calls.size(); ++k)
        output.push_back(call_item(call_item_id(suffix, static_cast<int>(k)), calls[k].call_id, calls[k].name,
                                   calls[k].arguments, "completed"));
    // A response cut short: its last item was cut with it.
    if (r["status"] == "incomplete" && !output.empty()) output.back()["status"] = "incomplete";
    r["usage"] = responses_usage(usage);
    if (!warmctx.is_null()) r["warmctx"] = warmctx;
    return r;
}

std::string sse_text(const responses_event & e) {
    return "event: " + e.event + "\ndata: " + dump_json(e.data) + "\n\n";
}

// ---- responses_stream ---------------------------------------------------------------

responses_stream::responses_stream(responses_request_info info, std::string response_id, int64_t created_at)
    : info_(std::move(info)), id_(std::move(response_id)), suffix_(id_suffix(id_)), created_at_(created_at) {}

responses_event responses_stream::make(std::string type, json data) {
    data["type"] = type;
    data["sequence_number"] = seq_++;
    return {std::move(type), std::move(data)};
}

json responses_stream::item_json(const item & it) const {
    if (it.is_call) return call_item(it.id, it.call_id, it.name, it.arguments, it.status);
    if (it.is_reasoning) return reasoning_item(it.id, it.text, it.status, it.status != "in_progress");
    // A message's content part exists from content_part.added on, i.e. once it is open.
    return message_item(it.id, it.text, it.status, it.status != "in_progress");
}

std::vector<responses_event> responses_stream::start() {
    std::vector<responses_event> out;
    if (done_ || seq_ > 0) return out;
    json r = response_object(info_, id_, created_at_, "in_progress");
    out.push_back(make("response.created", {{"response", r}}));
    out.push_back(make("response.in_progress", {{"response", std::move(r)}}));
    return out;
}

std::vector<responses_event> responses_stream::heartbeat() {
    std::vector<responses_event> out;
    if (done_ || !items_.empty()) return out;
    if (seq_ == 0) return start();
    out.push_back(
        make("response.in_progress", {{"response", response_object(info_, id_, created_at_, "in_progress")}}));
    return out;
}

void responses_stream::open_with_part(item it, const json & empty_part, std::vector<responses_event> & out) {
    it.output_index = static_cast<int>(items_.size());
    items_.push_back(it);
    open_ = static_cast<int>(items_.size()) - 1;
    out.push_back(make("response.output_item.added", {{"output_index", it.output_index}, {"item", item_json(it)}}));
    out.push_back(make("response.content_part.added", {{"item_id", it.id},
                                                       {"output_index", it.output_index},
                                                       {"content_index", 0},
                                                       {"part", empty_part}}));
}

void responses_stream::open_message(std::vector<responses_event> & out) {
    item it;
    it.id = message_id(suffix_, n_messages_++);
    open_with_part(std::move(it), output_text_part(""), out);
}

void responses_stream::close_open(std::vector<responses_event> & out, const char * status) {
    if (open_ < 0) return;
    item & it = items_[open_];
    open_ = -1;
    it.status = status;
    if (it.is_reasoning) {
        const json part = {{"type", "reasoning_text"}, {"text", it.text}};
        out.push_back(
            make("response.reasoning_text.done",
                 {{"item_id", it.id}, {"output_index", it.output_index}, {"content_index", 0}, {"text", it.text}}));
        out.push_back(
            make("response.content_part.done",
                 {{"item_id", it.id}, {"output_index", it.output_index}, {"content_index", 0}, {"part", part}}));
    } else if (it.is_call) {
        out.push_back(make("response.function_call_arguments.done", {{"item_id", it.id},
                                                                     {"output_index", it.output_index},
                                                                     {"arguments", it.arguments},
                                                                     {"name", it.name}}));
    } else {
        out.push_back(make("response.output_text.done", {{"item_id", it.id},
                                                         {"output_index", it.output_index},
                                                         {"content_index", 0},
                                                         {"text", it.text},
                                                         {"logprobs", json::array()}}));
        out.push_back(make("response.content_part.done", {{"item_id", it.id},
                                                          {"output_index", it.output_index},
                                                          {"content_index", 0},
                                                          {"part", output_text_part(it.text)}}));
    }
    out.push_back(make("response.output_item.done", {{"output_index", it.output_index}, {"item", item_json(it)}}));
}

void responses_stream::add_reasoning(const std::string & piece, std::vector<responses_event> & out) {
    if (piece.empty()) return;
    if (open_ < 0 || !items_[open_].is_reasoning) {
        close_open(out, "completed");
        item it;
        it.is_reasoning = true;
        it.id = reasoning_item_id(suffix_, n_reasonings_++);
        open_with_part(std::move(it), {{"type", "reasoning_text"}, {"text", ""}}, out);
    }
    item & it = items_[open_];
    it.text += piece;
    out.push_back(
        make("response.reasoning_text.delta",
             {{"item_id", it.id}, {"output_index", it.output_index}, {"content_index", 0}, {"delta", piece}}));
}

void responses_stream::add_text(const std::string & piece, std::vector<responses_event> & out) {
    if (piece.empty()) return;
    if (open_ < 0 || items_[open_].is_call || items_[open_].is_reasoning) {
        close_open(out, "completed");
        open_message(out);
    }
    item & it = items_[open_];
    it.text += piece;
    out.push_back(make("response.output_text.delta", {{"item_id", it.id},
                                                      {"output_index", it.output_index},
                                                      {"content_index", 0},
                                                      {"delta", piece},
                                                      {"logprobs", json::array()}}));
}

void responses_stream::add_call(int64_t index, const std::string & call_id, const std::string & name,
                                const std::string & args, std::vector<responses_event> & out) {
    if (open_ < 0 || !items_[open_].is_call || items_[open_].chat_index != index) {
        close_open(out, "completed");
        item it;
        it.is_call = true;
        it.id = call_item_id(suffix_, n_calls_);
        it.call_id = call_id;
        if (it.call_id.empty()) it.call_id = "call_" + suffix_ + "_" + std::to_string(n_calls_);
        ++n_calls_;
        it.chat_index = index;
        it.name = name;
        it.output_index = static_cast<int>(items_.size());
        items_.push_back(it);
        open_ = static_cast<int>(items_.size()) - 1;
        out.push_back(make("response.output_item.added", {{"output_index", it.output_index}, {"item", item_json(it)}}));
    } else if (items_[open_].name.empty()) {
        items_[open_].name = name;  // a name that came after the call's first delta
    }
    if (!args.empty()) {
        item & it = items_[open_];
        it.arguments += args;
        out.push_back(make("response.function_call_arguments.delta",
                           {{"item_id", it.id}, {"output_index", it.output_index}, {"delta", args}}));
    }
}

std::vector<responses_event> responses_stream::text(const std::string & piece) {
    std::vector<responses_event> out;
    if (done_) return out;
    if (seq_ == 0) out = start();
    add_text(piece, out);
    return out;
}

std::vector<responses_event> responses_stream::reasoning(const std::string & piece) {
    std::vector<responses_event> out;
    if (done_) return out;
    if (seq_ == 0) out = start();
    add_reasoning(piece, out);
    return out;
}

std::vector<responses_event> responses_stream::call(int64_t index, const std::string & call_id,
                                                    const std::string & name, const std::string & arguments) {
    std::vector<responses_event> out;
    if (done_) return out;
    if (seq_ == 0) out = start();
    add_call(index, call_id, name, arguments, out);
    return out;
}

json responses_stream::final_object(std::string_view status) const {
    json r = response_object(info_, id_, created_at_, status);
    for (const item & it : items_) r["output"].push_back(item_json(it));
    r["usage"] = usage_ ? responses_usage(*usage_) : json(nullptr);
    if (!warmctx_.is_null()) r["warmctx"] = warmctx_;
    return r;
}

std::vector<responses_event> responses_stream::finish(finish_reason finish, const completion_usage & usage,
                                                      const json & warmctx) {
    std::vector<responses_event> out;
    if (done_) return out;
    if (seq_ == 0) out = start();
    close_open(out, cut_short(finish) ? "incomplete" : "completed");
    usage_ = usage;
    warmctx_ = warmctx;
    json r = final_object("completed");
    set_finish(r, finish);
    const std::string name = r["status"] == "incomplete" ? "response.incomplete" : "response.completed";
    out.push_back(make(name, {{"response", std::move(r)}}));
    done_ = true;
    return out;
}

std::vector<responses_event> responses_stream::error(const api_error & e) {
    std::vector<responses_event> out;
    if (done_) return out;
    if (seq_ == 0) out = start();
    const json code = e.code.empty() ? json(nullptr) : json(e.code);
    out.push_back(make("error", {{"code", code},
                                 {"message", e.message},
                                 {"param", e.param.empty() ? json(nullptr) : json(e.param)}}));
    if (open_ >= 0) {
        items_[open_].status = "incomplete";  // cut short, without its done events
        open_ = -1;
    }
    json r = final_object("failed");
    r["error"] = {{"code", e.code.empty() ? json("server_error") : code}, {"message", e.message}};
    out.push_back(make("response.failed", {{"response", std::move(r)}}));
    done_ = true;
    return out;
}

// ---- the renderer --------------------------------------------------------------------------

namespace {

std::string events_text(const std::vector<responses_event> & events) {
    std::string text;
    for (const auto & e : events) text += sse_text(e);
    return text;
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
                                  a.end.finish, a.end.usage, warmctx_json(a.end.report),
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
        return events_text(stream_.finish(e.finish, e.usage, warmctx_json(e.report)));
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
