// The store under injected faults and crashes (faulty_fs over mem_fs): whatever fails and
// wherever the power goes, a reopened store never loads a torn file, and the previous
// good snapshot of a key survives a failed replace.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "store_test_util.h"
#include "store/snapshot_store.h"

namespace warmctx {
namespace {

using testing::make_path;
using testing::snapshot_of;
using rc = retention_class;

const std::string k_dir = "/cache/snapshots";

snapshot_key key_of(const snapshot & s) { return {s.meta.key(), s.meta.workspace}; }

std::unique_ptr<snapshot_store> open_store(file_system & fs) {
    snapshot_store_options o;
    o.dir = k_dir;
    o.fs = &fs;
    auto s = snapshot_store::open(o);
    EXPECT_TRUE(s.ok()) << s.error().to_string();
    return s.ok() ? std::move(s.value()) : nullptr;
}

bool has_temp_files(mem_fs & mem) {
    auto names = mem.list_dir(k_dir);  // (not `*mem.list_dir()` in the loop: it would dangle)
    for (const auto & n : *names)
        if (n.ends_with(".tmp")) return true;
    return false;
}

bool is_silent(fs_fault f) { return f == fs_fault::torn_write || f == fs_fault::bit_flip; }

struct two_versions {
    snapshot v1, v2;
    two_versions() {
        auto p = make_path(1, {rc::high, rc::low});
        v1 = snapshot_of(p, p.blocks.size(), "ws", 1, 3000, 1000);
        v2 = snapshot_of(p, p.blocks.size(), "ws", 2, 3000, 2000);
    }
};

TEST(snapshot_store_faults, failed_put_keeps_the_previous_version) {
    two_versions tv;
    for (fs_fault f : {fs_fault::no_space, fs_fault::short_write, fs_fault::sync_fails, fs_fault::io_error}) {
        SCOPED_TRACE(std::string(fs_fault_name(f)));
        mem_fs mem;
        faulty_fs ffs(mem);
        auto store = open_store(ffs);
        ASSERT_TRUE(store->put(tv.v1).ok());
        ffs.reset();  // count this put's operations from 0
        if (f == fs_fault::sync_fails) ffs.inject_on(fs_op::sync, 0, f);
        else ffs.inject_on(fs_op::append, 2, f);  // the KV's append
        auto r = store->put(tv.v2);
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.error().code(), status_code::io_error);
        if (f == fs_fault::no_space) {
            EXPECT_NE(r.error().message().find("No space left on device"), std::string::npos) << r.error().message();
        }
        EXPECT_FALSE(has_temp_files(mem)) << "the failed put cleaned up its temp file";
        auto l = store->load(key_of(tv.v1));
        ASSERT_TRUE(l.ok()) << l.error().to_string();
        EXPECT_EQ((*l)->kv, tv.v1.kv);
        EXPECT_EQ(store->stats().n_put_failures, 1u);
        // And after a crash too.
        mem.crash();
        auto again = open_store(mem);
        auto l2 = again->load(key_of(tv.v1));
        ASSERT_TRUE(l2.ok()) << l2.error().to_string();
        EXPECT_EQ((*l2)->kv, tv.v1.kv);
    }
}

TEST(snapshot_store_faults, crash_between_write_and_rename) {
    two_versions tv;
    for (uint64_t seed : {0, 1, 2, 3, 4, 5}) {
        mem_fs mem;
        faulty_fs ffs(mem);
        auto store = open_store(ffs);
        ASSERT_TRUE(store->put(tv.v1).ok());
        ffs.reset();
        ffs.inject_on(fs_op::rename, 0, fs_fault::crash);
        EXPECT_FALSE(store->put(tv.v2).ok());
        EXPECT_TRUE(ffs.crashed());
        store.reset();
        mem.crash(seed);  // a seeded crash may keep the temp file's name: rescan removes it
        auto again = open_store(mem);
        EXPECT_FALSE(has_temp_files(mem));
        auto l = again->load(key_of(tv.v1));
        ASSERT_TRUE(l.ok()) << l.error().to_string();
        EXPECT_EQ((*l)->kv, tv.v1.kv);
    }
}

// Every fault kind at every operation of a replacing put, then a crash (kind and seeded):
// the key then holds v1 or v2, whole - or, only after a silent fault (a device that lied
// about a write), nothing loadable, with the damage caught by the checksums.
TEST(snapshot_store_faults, every_fault_at_every_op_of_a_put_then_a_crash) {
    two_versions tv;
    uint64_t n_put_ops = 0;
    {
        mem_fs mem;
        faulty_fs ffs(mem);
        auto store = open_store(ffs);
        ASSERT_TRUE(store->put(tv.v1).ok());
        ffs.reset();
        ASSERT_TRUE(store->put(tv.v2).ok());
        n_put_ops = ffs.n_ops();
    }
    EXPECT_EQ(n_put_ops, 9u);  // create, 4 appends, sync, close, rename, sync_dir
    int n_cases = 0, n_v1 = 0, n_v2 = 0, n_caught = 0, n_torn_loaded = 0;
    for (fs_fault f : {fs_fault::io_error, fs_fault::short_write, fs_fault::no_space, fs_fault::sync_fails,
                       fs_fault::torn_write, fs_fault::bit_flip, fs_fault::crash}) {
        for (uint64_t k = 0; k < n_put_ops; ++k) {
            for (uint64_t seed : {0, 11, 12, 13, 14, 15, 16, 17, 18}) {
                SCOPED_TRACE(std::string(fs_fault_name(f)) + " at op " + std::to_string(k) + ", crash seed " +
                             std::to_string(seed));
                ++n_cases;
                mem_fs mem;
                faulty_fs ffs(mem);
                bool put_ok = false;
                {
                    auto store = open_store(ffs);
                    ASSERT_TRUE(store->put(tv.v1).ok());
                    ffs.reset();
                    ffs.inject_at(k, f);
                    put_ok = store->put(tv.v2).ok();
                }
                if (!is_silent(f)) {
                    EXPECT_FALSE(put_ok) << "a fault the device reports fails the put";
                }
                mem.crash(seed);
                auto store = open_store(mem);
                EXPECT_FALSE(has_temp_files(mem));
                auto list = store->list();
                ASSERT_LE(list.size(), 1u);
                if (list.empty()) {
                    // Only a lying device can take v1 away: the damaged v2 replaced it and
                    // was caught at the scan.
                    EXPECT_TRUE(is_silent(f) && put_ok);
                    EXPECT_EQ(store->stats().n_quarantined, 1u);
                    ++n_caught;
                    continue;
                }
                auto l = store->load(key_of(tv.v1));
                if (!l.ok()) {
                    EXPECT_EQ(l.error().code(), status_code::corrupt) << l.error().to_string();
                    EXPECT_TRUE(is_silent(f) && put_ok);
                    ++n_caught;
                    continue;
                }
                const auto & kv = (*l)->kv;
                if (kv == tv.v1.kv) ++n_v1;
                else if (kv == tv.v2.kv) ++n_v2;
                else ++n_torn_loaded;
                // A put that returned ok (and told the truth) survives the crash.
                if (put_ok && !is_silent(f)) {
                    EXPECT_EQ(kv, tv.v2.kv);
                }
            }
        }
    }
    EXPECT_EQ(n_torn_loaded, 0);
    EXPECT_GT(n_v1, 0);
    EXPECT_GT(n_v2, 0);
    EXPECT_GT(n_caught, 0);
    std::printf("fault matrix: %d cases, %d kept v1, %d got v2, %d damaged files caught, %d torn loaded\n", n_cases,
                n_v1, n_v2, n_caught, n_torn_loaded);
}

// Many puts over several keys with random faults and a crash at a random op: every file
// that loads afterwards is one of the versions written for its key, whole; with faults the
// device reports (no silent ones), every key that had a successful put still loads.
void random_faults_run(bool silent_faults, int n_runs) {
    int n_loaded = 0, n_caught = 0, n_torn_loaded = 0;
    for (int run = 1; run <= n_runs; ++run) {
        SCOPED_TRACE("run " + std::to_string(run));
        std::mt19937 rng((uint32_t)run);
        std::vector<testing::test_path> paths;
        for (uint32_t i = 0; i < 3; ++i) paths.push_back(make_path(100 + i, {rc::high, rc::medium, rc::low}));
        std::map<std::string, std::vector<std::vector<uint8_t>>> written;  // file name -> every version attempted
        std::set<std::string> committed;  // keys with at least one put that returned ok
        mem_fs mem;
        faulty_fs ffs(mem);
        {
            auto store = open_store(ffs);
            std::vector<fs_fault> kinds = {fs_fault::io_error, fs_fault::short_write, fs_fault::no_space,
                                           fs_fault::sync_fails};
            if (silent_faults) {
                kinds.push_back(fs_fault::torn_write);
                kinds.push_back(fs_fault::bit_flip);
            }
            ffs.inject_random((uint64_t)run, 0.04, kinds);
            ffs.inject_at(20 + rng() % 250, fs_fault::crash);
            for (int i = 0; i < 40 && !ffs.crashed(); ++i) {
                const auto & p = paths[rng() % paths.size()];
                size_t n_blocks = 1 + rng() % p.blocks.size();
                snapshot s = snapshot_of(p, n_blocks, "ws" + std::to_string(rng() % 2), (uint32_t)rng(),
                                         500 + rng() % 3000, 1000 + (uint64_t)i);
                written[key_of(s).file_name()].push_back(s.kv);
                if (store->put(s).ok()) committed.insert(key_of(s).file_name());
            }
        }
        mem.crash((uint64_t)run);
        auto store = open_store(mem);
        EXPECT_FALSE(has_temp_files(mem));
        const uint64_t n_caught_at_scan = store->stats().n_quarantined;
        if (!silent_faults) {
            EXPECT_EQ(n_caught_at_scan, 0u);
        }
        n_caught += (int)n_caught_at_scan;
        std::set<std::string> present;
        for (const auto & e : store->list()) {
            auto l = store->load(e.key);
            if (!l.ok()) {
                EXPECT_TRUE(silent_faults) << l.error().to_string();
                EXPECT_EQ(l.error().code(), status_code::corrupt);
                ++n_caught;
                continue;
            }
            ++n_loaded;
            present.insert(e.file_name);
            const auto & versions = written[e.file_name];
            if (std::find(versions.begin(), versions.end(), (*l)->kv) == versions.end()) ++n_torn_loaded;
        }
        if (!silent_faults) {
            for (const auto & name : committed) {
                EXPECT_TRUE(present.count(name)) << name << " lost after a successful put";
            }
        }
    }
    EXPECT_EQ(n_torn_loaded, 0);
    EXPECT_GT(n_loaded, 0);
    std::printf("random faults (%s): %d runs, %d files loaded whole, %d damaged files caught, %d torn loaded\n",
                silent_faults ? "with silent ones" : "reported only", n_runs, n_loaded, n_caught, n_torn_loaded);
}

TEST(snapshot_store_faults, random_reported_faults_and_crashes) { random_faults_run(false, 40); }
TEST(snapshot_store_faults, random_faults_including_lying_writes_and_crashes) { random_faults_run(true, 40); }

}  // namespace
}  // namespace warmctx
