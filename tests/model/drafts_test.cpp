// Drafts from the workspace (warmctx/drafts.h) on the tiny model: an answer decoded with
// drafts is the answer decoded without them - the same tokens greedily and sampled, the
// same logits but for their last bits, the same sequence left behind - whether the draft is right
// (an earlier answer to the same prompt) or wrong; a hybrid model decodes without them.
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "tiny_model.h"
#include "warmctx/drafts.h"
#include "warmctx/scheduler.h"
#include "workload/workload.h"

namespace warmctx {
namespace {

using testing::open_tiny;
using testing::random_tokens;

std::vector<token_id> source_of(std::span<const token_id> prompt, std::span<const token_id> answer) {
    std::vector<token_id> s(prompt.end() - 16, prompt.end());
    s.insert(s.end(), answer.begin(), answer.end());
    return s;
}

struct decoded {
    generation g;
    std::vector<float> logits;
    pos_t n_in_seq = 0;
};

decoded decode(engine & e, seq_id seq, std::span<const token_id> prompt, const sampling_params & sp,
               const std::vector<token_id> * source) {
    decoded d;
    e.clear_seq(seq);
    std::vector<float> l;
    EXPECT_TRUE(e.prefill(seq, prompt, 0, {}, &l).ok());
    draft_index idx;
    if (source) idx.add_source(*source);
    idx.extend(prompt);
    auto g = e.generate(seq, l, sp, &d.logits, source ? &idx : nullptr);
    EXPECT_TRUE(g.ok()) << g.error().to_string();
    if (g.ok()) d.g = std::move(g.value());
    d.n_in_seq = e.seq_n_tokens(seq);
    return d;
}

float max_diff(std::span<const float> a, std::span<const float> b) {
    EXPECT_EQ(a.size(), b.size());
    float d = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
}

// Several rows decoded together sum in another order than one alone (drafts.h): llama.cpp's
// batched kernel against its one-row dot product. How far apart that puts a row's logits
// depends on the weights' type and the CPU (f16 weights: ~1e-2; q8_0 weights on AVX-512:
// ~0.3-0.5), so it is measured here, without drafts: the plain answer's tokens decoded
// 2, 3, 5, 9 and 17 rows at a time (a draft's sizes) against the same rows one at a time.
// A drafted answer's rows may differ from the plain answer's by that much, with a floor of
// 5e-2 - and by more only where a draft left something behind (a cut that crossed a
// sliding window, a rejected row's KV).
float rows_tolerance(engine & e, std::span<const token_id> prompt, const decoded & plain) {
    const seq_id seq = 3;
    const size_t v = plain.logits.size() / std::max<size_t>(plain.g.tokens.size(), 1);
    float worst = 0;
    for (size_t rows : {2, 3, 5, 9, 17}) {
        if (rows + 1 > plain.g.tokens.size()) break;
        e.clear_seq(seq);
        std::vector<float> l;
        EXPECT_TRUE(e.prefill(seq, prompt, 0, {}, &l).ok());
        std::vector<step_input> in;
        for (size_t j = 0; j < rows; ++j)
            in.push_back({seq, plain.g.tokens[j], (pos_t)(prompt.size() + j)});
        std::vector<std::vector<float>> out;
        EXPECT_TRUE(e.decode_step(in, out).ok());
        for (size_t j = 0; j < out.size(); ++j)  // row j gives the logits of token j + 1
            worst = std::max(worst, max_diff(out[j], std::span(plain.logits).subspan((j + 1) * v, v)));
    }
    e.clear_seq(seq);
    return std::max(5e-2f, 1.5f * worst);
}

// The two best logits' distance in one row.
float top2_gap(std::span<const float> row) {
    float a = -INFINITY, b = -INFINITY;
    for (float x : row) {
        if (x > a) b = a, a = x;
        else if (x > b) b = x;
    }
    return a - b;
}

// The drafted answer is the undrafted one: token for token while their rows agree within
// the tolerance. Where two tokens' logits are closer than the rows' difference (greedy: the
// best two; sampled: a draw at the edge between two), the choice may go the other way, and
// from there the two are different texts: so each row up to the first token that differs
// is within the tolerance, and a greedy answer differs only at such a near tie. Returns the
// tokens the two share. A rejected draft leaves nothing behind either way.
size_t expect_same(const decoded & plain, const decoded & drafted, float tolerance, bool greedy = true) {
    const auto & p = plain.g.tokens;
    const auto & d = drafted.g.tokens;
    size_t agree = 0;
    while (agree < p.size() && agree < d.size() && p[agree] == d[agree]) ++agree;
    const size_t v = p.empty() ? 0 : plain.logits.size() / p.size();
    EXPECT_EQ(plain.logits.size(), p.size() * v);
    EXPECT_EQ(drafted.logits.size(), d.size() * v);
    const size_t rows = std::min({agree + 1, p.size(), d.size()});
    EXPECT_LE(max_diff(std::span(plain.logits).first(rows * v), std::span(drafted.logits).first(rows * v)),
              tolerance);
    if (agree < p.size() && agree < d.size()) {
        SCOPED_TRACE("the answers part at token " + std::to_string(agree) + " of " + std::to_string(p.size()));
        if (greedy) EXPECT_LE(top2_gap(std::span(plain.logits).subspan(agree * v, v)), 2 * tolerance);
    } else {
        EXPECT_EQ(p, d);
        EXPECT_EQ(plain.g.text, drafted.g.text);
    }
    EXPECT_EQ(plain.n_in_seq - (pos_t)p.size(), drafted.n_in_seq - (pos_t)d.size());
    return agree;
}

TEST(Drafts, AnEarlierAnswerDraftsTheSameAnswerGreedyAndSampled) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    const auto prompt = random_tokens(70, 3, e->model().n_vocab);
    for (float temperature : {0.0f, 1.0f}) {
        SCOPED_TRACE(temperature);
        sampling_params sp;
        sp.max_tokens = 96;
        sp.temperature = temperature;
        sp.seed = 11;
        const decoded plain = decode(*e, 0, prompt, sp, nullptr);
        ASSERT_GT(plain.g.tokens.size(), 40u);
        EXPECT_EQ(plain.g.drafts.n_drafted, 0u);
        sp.draft_max = 16;
        const auto source = source_of(prompt, plain.g.tokens);
        const decoded drafted = decode(*e, 1, prompt, sp, &source);
        const size_t agree = expect_same(plain, drafted, rows_tolerance(*e, prompt, plain), temperature == 0.0f);
        // Each step checks up to 16 tokens of the earlier answer, and sampling chooses them
        // (those the two answers share).
        EXPECT_GE(drafted.g.drafts.n_accepted, agree * 3 / 4) << drafted.g.drafts.n_drafted;
        EXPECT_LE(drafted.g.drafts.n_steps, plain.g.tokens.size() / 4);
    }
}

TEST(Drafts, AWrongDraftChangesNothing) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    const auto prompt = random_tokens(70, 4, e->model().n_vocab);
    sampling_params sp;
    sp.max_tokens = 48;
    const decoded plain = decode(*e, 0, prompt, sp, nullptr);
    sp.draft_max = 16;
    // The prompt's tail leads into text the model does not write.
    const auto source = source_of(prompt, random_tokens(200, 5, e->model().n_vocab));
    const decoded drafted = decode(*e, 1, prompt, sp, &source);
    expect_same(plain, drafted, rows_tolerance(*e, prompt, plain));
    EXPECT_GT(drafted.g.drafts.n_drafted, 0u);
    EXPECT_LT(drafted.g.drafts.n_accepted, drafted.g.drafts.n_drafted);
}

// A sliding window's cache keeps every cell where a cold run has it: a draft's positions
// are cut back as plain KV's are.
TEST(Drafts, ASlidingWindowModelDraftsTheSameAnswer) {
    engine_options o = testing::tiny_options();
    o.model_path = std::string(WARMCTX_TEST_TMP) + "/tiny-swa-q8_0-seed1.gguf";
    auto e = engine::open(o);
    ASSERT_TRUE(e.ok()) << e.error().to_string();
    ASSERT_EQ((*e)->context().memory.kind, memory_kind::sliding_window);
    // Past the window (64 tokens), so that cutting a draft back crosses it.
    const auto prompt = random_tokens(150, 8, (*e)->model().n_vocab);
    sampling_params sp;
    sp.max_tokens = 96;
    const decoded plain = decode(**e, 0, prompt, sp, nullptr);
    ASSERT_GT(plain.g.tokens.size(), 40u);
    sp.draft_max = 64;
    const auto source = source_of(prompt, plain.g.tokens);
    const decoded drafted = decode(**e, 1, prompt, sp, &source);
    const float tolerance = rows_tolerance(**e, prompt, plain);
    const size_t agree = expect_same(plain, drafted, tolerance);
    EXPECT_GE(drafted.g.drafts.n_accepted, agree * 3 / 4);
    // The answer's first token, then text the model does not write.
    std::vector<token_id> off_course{plain.g.tokens[0]};
    for (token_id t : random_tokens(200, 9, (*e)->model().n_vocab)) off_course.push_back(t);
    const auto wrong = source_of(prompt, off_course);
    const decoded rejected = decode(**e, 2, prompt, sp, &wrong);
    SCOPED_TRACE("drafts rejected");
    expect_same(plain, rejected, tolerance);
    EXPECT_GT(rejected.g.drafts.n_drafted, rejected.g.drafts.n_accepted);
}

TEST(Drafts, AHybridModelDecodesWithoutThem) {
    engine_options o = testing::tiny_options();
    o.model_path = std::string(WARMCTX_TEST_TMP) + "/tiny-hybrid-q8_0-seed1.gguf";
    auto e = engine::open(o);
    ASSERT_TRUE(e.ok()) << e.error().to_string();
    const auto prompt = random_tokens(70, 6, (*e)->model().n_vocab);
    sampling_params sp;
    sp.max_tokens = 24;
    const decoded plain = decode(**e, 0, prompt, sp, nullptr);
    sp.draft_max = 16;
    const auto source = source_of(prompt, plain.g.tokens);
    const decoded drafted = decode(**e, 1, prompt, sp, &source);
    EXPECT_EQ(plain.g.tokens, drafted.g.tokens);
    EXPECT_EQ(drafted.g.drafts.n_drafted, 0u);  // its recurrent state cannot drop a rejected draft
}

// Through the engine thread: a request sent again is drafted from the answer before, and
// is that answer, the cold run's; two such requests batched together too; a
// request that asks no drafts gets none.
struct sink_state {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<completion_event> done;
    int leave_at_delta = 0;  // > 0: the client goes away at that delta, mid-answer
    int n_deltas = 0;
    std::string text;  // the deltas' text
    event_sink sink() {
        return [this](const completion_event & ev) {
            if (ev.what == completion_event::kind::delta) text += ev.text;
            if (ev.what == completion_event::kind::delta && ++n_deltas == leave_at_delta) {
                std::lock_guard lk(mu);
                done = ev;
                cv.notify_all();
                return false;
            }
            if (ev.what != completion_event::kind::done && ev.what != completion_event::kind::error) return true;
            std::lock_guard lk(mu);
            done = ev;
            cv.notify_all();
            return true;
        };
    }
    const completion_event & wait() {
        std::unique_lock lk(mu);
        cv.wait_for(lk, std::chrono::seconds(120), [&] { return done.has_value(); });
        return *done;
    }
};

turn_request request(const std::string & ws, int32_t draft_max) {
    workload_generator g(21, [](const std::string & s) { return s.size() / 3; });
    turn_request r;
    r.workspace = ws;
    r.segments = make_workspace(g, 300, 1);
    r.sampling.max_tokens = 64;
    r.sampling.draft_max = draft_max;
    r.keep_logits = true;
    return r;
}

TEST(Drafts, ARequestSentAgainIsDraftedFromTheAnswerBeforeAndEqualsTheColdRun) {
    scheduler_options o;
    o.engine.engine = testing::tiny_options();
    o.engine.n_holders = 3;
    o.n_parallel = 2;
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    auto run = [&](std::vector<turn_request> rs, std::vector<std::string> * texts = nullptr) {
        std::vector<std::unique_ptr<sink_state>> sinks;
        for (auto & r : rs) {
            sinks.push_back(std::make_unique<sink_state>());
            EXPECT_TRUE((*s)->submit({r, sinks.back()->sink()}).ok());
        }
        std::vector<completion_event> out;
        for (auto & k : sinks) out.push_back(k->wait());
        for (auto & k : sinks)
            if (texts) texts->push_back(k->text);
        return out;
    };
    std::vector<std::string> first_text;
    const auto first = run({request("a", 16), request("b", 16)}, &first_text);
    const auto again = run({request("a", 16), request("b", 16)});
    for (size_t i = 0; i < 2; ++i) {
        SCOPED_TRACE(i);
        ASSERT_EQ(first[i].what, completion_event::kind::done);
        ASSERT_EQ(again[i].what, completion_event::kind::done);
        ASSERT_GT(first[i].tokens.size(), 20u);
        EXPECT_EQ(again[i].tokens, first[i].tokens);
        EXPECT_GE(again[i].drafts.n_accepted, first[i].tokens.size() / 2) << again[i].drafts.n_drafted;
        std::optional<turn_result> cold;
        ASSERT_TRUE((*s)->call([&](context_engine & ce) {
            auto c = ce.run_cold(request(i ? "b" : "a", 0));
            if (c.ok()) cold = std::move(c.value());
        }).ok());
        ASSERT_TRUE(cold.has_value());
        EXPECT_EQ(again[i].tokens, cold->gen.tokens);
        EXPECT_LE(max_diff(again[i].gen_logits, cold->gen_logits), 5e-2f);  // f16 weights (rows_tolerance)
        EXPECT_EQ(again[i].prompt_logits, cold->prompt_logits);  // the prompt's, bit for bit
    }
    // A client that leaves after a drafted step (its second delta): the job is retired
    // with what its sequence holds, and the workspace's next turn still equals the cold run.
    {
        sink_state gone;
        gone.leave_at_delta = 2;
        ASSERT_TRUE((*s)->submit({request("a", 64), gone.sink()}).ok());
        gone.wait();
        const auto after = run({request("a", 64)});
        ASSERT_EQ(after[0].what, completion_event::kind::done);
        EXPECT_EQ(after[0].tokens, first[0].tokens);
        EXPECT_GT(after[0].drafts.n_accepted, 0u);
    }
    // An answer that leaves the one before partway (sampled, a token of the one before
    // banned): the draft is taken up to there, the rest cut from the sequence, and the
    // answer is the cold run's, draw for draw.
    {
        turn_request sampled = request("c", 64);
        sampled.sampling.temperature = 1.0f;
        sampled.sampling.seed = 7;
        const auto before = run({sampled});
        ASSERT_EQ(before[0].what, completion_event::kind::done);
        ASSERT_GT(before[0].tokens.size(), 20u);
        turn_request banned = sampled;
        banned.sampling.logit_bias.push_back({before[0].tokens[12], -100.0f});
        const auto b = run({banned});
        ASSERT_EQ(b[0].what, completion_event::kind::done);
        EXPECT_NE(b[0].tokens, before[0].tokens);
        EXPECT_GT(b[0].drafts.n_drafted, b[0].drafts.n_accepted);
        EXPECT_GT(b[0].drafts.n_accepted, 0u);
        std::optional<turn_result> cold;
        banned.sampling.draft_max = 0;
        ASSERT_TRUE((*s)->call([&](context_engine & ce) {
            auto c = ce.run_cold(banned);
            if (c.ok()) cold = std::move(c.value());
        }).ok());
        ASSERT_TRUE(cold.has_value());
        EXPECT_EQ(b[0].tokens, cold->gen.tokens);
    }
    const auto off = run({request("a", 0)});
    ASSERT_EQ(off[0].what, completion_event::kind::done);
    EXPECT_EQ(off[0].drafts.n_drafted, 0u);
    EXPECT_EQ(off[0].tokens, first[0].tokens);
    // Without its logits kept, a greedy request's rows give only their picks
    // (step_input::first_max_only), beside one that keeps them: the same answers, drafted.
    {
        turn_request a = request("a", 16);
        a.keep_logits = false;
        std::vector<std::string> texts;
        const auto both = run({a, request("b", 16)}, &texts);
        ASSERT_EQ(both[0].what, completion_event::kind::done);
        EXPECT_EQ(texts, first_text);
        EXPECT_GE(both[0].drafts.n_accepted, first[0].tokens.size() / 2);
        EXPECT_EQ(both[1].tokens, first[1].tokens);
    }
    const scheduler_stats st = (*s)->stats();
    EXPECT_GE(st.drafts.n_accepted, again[0].drafts.n_accepted + again[1].drafts.n_accepted);
}

// Greedy with nothing else reading the distribution needs only each row's first maximum:
// decode_step gives that index where the row asks (step_input::first_max_only) and copies
// none of its logits, beside rows that take them whole; generate reads only those indices
// and writes the answer it writes with every row's logits copied.
TEST(Drafts, AGreedyRowGivesOnlyItsFirstMaximumAndTheSameAnswer) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    const int32_t v = e->model().n_vocab;
    const auto prompt = random_tokens(70, 6, v);
    const auto next = random_tokens(3, 7, v);
    auto step = [&](bool mark_first, std::vector<std::vector<float>> & out, std::vector<token_id> * firsts) {
        std::vector<float> l;
        std::vector<step_input> in;
        for (seq_id s : {0, 1}) {
            e->clear_seq(s);
            EXPECT_TRUE(e->prefill(s, prompt, 0, {}, &l).ok());
            for (size_t j = 0; j < next.size(); ++j)  // seq 0's rows marked, seq 1's whole
                in.push_back({s, next[j], (pos_t)(prompt.size() + j), mark_first && s == 0});
        }
        ASSERT_TRUE(e->decode_step(in, out, firsts).ok());
    };
    std::vector<std::vector<float>> whole, picked;
    std::vector<token_id> firsts;
    step(false, whole, nullptr);
    step(true, picked, &firsts);
    ASSERT_EQ(firsts.size(), 2 * next.size());
    for (size_t r = 0; r < firsts.size(); ++r) {
        SCOPED_TRACE(r);
        ASSERT_EQ(whole[r].size(), (size_t)v);
        if (r < next.size()) {
            EXPECT_TRUE(picked[r].empty());  // not copied
            EXPECT_EQ(firsts[r], (token_id)first_max_index(whole[r]));
        } else {
            EXPECT_EQ(firsts[r], -1);
            EXPECT_EQ(0, std::memcmp(picked[r].data(), whole[r].data(), whole[r].size() * sizeof(float)));
        }
    }
    // generate: without logits_out each row gives only its pick; with it, every row whole.
    // Drafted from the same earlier answer, the two decode the same rows in the same steps.
    sampling_params sp;
    sp.max_tokens = 64;
    const decoded plain = decode(*e, 0, prompt, sp, nullptr);
    sp.draft_max = 16;
    const auto source = source_of(prompt, plain.g.tokens);
    const decoded full = decode(*e, 2, prompt, sp, &source);
    e->clear_seq(1);
    std::vector<float> l;
    ASSERT_TRUE(e->prefill(1, prompt, 0, {}, &l).ok());
    draft_index idx;
    idx.add_source(source);
    idx.extend(prompt);
    auto g = e->generate(1, l, sp, nullptr, &idx);
    ASSERT_TRUE(g.ok()) << g.error().to_string();
    EXPECT_EQ(g->tokens, full.g.tokens);
    EXPECT_GT(g->drafts.n_accepted, 0u);
    EXPECT_EQ(g->drafts.n_accepted, full.g.drafts.n_accepted);
    EXPECT_EQ(g->drafts.n_steps, full.g.drafts.n_steps);
    EXPECT_EQ(e->seq_n_tokens(1), full.n_in_seq);
}

}  // namespace
}  // namespace warmctx
