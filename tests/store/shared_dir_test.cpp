// Several stores on one directory (options.shared, store_persistence::shared), as replicas
// behind a load balancer use it: each sees the others' files, the budget is the
// directory's, a file another evicted is a clean miss, another's write in progress is left
// alone; the workspace store's view follows the files.
#include <gtest/gtest.h>

#include "store_test_util.h"
#include "warmctx/segment_store.h"
#include "warmctx/snapshot_store.h"

namespace warmctx {
namespace {

using testing::chains_of;
using testing::make_path;
using testing::snapshot_of;
using rc = retention_class;

const std::string k_dir = "/shared/kv";

struct two_stores {
    mem_fs mem;
    uint64_t clock = 1'000'000;
    std::vector<std::string> evicted_by_a, evicted_by_b;
    std::unique_ptr<snapshot_store> a, b;
    snapshot_store_options options(std::vector<std::string> & evicted, uint64_t budget) {
        snapshot_store_options o;
        o.dir = k_dir;
        o.fs = &mem;
        o.clock_ms = [this] { return clock; };
        o.shared = true;
        o.shared_refresh_ms = 100;
        o.budget_bytes = budget;
        o.on_evict = [&evicted](const std::string & name) { evicted.push_back(name); };
        return o;
    }
    explicit two_stores(uint64_t budget = 0) {
        a = std::move(snapshot_store::open(options(evicted_by_a, budget)).value());
        b = std::move(snapshot_store::open(options(evicted_by_b, budget)).value());
    }
};

snapshot_key key_of(const snapshot & s) { return {s.meta.key(), s.meta.workspace}; }

TEST(shared_dir, a_file_another_store_put_is_found_once_the_refresh_is_due) {
    two_stores st;
    auto p = make_path(1, {rc::highest, rc::high, rc::low});
    snapshot s = snapshot_of(p, p.blocks.size(), "ws-a");
    ASSERT_TRUE(st.a->put(s).ok());
    auto chains = chains_of(p);
    // b read the directory at open, before the put: it finds nothing until its next read.
    EXPECT_FALSE(st.b->lookup(chains).hit());
    st.clock += 100;
    auto m = st.b->lookup(chains);
    ASSERT_TRUE(m.hit());
    EXPECT_EQ(m.key, key_of(s));
    auto l = st.b->load(m.key);
    ASSERT_TRUE(l.ok()) << l.error().to_string();
    testing::expect_same_snapshot(**l, s);
    EXPECT_EQ(st.b->stats().n_files, 1u);  // counted once, by name, in each view
    EXPECT_EQ(st.a->stats().n_files, 1u);
}

TEST(shared_dir, the_budget_is_the_directorys_and_another_stores_eviction_is_a_clean_miss) {
    // Each file is ~1.5 kB on disk: three fit, four do not.
    auto p = make_path(2, {rc::high, rc::high, rc::high, rc::high});
    snapshot s1 = snapshot_of(p, 4, "ws-1", 1, 1000, 1'000'000);
    uint64_t one = 0;
    {
        mem_fs probe;
        snapshot_store_options o;
        o.dir = k_dir;
        o.fs = &probe;
        auto store = snapshot_store::open(o);
        ASSERT_TRUE(store.ok());
        auto e = (*store)->put(s1);
        ASSERT_TRUE(e.ok()) << e.error().to_string();
        one = e->file_bytes;
    }
    two_stores st(3 * one + one / 2);
    auto e1 = st.a->put(s1);
    ASSERT_TRUE(e1.ok()) << e1.error().to_string();
    st.clock += 10;
    auto p2 = make_path(3, {rc::high, rc::high, rc::high, rc::high});
    snapshot s2 = snapshot_of(p2, 4, "ws-2", 2, 1000, 1'000'010);
    ASSERT_TRUE(st.b->put(s2).ok());
    st.clock += 10;
    auto p3 = make_path(4, {rc::high, rc::high, rc::high, rc::high});
    snapshot s3 = snapshot_of(p3, 4, "ws-3", 3, 1000, 1'000'020);
    ASSERT_TRUE(st.a->put(s3).ok());
    EXPECT_TRUE(st.evicted_by_a.empty());
    EXPECT_TRUE(st.evicted_by_b.empty());
    // b's put reads the directory first: it counts a's two files and evicts the oldest, a's.
    st.clock += 10;
    auto p4 = make_path(5, {rc::high, rc::high, rc::high, rc::high});
    snapshot s4 = snapshot_of(p4, 4, "ws-4", 4, 1000, 1'000'030);
    ASSERT_TRUE(st.b->put(s4).ok());
    ASSERT_EQ(st.evicted_by_b, (std::vector<std::string>{key_of(s1).file_name()}));
    EXPECT_LE(st.b->stats().n_bytes, 3 * one + one / 2);
    uint64_t dir_bytes = 0;
    const std::vector<std::string> names = *st.mem.list_dir(k_dir);
    for (const std::string & n : names)
        if (n.ends_with(".wcsnap")) dir_bytes += *st.mem.file_size(k_dir + "/" + n);
    EXPECT_EQ(dir_bytes, 3 * one);
    // a still indexes s1: its load is a miss "not_found" (no quarantine), and s1 leaves
    // a's index; a's lookup of it is then a miss too.
    auto l = st.a->load(key_of(s1));
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.error().code(), status_code::not_found);
    EXPECT_EQ(st.a->stats().load_misses_by_reason["not_found"], 1u);
    EXPECT_EQ(st.a->stats().n_quarantined, 0u);
    EXPECT_FALSE(st.a->find(key_of(s1)));
    EXPECT_FALSE(st.a->lookup(chains_of(p)).hit());
    EXPECT_TRUE(st.a->rejected().empty());
}

TEST(shared_dir, another_writers_young_temp_file_is_left_alone_and_an_old_one_removed) {
    two_stores st;
    const std::string temp = k_dir + "/0123.wcsnap.4242-1.tmp";
    ASSERT_TRUE(st.mem.write_file(temp, std::vector<uint8_t>(10, 1)).ok());
    // mem_fs's mtime is a change counter (near 0 ms): it is young while the clock is below
    // the grace period, and old once the clock passes it.
    snapshot_store_options o = st.options(st.evicted_by_a, 0);
    o.shared_temp_grace_ms = 2'000'000;
    auto c = std::move(snapshot_store::open(o).value());
    EXPECT_TRUE(st.mem.file_size(temp).ok());
    EXPECT_EQ(c->stats().n_temp_removed, 0u);
    st.clock = 2'000'100;
    ASSERT_TRUE(c->rescan().ok());
    EXPECT_FALSE(st.mem.file_size(temp).ok());
    EXPECT_EQ(c->stats().n_temp_removed, 1u);
}

segment seg_of(std::string id, std::string content) {
    segment s;
    s.id = std::move(id);
    s.kind = segment_kind::repo_map;
    s.content = std::move(content);
    return s;
}

TEST(shared_dir, a_workspace_store_sees_another_stores_puts_replacements_and_erases) {
    mem_fs mem;
    store_persistence sp{&mem, "/shared/workspaces"};
    sp.shared = true;
    segment_store a(store_limits{}, sp), b(store_limits{}, sp);
    auto any_id = [](std::string_view) { return true; };
    ASSERT_TRUE(a.load(kind_table{}, any_id).ok());
    ASSERT_TRUE(b.load(kind_table{}, any_id).ok());
    bool created = false;
    ASSERT_TRUE(a.put("ws", seg_of("map", "v1"), created).ok());
    auto got = b.get("ws", "map");
    ASSERT_TRUE(got);
    EXPECT_EQ(got->content, "v1");
    ASSERT_TRUE(b.put("ws", seg_of("map", "v2-longer"), created).ok());
    EXPECT_FALSE(created);  // b saw a's file before its own put
    EXPECT_EQ(a.get("ws", "map")->content, "v2-longer");
    ASSERT_TRUE(b.put("ws", seg_of("rules", "r"), created).ok());
    ASSERT_EQ(a.list("ws")->size(), 2u);
    EXPECT_EQ(a.n_bytes(), b.n_bytes());
    ASSERT_TRUE(*a.erase("ws", "map"));
    EXPECT_FALSE(b.get("ws", "map"));
    ASSERT_EQ(b.list("ws")->size(), 1u);
    EXPECT_EQ(b.n_segments(), 1u);
    ASSERT_EQ(*a.drop("ws"), 1u);
    EXPECT_FALSE(b.list("ws"));
    EXPECT_EQ(b.n_bytes(), 0u);
}

TEST(shared_dir, without_shared_a_store_keeps_its_own_view) {
    mem_fs mem;
    segment_store a(store_limits{}, store_persistence{&mem, "/ws"}), b(store_limits{}, store_persistence{&mem, "/ws"});
    auto any_id = [](std::string_view) { return true; };
    ASSERT_TRUE(a.load(kind_table{}, any_id).ok());
    ASSERT_TRUE(b.load(kind_table{}, any_id).ok());
    bool created = false;
    ASSERT_TRUE(a.put("ws", seg_of("map", "v1"), created).ok());
    EXPECT_FALSE(b.get("ws", "map"));  // what serve's exclusive lock on the directory is for
}

}  // namespace
}  // namespace warmctx
