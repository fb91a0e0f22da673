// warmctx/assembler.h - segments -> one canonical prompt: its tokens, manifest and blocks.
//
// assemble() turns a request's segments into the exact tokens the engine prefills:
//
//   1. validate: ids well-formed and unique, at most one `user` segment, paths and
//      roles checked (validate_segments);
//   2. canonical order: by the kind table's order, then id, then path (byte-wise);
//      inside a run of stable segments of one class, the workspace's learned order when
//      given (hints, warmctx/volatility.h). Input order never changes anything below;
//   3. render. With the model's own (Jinja) template (text_model::renders_conversations)
//      the segments are one conversation (a tools segment that holds an OpenAI tools
//      array becomes the template's tools), rendered whole, once: that text is the
//      prompt. It is cut into one piece per segment where the text before a cut depends
//      on the segments before it only: the end of the rendering of the segments before,
//      found on renderings with the contents left out ("skeletons") aligned with the
//      whole. A segment with no such point after it shares a piece with the segments
//      after it. Where the cuts fall decides only how much a later turn can reuse.
//      Without that template, each segment is ONE chat message rendered alone
//      (text_model::render_message) and the prompt is the messages one after another;
//   4. tokenize: each piece apart from the others, so the tokens of a prefix of
//      pieces are identical whatever follows. The template's own text is tokenized
//      with special tokens parsed, the request's data as plain text (tokenize_plain),
//      so content cannot inject control tokens. Contents the model does not remember
//      (text_model::remembered_plain) are tokenized on several threads when they are
//      large, a large one in parts cut at line starts (is_line_cut) where the
//      tokenizer gives the whole text's tokens that way; in a conversation rendered
//      whole, a diff (or a chat message carrying one) is cut at its files and hunks
//      (diff_unit_cuts), each part a piece of its own;
//   5. the generation prompt (e.g. "<|im_start|>assistant\n"), if asked for, is a
//      final piece of its own (in a conversation rendered whole: where the rendering
//      without it is a prefix of the rendering with it). It belongs to NO segment: its
//      blocks carry segment_index == k_generation_prompt_index and retention `none`,
//      and it always starts a chunk, so the same segments with and without a
//      generation prompt share every cached segment's KV;
//   6. blocks: the canonical chunks the engine prefills (warmctx/chunking.h, plan_chunks):
//      every piece starts a chunk, except a piece that follows a piece of retention
//      `none` (nothing from there on is ever cached, so no warm turn starts there:
//      the uncached tail - question and generation prompt - is chunked together);
//      a block never crosses a boundary, and inside a run of pieces a new block starts
//      every chunk_tokens tokens counted from the run's start. Block i carries the chain
//      hash h_i = H(h_{i-1}, its token ids), h_0 = H(profile fingerprint, tenant
//      salt). h_i names the KV of [0, block_i.end) exactly: same tokens, same chunk
//      composition, same profile, same tenant. The blocks' ranges are exactly
//      plan_chunks(0, tokens.size(), boundaries, chunk_tokens), so every block end
//      (not only a segment end) is a point where a cold run's chunks also split: a
//      cached prefix may end at any block end, and an edit deep inside a segment
//      keeps the hashes of that segment's blocks before it.
//
// Token ids are hashed as little-endian int32, so hashes do not depend on the host.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/hash.h"
#include "warmctx/kind_table.h"
#include "warmctx/manifest.h"
#include "warmctx/profile.h"
#include "warmctx/segments.h"
#include "warmctx/status.h"
#include "warmctx/text_model.h"
#include "warmctx/types.h"
#include "warmctx/volatility.h"

namespace warmctx {

// ---- validation ----------------------------------------------------------------

inline constexpr size_t k_max_segment_id_chars = 128;
inline constexpr size_t k_max_segment_path_bytes = 4096;

// A segment id later names files and URL path segments, so: 1..128 chars from
// [A-Za-z0-9._:/-], no leading, trailing or doubled '/', and no "." or ".."
// component. Errors: invalid_argument naming the id and the rule it breaks.
status validate_segment_id(std::string_view id);

// Every id valid (validate_segment_id) and unique; at most one `user` segment;
// paths free of control characters and at most 4096 bytes (a path is printed in a
// one-line header); a `role`, when set, a chat role, and either the kind's own role
// or allowed by the kind's policy (role_from_segment). Errors: invalid_argument.
status validate_segments(std::span<const segment> segs, const kind_table & kinds);

// ---- assembly ------------------------------------------------------------------

inline constexpr int k_generation_prompt_index = -1;

struct block {
    hash128 chain;                 // h_i: names the KV of [0, end)
    pos_t begin = 0, end = 0;      // [begin, end)
    retention_class retention = retention_class::none;  // the segment's class
    int segment_index = 0;         // into manifest.segments, or k_generation_prompt_index
    bool operator==(const block &) const = default;
};

struct assembled_prompt {
    std::vector<token_id> tokens;
    // The start of every piece (segment or generation prompt) after the first whose
    // previous piece is cached (retention not `none`), sorted, unique, inside
    // (0, tokens.size()) - the engine's canonical chunking input.
    std::vector<pos_t> boundaries;
    manifest prompt_manifest;
    // Cover [0, tokens.size()) in order, without gaps.
    std::vector<block> blocks;
    hash128 root_hash;             // h_0 = H(profile fingerprint, tenant salt); never publish
    // The chain hash at stable_end: the end of the leading run of segments whose
    // stability is `stable` (with the default order: the last stable segment, since
    // all stable kinds come first). It names the warm part a workspace keeps across
    // turns (routing, explain). No leading stable segment: root_hash and 0.
    hash128 stable_prefix_hash;
    pos_t stable_end = 0;
    // Tokens in `stable` segments wherever they are (== stable_end unless an override
    // moved a stable kind after a non-stable one).
    pos_t n_stable_tokens = 0;
    // The workspace's learned order and finer blocks it was assembled with
    // (warmctx/volatility.h; empty: the kind order and whole chunks), and, set by whoever
    // decided them, whether that order differs from the workspace's last turn's and why.
    assembly_hints hints;
    bool reordered = false;
    std::string order_note;
    // Per reorderable stable segment, its content_digest (warmctx/volatility.h): the
    // runtime keeps it for the workspace's next turn to locate an edit.
    std::map<std::string, std::vector<uint64_t>> content_digests;
    // The index in prompt_manifest.segments of the first chat message (is_chat_message), if any:
    // where a fused conversation begins, and what the workspace's head watch follows.
    std::optional<size_t> first_chat_message;
};

// Where a warm run may start reusing: the end of the last of the first `n_blocks`
// blocks that ends before the prompt's last token (that token's logits must be
// computed). A block end is a canonical chunk start, so the tail's chunks are the cold
// run's. This is the one snapping rule: the engine's cache, the tiers and explain all
// use it.
struct reuse_point {
    size_t n_blocks = 0;  // blocks reused
    pos_t n_tokens = 0;   // == blocks[n_blocks - 1].end (0 when none)
};
reuse_point snap_reuse(const assembled_prompt & prompt, size_t n_blocks);

// The checkpoint spacing (profile::checkpoint_tokens) for a model whose memory keeps a
// checkpoint of `checkpoint_bytes` where a turn may resume, beside `kv_bytes_per_token` of
// attention KV: the fewest whole chunks whose attention KV outweighs one checkpoint, so
// checkpoints at most double the memory; 0 (any chunk end) when one chunk does.
uint32_t checkpoint_spacing(uint64_t checkpoint_bytes, uint64_t kv_bytes_per_token, uint32_t chunk_tokens);

// The span of a conversation's chunk runs (profile::span_tokens): the call size from
// which a decode call at depth costs about what its tokens do rather than what a call
// does (docs/benchmarks.md, "A conversation in calls of the engine's size"). On a GPU,
// 128 (a call's fixed cost, ~3 ms at 16k cells, is ~110 tokens' worth). On the CPU, the
// larger of: the fewest rows that fill flash attention's tiles (it splits a call's rows
// times heads into 4 pieces per thread, each computed as whole 64-row tiles: 256 *
// n_threads / n_head), and the rows whose weights (`weights_per_row`: the parameters a
// row is multiplied through, the embedding table's aside) make a call's own ~5 ms a third
// of it; in whole tiles, 64 to 256 (the tiny shapes 256, a 0.5B shape 64; not more: an
// appended turn prefills its last span again, docs/benchmarks.md). At most chunk_tokens.
// Where a span starts shallower than 8 spans deep it is shorter (a run's start / 8:
// blocks.cpp). The span only places block ends, which name their tokens' range (a
// block's chain hash), so a span that differs between two runs (other threads) makes
// other blocks, never a false hit.
uint32_t conversation_span(std::string_view backend, uint32_t chunk_tokens, uint32_t n_threads, int32_t n_head,
                           uint64_t weights_per_row);

// The leading segments of a prompt whose rest still has much to tokenize, so that they
// can be prefilled while the rest tokenizes (scheduler::prefill_ahead): the longest run
// of `segs` in the prompt's canonical order, of classes above `none`, whose contents not
// remembered by `model` (text_model::remembered_plain) add up to at most
// `max_lead_bytes`, when the contents after it not remembered add up to at least
// `min_rest_bytes`. Empty when there is no such run, when it holds nothing to tokenize
// (nothing to gain) or when it is the whole prompt. Assembled alone, these segments
// give the tokens the whole prompt starts with wherever the template renders a
// message independently of those after it; where it does not, a lookup simply finds
// fewer blocks.
std::vector<segment> leading_segments(std::span<const segment> segs, const kind_table & kinds,
                                      const text_model & model, size_t min_rest_bytes, size_t max_lead_bytes,
                                      std::span<const std::string> learned = {});

// A message of the conversation: this turn's question, or a history segment that says
// whose message it is (the chat APIs' history; a workspace's history segments without
// a role are each their own run).
bool is_chat_message(const segment & s);

// The segments in the order assemble puts them: by (kind order, id, path), then, inside
// each run of reorderable segments (is_reorderable: stable, not the tools) of one
// retention class, in the order of `learned` (ids
// it does not name first, in that order). Depends on `learned` and the segments' ids,
// never on their input order.
std::vector<const segment *> ordered_segments(std::span<const segment> segs, const kind_table & kinds,
                                              std::span<const std::string> learned = {});

// Errors: invalid_argument (validate_segments fails, no segments, chunk_tokens == 0
// or differs from prof.chunk_tokens), out_of_range (more than INT32_MAX tokens), and
// whatever the text_model returns, prefixed with the segment's id.
// `hints`: the workspace's learned order (ordered_segments) and the stable segments cut
// into finer blocks at line starts (line_block_cuts; only in a conversation rendered
// whole, and where the model's tokenizer splits at lines, so the tokens are unchanged).
// `continuation`: the start of the assistant's answer, given by the client (a request
// whose last message is the assistant's): its text after the generation prompt, in the
// generation prompt's piece, so the model continues it.
result<assembled_prompt> assemble(std::span<const segment> segs, const kind_table & kinds,
                                  const text_model & model, const profile & prof,
                                  std::string_view tenant_salt, uint32_t chunk_tokens,
                                  bool add_generation_prompt = true, const assembly_hints & hints = {},
                                  std::string_view continuation = {});

// A raw completion (/v1/completions): the prompt is `prompt.content` as given - no chat
// template - tokenized with special tokens parsed, after the model's prefix tokens, as
// llama-server does. It is one piece of class `low` (cacheable: two prompts sharing a
// beginning share its whole blocks). With a `suffix` (fill-in-the-middle): FIM prefix
// token, the prompt, FIM suffix token, the suffix, FIM middle token; the part from the
// FIM suffix token on is class `none` (never cached). The manifest has the prompt's
// entry (and "suffix"). Errors: invalid_argument (an empty prompt, a suffix but no FIM
// tokens in the vocabulary), as assemble's otherwise.
result<assembled_prompt> assemble_raw(const segment & prompt, const std::optional<std::string> & suffix,
                                      const text_model & model, const profile & prof, std::string_view tenant_salt,
                                      uint32_t chunk_tokens);

// h_0 = H(fingerprint, salt): the root every chain hash of a tenant starts from.
hash128 root_hash(const profile & prof, std::string_view tenant_salt);

// hash_bytes of the token ids as little-endian int32 - a segment's token_hash.
hash128 hash_tokens(std::span<const token_id> tokens);
// hash_combine(prev, token ids as little-endian int32) - one link of a block chain:
// blocks[i].chain == chain_hash(blocks[i-1].chain or root, tokens of block i).
hash128 chain_hash(hash128 prev, std::span<const token_id> tokens);

}  // namespace warmctx
