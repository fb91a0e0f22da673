// warmctx/volatility.h - a workspace's learned order of its stable segments, and which of
// them are cut into finer blocks.
//
// An edit of a stable segment re-prefills everything after its first changed block. Two
// things make that cheap, both decided here per workspace from how often each stable
// segment changed over its recent turns:
//
//   - order: inside a run of stable segments of one retention class (in the kind table's
//     order: system, tools, rules; then the repo map and the pinned files), the segments
//     that change often go last, so an edit of one re-prefills little after it. The kind
//     table still decides the classes and everything outside such a run; input order
//     still never changes the prompt (the order depends on the workspace's history only);
//   - finer blocks: a stable segment that has changed at least once (ever) is cut
//     at line starts into parts of about k_line_block_bytes (line_block_cuts), each a piece
//     of its own, so an edit keeps the blocks of the file's unchanged head. A segment that
//     never changes keeps whole chunks (a cold prefill in smaller chunks costs more).
//
// A reorder is itself a miss: every block from the first segment that moves on is new.
// So the order changes only when the expected saving over the next `horizon_turns` turns
// exceeds what the reorder costs this turn beyond what this turn's own edits cost anyway
// (hysteresis), and a segment is ranked by its rate only once it changed `min_changes`
// times in the window (one edit is an event; two are a habit). Costs are in content
// bytes (known before tokenizing); decide_order says why it changed the order, or why
// not, in `note`.
//
// Pure functions over plain values; the runtime keeps a volatility_state per workspace
// (and, with a disk tier, a file of it: volatility_to_json).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/hash.h"
#include "warmctx/kind_table.h"
#include "warmctx/manifest.h"
#include "warmctx/segments.h"
#include "warmctx/status.h"

namespace warmctx {

// A stable segment's finer blocks: a cut at the first line start (is_line_cut, or
// is_any_line_cut where the tokenizer allows it) at or after this many bytes since the
// previous cut. About 100-150 tokens of code or a repo
// map; the measurement behind it is in docs/benchmarks.md ("chunk size").
inline constexpr size_t k_line_block_bytes = 512;
inline constexpr size_t k_line_block_max_cuts = 1024;

// Where a stable segment's text is cut into finer blocks. Each cut depends on the text
// before it only, so an edit keeps every cut before it. Every cut is an is_line_cut
// point, or with `any_line` an is_any_line_cut point (the parts tokenize to the whole
// text's tokens where the model allows it: text_model::plain_splits_at_lines,
// plain_splits_at_any_line). Ascending, in (0, size).
std::vector<size_t> line_block_cuts(std::string_view t, size_t block_bytes = k_line_block_bytes,
                                    bool any_line = false);

struct volatility_options {
    bool enabled = true;          // false: the kind table's order and whole chunks, always
    uint32_t window_turns = 32;   // the recent turns a rate is measured over (<= 64)
    uint32_t min_changes = 2;     // changes in the window before a segment is ranked by its rate
    uint32_t horizon_turns = 8;   // turns over which a reorder must pay for itself
    // A reorder must also save at least this fraction of the stable bytes per turn, so
    // that two segments of nearly the same rate do not swap back and forth.
    double min_saving_fraction = 0.02;
};

// One stable segment's recent history.
struct segment_volatility {
    hash128 content_hash;         // at its last observed turn
    uint64_t content_bytes = 0;
    uint64_t changed_bits = 0;    // bit i: changed at the i-th most recent observed turn
    uint32_t n_observed = 0;      // turns it was seen in after its first (at most 64 counted)
    bool fine = false;            // cut into finer blocks since it first changed (kept even when
                                  // the change leaves the window: going back would be a miss)
    // Where its finer blocks begin, in content bytes (assembly_hints::fine_from): the
    // start of the first k_edit_digest_bytes block its first change touched, moved back by
    // an earlier change. Before it the segment keeps the whole chunks it had.
    uint64_t fine_from = 0;
    std::vector<uint64_t> digest;  // content_digest of its content at its last observed turn
    uint32_t n_changes(uint32_t window) const;
    double rate(uint32_t window) const;  // changes / observed turns in the window (0 when none)
};

// Whether turns carry one segment of the turn before forward: its content hash and index
// in the manifest at the last observed turn, and per observed turn since (bit 0 the
// latest, at most 64) whether the turn held that segment at the same index again.
struct carry_watch {
    hash128 hash;
    uint32_t index = 0;
    bool has = false;
    uint64_t carried_bits = 0;
    uint32_t observed = 0;
    // Whether this request holds the watched segment at its index.
    bool carried_by(std::span<const segment * const> order) const;
    // The turn's segment at `index` (none: nothing watched from now on).
    void observe(const manifest & prompt_manifest, std::optional<size_t> index);
    // The last k_fuse_after_turns - 1 observed turns did not carry it forward.
    bool habit() const;
    bool operator==(const carry_watch &) const = default;
};

// What a workspace remembers.
struct volatility_state {
    std::vector<std::string> order;  // the stable segments' ids as last assembled ("": the kind order)
    std::map<std::string, segment_volatility> segs;
    uint64_t n_turns = 0;
    // The last segment of the last turn (its question, or a tool result the model
    // answers). An agent that appends carries its question forward (and a retry repeats
    // it); one that slides a window of the last N messages, or asks a new question over
    // the same context each time, does not.
    carry_watch tail;
    // The first chat message of the last turn (the oldest history message it sent, or its
    // question). An agent that appends or compacts carries it forward; one that slides a
    // window of the last N messages drops it, and its whole conversation moves.
    carry_watch head;
};

// A workspace's state as JSON text (format "warmctx-volatility-v1"), and back: the runtime
// keeps it beside the disk tier so that a restart keeps the learned order and finer
// blocks. Errors of the reader: invalid_argument (not this format, or a field out of range).
std::string volatility_to_json(const volatility_state & st);
result<volatility_state> volatility_from_json(std::string_view text);

// What the assembler takes from it (assemble's `hints`).
struct assembly_hints {
    std::vector<std::string> order;  // stable segment ids, in the learned order
    std::vector<std::string> fine;   // stable segment ids cut into finer blocks
    // Per fine segment, where its finer blocks begin (absent: its start): located in content
    // bytes, applied to the segment's message text, so a header kind's cuts begin that
    // header's length earlier - the same for every turn, warm or cold.
    // A segment first cut finer at an edit keeps the whole chunks before the edit's block,
    // which the turns before computed alike, instead of losing its unchanged head.
    std::map<std::string, uint64_t> fine_from;
    // The last segment's piece and the generation prompt are one piece: the turn's tail
    // is one decode call instead of two. Its KV is then not kept for a next turn (the
    // generation prompt would begin the next assistant message's run), so only where
    // the workspace's turns have not been carrying their last segment forward
    // (k_fuse_after_turns observed turns in a row).
    bool fuse_generation_prompt = false;
    // The chat messages are one chunk run, from the first to the last, of class none:
    // where the workspace's turns have not been carrying their first chat message forward
    // at its place (a sliding window: every turn moves the whole conversation, so none of
    // it is ever reused and its message boundaries only cost decode calls).
    bool fuse_conversation = false;
    bool empty() const {
        return order.empty() && fine.empty() && fine_from.empty() && !fuse_generation_prompt && !fuse_conversation;
    }
    bool operator==(const assembly_hints &) const = default;
};

// Turns in a row, this request included, that did not carry the previous turn's last
// segment forward before the generation prompt is fused into the last piece.
inline constexpr uint32_t k_fuse_after_turns = 2;

// The granularity at which a segment's edits are located: its content's hash per block of
// this many bytes (content_digest).
// Small against a chunk's ~2 KB of text, so that the whole chunk before an edit's block
// usually stays whole.
inline constexpr size_t k_edit_digest_bytes = 256;
std::vector<uint64_t> content_digest(std::string_view content);

struct order_decision {
    assembly_hints hints;
    // Each reorderable stable segment's content_digest, for observe_turn.
    std::map<std::string, std::vector<uint64_t>> digests;
    bool reordered = false;  // hints.order differs from the state's order
    std::string note;        // why it changed (or why a better order was not taken); "" when nothing to say
};

// The hints for this request's segments. Pure.
order_decision decide_order(const volatility_state & st, std::span<const segment> segs, const kind_table & kinds,
                            const volatility_options & o);

// Records an assembled turn: each stable segment changed or not (by content hash), the
// order it was assembled in, and whether it carried the last turn's last segment
// forward. Segments absent from it are forgotten. Returns whether what a restart would
// need to assemble the next turn alike changed: the order, a segment's finer blocks, or
// a habit a fusion follows (worth writing to disk at once).
// `first_chat` is the index in `prompt_manifest` of the turn's first chat message
// (assembled_prompt::first_chat_message): what the head watch follows.
// `hints` and `digests` are the turn's (order_decision): where its fine segments' finer
// blocks began, and their contents' digests (none: an edit is located at the start).
bool observe_turn(volatility_state & st, const manifest & prompt_manifest, std::optional<size_t> first_chat,
                  const assembly_hints & hints = {},
                  const std::map<std::string, std::vector<uint64_t>> & digests = {});

// Whether a segment takes part in the learned order and finer blocks: a stable one, except
// the tools (a template writes them in its own place, wherever the segment sits).
bool is_reorderable(const segment & s, const kind_table & kinds);

// The content hash a manifest entry carries (hash of the content, and of a message's
// tool calls when it has any).
hash128 segment_content_hash(const segment & s);

}  // namespace warmctx
