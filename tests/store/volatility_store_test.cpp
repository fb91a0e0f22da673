// The volatility store (store/volatility_store.h) on the in-memory file system: what a
// workspace learned survives a reopen and a power cut once written (each write synced and
// renamed into place), a file that is not the format is set aside and reads as nothing
// learned, a removal removes, and a directory that is a link is refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "warmctx/fs.h"
#include "store/volatility_store.h"

namespace warmctx {
namespace {

volatility_state learned(uint64_t n_turns) {
    volatility_state st;
    st.order = {"sys", "pin-a", "map"};
    st.n_turns = n_turns;
    segment_volatility v;
    v.content_bytes = 120;
    v.changed_bits = 0b1010;
    v.n_observed = 4;
    v.fine = true;
    v.fine_from = 64;
    v.digest = {1, 2, 3};
    st.segs["map"] = v;
    return st;
}

std::unique_ptr<volatility_store> open_store(file_system & fs) {
    auto s = volatility_store::open(fs, "/cache/volatility");
    EXPECT_TRUE(s.ok()) << s.error().to_string();
    return s.ok() ? std::move(s.value()) : nullptr;
}

TEST(VolatilityStore, AWrittenStateSurvivesAReopenAndAPowerCut) {
    mem_fs mem;
    {
        auto s = open_store(mem);
        ASSERT_TRUE(s);
        EXPECT_FALSE(s->read("ws-a"));  // nothing learned yet
        s->put("ws-a", learned(7));
        // Queued, not yet written: read sees what was put.
        auto queued = s->read("ws-a");
        ASSERT_TRUE(queued);
        EXPECT_EQ(queued->n_turns, 7u);
        s->flush();
        EXPECT_EQ(s->stats().n_writes, 1u);
    }
    mem.crash();  // only what was synced, and renamed durably, is left
    auto s = open_store(mem);
    ASSERT_TRUE(s);
    auto back = s->read("ws-a");
    ASSERT_TRUE(back) << "a written state was lost at a power cut";
    EXPECT_EQ(back->order, learned(7).order);
    EXPECT_EQ(back->n_turns, 7u);
    ASSERT_EQ(back->segs.count("map"), 1u);
    EXPECT_EQ(back->segs.at("map").fine_from, 64u);
    EXPECT_EQ(back->segs.at("map").digest, (std::vector<uint64_t>{1, 2, 3}));
    // A removal removes.
    s->remove("ws-a");
    EXPECT_FALSE(s->read("ws-a"));
    s->flush();
    EXPECT_FALSE(mem.file_size(s->path_of("ws-a")).ok());
}

TEST(VolatilityStore, AFileThatIsNotTheFormatIsSetAsideAndReadsAsNothingLearned) {
    mem_fs mem;
    auto s = open_store(mem);
    ASSERT_TRUE(s);
    const std::string path = s->path_of("ws-b");
    const std::string junk = "{\"format\": \"something else\"}";
    ASSERT_TRUE(mem.write_file(path, std::span((const uint8_t *)junk.data(), junk.size())).ok());
    EXPECT_FALSE(s->read("ws-b"));
    EXPECT_EQ(s->stats().n_quarantined, 1u);
    EXPECT_FALSE(mem.file_size(path).ok()) << "left in place";
    auto q = mem.list_dir("/cache/volatility/quarantine");
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->size(), 2u);  // the file and its reason
    // The workspace learns again, and its new state is written.
    s->put("ws-b", learned(1));
    s->flush();
    s.reset();
    auto again = open_store(mem);
    ASSERT_TRUE(again);
    auto back = again->read("ws-b");
    ASSERT_TRUE(back);
    EXPECT_EQ(back->n_turns, 1u);
    // At most k_max_quarantined files are kept.
    for (size_t i = 0; i < volatility_store::k_max_quarantined + 3; ++i) {
        const std::string ws = "junk-" + std::to_string(i);
        ASSERT_TRUE(mem.write_file(again->path_of(ws), std::span((const uint8_t *)junk.data(), junk.size())).ok());
        EXPECT_FALSE(again->read(ws));
    }
    q = mem.list_dir("/cache/volatility/quarantine");
    ASSERT_TRUE(q.ok());
    EXPECT_LE(q->size(), 2 * volatility_store::k_max_quarantined);
}

TEST(VolatilityStore, ADirectoryThatIsALinkIsRefused) {
    char t[] = "/tmp/warmctx-vol-XXXXXX";
    const std::string dir = mkdtemp(t);
    std::filesystem::create_directory(dir + "/elsewhere");
    std::filesystem::create_directory_symlink(dir + "/elsewhere", dir + "/volatility");
    auto s = volatility_store::open(posix_fs(), dir + "/volatility");
    EXPECT_FALSE(s.ok());
    if (!s.ok()) EXPECT_EQ(s.error().code(), status_code::failed_precondition);
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace warmctx
