// Sampling: the sampler chain of a request's parameters (penalties, logit bias, grammar,
// top-k/top-p/temperature, or greedy), one generation step at a time (stop strings,
// limits, log-probabilities), and a whole generation on one sequence.
#include "warmctx/sampling.h"

#include "engine_impl.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "util/text_stream.h"

namespace warmctx {

std::string_view finish_reason_name(finish_reason r) {
    switch (r) {
        case finish_reason::length: return "length";
        case finish_reason::stop: return "stop";
        case finish_reason::eos: return "eos";
        case finish_reason::context_full: return "context_full";
    }
    return "length";
}

struct token_sampler::impl {
    detail::sampler_ptr chain;  // null: greedy
    // Greedy under a grammar: `chain` holds the logit bias and penalties (or is null), and
    // the grammar is apart. The first maximum is checked against the grammar alone; only
    // when the grammar refuses it are all candidates checked. Greedy's pick is the same
    // (the first maximum of what the grammar allows), without checking every token of
    // the vocabulary against every grammar stack per token: 256 alternatives cost ~80 ms
    // a token on 2 cores, on the engine thread.
    // Sampled under a grammar (temperature > 0): `chain` samples without the grammar, and
    // the grammar checks that one token; only when it refuses it is the grammar applied to
    // every candidate and the chain sampled again (llama.cpp's common sampler does the
    // same). The distribution is the grammar-first one: p(t) for an allowed t, plus the
    // refused mass times p(t)/Z on the resample, is p(t)/Z (before top-k/top-p, which then
    // cut the unconstrained candidates first, as llama-server's do).
    bool sampled = false;
    detail::sampler_ptr grammar;
};

token_sampler::token_sampler(std::unique_ptr<impl> p) : p_(std::move(p)) {}
token_sampler::~token_sampler() = default;

namespace {
// A literal as a regex (std::regex ECMAScript syntax): every metacharacter escaped.
std::string regex_escape(const std::string & s) {
    std::string out;
    for (char c : s) {
        if (std::string_view(".^$|()[]{}*+?\\/-").find(c) != std::string_view::npos) out += '\\';
        out += c;
    }
    return out;
}
}  // namespace

result<std::unique_ptr<token_sampler>> token_sampler::make(const sampling_params & sp, const engine & e) {
    const int32_t n_vocab = e.model().n_vocab;
    if (sp.max_tokens < 0) return invalid_argument("max_tokens must not be negative");
    if (sp.temperature > 0 && (sp.top_p <= 0 || sp.top_p > 1)) return invalid_argument("top_p must be in (0, 1]");
    if (sp.top_k < 0) return invalid_argument("top_k must not be negative");
    if (!std::isfinite(sp.presence_penalty) || !std::isfinite(sp.frequency_penalty))
        return invalid_argument("penalties must be finite");
    std::vector<llama_logit_bias> bias;
    for (const auto & [tok, b] : sp.logit_bias) {
        if (tok < 0 || tok >= n_vocab)
            return invalid_argument("logit_bias: token " + std::to_string(tok) + " is outside the vocabulary (0.." +
                                    std::to_string(n_vocab - 1) + ")");
        if (!std::isfinite(b)) return invalid_argument("logit_bias: a bias must be finite");
        bias.push_back({tok, b});
    }
    const bool penalties = sp.presence_penalty != 0 || sp.frequency_penalty != 0;
    auto p = std::make_unique<impl>();
    if (sp.temperature > 0 || penalties || !bias.empty() || !sp.grammar.empty()) {
        p->chain.reset(llama_sampler_chain_init(llama_sampler_chain_default_params()));
        if (!bias.empty())
            llama_sampler_chain_add(p->chain.get(),
                                    llama_sampler_init_logit_bias(n_vocab, (int32_t)bias.size(), bias.data()));
        if (penalties)
            llama_sampler_chain_add(p->chain.get(),
                                    llama_sampler_init_penalties(n_vocab, k_penalty_window, 1.0f, sp.frequency_penalty,
                                                                 sp.presence_penalty));
        if (!sp.grammar.empty()) {
            llama_sampler * g = nullptr;
            if (sp.grammar_lazy) {
                std::vector<std::string> patterns = sp.grammar_trigger_patterns;
                std::vector<llama_token> tokens;
                for (const std::string & w : sp.grammar_trigger_words) {
                    auto t = e.tokenize(w, true);
                    if (t.ok() && t->size() == 1) tokens.push_back((*t)[0]);
                    else patterns.push_back(regex_escape(w));
                }
                std::vector<const char *> pc;
                for (const auto & s : patterns) pc.push_back(s.c_str());
                g = llama_sampler_init_grammar_lazy_patterns(e.p_->vocab, sp.grammar.c_str(), "root", pc.data(),
                                                             pc.size(), tokens.data(), tokens.size());
            } else {
                g = llama_sampler_init_grammar(e.p_->vocab, sp.grammar.c_str(), "root");
            }
            if (!g) return invalid_argument("the grammar does not parse (GBNF with a rule named root)");
            if (!sp.grammar_lazy && !sp.grammar_prefill.empty()) {
                auto toks = e.tokenize(sp.grammar_prefill, true);
                if (!toks.ok()) {
                    llama_sampler_free(g);
                    return toks.error();
                }
                for (token_id t : *toks) llama_sampler_accept(g, t);
            }
            p->grammar.reset(g);
        }
    }
    p->sampled = sp.temperature > 0;
    if (sp.temperature <= 0) {
        if (!p->grammar && p->chain) llama_sampler_chain_add(p->chain.get(), llama_sampler_init_greedy());
        else if (p->grammar && !penalties && bias.empty()) p->chain.reset();
    } else {
        if (sp.top_k > 0) llama_sampler_chain_add(p->chain.get(), llama_sampler_init_top_k(sp.top_k));
        if (sp.top_p < 1.0f) llama_sampler_chain_add(p->chain.get(), llama_sampler_init_top_p(sp.top_p, 1));
        llama_sampler_chain_add(p->chain.get(), llama_sampler_init_temp(sp.temperature));
        llama_sampler_chain_add(p->chain.get(), llama_sampler_init_dist(sp.seed));
    }
    return std::unique_ptr<token_sampler>(new token_sampler(std::move(p)));
}

namespace {
// The logits as llama.cpp's candidates. One array per thread, kept: every request's
// sampler would otherwise allocate and fault in n_vocab entries (1.8 MB for a 152k
// vocabulary) before its first token.
llama_token_data_array candidates(std::span<const float> l) {
    thread_local std::vector<llama_token_data> cand;
    cand.resize(l.size());
    for (size_t i = 0; i < l.size(); ++i) cand[i] = {(llama_token)i, l[i], 0.0f};
    return {cand.data(), cand.size(), -1, false};
}

size_t first_max(const llama_token_data_array & a) {
    size_t best = 0;
    for (size_t i = 1; i < a.size; ++i)
        if (a.data[i].logit > a.data[best].logit) best = i;
    return best;
}

// Greedy's pick under a grammar that refused the first maximum: the first token the
// grammar allows in the order of logits, high to low, then ids (the first maximum of what
// it allows, as checking the whole vocabulary and taking the first maximum gives). The
// grammar checks the best 64 candidates, then the best 1,024, then 16,384, ... - the
// whole vocabulary only when none before is allowed - instead of every token of the
// vocabulary against every stack of the grammar each time (a random model's answer under
// 256 alternatives cost ~300 ms a token on 2 cores, on the engine thread). `arr` is
// reordered. When the grammar allows nothing, token 0 (what the first maximum of an all
// -inf array is).
llama_token first_allowed(llama_sampler * grammar, llama_token_data_array & arr) {
    auto before = [](const llama_token_data & a, const llama_token_data & b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    thread_local std::vector<llama_token_data> batch;
    size_t done = 0;
    for (size_t k = 64; done < arr.size; k *= 16) {
        const size_t n = std::min(k, arr.size);
        std::partial_sort(arr.data + done, arr.data + n, arr.data + arr.size, before);
        batch.assign(arr.data + done, arr.data + n);
        llama_token_data_array b{batch.data(), batch.size(), -1, false};
        llama_sampler_apply(grammar, &b);
        for (size_t i = 0; i < b.size; ++i)
            if (b.data[i].logit != -INFINITY) return b.data[i].id;
        done = n;
    }
    return 0;
}
}  // namespace

namespace {
#if defined(__x86_64__) || defined(__i386__)
// first_max_index's two passes over 8 lanes at a time: the maximum (a NaN never wins
// `x > m`, as in max_element), then the first block that holds it. ~3x std::max_element
// over 151,936 logits (55 against 171 us on this project's 2-core Xeon).
__attribute__((target("avx2"))) size_t first_max_avx2(std::span<const float> l) {
    using v8 = float __attribute__((vector_size(32)));
    constexpr size_t w = 8;
    const size_t n = l.size();
    float m = l[0];
    v8 lane = {m, m, m, m, m, m, m, m};
    size_t i = 0;
    for (; i + w <= n; i += w) {
        v8 x;
        std::memcpy(&x, l.data() + i, sizeof x);
        lane = x > lane ? x : lane;
    }
    for (; i < n; ++i) m = l[i] > m ? l[i] : m;
    for (size_t k = 0; k < w; ++k) m = lane[k] > m ? lane[k] : m;
    const v8 mv = {m, m, m, m, m, m, m, m};
    for (i = 0; i + w <= n; i += w) {
        v8 x;
        std::memcpy(&x, l.data() + i, sizeof x);
        const auto eq = x == mv;
        int any = 0;
        for (size_t k = 0; k < w; ++k) any |= eq[k];
        if (any) break;
    }
    for (; i < n; ++i)
        if (l[i] == m) return i;
    return 0;
}
#endif
}  // namespace

size_t first_max_index(std::span<const float> l) {
    if (l.empty() || std::isnan(l[0])) return 0;  // std::max_element keeps a NaN that comes first
#if defined(__x86_64__) || defined(__i386__)
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) return first_max_avx2(l);
#endif
    return (size_t)(std::max_element(l.begin(), l.end()) - l.begin());
}

bool token_sampler::picks_first_max() const { return !p_->chain && !p_->grammar; }

token_id token_sampler::sample(std::span<const float> l) {
    if (p_->grammar && p_->sampled) {
        llama_token_data_array arr = candidates(l);
        llama_sampler_apply(p_->chain.get(), &arr);
        llama_token t = arr.data[arr.selected].id;
        llama_token_data one{t, 0.0f, 0.0f};
        llama_token_data_array single{&one, 1, -1, false};
        llama_sampler_apply(p_->grammar.get(), &single);
        if (one.logit == -INFINITY) {  // refused: sampled again from what the grammar allows
            arr = candidates(l);
            llama_sampler_apply(p_->grammar.get(), &arr);
            llama_sampler_apply(p_->chain.get(), &arr);
            t = arr.data[arr.selected].id;
        }
        accept(t);
        return t;
    }
    if (p_->grammar) {
        // Greedy: the first maximum, offered to the grammar alone; the candidates (the
        // whole vocabulary's, ~1.8 MB to write) only when a bias or penalty changes the
        // logits or the grammar refuses it.
        llama_token_data one{(llama_token)first_max_index(l), 0.0f, 0.0f};
        llama_token_data_array arr{nullptr, 0, -1, false};
        if (p_->chain) {
            arr = candidates(l);
            llama_sampler_apply(p_->chain.get(), &arr);  // bias, penalties
            one = arr.data[first_max(arr)];
        } else {
            one.logit = l[(size_t)one.id];
        }
        llama_token_data_array single{&one, 1, -1, false};
        llama_sampler_apply(p_->grammar.get(), &single);
        llama_token t = one.id;
        if (one.logit == -INFINITY) {  // refused
            if (!p_->chain) arr = candidates(l);
            t = first_allowed(p_->grammar.get(), arr);
        }
        accept(t);
        return t;
    }
    if (!p_->chain) return (token_id)first_max_index(l);  // first maximum
    llama_token_data_array arr = candidates(l);
    llama_sampler_apply(p_->chain.get(), &arr);
    const llama_token t = arr.data[arr.selected].id;
    llama_sampler_accept(p_->chain.get(), t);  // the penalties count it from now on
    return t;
}

void token_sampler::accept(token_id t) {
    if (p_->chain) llama_sampler_accept(p_->chain.get(), t);
    if (p_->grammar) llama_sampler_accept(p_->grammar.get(), t);
}

// A reasoning budget (sampling_params::reasoning_budget) over the text of the prompt's end
// and the answer: idle until reasoning opens, counting its tokens until it closes or the
// budget is spent, then forcing the first closing text's tokens, then idle again (a format
// may open another block: gpt-oss's analysis before each call), each block its budget.
struct reasoning_budget {
    enum class state { off, idle, counting, forcing, done };
    state st = state::off;
    std::string seen;       // the prompt's last text and the answer's pieces since
    size_t from = 0;        // where the next search for an open or close starts
    int32_t budget = -1;
    int32_t in_reasoning = 0;
    std::string start;
    std::vector<std::string> ends;
    std::vector<token_id> forced;
    size_t next_forced = 0;

    void init(const sampling_params & sp) {
        if (sp.reasoning_budget < 0 || sp.reasoning_start.empty() || sp.reasoning_ends.empty()) return;
        st = state::idle;
        budget = sp.reasoning_budget;
        start = sp.reasoning_start;
        ends = sp.reasoning_ends;
        seen = sp.reasoning_prompt;
        look();
    }
    size_t longest() const {
        size_t n = start.size();
        for (const auto & e : ends) n = std::max(n, e.size());
        return n;
    }
    // Moves on by what `seen` now holds: an open, then a close.
    void look() {
        if (from > 4096) {  // what is behind the search is not looked at again
            seen.erase(0, from);
            from = 0;
        }
        if (st == state::idle) {
            const size_t at = seen.find(start, from);
            if (at == std::string::npos) {
                // What may still begin an open; never back before what was searched (an
                // open already closed there would open again).
                from = std::max(from, seen.size() > longest() ? seen.size() - longest() : 0);
                return;
            }
            st = state::counting;
            in_reasoning = 0;
            from = at + start.size();
        }
        if (st == state::counting) {
            size_t first = std::string::npos;
            for (const auto & e : ends) first = std::min(first, seen.find(e, from));
            if (first != std::string::npos) {
                st = state::idle;
                from = first;
                look();
                return;
            }
            from = seen.size() > longest() ? std::max(from, seen.size() - longest()) : from;
        }
    }
    // The piece of a token the answer just took (not a forced one).
    void took(std::string_view piece) {
        if (st != state::idle && st != state::counting) return;
        const bool counting = st == state::counting;
        seen.append(piece);
        look();
        if (counting && st == state::counting) ++in_reasoning;
    }
    // Whether the budget is spent now; the closing text's tokens are made then.
    bool must_force(const engine & e, std::string_view text) {
        if (st != state::counting || in_reasoning < budget) return false;
        if (ends_inside_utf8(text)) return false;  // the character first
        auto t = e.tokenize(ends.front(), true);
        if (!t.ok() || t->empty()) {
            st = state::done;
            return false;
        }
        forced = std::move(*t);
        next_forced = 0;
        st = state::forcing;
        return true;
    }
    static bool ends_inside_utf8(std::string_view s) {
        // The last lead byte's sequence length against the bytes after it.
        for (size_t k = 1; k <= std::min<size_t>(4, s.size()); ++k) {
            const auto c = static_cast<unsigned char>(s[s.size() - k]);
            if ((c & 0xC0) == 0x80) continue;  // continuation byte
            const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            return need > k;
        }
        return false;
    }
};

struct generation_step::impl {
    const engine * e = nullptr;
    sampling_params sp;
    std::unique_ptr<token_sampler> sampler;
    text_stream text;
    std::vector<token_id> tokens;
    reasoning_budget reasoning;
    std::vector<token_id> preserved;  // sorted
    int32_t n_forced = 0;
    std::string raw;  // the last bytes taken while reasoning (a UTF-8 character's end)
    explicit impl(std::vector<std::string> stop) : text(std::move(stop)) {}
};

namespace {
// log-softmax over the whole vocabulary: the chosen token's and the k largest.
token_logprobs logprobs_of(const engine & e, std::span<const float> logits, token_id chosen, int32_t k) {
    float mx = -INFINITY;
    for (float x : logits) mx = std::max(mx, x);
    double sum = 0;
    for (float x : logits) sum += std::exp((double)x - mx);
    const float log_z = mx + (float)std::log(sum);
    token_logprobs out;
    out.chosen = {chosen, logits[(size_t)chosen] - log_z, e.token_piece(chosen)};
    const size_t n = std::min<size_t>((size_t)std::max(k, 0), logits.size());
    if (n > 0) {
        std::vector<token_id> idx(logits.size());
        for (size_t i = 0; i < idx.size(); ++i) idx[i] = (token_id)i;
        std::partial_sort(idx.begin(), idx.begin() + (long)n, idx.end(), [&](token_id a, token_id b) {
            return logits[(size_t)a] > logits[(size_t)b] || (logits[(size_t)a] == logits[(size_t)b] && a < b);
        });
        for (size_t i = 0; i < n; ++i)
            out.top.push_back({idx[i], logits[(size_t)idx[i]] - log_z, e.token_piece(idx[i])});
    }
    return out;
}
}  // namespace

generation_step::generation_step(std::unique_ptr<impl> p) : p_(std::move(p)) {}
generation_step::~generation_step() = default;

result<std::unique_ptr<generation_step>> generation_step::make(const engine & e, const sampling_params & sp) {
    auto sampler = token_sampler::make(sp, e);
    if (!sampler.ok()) return sampler.error();
    auto p = std::make_unique<impl>(sp.stop);
    p->e = &e;
    p->sp = sp;
    p->sampler = std::move(sampler.value());
    p->reasoning.init(sp);
    for (const std::string & t : sp.preserved_tokens) {
        auto toks = e.tokenize(t, true);
        if (toks.ok() && toks->size() == 1) p->preserved.push_back((*toks)[0]);
    }
    std::sort(p->preserved.begin(), p->preserved.end());
    return std::unique_ptr<generation_step>(new generation_step(std::move(p)));
}

generation_step::decision generation_step::next(std::span<const float> logits, pos_t n_in_seq) {
    return decide(logits, -1, n_in_seq);
}

bool generation_step::needs_first_max_only() const { return p_->sp.n_logprobs < 0 && p_->sampler->picks_first_max(); }

generation_step::decision generation_step::next_from_first_max(token_id first_max, pos_t n_in_seq) {
    return decide({}, first_max, n_in_seq);
}

// The decision after `logits`, or after logits whose first maximum is `first_max` (>= 0).
generation_step::decision generation_step::decide(std::span<const float> logits, token_id first_max,
                                                  pos_t n_in_seq) {
    decision d;
    auto end = [&d](finish_reason r) {
        d.finished = true;
        d.finish = r;
        return d;
    };
    if ((int32_t)p_->tokens.size() >= p_->sp.max_tokens) return end(finish_reason::length);
    reasoning_budget & rb = p_->reasoning;
    if (rb.st == reasoning_budget::state::forcing || rb.must_force(*p_->e, p_->raw)) {
        d.token = rb.forced[rb.next_forced++];
        d.forced = true;
        ++p_->n_forced;
        p_->sampler->accept(d.token);
    } else {
        d.token = first_max >= 0 ? first_max : p_->sampler->sample(logits);
    }
    if (p_->sp.n_logprobs >= 0) d.logprobs = logprobs_of(*p_->e, logits, d.token, p_->sp.n_logprobs);
    if (p_->e->is_end_of_generation(d.token)) return end(finish_reason::eos);
    p_->tokens.push_back(d.token);
    const std::string piece =
        p_->e->token_piece(d.token, std::binary_search(p_->preserved.begin(), p_->preserved.end(), d.token));
    if (rb.st != reasoning_budget::state::off && rb.st != reasoning_budget::state::done) {
        p_->raw += piece;
        if (p_->raw.size() > 8) p_->raw.erase(0, p_->raw.size() - 8);
        if (!d.forced) {
            rb.took(piece);
        } else {
            rb.seen.append(piece);  // the whole closing text, so that no search finds the open before it
            if (rb.next_forced == rb.forced.size()) {  // closed: watch for the next block
                rb.st = reasoning_budget::state::idle;
                rb.from = rb.seen.size();
            }
        }
    }
    d.delta = p_->text.push(piece);
    if (p_->text.stopped()) return end(finish_reason::stop);
    if ((int32_t)p_->tokens.size() >= p_->sp.max_tokens) return end(finish_reason::length);
    if ((uint32_t)n_in_seq + 1 > p_->e->context().n_ctx_seq) return end(finish_reason::context_full);
    return d;
}

std::string generation_step::finish() { return p_->text.finish(); }
int32_t generation_step::n_generated() const { return (int32_t)p_->tokens.size(); }
const std::vector<token_id> & generation_step::tokens() const { return p_->tokens; }
const std::string & generation_step::text() const { return p_->text.text(); }
int32_t generation_step::n_forced() const { return p_->n_forced; }

result<generation> engine::generate(seq_id seq, std::vector<float> logits, const sampling_params & sp,
                                    std::vector<float> * logits_out, draft_index * drafts) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if ((int32_t)logits.size() != p_->minfo.n_vocab)
        return invalid_argument("generate: logits must have n_vocab entries (prefill first)");
    auto gs = generation_step::make(*this, sp);
    if (!gs.ok()) return gs.error();
    generation_step & step = **gs;
    // Drafts need a memory cut back exactly after a token sampling did not choose.
    if (sp.draft_max <= 0 || !drops_a_draft(p_->cinfo.memory)) drafts = nullptr;

    generation g;
    auto t0 = std::chrono::steady_clock::now();
    pos_t pos = seq_n_tokens(seq);
    std::vector<std::vector<float>> rows;
    std::vector<token_id> firsts;  // the rows' first maxima, where that is all sampling reads
    const bool first_max_only = !logits_out && step.needs_first_max_only();
    std::vector<step_input> batch;
    auto decide = [&](std::span<const float> l, token_id first_max) {
        if (logits_out && step.n_generated() < sp.max_tokens) logits_out->insert(logits_out->end(), l.begin(), l.end());
        auto d = first_max >= 0 ? step.next_from_first_max(first_max, pos) : step.next(l, pos);
        if (!d.finished && drafts) drafts->push(d.token);
        return d;
    };
    auto d = decide(logits, -1);
    while (!d.finished) {
        // The token, and where the workspace says how it goes on, a draft after it.
        batch.assign(1, step_input{seq, d.token, pos, first_max_only});
        if (drafts) {
            const size_t n = draft_room(sp, step.n_generated(), pos, p_->cinfo.n_ctx_seq, p_->cinfo.chunk_tokens - 1);
            for (token_id t : drafts->propose(n))
                batch.push_back({seq, t, (pos_t)(pos + batch.size()), first_max_only});
        }
        status st = decode_step(batch, rows, first_max_only ? &firsts : nullptr);
        if (!st.ok()) return st.with_context("generate");
        ++pos;
        // Sampling after each position in turn; a draft token stands where it was chosen.
        size_t i = 0;
        for (;;) {
            d = decide(rows[i], first_max_only ? firsts[i] : -1);
            if (d.finished || i + 1 >= batch.size() || d.token != batch[i + 1].token) break;
            ++pos;
            ++i;
        }
        if (batch.size() > 1) {
            drafts->record(batch.size() - 1, i);
            g.drafts.n_steps++;
            g.drafts.n_drafted += batch.size() - 1;
            g.drafts.n_accepted += i;
            if (i + 1 < batch.size())
                WARMCTX_RETURN_IF_ERROR(trim_seq(seq, pos).with_context("generate: dropping a draft"));
        }
    }
    g.finish = d.finish;
    step.finish();
    g.tokens = step.tokens();
    g.text = step.text();
    g.t_decode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return g;
}

}  // namespace warmctx
