// Internal: where a conversation rendered whole through the model's own template
// (text_model::renders_conversations) may be cut into one piece per segment.
//
// The conversation is rendered whole, once, as the template renders it (F). It is then
// cut into one piece per segment at points where the text before the cut depends on
// the segments before it only: the end of the rendering of segments [0, k) without a
// generation prompt, when that rendering is a prefix of F. Those prefix renderings are
// made with every content replaced by a short placeholder ("skeletons": cheap, and the
// same turn after turn, so the text model may remember them), and mapped onto F by
// aligning the skeleton of the whole conversation with F, content by content (a
// template may trim a content; any other transformation fails the alignment, and then
// the prefixes are rendered with their real contents). A segment whose prefix is not a
// prefix of F (Qwen2.5's template writes a default system prompt when the tools come
// without one, so "tools alone" is no prefix of "tools and system") shares one piece
// with the segments after it, up to the next cut. Each piece is tokenized alone, the
// template's own text with special tokens parsed, the request's data as plain text
// (conversation_tokens.cpp). Where the cuts fall decides only how much a later turn can
// reuse: the prompt is F in every case.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "warmctx/assembler.h"
#include "warmctx/conversation.h"

namespace warmctx::detail {

// The segments as the template sees them: messages, and the tools arrays of tools
// segments (which the template renders in its own tool format).
struct conversation_plan {
    std::vector<conversation_message> msgs;   // real contents
    std::vector<conversation_message> skel;   // contents replaced by placeholders
    std::vector<int> msg_of;                  // segment -> message index, -1 for tools
    std::vector<std::string> tools_of;        // segment -> its tools array text (tools segments)
};

// The plan of the segments of `order`, each rendered with roles[i]: a tools segment that
// holds an OpenAI tools array is the template's tools, every other segment a message.
conversation_plan plan_conversation(std::span<const segment * const> order, std::span<const std::string> roles,
                                    const kind_table & kinds);

// The tools arrays of the segments [0, k) as one array text ("" when none).
std::string tools_upto(const conversation_plan & cp, size_t k);

// The cut points: cut[k] (k = 0..n) = where the text of segments [0, k) ends in F
// (cut[0] == 0), or nullopt when no such point exists; the cuts that exist ascend.
// `whole_skel`: the whole skeleton's rendering when the caller has it (else nullptr);
// `expanded`: F made from it (a template that writes contents verbatim), else nullptr
// and the skeleton is aligned with F here. The same conversation always gets the same
// cuts.
std::vector<std::optional<size_t>> conversation_cuts(const conversation_plan & cp, const rendered_conversation & f,
                                                     const text_model & model, bool add_generation_prompt,
                                                     const rendered_conversation * whole_skel,
                                                     const expanded_skeleton * expanded);

// The two whole prefixes of a long conversation's skeleton that conversation_cuts renders
// (all its segments and all but the last, without a generation prompt), rendered on
// threads of their own while the caller renders F: each costs about what F does, and
// the text model remembers renders (text_model::render_conversation), so the cut finder
// finds them done. Nothing is started for a template that does not write contents
// verbatim or a conversation short enough to have each prefix rendered anyway. join()
// before conversation_cuts (the destructor joins too).
class prefix_renders_ahead {
  public:
    prefix_renders_ahead(const conversation_plan & cp, const text_model & model);
    ~prefix_renders_ahead() { join(); }
    prefix_renders_ahead(const prefix_renders_ahead &) = delete;
    prefix_renders_ahead & operator=(const prefix_renders_ahead &) = delete;
    void join();
    size_t started() const { return threads_.size(); }

  private:
    std::vector<std::thread> threads_;
};

}  // namespace warmctx::detail
