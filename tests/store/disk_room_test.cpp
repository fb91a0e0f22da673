// A durable write on a full disk takes room back from the snapshot cache beside it
// (segment_store's make_room, snapshot_store::evict_for_space), on the in-memory fs with a
// capacity.
#include <gtest/gtest.h>

#include "store_test_util.h"
#include "warmctx/fs.h"
#include "store/segment_store.h"
#include "store/snapshot_store.h"

namespace warmctx {
namespace {

using testing::make_path;
using testing::snapshot_of;
using rc = retention_class;

uint64_t bytes_under(mem_fs & fs, const std::string & dir) {
    uint64_t n = 0;
    auto names = fs.list_dir(dir);
    if (!names.ok()) return 0;
    for (const std::string & name : *names)
        if (auto sz = fs.file_size(dir + "/" + name); sz.ok()) n += *sz;
    return n;
}

struct disk {
    mem_fs mem;
    std::unique_ptr<snapshot_store> snaps;
    disk() {
        snapshot_store_options o;
        o.dir = "/cache/kv";
        o.fs = &mem;
        auto s = snapshot_store::open(std::move(o));
        EXPECT_TRUE(s.ok());
        snaps = std::move(*s);
        // Three snapshots of 20 KB of KV each: a low one, a high one (pinned), a highest one.
        uint32_t seed = 1;
        for (rc c : {rc::low, rc::high, rc::highest}) {
            auto p = make_path(seed, {rc::highest, c});
            auto e = snaps->put(snapshot_of(p, p.blocks.size(), "ws", seed, 20000));
            EXPECT_TRUE(e.ok()) << e.error().to_string();
            if (c == rc::high) EXPECT_TRUE(snaps->pin(e->key).ok());
            ++seed;
        }
        // The disk is full but for 1 KB.
        mem.set_capacity(bytes_under(mem, "/cache/kv") + 1000);
    }
};

segment big_segment() {
    segment s;
    s.id = "repo-map";
    s.kind = segment_kind::repo_map;
    s.content = std::string(8000, 'x');
    return s;
}

TEST(disk_room, a_full_disk_fails_a_durable_write_without_a_cache_to_take_room_from) {
    disk d;
    segment_store store(store_limits{}, store_persistence{&d.mem, "/cache/workspaces"});
    bool created = false;
    status st = store.put("ws", big_segment(), created);
    EXPECT_TRUE(is_disk_full(st)) << st.to_string();
    EXPECT_FALSE(store.get("ws", "repo-map"));
    EXPECT_EQ(d.snaps->list().size(), 3u);
}

TEST(disk_room, snapshots_are_evicted_before_a_durable_write_fails) {
    disk d;
    std::vector<uint64_t> asked;
    segment_store store(store_limits{}, store_persistence{&d.mem, "/cache/workspaces", [&](uint64_t bytes) {
                                                              asked.push_back(bytes);
                                                              return d.snaps->evict_for_space(bytes);
                                                          }});
    bool created = false;
    status st = store.put("ws", big_segment(), created);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(created);
    ASSERT_TRUE(store.get("ws", "repo-map"));
    ASSERT_EQ(asked.size(), 1u);
    EXPECT_GE(asked[0], 8000u);
    // The policy's order: the low snapshot went first, and one 20 KB file was enough; the
    // pinned one is never evicted.
    auto left = d.snaps->list();
    ASSERT_EQ(left.size(), 2u);
    for (const snapshot_entry & e : left) EXPECT_NE(e.meta.last_class(), rc::low);
    EXPECT_EQ(d.snaps->stats().evictions_by_class[(size_t)rc::low], 1u);
}

TEST(disk_room, evict_for_space_stops_at_pinned_files_and_says_what_it_freed) {
    disk d;
    const uint64_t freed = d.snaps->evict_for_space(1u << 30);
    auto left = d.snaps->list();
    ASSERT_EQ(left.size(), 1u);  // the pinned one
    EXPECT_EQ(left[0].meta.last_class(), rc::high);
    EXPECT_GE(freed, 40000u);
    EXPECT_EQ(d.snaps->evict_for_space(0), 0u);
}

}  // namespace
}  // namespace warmctx
