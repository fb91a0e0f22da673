// warmctx/context_engine.h - one request's whole flow, from segments to cache update.
//
//   segments ─▶ assemble (canonical order, per-segment tokens, manifest, block chain)
//            ─▶ prefix cache lookup (longest cached prefix, snapped to a block end)
//            ─▶ in place (the work stream still holds it from its last turn): trim at
//               the reuse point; else load the prefix from the RAM pool into the work
//               stream at positions 0..P-1 (a cold run's cell layout), trim
//            ─▶ prefill the rest in canonical chunks ─▶ decode
//            ─▶ insert the prompt's cacheable blocks into the pool (evicting under
//               budgets); the work stream keeps them for the next turn
//
// Every turn carries an explain_report: per segment the tokens reused and prefilled,
// and for a miss the reason (segment changed, profile drift, eviction, snapping, cold).
// explain() produces the same report for a hypothetical request without running it.
//
// KV streams (engine sequences of n_ctx cells each): 0 .. n_work_seqs-1 are work
// sequences (one per turn in flight), then, with options.cold_stream, the cold-reference
// sequence of run_cold (serve allocates none).
// Cached prefixes are not streams: the prefix cache's holders are compact saved states
// in RAM (the pool), each the size of its own tokens, bounded by the byte budget.
//
// Thread safety: none. One thread (the engine thread) owns a context_engine.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "warmctx/assembler.h"
#include "warmctx/chat_template.h"
#include "warmctx/context_counters.h"
#include "warmctx/context_options.h"
#include "warmctx/engine.h"
#include "warmctx/explain_report.h"
#include "warmctx/prefix_cache.h"
#include "warmctx/profile.h"
#include "warmctx/status.h"

namespace warmctx {

class context_engine;
class snapshot_store;

// What a turn is for. An answer prefills its prompt and generates; a pre-warm prefills
// only the prompt's cacheable blocks (up to its first block of class none), generates
// nothing, and finish_turn caches them - counted apart from turns
// (context_counters::prewarm), and the workspace's next turn says it was served from it.
// A leading pre-warm is one a request started for its own leading segments, to prefill
// them while the rest of its prompt tokenizes (scheduler::prefill_ahead).
enum class turn_kind { answer, prewarm, leading_prewarm };

inline bool is_prewarm(turn_kind k) { return k != turn_kind::answer; }

struct turn_request {
    std::string workspace = "default";
    turn_kind kind = turn_kind::answer;
    std::vector<segment> segments;
    sampling_params sampling;
    bool add_generation_prompt = true;
    bool keep_logits = false;         // fill turn_result::prompt_logits / gen_logits
    bool cache = true;                // cache the prompt's cacheable blocks afterwards
    // A raw completion: segments[0]'s content is the prompt as given, no chat template
    // (assemble_raw); `suffix` makes it fill-in-the-middle.
    bool raw = false;
    std::optional<std::string> suffix;
    // The start of the answer, given (a chat whose last message is the assistant's): the
    // model continues it (assemble's `continuation`); the answer is what it adds.
    std::string continuation;
    // Isolation of the prefix cache (as vLLM's cache_salt): folded into the root of every
    // chain hash with the tenant salt, so this request's blocks match only blocks of
    // requests with the same salt ("" = shared, the default).
    std::string cache_salt;
    // The learned order and finer blocks to assemble with (a cold reference run of a warm
    // turn takes the warm turn's: assembled_prompt::hints); nullopt: the workspace's own,
    // decided from its history (warmctx/volatility.h).
    std::optional<assembly_hints> hints;
    // The prompt assembled already, off the engine thread (assemble_request); used when
    // it was assembled under the engine's current profile, else assembled again.
    std::shared_ptr<const assembled_prompt> assembled;
};

struct turn_result {
    generation gen;
    explain_report explain;
    manifest prompt_manifest;
    std::string stable_prefix_hash;
    double t_total_ms = 0;            // assemble .. generation done (cache update excluded)
    double t_assemble_ms = 0;
    double t_copy_ms = 0;             // holder -> work sequence
    double t_restore_ms = 0;          // the disk tier -> work sequence (read, check, load)
    double t_prefill_ms = 0;
    double t_checkpoint_ms = 0;       // checkpoints taken during the prefill (outside t_prefill_ms)
    double t_first_token_ms = 0;      // assemble .. first token chosen
    double t_decode_ms = 0;
    double t_cache_update_ms = 0;     // insert after the turn
    std::vector<float> prompt_logits; // keep_logits: logits after the prompt
    std::vector<float> gen_logits;    // keep_logits: logits of every generation step
};

// A turn between begin_turn and finish_turn: its work sequence holds the prompt's KV.
// Move-only. Destroying a turn that was neither finished nor aborted aborts it (clears
// its work sequence), so no error path can leak a sequence's KV.
// REQUIRES: destroyed before the context_engine that began it.
class pending_turn {
  public:
    std::string workspace;
    seq_id seq = -1;
    assembled_prompt prompt;
    explain_report explain;
    uint64_t tick = 0;      // its tick of the engine's turn clock (LRU order)
    bool cache = true;
    double t_assemble_ms = 0, t_copy_ms = 0, t_restore_ms = 0, t_prefill_ms = 0;
    // Taking checkpoints at block ends during the prefill (a model with them: the state
    // out of the device into host memory), apart from t_prefill_ms.
    double t_checkpoint_ms = 0;
    // Before the lookup: blocks of other streams or of this one that the turn would
    // overwrite saved to the pool (or parked in a free stream); the lookup itself and
    // the turn's explain.
    double t_write_back_ms = 0, t_lookup_ms = 0;
    pos_t prefill_pos = 0;  // the next prompt position to prefill
    pos_t prefill_end = 0;  // prefilled when prefill_pos reaches it: the prompt's end, or
                            // a pre-warm's cacheable end
    pos_t reused = 0;       // prompt positions that came from a cache
    turn_kind kind = turn_kind::answer;
    int64_t t_begin_unix_ms = 0;

    bool prefilled() const { return prefill_pos >= prefill_end; }
    pos_t prefill_remaining() const { return prefilled() ? 0 : prefill_end - prefill_pos; }

    pending_turn() = default;
    pending_turn(const pending_turn &) = delete;
    pending_turn & operator=(const pending_turn &) = delete;
    pending_turn(pending_turn && o) noexcept;
    pending_turn & operator=(pending_turn && o) noexcept;
    ~pending_turn();

  private:
    friend class context_engine;
    context_engine * owner_ = nullptr;
};

class context_engine {
  public:
    static result<std::unique_ptr<context_engine>> open(const context_engine_options & opts);
    ~context_engine();

    // One turn through the warm path. Errors: those of assemble, prefill and generate;
    // the workspace's state is unchanged on error.
    // In work stream `seq` (0 unless a caller, such as verify, wants another stream).
    result<turn_result> run_turn(const turn_request & req, seq_id seq = 0);
    // The two halves of run_turn, for a caller that decodes itself (the scheduler's
    // batched steps). begin_turn assembles, reuses the longest cached prefix in work
    // sequence `seq` and prefills the rest; `logits` receives the logits after the
    // prompt. finish_turn caches the prompt, updates the workspace's state and counters
    // (n_generated tokens), and clears the sequence. abort_turn only clears it.
    // REQUIRES 0 <= seq < n_work_seqs, and no other pending turn on `seq`.
    result<pending_turn> begin_turn(const turn_request & req, seq_id seq, std::vector<float> & logits);
    // As begin_turn, but prefills nothing: the caller then runs prefill_some until the
    // turn is prefilled, and may run other sequences' work between the calls (each
    // canonical chunk is its own decode call either way, so the KV equals a cold run's).
    result<pending_turn> begin_turn_deferred(const turn_request & req, seq_id seq);
    // Prefills whole canonical chunks of `t` from t.prefill_pos, at least one and then
    // more while fewer than `max_tokens` have been prefilled by this call; when the
    // prompt is done, `logits` receives the logits after it. On error the turn stays
    // pending (abort it).
    status prefill_some(pending_turn & t, pos_t max_tokens, std::vector<float> & logits);
    // Caches the turn's cacheable blocks and records it. A pre-warm may be finished
    // before it is prefilled (preempted): it caches the blocks prefilled so far.
    // Its disk write-through (the copy of the prefix out of its stream) is deferred: it
    // is made by write_through_idle once the engine has been idle for a while
    // (context_engine_options::write_through_delay_ms), or by flush_deferred_writes, or first thing by whatever
    // would change that stream below the prefix (a turn that does not keep it in place,
    // a clear, a trim) or needs the tiers complete (snapshots, pins, stop). It always
    // sees the prefix as the turn left it.
    status finish_turn(pending_turn & t, size_t n_generated);
    void flush_deferred_writes();
    // For an idle engine thread: once no turn has finished for
    // context_engine_options::write_through_delay_ms, makes one deferred disk
    // write-through and returns true; else `retry_in` says when to ask again. Also hands
    // the learned orders that changed to their writer.
    bool write_through_idle(std::chrono::milliseconds * retry_in = nullptr);
    // For a busy engine thread, between decode steps: makes the oldest deferred disk
    // write-through once it has waited context_engine_options::write_through_max_delay_ms
    // (`quiet`: no request waits, none prefills) or twice that (else), and returns true
    // (one per call).
    bool write_through_overdue(bool quiet = true);
    // For an idle engine thread: when no work stream is free, saves the durable blocks of
    // the one a new workspace's turn would take next (the least recently used idle one)
    // into the pool, unless the pool or another stream holds them, so that the
    // displacement then costs that turn nothing. One stream per call; true when it
    // saved one. The stream the last turn finished on is left alone for
    // k_write_ahead_delay after that turn (its workspace's next turn usually comes
    // first, in place); `retry_in` then says when to ask again.
    static constexpr std::chrono::milliseconds k_write_ahead_delay{500};
    bool write_back_ahead(std::chrono::milliseconds * retry_in = nullptr);
    void abort_turn(pending_turn & t);
    uint32_t n_work_seqs() const;
    // Which of `free_seqs` a turn of `workspace` should run in: the one its last turn
    // left (so the turn reuses it in place), else an empty one, else the one left
    // longest ago. -1 when none of them is a free work sequence.
    seq_id pick_work_seq(std::string_view workspace, std::span<const seq_id> free_seqs) const;
    // Of `idle`, the work stream holding the prefix `workspace`'s last turn left there, or -1.
    seq_id stream_of_workspace(std::string_view workspace, std::span<const seq_id> idle) const;
    // For a caller that decodes itself: the sampling and stop decisions of one generation
    // (the same generation_step engine::generate uses), and one batched decode step over
    // work sequences that hold pending turns. Errors: those of generation_step::make and
    // engine::decode_step; invalid_argument for a sequence that is not a work sequence.
    result<std::unique_ptr<generation_step>> start_generation(const sampling_params & sp) const;
    // Drafts for a turn's generation (warmctx/drafts.h): its workspace's last answers and
    // its prompt; null where sp asks none or the model's memory cannot drop a draft
    // sampling did not choose (plain KV and a sliding window can, a recurrent state cannot:
    // drops_a_draft).
    std::unique_ptr<draft_index> drafts_for(const pending_turn & t, const sampling_params & sp) const;
    // A turn's answer, kept for drafts of its workspace's later turns (a request sent again).
    void remember_answer(const pending_turn & t, std::span<const token_id> answer);
    // Cuts a work sequence back to its first `n_tokens` (the positions of a draft sampling
    // did not choose). Errors: invalid_argument (not a work sequence), those of trimming.
    status drop_draft(seq_id seq, pos_t n_tokens);
    status decode_step(std::span<const step_input> inputs, std::vector<std::vector<float>> & logits,
                       std::vector<token_id> * first_max = nullptr);

    // The same prompt computed cold in a fresh sequence, the cache untouched: the
    // reference every warm answer must equal. Errors: failed_precondition without
    // options.cold_stream.
    result<turn_result> run_cold(const turn_request & req);
    // What run_turn would do, without running anything: no counter of the cache or of a
    // tier moves, no LRU is touched, nothing is loaded. Uses req.assembled as begin_turn
    // does (assemble off the engine thread first).
    result<explain_report> explain(const turn_request & req) const;
    // Assembles without running (manifest, tokens, hashes). Reads only what serving
    // never changes (the tokenizer, the template, the profile; the tokenizer's memo has
    // its own lock), so an HTTP thread may call it while the engine thread works - only
    // set_chunk_tokens must not run meanwhile.
    result<assembled_prompt> assemble_request(const turn_request & req) const;
    // ok when the prompt fits a work sequence; else out_of_range naming the limit and
    // the flag (what begin_turn answers). Thread safety: as assemble_request.
    status check_fits(const assembled_prompt & prompt) const;
    // Before assembling: out_of_range when the request's text plainly needs more tokens
    // than a work sequence holds (its bytes over the longest token's), so that megabytes
    // are refused without being tokenized. Thread safety: as assemble_request.
    status check_plausible(const turn_request & req) const;
    // The request's leading segments to prefill while the rest still tokenizes
    // (warmctx::leading_segments over its segments; empty for a raw prompt). Thread
    // safety: as assemble_request.
    std::vector<segment> leading_segments(const turn_request & req, size_t min_rest_bytes,
                                          size_t max_lead_bytes) const;

    // Pins (or unpins) the stable blocks of the workspace's last turn.
    status pin_workspace(const std::string & workspace, bool pinned);
    // Forgets the workspace: its holders, its last turn and its counters.
    void drop_workspace(const std::string & workspace);
    // How many workspaces the engine remembers (<= max_workspaces).
    size_t n_remembered_workspaces() const;

    // Suspend: make sure the workspace's cached path is on disk (writing it now if
    // needed), then drop it from the engine's KV. Resume: load the workspace's last
    // path back from disk into the engine. Branch: a new workspace that
    // starts from `from`'s last turn and shares its cached prefix (no copy: the cache
    // matches by content). Snapshot: write the workspace's cached path to disk now.
    // Errors: not_found (unknown workspace / nothing on disk), failed_precondition
    // (no disk tier).
    status suspend_workspace(const std::string & workspace);
    status resume_workspace(const std::string & workspace);
    status branch_workspace(const std::string & from, const std::string & to);
    status snapshot_workspace(const std::string & workspace);
    // Drops every prefix of the engine's KV, streams and RAM pool (not the disk tier):
    // what a restart does.
    void drop_engine_cache();
    // Empties the idle work streams after writing their blocks back to the pool: the
    // next turn reuses from the pool, not in place.
    void drop_work_streams();
    // The disk tier (null when off), for listing and tests; waits for the disk tier's
    // queued writes first.
    snapshot_store * disk_tier();

    // Changes the canonical chunk size (a profile field): every cached prefix stops
    // matching and explain names the drift. REQUIRES 1 <= n <= the engine's chunk.
    status set_chunk_tokens(uint32_t n);

    const profile & current_profile() const;
    const model_info & model() const;
    // The model's Jinja chat template (tool-call grammars, output parsing); nullptr when
    // prompts are rendered with the built-in per-message templates.
    const chat_templates * chat_template() const;
    const context_info & context() const;
    // Text -> tokens through the model's tokenizer (`parse_special`: "<|im_start|>" becomes
    // its one control token), e.g. to size a synthetic workload; and back (`special`: a
    // control token written as its text, as the prompt reads). Safe on any thread (they
    // read only the vocabulary). Errors: invalid_argument (a token outside the vocabulary).
    result<std::vector<token_id>> tokenize(std::string_view text, bool parse_special = true) const;
    result<std::string> detokenize(std::span<const token_id> tokens, bool special = false) const;
    context_counters counters() const;
    const prefix_cache & cache() const;

  private:
    struct impl;
    explicit context_engine(std::unique_ptr<impl> p);
    std::unique_ptr<impl> p_;
};

}  // namespace warmctx
