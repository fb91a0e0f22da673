// A hybrid model's checkpoints (its recurrent state at block ends, warmctx/engine.h): how
// many a stream keeps over a long conversation, which block ends a prefill takes them at,
// and a turn resuming from the one before a block end that has none - always equal to a
// cold run.
#include <gtest/gtest.h>

#include <cstring>

#include "tiny_model.h"
#include "warmctx/context_engine.h"
#include "workload/workload.h"

namespace warmctx {
namespace {

std::unique_ptr<context_engine> open_hybrid(uint32_t max_count, int32_t gap, uint32_t chunk_tokens = 64,
                                            cache_budget budget = {}) {
    context_engine_options o;
    o.budget = std::move(budget);
    o.engine = testing::tiny_options();
    o.engine.chunk_tokens = chunk_tokens;
    o.engine.model_path = std::string(WARMCTX_TEST_TMP) + "/tiny-hybrid-q8_0-seed1.gguf";
    o.engine.n_ctx = 4096;
    o.n_work_seqs = 2;
    o.n_holders = 16;
    o.stream_checkpoint_max_count = max_count;
    o.checkpoint_gap_tokens = gap;
    auto r = context_engine::open(o);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? std::move(r.value()) : nullptr;
}

// A workspace and a conversation of `n_history` earlier messages, then the question.
turn_request conversation(int n_history, const std::string & question, uint64_t seed = 7) {
    workload_generator g(seed, [](const std::string & s) { return s.size() / 3; });
    turn_request r;
    r.workspace = "a";
    r.segments = make_workspace(g, 500, 2);
    const segment q = r.segments.back();
    r.segments.pop_back();
    for (int i = 0; i < n_history; ++i) {
        segment h;
        h.id = "h" + std::to_string(i);
        h.kind = segment_kind::history;
        h.role = i % 2 == 0 ? "user" : "assistant";
        h.content = "message " + std::to_string(i) + ": the tests under src/ pass, next the docs";
        r.segments.push_back(h);
    }
    segment u = q;
    u.content = question;
    r.segments.push_back(u);
    r.sampling.max_tokens = 2;
    r.keep_logits = true;
    return r;
}

uint64_t held(const context_engine & ce) {
    const kv_memory m = ce.counters().memory;
    return m.checkpoint_size_bytes == 0 ? 0 : m.checkpoint_bytes / m.checkpoint_size_bytes;
}

void expect_cold(context_engine & ce, const turn_request & req, const turn_result & warm) {
    auto c = ce.run_cold(req);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    EXPECT_EQ(warm.gen.tokens, c->gen.tokens);
    ASSERT_EQ(warm.prompt_logits.size(), c->prompt_logits.size());
    EXPECT_EQ(0, std::memcmp(warm.prompt_logits.data(), c->prompt_logits.data(), c->prompt_logits.size() * 4));
}

// A conversation takes checkpoints every turn; a stream keeps at most its count of them
// (they would grow without bound: 52.7 MB each for a 4B hybrid), and the turns still
// resume in place, equal to cold. The time they took is named apart from the prefill.
TEST(Checkpoints, ALongConversationKeepsAtMostItsCountPerStream) {
    auto ce = open_hybrid(6, 0);
    auto all = open_hybrid(1000, 0);
    ASSERT_TRUE(ce && all);
    for (int turn = 0; turn < 8; ++turn) {
        const turn_request req = conversation(2 * turn, "question " + std::to_string(turn));
        auto t = ce->run_turn(req);
        ASSERT_TRUE(t.ok()) << t.error().to_string();
        EXPECT_LE(held(*ce), 6u) << "turn " << turn;
        // The last turn's are kept: each turn reuses what it would with every checkpoint
        // (until the history is deep enough to be packed into spans, turn 6: its block
        // ends change, and an old checkpoint the bounded stream let go may be one again).
        auto u = all->run_turn(req);
        ASSERT_TRUE(u.ok()) << u.error().to_string();
        if (turn < 6) EXPECT_EQ(t->explain.n_reused, u->explain.n_reused) << "turn " << turn;
        if (turn == 0) EXPECT_GT(t->t_checkpoint_ms, 0.0);
        if (turn > 0) {
            EXPECT_TRUE(t->explain.in_place) << "turn " << turn << ": " << t->explain.reason;
            EXPECT_GT(t->explain.n_reused, 0) << "turn " << turn;
        }
        if (turn == 7) expect_cold(*ce, req, *t);
    }
    EXPECT_GT(ce->counters().memory.n_checkpoints_thinned, 0u);
    EXPECT_EQ(ce->counters().memory.n_reuse_refused, 0u);
    // Those thinned gave their buffers back for the next ones: allocated, and counted so
    // (at most two kept; on the CPU no page-locked buffer).
    const kv_memory m = ce->counters().memory;
    EXPECT_GE(m.state_scratch_bytes, m.checkpoint_size_bytes);
    EXPECT_LE(m.state_scratch_bytes, 2 * m.checkpoint_size_bytes);
    EXPECT_EQ(m.allocated_bytes,
              m.streams_allocated_bytes + m.pool_allocated_bytes + m.checkpoint_bytes + m.state_scratch_bytes);
}

// Block ends nearer than the gap to the next one kept get no checkpoint (but the last two
// and the cacheable end do). A later turn that shares up to one of those resumes from the
// checkpoint before it - not served cold for want of one - and equals a cold run.
TEST(Checkpoints, ATurnResumesFromTheCheckpointBeforeABlockEndLeftOut) {
    auto every = open_hybrid(64, 0);
    auto gapped = open_hybrid(64, 1 << 20);
    ASSERT_TRUE(every && gapped);
    const turn_request first = conversation(6, "first question");
    auto prompt = gapped->assemble_request(first);
    ASSERT_TRUE(prompt.ok());
    ASSERT_GT(prompt->blocks.size(), 6u);
    ASSERT_TRUE(every->run_turn(first).ok());
    ASSERT_TRUE(gapped->run_turn(first).ok());
    const uint64_t all = every->counters().memory.n_checkpoints_taken;
    const uint64_t few = gapped->counters().memory.n_checkpoints_taken;
    EXPECT_LE(few, 3u);
    EXPECT_LT(few, all);
    // The next turn drops the conversation's earliest message (a window): it shares the
    // workspace up to where the history began, a block end with no checkpoint.
    turn_request next = conversation(6, "second question");
    for (size_t i = 0; i < next.segments.size(); ++i)
        if (next.segments[i].id == "h0") {
            next.segments.erase(next.segments.begin() + (long)i);
            break;
        }
    auto t = gapped->run_turn(next);
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    EXPECT_EQ(gapped->counters().memory.n_reuse_refused, 0u) << t->explain.reason;
    EXPECT_EQ(t->explain.reason.find("could not be reused"), std::string::npos) << t->explain.reason;
    auto e = every->run_turn(next);
    ASSERT_TRUE(e.ok());
    EXPECT_GT(e->explain.n_reused, 0);
    EXPECT_LE(t->explain.n_reused, e->explain.n_reused);
    expect_cold(*gapped, next, *t);
    expect_cold(*every, next, *e);
}

// An agent's turn ends in a long message (a tool's output); its next turn appends the answer
// and a question. However far apart the prefill spaces its checkpoints, it keeps the last
// chunk ends of the prompt, inside that message: the next turn resumes at most one chunk
// before the end of what it shares, not at the message's start, and equals a cold run.
// Spaced by a gap (1 << 20 tokens) or by the checkpoint's memory (chunks of 16: a 38,980-byte
// recurrent state outweighs 3 chunks of 1,024-byte-a-token KV, so checkpoints are at least 48
// tokens apart; that the blocks stay chunks, Assembler.BlocksAreTheCanonicalChunksOfThePrompt).
TEST(Checkpoints, ANextTurnResumesInsideALongLastMessage) {
    for (auto [gap, chunk] : {std::pair{1 << 20, 64}, std::pair{-1, 16}}) {
        SCOPED_TRACE("gap " + std::to_string(gap) + ", chunks of " + std::to_string(chunk));
        auto ce = open_hybrid(64, gap, (uint32_t)chunk);
        ASSERT_TRUE(ce);
        if (gap < 0) ASSERT_EQ(ce->current_profile().checkpoint_tokens, 48u);
        std::string output;
        for (int i = 0; output.size() < 3000; ++i)
            output += "line " + std::to_string(i) + ": src/engine/engine.cpp:" + std::to_string(40 + i) + " ok\n";
        turn_request first = conversation(4, output);
        auto prompt = ce->assemble_request(first);
        ASSERT_TRUE(prompt.ok());
        const auto & msg = prompt->prompt_manifest.segments.back();
        ASSERT_GT(msg.token_end - msg.token_begin, 4 * chunk) << "the message spans several chunks";
        ASSERT_TRUE(ce->run_turn(first).ok());
        turn_request next = first;
        next.segments.back().kind = segment_kind::history;  // the output, now history
        next.segments.back().role = "user";
        next.segments.back().id = "h4";  // history is ordered by id
        segment answer;
        answer.id = "h5";
        answer.kind = segment_kind::history;
        answer.role = "assistant";
        answer.content = "All lines pass.";
        next.segments.push_back(answer);
        segment q = first.segments.back();
        q.id = "q1";
        q.content = "And the docs?";
        next.segments.push_back(q);
        auto t = ce->run_turn(next);
        ASSERT_TRUE(t.ok()) << t.error().to_string();
        EXPECT_GE(t->explain.n_reused, msg.token_end - chunk) << t->explain.reason;
        expect_cold(*ce, next, *t);
    }
}

// The RAM pool's byte budget holds what its prefixes really take: a hybrid's prefix carries
// its recurrent state at its end and at every checkpoint its stream kept, however many.
// The cache charges each prefix at least the bytes the pool holds for it, so the pool never
// holds more than the budget (before, the charge spread one checkpoint over the spacing's
// tokens, and a conversation's prefixes, with a checkpoint at each message, held ~1.5x).
TEST(Checkpoints, ThePoolsByteBudgetCountsEveryCheckpointAPrefixCarries) {
    cache_budget b;
    b.max_bytes = 3u << 20;
    auto ce = open_hybrid(64, 0, 64, b);
    ASSERT_TRUE(ce);
    uint64_t most = 0;
    for (int i = 0; i < 8; ++i) {
        turn_request req = conversation(12, "question " + std::to_string(i), 100 + (uint64_t)i);
        req.workspace = "w" + std::to_string(i);
        auto t = ce->run_turn(req);
        ASSERT_TRUE(t.ok()) << t.error().to_string();
        const auto c = ce->counters();
        EXPECT_LE(c.memory.pool_bytes, b.max_bytes) << "turn " << i << ", " << c.memory.pool_entries << " prefixes";
        EXPECT_GE(c.cache.resident_bytes, c.memory.pool_bytes) << "turn " << i;
        EXPECT_LE(c.cache.resident_bytes, b.max_bytes) << "turn " << i;
        most = std::max(most, c.memory.pool_bytes);
    }
    // The budget bound: the pool filled it, and evicted to stay within it.
    EXPECT_GT(most, b.max_bytes / 2);
    uint64_t evicted = 0;
    for (auto e : ce->counters().cache.evictions_by_class) evicted += e;
    EXPECT_GT(evicted, 0u);
    EXPECT_TRUE(ce->cache().check_invariants().ok());
}

}  // namespace
}  // namespace warmctx
