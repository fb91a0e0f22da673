// The snapshot reader (src/store/snapshot.cpp) on arbitrary bytes: a file in the disk
// tier's directory is whatever the disk holds.
//
// Each input is decoded as it is, and again "resealed": with its chain hashes, its key
// and its three checksums recomputed the way a writer would (when its section table
// allows), so the fuzzer reaches the checks behind the checksums - the JSON of the
// profile and the manifest, the blocks, the cross-field checks - instead of stopping at
// the first checksum every mutation breaks.
//
// Every decode runs the three ways the store reads a file: decode_snapshot on the bytes,
// decode_snapshot_header on prefixes of them, and read_snapshot / read_snapshot_header
// on the file in an in-memory file system (mem_fs).
//
// Checks, besides no crash and no read outside the input: the three ways agree (same
// result, same defect); a refusal is `corrupt` with a defect named in its message; an
// accepted file passes validate_snapshot, encodes again, and decodes again to the same
// snapshot.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#include "warmctx/fs.h"
#include "store/snapshot.h"

using namespace warmctx;
namespace sf = snapshot_format;

namespace {

uint64_t get_u64(const std::vector<uint8_t> & b, size_t at) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{b[at + i]} << (8 * i);
    return v;
}
uint32_t get_u32(const std::vector<uint8_t> & b, size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{b[at + i]} << (8 * i);
    return v;
}
void put_u64(std::vector<uint8_t> & b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_hash(std::vector<uint8_t> & b, size_t at, hash128 h) {
    put_u64(b, at, h.hi);
    put_u64(b, at + 8, h.lo);
}
hash128 get_hash(const std::vector<uint8_t> & b, size_t at) { return {get_u64(b, at), get_u64(b, at + 8)}; }

// What a writer would have written around these bytes: every block's chain hash after
// the first from the tokens, the key, then the fixed-header, header and body checksums.
// Fixes what its section table lets it find; leaves the rest as it is.
std::vector<uint8_t> reseal(std::vector<uint8_t> b) {
    if (b.size() < sf::k_fixed_header_bytes + sf::k_checksum_bytes) return b;
    auto off = [&](sf::section s) { return get_u64(b, sf::k_off_sections + s * sf::k_section_entry_bytes); };
    auto len = [&](sf::section s) { return get_u64(b, sf::k_off_sections + s * sf::k_section_entry_bytes + 8); };
    auto inside = [&](uint64_t o, uint64_t n) { return o <= b.size() && n <= b.size() - o; };

    const uint64_t blocks_at = off(sf::s_blocks), blocks_bytes = len(sf::s_blocks);
    const uint64_t tokens_at = off(sf::s_tokens), tokens_bytes = len(sf::s_tokens);
    if (inside(blocks_at, blocks_bytes) && inside(tokens_at, tokens_bytes)) {
        const size_t n_blocks = blocks_bytes / sf::k_block_record_bytes;
        const size_t n_tokens = tokens_bytes / sizeof(int32_t);
        std::vector<token_id> tokens(n_tokens);
        for (size_t i = 0; i < n_tokens; ++i) tokens[i] = static_cast<token_id>(get_u32(b, tokens_at + 4 * i));
        for (size_t i = 1; i < n_blocks; ++i) {
            const size_t rec = blocks_at + i * sf::k_block_record_bytes;
            const uint32_t begin = get_u32(b, rec + 16), end = get_u32(b, rec + 20);
            if (begin >= end || end > n_tokens) continue;
            const hash128 prev = get_hash(b, rec - sf::k_block_record_bytes);
            put_hash(b, rec, chain_hash(prev, std::span<const token_id>(tokens).subspan(begin, end - begin)));
        }
        if (n_blocks > 0)
            put_hash(b, sf::k_off_key, get_hash(b, blocks_at + (n_blocks - 1) * sf::k_block_record_bytes));
    }
    put_hash(b, sf::k_off_fixed_checksum, hash_bytes(b.data(), sf::k_off_fixed_checksum));
    if (tokens_at >= sf::k_fixed_header_bytes + sf::k_checksum_bytes && tokens_at <= b.size())
        put_hash(b, tokens_at - sf::k_checksum_bytes, hash_bytes(b.data(), tokens_at - sf::k_checksum_bytes));
    put_hash(b, b.size() - sf::k_checksum_bytes, hash_bytes(b.data(), b.size() - sf::k_checksum_bytes));
    return b;
}

void check_refusal(const status & st, snapshot_defect why) {
    FUZZ_CHECK_MSG(st.code() == status_code::corrupt, st.to_string());
    FUZZ_CHECK(why != snapshot_defect::none && why != snapshot_defect::misnamed);
    FUZZ_CHECK_MSG(st.message().rfind(std::string(snapshot_defect_name(why)) + ": ", 0) == 0, st.message());
}

bool same_meta(const snapshot_meta & a, const snapshot_meta & b) {
    return a.prof == b.prof && a.profile_fingerprint == b.profile_fingerprint && a.workspace == b.workspace &&
           a.prompt_manifest == b.prompt_manifest && a.blocks == b.blocks && a.created_unix_ms == b.created_unix_ms;
}

void check_file(const std::vector<uint8_t> & bytes) {
    snapshot_defect why = snapshot_defect::none;
    auto s = decode_snapshot(bytes, &why);
    if (!s.ok()) check_refusal(s.error(), why);
    else FUZZ_CHECK(why == snapshot_defect::none);

    // The header from prefixes: a refusal names the same defect as the whole decode, or
    // asks for more bytes (invalid_argument); an accepted head is the whole decode's.
    // (The whole file's header is decode_snapshot's first step: not repeated here.)
    for (size_t n : {std::min<size_t>(bytes.size(), sf::k_fixed_header_bytes), bytes.size() / 2}) {
        snapshot_defect hwhy = snapshot_defect::none;
        auto h = decode_snapshot_header(std::span<const uint8_t>(bytes.data(), n), bytes.size(), &hwhy);
        if (h.ok()) {
            FUZZ_CHECK(h->file_bytes == bytes.size());
            FUZZ_CHECK(h->head_bytes <= n);
            FUZZ_CHECK(h->kv_offset + h->kv_bytes + sf::k_checksum_bytes == bytes.size());
            if (s.ok()) FUZZ_CHECK(same_meta(h->meta, s->meta));
            else FUZZ_CHECK(why == snapshot_defect::body_checksum || why == snapshot_defect::chain_mismatch);
        } else if (h.error().code() == status_code::invalid_argument) {
            FUZZ_CHECK(n < bytes.size());
        } else {
            check_refusal(h.error(), hwhy);
            FUZZ_CHECK(hwhy == why);
        }
    }

    // Through the file-system seam, as the store reads it.
    mem_fs fs;
    FUZZ_CHECK(fs.create_dirs("/d").ok());
    FUZZ_CHECK(fs.write_file("/d/f.wcsnap", bytes).ok());
    auto f = fs.open_readable("/d/f.wcsnap");
    FUZZ_CHECK(f.ok());
    snapshot_defect rwhy = snapshot_defect::none;
    auto r = read_snapshot(**f, &rwhy);
    FUZZ_CHECK(r.ok() == s.ok());
    if (!r.ok()) {
        check_refusal(r.error(), rwhy);
        FUZZ_CHECK(rwhy == why);
    }
    if (!s.ok() && why != snapshot_defect::body_checksum && why != snapshot_defect::chain_mismatch) return;

    // The head read alone (a listing) accepts what the whole read got past its head.
    auto rh = read_snapshot_header(**f);
    FUZZ_CHECK_MSG(rh.ok(), rh.error().message());
    if (!s.ok()) return;
    FUZZ_CHECK(same_meta(rh->meta, s->meta));

    // Accepted: what the writer checks holds, and it writes the same snapshot back.
    FUZZ_CHECK(same_meta(r->meta, s->meta) && r->tokens == s->tokens && r->kv == s->kv);
    status valid = validate_snapshot(s->meta, s->tokens, s->kv);
    FUZZ_CHECK_MSG(valid.ok(), valid.message());
    auto enc = encode_snapshot(s->meta, s->tokens, s->kv);
    FUZZ_CHECK_MSG(enc.ok(), enc.error().message());
    auto again = decode_snapshot(*enc);
    FUZZ_CHECK_MSG(again.ok(), again.error().message());
    FUZZ_CHECK(same_meta(again->meta, s->meta) && again->tokens == s->tokens && again->kv == s->kv);
    FUZZ_CHECK(check_snapshot_profile(s->meta, s->meta.prof).ok());
    fuzz::check_json_text(dump_json(s->meta.prof.to_json()));
    fuzz::check_json_text(dump_json(s->meta.prompt_manifest.to_json()));
    (void)snapshot_file_name(s->meta.key(), s->meta.workspace);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    std::vector<uint8_t> bytes(data, data + size);
    check_file(bytes);
    std::vector<uint8_t> sealed = reseal(bytes);
    if (sealed != bytes) check_file(sealed);
    return 0;
}
