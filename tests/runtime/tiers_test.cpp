// The disk tier's write queue (runtime/disk_kv_tier.h), on the in-memory file system behind a
// gate the test holds: a write-through returns while its file is still unwritten, a
// queued snapshot serves lookups and restores from memory, the same prefix is queued
// once, a full queue drops the new write (counted, logged), and destruction finishes
// every queued write. No model: snapshots carry pseudo-KV (disk_kv_tier's queue never looks
// inside the KV), and fetch() is restore() without the engine's load.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "../store/store_test_util.h"
#include "gated_fs.h"
#include "disk_kv_tier.h"

namespace warmctx {
namespace {

using rc = retention_class;
using testing::gate_opener;
using testing::gated_fs;
using testing::make_path;
using testing::snapshot_files;
using testing::snapshot_of;
using testing::test_path;

assembled_prompt prompt_of(const test_path & p) {
    assembled_prompt prompt;
    prompt.tokens = p.tokens;
    prompt.blocks = p.blocks;
    prompt.prompt_manifest = p.prompt_manifest;
    return prompt;
}

std::unique_ptr<disk_kv_tier> open_tiers(file_system & fs, write_queue_options wq = {}) {
    tier_options o;
    o.cache_dir = "/disk";
    o.disk_fs = &fs;
    auto t = disk_kv_tier::open(o, eviction_policy::semantic, 0, std::move(wq));
    EXPECT_TRUE(t.ok()) << t.error().to_string();
    return t.ok() ? std::move(t.value()) : nullptr;
}

constexpr size_t k_kv_bytes = 4096;

// 3 segments of 40 tokens in blocks of 16, 16, 8: 9 blocks; the snapshots hold the
// first two segments (6 blocks, 80 tokens).
snapshot two_segments_of(const test_path & p, const std::string & ws = "ws", uint32_t kv_seed = 7) {
    return snapshot_of(p, 6, ws, kv_seed, k_kv_bytes);
}

uint64_t bytes_of(const snapshot & s) { return s.kv.size() + s.tokens.size() * sizeof(token_id); }

TEST(TierWriteQueue, AWriteThroughReturnsBeforeItsFileIsWrittenAndItsBytesServeARestore) {
    mem_fs mem;
    gated_fs fs(mem);
    auto t = open_tiers(fs);
    ASSERT_TRUE(t);
    gate_opener opener{fs};
    const test_path p = make_path(1, {rc::high, rc::high, rc::none});
    const assembled_prompt prompt = prompt_of(p);
    const snapshot snap = two_segments_of(p);

    fs.close_gate();
    // Returns while the writer cannot write: the caller never waits for the file.
    ASSERT_EQ(t->queue_write(snap), disk_kv_tier::queue_outcome::queued);
    fs.wait_entered(1);  // the writer is in the put, held at the gate
    EXPECT_TRUE(snapshot_files(mem, "/disk").empty());
    write_queue_stats q = t->queue_stats();
    EXPECT_EQ(q.queued_writes, 1u);
    EXPECT_EQ(q.queued_bytes, bytes_of(snap));
    EXPECT_EQ(t->counters().n_writes_disk, 0u);  // a write counts once its file is there

    // Lookups see the queued snapshot; a restore takes its bytes, reading no file.
    disk_kv_tier::hit peeked = t->peek(prompt, 0);
    EXPECT_EQ(peeked.tier, kv_tier::disk);
    EXPECT_EQ(peeked.file.n_blocks, 6u);
    EXPECT_EQ(peeked.at.n_tokens, 80);
    EXPECT_TRUE(peeked.queued);
    auto newest = t->newest_profile("ws");
    ASSERT_TRUE(newest);
    EXPECT_TRUE(*newest == p.prof);
    const uint64_t reads = fs.n_opens_for_read();
    auto [h, bytes] = t->fetch(p.prof, prompt, 0);
    ASSERT_TRUE(bytes);
    EXPECT_EQ(h.tier, kv_tier::disk);
    EXPECT_EQ(h.at.n_tokens, 80);
    EXPECT_EQ(bytes->kv, snap.kv);
    EXPECT_EQ(bytes->tokens, snap.tokens);
    EXPECT_EQ(fs.n_opens_for_read(), reads);
    EXPECT_EQ(t->queue_stats().n_restores_from_queue, 1u);
    // Another profile's queued bytes are a miss, as a file of another profile is.
    profile other = p.prof;
    other.kv_type = "q8_0";
    EXPECT_FALSE(t->fetch(other, prompt, 0).second);
    EXPECT_EQ(t->counters().n_restore_failures, 1u);
    // Better than what the caller has already: nothing.
    EXPECT_EQ(t->peek(prompt, 80).tier, kv_tier::none);

    fs.open_gate();
    t->flush();
    EXPECT_EQ(snapshot_files(mem, "/disk").size(), 1u);
    EXPECT_EQ(t->counters().n_writes_disk, 1u);
    q = t->queue_stats();
    EXPECT_EQ(q.queued_writes, 0u);
    EXPECT_EQ(q.queued_bytes, 0u);
    // Now from the file: the same bytes.
    t->forget_recent_loads();
    auto [h2, loaded] = t->fetch(p.prof, prompt, 0);
    ASSERT_TRUE(loaded);
    EXPECT_FALSE(h2.queued);
    EXPECT_EQ(h2.at.n_tokens, 80);
    EXPECT_EQ(loaded->kv, snap.kv);
    EXPECT_GT(fs.n_opens_for_read(), reads);

    // put_disk is synchronous: its file exists when it returns.
    const test_path p2 = make_path(2, {rc::high, rc::high, rc::none});
    ASSERT_TRUE(t->put_disk(two_segments_of(p2, "ws2")).ok());
    EXPECT_EQ(snapshot_files(mem, "/disk").size(), 2u);
    EXPECT_EQ(t->counters().n_writes_disk, 2u);
}

TEST(TierWriteQueue, TheSamePrefixIsQueuedOnce) {
    mem_fs mem;
    gated_fs fs(mem);
    auto t = open_tiers(fs);
    ASSERT_TRUE(t);
    gate_opener opener{fs};
    const test_path a = make_path(1, {rc::high, rc::high, rc::none});
    const test_path b = make_path(2, {rc::high, rc::high, rc::none});

    fs.close_gate();
    ASSERT_EQ(t->queue_write(two_segments_of(a)), disk_kv_tier::queue_outcome::queued);
    fs.wait_entered(1);  // a is being written
    EXPECT_EQ(t->queue_write(two_segments_of(a)), disk_kv_tier::queue_outcome::held);
    EXPECT_EQ(t->queue_write(snapshot_of(a, 4, "ws", 7, k_kv_bytes)),
              disk_kv_tier::queue_outcome::held);  // a prefix of it
    EXPECT_EQ(t->queue_write(two_segments_of(a, "another workspace")),
              disk_kv_tier::queue_outcome::held);                                        // same chain
    ASSERT_EQ(t->queue_write(two_segments_of(b)), disk_kv_tier::queue_outcome::queued);  // waits behind a
    EXPECT_EQ(t->queue_write(two_segments_of(b)), disk_kv_tier::queue_outcome::held);    // queued, not started
    write_queue_stats q = t->queue_stats();
    EXPECT_EQ(q.n_queued, 2u);
    EXPECT_EQ(q.queued_writes, 2u);
    EXPECT_EQ(q.n_held_by_queue, 4u);
    EXPECT_EQ(fs.n_entered(), 1u);

    fs.open_gate();
    snapshot_store * disk = t->disk();  // flushes
    ASSERT_TRUE(disk);
    EXPECT_EQ(t->queue_stats().queued_writes, 0u);
    EXPECT_EQ(disk->stats().n_puts, 2u);
    EXPECT_EQ(disk->list().size(), 2u);
    EXPECT_EQ(t->counters().n_writes_disk, 2u);
    // On disk now: still held, not queued again.
    EXPECT_EQ(t->queue_write(two_segments_of(a)), disk_kv_tier::queue_outcome::held);
    EXPECT_EQ(t->queue_stats().n_queued, 2u);
}

TEST(TierWriteQueue, AFullQueueDropsTheNewWriteCountedAndLogged) {
    mem_fs mem;
    gated_fs fs(mem);
    const test_path a = make_path(1, {rc::high, rc::high, rc::none});
    const test_path b = make_path(2, {rc::high, rc::high, rc::none});
    write_queue_options wq;
    wq.max_bytes = bytes_of(two_segments_of(a)) + 100;  // one snapshot fits, two do not
    auto t = open_tiers(fs, wq);
    ASSERT_TRUE(t);
    gate_opener opener{fs};

    fs.close_gate();
    ASSERT_EQ(t->queue_write(two_segments_of(a)), disk_kv_tier::queue_outcome::queued);
    fs.wait_entered(1);
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(t->queue_write(two_segments_of(b)), disk_kv_tier::queue_outcome::dropped);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("disk tier: a write failed"), std::string::npos) << err;
    EXPECT_NE(err.find("write queue"), std::string::npos) << err;
    EXPECT_EQ(t->counters().n_write_failures_disk, 1u);
    write_queue_stats q = t->queue_stats();
    EXPECT_EQ(q.n_dropped, 1u);
    EXPECT_EQ(q.queued_writes, 1u);
    EXPECT_EQ(q.queued_bytes, bytes_of(two_segments_of(a)));
    EXPECT_EQ(t->peek(prompt_of(b), 0).tier, kv_tier::none);  // nothing holds b

    fs.open_gate();
    t->flush();
    EXPECT_EQ(t->counters().n_writes_disk, 1u);
    EXPECT_EQ(snapshot_files(mem, "/disk").size(), 1u);
    // The queue is empty again: b fits now (and an empty queue takes any one snapshot).
    write_queue_options tiny;
    tiny.max_bytes = 1;
    auto t2 = open_tiers(fs, tiny);
    ASSERT_TRUE(t2);
    EXPECT_EQ(t2->queue_write(two_segments_of(b)), disk_kv_tier::queue_outcome::queued);
    t2->flush();
    EXPECT_EQ(t2->counters().n_writes_disk, 1u);
}

TEST(TierWriteQueue, DestructionFinishesTheQueuedWrites) {
    mem_fs mem;
    gated_fs fs(mem);
    uint64_t queued_at_destruction = 0;
    disk_kv_tier * raw = nullptr;
    write_queue_options wq;
    // The destructor has told the writer to stop: only now may the writes go through.
    wq.on_destroy = [&] {
        queued_at_destruction = raw->queue_stats().queued_writes;
        fs.open_gate();
    };
    auto t = open_tiers(fs, wq);
    ASSERT_TRUE(t);
    raw = t.get();
    gate_opener opener{fs};
    std::vector<snapshot> snaps;
    for (uint32_t seed = 1; seed <= 3; ++seed)
        snaps.push_back(two_segments_of(make_path(seed, {rc::high, rc::high, rc::none}), "ws", seed));

    fs.close_gate();
    for (const auto & s : snaps) ASSERT_EQ(t->queue_write(s), disk_kv_tier::queue_outcome::queued);
    fs.wait_entered(1);
    t.reset();  // finishes every queued write, then joins
    EXPECT_EQ(queued_at_destruction, 3u);

    snapshot_store_options so;
    so.dir = "/disk";
    so.fs = &mem;
    auto store = snapshot_store::open(so);
    ASSERT_TRUE(store.ok()) << store.error().to_string();
    ASSERT_EQ((*store)->list().size(), 3u);
    for (const auto & s : snaps) {
        auto loaded = (*store)->load({s.meta.blocks.back().chain, s.meta.workspace}, &s.meta.prof);
        ASSERT_TRUE(loaded.ok()) << loaded.error().to_string();
        EXPECT_EQ((*loaded)->kv, s.kv);
        EXPECT_EQ((*loaded)->tokens, s.tokens);
    }
}

// A restore that finds its file damaged is a miss at once: the file leaves the index then,
// and the writer thread moves it to quarantine/ (a rename and a directory sync), so the
// engine thread never waits on the directory.
TEST(TierWriteQueue, ADamagedFileIsQuarantinedByTheWriterNotByTheRestore) {
    mem_fs mem;
    gated_fs fs(mem);
    auto t = open_tiers(fs);
    ASSERT_TRUE(t);
    gate_opener opener{fs};
    const test_path p = make_path(1, {rc::high, rc::high, rc::none});
    const assembled_prompt prompt = prompt_of(p);
    ASSERT_TRUE(t->put_disk(two_segments_of(p)).ok());
    const std::vector<snapshot_entry> files = t->disk()->list();
    ASSERT_EQ(files.size(), 1u);
    ASSERT_TRUE(mem.corrupt_byte("/disk/" + files[0].file_name, files[0].file_bytes - 100, 0x40).ok());

    fs.close_gate();
    fs.gate_quarantine();
    auto restore = std::async(std::launch::async, [&] { return t->fetch(p.prof, prompt, 0); });
    if (restore.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
        fs.open_gate();
        FAIL() << "the restore waited for the file's move to quarantine";
    }
    auto [h, bytes] = restore.get();
    EXPECT_FALSE(bytes);
    EXPECT_NE(h.failed.find(files[0].file_name), std::string::npos) << h.failed;
    EXPECT_EQ(t->counters().n_restore_failures, 1u);
    fs.wait_entered(1);  // the writer is moving it, held at the gate
    EXPECT_EQ(t->peek(prompt, 0).tier, kv_tier::none);  // out of the index already
    EXPECT_EQ(snapshot_files(mem, "/disk").size(), 1u);  // still in place

    fs.open_gate();
    t->flush();
    EXPECT_TRUE(snapshot_files(mem, "/disk").empty());
    const snapshot_store_stats st = t->disk()->stats();
    EXPECT_EQ(st.n_quarantined, 1u);
    ASSERT_EQ(t->disk()->rejected().size(), 1u);
    EXPECT_TRUE(t->disk()->rejected()[0].quarantined);
}

// A write the store refuses (a full disk) is counted by the writer and said once.
TEST(TierWriteQueue, AFailedWriteIsCountedWhenTheWriterGetsToIt) {
    mem_fs mem;
    faulty_fs faulty(mem);
    auto t = open_tiers(faulty);
    ASSERT_TRUE(t);
    faulty.inject_random(7, 1.0, {fs_fault::no_space});
    const test_path a = make_path(1, {rc::high, rc::high, rc::none});
    ::testing::internal::CaptureStderr();
    ASSERT_EQ(t->queue_write(two_segments_of(a)), disk_kv_tier::queue_outcome::queued);
    t->flush();
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(t->counters().n_write_failures_disk, 1u);
    EXPECT_EQ(t->counters().n_writes_disk, 0u);
    EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
    EXPECT_EQ(t->peek(prompt_of(a), 0).tier, kv_tier::none);  // gone from the queue, not on disk
    faulty.reset();
    EXPECT_EQ(t->queue_write(two_segments_of(a)), disk_kv_tier::queue_outcome::queued);  // a later turn tries again
    t->flush();
    EXPECT_EQ(t->counters().n_writes_disk, 1u);
}

}  // namespace
}  // namespace warmctx
