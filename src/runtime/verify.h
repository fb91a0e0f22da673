// runtime/verify.h - the correctness gate: seeded random workspace scenarios, every turn
// run warm (through the cache: engine, host RAM, disk) and cold, and compared.
//
// A scenario is one workspace through a fixed series of steps: a cold turn, a new
// question, restores from host RAM and from disk, history and a diff, a volatile edit, a
// stable edit, and (every other scenario) a profile drift (another chunk size). Each warm
// turn is checked twice:
//   - against its cold reference: in exact mode tokens and logits must be equal bit for
//     bit (a mismatch); in shared mode the difference is measured;
//   - against what the step expects of the cache (an expectation failure): a hit of at
//     least the stable prefix after an unchanged one; after a stable edit, reuse up to
//     the last block before the first changed token and not beyond, explained as a change
//     of that segment; a restore from the named tier; explain naming the drifted profile
//     field; and never more reuse than was ever cached for that prompt under the current
//     profile (cache_model below).
// Scenarios share one context engine, so the cache carries prefixes from one scenario to
// the next (the system prompt is the same in all of them): the oracle models that
// instead of assuming every scenario's prompts are new to the cache.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "warmctx/assembler.h"
#include "warmctx/context_engine.h"
#include "warmctx/status.h"

namespace warmctx {

struct verify_options {
    // The engine, cache and tiers to verify. Its n_ctx is raised to fit the largest
    // scenario; with `tiers`, a host-RAM tier of 1 GiB and a private disk directory are
    // added where the options name none.
    context_engine_options engine;
    int scenarios = 20;
    uint64_t seed = 1;
    size_t stable_tokens_max = 700;  // largest stable prefix of a scenario, tokens (>= 200)
    int32_t max_tokens = 8;          // greedy tokens per turn
    int32_t draft_max = -1;          // warm turns draft from the workspace (warmctx/drafts.h; 0: none;
                                     // -1: default_draft_max, as serve)
    bool tiers = true;               // also replay restores from host RAM and disk
    double max_seconds = 0;          // start no scenario after this long (0: no limit); the report says how many ran
};

// A warm turn whose tokens or logits differ from its cold reference.
struct verify_mismatch {
    int scenario = 0;
    std::string step;
    bool tokens_equal = false;
    bool logits_equal = false;
    float max_logit_diff = 0;
    size_t n_tokens_agree = 0, n_tokens = 0;  // generated tokens equal / of the cold run
    std::string to_string() const;
};

// An expectation of the oracle that a warm turn broke.
struct verify_failure {
    int scenario = 0;
    std::string step;
    std::string message;
    pos_t n_reused = 0;
    std::string reason;  // the turn's explain
    // "scenario-3 stable edit of 'tools': expected a miss at token 93 (reused 120, <reason>)"
    std::string to_string() const;
};

struct verify_report {
    std::string mode;                 // exact | shared
    std::string model;
    uint64_t seed = 0;
    std::string policy;
    uint64_t budget_tokens = 0;
    int scenarios = 0;                // scenarios run
    int scenarios_asked = 0;          // ... of those asked for: fewer where max_seconds ran out
    int turns = 0;                    // warm turns, each compared with a cold run
    int mismatched_scenarios = 0;     // scenarios with at least one mismatching turn
    std::vector<verify_mismatch> mismatches;  // every mismatching turn
    float max_logit_diff = 0;         // over every compared logit
    uint64_t n_tokens_agree = 0, n_tokens_compared = 0;
    std::vector<verify_failure> failures;
    uint64_t tokens_reused = 0, tokens_prefilled = 0;
    std::map<std::string, int> results;         // warm turns by explain result (miss kind)
    std::map<std::string, int> reuses_by_tier;  // warm turns that reused tokens, by tier (engine, host, disk)
    int drift_turns = 0;              // turns under a drifted profile
    int drift_turns_reused = 0;       // ... that legitimately reused a prefix cached under that profile
    std::map<std::string, uint64_t> evictions_by_class;
    uint64_t whole_holder_evictions = 0;
    // How prefixes moved between the streams (the device tier's path: a step runs in a
    // second stream, and an edit's trimmed blocks are parked in a free one), and through
    // the RAM pool.
    std::string backend;              // CPU | CUDA
    std::string memory;               // the model's memory kind (memory_kind_name); "unsupported": no reuse is expected
    bool stream_copies = false;
    uint64_t n_stream_copies = 0, n_branches_parked = 0, n_pool_loads = 0, n_write_backs = 0;
    uint64_t n_padded_decodes = 0;    // decodes padded to 64 rows (engine::pad_rows), warm and cold
    int n_fused_turns = 0;            // warm turns whose generation prompt shared the last piece
    int n_fused_conversations = 0;    // warm turns whose chat messages were one run (a sliding window)
    uint64_t n_drafted = 0, n_draft_accepted = 0;  // draft tokens the warm turns decoded, and sampling chose
    float max_drafted_logit_diff = 0; // drafted turns' generation logits against cold (rows decoded
                                      // together sum in another order: warmctx/drafts.h)
    double elapsed_ms = 0;

    double token_agreement() const;   // 1 when nothing was compared
    // No expectation failure, and in exact mode no mismatch.
    bool passed() const;
    // The keys `warmctx verify --json` prints.
    nlohmann::json to_json() const;
};

// What the cache may legitimately hold: every block ever offered to it, by chain hash. A
// chain hash names the tokens, chunking, profile and tenant of [0, end), so a prefix
// cached under one profile never counts for another. Eviction only removes, so this is
// an upper bound of what the engine and the tiers can serve.
class cache_model {
  public:
    // A turn computed `blocks`: all of them, those of class none included, which the
    // prefix cache does not insert but the turn's work stream holds until it is given to
    // another prompt (the next turn of the workspace reuses them in place where their
    // chain hashes match: a fused conversation, then an agent that appends again). Also
    // for what a tier held before the run (a cache directory from an earlier one).
    void note_cached(std::span<const block> blocks);
    // The most the cache may reuse of a prompt of `n_tokens` tokens with these blocks:
    // the end of the last block that was ever cached, before the prompt's last token
    // (which is always computed).
    pos_t max_reuse(std::span<const block> blocks, pos_t n_tokens) const;
    size_t size() const { return cached_.size(); }

  private:
    std::unordered_set<hash128, hash128_hasher> cached_;
};

// What one step expects of its warm turn.
struct turn_expectation {
    pos_t min_reuse = -1;        // at least this many tokens reused (-1: no bound)
    pos_t max_reuse = -1;        // the step's own bound, e.g. the edited segment's start (-1: none)
    pos_t max_cached = -1;       // the cache model's bound (-1: not checked)
    std::string tier;            // the reuse must come from this tier ("": any)
    int in_place = -1;           // 1: the work stream still held the prefix; 0: it was
                                 // loaded or restored into it; -1: either
    // After an edit: reuse must stop in this segment, and explain must say it changed.
    std::string changed_segment;
    // After a profile drift: whenever reuse stops short of the cacheable end, explain
    // must call it profile drift and name this field ("": no drift).
    std::string drifted_field;
    // The same request as the turn before: its answer must be drafted from that one's
    // (each token drafted and chosen but the first, sampled after the prompt, and the
    // last, which is never decoded).
    bool drafted = false;
    // The same request sent again: shuffled with a generator of its own, drafted or not, so
    // the scenario's generator (and every later scenario) is the same with drafts or without.
    bool sent_again = false;
};

// The expectations `ex` breaks, one message each (empty: all held).
std::vector<std::string> check_turn(const turn_expectation & want, const explain_report & ex);

using verify_progress = std::function<void(const std::string &)>;

// Runs the scenarios. `progress` gets one line per scenario. Errors: invalid_argument
// (scenarios < 1, stable_tokens_max < 200), those of context_engine::open, and a turn
// that fails to run (with the scenario and step as context). Mismatches and expectation
// failures are not errors: they are in the report.
result<verify_report> run_verify(const verify_options & opts, const verify_progress & progress = {});

}  // namespace warmctx
