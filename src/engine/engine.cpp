// The engine at work: tokenizing, canonical-chunk prefill, batched decode steps, and
// sequences copied, trimmed, saved and loaded. (engine_open.cpp opens it, sampling.cpp
// samples.) The engine's files are the only ones that include llama.h.
#include "engine_impl.h"

#include "seq_state.h"
#include "warmctx/sampling.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "llama.h"

#ifndef WARMCTX_LLAMA_COMMIT
#define WARMCTX_LLAMA_COMMIT "unknown"
#endif
#ifndef WARMCTX_BACKEND
#define WARMCTX_BACKEND "CPU"
#endif

namespace warmctx {

using namespace seq_state;  // llama.cpp's sequence state layout (seq_state.h)

std::string_view llama_commit() { return WARMCTX_LLAMA_COMMIT; }
std::string_view backend_name() { return WARMCTX_BACKEND; }

std::string_view kv_mode_name(kv_mode m) { return m == kv_mode::exact ? "exact" : "shared"; }

result<kv_mode> parse_kv_mode(std::string_view s) {
    if (s == "exact") return kv_mode::exact;
    if (s == "shared") return kv_mode::shared;
    return invalid_argument("unknown KV mode '" + std::string(s) + "' (expected exact or shared)");
}

engine::engine(std::unique_ptr<impl> p) : p_(std::move(p)) {}
engine::~engine() = default;

const engine_options & engine::options() const { return p_->opts; }
const model_info & engine::model() const { return p_->minfo; }
const context_info & engine::context() const { return p_->cinfo; }

result<std::vector<token_id>> engine::tokenize(std::string_view text, bool parse_special) const {
    if (text.size() > (size_t)INT32_MAX / 2) return out_of_range("text too large to tokenize");
    std::vector<token_id> out(text.size() + 8);
    int32_t n = llama_tokenize(p_->vocab, text.data(), (int32_t)text.size(), out.data(), (int32_t)out.size(),
                               /*add_special=*/false, parse_special);
    if (n < 0) {
        out.resize((size_t)-n);
        n = llama_tokenize(p_->vocab, text.data(), (int32_t)text.size(), out.data(), (int32_t)out.size(), false,
                           parse_special);
        if (n < 0) return engine_error("llama_tokenize failed");
    }
    out.resize((size_t)n);
    return out;
}

result<std::string> engine::detokenize(std::span<const token_id> tokens) const {
    for (token_id t : tokens)
        if (t < 0 || t >= p_->minfo.n_vocab)
            return invalid_argument("token id " + std::to_string(t) + " out of vocabulary");
    std::string out(tokens.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(p_->vocab, tokens.data(), (int32_t)tokens.size(), out.data(), (int32_t)out.size(),
                                 false, false);
    if (n < 0) {
        out.resize((size_t)-n);
        n = llama_detokenize(p_->vocab, tokens.data(), (int32_t)tokens.size(), out.data(), (int32_t)out.size(), false,
                             false);
        if (n < 0) return engine_error("llama_detokenize failed");
    }
    out.resize((size_t)n);
    return out;
}

std::vector<std::string> engine::special_token_texts() const {
    std::vector<std::string> out;
    const int32_t n = llama_vocab_n_tokens(p_->vocab);
    for (token_id t = 0; t < n; ++t) {
        if (!(llama_vocab_get_attr(p_->vocab, t) &
              (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN)))
            continue;
        char buf[256];
        const int32_t k = llama_token_to_piece(p_->vocab, t, buf, sizeof buf, 0, true);
        if (k > 0) out.emplace_back(buf, (size_t)k);
    }
    std::sort(out.begin(), out.end(), [](const std::string & a, const std::string & b) {
        return a.size() != b.size() ? a.size() > b.size() : a < b;
    });
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

std::optional<std::array<token_id, 3>> engine::fim_tokens() const {
    const token_id pre = llama_vocab_fim_pre(p_->vocab), suf = llama_vocab_fim_suf(p_->vocab),
                   mid = llama_vocab_fim_mid(p_->vocab);
    if (pre < 0 || suf < 0 || mid < 0) return std::nullopt;
    return std::array<token_id, 3>{pre, suf, mid};
}

std::string engine::token_piece(token_id t, bool special) const {
    char buf[256];
    int32_t n = llama_token_to_piece(p_->vocab, t, buf, sizeof buf, 0, special);
    if (n < 0) {
        std::string s((size_t)-n, '\0');
        n = llama_token_to_piece(p_->vocab, t, s.data(), (int32_t)s.size(), 0, special);
        return n < 0 ? std::string() : s.substr(0, (size_t)n);
    }
    return std::string(buf, (size_t)n);
}

result<std::string> engine::apply_chat_template(std::span<const chat_message> messages,
                                                bool add_generation_prompt) const {
    if (p_->minfo.chat_template.empty()) return failed_precondition("the model has no chat template");
    std::vector<llama_chat_message> msgs;
    size_t total = 0;
    for (const auto & m : messages) {
        msgs.push_back({m.role.c_str(), m.content.c_str()});
        total += m.role.size() + m.content.size();
    }
    std::string buf(total * 2 + 256, '\0');
    const char * tmpl = p_->minfo.chat_template.c_str();
    int32_t n = llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), add_generation_prompt, buf.data(),
                                          (int32_t)buf.size());
    if (n < 0) return failed_precondition("the model's chat template is not supported by llama_chat_apply_template");
    if ((size_t)n > buf.size()) {
        buf.resize((size_t)n);
        n = llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), add_generation_prompt, buf.data(),
                                      (int32_t)buf.size());
    }
    buf.resize((size_t)n);
    return buf;
}

bool engine::is_end_of_generation(token_id t) const { return llama_vocab_is_eog(p_->vocab, t); }

// The cost model behind pad_rows, fitted to `warmctx-bench calls` on 2 CPU cores (AVX2)
// for the 0.5B q4_0 model and the tiny one at depths 1k-8k (docs/benchmarks.md, "Small
// batches on the CPU"): a query row costs its weights (per matrix parameter P) plus, per
// KV cell before it, a share per attention head (H = layers x heads). Alone (fewer than
// 64 rows: one row at a time) about 9 us + 6.5 ps * P + 10 ns * H * pos; in a 64-row batch
// (tiled) about 4 us + 9.2 ps * P + 3.5 ns * H * pos. Where the tiny model's heads cost
// more alone (19 ns) the model stays on the side of padding less. Integer femtoseconds:
// the same answer on every build, as exactness needs.
void engine::impl::init_pad_costs() {
    const uint64_t embd = (uint64_t)std::max(0, minfo.n_vocab) * (uint64_t)std::max(0, minfo.n_embd);
    const unsigned __int128 P = minfo.n_params > embd ? minfo.n_params - embd : 0;  // matrices, not the lookup table
    const unsigned __int128 H = (uint64_t)std::max(0, minfo.n_layer) * (uint64_t)std::max(0, minfo.n_head);
    pad.a = (unsigned __int128)9'000'000'000 + 6'500 * P;
    pad.b = 10'000'000 * H;
    pad.c = (unsigned __int128)4'000'000'000 + 9'200 * P;
    pad.d = 3'500'000 * H;
}

// Padded when 64 rows are predicted to cost at most 85% of the n rows alone (a margin for
// the model's error: padding never pays less than it costs by much).
int32_t engine::impl::pad_rows(int32_t n, pos_t pos) const {
    if (cinfo.splits_freely) return n >= 1 && n < k_pad_to ? k_pad_to - n : 0;
    if (!cinfo.pads_rows || n < 8 || n >= k_pad_to || pos < 0 || pad.b == 0) return 0;
    const unsigned __int128 p = (uint64_t)pos;
    const unsigned __int128 alone = (unsigned __int128)(uint64_t)n * (pad.a + pad.b * p);
    const unsigned __int128 tiled = (unsigned __int128)k_pad_to * (pad.c + pad.d * p);
    return tiled * 100 <= alone * 85 ? k_pad_to - n : 0;
}

int32_t engine::pad_rows(int32_t n, pos_t pos) const { return p_->pad_rows(n, pos); }

namespace {
// The probes' one test: two sets of logits, bit for bit (an empty set is no answer).
bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return !a.empty() && a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
}  // namespace

// A decode step's rows: with two or more, ggml's CPU kernels compute each row the same
// way however many there are; one row alone goes through others (a one-row dot product),
// whose last bits differ once the sequence is deeper than 256 cells (flash attention then
// splits one row's KV between the threads). Measured here: 3 tokens after 264, decoded one
// row a step, in one step of 3, and in steps of 2 (the last padded: by a row in its own
// sequence, and by one in an empty sequence beside it). Where padding a lone row to two
// makes a token's logits the same decoded alone, beside other jobs' rows or with a draft,
// and the pad decode_step uses (beside where that agrees) costs at most
// engine_options::steps_pad_max_cost (1.2x) the lone row, lone rows are padded; where it
// costs more they are not, and steps_exact says answers may part at near ties.
status engine::impl::probe_steps() {
    // Deeper than 256 cells: one row's flash attention splits a longer KV between threads.
    const pos_t depth = 264;
    std::vector<token_id> toks((size_t)depth + 3);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = (token_id)((i * 7919 + 11) % (size_t)std::max(1, minfo.n_vocab));
    const pos_t end = depth + 3;
    llama_memory_seq_rm(mem(), 0, -1, -1);
    for (pos_t at = 0; at < depth; at += (pos_t)cinfo.chunk_tokens)
        WARMCTX_RETURN_IF_ERROR(decode(0, toks.data() + at, std::min<pos_t>((pos_t)cinfo.chunk_tokens, depth - at), at,
                                       false, padding::never));
    auto run = [&](std::initializer_list<int32_t> steps, std::vector<float> & out) -> status {
        llama_memory_seq_rm(mem(), 0, depth, -1);
        pos_t pos = depth;
        for (int32_t k : steps) {
            // 0: one row padded to two in its sequence; -1: padded by a row in sequence 1
            const int32_t n = k <= 0 ? 2 : k;
            batch.n_tokens = n;
            // Every row's logits: the output layer of one row alone is another kernel too.
            for (int32_t i = 0; i < n; ++i)
                detail::set_step_row(batch, i, toks[(size_t)std::min<pos_t>(pos + i, end - 1)], pos + i, 0);
            if (k < 0) detail::set_step_row(batch, 1, toks[(size_t)pos], 0, 1);
            WARMCTX_RETURN_IF_ERROR(detail::decode_status(llama_decode(ctx.get(), batch)));
            pos += k <= 0 ? 1 : k;
            if (k <= 0) llama_memory_seq_rm(mem(), k == 0 ? 0 : 1, k == 0 ? pos : 0, -1);
            if (pos == end) {
                const float * l = llama_get_logits_ith(ctx.get(), k <= 0 ? 0 : -1);
                out.assign(l, l + minfo.n_vocab);
            }
        }
        return {};
    };
    // The pad decode_step uses where it can: a row in an empty sequence beside (here 1).
    const bool beside = cinfo.n_seq_max >= 2;
    std::vector<float> one, three, two, two_beside;
    status st = run({1, 1, 1}, one);
    if (st.ok()) st = run({3}, three);
    if (st.ok()) st = run({2, 0}, two);
    if (st.ok() && beside) st = run({2, -1}, two_beside);
    const bool lone_differs = !same_bits(one, three);
    // Beside agrees where one row of each of two sequences computes as rows of one do (flash
    // attention on; without it the attention's products of one row a stream take the lone
    // row's kernel): then sequences share a ubatch in decode_step too.
    cinfo.pads_beside = beside && same_bits(three, two_beside);
    const bool pad_agrees = cinfo.pads_beside || same_bits(three, two);
    const int32_t padded = cinfo.pads_beside ? -1 : 0;
    // Each way's fastest of five, alternated: the least noisy estimate on a shared machine
    // (a sum let one slow repetition move a model near the line across it between starts).
    double t_lone = 0, t_pad = 0;
    for (int rep = 0; st.ok() && lone_differs && pad_agrees && rep < 5; ++rep) {
        for (bool pad : {false, true}) {
            const auto t0 = std::chrono::steady_clock::now();
            std::vector<float> ignored;
            st = pad ? run({padded, padded, padded}, ignored) : run({1, 1, 1}, ignored);
            const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            double & best = pad ? t_pad : t_lone;
            best = rep == 0 ? t : std::min(best, t);
        }
    }
    llama_memory_seq_rm(mem(), 0, -1, -1);
    cinfo.steps_pad_cost = t_lone > 0 ? t_pad / t_lone : 0;
    cinfo.pads_steps = st.ok() && lone_differs && pad_agrees && cinfo.steps_pad_cost <= opts.steps_pad_max_cost;
    cinfo.pads_beside = cinfo.pads_beside && cinfo.pads_steps;
    cinfo.steps_exact = st.ok() && (!lone_differs || cinfo.pads_steps);
    return st;
}

// On the CPU, ggml computes a row of a batch of 64 rows or more the same way wherever the
// row sits in it (`warmctx-bench splits`, docs/internals.md "Free splits"); a batch of fewer
// rows goes through other kernels unless padded. Measured, not assumed: another build or
// CPU may differ, and then prefill keeps to canonical chunks.
status engine::impl::probe_free_splits() {
    const int32_t n = std::min<int32_t>(100, (int32_t)cinfo.chunk_tokens);  // a batch holds chunk_tokens rows
    if (n < k_pad_to || cinfo.n_ctx_seq < (uint32_t)n + k_pad_cells) return {};
    std::vector<token_id> toks((size_t)n);
    uint64_t x = 0x9E3779B97F4A7C15ull;  // a fixed sequence of tokens: the same probe every time
    for (auto & t : toks) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        t = (token_id)(x % (uint64_t)std::max(1, minfo.n_vocab));
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto run = [&](std::initializer_list<int32_t> plan, std::vector<float> & out) -> status {
        llama_memory_seq_rm(mem(), 0, -1, -1);
        pos_t pos = 0;
        for (int32_t k : plan) {
            WARMCTX_RETURN_IF_ERROR(decode(0, toks.data() + pos, k, pos, pos + k == n, padding::every_short_call));
            pos += k;
        }
        copy_logits(&out);
        return {};
    };
    std::vector<float> a, b;
    status st = run({n}, a);
    if (st.ok()) st = run({40, n - 40}, b);
    llama_memory_seq_rm(mem(), 0, -1, -1);
    cinfo.splits_freely = st.ok() && same_bits(a, b);
    cinfo.splits_probe_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return st;
}
uint64_t engine::padded_decodes() const { return p_->n_padded.load(std::memory_order_relaxed); }
uint64_t engine::prefill_decodes() const { return p_->n_prefill_decodes.load(std::memory_order_relaxed); }

status engine::prefill(seq_id seq, std::span<const token_id> tokens, pos_t pos0,
                       std::span<const pos_t> boundaries, std::vector<float> * last_logits,
                       int32_t chunk_tokens, std::span<const pos_t> checkpoint_ends) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if (chunk_tokens == 0) chunk_tokens = (int32_t)p_->cinfo.chunk_tokens;
    if (chunk_tokens < 1 || chunk_tokens > (int32_t)p_->cinfo.chunk_tokens)
        return invalid_argument("prefill: chunk_tokens must be in [1, " + std::to_string(p_->cinfo.chunk_tokens) + "]");
    if (tokens.empty()) return invalid_argument("prefill: no tokens (empty prompt)");
    if (pos0 < 0) return invalid_argument("prefill: negative start position");
    if ((uint64_t)pos0 + tokens.size() > p_->cinfo.n_ctx_seq)
        return out_of_range("prompt needs " + std::to_string((uint64_t)pos0 + tokens.size()) +
                            " tokens but the context holds " + std::to_string(p_->cinfo.n_ctx_seq) + " per sequence");
    // Where the context splits freely, calls of chunk_tokens from pos0 on: the KV is the
    // same as the canonical chunks' (context_info::splits_freely).
    const bool free = p_->cinfo.splits_freely;
    if (!free && !is_chunk_start(pos0, boundaries, chunk_tokens))
        return failed_precondition("prefill: start position " + std::to_string(pos0) +
                                   " is not a canonical chunk start (warm KV would differ from cold)");
    if (seq_n_tokens(seq) != pos0)
        return failed_precondition("prefill: sequence " + std::to_string(seq) + " holds " +
                                   std::to_string(seq_n_tokens(seq)) + " tokens, expected " + std::to_string(pos0));
    for (token_id t : tokens)
        if (t < 0 || t >= p_->minfo.n_vocab)
            return invalid_argument("prefill: token id " + std::to_string(t) + " out of vocabulary");
    const pos_t from[1] = {pos0};
    auto chunks = plan_chunks(pos0, (int32_t)tokens.size(), free ? std::span<const pos_t>(from) : boundaries,
                              chunk_tokens);
    for (size_t i = 0; i < chunks.size(); ++i) {
        auto [b, e] = chunks[i];
        const bool last = i + 1 == chunks.size();
        status st = p_->decode(seq, tokens.data() + (b - pos0), e - b, b, last && last_logits != nullptr);
        p_->n_prefill_decodes.fetch_add(1, std::memory_order_relaxed);
        // A block end a later turn may resume from: where the memory cannot be cut back,
        // its window or recurrent state there is kept.
        if (st.ok() && p_->cinfo.memory.checkpoints &&
            (checkpoint_ends.empty() || std::binary_search(checkpoint_ends.begin(), checkpoint_ends.end(), e)))
            st = p_->take_checkpoint(seq, e);
        if (!st.ok()) {
            // Leave the sequence as it was (or empty, where it cannot be cut back).
            if (!trim_seq(seq, pos0).ok()) clear_seq(seq);
            return st.with_context("prefill");
        }
    }
    if (last_logits) p_->copy_logits(last_logits);
    return {};
}

result<engine::decode_timing> engine::timed_decode(seq_id seq, std::span<const token_id> tokens, pos_t pos) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if (tokens.empty() || tokens.size() > p_->cinfo.chunk_tokens)
        return invalid_argument("timed_decode: 1 to " + std::to_string(p_->cinfo.chunk_tokens) + " tokens");
    if (pos < 0 || (uint64_t)pos + tokens.size() > p_->cinfo.n_ctx_seq)
        return out_of_range("timed_decode: past the sequence's context");
    for (token_id t : tokens)
        if (t < 0 || t >= p_->minfo.n_vocab) return invalid_argument("timed_decode: token id out of vocabulary");
    llama_synchronize(p_->ctx.get());
    using clk = std::chrono::steady_clock;
    const auto t0 = clk::now();
    WARMCTX_RETURN_IF_ERROR(
        p_->decode(seq, tokens.data(), (int32_t)tokens.size(), pos, true).with_context("timed_decode"));
    const auto t1 = clk::now();
    std::vector<float> logits;
    p_->copy_logits(&logits);  // waits for the device
    const auto t2 = clk::now();
    return decode_timing{std::chrono::duration<double, std::milli>(t1 - t0).count(),
                         std::chrono::duration<double, std::milli>(t2 - t0).count()};
}

status engine::decode_step(std::span<const step_input> inputs, std::vector<std::vector<float>> & logits,
                           std::vector<token_id> * first_max) {
    if (inputs.empty()) return invalid_argument("decode_step: no inputs");
    if (inputs.size() > p_->cinfo.chunk_tokens)
        return invalid_argument("decode_step: more inputs than the batch holds");
    for (size_t i = 0; i < inputs.size(); ++i) {
        const auto & in = inputs[i];
        WARMCTX_RETURN_IF_ERROR(p_->check_seq(in.seq));
        if (in.token < 0 || in.token >= p_->minfo.n_vocab)
            return invalid_argument("decode_step: token out of vocabulary");
        if ((uint32_t)in.pos >= p_->cinfo.n_ctx_seq) return out_of_range("decode_step: sequence is full");
        // A sequence's rows (its token and a draft after it) are adjacent, at consecutive positions.
        const bool continues = i > 0 && inputs[i - 1].seq == in.seq;
        if (continues && in.pos != inputs[i - 1].pos + 1)
            return invalid_argument("decode_step: a sequence's rows must be at consecutive positions");
        for (size_t j = 0; !continues && j < i; ++j)
            if (inputs[j].seq == in.seq) return invalid_argument("decode_step: a sequence's rows must be adjacent");
    }
    logits.resize(inputs.size());
    std::vector<token_id> none;
    std::vector<token_id> & picks = first_max ? *first_max : none;
    picks.assign(first_max ? inputs.size() : 0, -1);
    if (!p_->cinfo.pads_steps) return p_->step_call(inputs, logits, picks).with_context("decode_step");
    // Where lone rows are padded (context_info::pads_steps), llama.cpp must not make a lone
    // row of any ubatch either: it puts sequences in one ubatch only where their ids follow
    // each other and they bring as many rows each. So the step goes as calls of such runs
    // of sequences (where one row of each of two sequences computes as two of one does,
    // context_info::pads_beside; else one sequence a call), and a lone row is padded.
    for (size_t i = 0; i < inputs.size();) {
        auto group_end = [&](size_t at) {
            size_t e = at + 1;
            while (e < inputs.size() && inputs[e].seq == inputs[at].seq) ++e;
            return e;
        };
        size_t end = group_end(i);
        const size_t rows = end - i;
        while (p_->cinfo.pads_beside && end < inputs.size() && inputs[end].seq == inputs[end - 1].seq + 1 &&
               group_end(end) - end == rows)
            end = group_end(end);
        const auto rows_picks = picks.empty() ? std::span<token_id>{} : std::span(picks).subspan(i, end - i);
        WARMCTX_RETURN_IF_ERROR(
            p_->step_call(inputs.subspan(i, end - i), std::span(logits).subspan(i, end - i), rows_picks)
                .with_context("decode_step"));
        i = end;
    }
    return {};
}

// One llama_decode of a step's rows. A lone row goes as two (context_info::pads_steps): the
// pad row is a copy of its token in an empty sequence next to it where there is one (its
// attention is over nothing: the pad costs the lone row next to nothing at any depth), else
// at the next position of its own sequence (its attention as deep as the row's: ~2x the row
// on the 0.5B shape at depth 2,300); either way its cell is given back at once and its
// logits (the output layer of one row alone is another kernel too) are not returned.
// (Not the context's last cell: there is none after it where no padding cells are kept.)
status engine::impl::step_call(std::span<const step_input> rows, std::span<std::vector<float>> logits,
                               std::span<token_id> first_max) {
    const uint32_t cells = cinfo.n_ctx_seq + (cinfo.pads_rows ? engine::k_pad_cells : 0);
    step_input pad{-1, 0, 0};
    if (rows.size() == 1 && cinfo.pads_steps) {
        const step_input & in = rows[0];
        for (seq_id s : {in.seq + 1, in.seq - 1})
            if (cinfo.pads_beside && pad.seq < 0 && s >= 0 && (uint32_t)s < cinfo.n_seq_max &&
                llama_memory_seq_pos_max(mem(), s) < 0)
                pad = {s, in.token, 0};
        if (pad.seq < 0 && (uint32_t)in.pos + 1 < cells) pad = {in.seq, in.token, in.pos + 1};
    }
    const bool pad_first = pad.seq >= 0 && pad.seq < rows[0].seq;  // a ubatch's sequences go in order
    int32_t n = 0;
    if (pad_first) detail::set_step_row(batch, n++, pad.token, pad.pos, pad.seq);
    const int32_t first = n;
    for (const auto & in : rows) detail::set_step_row(batch, n++, in.token, in.pos, in.seq);
    if (pad.seq >= 0 && !pad_first) detail::set_step_row(batch, n++, pad.token, pad.pos, pad.seq);
    batch.n_tokens = n;
    status st = detail::decode_status(llama_decode(ctx.get(), batch));
    if (pad.seq >= 0) llama_memory_seq_rm(mem(), pad.seq, pad.pos, -1);
    WARMCTX_RETURN_IF_ERROR(st);
    for (size_t i = 0; i < rows.size(); ++i) {
        const float * l = llama_get_logits_ith(ctx.get(), first + (int32_t)i);
        if (!first_max.empty() && rows[i].first_max_only) {
            first_max[i] = (token_id)first_max_index(std::span(l, (size_t)minfo.n_vocab));
            logits[i].clear();
        } else {
            logits[i].assign(l, l + minfo.n_vocab);
        }
    }
    return {};
}

}  // namespace warmctx
