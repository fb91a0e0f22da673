// warmctx/chat_template.h - the model's own chat template (Jinja, through llama.cpp's
// common/chat), its tool-call grammars and its output parser.
//
// Built as a library of its own (warmctx_chat, src/engine/chat_template.cpp) that links
// llama.cpp's `llama-common` PRIVATE: that library carries its own JSON library, which
// must not meet the one the rest of warmctx is built with. This header therefore holds
// only plain types.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/conversation.h"
#include "warmctx/status.h"

namespace warmctx {

struct chat_template_source {
    std::string source;     // the Jinja text
    std::string bos_text;   // the vocabulary's BOS/EOS token text, as templates see them
    std::string eos_text;
    bool strip_bos = false; // the tokenizer adds BOS itself: a rendered leading BOS text goes
    // The texts the tokenizer parses as control tokens (engine::special_token_texts). A
    // render refuses request data that would reach the prompt as such a token: data a
    // template copies through a filter that drops llama.cpp's mark of request data
    // (`tojson` of a tool call's arguments, say).
    std::vector<std::string> control_texts;
};

// Parses a model's answer by the template's tool-call format. Thread-safe.
class chat_output_parser {
  public:
    virtual ~chat_output_parser() = default;
    // `partial`: the answer is still being generated (an unfinished call is left out
    // of tool_calls, and its arguments so far are not guessed at).
    // Errors: invalid_argument (a finished answer that does not parse).
    virtual result<parsed_answer> parse(const std::string & text, bool partial) const = 0;
};

// What generating an answer under tools (or a JSON schema) needs: a grammar, lazy when
// the model may also answer in text (it binds from the first trigger on), stop strings,
// and the parser of the answer.
struct answer_format {
    std::string grammar;                        // GBNF, root rule "root"; "" = none
    bool grammar_lazy = false;
    std::vector<std::string> trigger_patterns;  // regexes over the output (lazy grammar)
    std::vector<std::string> trigger_words;     // literal texts; the engine maps them to
                                                // single tokens where it can
    std::vector<std::string> additional_stops;
    std::string generation_prompt;              // the grammar's start, already in the prompt
    std::shared_ptr<const chat_output_parser> parser;
    std::string format_name;                    // the template's format, for logs
    // The answer's reasoning block: the text that opens it and those that close it
    // (Qwen's "<think>" and "</think>"), when the template's format has one; "" = none.
    std::string reasoning_start;
    std::vector<std::string> reasoning_ends;
    // Control tokens the parser reads (gpt-oss's "<|channel|>"): the answer keeps their text.
    std::vector<std::string> preserved_tokens;
};

struct answer_request {
    std::string tools_json;                 // OpenAI `tools` array as JSON text ("" = none)
    tool_choice_mode choice = tool_choice_mode::auto_;
    std::string named_function;             // tool_choice naming one function ("" = not named)
    bool parallel_tool_calls = false;
    std::string json_schema;                // response_format json_schema's schema ("" = none)
};

class chat_templates {
  public:
    // Parses the template. Errors: invalid_argument (not a Jinja template llama.cpp runs).
    static result<std::unique_ptr<chat_templates>> load(const chat_template_source & src);
    virtual ~chat_templates() = default;

    // The conversation rendered as the template renders it (tools in its own format,
    // add_generation_prompt), with the runs that came from the request's data marked.
    // Errors: invalid_argument (the template raised an error, e.g. "roles must
    // alternate"; bad tools or tool_calls JSON).
    virtual result<rendered_conversation> render(std::span<const conversation_message> msgs,
                                                 std::string_view tools_json,
                                                 bool add_generation_prompt) const = 0;

    // The grammar and parser of an answer to a conversation whose LAST messages are
    // `tail` (a generation prompt may depend on them; contents do not matter). Answers
    // are memoised by request. Errors: invalid_argument (bad tools, an unknown named
    // function, a schema llama.cpp cannot turn into a grammar).
    virtual result<answer_format> answer(std::span<const conversation_message> tail,
                                         const answer_request & req) const = 0;

    virtual const std::string & source() const = 0;
    // The template writes contents verbatim (text_model::renders_contents_verbatim), as
    // probed at load: conversations of every role with contents that templates are known
    // to look into (surrounding whitespace, <think>, <tool_response>, [TOOL_CALLS], ...)
    // render exactly as their skeletons with the contents put in.
    virtual bool contents_verbatim() const = 0;
    // The template takes one system message, first (as probed at load: it refuses a
    // second), so the system messages are rendered as one, joined by blank lines
    // (Qwen3.5's, Mistral's): a system segment after the first has no message of its own.
    virtual bool joins_system_messages() const { return false; }
    // The template's answers open with a reasoning block (answer({}, {}) names its tags):
    // every chat answer is parsed, so reasoning is not returned as content.
    virtual bool reasons() const { return false; }
};

// A JSON schema (JSON text) as a GBNF grammar, by llama.cpp's json-schema-to-grammar.
// Errors: invalid_argument (not JSON, or a schema it does not support).
result<std::string> json_schema_grammar(std::string_view schema_json);

}  // namespace warmctx
