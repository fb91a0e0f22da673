// The snapshot store on the in-memory fs: put, rescan, lookup, load, eviction, quarantine,
// shared loads, and the fault-injecting fs (after a crash, no torn file is ever loaded
// and the previous good snapshot of a key survives).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <set>
#include <mutex>
#include <random>
#include <thread>

#include "store_test_util.h"
#include "store/snapshot_store.h"

namespace warmctx {
namespace {

using testing::chains_of;
using testing::make_path;
using testing::snapshot_of;
using rc = retention_class;

const std::string k_dir = "/cache/snapshots";

struct fixture {
    mem_fs mem;
    uint64_t clock = 1'000'000;
    snapshot_store_options options(file_system * fs = nullptr) {
        snapshot_store_options o;
        o.dir = k_dir;
        o.fs = fs ? fs : &mem;
        o.clock_ms = [this] { return clock; };
        return o;
    }
    std::unique_ptr<snapshot_store> open(snapshot_store_options o) {
        auto s = snapshot_store::open(std::move(o));
        EXPECT_TRUE(s.ok()) << s.error().to_string();
        return s.ok() ? std::move(s.value()) : nullptr;
    }
    std::unique_ptr<snapshot_store> open() { return open(options()); }
};

snapshot_key key_of(const snapshot & s) { return {s.meta.key(), s.meta.workspace}; }

// ---- basics -----------------------------------------------------------------------------------

TEST(snapshot_store, put_list_load_and_reopen) {
    fixture fx;
    auto store = fx.open();
    auto p = make_path(1, {rc::highest, rc::high, rc::low});
    snapshot s = snapshot_of(p, p.blocks.size(), "ws-a");
    auto e = store->put(s);
    ASSERT_TRUE(e.ok()) << e.error().to_string();
    EXPECT_EQ(e->key, key_of(s));
    EXPECT_EQ(e->file_name, snapshot_file_name(s.meta.key(), "ws-a"));
    EXPECT_EQ(*fx.mem.list_dir(k_dir), (std::vector<std::string>{e->file_name, "quarantine"}));

    auto l = store->load(key_of(s));
    ASSERT_TRUE(l.ok()) << l.error().to_string();
    testing::expect_same_snapshot(s, **l);

    // A restart (a new store on the same directory) indexes it from its head alone.
    fx.mem.crash();  // and only what was made durable counts
    faulty_fs counting(fx.mem);
    auto again = fx.open(fx.options(&counting));
    ASSERT_EQ(again->list().size(), 1u);
    EXPECT_EQ(again->list()[0].meta.blocks, s.meta.blocks);
    EXPECT_EQ(again->list()[0].kv_bytes, s.kv.size());
    auto l2 = again->load(key_of(s));
    ASSERT_TRUE(l2.ok()) << l2.error().to_string();
    testing::expect_same_snapshot(s, **l2);

    auto st = again->stats();
    EXPECT_EQ(st.n_files, 1u);
    EXPECT_EQ(st.n_loads, 1u);
    EXPECT_EQ(st.n_load_hits, 1u);
    EXPECT_EQ(st.n_file_reads, 1u);
}

TEST(snapshot_store, a_put_replaces_the_file_of_its_key) {
    fixture fx;
    auto store = fx.open();
    auto p = make_path(1, {rc::high, rc::high});
    snapshot v1 = snapshot_of(p, p.blocks.size(), "ws", 1);
    snapshot v2 = snapshot_of(p, p.blocks.size(), "ws", 2);
    ASSERT_TRUE(store->put(v1).ok());
    ASSERT_TRUE(store->put(v2).ok());
    EXPECT_EQ(store->list().size(), 1u);
    EXPECT_EQ((*store->load(key_of(v1)))->kv, v2.kv);
    EXPECT_EQ(store->stats().n_bytes, store->list()[0].file_bytes);
}

TEST(snapshot_store, put_refuses_an_invalid_snapshot_without_touching_the_disk) {
    fixture fx;
    auto store = fx.open();
    auto p = make_path(1, {rc::high});
    snapshot s = snapshot_of(p, p.blocks.size(), "ws");
    s.tokens.pop_back();  // fewer tokens than the blocks cover
    auto r = store->put(s);
    EXPECT_EQ(r.error().code(), status_code::invalid_argument);
    EXPECT_EQ(*fx.mem.list_dir(k_dir), std::vector<std::string>{"quarantine"});
    EXPECT_EQ(store->stats().n_put_failures, 1u);
}

// ---- lookup -----------------------------------------------------------------------------------

TEST(snapshot_store, lookup_finds_the_longest_prefix_any_file_holds) {
    fixture fx;
    auto store = fx.open();
    auto p = make_path(1, {rc::highest, rc::high, rc::medium, rc::low});  // 4 segments x 3 blocks
    ASSERT_EQ(p.blocks.size(), 12u);
    snapshot a = snapshot_of(p, 5, "ws-a");
    snapshot b = snapshot_of(p, 9, "ws-b");
    ASSERT_TRUE(store->put(a).ok());
    ASSERT_TRUE(store->put(b).ok());

    auto path = chains_of(p);
    auto m = store->lookup(path);  // the whole path: b holds 9 of its blocks
    ASSERT_TRUE(m.hit());
    EXPECT_EQ(m.key, key_of(b));
    EXPECT_EQ(m.n_blocks, 9u);
    EXPECT_EQ(m.n_tokens, p.blocks[8].end);
    EXPECT_EQ(m.file_n_tokens, b.meta.n_tokens());

    // A path that leaves the cached ones after block 3: both files hold 4 blocks of it;
    // the smaller file serves (less to read).
    auto other = make_path(2, {rc::low});
    std::vector<hash128> diverged(path.begin(), path.begin() + 4);
    diverged.push_back(other.blocks[0].chain);
    m = store->lookup(diverged);
    ASSERT_TRUE(m.hit());
    EXPECT_EQ(m.n_blocks, 4u);
    EXPECT_EQ(m.key, key_of(a));
    EXPECT_EQ(m.n_tokens, p.blocks[3].end);
    EXPECT_EQ(m.file_n_tokens, a.meta.n_tokens());

    // Another profile (or tenant) roots other chains: a miss by construction.
    profile drifted = testing::test_profile();
    drifted.kv_type = "q8_0";
    auto q = make_path(1, {rc::highest, rc::high, rc::medium, rc::low}, 40, 16, drifted);
    EXPECT_FALSE(store->lookup(chains_of(q)).hit());
    EXPECT_FALSE(store->lookup(std::span<const hash128>{}).hit());

    auto st = store->stats();
    EXPECT_EQ(st.n_lookups, 4u);
    EXPECT_EQ(st.n_lookup_hits, 2u);
    EXPECT_EQ(st.n_lookup_misses, 2u);
}

// A reader whose sequences hold fewer tokens than a file cannot load it: with
// max_file_tokens, lookup passes such a file over for a shorter one of the same prefix,
// or misses.
TEST(snapshot_store, lookup_passes_over_files_longer_than_the_reader_holds) {
    fixture fx;
    auto store = fx.open();
    auto p = make_path(1, {rc::highest, rc::high, rc::medium, rc::low});
    snapshot a = snapshot_of(p, 5, "ws-a");
    snapshot b = snapshot_of(p, 9, "ws-b");
    ASSERT_TRUE(store->put(a).ok());
    ASSERT_TRUE(store->put(b).ok());
    auto path = chains_of(p);
    auto m = store->lookup(path, b.meta.n_tokens());  // b fits exactly
    EXPECT_EQ(m.key, key_of(b));
    EXPECT_EQ(m.n_blocks, 9u);
    m = store->lookup(path, b.meta.n_tokens() - 1);    // b does not: a serves its 5 blocks
    EXPECT_EQ(m.key, key_of(a));
    EXPECT_EQ(m.n_blocks, 5u);
    EXPECT_EQ(store->peek(p.blocks, b.meta.n_tokens() - 1).key, key_of(a));
    EXPECT_FALSE(store->lookup(path, a.meta.n_tokens() - 1).hit());
    EXPECT_FALSE(store->peek(p.blocks, a.meta.n_tokens() - 1).hit());
    EXPECT_EQ(store->stats().n_lookup_misses, 1u);
}

// The newest file of a workspace, from the index alone (explain's source of the profile a
// workspace's KV was last computed under, after a restart).
TEST(snapshot_store, newest_of_is_a_workspaces_latest_file) {
    fixture fx;
    auto p = make_path(1, {rc::highest, rc::high, rc::medium});
    snapshot older = snapshot_of(p, 6, "ws", 7, 1000, 1'700'000'000'000);
    snapshot newer = snapshot_of(p, 3, "ws", 7, 1000, 1'700'000'005'000);
    snapshot other = snapshot_of(p, 9, "other", 7, 1000, 1'700'000'009'000);
    {
        auto store = fx.open();
        for (const snapshot * s : {&older, &newer, &other}) ASSERT_TRUE(store->put(*s).ok());
        EXPECT_EQ(store->newest_of("ws")->key, key_of(newer));
    }
    auto store = fx.open();  // after a restart, from the heads
    ASSERT_TRUE(store->newest_of("ws").has_value());
    EXPECT_EQ(store->newest_of("ws")->key, key_of(newer));
    EXPECT_EQ(store->newest_of("ws")->meta.prof, p.prof);
    EXPECT_EQ(store->newest_of("other")->key, key_of(other));
    EXPECT_FALSE(store->newest_of("nobody").has_value());
    EXPECT_EQ(store->stats().n_lookups, 0u);
    EXPECT_EQ(store->stats().n_loads, 0u);
}

// ---- damage: at scan and at load ------------------------------------------------------------------

TEST(snapshot_store, open_quarantines_bad_heads_and_removes_temp_files) {
    fixture fx;
    auto p = make_path(1, {rc::high, rc::low});
    snapshot good = snapshot_of(p, 6, "ws");
    snapshot bad = snapshot_of(p, 3, "ws");
    std::string bad_name, good_name;
    {
        auto store = fx.open();
        good_name = store->put(good)->file_name;
        bad_name = store->put(bad)->file_name;
    }
    ASSERT_TRUE(fx.mem.corrupt_byte(k_dir + "/" + bad_name, 300, 0x01).ok());  // in the metadata
    ASSERT_TRUE(fx.mem.write_file(k_dir + "/" + good_name + ".77-1.tmp", std::vector<uint8_t>(10, 1)).ok());
    ASSERT_TRUE(fx.mem.write_file(k_dir + "/garbage.wcsnap", std::vector<uint8_t>(50, 0)).ok());
    ASSERT_TRUE(fx.mem.write_file(k_dir + "/README", std::vector<uint8_t>(5, 'x')).ok());

    auto store = fx.open();
    ASSERT_EQ(store->list().size(), 1u);
    EXPECT_EQ(store->list()[0].file_name, good_name);
    auto rej = store->rejected();
    ASSERT_EQ(rej.size(), 2u);
    std::map<std::string, rejected_file> by_name;
    for (auto & r : rej) by_name[r.file_name] = r;
    EXPECT_EQ(by_name[bad_name].defect, snapshot_defect::header_checksum);
    EXPECT_TRUE(by_name[bad_name].quarantined);
    EXPECT_EQ(by_name["garbage.wcsnap"].defect, snapshot_defect::bad_magic);
    auto q = *fx.mem.list_dir(k_dir + "/quarantine");
    EXPECT_EQ(q, (std::vector<std::string>{bad_name, bad_name + ".reason", "garbage.wcsnap", "garbage.wcsnap.reason"}));
    auto reason = fx.mem.read_file(k_dir + "/quarantine/" + bad_name + ".reason");
    EXPECT_EQ(std::string(reason->begin(), reason->end()).rfind("header_checksum\t", 0), 0u);
    std::vector<std::string> left = {good_name, "README", "quarantine"};
    std::sort(left.begin(), left.end());  // list_dir sorts byte-wise; the name is a hash
    EXPECT_EQ(*fx.mem.list_dir(k_dir), left);
    auto st = store->stats();
    EXPECT_EQ(st.n_quarantined, 2u);
    EXPECT_EQ(st.n_temp_removed, 1u);
    // The quarantined file's prefix is still served - by the good file that extends it.
    auto chains = chains_of(p);
    auto m = store->lookup(std::span<const hash128>(chains).first(3));
    EXPECT_EQ(m.key, key_of(good));
    EXPECT_EQ(m.n_blocks, 3u);
}

// A file of the previous format version (written before an upgrade) is a miss named
// foreign_version at open: not indexed, never loaded, and no other file is affected.
TEST(snapshot_store, a_file_of_an_older_format_version_is_a_clean_miss) {
    namespace sf = snapshot_format;
    static_assert(sf::k_version >= 2);
    fixture fx;
    auto p = make_path(1, {rc::high, rc::low});
    snapshot old = snapshot_of(p, 3, "ws-old");
    snapshot current = snapshot_of(p, 6, "ws-new");
    std::string old_name;
    {
        auto store = fx.open();
        old_name = store->put(old)->file_name;
        ASSERT_TRUE(store->put(current).ok());
    }
    // The version field now says k_version - 1 (checked before any checksum).
    ASSERT_TRUE(fx.mem.corrupt_byte(k_dir + "/" + old_name, sf::k_off_version,
                                    (uint8_t)(sf::k_version ^ (sf::k_version - 1))).ok());
    auto store = fx.open();
    ASSERT_EQ(store->list().size(), 1u);
    EXPECT_EQ(store->list()[0].key, key_of(current));
    ASSERT_EQ(store->rejected().size(), 1u);
    EXPECT_EQ(store->rejected()[0].file_name, old_name);
    EXPECT_EQ(store->rejected()[0].defect, snapshot_defect::foreign_version);
    EXPECT_NE(store->rejected()[0].reason.find("format version " + std::to_string(sf::k_version - 1)), std::string::npos)
        << store->rejected()[0].reason;
    EXPECT_EQ(store->load(key_of(old)).error().code(), status_code::not_found);
    auto chains = chains_of(p);
    EXPECT_EQ(store->lookup(std::span<const hash128>(chains).first(3)).key, key_of(current));
}

// quarantine/ is bounded: at most quarantine_max_files files (oldest out first), and its
// bytes count against the budget, going before any good snapshot does.
TEST(snapshot_store, quarantine_is_bounded_and_counted_in_the_budget) {
    fixture fx;
    ASSERT_TRUE(fx.mem.create_dirs(k_dir).ok());
    for (int i = 0; i < 5; ++i)
        ASSERT_TRUE(fx.mem.write_file(k_dir + "/bad" + std::to_string(i) + ".wcsnap", std::vector<uint8_t>(1000, 0)).ok());
    auto o = fx.options();
    o.quarantine_max_files = 2;
    auto store = fx.open(o);
    auto st = store->stats();
    EXPECT_EQ(st.n_quarantined, 5u);
    EXPECT_EQ(st.quarantine_files, 2u);
    EXPECT_EQ(st.n_quarantine_pruned, 3u);
    EXPECT_GE(st.quarantine_bytes, 2000u);
    EXPECT_EQ(*fx.mem.list_dir(k_dir + "/quarantine"),
              (std::vector<std::string>{"bad3.wcsnap", "bad3.wcsnap.reason", "bad4.wcsnap", "bad4.wcsnap.reason"}));
    store.reset();

    // With a budget, a put that needs room drops quarantined files first: the good
    // snapshot stays and quarantine/ empties.
    auto p = make_path(1, {rc::high, rc::low});
    snapshot good = snapshot_of(p, p.blocks.size(), "ws");
    {
        auto probe = fx.open(fx.options());  // unlimited: measure the file
        auto e = probe->put(good);
        ASSERT_TRUE(e.ok());
        o.budget_bytes = e->file_bytes + 100;  // room for the snapshot, not for the quarantine too
    }
    store = fx.open(o);
    st = store->stats();
    EXPECT_EQ(st.n_files, 1u) << "the good snapshot is kept";
    EXPECT_EQ(st.quarantine_files, 0u);
    EXPECT_EQ(st.quarantine_bytes, 0u);
    EXPECT_LE(st.n_bytes + st.quarantine_bytes, o.budget_bytes);
    EXPECT_EQ(*fx.mem.list_dir(k_dir + "/quarantine"), std::vector<std::string>{});
}

TEST(snapshot_store, a_file_under_another_files_name_is_misnamed) {
    fixture fx;
    auto p = make_path(1, {rc::high, rc::low});
    snapshot a = snapshot_of(p, 2, "ws");
    {
        auto store = fx.open();
        ASSERT_TRUE(store->put(a).ok());
    }
    auto bytes = fx.mem.read_file(k_dir + "/" + key_of(a).file_name());
    std::string wrong = snapshot_file_name(a.meta.key(), "other-ws");
    ASSERT_TRUE(fx.mem.write_file(k_dir + "/" + wrong, *bytes).ok());
    auto store = fx.open();
    EXPECT_EQ(store->list().size(), 1u);
    ASSERT_EQ(store->rejected().size(), 1u);
    EXPECT_EQ(store->rejected()[0].defect, snapshot_defect::misnamed);
}

TEST(snapshot_store, load_verifies_everything_and_quarantines_a_damaged_body) {
    fixture fx;
    auto store = fx.open();
    auto p = make_path(1, {rc::high, rc::low});
    snapshot s = snapshot_of(p, p.blocks.size(), "ws", 7, 4000);
    auto e = store->put(s);
    ASSERT_TRUE(e.ok());
    // Damage the KV after indexing: the head is still fine, only a full read sees it.
    ASSERT_TRUE(fx.mem.corrupt_byte(k_dir + "/" + e->file_name, e->file_bytes - 100, 0x40).ok());
    ASSERT_TRUE(store->lookup(chains_of(p)).hit());
    auto l = store->load(key_of(s));
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.error().code(), status_code::corrupt);
    EXPECT_NE(l.error().message().find("body_checksum"), std::string::npos) << l.error().message();
    // Gone from the index and the directory; a lookup now misses.
    EXPECT_FALSE(store->lookup(chains_of(p)).hit());
    EXPECT_EQ(fx.mem.file_size(k_dir + "/quarantine/" + e->file_name).ok(), true);
    EXPECT_EQ(store->load(key_of(s)).error().code(), status_code::not_found);
    auto st = store->stats();
    EXPECT_EQ(st.load_misses_by_reason["corrupt:body_checksum"], 1u);
    EXPECT_EQ(st.load_misses_by_reason["not_found"], 1u);
    EXPECT_EQ(st.n_quarantined, 1u);
    EXPECT_EQ(st.n_files, 0u);
    EXPECT_EQ(st.n_bytes, 0u);
}

// A file whose checksummed head declares more KV than its tokens can hold (the engine's
// bound, snapshot_store_options::max_kv_bytes) is rejected from its head alone: not
// indexed, quarantined, its KV never read. One declaring 6 GB for 350 tokens was read
// whole on the engine thread before its body checksum failed (every client waited 75 s).
TEST(snapshot_store, a_head_declaring_more_kv_than_its_tokens_hold_is_not_read) {
    fixture fx;
    auto p = make_path(1, {rc::high, rc::low});
    snapshot s = snapshot_of(p, p.blocks.size(), "ws", 7, 256 << 10);
    {
        auto store = fx.open();
        ASSERT_TRUE(store->put(s).ok());
    }
    auto o = fx.options();
    o.max_kv_bytes = [](const snapshot_meta & m) { return (uint64_t)m.n_tokens() * 64; };
    auto store = fx.open(o);
    EXPECT_TRUE(store->list().empty());
    EXPECT_FALSE(store->lookup(chains_of(p)).hit());
    auto st = store->stats();
    EXPECT_EQ(st.n_quarantined, 1u);
    EXPECT_EQ(st.n_file_reads, 0u);
    bool named = false;
    for (const auto & r : store->rejected()) named |= r.reason.find("declares") != std::string::npos;
    EXPECT_TRUE(named);
    // Within the bound, the same file is indexed and read.
    {
        auto again = fx.open();
        ASSERT_TRUE(again->put(s).ok());
    }
    o.max_kv_bytes = [](const snapshot_meta & m) { return (uint64_t)m.n_tokens() * (1u << 20); };
    auto fine = fx.open(o);
    ASSERT_EQ(fine->list().size(), 1u);
    EXPECT_TRUE(fine->load(key_of(s)).ok());
}

TEST(snapshot_store, without_quarantine_a_bad_file_is_removed) {
    fixture fx;
    auto o = fx.options();
    o.quarantine = false;
    auto store = fx.open(o);
    auto p = make_path(1, {rc::high});
    snapshot s = snapshot_of(p, p.blocks.size(), "ws");
    auto e = store->put(s);
    ASSERT_TRUE(fx.mem.truncate(k_dir + "/" + e->file_name, e->file_bytes - 1).ok());
    auto l = store->load(key_of(s));
    EXPECT_NE(l.error().message().find("truncated"), std::string::npos);
    EXPECT_EQ(*fx.mem.list_dir(k_dir), std::vector<std::string>{});
    EXPECT_EQ(store->stats().n_bad_removed, 1u);
    EXPECT_TRUE(store->rejected()[0].removed);
}

TEST(snapshot_store, another_profile_is_a_miss_naming_the_field_and_keeps_the_file) {
    fixture fx;
    auto store = fx.open();
    auto p = make_path(1, {rc::high});
    snapshot s = snapshot_of(p, p.blocks.size(), "ws");
    ASSERT_TRUE(store->put(s).ok());
    profile expected = s.meta.prof;
    expected.chunk_tokens = 32;
    auto l = store->load(key_of(s), &expected);
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.error().code(), status_code::failed_precondition);
    EXPECT_NE(l.error().message().find("chunk_tokens: '16' -> '32'"), std::string::npos) << l.error().message();
    EXPECT_EQ(store->list().size(), 1u);
    EXPECT_TRUE(store->load(key_of(s), &s.meta.prof).ok());
    auto st = store->stats();
    EXPECT_EQ(st.load_misses_by_reason["profile_drift"], 1u);
    EXPECT_EQ(st.n_load_hits, 1u);
}

TEST(snapshot_store, scan_only_changes_nothing) {
    fixture fx;
    auto p = make_path(1, {rc::high});
    ASSERT_TRUE(fx.mem.create_dirs(k_dir).ok());
    ASSERT_TRUE(fx.mem.write_file(k_dir + "/x.wcsnap.1-1.tmp", std::vector<uint8_t>(3, 0)).ok());
    ASSERT_TRUE(fx.mem.write_file(k_dir + "/bad.wcsnap", std::vector<uint8_t>(300, 0)).ok());
    auto o = fx.options();
    o.scan_only = true;
    auto store = fx.open(o);
    EXPECT_EQ(store->list().size(), 0u);
    ASSERT_EQ(store->rejected().size(), 1u);
    EXPECT_FALSE(store->rejected()[0].quarantined);
    EXPECT_EQ(*fx.mem.list_dir(k_dir), (std::vector<std::string>{"bad.wcsnap", "x.wcsnap.1-1.tmp"}));
}

TEST(snapshot_store, remove_and_remove_all) {
    fixture fx;
    auto store = fx.open();
    auto p = make_path(1, {rc::high, rc::low});
    snapshot a = snapshot_of(p, 2, "ws"), b = snapshot_of(p, 4, "ws"), c = snapshot_of(p, 6, "ws");
    for (auto * s : {&a, &b, &c}) ASSERT_TRUE(store->put(*s).ok());
    ASSERT_TRUE(store->remove(key_of(b)).ok());
    EXPECT_EQ(store->remove(key_of(b)).code(), status_code::not_found);
    EXPECT_EQ(store->list().size(), 2u);
    auto n = store->remove_all();
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, 2u);
    EXPECT_EQ(*fx.mem.list_dir(k_dir), std::vector<std::string>{"quarantine"});
    EXPECT_EQ(store->stats().n_bytes, 0u);
}

// ---- budget and eviction -----------------------------------------------------------------------

// Four files of ~equal size, classes by their last block.
struct budget_case {
    fixture fx;
    std::vector<snapshot> snaps;
    uint64_t file_bytes = 0;
    budget_case() {
        // One path per class so every file's last block has the class we want.
        std::vector<rc> classes = {rc::high, rc::low, rc::highest, rc::medium};
        for (size_t i = 0; i < classes.size(); ++i) {
            auto p = make_path(10 + (uint32_t)i, {classes[i]});
            snaps.push_back(snapshot_of(p, p.blocks.size(), "ws" + std::to_string(i % 2), 1, 2000));
        }
    }
};

TEST(snapshot_store, semantic_eviction_drops_the_lowest_class_first_then_lru) {
    budget_case bc;
    auto probe = bc.fx.open();
    uint64_t one = probe->put(bc.snaps[0])->file_bytes;
    ASSERT_TRUE(probe->remove_all().ok());
    probe.reset();

    auto o = bc.fx.options();
    o.budget_bytes = 3 * one + 10;  // room for three
    auto store = bc.fx.open(o);
    for (size_t i = 0; i < 3; ++i) {
        bc.fx.clock += 10;
        ASSERT_TRUE(store->put(bc.snaps[i]).ok());
    }
    bc.fx.clock += 10;
    ASSERT_TRUE(store->load(key_of(bc.snaps[1])).ok());  // the low one is the most recent: still first to go
    bc.fx.clock += 10;
    auto e = store->put(bc.snaps[3]);  // medium
    ASSERT_TRUE(e.ok()) << e.error().to_string();
    std::set<std::string> names;
    for (auto & x : store->list()) names.insert(x.file_name);
    EXPECT_FALSE(names.count(key_of(bc.snaps[1]).file_name())) << "low class evicted";
    EXPECT_EQ(names.size(), 3u);
    EXPECT_LE(store->stats().n_bytes, o.budget_bytes);
    EXPECT_EQ(store->stats().evictions_by_class[(size_t)rc::low], 1u);
    EXPECT_FALSE(bc.fx.mem.file_size(k_dir + "/" + key_of(bc.snaps[1]).file_name()).ok());

    // Next to go: medium (the one just put is safe only during its own put).
    bc.fx.clock += 10;
    ASSERT_TRUE(store->put(bc.snaps[1]).ok());
    names.clear();
    for (auto & x : store->list()) names.insert(x.file_name);
    EXPECT_FALSE(names.count(key_of(bc.snaps[3]).file_name())) << "medium evicted";
}

TEST(snapshot_store, lru_eviction_ignores_classes) {
    budget_case bc;
    auto probe = bc.fx.open();
    uint64_t one = probe->put(bc.snaps[0])->file_bytes;
    ASSERT_TRUE(probe->remove_all().ok());
    probe.reset();
    auto o = bc.fx.options();
    o.budget_bytes = 2 * one + 10;
    o.policy = eviction_policy::lru;
    auto store = bc.fx.open(o);
    bc.fx.clock += 10;
    ASSERT_TRUE(store->put(bc.snaps[2]).ok());  // highest, oldest
    bc.fx.clock += 10;
    ASSERT_TRUE(store->put(bc.snaps[1]).ok());  // low
    bc.fx.clock += 10;
    ASSERT_TRUE(store->put(bc.snaps[0]).ok());
    EXPECT_FALSE(store->find(key_of(bc.snaps[2])).has_value()) << "the oldest goes, whatever its class";
    EXPECT_TRUE(store->find(key_of(bc.snaps[1])).has_value());
}

TEST(snapshot_store, pinned_files_stay_and_a_put_that_cannot_fit_is_refused) {
    budget_case bc;
    auto probe = bc.fx.open();
    uint64_t one = probe->put(bc.snaps[0])->file_bytes;
    ASSERT_TRUE(probe->remove_all().ok());
    probe.reset();
    auto o = bc.fx.options();
    o.budget_bytes = 2 * one + 10;
    auto store = bc.fx.open(o);
    ASSERT_TRUE(store->put(bc.snaps[1]).ok());  // low
    ASSERT_TRUE(store->put(bc.snaps[0]).ok());  // high
    ASSERT_TRUE(store->pin(key_of(bc.snaps[1])).ok());
    ASSERT_TRUE(store->pin(key_of(bc.snaps[0])).ok());
    auto r = store->put(bc.snaps[2]);
    EXPECT_EQ(r.error().code(), status_code::resource_exhausted);
    EXPECT_FALSE(store->find(key_of(bc.snaps[2])).has_value());
    EXPECT_FALSE(bc.fx.mem.file_size(k_dir + "/" + key_of(bc.snaps[2]).file_name()).ok());
    EXPECT_EQ(store->list().size(), 2u);
    store->unpin(key_of(bc.snaps[1]));
    ASSERT_TRUE(store->put(bc.snaps[2]).ok());
    EXPECT_FALSE(store->find(key_of(bc.snaps[1])).has_value());  // the unpinned low one went
    EXPECT_EQ(store->stats().n_pinned, 1u);

    // Larger than the whole budget: refused before anything is written.
    auto big = bc.snaps[3];
    big.kv = testing::random_bytes(3 * one, 3);
    EXPECT_EQ(store->put(big).error().code(), status_code::resource_exhausted);
}

TEST(snapshot_store, a_workspace_budget_evicts_only_that_workspace) {
    budget_case bc;
    auto probe = bc.fx.open();
    uint64_t one = probe->put(bc.snaps[0])->file_bytes;
    ASSERT_TRUE(probe->remove_all().ok());
    probe.reset();
    auto o = bc.fx.options();
    o.workspace_budget_bytes = one + 10;  // one file per workspace
    auto store = bc.fx.open(o);
    ASSERT_TRUE(store->put(bc.snaps[0]).ok());  // ws0
    ASSERT_TRUE(store->put(bc.snaps[1]).ok());  // ws1
    ASSERT_TRUE(store->put(bc.snaps[2]).ok());  // ws0: evicts snaps[0]
    EXPECT_FALSE(store->find(key_of(bc.snaps[0])).has_value());
    EXPECT_TRUE(store->find(key_of(bc.snaps[1])).has_value());
    EXPECT_TRUE(store->find(key_of(bc.snaps[2])).has_value());
}

TEST(snapshot_store, rescan_enforces_a_smaller_budget) {
    budget_case bc;
    uint64_t one = 0;
    {
        auto store = bc.fx.open();
        for (auto & s : bc.snaps) {
            bc.fx.clock += 10;
            one = store->put(s)->file_bytes;
        }
    }
    auto o = bc.fx.options();
    o.budget_bytes = 2 * one + 10;
    auto store = bc.fx.open(o);
    EXPECT_EQ(store->list().size(), 2u);
    EXPECT_TRUE(store->find(key_of(bc.snaps[0])).has_value());  // high
    EXPECT_TRUE(store->find(key_of(bc.snaps[2])).has_value());  // highest
}

// ---- shared loads ------------------------------------------------------------------------------

// Once armed, holds the first read of `gated` until released, and counts the reads of
// it. Wraps another fs. Synchronises with condition variables only.
class gate_fs final : public file_system {
  public:
    gate_fs(file_system & base, std::string gated) : base_(base), gated_(std::move(gated)) {}
    void arm() {
        std::lock_guard lock(mu_);
        armed_ = true;
    }
    void wait_until_entered() {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return entered_; });
    }
    void release() {
        std::lock_guard lock(mu_);
        released_ = true;
        cv_.notify_all();
    }
    int reads() {
        std::lock_guard lock(mu_);
        return reads_;
    }
    result<std::unique_ptr<readable_file>> open_readable(const std::string & path) override {
        std::unique_lock lock(mu_);
        if (armed_ && path == gated_) {
            ++reads_;
            entered_ = true;
            cv_.notify_all();
            cv_.wait(lock, [&] { return released_; });
        }
        lock.unlock();
        return base_.open_readable(path);
    }
    result<std::unique_ptr<writable_file>> create_file(const std::string & p) override { return base_.create_file(p); }
    result<uint64_t> file_size(const std::string & p) override { return base_.file_size(p); }
    result<file_version> stat_file(const std::string & p) override { return base_.stat_file(p); }
    status rename_file(const std::string & a, const std::string & b) override { return base_.rename_file(a, b); }
    status remove_file(const std::string & p) override { return base_.remove_file(p); }
    result<std::vector<std::string>> list_dir(const std::string & d) override { return base_.list_dir(d); }
    status create_dirs(const std::string & d) override { return base_.create_dirs(d); }
    status sync_dir(const std::string & d) override { return base_.sync_dir(d); }

  private:
    file_system & base_;
    std::string gated_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool armed_ = false, entered_ = false, released_ = false;
    int reads_ = 0;
};

TEST(snapshot_store, concurrent_loads_of_one_key_read_the_file_once) {
    fixture fx;
    auto p = make_path(1, {rc::high, rc::low});
    snapshot s = snapshot_of(p, p.blocks.size(), "ws", 3, 100000);
    {
        auto store = fx.open();
        ASSERT_TRUE(store->put(s).ok());
    }
    gate_fs gate(fx.mem, k_dir + "/" + key_of(s).file_name());
    std::mutex mu;
    std::condition_variable cv;
    int joined = 0;
    auto o = fx.options(&gate);
    o.on_shared_load = [&](const snapshot_key & k) {
        EXPECT_EQ(k, key_of(s));
        std::lock_guard lock(mu);
        ++joined;
        cv.notify_all();
    };
    auto store = fx.open(o);  // the scan's head read passes: the gate is not armed yet
    gate.arm();

    constexpr int n = 4;
    std::vector<std::shared_ptr<const snapshot>> got(n);
    std::vector<status> errors(n);
    auto load = [&](int i) {
        auto r = store->load(key_of(s));
        if (r.ok()) got[i] = *r;
        else errors[i] = r.error();
    };
    std::vector<std::thread> threads;
    threads.emplace_back(load, 0);
    gate.wait_until_entered();  // the first load is reading, and is held there
    for (int i = 1; i < n; ++i) threads.emplace_back(load, i);
    {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return joined == n - 1; });  // every other load has joined it
    }
    gate.release();
    for (auto & t : threads) t.join();

    for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(errors[i].ok()) << errors[i].to_string();
        EXPECT_EQ(got[i].get(), got[0].get()) << "one snapshot object for all";
    }
    EXPECT_EQ(got[0]->kv, s.kv);
    EXPECT_EQ(gate.reads(), 1);
    auto st = store->stats();
    EXPECT_EQ(st.n_loads, (uint64_t)n);
    EXPECT_EQ(st.n_load_hits, (uint64_t)n);
    EXPECT_EQ(st.n_shared_loads, (uint64_t)n - 1);
    EXPECT_EQ(st.n_file_reads, 1u);

    // Afterwards a load reads again (nothing is cached in memory by the store).
    ASSERT_TRUE(store->load(key_of(s)).ok());
    EXPECT_EQ(gate.reads(), 2);
}

// Several threads putting, looking up, loading, removing and rescanning at once: every
// call returns a whole snapshot of what was written or a clean miss, and the counters add up.
TEST(snapshot_store, concurrent_mixed_calls_stay_consistent) {
    fixture fx;
    auto o = fx.options();
    o.budget_bytes = 12'000;  // a few files: eviction runs concurrently too
    auto store = fx.open(o);
    std::vector<testing::test_path> paths;
    for (uint32_t i = 0; i < 3; ++i) paths.push_back(make_path(50 + i, {rc::high, rc::low}));
    // Every version ever written is derived from (path, n_blocks, kv seed): recomputable.
    auto make = [&](size_t path, size_t n_blocks, uint32_t kv_seed) {
        return snapshot_of(paths[path], n_blocks, "ws", kv_seed, 2000);
    };
    std::atomic<int> bad{0};
    auto worker = [&](uint32_t seed) {
        std::mt19937 rng(seed);
        for (int i = 0; i < 300; ++i) {
            size_t path = rng() % paths.size(), n_blocks = 1 + rng() % paths[path].blocks.size();
            switch (rng() % 6) {
                case 0:
                case 1: (void)store->put(make(path, n_blocks, rng() % 4)); break;
                case 2: (void)store->lookup(chains_of(paths[path])); break;
                case 3:
                case 4: {
                    snapshot_key key{paths[path].blocks[n_blocks - 1].chain, "ws"};
                    auto l = store->load(key);
                    if (l.ok()) {
                        bool known = false;
                        for (uint32_t k = 0; k < 4; ++k) known |= (*l)->kv == make(path, n_blocks, k).kv;
                        if (!known || (*l)->tokens != make(path, n_blocks, 0).tokens) ++bad;
                    } else if (l.error().code() != status_code::not_found) {
                        ++bad;
                    }
                    break;
                }
                case 5:
                    if (rng() % 10 == 0) (void)store->rescan();
                    else (void)store->remove({paths[path].blocks[n_blocks - 1].chain, "ws"});
                    break;
            }
        }
    };
    std::vector<std::thread> threads;
    for (uint32_t t = 0; t < 4; ++t) threads.emplace_back(worker, 1000 + t);
    for (auto & t : threads) t.join();
    EXPECT_EQ(bad.load(), 0);
    auto st = store->stats();
    uint64_t misses = 0;
    for (auto & [reason, n] : st.load_misses_by_reason) misses += n;
    EXPECT_EQ(st.n_loads, st.n_load_hits + misses);
    EXPECT_EQ(st.n_lookups, st.n_lookup_hits + st.n_lookup_misses);
    EXPECT_LE(st.n_bytes, o.budget_bytes);
    EXPECT_EQ(st.n_quarantined, 0u);
    uint64_t sum = 0;
    for (auto & e : store->list()) sum += e.file_bytes;
    EXPECT_EQ(sum, st.n_bytes);
    // The directory holds exactly the indexed files (no temp, no orphan).
    auto names = fx.mem.list_dir(k_dir);
    EXPECT_EQ(names->size(), store->list().size() + 1);  // + quarantine/
}

}  // namespace
}  // namespace warmctx
