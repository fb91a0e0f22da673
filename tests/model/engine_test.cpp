// The engine adapter on the tiny model: loading, tokens, template, sampling,
// sequence operations, and bad input as clear errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "tiny_model.h"
#include "warmctx/assembler.h"
#include "warmctx/sampling.h"
#include "engine/engine_adapters.h"

namespace warmctx {
namespace {

using testing::open_tiny;
using testing::random_tokens;
using testing::tiny_options;

TEST(Engine, LoadsTheTinyModel) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->model().architecture, "qwen2");
    EXPECT_GT(e->model().n_vocab, 150000);  // the real Qwen2 vocabulary
    EXPECT_EQ(e->model().n_layer, 2);
    EXPECT_GE(e->model().n_ctx_train, 47000);
    EXPECT_FALSE(e->model().chat_template.empty());
    EXPECT_EQ(e->context().n_ctx_seq, 2048u);
    // 2 layers * (K + V) * 2 KV heads * head dim 16 * 2 bytes (f16)
    EXPECT_EQ(e->context().kv_bytes_per_token, 2u * 2u * 2u * 16u * 2u);
}

TEST(Engine, MissingModelIsNotFound) {
    auto o = tiny_options();
    o.model_path = std::string(WARMCTX_TEST_TMP) + "/does-not-exist.gguf";
    auto e = engine::open(o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().code(), status_code::not_found);
}

TEST(Engine, NonGgufFileIsInvalidArgument) {
    const std::string p = std::string(WARMCTX_TEST_TMP) + "/not-a-model.gguf";
    std::ofstream(p) << "this is not a model";
    auto o = tiny_options();
    o.model_path = p;
    auto e = engine::open(o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().code(), status_code::invalid_argument);
    EXPECT_NE(e.error().message().find("not a GGUF"), std::string::npos);
}

TEST(Engine, TruncatedGgufIsAnErrorNotACrash) {
    const std::string p = std::string(WARMCTX_TEST_TMP) + "/truncated.gguf";
    {
        std::ifstream in(WARMCTX_TINY_MODEL, std::ios::binary);
        std::vector<char> head(4096);
        in.read(head.data(), (std::streamsize)head.size());
        std::ofstream(p, std::ios::binary).write(head.data(), in.gcount());
    }
    auto o = tiny_options();
    o.model_path = p;
    auto e = engine::open(o);
    EXPECT_FALSE(e.ok());
}

TEST(Engine, UnknownKvTypeIsInvalidArgument) {
    auto o = tiny_options();
    o.kv_type = "q3_x";
    auto e = engine::open(o);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.error().code(), status_code::invalid_argument);
    EXPECT_NE(e.error().message().find("q3_x"), std::string::npos);
}

TEST(Engine, EmptyPromptAndTooLongPromptAreErrors) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->prefill(0, {}, 0, {}).code(), status_code::invalid_argument);
    auto too_long = random_tokens(2049, 5, e->model().n_vocab);
    EXPECT_EQ(e->prefill(0, too_long, 0, {}).code(), status_code::out_of_range);
    EXPECT_EQ(e->seq_n_tokens(0), 0);  // nothing half-written
    std::vector<token_id> bad = {1, 2, -5};
    EXPECT_EQ(e->prefill(0, bad, 0, {}).code(), status_code::invalid_argument);
    EXPECT_EQ(e->prefill(99, random_tokens(4, 1, 1000), 0, {}).code(), status_code::invalid_argument);
}

TEST(Engine, TokenizesWithTheRealQwenVocabulary) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto t = e->tokenize("<|im_start|>user\nhello world<|im_end|>");
    ASSERT_TRUE(t.ok());
    ASSERT_GE(t->size(), 4u);
    EXPECT_EQ((*t)[0], 151644);  // <|im_start|> is one control token in Qwen2
    auto text = e->detokenize(*t);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, "user\nhello world");  // control tokens are not rendered
    auto words = e->tokenize("hello world", false);
    ASSERT_TRUE(words.ok());
    EXPECT_EQ(words->size(), 2u);
}

TEST(Engine, AppliesTheModelsChatTemplate) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    std::vector<chat_message> m = {{"system", "be brief"}, {"user", "hi"}};
    auto s = e->apply_chat_template(m, true);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    EXPECT_EQ(*s, "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Engine, SeededSamplingIsReproducibleAndSeedSensitive) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto p = random_tokens(40, 9, e->model().n_vocab);
    auto run = [&](seq_id s, uint32_t seed) {
        std::vector<float> l;
        EXPECT_TRUE(e->prefill(s, p, 0, {}, &l).ok());
        sampling_params sp;
        sp.max_tokens = 16;
        sp.temperature = 1.5f;
        sp.top_p = 0.95f;
        sp.top_k = 1000;
        sp.seed = seed;
        auto g = e->generate(s, l, sp);
        EXPECT_TRUE(g.ok());
        return g.ok() ? g->tokens : std::vector<token_id>{};
    };
    auto a = run(0, 7), b = run(1, 7), c = run(2, 8);
    EXPECT_EQ(a.size(), 16u);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
}

// logit_bias and the penalties go through llama.cpp's samplers, greedy or not: +50 on
// two tokens makes them the only candidates; without penalties the greedy choice then
// repeats one of them, with frequency and presence penalties it has to alternate; -100
// bans a token.
TEST(Engine, LogitBiasAndPenaltiesShapeTheChoice) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto p = random_tokens(30, 13, e->model().n_vocab);
    auto run = [&](sampling_params sp) {
        std::vector<float> l;
        e->clear_seq(0);
        EXPECT_TRUE(e->prefill(0, p, 0, {}, &l).ok());
        sp.max_tokens = 12;
        auto g = e->generate(0, l, sp);
        EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().to_string());
        return g.ok() ? g->tokens : std::vector<token_id>{};
    };
    const token_id a = 1000, b = 2000;
    sampling_params sp;
    sp.logit_bias = {{a, 50.0f}, {b, 50.0f}};
    auto plain = run(sp);
    ASSERT_EQ(plain.size(), 12u);
    for (token_id t : plain) EXPECT_EQ(t, plain[0]) << "greedy repeats the best of the two";
    EXPECT_TRUE(plain[0] == a || plain[0] == b);
    sp.frequency_penalty = 2.0f;
    sp.presence_penalty = 2.0f;
    auto penalized = run(sp);
    ASSERT_EQ(penalized.size(), 12u);
    EXPECT_NE(std::count(penalized.begin(), penalized.end(), a), 0);
    EXPECT_NE(std::count(penalized.begin(), penalized.end(), b), 0);
    EXPECT_EQ(std::count(penalized.begin(), penalized.end(), a) + std::count(penalized.begin(), penalized.end(), b), 12);

    sampling_params ban;
    auto free_run = run(ban);
    ASSERT_FALSE(free_run.empty());
    ban.logit_bias = {{free_run[0], -100.0f}};
    auto banned = run(ban);
    ASSERT_FALSE(banned.empty());
    EXPECT_NE(banned[0], free_run[0]);

    sampling_params bad;
    bad.logit_bias = {{e->model().n_vocab, 1.0f}};
    std::vector<float> l;
    e->clear_seq(0);
    ASSERT_TRUE(e->prefill(0, p, 0, {}, &l).ok());
    EXPECT_EQ(e->generate(0, l, bad).error().code(), status_code::invalid_argument);
}

// A grammar decides what may be generated: only "yes" or "no", then the end.
TEST(Engine, AGrammarConstrainsTheOutput) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto p = random_tokens(25, 17, e->model().n_vocab);
    for (float temperature : {0.0f, 1.0f}) {
        std::vector<float> l;
        e->clear_seq(0);
        ASSERT_TRUE(e->prefill(0, p, 0, {}, &l).ok());
        sampling_params sp;
        sp.max_tokens = 16;
        sp.temperature = temperature;
        sp.seed = 5;
        sp.grammar = R"(root ::= "yes" | "no")";
        auto g = e->generate(0, l, sp);
        ASSERT_TRUE(g.ok()) << g.error().to_string();
        EXPECT_TRUE(g->text == "yes" || g->text == "no") << g->text;
        EXPECT_EQ(g->finish, finish_reason::eos);
    }
    sampling_params bad;
    bad.grammar = "root ::= (";
    std::vector<float> l;
    e->clear_seq(0);
    ASSERT_TRUE(e->prefill(0, p, 0, {}, &l).ok());
    EXPECT_EQ(e->generate(0, l, bad).error().code(), status_code::invalid_argument);
}

// Greedy under a grammar that refuses the first maximum takes the first maximum of what it
// allows (lowest id among equal logits), wherever that token ranks: the grammar checks the
// best candidates first, in growing batches, and must find the same token as a check of
// the whole vocabulary.
TEST(Engine, GreedyUnderAGrammarTakesTheFirstMaximumItAllows) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    const int32_t n = e->model().n_vocab;
    std::vector<bool> allowed((size_t)n);
    size_t n_allowed = 0;
    for (token_id t = 0; t < n; ++t) {
        const std::string piece = e->token_piece(t);
        bool ok = false;
        for (const char * w : {"yes", "no", "maybe"}) ok |= !piece.empty() && std::string(w).rfind(piece, 0) == 0;
        allowed[(size_t)t] = ok;
        n_allowed += ok;
    }
    ASSERT_GT(n_allowed, 3u);
    sampling_params sp;
    sp.temperature = 0;
    sp.grammar = R"(root ::= "yes" | "no" | "maybe")";
    std::mt19937 rng(3);
    for (int round = 0; round < 24; ++round) {
        // Integer logits: every value is shared by ~150 tokens (ties), and the allowed
        // tokens rank anywhere - in the first batch, a later one, or (round 0) last.
        std::vector<float> l((size_t)n);
        for (auto & v : l) v = (float)(rng() % 1000);
        if (round == 0)
            for (token_id t = 0; t < n; ++t)
                if (allowed[(size_t)t]) l[(size_t)t] = -1.0f;
        token_id want = -1;
        for (token_id t = 0; t < n; ++t)
            if (allowed[(size_t)t] && (want < 0 || l[(size_t)t] > l[(size_t)want])) want = t;
        auto s = token_sampler::make(sp, *e);
        ASSERT_TRUE(s.ok()) << s.error().to_string();
        EXPECT_EQ((*s)->sample(l), want) << "round " << round;
    }
}

// A lazy grammar binds from its trigger on. Its first pick is taken as the logits' first
// maximum (the untriggered grammar leaves them alone) - and the grammar must still see
// that pick: a trigger picked first binds the second.
TEST(Engine, ALazyGrammarTriggeredByTheFirstTokenBindsTheNext) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto one = [&](const char * text) {
        auto t = e->tokenize(text, false);
        EXPECT_TRUE(t.ok() && t->size() == 1u) << text;
        return t.ok() && !t->empty() ? (*t)[0] : token_id{0};
    };
    const token_id trigger = one("hello"), x = one("x"), other = one("abc");
    sampling_params sp;
    sp.grammar = R"(root ::= "hello" "x")";
    sp.grammar_lazy = true;
    sp.grammar_trigger_words = {"hello"};
    auto s = token_sampler::make(sp, *e);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    std::vector<float> l((size_t)e->model().n_vocab, 0.0f);
    l[(size_t)trigger] = 10.0f;
    l[(size_t)other] = 9.0f;
    EXPECT_EQ((*s)->sample(l), trigger);
    std::fill(l.begin(), l.end(), 0.0f);
    l[(size_t)other] = 10.0f;
    l[(size_t)x] = 5.0f;
    EXPECT_EQ((*s)->sample(l), x) << "the trigger, picked first, binds the grammar";
}

// A reasoning budget: once the reasoning the prompt opened has taken its budget of
// tokens, the closing text is forced, token by token, and the rest is sampled again.
// Reasoning that never opened is left alone; with no budget nothing is forced.
TEST(Engine, AReasoningBudgetClosesTheReasoningForTheModel) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto p = random_tokens(24, 29, e->model().n_vocab);
    auto run = [&](const sampling_params & sp) {
        std::vector<float> l;
        e->clear_seq(0);
        EXPECT_TRUE(e->prefill(0, p, 0, {}, &l).ok());
        auto g = e->generate(0, l, sp);
        EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().to_string());
        return g.ok() ? *g : generation{};
    };
    sampling_params base;
    base.max_tokens = 12;
    const generation free = run(base);
    ASSERT_EQ(free.tokens.size(), 12u);
    auto close = e->tokenize("</think>", true);
    ASSERT_TRUE(close.ok());

    sampling_params sp = base;
    sp.reasoning_budget = 3;
    sp.reasoning_start = "<think>";
    sp.reasoning_ends = {"</think>"};
    sp.reasoning_prompt = "<|im_start|>assistant\n<think>\n";
    const generation g = run(sp);
    ASSERT_GE(g.tokens.size(), 3 + close->size());
    EXPECT_TRUE(std::equal(g.tokens.begin(), g.tokens.begin() + 3, free.tokens.begin()));
    EXPECT_TRUE(std::equal(close->begin(), close->end(), g.tokens.begin() + 3));
    EXPECT_NE(g.text.find("</think>"), std::string::npos) << g.text;

    sampling_params closed = sp;  // the prompt's reasoning is closed already
    closed.reasoning_prompt = "<think>\nr\n</think>\n\n";
    closed.reasoning_budget = 0;
    EXPECT_EQ(run(closed).tokens, free.tokens);
    sampling_params none = sp;  // no budget
    none.reasoning_budget = -1;
    EXPECT_EQ(run(none).tokens, free.tokens);

    // A budget of none (Ollama's think: false): closed at once, and only once - the open
    // the prompt ends with is not found again by the searches after the close (it was,
    // and the close forced again in the answer: under a JSON schema's grammar a 500).
    sampling_params zero = sp;
    zero.reasoning_budget = 0;
    zero.reasoning_prompt = "<think>";
    zero.reasoning_ends = {"</think>", std::string(48, '#')};  // a long end looks back further (gpt-oss's)
    const generation z = run(zero);
    ASSERT_GE(z.tokens.size(), close->size() + 4);
    EXPECT_TRUE(std::equal(close->begin(), close->end(), z.tokens.begin()));
    EXPECT_EQ(z.text.find("</think>"), z.text.rfind("</think>")) << z.text;
}

TEST(Engine, StopStringEndsGeneration) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto p = random_tokens(20, 11, e->model().n_vocab);
    std::vector<float> l;
    ASSERT_TRUE(e->prefill(0, p, 0, {}, &l).ok());
    sampling_params sp;
    sp.max_tokens = 12;
    auto g = e->generate(0, l, sp);
    ASSERT_TRUE(g.ok());
    ASSERT_GE(g->tokens.size(), 4u);
    // Use the piece of the third token as a stop string: generation must stop there.
    std::string stop = e->token_piece(g->tokens[2]);
    ASSERT_FALSE(stop.empty());
    e->clear_seq(0);
    ASSERT_TRUE(e->prefill(0, p, 0, {}, &l).ok());
    sp.stop = {stop};
    auto g2 = e->generate(0, l, sp);
    ASSERT_TRUE(g2.ok());
    EXPECT_EQ(g2->finish, finish_reason::stop);
    EXPECT_EQ(g2->text.find(stop), std::string::npos);
    EXPECT_LE(g2->tokens.size(), 3u);
}

TEST(Engine, CopyTrimClear) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto p = random_tokens(100, 3, e->model().n_vocab);
    ASSERT_TRUE(e->prefill(0, p, 0, {}).ok());
    EXPECT_EQ(e->seq_n_tokens(0), 100);
    ASSERT_TRUE(e->copy_seq(0, 1).ok());
    EXPECT_EQ(e->seq_n_tokens(1), 100);
    ASSERT_TRUE(e->trim_seq(1, 40).ok());
    EXPECT_EQ(e->seq_n_tokens(1), 40);
    EXPECT_EQ(e->seq_n_tokens(0), 100);  // the source is untouched
    e->clear_seq(0);
    EXPECT_EQ(e->seq_n_tokens(0), 0);
    EXPECT_EQ(e->seq_n_tokens(1), 40);
    EXPECT_FALSE(e->copy_seq(0, 17).ok());
}

// copy_seq leaves the data to llama.cpp's next decode: a state read (or a load into the
// source) before it sees the destination without it. copy_seq_now copies at once: the
// destination's saved state is the source's, byte for byte, before any other decode, and
// a load into the source right after does not reach the copy.
TEST(Engine, CopySeqNowCopiesTheDataBeforeItReturns) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto p = random_tokens(100, 3, e->model().n_vocab);
    ASSERT_TRUE(e->prefill(0, p, 0, {}).ok());
    auto src = e->save_seq(0);
    ASSERT_TRUE(src.ok());
    ASSERT_TRUE(e->copy_seq_now(0, 1).ok());
    EXPECT_EQ(e->seq_n_tokens(1), 100);
    auto other = random_tokens(60, 4, e->model().n_vocab);
    ASSERT_TRUE(e->prefill(2, other, 0, {}).ok());
    auto other_state = e->save_seq(2);
    ASSERT_TRUE(other_state.ok());
    ASSERT_TRUE(e->load_seq(0, *other_state).ok());  // the source changes before any decode
    auto dst = e->save_seq(1);
    ASSERT_TRUE(dst.ok());
    EXPECT_TRUE(*dst == *src);
    // The lazy copy, for contrast: its destination read at once is not the source.
    ASSERT_TRUE(e->copy_seq(2, 3).ok());
    auto lazy = e->save_seq(3);
    EXPECT_TRUE(!lazy.ok() || *lazy != *other_state);
}

// save_seq's bytes are one stream's state with seq id 0: the same for the same KV from any
// sequence; load_seq takes only that form, and a state longer than a sequence here is
// out_of_range, not llama.cpp's error.
TEST(Engine, SavedStateIsOneStreamsAndLoadRefusesWhatDoesNotFit) {
    auto e = open_tiny(kv_mode::exact, 4);
    ASSERT_TRUE(e);
    auto p = random_tokens(300, 5, e->model().n_vocab);
    ASSERT_TRUE(e->prefill(0, p, 0, {}).ok());
    ASSERT_TRUE(e->prefill(3, p, 0, {}).ok());
    auto a = e->save_seq(0), b = e->save_seq(3);
    ASSERT_TRUE(a.ok() && b.ok()) << (a.ok() ? b.error() : a.error()).to_string();
    EXPECT_EQ(*a, *b);
    auto u32_at = [](const std::vector<uint8_t> & v, size_t at) {
        uint32_t x;
        std::memcpy(&x, v.data() + at, 4);
        return x;
    };
    EXPECT_EQ(u32_at(*a, 4), 0u);    // seq id
    EXPECT_EQ(u32_at(*a, 8), 1u);    // KV streams
    EXPECT_EQ(u32_at(*a, 12), 300u); // cells
    // An empty sequence round-trips too.
    auto empty = e->save_seq(1);
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(empty->size(), 16u);
    ASSERT_TRUE(e->load_seq(2, *empty).ok());
    EXPECT_EQ(e->seq_n_tokens(2), 0);
    // Anything but that form is corrupt: llama.cpp's own multi-stream form, another seq
    // id, a byte too many or too few.
    auto patched = [&](size_t at, uint32_t v) {
        auto c = *a;
        std::memcpy(c.data() + at, &v, 4);
        return c;
    };
    EXPECT_EQ(e->load_seq(2, patched(8, 4)).code(), status_code::corrupt);
    EXPECT_EQ(e->load_seq(2, patched(4, 3)).code(), status_code::corrupt);
    auto longer = *a;
    longer.push_back(0);
    EXPECT_EQ(e->load_seq(2, longer).code(), status_code::corrupt);
    EXPECT_EQ(e->load_seq(2, std::span<const uint8_t>(a->data(), a->size() - 1)).code(), status_code::corrupt);
    EXPECT_EQ(e->seq_n_tokens(2), 0);
    // A context whose sequences hold fewer tokens than the state: out_of_range.
    auto o = tiny_options(kv_mode::exact, 2);
    o.n_ctx = 256;
    auto small = engine::open(o);
    ASSERT_TRUE(small.ok()) << small.error().to_string();
    status st = (*small)->load_seq(0, *a);
    EXPECT_EQ(st.code(), status_code::out_of_range) << st.to_string();
    EXPECT_EQ((*small)->seq_n_tokens(0), 0);
}

// truncate_seq_state cuts a saved state in RAM to a shorter prefix: the same bytes as the
// state of that prefix prefilled alone (cut at a chunk start), in both forms and with V
// transposed (no flash attention) or not; and a state whose cells are not positions
// 0..k-1 in order, or which holds fewer tokens, is refused.
TEST(Engine, ASavedStateCutInRamEqualsTheShorterPrefixsState) {
    for (bool fa : {false, true}) {
        SCOPED_TRACE(fa ? "flash attention" : "V transposed");
        auto o = tiny_options(kv_mode::exact, 3);
        o.flash_attn = fa;
        auto r = engine::open(o);
        ASSERT_TRUE(r.ok()) << r.error().to_string();
        engine & e = **r;
        auto p = random_tokens(300, 11, e.model().n_vocab);
        ASSERT_TRUE(e.prefill(0, p, 0, {}).ok());
        ASSERT_TRUE(e.prefill(1, std::span<const token_id>(p.data(), 128), 0, {}).ok());
        auto whole = e.save_seq(0), part = e.save_seq(1);
        ASSERT_TRUE(whole.ok() && part.ok());
        auto cut = *whole;
        ASSERT_TRUE(truncate_seq_state(cut, 128).ok());
        EXPECT_EQ(cut, *part);
        // llama.cpp's own layout (three streams, seq 0's cells in the first).
        auto raw_whole = e.save_seq_raw(0), raw_part = e.save_seq_raw(1);
        ASSERT_TRUE(raw_whole.ok() && raw_part.ok());
        auto raw_cut = *raw_whole;
        ASSERT_TRUE(truncate_seq_state(raw_cut, 128).ok());
        auto portable = e.portable_state(raw_cut);
        ASSERT_TRUE(portable.ok()) << portable.error().to_string();
        EXPECT_EQ(*portable, *part);
        ASSERT_TRUE(e.load_seq_raw(2, raw_cut).ok());
        EXPECT_EQ(e.seq_n_tokens(2), 128);
        // To nothing: an empty state, which loads as one.
        auto none = *whole;
        ASSERT_TRUE(truncate_seq_state(none, 0).ok());
        EXPECT_EQ(none.size(), 16u);
        ASSERT_TRUE(e.load_seq(2, none).ok());
        EXPECT_EQ(e.seq_n_tokens(2), 0);
        // More than it holds; cells out of order; not a state at all.
        auto more = *whole;
        EXPECT_EQ(truncate_seq_state(more, 301).code(), status_code::out_of_range);
        auto swapped = *whole;
        std::swap_ranges(swapped.begin() + 16, swapped.begin() + 20, swapped.begin() + 28);  // cells 0 and 1's pos
        EXPECT_EQ(truncate_seq_state(swapped, 128).code(), status_code::corrupt);
        std::vector<uint8_t> junk(64, 0xab);
        EXPECT_EQ(truncate_seq_state(junk, 1).code(), status_code::corrupt);
        auto short_by_one = *whole;
        short_by_one.pop_back();
        EXPECT_EQ(truncate_seq_state(short_by_one, 10).code(), status_code::corrupt);
    }
}

// With flash attention on the CPU a batch of fewer than 64 rows deep in a sequence is
// padded to 64 (engine::pad_rows: llama.cpp computes fewer rows one at a time): the rule
// answers by the cost model, never without flash attention, and a padded prefill leaves
// no trace: the sequence holds its own tokens only, its state is byte for byte a second
// prefill's, and what follows it is the same.
TEST(Engine, ASmallBatchDeepInASequenceIsPaddedOnTheCpuAndLeavesNoTrace) {
    auto o = tiny_options(kv_mode::exact, 2);
    o.flash_attn = true;
    o.chunk_tokens = 512;
    o.free_splits = false;  // the cost model (where splits are free every short call is padded)
    auto e = engine::open(o);
    ASSERT_TRUE(e.ok()) << e.error().to_string();
    engine & en = **e;
    ASSERT_TRUE(en.context().pads_rows);
    EXPECT_EQ(en.pad_rows(40, 1536), 24);
    EXPECT_EQ(en.pad_rows(63, 8192), 1);
    EXPECT_EQ(en.pad_rows(4, 8192), 0) << "a few rows alone cost less than 64";
    EXPECT_EQ(en.pad_rows(64, 8192), 0);
    EXPECT_EQ(en.pad_rows(1, 8192), 0);
    // Deeper, fewer rows are worth padding.
    int32_t n_min_1k = 64, n_min_8k = 64;
    for (int32_t n = 63; n >= 1; --n) {
        if (en.pad_rows(n, 1024) > 0) n_min_1k = n;
        if (en.pad_rows(n, 8192) > 0) n_min_8k = n;
    }
    EXPECT_LT(n_min_8k, n_min_1k);
    EXPECT_LT(n_min_8k, 40);

    const auto toks = random_tokens(1600, 11, en.model().n_vocab);
    const std::vector<pos_t> bounds = {1536, 1576};  // chunks: 3 x 512, 40 (padded), 24
    ASSERT_GT(en.pad_rows(40, 1536), 0);
    std::vector<float> l0, l1;
    ASSERT_TRUE(en.prefill(0, std::span(toks).first(1576), 0, bounds, &l0).ok());
    EXPECT_EQ(en.seq_n_tokens(0), 1576) << "the padding's cells are given back";
    ASSERT_TRUE(en.prefill(1, std::span(toks).first(1576), 0, bounds, &l1).ok());
    EXPECT_EQ(l0, l1);
    auto s0 = en.save_seq(0), s1 = en.save_seq(1);
    ASSERT_TRUE(s0.ok() && s1.ok());
    EXPECT_EQ(*s0, *s1);
    // The next chunk after a padded one.
    ASSERT_TRUE(en.prefill(0, std::span(toks).subspan(1576), 1576, bounds, &l0).ok());
    ASSERT_TRUE(en.prefill(1, std::span(toks).subspan(1576), 1576, bounds, &l1).ok());
    EXPECT_EQ(en.seq_n_tokens(0), 1600);
    EXPECT_EQ(l0, l1);

    o.flash_attn = false;
    auto nofa = engine::open(o);
    ASSERT_TRUE(nofa.ok());
    EXPECT_FALSE((*nofa)->context().pads_rows);
    EXPECT_EQ((*nofa)->pad_rows(40, 8192), 0) << "without flash attention every batch size is cheap per row";
}

// The real (Qwen2) tokenizer may be cut before a line that starts with a letter or digit:
// its text model says so, and a 200 KiB text tokenized in parts, as the assembler does,
// equals the whole text tokenized at once.
TEST(Engine, TheQwenTokenizerMayBeCutAtLineStarts) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto tm = make_engine_text_model(*e);
    EXPECT_TRUE(tm->plain_splits_at_lines());
    std::string text;
    for (int i = 0; text.size() < (200u << 10); ++i)
        text += (i % 4 == 0 ? "    " : i % 4 == 1 ? "}\n" : "") + std::string("int value_") + std::to_string(i) +
                " = compute(\"x y\", " + std::to_string(i * 7) + ");\n";
    std::vector<segment> segs = {{"map", segment_kind::repo_map, "", "", text}};
    // The same text model, but never cut.
    struct whole_only final : text_model {
        const text_model & m;
        explicit whole_only(const text_model & x) : m(x) {}
        result<std::vector<token_id>> tokenize(std::string_view t) const override { return m.tokenize(t); }
        result<std::vector<token_id>> tokenize_plain(std::string_view t) const override { return m.tokenize_plain_part(t); }
        result<std::string> render_message(std::string_view r, std::string_view c) const override {
            return m.render_message(r, c);
        }
        std::string generation_prompt() const override { return m.generation_prompt(); }
        bool renders_conversations() const override { return m.renders_conversations(); }
        bool renders_contents_verbatim() const override { return m.renders_contents_verbatim(); }
        result<rendered_conversation> render_conversation(std::span<const conversation_message> c, std::string_view t,
                                                          bool g) const override {
            return m.render_conversation(c, t, g);
        }
        std::vector<token_id> prefix_tokens() const override { return m.prefix_tokens(); }
    } whole(*tm);
    auto cut = assemble(segs, kind_table{}, *tm, profile{}, "salt", 512, false);
    ASSERT_TRUE(cut.ok()) << cut.error().to_string();
    auto at_once = assemble(segs, kind_table{}, whole, profile{}, "salt", 512, false);
    ASSERT_TRUE(at_once.ok()) << at_once.error().to_string();
    EXPECT_GT(cut->tokens.size(), 40000u);
    EXPECT_EQ(cut->tokens, at_once->tokens);
}

// The real (Qwen2) tokenizer may also be cut before any line that is not blank
// (is_any_line_cut: indented code, braces, comments), which a stable segment's finer
// blocks use: its text model says so, and a text of many kinds of lines, cut before
// every such line, tokenizes to the whole text's tokens. A cut before a blank line would
// not.
TEST(Engine, TheQwenTokenizerMayBeCutBeforeAnyLineThatIsNotBlank) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto tm = make_engine_text_model(*e);
    ASSERT_TRUE(tm->plain_splits_at_any_line());
    static const char * const kinds[] = {
        "    int value = compute(a, b);\n", "\t\treturn x;\n", "}\n", "  }  \n", "\n", "    \n", "\t\n",
        "// a comment, with 'quotes'\n", "#include <map>\n", "        if (x) { y(); }\r\n", "\r\n",
        "  - item \xc3\xa9t\xc3\xa9\n", "   \xe4\xb8\xad\xe6\x96\x87 text\n", "def f(x):\n", "    's'\n",
        "@@ -1,2 +1,2 @@\n", "+    added;\n", "-\told;\n", "<p>\n", "  </p>\n", "12 + 34\n", " x\n", "!\n"};
    std::mt19937 rng(7);
    std::string text;
    while (text.size() < (64u << 10)) text += kinds[rng() % std::size(kinds)];
    std::vector<size_t> cuts;
    for (size_t p = 1; p < text.size(); ++p)
        if (is_any_line_cut(text, p)) cuts.push_back(p);
    ASSERT_GT(cuts.size(), 1000u);
    auto whole = tm->tokenize_plain(text);
    ASSERT_TRUE(whole.ok()) << whole.error().to_string();
    std::vector<token_id> joined;
    size_t from = 0;
    cuts.push_back(text.size());
    for (size_t c : cuts) {
        auto part = tm->tokenize_plain_part(text.substr(from, c - from));
        ASSERT_TRUE(part.ok()) << part.error().to_string();
        joined.insert(joined.end(), part->begin(), part->end());
        from = c;
    }
    EXPECT_EQ(joined, *whole);
    // The rule is not vacuous: a cut before a blank line, with or without spaces, changes
    // this tokenizer's tokens (the line breaks and the spaces between them are one word).
    for (std::string_view t : {std::string_view("x\n\n    y();\n"), std::string_view("x\n    \n    y();\n"), std::string_view("x\n  \n\ty\n")}) {
        const size_t p = t.find('\n') + 1;
        EXPECT_FALSE(is_any_line_cut(t, p));
        auto w = tm->tokenize_plain(t);
        auto a = tm->tokenize_plain_part(t.substr(0, p));
        auto b = tm->tokenize_plain_part(t.substr(p));
        ASSERT_TRUE(w.ok() && a.ok() && b.ok());
        a->insert(a->end(), b->begin(), b->end());
        EXPECT_NE(*a, *w) << "a cut the rule refuses would have been harmless: " << t;
    }
}

// The text model remembers tokenizations (the template's text between contents repeats
// every turn): asked again, it answers what the tokenizer does, and text with special
// tokens is never answered from what the same text gave as plain text, or back.
TEST(Engine, RememberedTokenizationsEqualTheTokenizersAndKeepSpecialApartFromPlain) {
    auto e = open_tiny();
    ASSERT_TRUE(e);
    auto tm = make_engine_text_model(*e);
    const std::string tmpl = "<|im_end|>\n<|im_start|>user\n# Tools\n\nYou may call one or more functions.\n" +
                             std::string(300, 'x') + "\n<|im_start|>assistant\n";
    auto special = e->tokenize(tmpl, true);
    auto plain = e->tokenize(tmpl, false);
    ASSERT_TRUE(special.ok() && plain.ok());
    ASSERT_NE(*special, *plain);  // the special tokens are single tokens only in the first
    for (int round = 0; round < 3; ++round) {
        auto s1 = tm->tokenize(tmpl);
        auto p1 = tm->tokenize_plain(tmpl);
        ASSERT_TRUE(s1.ok() && p1.ok());
        EXPECT_EQ(*s1, *special) << "round " << round;
        EXPECT_EQ(*p1, *plain) << "round " << round;
    }
    // Plain first, then special, on a text neither has seen.
    const std::string other = tmpl + "<|im_end|>";
    auto p2 = tm->tokenize_plain(other);
    auto s2 = tm->tokenize(other);
    ASSERT_TRUE(p2.ok() && s2.ok());
    EXPECT_EQ(*p2, *e->tokenize(other, false));
    EXPECT_EQ(*s2, *e->tokenize(other, true));
    // Short texts too (role names, headers).
    for (const char * t : {"user", "<|im_start|>", "\n"}) {
        EXPECT_EQ(*tm->tokenize(t), *e->tokenize(t, true)) << t;
        EXPECT_EQ(*tm->tokenize(t), *e->tokenize(t, true)) << t;
    }
}

// Greedy decoding's pick: the first maximum, as std::max_element gives it, whatever the
// length (blocks of 16 and a rest), ties, signed zeros, infinities and NaNs.
TEST(FirstMaxIndex, IsWhatMaxElementGives) {
    std::mt19937 rng(7);
    auto check = [](const std::vector<float> & l) {
        const size_t want = l.empty() ? 0 : (size_t)(std::max_element(l.begin(), l.end()) - l.begin());
        EXPECT_EQ(first_max_index(l), want) << "n " << l.size();
    };
    for (size_t n : {0u, 1u, 15u, 16u, 17u, 33u, 1000u, 151936u}) {
        std::vector<float> l(n);
        for (float & x : l) x = (float)(int)(rng() % 50) * 0.5f;  // many ties
        check(l);
        if (n > 3) {
            l[n / 2] = NAN;  // never the pick
            l[n - 1] = 1e9f;
            check(l);
            l[0] = NAN;  // first: max_element keeps it
            check(l);
        }
    }
    check({-0.0f, 0.0f, -1.0f});
    check({-INFINITY, -INFINITY});
    check(std::vector<float>(40, -INFINITY));
    std::vector<float> z(40, -1.0f);
    z[20] = 0.0f, z[21] = -0.0f, z[37] = 0.0f;
    check(z);
}

}  // namespace
}  // namespace warmctx
