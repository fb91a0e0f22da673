// Internal: what the assembler's files share. assembler.cpp orders, validates and puts
// the prompt together; tokenize.cpp tokenizes segments (on several threads when there is
// much); template_cuts.cpp and conversation_tokens.cpp render a conversation whole
// through the model's own template and cut it into pieces; blocks.cpp chunks the pieces
// into hashed blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/assembler.h"

namespace warmctx::detail {

// One contiguous range of the prompt that chunks restart at: a segment, a part of one
// (a diff's unit), or the generation prompt.
struct piece {
    pos_t begin = 0, end = 0;
    retention_class retention = retention_class::none;
    int segment_index = 0;  // into manifest.segments, or k_generation_prompt_index
    // A chat message (not an assistant's) right after another: it shares the chunk run
    // of the message before it, which began at the last assistant message (or at the
    // first message of the run). See build_blocks.
    bool continues = false;
    // A chat message (of any role) right after another: where an assistant message is,
    // it starts a run only once the run before it holds profile::span_tokens.
    bool after_message = false;
};

// Fills out.boundaries, out.blocks and out.root_hash from the prompt's pieces, which
// cover out.tokens in order (see assemble).
void build_blocks(assembled_prompt & out, std::span<const piece> pieces, const profile & prof,
                  std::string_view tenant_salt, uint32_t chunk_tokens);

// A segment's message text: its content, after a one-line header for kinds that have
// one (the path says more to the model than the id).
std::string message_text(const segment & s, const kind_policy & p);

// The message text of the per-message path: a template that renders one message alone
// has no place for tool calls, so an assistant message's calls follow its text as JSON.
std::string message_content(const segment & s, const kind_policy & p);

// tokenize_plain of every text, spread over threads when there is much; a large text is
// tokenized in parts where the model allows it (text_model::plain_splits_at_lines), and
// its joined tokens are then remembered whole. One result per text, in order.
std::vector<result<std::vector<token_id>>> tokenize_plain_spread(const text_model & model,
                                                                 std::span<const std::string_view> texts);

// The per-message path: every segment of `order` rendered as one message (with
// roles[i]) and tokenized alone. One result per segment, in order.
std::vector<result<std::vector<token_id>>> tokenize_segments(std::span<const segment * const> order,
                                                             std::span<const std::string> roles,
                                                             const kind_table & kinds, const text_model & model);

// The conversation path (text_model::renders_conversations): the segments of `order`
// rendered whole and cut into pieces.
struct conversation_tokens {
    std::vector<result<std::vector<token_id>>> seg;  // per segment in `order` (empty: shares the next piece)
    std::vector<retention_class> piece_cls;          // per segment: the class of the piece it ends
    std::vector<token_id> gen;                       // the generation prompt's own tokens
    // Per segment: offsets into seg[i] where a piece of its own starts inside it (a
    // diff's files and hunks: diff_unit_cuts), ascending, in (0, seg[i].size()).
    std::vector<std::vector<size_t>> sub_cuts;
};
// `fine[i]`: segment i is cut into finer blocks at line starts (line_block_cuts) where
// the tokenizer allows it, from that many bytes of its text on (assembly_hints::fine_from).
result<conversation_tokens> tokenize_conversation(std::span<const segment * const> order,
                                                  std::span<const std::string> roles, const kind_table & kinds,
                                                  const text_model & model, bool add_generation_prompt,
                                                  const std::vector<std::optional<size_t>> & fine);

}  // namespace warmctx::detail
