// The snapshot format: round trips, and every kind of damage is `corrupt` with the
// right reason and never a crash - on bytes in memory and through the in-memory fs.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "store_test_util.h"
#include "warmctx/fs.h"
#include "store/snapshot.h"

namespace warmctx {
namespace {

namespace sf = snapshot_format;
using testing::make_path;
using testing::snapshot_of;
using rc = retention_class;

snapshot sample(size_t kv_bytes = 1000) {
    auto p = make_path(1, {rc::highest, rc::high, rc::low});
    return snapshot_of(p, p.blocks.size(), "ws-a", 7, kv_bytes);
}

std::vector<uint8_t> encode(const snapshot & s) {
    auto r = encode_snapshot(s.meta, s.tokens, s.kv);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? *r : std::vector<uint8_t>{};
}

uint64_t get_u64(const std::vector<uint8_t> & b, size_t at) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= (uint64_t)b[at + i] << (8 * i);
    return v;
}
void put_u32(std::vector<uint8_t> & b, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + i] = (uint8_t)(v >> (8 * i));
}
void put_u64(std::vector<uint8_t> & b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) b[at + i] = (uint8_t)(v >> (8 * i));
}
void put_hash(std::vector<uint8_t> & b, size_t at, hash128 h) {
    put_u64(b, at, h.hi);
    put_u64(b, at + 8, h.lo);
}
uint64_t section_offset(const std::vector<uint8_t> & b, sf::section s) {
    return get_u64(b, sf::k_off_sections + s * sf::k_section_entry_bytes);
}
uint64_t section_bytes(const std::vector<uint8_t> & b, sf::section s) {
    return get_u64(b, sf::k_off_sections + s * sf::k_section_entry_bytes + 8);
}

// Recomputes all three checksums: what a buggy (or hostile) writer would produce, so the
// checks behind the checksums can be reached.
void reseal(std::vector<uint8_t> & b) {
    put_hash(b, sf::k_off_fixed_checksum, hash_bytes(b.data(), sf::k_off_fixed_checksum));
    size_t head = section_offset(b, sf::s_tokens);
    put_hash(b, head - sf::k_checksum_bytes, hash_bytes(b.data(), head - sf::k_checksum_bytes));
    put_hash(b, b.size() - sf::k_checksum_bytes, hash_bytes(b.data(), b.size() - sf::k_checksum_bytes));
}

// Replaces a JSON section with other bytes, moving everything after it, and reseals.
std::vector<uint8_t> replace_section(const std::vector<uint8_t> & b, sf::section s, const std::string & text) {
    const uint64_t off = section_offset(b, s), n = section_bytes(b, s);
    std::vector<uint8_t> out(b.begin(), b.begin() + (ptrdiff_t)off);
    out.insert(out.end(), text.begin(), text.end());
    out.insert(out.end(), b.begin() + (ptrdiff_t)(off + n), b.end());
    const int64_t delta = (int64_t)text.size() - (int64_t)n;
    put_u64(out, sf::k_off_sections + s * sf::k_section_entry_bytes + 8, text.size());
    for (size_t t = s + 1; t < sf::k_n_sections; ++t)
        put_u64(out, sf::k_off_sections + t * sf::k_section_entry_bytes, section_offset(b, (sf::section)t) + delta);
    put_u64(out, sf::k_off_file_bytes, out.size());
    reseal(out);
    return out;
}

snapshot_defect defect_of(std::span<const uint8_t> bytes) {
    snapshot_defect why = snapshot_defect::none;
    auto r = decode_snapshot(bytes, &why);
    if (r.ok()) return snapshot_defect::none;
    EXPECT_EQ(r.error().code(), status_code::corrupt) << r.error().to_string();
    // The message starts with the defect's name.
    EXPECT_EQ(r.error().message().rfind(std::string(snapshot_defect_name(why)) + ":", 0), 0u) << r.error().message();
    return why;
}

// ---- round trips ---------------------------------------------------------------------------

TEST(snapshot_format, round_trip_in_memory) {
    snapshot s = sample();
    auto bytes = encode(s);
    auto d = decode_snapshot(bytes);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    testing::expect_same_snapshot(s, *d);
    EXPECT_EQ(d->meta.key(), s.meta.blocks.back().chain);
    EXPECT_EQ(d->meta.last_class(), rc::low);
}

TEST(snapshot_format, encode_is_deterministic_and_write_streams_the_same_bytes) {
    snapshot s = sample();
    auto a = encode(s), b = encode(s);
    EXPECT_EQ(a, b);
    mem_fs fs;
    auto f = fs.create_file("/x.wcsnap");
    ASSERT_TRUE(f.ok());
    auto n = write_snapshot(**f, s.meta, s.tokens, s.kv);
    ASSERT_TRUE(n.ok()) << n.error().to_string();
    EXPECT_EQ(*n, a.size());
    ASSERT_TRUE((*f)->close().ok());
    auto back = fs.read_file("/x.wcsnap");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, a);
}

TEST(snapshot_format, read_through_a_file_and_header_only) {
    snapshot s = sample(5000);
    auto bytes = encode(s);
    mem_fs fs;
    ASSERT_TRUE(fs.write_file("/x.wcsnap", bytes).ok());
    auto f = fs.open_readable("/x.wcsnap");
    ASSERT_TRUE(f.ok());
    auto h = read_snapshot_header(**f);
    ASSERT_TRUE(h.ok()) << h.error().to_string();
    EXPECT_EQ(h->meta.blocks, s.meta.blocks);
    EXPECT_EQ(h->file_bytes, bytes.size());
    EXPECT_EQ(h->kv_bytes, 5000u);
    EXPECT_LT(h->head_bytes, h->kv_offset);
    auto full = read_snapshot(**f);
    ASSERT_TRUE(full.ok()) << full.error().to_string();
    testing::expect_same_snapshot(s, *full);

    // The head alone decodes: a listing never needs the tokens or the KV.
    std::span<const uint8_t> head(bytes.data(), h->head_bytes);
    auto h2 = decode_snapshot_header(head, bytes.size());
    ASSERT_TRUE(h2.ok()) << h2.error().to_string();
    EXPECT_EQ(h2->meta.workspace, "ws-a");
    // Less than the head is the caller's mistake, not damage.
    auto h3 = decode_snapshot_header(head.first(head.size() - 1), bytes.size());
    EXPECT_EQ(h3.error().code(), status_code::invalid_argument);
    auto h4 = decode_snapshot_header(head.first(100), bytes.size());
    EXPECT_EQ(h4.error().code(), status_code::invalid_argument);
}

TEST(snapshot_format, empty_workspace_and_generation_prompt_blocks_are_allowed) {
    auto p = make_path(2, {rc::high});
    snapshot s = snapshot_of(p, p.blocks.size(), "");
    s.meta.blocks.back().segment_index = k_generation_prompt_index;
    s.meta.blocks.back().retention = rc::none;
    auto d = decode_snapshot(encode(s));
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    EXPECT_EQ(d->meta.workspace, "");
    EXPECT_EQ(d->meta.blocks.back().segment_index, k_generation_prompt_index);
}

TEST(snapshot_format, file_name_is_key_and_workspace_hash) {
    snapshot s = sample();
    std::string n = snapshot_file_name(s.meta.key(), "ws-a");
    EXPECT_EQ(n.substr(0, 32), s.meta.key().hex());
    EXPECT_TRUE(n.ends_with(".wcsnap"));
    EXPECT_NE(n, snapshot_file_name(s.meta.key(), "ws-b"));
    EXPECT_EQ(n, snapshot_file_name(s.meta.key(), "ws-a"));
    EXPECT_NE(snapshot_file_name(s.meta.key(), "../../etc/passwd").find('/'), 0u);
    EXPECT_EQ(snapshot_file_name(s.meta.key(), "../../etc/passwd").find('/'), std::string::npos);
}

// ---- encode refuses what decode would refuse ---------------------------------------------------

TEST(snapshot_format, encode_validates) {
    snapshot good = sample();
    auto bad = [&](auto mutate) {
        snapshot s = good;
        mutate(s);
        auto r = encode_snapshot(s.meta, s.tokens, s.kv);
        EXPECT_FALSE(r.ok());
        if (!r.ok()) {
            EXPECT_EQ(r.error().code(), status_code::invalid_argument) << r.error().to_string();
        }
    };
    bad([](snapshot & s) { s.meta.blocks.clear(); s.tokens.clear(); });
    bad([](snapshot & s) { s.meta.blocks[1].begin += 1; });                  // gap
    bad([](snapshot & s) { s.tokens.pop_back(); });                          // count
    bad([](snapshot & s) { s.tokens[20] ^= 1; });                            // chain link
    bad([](snapshot & s) { s.kv.clear(); });
    bad([](snapshot & s) { s.meta.workspace = std::string("a\nb"); });
    bad([](snapshot & s) { s.meta.workspace = std::string(5000, 'w'); });
    bad([](snapshot & s) { s.meta.profile_fingerprint = hash_string("other"); });
    bad([](snapshot & s) { s.meta.blocks[0].segment_index = 9; });
    bad([](snapshot & s) { s.meta.blocks[0].retention = (retention_class)7; });
}

// ---- truncation -------------------------------------------------------------------------------

TEST(snapshot_format, truncation_at_every_section_boundary_is_truncated) {
    auto bytes = encode(sample());
    std::vector<size_t> cuts = {0, 1, 7, 8, 11, 12, 100, sf::k_off_fixed_checksum, sf::k_fixed_header_bytes - 1,
                                sf::k_fixed_header_bytes};
    for (size_t s = 0; s < sf::k_n_sections; ++s) {
        size_t off = section_offset(bytes, (sf::section)s), n = section_bytes(bytes, (sf::section)s);
        for (size_t c : {off, off + 1, off + n / 2, off + n - 1, off + n}) cuts.push_back(c);
    }
    cuts.push_back(bytes.size() - sf::k_checksum_bytes);
    cuts.push_back(bytes.size() - 1);
    for (size_t c : cuts) {
        if (c >= bytes.size()) continue;
        SCOPED_TRACE("cut at " + std::to_string(c));
        EXPECT_EQ(defect_of(std::span(bytes.data(), c)), snapshot_defect::truncated);
    }
}

TEST(snapshot_format, truncation_at_random_points_is_truncated) {
    auto bytes = encode(sample(3000));
    std::mt19937 rng(42);
    for (int i = 0; i < 300; ++i) {
        size_t c = rng() % bytes.size();
        SCOPED_TRACE("cut at " + std::to_string(c));
        EXPECT_EQ(defect_of(std::span(bytes.data(), c)), snapshot_defect::truncated);
    }
}

TEST(snapshot_format, trailing_bytes_are_bad_layout) {
    auto bytes = encode(sample());
    bytes.push_back(0);
    EXPECT_EQ(defect_of(bytes), snapshot_defect::bad_layout);
}

// ---- bit flips -------------------------------------------------------------------------------

// Where a flip lands decides its name: magic, version, then everything else before the
// tokens is covered by the header checksums, and the tokens, KV and the body checksum
// itself by the body checksum.
snapshot_defect expected_for_flip(const std::vector<uint8_t> & b, size_t at) {
    if (at < sf::k_off_version) return snapshot_defect::bad_magic;
    if (at < sf::k_off_fixed_bytes) return snapshot_defect::foreign_version;
    if (at < section_offset(b, sf::s_tokens)) return snapshot_defect::header_checksum;
    return snapshot_defect::body_checksum;
}

TEST(snapshot_format, a_flipped_bit_anywhere_is_caught_with_its_reason) {
    const auto bytes = encode(sample(600));
    auto copy = bytes;
    for (size_t at = 0; at < bytes.size(); ++at) {
        // every bit of the fixed header, one bit (rotating) of every other byte
        int first = at < sf::k_fixed_header_bytes ? 0 : (int)(at % 8);
        int last = at < sf::k_fixed_header_bytes ? 7 : first;
        for (int bit = first; bit <= last; ++bit) {
            copy[at] ^= (uint8_t)(1u << bit);
            SCOPED_TRACE("flip byte " + std::to_string(at) + " bit " + std::to_string(bit));
            EXPECT_EQ(defect_of(copy), expected_for_flip(bytes, at));
            copy[at] = bytes[at];
        }
    }
}

TEST(snapshot_format, a_flip_in_each_section_through_the_memory_fs) {
    const auto bytes = encode(sample(2000));
    mem_fs fs;
    std::vector<std::pair<size_t, snapshot_defect>> cases = {
        {3, snapshot_defect::bad_magic},
        {sf::k_off_version, snapshot_defect::foreign_version},
        {sf::k_off_n_tokens, snapshot_defect::header_checksum},
    };
    for (size_t s = 0; s < sf::k_n_sections; ++s) {
        size_t at = section_offset(bytes, (sf::section)s) + section_bytes(bytes, (sf::section)s) / 2;
        cases.push_back({at, s < sf::s_tokens ? snapshot_defect::header_checksum : snapshot_defect::body_checksum});
    }
    cases.push_back({bytes.size() - 1, snapshot_defect::body_checksum});
    for (auto [at, want] : cases) {
        SCOPED_TRACE("flip at " + std::to_string(at));
        ASSERT_TRUE(fs.write_file("/s.wcsnap", bytes).ok());
        ASSERT_TRUE(fs.corrupt_byte("/s.wcsnap", at, 0x10).ok());
        auto f = fs.open_readable("/s.wcsnap");
        ASSERT_TRUE(f.ok());
        snapshot_defect why = snapshot_defect::none;
        auto r = read_snapshot(**f, &why);
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.error().code(), status_code::corrupt);
        EXPECT_EQ(why, want) << r.error().message();
        // A flip in the tokens or KV leaves the head intact: a listing still trusts it.
        auto h = read_snapshot_header(**f, &why);
        EXPECT_EQ(h.ok(), want == snapshot_defect::body_checksum);
    }
    // And truncation through the fs.
    ASSERT_TRUE(fs.write_file("/s.wcsnap", bytes).ok());
    ASSERT_TRUE(fs.truncate("/s.wcsnap", bytes.size() - 5).ok());
    auto f = fs.open_readable("/s.wcsnap");
    snapshot_defect why = snapshot_defect::none;
    EXPECT_FALSE(read_snapshot_header(**f, &why).ok());
    EXPECT_EQ(why, snapshot_defect::truncated);
}

TEST(snapshot_format, wrong_magic_and_future_version) {
    auto bytes = encode(sample());
    auto m = bytes;
    std::memcpy(m.data(), "GGUF\0\0\0\0", 8);
    EXPECT_EQ(defect_of(m), snapshot_defect::bad_magic);

    // A well-formed file of a future version: refused by its version, not its checksums.
    auto v = bytes;
    put_u32(v, sf::k_off_version, sf::k_version + 1);
    reseal(v);
    snapshot_defect why;
    auto r = decode_snapshot(v, &why);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(why, snapshot_defect::foreign_version);
    EXPECT_NE(r.error().message().find("format version " + std::to_string(sf::k_version + 1)), std::string::npos)
        << r.error().message();

    EXPECT_EQ(defect_of(std::vector<uint8_t>(4096, 0)), snapshot_defect::bad_magic);
    EXPECT_EQ(defect_of(std::vector<uint8_t>{}), snapshot_defect::truncated);
}

// ---- damage behind valid checksums (a writer's bug) ---------------------------------------------

TEST(snapshot_format, writer_bugs_behind_valid_checksums_are_named) {
    const auto bytes = encode(sample());
    {
        auto b = bytes;
        put_u32(b, sf::k_off_n_tokens, 5);
        reseal(b);
        EXPECT_EQ(defect_of(b), snapshot_defect::bad_layout);
    }
    {
        auto b = bytes;
        put_u32(b, sf::k_off_flags, 1);
        reseal(b);
        EXPECT_EQ(defect_of(b), snapshot_defect::bad_layout);
    }
    {
        auto b = bytes;
        put_u64(b, sf::k_off_file_bytes, bytes.size() + 100);
        reseal(b);
        EXPECT_EQ(defect_of(b), snapshot_defect::bad_layout);
    }
    EXPECT_EQ(defect_of(replace_section(bytes, sf::s_profile, "{not json")), snapshot_defect::malformed_profile);
    EXPECT_EQ(defect_of(replace_section(bytes, sf::s_profile, "{}")), snapshot_defect::malformed_profile);
    EXPECT_EQ(defect_of(replace_section(bytes, sf::s_profile, std::string(10000, '['))),
              snapshot_defect::malformed_profile);
    EXPECT_EQ(defect_of(replace_section(bytes, sf::s_manifest, "[1,2]")), snapshot_defect::malformed_manifest);
    EXPECT_EQ(defect_of(replace_section(bytes, sf::s_workspace, "a\x01")), snapshot_defect::malformed_workspace);
    {
        // Another (valid) profile than the fingerprint the header carries.
        profile other = testing::test_profile();
        other.rope_freq_scale = 0.5f;
        auto b = replace_section(bytes, sf::s_profile, other.to_json().dump());
        EXPECT_EQ(defect_of(b), snapshot_defect::inconsistent);
    }
    {
        // A block record with a class out of range.
        auto b = bytes;
        b[section_offset(b, sf::s_blocks) + 28] = 9;
        reseal(b);
        EXPECT_EQ(defect_of(b), snapshot_defect::malformed_blocks);
    }
    {
        // Blocks that do not tile [0, n).
        auto b = bytes;
        put_u32(b, section_offset(b, sf::s_blocks) + sf::k_block_record_bytes + 16, 3);
        reseal(b);
        EXPECT_EQ(defect_of(b), snapshot_defect::malformed_blocks);
    }
    {
        // Tokens that do not reproduce the chain hashes.
        auto b = bytes;
        b[section_offset(b, sf::s_tokens) + 4 * 20] ^= 1;
        reseal(b);
        EXPECT_EQ(defect_of(b), snapshot_defect::chain_mismatch);
    }
}

// ---- fuzz: never a crash ----------------------------------------------------------------------

TEST(snapshot_format, random_damage_never_crashes_and_never_decodes) {
    const auto bytes = encode(sample(800));
    std::mt19937 rng(7);
    for (int i = 0; i < 2000; ++i) {
        auto b = bytes;
        int n_changes = 1 + (int)(rng() % 8);
        for (int k = 0; k < n_changes; ++k) {
            switch (rng() % 4) {
                case 0: b[rng() % b.size()] ^= (uint8_t)(1 + rng() % 255); break;
                case 1: b.resize(rng() % b.size()); if (b.empty()) b.push_back(0); break;
                case 2: b.insert(b.begin() + (ptrdiff_t)(rng() % b.size()), (uint8_t)rng()); break;
                case 3: b.erase(b.begin() + (ptrdiff_t)(rng() % b.size())); if (b.empty()) b.push_back(0); break;
            }
        }
        if (b == bytes) continue;
        snapshot_defect why = snapshot_defect::none;
        auto r = decode_snapshot(b, &why);
        ASSERT_FALSE(r.ok()) << "damaged file decoded, iteration " << i;
        EXPECT_EQ(r.error().code(), status_code::corrupt);
        EXPECT_NE(why, snapshot_defect::none);
    }
    for (int i = 0; i < 500; ++i) {
        auto b = testing::random_bytes(rng() % 600, (uint32_t)i);
        if (b.size() >= 8 && i % 2) std::memcpy(b.data(), sf::k_magic.data(), 8);  // get past the magic
        EXPECT_FALSE(decode_snapshot(b).ok());
    }
}

// ---- profile ---------------------------------------------------------------------------------

TEST(snapshot_format, profile_mismatch_names_the_fields) {
    snapshot s = sample();
    EXPECT_TRUE(check_snapshot_profile(s.meta, s.meta.prof).ok());
    profile expected = s.meta.prof;
    expected.kv_type = "q8_0";
    expected.rope_freq_base = 500000.0f;
    std::vector<std::string> fields;
    status st = check_snapshot_profile(s.meta, expected, &fields);
    EXPECT_EQ(st.code(), status_code::failed_precondition);
    EXPECT_EQ(fields, (std::vector<std::string>{"rope_freq_base", "kv_type"}));
    EXPECT_NE(st.message().find("kv_type: 'f16' -> 'q8_0'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("rope_freq_base"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace warmctx
