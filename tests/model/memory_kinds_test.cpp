// Every memory kind reused exactly (warmctx/engine.h, memory_kind): a plain model, a
// sliding-window one (gpt-oss) and a hybrid (Qwen3.5: Gated DeltaNet beside attention),
// each a generated tiny model. A prefix reused in place, copied between streams, cut and
// loaded in llama.cpp's layout (the RAM pool) or the portable one (the disk), or loaded
// whole and then cut, gives the logits of a cold run bit for bit; a cut where the model
// keeps no checkpoint is refused, never served wrong.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "tiny_model.h"
#include "warmctx/engine.h"

namespace warmctx {
namespace {

using testing::random_tokens;

struct kind_case {
    const char * name;
    std::string path;
    memory_kind kind;
};

std::string model_path(const char * file) { return std::string(WARMCTX_TEST_TMP) + "/" + file; }

std::vector<kind_case> cases() {
    return {{"plain", WARMCTX_TINY_MODEL, memory_kind::plain},
            {"sliding_window", model_path("tiny-swa-q8_0-seed1.gguf"), memory_kind::sliding_window},
            {"hybrid", model_path("tiny-hybrid-q8_0-seed1.gguf"), memory_kind::hybrid}};
}

class MemoryKinds : public ::testing::TestWithParam<kind_case> {
  protected:
    std::unique_ptr<engine> open(bool flash_attn = true, const std::string & kv_type = "f16") {
        engine_options o;
        o.model_path = GetParam().path;
        o.n_ctx = 1024;
        o.n_seq_max = 6;
        o.chunk_tokens = 32;
        o.n_threads = 1;
        o.flash_attn = flash_attn;
        o.kv_type = kv_type;
        auto e = engine::open(o);
        EXPECT_TRUE(e.ok()) << e.error().to_string();
        return e.ok() ? std::move(e.value()) : nullptr;
    }
};

bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<token_id> cat(std::vector<token_id> a, const std::vector<token_id> & b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

TEST_P(MemoryKinds, SaysWhatItsMemoryIs) {
    auto e = open();
    ASSERT_TRUE(e);
    const memory_info & mi = e->context().memory;
    EXPECT_EQ(mi.kind, GetParam().kind) << mi.note;
    EXPECT_TRUE(mi.reuse) << mi.note;
    EXPECT_EQ(mi.checkpoints, GetParam().kind != memory_kind::plain);
    EXPECT_FALSE(mi.note.empty());
    if (GetParam().kind == memory_kind::plain) {
        EXPECT_EQ(mi.checkpoint_bytes, 0u);
    } else {
        EXPECT_GT(mi.checkpoint_bytes, 0u);
    }
    if (GetParam().kind == memory_kind::sliding_window) EXPECT_GT(mi.n_swa, 0);
    if (GetParam().kind == memory_kind::hybrid) EXPECT_GT(mi.recurrent_bytes, 0u);
    EXPECT_GT(e->context().kv_bytes_per_token, 0u);
}

// A (a segment), then B or C: the holder prefilled A+B; every path reuses A (and, cut
// deeper back, a chunk end inside A) and prefills the rest; each equals the cold A+C.
void check_every_path(engine & e, bool cut_inside) {
    const int32_t nv = e.model().n_vocab;
    const auto a = random_tokens(200, 1, nv), b = random_tokens(150, 2, nv), c = random_tokens(100, 3, nv);
    const std::vector<pos_t> bounds = {200};
    const pos_t at = cut_inside ? 160 : 200;  // a chunk end (chunks of 32 from 0) or the boundary
    const auto ab = cat(a, b), ac = cat(a, c);
    const std::span<const token_id> tail(ac.data() + at, ac.size() - (size_t)at);
    std::vector<float> cold, warm;
    ASSERT_TRUE(e.prefill(0, ac, 0, bounds, &cold).ok());
    ASSERT_TRUE(e.prefill(1, ab, 0, bounds).ok());

    // Copied to another stream, then cut.
    ASSERT_TRUE(e.copy_seq_now(1, 2).ok());
    ASSERT_TRUE(e.trim_seq(2, at).ok());
    ASSERT_EQ(e.seq_n_tokens(2), at);
    ASSERT_TRUE(e.prefill(2, tail, at, bounds, &warm).ok());
    EXPECT_TRUE(same_bits(cold, warm)) << "stream copy";

    // llama.cpp's layout cut in RAM (the pool), and the portable one (the disk).
    auto raw = e.save_seq_raw(1);
    ASSERT_TRUE(raw.ok()) << raw.error().to_string();
    ASSERT_TRUE(e.truncate_state(*raw, at).ok());
    ASSERT_TRUE(e.load_seq_raw(3, *raw).ok());
    ASSERT_EQ(e.seq_n_tokens(3), at);
    ASSERT_TRUE(e.prefill(3, tail, at, bounds, &warm).ok());
    EXPECT_TRUE(same_bits(cold, warm)) << "pool";

    auto portable = e.save_seq(1);
    ASSERT_TRUE(portable.ok()) << portable.error().to_string();
    auto cut = *portable;
    ASSERT_TRUE(e.truncate_state(cut, at).ok());
    ASSERT_TRUE(e.load_seq(4, cut).ok());
    ASSERT_TRUE(e.prefill(4, tail, at, bounds, &warm).ok());
    EXPECT_TRUE(same_bits(cold, warm)) << "disk";

    // The whole state loaded (a disk restore), then cut in the stream.
    ASSERT_TRUE(e.load_seq(5, *portable).ok());
    ASSERT_EQ(e.seq_n_tokens(5), (pos_t)ab.size());
    ASSERT_TRUE(e.trim_seq(5, at).ok());
    ASSERT_TRUE(e.prefill(5, tail, at, bounds, &warm).ok());
    EXPECT_TRUE(same_bits(cold, warm)) << "loaded, then cut";

    // In place, last: the holder itself cut back.
    ASSERT_TRUE(e.trim_seq(1, at).ok());
    ASSERT_TRUE(e.prefill(1, tail, at, bounds, &warm).ok());
    EXPECT_TRUE(same_bits(cold, warm)) << "in place";
}

TEST_P(MemoryKinds, AReusedPrefixGivesTheColdLogitsThroughEveryPath) {
    for (bool fa : {true, false}) {
        SCOPED_TRACE(fa ? "flash attention" : "no flash attention");
        auto e = open(fa);
        ASSERT_TRUE(e);
        check_every_path(*e, false);
        e->clear_all();
        check_every_path(*e, true);
    }
}

TEST_P(MemoryKinds, AQuantizedKvIsReusedExactlyToo) {
    // The tiny plain model's 16-wide heads take no q8_0 blocks (32); its q8_0 runs are
    // the verify tests'.
    if (GetParam().kind == memory_kind::plain) GTEST_SKIP() << "head size 16";
    auto e = open(true, "q8_0");
    ASSERT_TRUE(e);
    check_every_path(*e, true);
}

// Where the model cannot be cut back without a checkpoint, a cut elsewhere is refused and
// leaves the sequence whole; a saved state is not cut there either.
TEST_P(MemoryKinds, ACutWithoutACheckpointIsRefused) {
    if (GetParam().kind == memory_kind::plain) GTEST_SKIP() << "plain KV is cut anywhere";
    auto e = open();
    ASSERT_TRUE(e);
    const auto t = random_tokens(300, 5, e->model().n_vocab);
    ASSERT_TRUE(e->prefill(0, t, 0, {}).ok());
    EXPECT_EQ(e->checkpoints(0).size(), (300u + 31) / 32);
    auto saved = e->save_seq(0);
    ASSERT_TRUE(saved.ok());
    auto cut = *saved;
    EXPECT_EQ(e->truncate_state(cut, 100).code(), status_code::out_of_range);
    EXPECT_EQ(cut, *saved);  // unchanged
    if (GetParam().kind == memory_kind::hybrid) {
        EXPECT_EQ(e->trim_seq(0, 100).code(), status_code::failed_precondition);
        EXPECT_EQ(e->seq_n_tokens(0), 300);
        // A loaded state holds its checkpoints: cut to one of them, not elsewhere.
        ASSERT_TRUE(e->load_seq(1, *saved).ok());
        EXPECT_EQ(e->trim_seq(1, 100).code(), status_code::failed_precondition);
        EXPECT_TRUE(e->trim_seq(1, 96).ok());
        EXPECT_EQ(e->seq_n_tokens(1), 96);
    }
    // Foreign bytes are refused as corrupt, never loaded.
    std::vector<uint8_t> junk(saved->begin(), saved->begin() + (long)saved->size() / 2);
    EXPECT_FALSE(e->load_seq(2, junk).ok());
    EXPECT_EQ(e->seq_n_tokens(2), 0);
}

// A hybrid stream copied whole (a turn taking another stream's prefix, a stream parked) keeps
// its recurrent state on the device: while another sequence is empty, a token decoded there
// applies the copy, and no state leaves the device or comes back (on a 4B hybrid, 52.7 MB each
// way on the turn's way). Source and copy then continue as the original would, bit for bit,
// whichever moves first. With no sequence empty, the copy decodes into itself and puts its
// state back from a checkpoint: one is taken where it holds none at its end.
TEST_P(MemoryKinds, ACopyOfAHybridStreamKeepsItsStateOnTheDevice) {
    if (GetParam().kind != memory_kind::hybrid) GTEST_SKIP() << "only a recurrent state is saved for a copy";
    auto e = open();
    ASSERT_TRUE(e);
    const int32_t nv = e->model().n_vocab;
    const std::vector<pos_t> none{-1};  // checkpoint_ends: none
    ASSERT_TRUE(e->prefill(0, random_tokens(320, 6, nv), 0, {}).ok());
    ASSERT_TRUE(e->prefill(0, random_tokens(32, 8, nv), 320, {}, nullptr, 0, none).ok());
    ASSERT_EQ(e->checkpoints(0).back(), 320);  // none at its end
    const uint64_t before = e->checkpoints_taken();
    ASSERT_TRUE(e->copy_seq_now(0, 1).ok());
    EXPECT_EQ(e->checkpoints_taken(), before);
    EXPECT_EQ(e->seq_n_tokens(1), 352);
    EXPECT_EQ(e->seq_n_tokens(2), 0);  // the scratch sequence is given back
    const auto next = random_tokens(32, 7, nv);
    std::vector<float> a, b;
    ASSERT_TRUE(e->prefill(0, next, 352, {}, &a, 0, none).ok());  // the source first
    ASSERT_TRUE(e->prefill(1, next, 352, {}, &b, 0, none).ok());
    EXPECT_TRUE(same_bits(a, b));
    // The copy first, then the source.
    ASSERT_TRUE(e->copy_seq_now(1, 2).ok());
    const auto more = random_tokens(32, 9, nv);
    std::vector<float> c, d;
    ASSERT_TRUE(e->prefill(2, more, 384, {}, &c, 0, none).ok());
    ASSERT_TRUE(e->prefill(1, more, 384, {}, &d, 0, none).ok());
    EXPECT_TRUE(same_bits(c, d));
    EXPECT_EQ(e->checkpoints_taken(), before);
    // Every sequence holds tokens: the copy decodes into itself, one checkpoint taken.
    for (seq_id s = 3; s < 6; ++s) ASSERT_TRUE(e->prefill(s, random_tokens(32, 10 + s, nv), 0, {}).ok());
    const uint64_t full = e->checkpoints_taken();
    ASSERT_TRUE(e->copy_seq_now(1, 0).ok());
    EXPECT_EQ(e->checkpoints_taken(), full + 1);
    EXPECT_EQ(e->seq_n_tokens(0), 416);
    std::vector<float> f, g;
    ASSERT_TRUE(e->prefill(0, next, 416, {}, &f, 0, none).ok());
    ASSERT_TRUE(e->prefill(1, next, 416, {}, &g, 0, none).ok());
    EXPECT_TRUE(same_bits(f, g));
    // One that ends at a checkpoint takes no other.
    ASSERT_TRUE(e->prefill(2, random_tokens(32, 11, nv), 416, {}).ok());  // a checkpoint at its end
    const uint64_t at_end = e->checkpoints_taken();
    ASSERT_TRUE(e->copy_seq_now(2, 0).ok());
    EXPECT_EQ(e->checkpoints_taken(), at_end);
}

INSTANTIATE_TEST_SUITE_P(Kinds, MemoryKinds, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<kind_case> & i) { return std::string(i.param.name); });

}  // namespace
}  // namespace warmctx
