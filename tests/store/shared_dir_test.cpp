// Several stores on one directory (options.shared, store_persistence::shared), as replicas
// behind a load balancer use it: each sees the others' files, the budget is the
// directory's, a file another evicted is a clean miss, another's write in progress is left
// alone; the workspace store's view follows the files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "../runtime/gated_fs.h"
#include "store_test_util.h"
#include "warmctx/fs.h"
#include "store/segment_store.h"
#include "store/snapshot_store.h"

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

// A segment file larger than any segment the store takes, planted in the shared
// directory, is not read by another store's refresh (the start-up load's size check holds
// there too): a 20 GB sparse file cost every request of the workspace a bad_alloc.
TEST(shared_dir, a_refresh_does_not_read_a_file_larger_than_any_segment) {
    mem_fs mem;
    testing::gated_fs counting(mem);
    store_limits lim;
    lim.max_segment_bytes = 1024;
    store_persistence sp{&counting, "/shared/workspaces"};
    sp.shared = true;
    segment_store a(lim, sp), b(lim, sp);
    auto any_id = [](std::string_view) { return true; };
    ASSERT_TRUE(a.load(kind_table{}, any_id).ok());
    ASSERT_TRUE(b.load(kind_table{}, any_id).ok());
    bool created = false;
    ASSERT_TRUE(a.put("ws", seg_of("map", "v1"), created).ok());
    ASSERT_TRUE(b.get("ws", "map"));
    std::string file;
    auto dirs = mem.list_dir("/shared/workspaces");
    ASSERT_TRUE(dirs.ok());
    for (const std::string & d : *dirs) {
        auto names = mem.list_dir("/shared/workspaces/" + d);
        if (!names.ok()) continue;
        for (const std::string & n : *names)
            if (n.size() > 6 && n.compare(n.size() - 6, 6, ".wcseg") == 0) file = "/shared/workspaces/" + d + "/" + n;
    }
    ASSERT_FALSE(file.empty());
    auto w = mem.create_file(file);
    ASSERT_TRUE(w.ok());
    const std::vector<uint8_t> big(1 << 20, 'x');
    ASSERT_TRUE((*w)->append(big).ok());
    ASSERT_TRUE((*w)->close().ok());
    const uint64_t before = counting.n_opens_for_read();
    EXPECT_FALSE(b.get("ws", "map")) << "a file the store refuses leaves the view";
    EXPECT_EQ(counting.n_opens_for_read(), before) << "the refresh read a file larger than any segment";
    bool created_again = false;
    EXPECT_TRUE(b.put("ws", seg_of("map", "v2"), created_again).ok());
    EXPECT_EQ(a.get("ws", "map")->content, "v2");
}

// A workspace directory that is a symbolic link (planted in a shared directory, pointing
// out of it) is not followed: not loaded, not refreshed into a view, nothing written or
// removed through it; the directory it points to keeps its files. It was written, read
// and deleted there.
TEST(shared_dir, a_workspace_directory_that_is_a_link_is_not_followed) {
    namespace sfs = std::filesystem;
    std::string tmpl = (sfs::temp_directory_path() / "warmctx-link-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    const sfs::path top = tmpl, root = top / "workspaces", outside = top / "outside";
    store_persistence sp{&posix_fs(), root.string()};
    sp.shared = true;
    auto any_id = [](std::string_view) { return true; };
    bool created = false;
    {
        segment_store a(store_limits{}, sp);
        ASSERT_TRUE(a.load(kind_table{}, any_id).ok());
        ASSERT_TRUE(a.put("ws", seg_of("map", "v1"), created).ok());
    }
    // Outside the directory: a copy of that workspace's files; inside, "evil" links there.
    sfs::copy(root / "ws", outside, sfs::copy_options::recursive);
    sfs::create_directory_symlink(outside, root / "evil");
    auto outside_files = [&] {
        std::map<std::string, uintmax_t> m;
        for (const auto & e : sfs::directory_iterator(outside)) m[e.path().filename().string()] = e.file_size();
        return m;
    };
    const auto before = outside_files();
    ASSERT_FALSE(before.empty());

    segment_store b(store_limits{}, sp);
    auto rep = b.load(kind_table{}, any_id);
    ASSERT_TRUE(rep.ok());
    bool named = false;
    for (const auto & p : rep->problems) named |= p.find("symbolic link") != std::string::npos;
    EXPECT_TRUE(named) << "the load names the link";
    EXPECT_FALSE(b.get("evil", "map")) << "read through the link";
    EXPECT_TRUE(b.get("ws", "map")) << "the real workspace is read";
    EXPECT_FALSE(b.put("evil", seg_of("map", "v2"), created).ok()) << "written through the link";
    EXPECT_FALSE(b.put("evil", seg_of("other", "x"), created).ok());
    auto dropped = b.drop("evil");
    EXPECT_TRUE(!dropped.ok() || *dropped == 0);
    EXPECT_EQ(outside_files(), before) << "the directory the link points to changed";
    std::error_code ec;
    sfs::remove_all(top, ec);
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

// ---- two processes on one real directory ------------------------------------------------------

// Child `id` of the test below: for `seconds`, puts snapshots of 8 paths (its own workspace)
// and looks up and loads any path (the other child's too), with a directory budget of about
// four files, so both evict all the time. Writes its log to <dir>.<id>.log: "put NAME",
// "evict NAME", "load_ok", "load_gone", "error WHAT". Exits 0, or 3 when the store would not open.
[[noreturn]] void stress_child(const std::string & dir, int id, uint64_t budget, double seconds) {
    std::ofstream log(dir + "." + std::to_string(id) + ".log");
    snapshot_store_options o;
    o.dir = dir;
    o.shared = true;
    o.shared_refresh_ms = 0;
    o.budget_bytes = budget;
    o.on_evict = [&log](const std::string & name) { log << "evict " << name << "\n"; };
    auto store = snapshot_store::open(o);
    if (!store) _exit(3);
    std::mt19937 rng(1000 + id);
    const auto t_end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < t_end) {
        const uint32_t path_seed = rng() % 8;
        auto p = make_path(path_seed, {rc::high, rc::high, rc::low});
        const size_t n_blocks = 3 + rng() % (p.blocks.size() - 2);
        // The KV is a function of (path, length): any reader can check the bytes it loads.
        snapshot snap = snapshot_of(p, n_blocks, "ws-" + std::to_string(id), path_seed * 100 + (uint32_t)n_blocks, 20000);
        auto e = (*store)->put(snap);
        if (e.ok()) log << "put " << e->file_name << "\n";
        else log << "error put: " << e.error().to_string() << "\n";
        auto q = make_path(rng() % 8, {rc::high, rc::high, rc::low});
        auto m = (*store)->lookup(chains_of(q));
        if (!m.hit()) continue;
        auto l = (*store)->load(m.key);
        if (l.ok()) {
            const size_t nb = (*l)->meta.blocks.size();
            uint32_t seed = 0;
            for (uint32_t s = 0; s < 8; ++s)
                if ((*l)->meta.blocks[0].chain == make_path(s, {rc::high, rc::high, rc::low}).blocks[0].chain) seed = s;
            const bool same = (*l)->kv == testing::random_bytes(20000, seed * 100 + (uint32_t)nb);
            log << (same ? "load_ok" : "error load: other bytes") << "\n";
        } else if (l.error().code() == status_code::not_found) {
            log << "load_gone\n";
        } else {
            log << "error load: " << l.error().to_string() << "\n";
        }
    }
    for (const rejected_file & r : (*store)->rejected()) log << "error rejected " << r.file_name << ": " << r.reason << "\n";
    log.close();
    _exit(0);
}

TEST(shared_dir, two_processes_put_load_and_evict_in_one_directory_and_lose_nothing) {
    const std::string dir = std::filesystem::temp_directory_path() / ("warmctx-shared-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const uint64_t budget = 4 * 22000;  // about four files of 20 kB of KV
    const double seconds = std::getenv("WARMCTX_SHARED_DIR_SECONDS") ? std::atof(std::getenv("WARMCTX_SHARED_DIR_SECONDS")) : 3.0;
    pid_t kids[2];
    for (int id = 0; id < 2; ++id) {
        kids[id] = ::fork();
        ASSERT_GE(kids[id], 0);
        if (kids[id] == 0) stress_child(dir, id, budget, seconds);
    }
    for (pid_t k : kids) {
        int st = 0;
        ASSERT_EQ(::waitpid(k, &st, 0), k);
        ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "a child failed: " << st;
    }
    std::map<std::string, int> puts, evictions;
    std::map<std::string, int> counts;
    std::vector<std::string> errors;
    for (int id = 0; id < 2; ++id) {
        std::ifstream log(dir + "." + std::to_string(id) + ".log");
        for (std::string line; std::getline(log, line);) {
            if (line.rfind("put ", 0) == 0) ++puts[line.substr(4)];
            else if (line.rfind("evict ", 0) == 0) ++evictions[line.substr(6)];
            else if (line.rfind("error", 0) == 0) errors.push_back(line);
            ++counts[line.substr(0, line.find(' '))];
        }
        std::filesystem::remove(dir + "." + std::to_string(id) + ".log");
    }
    EXPECT_TRUE(errors.empty()) << errors.size() << " errors; the first: " << errors.front();
    // Every file put is on disk at the end, or someone evicted it: nothing else removes one.
    std::set<std::string> present;
    uint64_t dir_bytes = 0;
    for (const auto & e : std::filesystem::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        EXPECT_FALSE(name.ends_with(".tmp")) << "a temp file was left: " << name;
        if (!name.ends_with(".wcsnap")) continue;
        present.insert(name);
        dir_bytes += e.file_size();
    }
    size_t n_lost = 0;
    for (const auto & [name, n] : puts)
        if (!present.count(name) && !evictions.count(name)) ++n_lost;
    EXPECT_EQ(n_lost, 0u) << "files put, never evicted, and gone";
    // The budget is the directory's (the last put of one process may not have seen the
    // other's last one: one file of slack).
    EXPECT_LE(dir_bytes, budget + 22000);
    // Every file left loads and verifies; nothing goes to quarantine.
    snapshot_store_options o;
    o.dir = dir;
    o.scan_only = true;
    auto check = snapshot_store::open(o);
    ASSERT_TRUE(check.ok());
    EXPECT_TRUE((*check)->rejected().empty());
    for (const snapshot_entry & e : (*check)->list()) EXPECT_TRUE((*check)->load(e.key).ok()) << e.file_name;
    EXPECT_GT(counts["put"], 20);
    EXPECT_GT(counts["evict"], 10);
    EXPECT_GT(counts["load_ok"], 10);
    std::printf("two processes, %.1f s: %d puts, %d evictions, %d loads ok, %d loads of a file the other evicted, "
                "%zu files (%llu bytes) at the end\n",
                seconds, counts["put"], counts["evict"], counts["load_ok"], counts["load_gone"], present.size(),
                (unsigned long long)dir_bytes);
    std::filesystem::remove_all(dir);
}

// Two processes' workspace stores on one directory: the workspace bound is the
// directory's, and each reads every workspace the other's put acknowledged, lists what is
// in the directory (not only what it has seen), and drops from its list what the other
// deleted; a restarted one loads them all. Each store used to bound its own view: with
// the bound reached there, it read none of the other's newest workspaces.
TEST(shared_dir, two_processes_share_the_workspace_bound_and_read_every_acknowledged_put) {
    const std::string dir =
        std::filesystem::temp_directory_path() / ("warmctx-shared-ws-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    store_limits lim;
    lim.max_workspaces = 8;
    store_persistence sp{&posix_fs(), dir};
    sp.shared = true;
    sp.shared_refresh_ms = 0;  // every listing re-reads the directory
    auto any_id = [](std::string_view) { return true; };
    auto in_child = [&](const std::function<int(segment_store &)> & body) {
        const pid_t kid = ::fork();
        if (kid == 0) {
            segment_store s(lim, sp);
            ::_exit(s.load(kind_table{}, any_id).ok() ? body(s) : 2);
        }
        int st = 0;
        return ::waitpid(kid, &st, 0) == kid && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    };
    segment_store b(lim, sp);
    ASSERT_TRUE(b.load(kind_table{}, any_id).ok());
    // Another process puts six workspaces.
    ASSERT_EQ(0, in_child([](segment_store & a) {
        bool created = false;
        for (int i = 0; i < 6; ++i)
            if (!a.put("a-" + std::to_string(i), seg_of("map", "from a " + std::to_string(i)), created).ok()) return 3;
        return 0;
    }));
    // This one puts six more: the directory holds at most eight workspaces, so two fit.
    int taken = 0, full = 0;
    for (int i = 0; i < 6; ++i) {
        bool created = false;
        store_refusal why = store_refusal::none;
        if (b.put("b-" + std::to_string(i), seg_of("map", "from b"), created, nullptr, &why).ok()) ++taken;
        else if (why == store_refusal::store_full) ++full;
    }
    EXPECT_EQ(taken, 2);
    EXPECT_EQ(full, 4);
    // It reads every workspace the other acknowledged, and lists all eight.
    for (int i = 0; i < 6; ++i) {
        auto g = b.get("a-" + std::to_string(i), "map");
        ASSERT_TRUE(g) << "a-" << i;
        EXPECT_EQ(g->content, "from a " + std::to_string(i));
    }
    EXPECT_EQ(b.workspaces().size(), 8u);
    // A third process deletes one of the first's: gone from this one's list and reads.
    ASSERT_EQ(0, in_child([](segment_store & c) {
        auto n = c.drop("a-0");
        return n.ok() && *n == 1 ? 0 : 4;
    }));
    const auto listed = b.workspaces();
    EXPECT_EQ(listed.size(), 7u);
    EXPECT_EQ(std::count(listed.begin(), listed.end(), "a-0"), 0);
    EXPECT_FALSE(b.get("a-0", "map"));
    // A restarted process loads all seven, and the bound leaves room for one more.
    segment_store d(lim, sp);
    auto rep = d.load(kind_table{}, any_id);
    ASSERT_TRUE(rep.ok());
    EXPECT_EQ(rep->n_workspaces, 7u);
    EXPECT_EQ(rep->n_skipped, 0u);
    bool created = false;
    EXPECT_TRUE(d.put("d-0", seg_of("map", "from d"), created).ok());
    EXPECT_FALSE(b.put("b-9", seg_of("map", "from b"), created).ok());  // b sees d's: eight
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace warmctx
