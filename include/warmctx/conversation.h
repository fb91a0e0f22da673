// warmctx/conversation.h - a conversation as a model's own (Jinja) chat template sees it,
// and the tool calls parsed back out of an answer. Plain types: no JSON library, no
// llama.cpp, so both the assembler (context layer) and the engine's template code
// (built apart from the rest, see src/engine/CMakeLists.txt) can include it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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

// ---- skeletons -------------------------------------------------------------------
//
// A skeleton is a conversation rendered with every non-empty content replaced by
// content_placeholder(i) (i: the message's index). For a template that writes contents
// verbatim (chat_templates::contents_verbatim), the real rendering is the skeleton's
// with each placeholder replaced by its content - cheap, and the skeleton stays the same
// turn after turn.

inline constexpr std::string_view k_content_placeholder = "WARMCTXPLACEHOLDER";
inline std::string content_placeholder(size_t i) {
    return std::string(k_content_placeholder) + std::to_string(i) + "Z";
}

// Where skeleton position `pos` lands in a text whose placeholders (`holes`, ascending
// [begin, end) in the skeleton) were replaced: `anchors` holds (skeleton end, text end)
// of each. nullopt inside a placeholder. O(log n).
inline std::optional<size_t> map_skeleton_pos(const std::vector<std::pair<size_t, size_t>> & holes,
                                              const std::vector<std::pair<size_t, size_t>> & anchors, size_t pos) {
    // The last hole that begins before pos: inside it, or pos is past it.
    auto h = std::lower_bound(holes.begin(), holes.end(), pos,
                              [](const std::pair<size_t, size_t> & x, size_t p) { return x.first < p; });
    if (h != holes.begin() && pos < std::prev(h)->second) return std::nullopt;
    // The last anchor at or before pos.
    auto a = std::upper_bound(anchors.begin(), anchors.end(), pos,
                              [](size_t p, const std::pair<size_t, size_t> & x) { return p < x.first; });
    if (a == anchors.begin()) return pos;
    --a;
    return a->second + (pos - a->first);
}

// A skeleton's rendering with the contents put in: the text, its runs (a placeholder
// must lie inside a run of data), and per placeholder its [begin, end) in the skeleton
// and where it ends in the expanded text.
struct expanded_skeleton {
    rendered_conversation text;
    std::vector<std::pair<size_t, size_t>> holes;    // skeleton [begin, end) of each placeholder
    std::vector<std::pair<size_t, size_t>> anchors;  // (skeleton end, expanded end) of each
    // Where skeleton position `pos` lands in the expanded text (nullopt: inside a placeholder).
    std::optional<size_t> map(size_t pos) const { return map_skeleton_pos(holes, anchors, pos); }
};

// nullopt when a placeholder is malformed, names no message, or lies in template text.
inline std::optional<expanded_skeleton> expand_skeleton(const rendered_conversation & skel,
                                                        std::span<const conversation_message> msgs) {
    expanded_skeleton out;
    size_t prev = 0;
    for (const render_run & r : skel.runs) {
        const std::string_view run(skel.text.data() + prev, r.end - prev);
        size_t sp = 0;
        while (true) {
            const size_t at = run.find(k_content_placeholder, sp);
            out.text.text.append(run.substr(sp, at == std::string_view::npos ? run.npos : at - sp));
            if (at == std::string_view::npos) break;
            if (!r.input) return std::nullopt;
            size_t q = at + k_content_placeholder.size(), idx = 0;
            bool digits = false;
            while (q < run.size() && run[q] >= '0' && run[q] <= '9')
                idx = idx * 10 + size_t(run[q++] - '0'), digits = true;
            if (!digits || q >= run.size() || run[q] != 'Z' || idx >= msgs.size()) return std::nullopt;
            ++q;
            out.holes.push_back({prev + at, prev + q});
            out.text.text += msgs[idx].content;
            out.anchors.push_back({prev + q, out.text.text.size()});
            sp = q;
        }
        if (!out.text.runs.empty() && out.text.runs.back().input == r.input)
            out.text.runs.back().end = out.text.text.size();
        else out.text.runs.push_back({out.text.text.size(), r.input});
        prev = r.end;
    }
    return out;
}

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
