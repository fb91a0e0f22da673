// The durable workspace store on the in-memory file system (crash semantics) and under
// injected faults: what was acknowledged survives a restart or a crash, damage is
// quarantined and never loaded, a failed write changes nothing.
#include <gtest/gtest.h>

#include "server/workspace_store.h"
#include "warmctx/fs.h"

namespace warmctx::server_detail {
namespace {

const std::string k_dir = "/cache/kv/workspaces";

segment seg(const std::string & id, segment_kind k, const std::string & content) {
    segment s;
    s.id = id;
    s.kind = k;
    s.content = content;
    return s;
}

workspace_store durable(file_system & fs) { return workspace_store(store_limits{}, store_persistence{&fs, k_dir}); }

void put_ok(workspace_store & st, const std::string & ws, segment s) {
    bool created = false;
    auto e = st.put(ws, std::move(s), created);
    ASSERT_FALSE(e.has_value()) << e->message;
}

TEST(WorkspaceStore, WhatWasStoredComesBackAfterARestartMostUsedFirst) {
    mem_fs fs;
    {
        auto st = durable(fs);
        ASSERT_TRUE(st.load(kind_table()).ok());
        put_ok(st, "alpha", seg("sys", segment_kind::system, "be terse"));
        put_ok(st, "alpha", seg("src/a.cc", segment_kind::pinned_file, "int main() {}"));
        put_ok(st, "beta", seg("map", segment_kind::repo_map, "a.cc b.cc"));
        put_ok(st, "beta", seg("map", segment_kind::repo_map, "a.cc b.cc c.cc"));  // replaced
        auto gone = st.erase("alpha", "sys");
        ASSERT_TRUE(gone.ok() && *gone);
        st.note_use("beta");
        st.note_use("beta");
        st.note_use("alpha");
        ASSERT_TRUE(st.flush_uses().ok());
    }
    fs.crash();  // everything above was acknowledged, so durable
    auto st = durable(fs);
    auto rep = st.load(kind_table());
    ASSERT_TRUE(rep.ok());
    EXPECT_EQ(rep->n_workspaces, 2u);
    EXPECT_EQ(rep->n_segments, 2u);
    EXPECT_EQ(rep->n_quarantined, 0u);
    auto a = st.list("alpha");
    ASSERT_TRUE(a.has_value());
    ASSERT_EQ(a->size(), 1u);
    EXPECT_EQ((*a)[0].id, "src/a.cc");
    EXPECT_EQ((*a)[0].content, "int main() {}");
    EXPECT_EQ((*a)[0].kind, segment_kind::pinned_file);
    auto b = st.get("beta", "map");
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->content, "a.cc b.cc c.cc");
    EXPECT_EQ(st.use_order(), (std::vector<std::string>{"beta", "alpha"}));
    EXPECT_EQ(st.n_bytes(), std::string("src/a.cc" "int main() {}" "map" "a.cc b.cc c.cc").size());
}

TEST(WorkspaceStore, DroppingAWorkspaceRemovesItsFiles) {
    mem_fs fs;
    {
        auto st = durable(fs);
        ASSERT_TRUE(st.load(kind_table()).ok());
        put_ok(st, "alpha", seg("sys", segment_kind::system, "x"));
        put_ok(st, "alpha", seg("rules", segment_kind::instructions, "y"));
        auto n = st.drop("alpha");
        ASSERT_TRUE(n.ok());
        EXPECT_EQ(*n, 2u);
    }
    fs.crash();
    auto st = durable(fs);
    auto rep = st.load(kind_table());
    ASSERT_TRUE(rep.ok());
    EXPECT_EQ(rep->n_segments, 0u);
    EXPECT_FALSE(st.list("alpha").has_value());
}

TEST(WorkspaceStore, ADamagedFileIsQuarantinedAndTheRestLoads) {
    mem_fs fs;
    {
        auto st = durable(fs);
        ASSERT_TRUE(st.load(kind_table()).ok());
        put_ok(st, "alpha", seg("sys", segment_kind::system, "be terse"));
        put_ok(st, "alpha", seg("map", segment_kind::repo_map, "a.cc b.cc"));
    }
    auto names = fs.list_dir(k_dir + "/alpha");
    ASSERT_TRUE(names.ok());
    ASSERT_EQ(names->size(), 2u);
    const std::string victim = k_dir + "/alpha/" + (*names)[0];
    auto size = fs.file_size(victim);
    ASSERT_TRUE(size.ok());
    ASSERT_TRUE(fs.corrupt_byte(victim, *size - 3, 0x20).ok());  // in the body: the checksum catches it
    // A write a crash interrupted, and a file that is not a store file at all.
    ASSERT_TRUE(fs.write_file(k_dir + "/alpha/x.wcseg.tmp", std::span<const uint8_t>()).ok());
    const std::string junk = "hello";
    ASSERT_TRUE(fs.write_file(k_dir + "/alpha/junk.wcseg",
                              std::span<const uint8_t>(reinterpret_cast<const uint8_t *>(junk.data()), junk.size()))
                    .ok());

    auto st = durable(fs);
    auto rep = st.load(kind_table());
    ASSERT_TRUE(rep.ok());
    EXPECT_EQ(rep->n_segments, 1u);
    EXPECT_EQ(rep->n_quarantined, 2u);
    ASSERT_EQ(rep->problems.size(), 2u);
    EXPECT_NE(rep->problems[0].find("checksum mismatch"), std::string::npos) << rep->problems[0];
    auto q = fs.list_dir(k_dir + "/.quarantine");
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->size(), 2u);
    auto left = fs.list_dir(k_dir + "/alpha");
    ASSERT_TRUE(left.ok());
    EXPECT_EQ(left->size(), 1u) << "the damaged files and the temporary file are gone from the workspace";
}

// A workspace may be named "quarantine": the store's own damaged files live in
// .quarantine/, which no workspace id can name. (Its 21 segments were acknowledged, all
// 404 after a restart with no log line, and a later quarantine deleted 5 of its files:
// issue 30 item 5.) An older version's quarantine/ files move to .quarantine/.
TEST(WorkspaceStore, AWorkspaceNamedQuarantineKeepsItsSegments) {
    mem_fs fs;
    const std::string legacy = k_dir + "/quarantine/1700000000000-alpha-0123.wcseg";
    {
        auto st = durable(fs);
        ASSERT_TRUE(st.load(kind_table()).ok());
        for (int i = 0; i < 20; ++i) put_ok(st, "quarantine", seg("s" + std::to_string(i), segment_kind::instructions, "x"));
        put_ok(st, "alpha", seg("sys", segment_kind::system, "be terse"));
        const std::string junk = "damaged";
        ASSERT_TRUE(fs.write_file(legacy, std::span<const uint8_t>(reinterpret_cast<const uint8_t *>(junk.data()), junk.size())).ok());
    }
    // Damage in another workspace, quarantined at each of 20 restarts: the trim of the
    // quarantine (16 files) must never reach the workspace's files.
    for (int round = 0; round < 20; ++round) {
        auto names = fs.list_dir(k_dir + "/alpha");
        ASSERT_TRUE(names.ok());
        const std::string junk = "hello" + std::to_string(round);
        ASSERT_TRUE(fs.write_file(k_dir + "/alpha/junk" + std::to_string(round) + ".wcseg",
                                  std::span<const uint8_t>(reinterpret_cast<const uint8_t *>(junk.data()), junk.size()))
                        .ok());
        auto st = durable(fs);
        auto rep = st.load(kind_table());
        ASSERT_TRUE(rep.ok());
        EXPECT_EQ(rep->n_quarantined, 1u) << round;
        EXPECT_EQ(rep->n_segments, 21u) << round;
        auto q = st.list("quarantine");
        ASSERT_TRUE(q.has_value()) << round;
        EXPECT_EQ(q->size(), 20u) << round;
    }
    EXPECT_FALSE(fs.file_size(legacy).ok()) << "the legacy quarantine file stayed among the workspace's";
    auto moved = fs.list_dir(k_dir + "/.quarantine");
    ASSERT_TRUE(moved.ok());
    EXPECT_LE(moved->size(), 16u);
    auto kept = fs.list_dir(k_dir + "/quarantine");
    ASSERT_TRUE(kept.ok());
    EXPECT_EQ(kept->size(), 20u);
}

// The file system underneath, recording the files created.
class recording_fs final : public file_system {
  public:
    explicit recording_fs(file_system & base) : base_(base) {}
    std::vector<std::string> created;
    result<std::unique_ptr<writable_file>> create_file(const std::string & p) override {
        created.push_back(p);
        return base_.create_file(p);
    }
    result<std::unique_ptr<readable_file>> open_readable(const std::string & p) override { return base_.open_readable(p); }
    result<uint64_t> file_size(const std::string & p) override { return base_.file_size(p); }
    result<file_version> stat_file(const std::string & p) override { return base_.stat_file(p); }
    status rename_file(const std::string & f, const std::string & t) override { return base_.rename_file(f, t); }
    status remove_file(const std::string & p) override { return base_.remove_file(p); }
    result<std::vector<std::string>> list_dir(const std::string & d) override { return base_.list_dir(d); }
    status create_dirs(const std::string & d) override { return base_.create_dirs(d); }
    status sync_dir(const std::string & d) override { return base_.sync_dir(d); }

  private:
    file_system & base_;
};

// Two stores on one directory (two servers on one home, or two writes of one segment)
// never write the same temp file: it was "<name>.tmp" for every write of a segment, so
// concurrent PUTs from two servers collided and answered 507 (issue 30 item 6).
TEST(WorkspaceStore, TempFileNamesAreUniquePerWrite) {
    mem_fs base;
    recording_fs fs(base);
    auto a = durable(fs);
    auto b = durable(fs);
    ASSERT_TRUE(a.load(kind_table()).ok());
    ASSERT_TRUE(b.load(kind_table()).ok());
    put_ok(a, "w", seg("s", segment_kind::instructions, "one"));
    put_ok(b, "w", seg("s", segment_kind::instructions, "two"));
    put_ok(a, "w", seg("s", segment_kind::instructions, "three"));
    std::vector<std::string> temps;
    for (const std::string & p : fs.created)
        if (p.size() > 4 && p.compare(p.size() - 4, 4, ".tmp") == 0) temps.push_back(p);
    ASSERT_EQ(temps.size(), 3u);
    EXPECT_NE(temps[0], temps[1]);
    EXPECT_NE(temps[0], temps[2]);
    EXPECT_NE(temps[1], temps[2]);
    auto again = durable(base);
    ASSERT_TRUE(again.load(kind_table()).ok());
    EXPECT_EQ(again.get("w", "s")->content, "three");
    auto names = base.list_dir(k_dir + "/w");
    ASSERT_TRUE(names.ok());
    EXPECT_EQ(names->size(), 1u) << "a temp file was left behind";
}

// A full disk is 507 wherever it happens, and no answer tells a client where the server
// keeps its files (the store's 507 carried absolute paths, and an explicit snapshot on a
// full disk answered 500; issue 30 item 9).
TEST(WorkspaceStore, AFullDiskIs507WithoutPaths) {
    const api_error e =
        store_write_error(io_error("write '/home/me/.cache/warmctx/kv/workspaces/w/abc.wcseg.7-2.tmp': No space left on device"));
    EXPECT_EQ(e.http_status, 507);
    EXPECT_EQ(e.message.find("/home"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("'abc.wcseg.7-2.tmp': No space left on device"), std::string::npos) << e.message;
    const api_error s = error_from_status(io_error("create '/var/cache/kv/0123.wcsnap.1-1.tmp': No space left on device"));
    EXPECT_EQ(s.http_status, 507);
    EXPECT_EQ(s.code, "insufficient_storage");
    EXPECT_EQ(s.message.find("/var"), std::string::npos) << s.message;
    EXPECT_EQ(error_from_status(io_error("read '/x/y': Input/output error")).http_status, 500);
    EXPECT_EQ(without_paths("a '/b/c' and '/d/e/f' and 'g' and '/h"), "a 'c' and 'f' and 'g' and '/h");
}

TEST(WorkspaceStore, AFailedWriteIsA507AndChangesNothing) {
    mem_fs base;
    faulty_fs fs(base);
    auto st = durable(fs);
    ASSERT_TRUE(st.load(kind_table()).ok());
    put_ok(st, "alpha", seg("sys", segment_kind::system, "old"));
    fs.inject_on(fs_op::append, 1, fs_fault::no_space);  // the next file write
    bool created = false;
    auto e = st.put("alpha", seg("sys", segment_kind::system, "new"), created);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->http_status, 507);
    EXPECT_NE(e->message.find("No space left"), std::string::npos) << e->message;
    EXPECT_EQ(st.get("alpha", "sys")->content, "old");
    EXPECT_EQ(st.n_write_failures(), 1u);

    auto again = durable(base);
    ASSERT_TRUE(again.load(kind_table()).ok());
    EXPECT_EQ(again.get("alpha", "sys")->content, "old");
    auto names = base.list_dir(k_dir + "/alpha");
    ASSERT_TRUE(names.ok());
    EXPECT_EQ(names->size(), 1u) << "no temporary file is left behind";
}

TEST(WorkspaceStore, TheSameContentAgainWritesNothing) {
    mem_fs base;
    faulty_fs fs(base);
    auto st = durable(fs);
    ASSERT_TRUE(st.load(kind_table()).ok());
    put_ok(st, "alpha", seg("sys", segment_kind::system, "same"));
    fs.reset();
    fs.inject_at(0, fs_fault::io_error);  // the next write would fail
    bool created = true, changed = true;
    auto e = st.put("alpha", seg("sys", segment_kind::system, "same"), created, &changed);
    EXPECT_FALSE(e.has_value());
    EXPECT_FALSE(created);
    EXPECT_FALSE(changed);
}

TEST(WorkspaceStore, SealedFilesRefuseEveryDamage) {
    const std::string sealed = seal_store_file("{\"a\":1}");
    std::vector<uint8_t> b(sealed.begin(), sealed.end());
    ASSERT_TRUE(unseal_store_file(b).ok());
    EXPECT_EQ(*unseal_store_file(b), "{\"a\":1}");
    for (size_t i = 0; i < b.size(); ++i) {
        auto d = b;
        d[i] ^= 0x01;
        EXPECT_FALSE(unseal_store_file(d).ok()) << "byte " << i;
    }
    for (size_t n = 0; n < b.size(); ++n) {
        std::vector<uint8_t> t(b.begin(), b.begin() + (long)n);
        EXPECT_FALSE(unseal_store_file(t).ok()) << "truncated to " << n;
    }
}

}  // namespace
}  // namespace warmctx::server_detail
