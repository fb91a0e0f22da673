// warmctx/text_model.h - the model's tokenizer and chat template, as the assembler sees
// them, and where the assembler may cut a text so that its parts tokenize apart.
//
// The context layer knows no model: the engine implements text_model over the real one
// (engine/engine_adapters.h), tests over a fake.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/conversation.h"
#include "warmctx/status.h"
#include "warmctx/types.h"

namespace warmctx {

// The model's tokenizer and chat template, as the assembler needs them. The engine
// side implements it over the real model; tests use a fake.
class text_model {
  public:
    virtual ~text_model() = default;
    // Text -> tokens, special tokens ("<|im_start|>") parsed into their ids.
    // REQUIRES of the implementation: no BOS/EOS added (see prefix_tokens), and the
    // same text always gives the same tokens.
    virtual result<std::vector<token_id>> tokenize(std::string_view text) const = 0;
    // Text -> tokens with special-token text left as plain text: a segment's content
    // that happens to contain "<|im_end|>" must not end its message. The default
    // (for tokenizers without special tokens) is tokenize().
    virtual result<std::vector<token_id>> tokenize_plain(std::string_view text) const { return tokenize(text); }
    // tokenize_plain's answer when the implementation has it at hand without
    // tokenizing (a memo of recent contents), else nullopt. The assembler tokenizes
    // only the rest, in parallel when it is large.
    virtual std::optional<std::vector<token_id>> remembered_plain(std::string_view) const { return std::nullopt; }
    // True when tokenize_plain(a + b) == tokenize_plain(a) + tokenize_plain(b) for every
    // `a` ending in '\n' and `b` starting with an ASCII letter or digit or with "@@ " (a
    // BPE tokenizer whose pre-tokenizer never joins a line break to the word after it):
    // is_line_cut. The assembler then cuts a large text at such line starts,
    // deterministically, and tokenizes the parts on several threads (one big segment, a
    // repository map, is no longer one thread's work); and it cuts a diff at its files
    // and hunks (diff_unit_cuts), so that each starts a chunk of its own.
    virtual bool plain_splits_at_lines() const { return false; }
    // True when the same holds for a cut before any line that is not blank
    // (is_any_line_cut: also one that starts with indentation or punctuation, as most
    // lines of code do): byte-level BPE tokenizers whose pre-tokenizer keeps a line break
    // apart from the next line's indentation (Qwen2, Llama 3), not GPT-2's. A stable
    // segment's finer blocks (line_block_cuts) are then cut at such lines, so an edit deep
    // inside an indented function keeps the lines above it.
    virtual bool plain_splits_at_any_line() const { return false; }
    // tokenize_plain of a part of a larger text: the implementation need not remember it.
    virtual result<std::vector<token_id>> tokenize_plain_part(std::string_view text) const {
        return tokenize_plain(text);
    }
    // The plain tokens of `text`, joined from its parts, for remembered_plain.
    virtual void remember_plain(std::string_view /*text*/, const std::vector<token_id> & /*tokens*/) const {}
    // One chat message through the model's template, exactly the text this message
    // contributes inside a conversation, e.g. "<|im_start|>user\nhi<|im_end|>\n".
    // REQUIRES of the implementation: no BOS and no default system prompt that a
    // template injects when a conversation does not start with one (Qwen2.5's
    // does): render such templates in context and cut the message's own text out.
    virtual result<std::string> render_message(std::string_view role, std::string_view content) const = 0;
    // The text that opens the assistant's answer, e.g. "<|im_start|>assistant\n".
    virtual std::string generation_prompt() const = 0;
    // True when whole conversations are rendered through the model's own (Jinja)
    // template (render_conversation); assemble() then takes that path, below.
    virtual bool renders_conversations() const { return false; }
    // True when the template writes every message's content verbatim, and what it writes
    // around a content does not depend on it (but for its being empty): a conversation's
    // rendering is then its skeleton's with the contents put in (conversation.h).
    virtual bool renders_contents_verbatim() const { return false; }
    // The conversation as the model's template renders it, tools in the template's own
    // format (`tools_json`: the OpenAI tools array as JSON text, "" = none), with the
    // runs that came from the request's data marked. REQUIRES of the implementation:
    // the same input always gives the same output; no BOS text when prefix_tokens()
    // holds the BOS.
    virtual result<rendered_conversation> render_conversation(std::span<const conversation_message>,
                                                              std::string_view /*tools_json*/,
                                                              bool /*add_generation_prompt*/) const {
        return failed_precondition("this text model renders no conversations");
    }
    // True when render_conversation remembers recent renders of small inputs (safely
    // from several threads): the assembler then renders what it will ask for on threads
    // of their own ahead of time.
    virtual bool remembers_renders() const { return false; }
    // Tokens that open every prompt (a BOS for models that want one; none for Qwen2).
    // They are part of the first segment's token range.
    virtual std::vector<token_id> prefix_tokens() const { return {}; }
    // The fill-in-the-middle tokens, when the vocabulary has all three.
    struct fim_tokens {
        token_id prefix = -1, suffix = -1, middle = -1;
    };
    virtual std::optional<fim_tokens> fim() const { return std::nullopt; }
};

// The assembler's cut points for plain_splits_at_lines: `p` is a line start (t[p-1] is
// '\n') whose first character is an ASCII letter or digit, or that starts a diff's hunk
// header ("@@ "). REQUIRES 0 < p < t.size().
inline bool is_line_cut(std::string_view t, size_t p) {
    const char c = t[p];
    return t[p - 1] == '\n' && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                                 t.substr(p, 3) == "@@ ");
}

// The finer blocks' cut points for plain_splits_at_any_line: `p` is a line start whose
// line, after any spaces and tabs, goes on with a printable ASCII character. Not a blank
// line, nor one whose indentation runs into a carriage return or into other (Unicode)
// white space: a pre-tokenizer may join a line break to such a run when another line
// break follows it. REQUIRES 0 < p < t.size().
inline bool is_any_line_cut(std::string_view t, size_t p) {
    if (t[p - 1] != '\n') return false;
    size_t i = p;
    while (i < t.size() && (t[i] == ' ' || t[i] == '\t')) ++i;
    return i < t.size() && t[i] > ' ' && t[i] < 0x7f;
}

// Where a unified diff (a segment of kind diff) is cut so that its parts start chunks of
// their own: before each "diff --git " line (a file), before a file's first "@@ " line
// (its header apart from its hunks: a file changed again keeps its header's tokens), and
// before a later "@@ " line once k_diff_unit_min_bytes have passed since the last cut (a
// hunk run too small to be worth a decode call of its own stays with the one before).
// At most k_diff_max_cuts (a diff of thousands of tiny files would otherwise make as
// many decode calls). Each cut depends only on the text before it, so two diffs that
// start alike are cut alike up to where they differ. Every cut is an is_line_cut point.
// Ascending, in (0, size).
inline constexpr size_t k_diff_unit_min_bytes = 1024;
inline constexpr size_t k_diff_max_cuts = 64;
std::vector<size_t> diff_unit_cuts(std::string_view t);

}  // namespace warmctx
