// The file-system seam: the same behaviour from posix_fs and mem_fs, mem_fs's crash
// model, and faulty_fs's deterministic faults.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <sys/stat.h>

#include "warmctx/fs.h"

namespace warmctx {
namespace {

std::span<const uint8_t> bytes_of(const std::string & s) { return {(const uint8_t *)s.data(), s.size()}; }
std::string text_of(const result<std::vector<uint8_t>> & r) {
    return r.ok() ? std::string(r->begin(), r->end()) : "<" + r.error().to_string() + ">";
}

// ---- the contract, on both implementations ---------------------------------------------------

class fs_contract : public ::testing::TestWithParam<bool> {
  protected:
    void SetUp() override {
        if (GetParam()) {
            char tmpl[] = "/tmp/warmctx-fs-test-XXXXXX";
            ASSERT_NE(::mkdtemp(tmpl), nullptr);
            root_ = tmpl;
            fs_ = &posix_fs();
        } else {
            root_ = "/mem";
            fs_ = &mem_;
            ASSERT_TRUE(mem_.create_dirs(root_).ok());
        }
    }
    void TearDown() override {
        if (GetParam()) std::filesystem::remove_all(root_);
    }
    std::string root_;
    file_system * fs_ = nullptr;
    mem_fs mem_;
};

TEST_P(fs_contract, write_read_rename_list_remove) {
    file_system & fs = *fs_;
    const std::string a = root_ + "/a.txt", b = root_ + "/b.txt";
    {
        auto f = fs.create_file(a);
        ASSERT_TRUE(f.ok()) << f.error().to_string();
        ASSERT_TRUE((*f)->append(bytes_of("hello ")).ok());
        ASSERT_TRUE((*f)->append(bytes_of("world")).ok());
        ASSERT_TRUE((*f)->sync().ok());
        ASSERT_TRUE((*f)->close().ok());
    }
    EXPECT_EQ(text_of(fs.read_file(a)), "hello world");
    EXPECT_EQ(*fs.file_size(a), 11u);
    EXPECT_EQ(text_of(fs.read_range(a, 6, 100)), "world");
    EXPECT_EQ(text_of(fs.read_range(a, 20, 5)), "");
    {
        auto r = fs.open_readable(a);
        ASSERT_TRUE(r.ok());
        uint8_t buf[4];
        EXPECT_EQ((*r)->read_at(9, 4, buf).code(), status_code::out_of_range);
    }
    ASSERT_TRUE(fs.write_file(b, bytes_of("old")).ok());
    {
        // A reader opened before a rename keeps reading what it opened.
        auto r = fs.open_readable(b);
        ASSERT_TRUE(r.ok());
        ASSERT_TRUE(fs.rename_file(a, b).ok());
        std::vector<uint8_t> buf(3);
        ASSERT_TRUE((*r)->read_at(0, 3, buf.data()).ok());
        EXPECT_EQ(std::string(buf.begin(), buf.end()), "old");
    }
    EXPECT_EQ(text_of(fs.read_file(b)), "hello world");
    EXPECT_EQ(fs.file_size(a).error().code(), status_code::not_found);
    ASSERT_TRUE(fs.create_dirs(root_ + "/x/y/z").ok());
    ASSERT_TRUE(fs.create_dirs(root_ + "/x/y/z").ok());  // exists: ok
    ASSERT_TRUE(fs.sync_dir(root_).ok());
    auto names = fs.list_dir(root_);
    ASSERT_TRUE(names.ok());
    EXPECT_EQ(*names, (std::vector<std::string>{"b.txt", "x"}));
    ASSERT_TRUE(fs.remove_file(b).ok());
    EXPECT_EQ(fs.remove_file(b).code(), status_code::not_found);
    EXPECT_EQ(fs.open_readable(b).error().code(), status_code::not_found);
    EXPECT_EQ(fs.create_file(root_ + "/no/such/dir/f").error().code(), status_code::not_found);
    EXPECT_EQ(fs.list_dir(root_ + "/nope").error().code(), status_code::not_found);
}

// stat_file: a version that changes with the bytes, on both implementations.
TEST_P(fs_contract, stat_file_tells_a_changed_file) {
    const std::string p = root_ + "/v";
    const std::vector<uint8_t> a = {1, 2, 3}, b = {4, 5, 6};
    ASSERT_TRUE(fs_->write_file(p, a).ok());
    auto v1 = fs_->stat_file(p);
    ASSERT_TRUE(v1.ok()) << v1.error().to_string();
    EXPECT_EQ(v1->size, 3u);
    EXPECT_EQ(*fs_->stat_file(p), *v1);  // unchanged: the same version
    // a same-size replace by rename is another version
    ASSERT_TRUE(fs_->write_file(p + ".tmp", b).ok());
    ASSERT_TRUE(fs_->rename_file(p + ".tmp", p).ok());
    auto v2 = fs_->stat_file(p);
    ASSERT_TRUE(v2.ok());
    EXPECT_NE(*v2, *v1);
    EXPECT_EQ(fs_->stat_file(root_ + "/missing").error().code(), status_code::not_found);
}

INSTANTIATE_TEST_SUITE_P(impls, fs_contract, ::testing::Values(true, false),
                         [](const auto & info) { return info.param ? "posix" : "mem"; });

TEST(posix_fs, errors_carry_the_errno_text) {
    auto r = posix_fs().open_readable("/definitely/not/here");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("No such file or directory"), std::string::npos) << r.error().message();
}

// A FIFO where a file was expected (a snapshot's name, a model path) is refused at once;
// a blocking open would wait for a writer forever.
TEST(posix_fs, a_fifo_is_refused_not_waited_on) {
    char tmpl[] = "/tmp/warmctx-fs-fifo-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    const std::string fifo = std::string(tmpl) + "/x.wcsnap";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    auto r = posix_fs().open_readable(fifo);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), status_code::io_error);
    EXPECT_NE(r.error().message().find("not a regular file"), std::string::npos) << r.error().message();
    EXPECT_EQ(posix_fs().stat_file(fifo).error().code(), status_code::io_error);
    std::filesystem::remove_all(tmpl);
}

// ---- mem_fs: what a crash keeps ------------------------------------------------------------

TEST(mem_fs, unsynced_bytes_and_names_are_lost_in_a_crash) {
    mem_fs fs;
    ASSERT_TRUE(fs.create_dirs("/d").ok());
    // Synced data, durable name.
    ASSERT_TRUE(fs.write_file("/d/kept", bytes_of("kept")).ok());
    ASSERT_TRUE(fs.sync_dir("/d").ok());
    // Durable name, some bytes not synced.
    {
        auto f = fs.create_file("/d/half");
        ASSERT_TRUE((*f)->append(bytes_of("synced")).ok());
        ASSERT_TRUE((*f)->sync().ok());
        ASSERT_TRUE(fs.sync_dir("/d").ok());
        ASSERT_TRUE((*f)->append(bytes_of("+lost")).ok());
    }
    // Synced data, name never made durable (no sync_dir after its create).
    ASSERT_TRUE(fs.write_file("/d/nameless", bytes_of("x")).ok());
    fs.crash();
    EXPECT_EQ(text_of(fs.read_file("/d/kept")), "kept");
    EXPECT_EQ(fs.file_size("/d/nameless").error().code(), status_code::not_found);
    EXPECT_EQ(text_of(fs.read_file("/d/half")), "synced");
}

TEST(mem_fs, a_rename_is_durable_only_after_the_directory_sync) {
    mem_fs fs;
    ASSERT_TRUE(fs.create_dirs("/d").ok());
    ASSERT_TRUE(fs.write_file("/d/f", bytes_of("v1")).ok());
    ASSERT_TRUE(fs.sync_dir("/d").ok());
    ASSERT_TRUE(fs.write_file("/d/f.tmp", bytes_of("v2")).ok());
    ASSERT_TRUE(fs.rename_file("/d/f.tmp", "/d/f").ok());
    EXPECT_EQ(text_of(fs.read_file("/d/f")), "v2");
    fs.crash();
    EXPECT_EQ(text_of(fs.read_file("/d/f")), "v1");

    ASSERT_TRUE(fs.write_file("/d/f.tmp", bytes_of("v3")).ok());
    ASSERT_TRUE(fs.rename_file("/d/f.tmp", "/d/f").ok());
    ASSERT_TRUE(fs.sync_dir("/d").ok());
    fs.crash();
    EXPECT_EQ(text_of(fs.read_file("/d/f")), "v3");
    EXPECT_EQ(*fs.list_dir("/d"), std::vector<std::string>{"f"});
}

TEST(mem_fs, renaming_an_unsynced_file_is_the_classic_torn_replace) {
    // Why the store syncs before it renames: without it, a durable name can point at
    // bytes that never reached the disk.
    mem_fs fs;
    ASSERT_TRUE(fs.create_dirs("/d").ok());
    auto f = fs.create_file("/d/f.tmp");
    ASSERT_TRUE((*f)->append(bytes_of("never synced")).ok());
    ASSERT_TRUE(fs.rename_file("/d/f.tmp", "/d/f").ok());
    ASSERT_TRUE(fs.sync_dir("/d").ok());
    fs.crash();
    EXPECT_EQ(text_of(fs.read_file("/d/f")), "");
}

TEST(mem_fs, a_seeded_crash_keeps_a_journal_prefix_so_a_rename_stays_atomic) {
    for (uint64_t seed = 1; seed <= 200; ++seed) {
        mem_fs fs;
        ASSERT_TRUE(fs.create_dirs("/d").ok());
        ASSERT_TRUE(fs.write_file("/d/f", bytes_of("old")).ok());
        ASSERT_TRUE(fs.sync_dir("/d").ok());
        ASSERT_TRUE(fs.write_file("/d/f.tmp", bytes_of("new")).ok());
        ASSERT_TRUE(fs.rename_file("/d/f.tmp", "/d/f").ok());
        auto g = fs.create_file("/d/g");
        ASSERT_TRUE((*g)->append(bytes_of("0123456789")).ok());
        fs.crash(seed);
        std::string f = text_of(fs.read_file("/d/f"));
        EXPECT_TRUE(f == "old" || f == "new") << f;  // never gone, never mixed
        auto gs = fs.read_file("/d/g");
        if (gs.ok()) {
            EXPECT_EQ(std::string("0123456789").rfind(text_of(gs), 0), 0u);  // a prefix of what was appended
        }
    }
}

// ---- faulty_fs --------------------------------------------------------------------------------

TEST(faulty_fs, counts_ops_and_injects_by_index_and_by_kind) {
    mem_fs mem;
    faulty_fs fs(mem);
    ASSERT_TRUE(fs.create_dirs("/d").ok());  // op 0
    fs.inject_at(3, fs_fault::io_error);     // ops: 1 create, 2 append, 3 sync
    auto f = fs.create_file("/d/f");
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->append(bytes_of("abcd")).ok());
    status st = (*f)->sync();
    EXPECT_EQ(st.code(), status_code::io_error);
    EXPECT_EQ(fs.n_ops(), 4u);
    EXPECT_EQ(fs.n_faults(), 1u);

    fs.inject_on(fs_op::append, 1, fs_fault::short_write);  // the second append ever
    st = (*f)->append(bytes_of("efghijkl"));
    EXPECT_EQ(st.code(), status_code::io_error);
    EXPECT_NE(st.message().find("short write"), std::string::npos);
    EXPECT_EQ(text_of(mem.read_file("/d/f")), "abcdefgh");  // half of it went through

    fs.inject_on(fs_op::append, 2, fs_fault::no_space);
    st = (*f)->append(bytes_of("zz"));
    EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st.message();
    EXPECT_EQ(text_of(mem.read_file("/d/f")), "abcdefgh");
}

TEST(faulty_fs, a_failed_fsync_makes_nothing_durable) {
    mem_fs mem;
    faulty_fs fs(mem);
    ASSERT_TRUE(fs.create_dirs("/d").ok());
    fs.inject_on(fs_op::sync, 0, fs_fault::sync_fails);
    auto f = fs.create_file("/d/f");
    ASSERT_TRUE((*f)->append(bytes_of("data")).ok());
    EXPECT_FALSE((*f)->sync().ok());
    ASSERT_TRUE(fs.sync_dir("/d").ok());
    mem.crash();
    EXPECT_EQ(text_of(mem.read_file("/d/f")), "");
}

TEST(faulty_fs, silent_faults_return_ok) {
    mem_fs mem;
    faulty_fs fs(mem);
    ASSERT_TRUE(fs.create_dirs("/d").ok());
    fs.inject_on(fs_op::append, 0, fs_fault::torn_write);
    fs.inject_on(fs_op::append, 1, fs_fault::bit_flip);
    auto f = fs.create_file("/d/f");
    EXPECT_TRUE((*f)->append(bytes_of("12345678")).ok());
    EXPECT_TRUE((*f)->append(bytes_of("abcdefgh")).ok());
    std::string got = text_of(mem.read_file("/d/f"));
    ASSERT_EQ(got.size(), 12u);
    EXPECT_EQ(got.substr(0, 4), "1234");
    EXPECT_NE(got.substr(4), "abcdefgh");
}

TEST(faulty_fs, a_crash_stops_every_later_op_until_reset) {
    mem_fs mem;
    faulty_fs fs(mem);
    ASSERT_TRUE(fs.create_dirs("/d").ok());
    ASSERT_TRUE(fs.write_file("/d/f.tmp", bytes_of("new")).ok());
    fs.inject_on(fs_op::rename, 0, fs_fault::crash);
    EXPECT_FALSE(fs.rename_file("/d/f.tmp", "/d/f").ok());
    EXPECT_TRUE(fs.crashed());
    EXPECT_FALSE(fs.remove_file("/d/f.tmp").ok());
    EXPECT_FALSE(fs.list_dir("/d").ok());
    EXPECT_FALSE(fs.open_readable("/d/f.tmp").ok());
    mem.crash();
    fs.reset();
    EXPECT_FALSE(fs.crashed());
    EXPECT_TRUE(fs.list_dir("/d").ok());
    EXPECT_EQ(*fs.list_dir("/d"), std::vector<std::string>{});  // nothing was dir-synced
}

TEST(faulty_fs, random_faults_are_a_function_of_the_seed) {
    auto run = [](uint64_t seed) {
        mem_fs mem;
        faulty_fs fs(mem);
        (void)fs.create_dirs("/d");
        fs.inject_random(seed, 0.3, {fs_fault::io_error, fs_fault::short_write, fs_fault::sync_fails});
        std::string trace;
        for (int i = 0; i < 50; ++i) {
            status st = fs.write_file("/d/f" + std::to_string(i), bytes_of("payload"));
            trace += st.ok() ? '.' : 'x';
        }
        return trace;
    };
    EXPECT_EQ(run(5), run(5));
    EXPECT_NE(run(5), run(6));
    EXPECT_NE(run(5).find('x'), std::string::npos);
}

TEST(faulty_fs, counts_reads_per_path) {
    mem_fs mem;
    faulty_fs fs(mem);
    ASSERT_TRUE(fs.create_dirs("/d").ok());
    ASSERT_TRUE(fs.write_file("/d/f", bytes_of("x")).ok());
    (void)fs.read_file("/d/f");
    (void)fs.read_file("/d/f");
    EXPECT_EQ(fs.n_reads("/d/f"), 2u);
    EXPECT_EQ(fs.n_reads_total(), 2u);
}

}  // namespace
}  // namespace warmctx
