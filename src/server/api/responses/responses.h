// server/api/responses/responses.h - the OpenAI Responses API (POST /v1/responses) as a translation
// over chat completions. Pure functions and one small state machine: no I/O, no scheduler.
//
// A Responses request body becomes a chat-completions body, which then runs through the
// chat pipeline unchanged (parse_completion_request and everything after it); the chat
// result, whole or streamed, is translated back into a Responses `response` object or
// into Responses stream events. Nothing is stored: every request carries its whole input.
//
// Request (responses_to_chat):
//
//   Responses                                 chat completions
//   instructions: "..."                       messages[0] = {"role":"system"}
//   input: "text"                             {"role":"user","content":"text"}
//   input[i] message item (type "message"     {"role": same, "content": the text parts
//     or none; role user, assistant,            joined with "\n"}
//     system, developer)
//   input[i] function_call                    an assistant message's tool_calls[] entry
//     {call_id, name, arguments}                {"id":call_id,"type":"function","function":
//                                               {"name","arguments"}}; consecutive calls, and
//                                               calls right after an assistant message item,
//                                               share ONE assistant message
//   input[i] function_call_output             {"role":"tool","tool_call_id":call_id,
//     {call_id, output}                         "content":output (text parts joined)}
//   input[i] reasoning                        skipped (a local model has no encrypted
//                                               reasoning to replay); it does not break
//                                               the merge of function calls around it
//   tools[i] {"type":"function", name,        {"type":"function","function":{name,
//     description, parameters, strict}          description, parameters, strict}}
//   tool_choice "auto"|"none"|"required"      the same
//   tool_choice {"type":"function",name}      {"type":"function","function":{"name"}}
//   max_output_tokens                         max_tokens
//   text.format json_object                   response_format {"type":"json_object"}
//   text.format json_schema {name, schema,    response_format {"type":"json_schema",
//     strict, description}                      "json_schema":{name, schema, strict, description}}
//   model, temperature, top_p, seed, user,    copied
//     parallel_tool_calls, prompt_cache_key,
//     workspace (warmctx's extension)
//   stream: true                              stream: true, stream_options.include_usage: true
//                                               (the final event carries usage)
//
// Accepted and ignored (they change nothing on a local server): store false (and absent:
// OpenAI's default is true, but refusing an absent `store` would refuse every client),
// include, reasoning (its effort and summary are echoed), metadata (echoed), service_tier,
// truncation "disabled", background false, safety_identifier, prompt_cache_retention,
// stream_options, max_tool_calls (it limits hosted tools, which are refused), top_logprobs 0,
// text.verbosity (echoed). Other unknown fields are ignored, as on the chat routes.
//
// Refused with 400 unsupported_parameter naming the field: store true,
// previous_response_id, conversation, background true, truncation "auto", prompt (a
// stored prompt template), top_logprobs > 0, hosted tools (web_search, file_search,
// code_interpreter, mcp, local_shell, ...; every tool type but "function", `custom`
// freeform tools included), input_image / input_file / input_audio parts, item_reference
// items. Known fields of the wrong type are a 400 naming the field ("input[2].call_id").
//
// Response (answer_to_response and responses_stream):
//
//   chat completion                           Responses
//   message.content (non-empty)               output[] {"type":"message","id":"msg_<s>",
//                                               "role":"assistant","content":[{"type":
//                                               "output_text","text","annotations":[]}]}
//   message.tool_calls[k]                     output[] {"type":"function_call","id":
//                                               "fc_<s>_<k>","call_id":tool_calls[k].id,
//                                               "name","arguments"}
//   finish_reason stop | tool_calls           status "completed"
//   finish_reason length                      status "incomplete", incomplete_details
//                                               {"reason":"max_output_tokens"}; the last
//                                               output item's status is "incomplete" too
//   usage {prompt_tokens, completion_tokens,  usage {input_tokens, input_tokens_details
//     total_tokens, prompt_tokens_details       {cached_tokens}, output_tokens,
//     {cached_tokens}}                          output_tokens_details{reasoning_tokens:0},
//                                               total_tokens}
//   warmctx                                   warmctx (the same object)
//
// <s> is the response id without its "resp_" prefix, so item ids follow from the
// response id. The response object echoes the request's settings (instructions, tools
// as sent, tool_choice, parallel_tool_calls, temperature, top_p, max_output_tokens, text,
// reasoning, metadata, prompt_cache_key, user) and store:false, previous_response_id:null,
// error:null. `output_text` is not sent: it is an SDK convenience, not wire format.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../api_error.h"
#include "warmctx/scheduler.h"

namespace warmctx::server_detail {

// What the response object echoes back, and what the translation back needs.
struct responses_request_info {
    std::string model;                          // as sent ("" when absent)
    bool stream = false;
    nlohmann::json instructions = nullptr;      // the string, or null
    nlohmann::json tools = nlohmann::json::array();  // the Responses-format array as sent
    nlohmann::json tool_choice = "auto";        // as sent (Responses shape)
    bool parallel_tool_calls = true;
    std::optional<double> temperature;          // echoed as 1 when absent (OpenAI's default)
    std::optional<double> top_p;                // echoed as 1 when absent
    std::optional<int64_t> max_output_tokens;
    nlohmann::json text = {{"format", {{"type", "text"}}}};  // {"format": {...}, "verbosity"?}
    std::optional<std::string> reasoning_effort;
    std::optional<std::string> reasoning_summary;
    nlohmann::json metadata = nlohmann::json::object();
    std::optional<std::string> prompt_cache_key;
    std::optional<std::string> user;
    std::optional<std::string> safety_identifier;
    // For chat_error_to_responses: the Responses field each chat message came from,
    // by chat message index ("instructions", "input", "input[3]").
    std::vector<std::string> message_sources;
};

// Translates a Responses request body (already valid JSON) into a chat-completions body
// for parse_completion_request (body_mode::chat). On error chat_body is unspecified.
maybe_error responses_to_chat(const nlohmann::json & body, nlohmann::json & chat_body,
                              responses_request_info & info);

// Renames the param of an error the chat parser gave for a translated body to the
// Responses field it came from: messages[k].* -> input[i] (or instructions),
// max_tokens -> max_output_tokens, response_format* -> text.format,
// tools[i].function.x -> tools[i].x, tool_choice.function.name -> tool_choice.name.
void chat_error_to_responses(api_error & e, const responses_request_info & info);

// A new response id: "resp_" + 32 random hex digits.
std::string make_response_id();

// The response object with `status` ("in_progress", "completed", "incomplete",
// "failed"), an empty output and usage null: what the stream's first events carry and
// what answer_to_response fills in. model: info.model.
nlohmann::json response_object(const responses_request_info & info, const std::string & response_id,
                               int64_t created_at, std::string_view status);

// An answer's usage as the Responses API counts it.
nlohmann::json responses_usage(const completion_usage & u);

// A tool call of an answer, for answer_to_response.
struct response_call {
    std::string call_id, name, arguments;
};

// A whole answer -> the Responses `response` object: its reasoning (a reasoning item
// first, when not empty), its text (a message item when not empty), its calls
// (function_call items), how it ended (cut short at the length limit or the context's
// end: status incomplete), its usage and the `warmctx` extension (null: none). The model
// is info.model.
nlohmann::json answer_to_response(const responses_request_info & info, const std::string & response_id,
                                  int64_t created_at, const std::string & text,
                                  const std::vector<response_call> & calls, finish_reason finish,
                                  const completion_usage & usage, const nlohmann::json & warmctx,
                                  const std::string & reasoning = {});

// One stream event: the SSE event name and its data (whose `type` is the same name).
struct responses_event {
    std::string event;
    nlohmann::json data;
};

// "event: <name>\ndata: <compact json>\n\n".
std::string sse_text(const responses_event & e);

// A streamed answer as Responses events.
//
//   start()        response.created, response.in_progress
//   text(), call() for text: response.output_item.added (message), response.content_part.added,
//                    then response.output_text.delta per piece;
//                  for a tool call: closes the open message or call, then
//                    response.output_item.added (function_call, arguments ""), then
//                    response.function_call_arguments.delta per fragment
//                  (closing a message: response.output_text.done, response.content_part.done,
//                   response.output_item.done; closing a call:
//                   response.function_call_arguments.done, response.output_item.done)
//   finish(...)    closes what is open, then response.completed (response.incomplete for
//                  an answer cut short) with the whole response object, usage included
//   error(e)       `error` {"type":"error","code","message","param"} - what OpenAI sends
//                  when a stream fails - then response.failed with the response so far and
//                  its `error` {code, message}: the node SDK stops at the first, clients
//                  that only watch response.* events (Codex) at the second
//
// Every event's data carries `sequence_number`, 0, 1, 2, ... over the whole stream (a
// call before start() sends start()'s two events first). Tool calls arrive one after
// another, as OpenAI and llama-server stream them: a fragment with a call index other than
// the open call's starts a new call. After finish() or
// error() every call returns no events.
class responses_stream {
public:
    responses_stream(responses_request_info info, std::string response_id, int64_t created_at);

    std::vector<responses_event> start();

    // A piece of the answer's text (nothing for "").
    std::vector<responses_event> text(const std::string & piece);
    // A piece of the model's reasoning (nothing for ""): a `reasoning` output item with
    // one reasoning_text part, streamed as response.reasoning_text.delta.
    std::vector<responses_event> reasoning(const std::string & piece);
    // A fragment of tool call `index` (the answer's calls count 0, 1, ...): its first
    // opens the call (call_id "" = one made from the response id), later ones add
    // argument bytes.
    std::vector<responses_event> call(int64_t index, const std::string & call_id, const std::string & name,
                                      const std::string & arguments);

    // How the answer ended, its usage and the `warmctx` extension object (null: none).
    std::vector<responses_event> finish(finish_reason finish, const completion_usage & usage,
                                        const nlohmann::json & warmctx);

    std::vector<responses_event> error(const api_error & e);

    // While the answer has not begun (queued, prefilling): another response.in_progress.
    // Clients whose idle timers count events, not SSE comments (Codex), stay connected
    // through a long prefill. Nothing once the answer has begun or ended.
    std::vector<responses_event> heartbeat();

    bool done() const { return done_; }

private:
    struct item {
        bool is_call = false;
        bool is_reasoning = false;
        std::string id;            // msg_... / fc_...
        int output_index = 0;
        std::string text;          // a message's text
        int64_t chat_index = 0;    // a call's index in the chat deltas
        std::string call_id, name, arguments;
        std::string status = "in_progress";
    };

    responses_event make(std::string type, nlohmann::json data);
    nlohmann::json item_json(const item & it) const;
    // Opens `it` (its output index set here) with one empty content part.
    void open_with_part(item it, const nlohmann::json & empty_part, std::vector<responses_event> & out);
    void open_message(std::vector<responses_event> & out);
    void add_text(const std::string & piece, std::vector<responses_event> & out);
    void add_reasoning(const std::string & piece, std::vector<responses_event> & out);
    void add_call(int64_t index, const std::string & call_id, const std::string & name, const std::string & args,
                  std::vector<responses_event> & out);
    void close_open(std::vector<responses_event> & out, const char * status);
    nlohmann::json final_object(std::string_view status) const;

    responses_request_info info_;
    std::string id_;
    std::string suffix_;           // the id without "resp_"
    int64_t created_at_ = 0;
    int64_t seq_ = 0;
    std::vector<item> items_;
    int open_ = -1;                // index into items_ of the open item, -1: none
    int n_messages_ = 0, n_calls_ = 0, n_reasonings_ = 0;
    bool done_ = false;
    // What the final response object carries (set by finish(); none after error()).
    std::optional<completion_usage> usage_;
    nlohmann::json warmctx_ = nullptr;
};

}  // namespace warmctx::server_detail
