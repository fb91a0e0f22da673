// warmctx/conversation.h - a conversation as a model's own (Jinja) chat template sees it,
// and the tool calls parsed back out of an answer. Plain types: no JSON library, no
// llama.cpp, so both the assembler (context layer) and the engine's template code
// (built apart from the rest, see src/engine/CMakeLists.txt) can include it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace warmctx {

// One message. `tool_calls` is an assistant message's OpenAI `tool_calls` array as JSON
// text ("" = none); `tool_call_id` the call a `tool` message answers.
struct conversation_message {
    std::string role;  // system | user | assistant | tool
    std::string content;
    std::string tool_calls;
    std::string tool_call_id;
};

// A rendered conversation: the text, cut into runs that came from the template itself
// (tokenized with special tokens parsed: "<|im_start|>") or from the request's data
// (message contents, tool schemas, call arguments: tokenized as plain text, so data can
// never inject a control token). runs[i] covers [runs[i-1].end, runs[i].end).
struct render_run {
    size_t end = 0;
    bool input = false;
};
struct rendered_conversation {
    std::string text;
    std::vector<render_run> runs;
};

// How the answer may call tools (OpenAI's tool_choice): auto (the model decides),
// none (no calls: the answer is text), required (at least one call).
enum class tool_choice_mode { auto_, none, required };

// One tool call parsed from the model's output.
struct parsed_tool_call {
    std::string id;         // generated when the model's format carries none
    std::string name;
    std::string arguments;  // JSON text
    bool operator==(const parsed_tool_call &) const = default;
};

// An answer parsed by the template's format: the text, the reasoning (models that
// think), the calls.
struct parsed_answer {
    std::string content;
    std::string reasoning;
    std::vector<parsed_tool_call> tool_calls;
};

}  // namespace warmctx
