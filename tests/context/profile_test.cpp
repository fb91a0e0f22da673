#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_workspace.h"
#include "warmctx/profile.h"

namespace warmctx {
namespace {

namespace fs = std::filesystem;
using testing::test_profile;

struct field_change {
    const char * name;
    std::function<void(profile &)> change;
};

// One change per field. Every field of the profile must be listed here (checked
// below), so a new field cannot escape the drift and fingerprint tests.
const std::vector<field_change> & every_field_change() {
    static const std::vector<field_change> v = {
        {"model_digest", [](profile & p) { p.model_digest = "ffeeddccbbaa99887766554433221100"; }},
        {"tokenizer_digest", [](profile & p) { p.tokenizer_digest = "tok2"; }},
        {"chat_template_digest", [](profile & p) { p.chat_template_digest = "llama3"; }},
        {"llama_commit", [](profile & p) { p.llama_commit = "0000000000000000000000000000000000000000"; }},
        {"backend", [](profile & p) { p.backend = "CUDA"; }},
        {"rope_freq_base", [](profile & p) { p.rope_freq_base = std::nextafter(p.rope_freq_base, 2e6f); }},
        {"rope_freq_scale", [](profile & p) { p.rope_freq_scale = 0.5f; }},
        {"yarn", [](profile & p) { p.yarn = "ext=1;attn=1;beta_fast=32;beta_slow=1;orig_ctx=32768"; }},
        {"kv_type", [](profile & p) { p.kv_type = "q8_0"; }},
        {"chunk_tokens", [](profile & p) { p.chunk_tokens = 256; }},
        {"kv_mode", [](profile & p) { p.kv_mode = "shared"; }},
        {"flash_attn", [](profile & p) { p.flash_attn = true; }},
        {"n_gpu_layers", [](profile & p) { p.n_gpu_layers = -1; }},
        {"free_splits", [](profile & p) { p.free_splits = true; }},
    };
    return v;
}

TEST(Profile, EveryFieldIsCoveredByTheseTests) {
    std::vector<std::string> listed, actual;
    for (const auto & c : every_field_change()) listed.push_back(c.name);
    for (const auto & [name, _] : test_profile().canonical_fields()) actual.emplace_back(name);
    EXPECT_EQ(listed, actual);
}

TEST(Profile, DriftNamesEachFieldAndChangesTheFingerprint) {
    const profile base = test_profile();
    std::set<hash128> fingerprints = {base.fingerprint()};
    for (const auto & c : every_field_change()) {
        profile changed = base;
        c.change(changed);
        SCOPED_TRACE(c.name);
        EXPECT_EQ(base.drifted_fields(changed), std::vector<std::string>{c.name});
        EXPECT_EQ(changed.drifted_fields(base), std::vector<std::string>{c.name});
        EXPECT_NE(changed.fingerprint(), base.fingerprint());
        EXPECT_FALSE(changed == base);
        const auto lines = base.describe_drift(changed);
        ASSERT_EQ(lines.size(), 1u);
        EXPECT_EQ(lines[0].rfind(std::string(c.name) + ": ", 0), 0u) << lines[0];
        fingerprints.insert(changed.fingerprint());
    }
    EXPECT_EQ(fingerprints.size(), every_field_change().size() + 1) << "every change gives its own fingerprint";
}

TEST(Profile, EqualProfilesAgree) {
    const profile a = test_profile(), b = test_profile();
    EXPECT_TRUE(a.drifted_fields(b).empty());
    EXPECT_TRUE(a.describe_drift(b).empty());
    EXPECT_EQ(a.fingerprint(), b.fingerprint());
    EXPECT_TRUE(a == b);
}

TEST(Profile, SeveralDriftsComeInDeclarationOrder) {
    profile a = test_profile(), b = a;
    b.kv_mode = "shared";
    b.model_digest = "other";
    b.chunk_tokens = 256;
    EXPECT_EQ(a.drifted_fields(b), (std::vector<std::string>{"model_digest", "chunk_tokens", "kv_mode"}));
    EXPECT_EQ(a.describe_drift(b)[1], "chunk_tokens: '16' -> '256'");
}

TEST(Profile, FieldBoundariesAreUnambiguous) {
    // "ab"+"c" and "a"+"bc" in adjacent string fields must not collide
    profile a = test_profile(), b = a;
    a.tokenizer_digest = "ab";
    a.chat_template_digest = "c";
    b.tokenizer_digest = "a";
    b.chat_template_digest = "bc";
    EXPECT_NE(a.fingerprint(), b.fingerprint());
}

TEST(Profile, JsonRoundTrips) {
    profile p = test_profile();
    p.yarn = "ext=1";
    p.rope_freq_scale = 0.25f;
    p.flash_attn = true;
    p.n_gpu_layers = -1;
    auto back = profile::from_json(nlohmann::json::parse(p.to_json().dump()));
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_TRUE(p.drifted_fields(*back).empty());
    EXPECT_EQ(back->fingerprint(), p.fingerprint());
    EXPECT_EQ(p.to_json()["kv_type"], "f16");
}

TEST(Profile, FromJsonIsStrict) {
    const nlohmann::json good = test_profile().to_json();
    auto expect_bad = [](nlohmann::json j, const char * mention) {
        auto r = profile::from_json(j);
        ASSERT_FALSE(r.ok()) << j.dump();
        EXPECT_EQ(r.error().code(), status_code::invalid_argument);
        EXPECT_NE(r.error().message().find(mention), std::string::npos) << r.error().message();
    };
    {
        auto j = good;
        j.erase("kv_type");
        expect_bad(j, "missing field 'kv_type'");
    }
    {
        auto j = good;
        j["colour"] = "red";
        expect_bad(j, "'colour'");
    }
    for (const char * gone : {"n_ctx", "kv_streams"}) {  // sizes of the cache, not of its values
        auto j = good;
        j[gone] = 4096;
        expect_bad(j, gone);
    }
    {
        auto j = good;
        j["chunk_tokens"] = "512";
        expect_bad(j, "'chunk_tokens'");
    }
    {
        auto j = good;
        j["chunk_tokens"] = -1;
        expect_bad(j, "'chunk_tokens'");
    }
    {
        auto j = good;
        j["chunk_tokens"] = uint64_t{1} << 40;
        expect_bad(j, "'chunk_tokens'");
    }
    {
        auto j = good;
        j["flash_attn"] = 0;
        expect_bad(j, "'flash_attn'");
    }
    {
        auto j = good;
        j["kv_mode"] = "fuzzy";
        expect_bad(j, "kv_mode");
    }
    expect_bad(nlohmann::json::array(), "object");
}

// Found by fuzz/fuzz_profile.cpp: a number no float holds became infinity, which to_json
// writes as null, so the profile (and a snapshot written under it) could not be read back.
TEST(Profile, FromJsonRefusesANumberNoFloatHolds) {
    for (double big : {1e300, -1e300, 3.5e38, 1.8446744073709552e19 * 1e20}) {
        auto j = test_profile().to_json();
        j["rope_freq_base"] = big;
        auto r = profile::from_json(j);
        ASSERT_FALSE(r.ok()) << big;
        EXPECT_EQ(r.error().code(), status_code::invalid_argument);
        EXPECT_NE(r.error().message().find("'rope_freq_base' is out of range"), std::string::npos) << r.error().message();
    }
    // The largest float and the smallest magnitudes still read, and read back the same.
    for (double ok : {3.4028234663852886e38, -3.4028234663852886e38, 1e-50, 0.0}) {
        auto j = test_profile().to_json();
        j["rope_freq_scale"] = ok;
        auto p = profile::from_json(j);
        ASSERT_TRUE(p.ok()) << ok << ": " << p.error().to_string();
        auto back = profile::from_json(nlohmann::json::parse(p->to_json().dump()));
        ASSERT_TRUE(back.ok()) << back.error().to_string();
        EXPECT_EQ(back->fingerprint(), p->fingerprint());
    }
}

// ---- file digests ------------------------------------------------------------------

class FileDigest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("warmctx_context_test_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::string write(const std::string & name, const std::string & bytes) {
        const auto path = (dir_ / name).string();
        std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
        return path;
    }
    static void set_mtime(const std::string & path, int64_t sec) {
        struct timespec ts[2] = {{sec, 0}, {sec, 0}};
        ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), ts, 0), 0);
    }

    fs::path dir_;
};

TEST_F(FileDigest, IsTheHashOfTheBytes) {
    std::string big(9u << 20, '\0');  // spans three 4 MiB buffers
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 13);
    const auto path = write("big.bin", big);
    auto d = file_digest(path);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    EXPECT_EQ(*d, hash_bytes(big.data(), big.size()));
    auto empty = file_digest(write("empty.bin", ""));
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(*empty, hash_bytes("", 0));
}

TEST_F(FileDigest, SecondCallIsAMemoHit) {
    const auto path = write("m.bin", "model bytes");
    const auto s0 = get_file_digest_stats();
    auto a = file_digest(path);
    const auto s1 = get_file_digest_stats();
    auto b = file_digest(path);
    const auto s2 = get_file_digest_stats();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
    EXPECT_EQ(s1.n_computed, s0.n_computed + 1);
    EXPECT_EQ(s2.n_computed, s1.n_computed) << "an unchanged file is not read again";
    EXPECT_EQ(s2.n_memo_hits, s1.n_memo_hits + 1);
    EXPECT_EQ(s2.n_bytes_read, s1.n_bytes_read);
}

TEST_F(FileDigest, RecomputesWhenMtimeChangesAtTheSameSize) {
    const auto path = write("m.bin", "aaaa");
    set_mtime(path, 1000000000);
    auto a = file_digest(path);
    write("m.bin", "bbbb");  // same size
    set_mtime(path, 1000000001);
    const auto s0 = get_file_digest_stats();
    auto b = file_digest(path);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(get_file_digest_stats().n_computed, s0.n_computed + 1);
    EXPECT_NE(*a, *b);
    EXPECT_EQ(*b, hash_string("bbbb"));
}

TEST_F(FileDigest, RecomputesWhenSizeChanges) {
    const auto path = write("m.bin", "aaaa");
    set_mtime(path, 1000000000);
    auto a = file_digest(path);
    write("m.bin", "aaaab");
    set_mtime(path, 1000000000);  // same mtime, different size
    auto b = file_digest(path);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*b, hash_string("aaaab"));
}

TEST_F(FileDigest, RecomputesWhenReplacedByRenameWithTheSameSizeAndMtime) {
    // cp -p / rsync -t / an atomic replace keep size and mtime; the memo also keys on
    // the inode (and ctime), so the new file is read.
    const auto path = write("m.bin", "aaaa");
    set_mtime(path, 1000000000);
    auto a = file_digest(path);
    const auto tmp = write("m.bin.tmp", "cccc");
    set_mtime(tmp, 1000000000);
    fs::rename(tmp, path);
    auto b = file_digest(path);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, hash_string("aaaa"));
    EXPECT_EQ(*b, hash_string("cccc"));
}

TEST_F(FileDigest, RangeDigest) {
    const std::string bytes = "HEADER--tensor data--";
    const auto path = write("m.gguf", bytes);
    auto tail = digest_bytes(path, 8, k_to_end_of_file);
    ASSERT_TRUE(tail.ok());
    EXPECT_EQ(*tail, hash_string(std::string_view(bytes).substr(8)));
    auto mid = digest_bytes(path, 8, 6);
    ASSERT_TRUE(mid.ok());
    EXPECT_EQ(*mid, hash_string("tensor"));
    EXPECT_NE(*tail, *file_digest(path)) << "ranges are memoised apart from the whole file";
    auto end = digest_bytes(path, bytes.size(), k_to_end_of_file);
    ASSERT_TRUE(end.ok());
    EXPECT_EQ(*end, hash_bytes("", 0));
    EXPECT_EQ(digest_bytes(path, bytes.size() + 1, k_to_end_of_file).error().code(), status_code::out_of_range);
    EXPECT_EQ(digest_bytes(path, 8, bytes.size()).error().code(), status_code::out_of_range);
    EXPECT_EQ(digest_bytes(path, 1, ~uint64_t{0} - 1).error().code(), status_code::out_of_range);
}

TEST_F(FileDigest, Errors) {
    EXPECT_EQ(file_digest((dir_ / "missing.bin").string()).error().code(), status_code::not_found);
    EXPECT_EQ(file_digest(dir_.string()).error().code(), status_code::io_error) << "a directory";
}

// The digest reads through the file-system seam: the same value on an in-memory file,
// and a change of the bytes (same size) is seen, not served from the memo.
TEST(FileDigestSeam, ReadsThroughTheFileSystemSeam) {
    mem_fs fs;
    ASSERT_TRUE(fs.create_dirs("/m").ok());
    const std::string bytes = "model bytes, not a real model";
    ASSERT_TRUE(fs.write_file("/m/model.gguf", std::span((const uint8_t *)bytes.data(), bytes.size())).ok());
    auto a = file_digest("/m/model.gguf", fs);
    ASSERT_TRUE(a.ok()) << a.error().to_string();
    EXPECT_EQ(*a, hash_bytes(bytes.data(), bytes.size()));
    const auto s0 = get_file_digest_stats();
    EXPECT_EQ(*file_digest("/m/model.gguf", fs), *a);
    EXPECT_EQ(get_file_digest_stats().n_memo_hits, s0.n_memo_hits + 1);
    ASSERT_TRUE(fs.corrupt_byte("/m/model.gguf", 3, 0x01).ok());
    auto b = file_digest("/m/model.gguf", fs);
    ASSERT_TRUE(b.ok());
    EXPECT_NE(*b, *a);
    EXPECT_EQ(file_digest("/m/none.gguf", fs).error().code(), status_code::not_found);
}

TEST_F(FileDigest, ConcurrentCallersAgree) {
    std::vector<std::string> paths;
    for (int i = 0; i < 4; ++i) paths.push_back(write("f" + std::to_string(i), std::string(1000 + i, 'a' + i)));
    std::vector<std::vector<hash128>> got(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            for (int round = 0; round < 50; ++round)
                for (const auto & p : paths) got[t].push_back(*file_digest(p));
        });
    for (auto & th : threads) th.join();
    for (int t = 1; t < 4; ++t) EXPECT_EQ(got[t], got[0]);
    EXPECT_EQ(got[0][0], hash_bytes(std::string(1000, 'a').data(), 1000));
}

}  // namespace
}  // namespace warmctx
