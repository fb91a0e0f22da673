// warmctx/sampling.h - how the engine picks tokens: a request's sampling parameters, the
// sampler they make, and the decisions of one generation token by token (stop strings,
// limits, log-probabilities). Implemented over llama.cpp's samplers (src/engine).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "warmctx/status.h"
#include "warmctx/drafts.h"
#include "warmctx/types.h"

namespace warmctx {

class engine;

struct sampling_params {
    int32_t max_tokens = 32;
    float temperature = 0.0f;     // <= 0: greedy (argmax)
    float top_p = 1.0f;           // 1: off
    int32_t top_k = 0;            // 0: off
    uint32_t seed = 0;
    std::vector<std::string> stop;  // generation ends before the first occurrence
    // OpenAI's penalties, over the tokens generated so far (at most the last
    // k_penalty_window): each logit loses frequency_penalty per earlier occurrence of its
    // token plus presence_penalty once if it occurred at all. 0 = off.
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    // Added to a token's logit before sampling (OpenAI's logit_bias; -100 bans it).
    std::vector<std::pair<token_id, float>> logit_bias;
    // Log-probabilities of each generated token (from the model's logits, before any
    // sampler): -1 = none, 0 = the chosen token's, k = also the k most likely (<= 20).
    int32_t n_logprobs = -1;
    // A GBNF grammar (root rule "root") the output must follow: tokens it does not allow
    // are never sampled, and when it is complete only the end of generation is. "" = none.
    std::string grammar;
    // A lazy grammar binds only from the first trigger on (the model may answer in text
    // or call a tool): a regex over the output, or a literal text (a single token when
    // the vocabulary has it as one).
    bool grammar_lazy = false;
    std::vector<std::string> grammar_trigger_patterns;
    std::vector<std::string> grammar_trigger_words;
    // Text the prompt already ends with that a (not lazy) grammar describes too - a
    // template's generation prompt, which tool-call grammars start with: fed to the
    // grammar before the first token is sampled.
    std::string grammar_prefill;
    // A budget of reasoning tokens (llama-server's reasoning_budget_tokens): -1 none, 0 ends
    // the reasoning at once. Reasoning opens with reasoning_start, in the prompt's last text
    // (reasoning_prompt: a generation prompt that opens it) or in the answer, and closes with
    // any of reasoning_ends; after `reasoning_budget` tokens inside it (and the UTF-8
    // character it is in) the first of reasoning_ends is forced, token by token, through
    // the grammar. A model that never closes its reasoning then still answers, or calls
    // the tool a grammar requires.
    int32_t reasoning_budget = -1;
    std::string reasoning_start;
    std::vector<std::string> reasoning_ends;
    std::string reasoning_prompt;
    // Control tokens whose text the answer keeps (a template's format markers that its
    // parser reads, as gpt-oss's "<|channel|>"); other control tokens have no text.
    std::vector<std::string> preserved_tokens;
    // Tokens a draft from the workspace may hold (warmctx/drafts.h; llama-server's
    // speculative.n_max); 0: decode without drafts. The answer is the same either way.
    int32_t draft_max = 0;
};

// The most tokens the next draft may hold: sp.draft_max, within the sequence's room after
// the token being decoded at `pos` and the tokens still to decode (the last one sampled
// never is, so a draft reaching it would be decoded for nothing), and `batch_room`.
inline size_t draft_room(const sampling_params & sp, int32_t n_generated, int64_t pos, uint32_t n_ctx_seq,
                         size_t batch_room) {
    const int64_t room = std::min<int64_t>({(int64_t)sp.draft_max, (int64_t)n_ctx_seq - pos - 1,
                                            (int64_t)sp.max_tokens - n_generated - 1, (int64_t)batch_room});
    return room > 0 ? (size_t)room : 0;
}

// One generated token's log-probability (natural log, over the whole vocabulary).
struct token_logprob {
    token_id token = -1;
    float logprob = 0;
    std::string piece;  // its text (may be part of a UTF-8 character)
};
struct token_logprobs {
    token_logprob chosen;
    std::vector<token_logprob> top;  // the most likely first (n_logprobs of them)
};
inline constexpr int32_t k_penalty_window = 4096;

enum class finish_reason { length, stop, eos, context_full };
std::string_view finish_reason_name(finish_reason r);

struct generation {
    std::vector<token_id> tokens;
    std::string text;
    finish_reason finish = finish_reason::length;
    double t_decode_ms = 0;
    draft_counters drafts;
};

// The index of the first maximum of `l`, what std::max_element gives (a NaN is never
// one, unless it comes first), in two vectorized passes where the CPU has AVX2: a greedy
// step's pick over a 151,936-token vocabulary on the host, once for every decoded row.
// 0 when `l` is empty.
size_t first_max_index(std::span<const float> l);

// Picks the next token from logits: greedy (first maximum) when temperature <= 0,
// else a seeded chain of top-k, top-p, temperature and a distribution sampler.
// Deterministic for a given seed and logits sequence.
class token_sampler {
  public:
    // Greedy (the first maximum) when temperature <= 0, else top-k, top-p, temperature
    // and a seeded draw; logit_bias then the penalties come first when given.
    // Errors: invalid_argument (top_p outside (0, 1], negative top_k or max_tokens, a
    // logit_bias token outside [0, n_vocab), a bias or penalty that is not finite).
    // A grammar needs the engine's vocabulary (invalid_argument when it does not parse).
    static result<std::unique_ptr<token_sampler>> make(const sampling_params & sp, const engine & e);
    ~token_sampler();
    token_id sample(std::span<const float> logits);
    // Whether sample() is the first maximum and nothing else (greedy, no bias, penalty or
    // grammar): then only that index of a row's logits is needed.
    bool picks_first_max() const;
    // The next token is `t`, chosen without sampling: the grammar and penalties see it.
    void accept(token_id t);

  private:
    struct impl;
    explicit token_sampler(std::unique_ptr<impl> p);
    std::unique_ptr<impl> p_;
};

// The decisions of one generation, token by token: which token comes next and whether
// the generation ends. engine::generate and the scheduler's batched loop both go through
// it, so they stop for the same reasons in the same order:
//   1. max_tokens reached                        -> length
//   2. the sampled token ends generation         -> eos   (not counted, no text)
//   3. the token's text completes a stop string  -> stop  (counted; text cut before it)
//   4. max_tokens reached with this token        -> length
//   5. the sequence has no room for this token   -> context_full
//   otherwise the token is to be decoded at the sequence's next position.
// A reasoning budget spent picks the closing tokens instead of the sampler (rule 2 on).
class generation_step {
  public:
    struct decision {
        token_id token = -1;      // the sampled token (-1 when none was sampled: rule 1)
        std::string delta;        // text now safe to emit (never part of a stop string or
                                  // of a UTF-8 character)
        bool finished = false;
        finish_reason finish = finish_reason::length;  // when finished
        std::optional<token_logprobs> logprobs;        // sp.n_logprobs >= 0 and a token was sampled
        bool forced = false;  // the token closes reasoning over its budget (not sampled)
    };
    // Errors: those of token_sampler::make.
    static result<std::unique_ptr<generation_step>> make(const engine & e, const sampling_params & sp);
    ~generation_step();

    // `logits` follow the sequence's last token; `n_in_seq` tokens are in the sequence.
    decision next(std::span<const float> logits, pos_t n_in_seq);
    // Whether next() reads only the first maximum of the logits (greedy, nothing that
    // reads the distribution: no bias, penalty, grammar or logprobs).
    bool needs_first_max_only() const;
    // As next(), given only the first maximum's index of the logits (engine::decode_step
    // computes it where they are, and copies none). REQUIRES needs_first_max_only().
    decision next_from_first_max(token_id first_max, pos_t n_in_seq);
    // The text held back when the generation ends without a stop string.
    std::string finish();
    int32_t n_generated() const;
    const std::vector<token_id> & tokens() const;
    const std::string & text() const;   // the whole text so far, cut before a stop string
    int32_t n_forced() const;           // tokens forced to end reasoning over its budget

  private:
    struct impl;
    explicit generation_step(std::unique_ptr<impl> p);
    decision decide(std::span<const float> logits, token_id first_max, pos_t n_in_seq);
    std::unique_ptr<impl> p_;
};

}  // namespace warmctx
