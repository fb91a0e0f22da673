// warmctx/assembler.h - segments -> one canonical prompt, its manifest and block hashes.
//
// assemble() turns a request's segments into the exact tokens the engine prefills:
//
//   1. validate: ids well-formed and unique, at most one `user` segment;
//   2. canonical order: by the kind table's order, then id, then path (byte-wise).
//      Input order never changes anything below;
//   3. each segment becomes ONE chat message, rendered alone through the model's
//      template and TOKENIZED ALONE. Its tokens therefore depend on that segment
//      only, and the tokens of a prefix of segments are identical whatever follows.
//      The template's frame around the content (e.g. "<|im_start|>user\n" and
//      "<|im_end|>\n") is tokenized with special tokens parsed, the content itself
//      as plain text (tokenize_plain), so content cannot inject control tokens;
//   4. the generation prompt (e.g. "<|im_start|>assistant\n"), if asked for, is a
//      final piece of its own, tokenized alone. It belongs to NO segment: its blocks
//      carry segment_index == k_generation_prompt_index and retention `none`, and a
//      boundary separates it from the last segment when that segment is cached, so
//      the same segments with and without a generation prompt share every cached
//      segment's KV;
//   5. blocks: the canonical chunks the engine prefills (warmctx/chunking.h, plan_chunks):
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
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "warmctx/types.h"
#include "warmctx/conversation.h"
#include "warmctx/hash.h"
#include "warmctx/kind_table.h"
#include "warmctx/profile.h"
#include "warmctx/segments.h"
#include "warmctx/status.h"

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

// ---- manifest ------------------------------------------------------------------

struct manifest_entry {
    std::string id;
    segment_kind kind = segment_kind::user;
    std::string path;
    std::string role;                   // the role the message was rendered with
    int order = 0;                      // the kind's order when assembled
    stability stab = stability::volatile_;
    retention_class cls = retention_class::none;
    pos_t token_begin = 0;              // [token_begin, token_end) in the prompt
    pos_t token_end = 0;
    uint64_t content_bytes = 0;
    hash128 content_hash;               // hash_bytes of the content, unsalted
    hash128 token_hash;                 // hash of the segment's token ids, unsalted

    pos_t n_tokens() const { return token_end - token_begin; }
    bool operator==(const manifest_entry &) const = default;
};

// What was assembled, for explain, the server and snapshot files. Entries are in
// canonical order. Publishes no salt and no root hash.
struct manifest {
    std::vector<manifest_entry> segments;
    pos_t n_tokens = 0;                      // the whole prompt
    pos_t generation_prompt_begin = -1;      // -1: no generation prompt
    pos_t generation_prompt_end = -1;
    pos_t stable_end = 0;                    // see assembled_prompt
    pos_t n_stable_tokens = 0;
    hash128 stable_prefix_hash;
    hash128 profile_fingerprint;

    // {"n_tokens":..., "segments":[{"id":..., "kind":"repo_map", ...}], ...};
    // hashes as 32 hex digits.
    nlohmann::json to_json() const;
    // The inverse of to_json. Strict: a missing field, wrong type, unknown kind,
    // class or stability, or malformed hash is invalid_argument naming it.
    static result<manifest> from_json(const nlohmann::json & j);
    // A fixed-width table, one line per segment plus a header and a summary line.
    std::string to_table() const;

    bool operator==(const manifest &) const = default;
};

// How one segment differs between two manifests.
enum class segment_change_kind {
    appeared,         // only in `after`
    disappeared,      // only in `before`
    content_changed,  // content_hash differs
    tokens_changed,   // same content, different tokens (kind, role, template or tokenizer)
    moved,            // same tokens, different token_begin (something before it changed)
};
std::string_view segment_change_kind_name(segment_change_kind k);

struct segment_change {
    std::string id;
    segment_change_kind what = segment_change_kind::appeared;
    pos_t before_begin = -1;         // token_begin in `before` (-1: not there)
    pos_t after_begin = -1;          // token_begin in `after` (-1: not there)
    std::string to_string() const;   // "segment 'src/a.cc' changed (content)"
};

// The segments that differ, in canonical order (the union of both manifests, ordered
// by (order, id, path)). Unchanged segments are not listed. `moved` is reported only
// for segments that neither changed nor appeared but start elsewhere.
std::vector<segment_change> diff_manifests(const manifest & before, const manifest & after);

// ---- assembly ------------------------------------------------------------------

inline constexpr int k_generation_prompt_index = -1;

struct block {
    hash128 chain;                 // h_i: names the KV of [0, end)
    pos_t begin = 0, end = 0;      // [begin, end)
    retention_class cls = retention_class::none;  // the segment's class
    int segment_index = 0;         // into manifest.segments, or k_generation_prompt_index
    bool operator==(const block &) const = default;
};

struct assembled_prompt {
    std::vector<token_id> tokens;
    // The start of every piece (segment or generation prompt) after the first whose
    // previous piece is cached (retention not `none`), sorted, unique, inside
    // (0, tokens.size()) - the engine's canonical chunking input.
    std::vector<pos_t> boundaries;
    manifest man;
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
reuse_point snap_reuse(const assembled_prompt & ap, size_t n_blocks);

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
                                      const text_model & model, size_t min_rest_bytes, size_t max_lead_bytes);

// Errors: invalid_argument (validate_segments fails, no segments, chunk_tokens == 0
// or differs from prof.chunk_tokens), out_of_range (more than INT32_MAX tokens), and
// whatever the text_model returns, prefixed with the segment's id.
result<assembled_prompt> assemble(std::span<const segment> segs, const kind_table & kinds,
                                  const text_model & model, const profile & prof,
                                  std::string_view tenant_salt, uint32_t chunk_tokens,
                                  bool add_generation_prompt = true);

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

// Parses hash128::hex() back (32 hex digits, either case). Errors: invalid_argument.
result<hash128> parse_hash128(std::string_view hex);

}  // namespace warmctx
