// The snapshot file format (docs/snapshot-format.md): encode, decode, check.
#include "store/snapshot.h"

#include "util/json.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <nlohmann/json.hpp>

// XXH3_state_t is a complete type only with static linking declarations.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace warmctx {

namespace sf = snapshot_format;

std::string_view snapshot_defect_name(snapshot_defect d) {
    switch (d) {
        case snapshot_defect::none: return "none";
        case snapshot_defect::truncated: return "truncated";
        case snapshot_defect::bad_magic: return "bad_magic";
        case snapshot_defect::foreign_version: return "foreign_version";
        case snapshot_defect::header_checksum: return "header_checksum";
        case snapshot_defect::bad_layout: return "bad_layout";
        case snapshot_defect::malformed_profile: return "malformed_profile";
        case snapshot_defect::malformed_workspace: return "malformed_workspace";
        case snapshot_defect::malformed_manifest: return "malformed_manifest";
        case snapshot_defect::malformed_blocks: return "malformed_blocks";
        case snapshot_defect::inconsistent: return "inconsistent";
        case snapshot_defect::body_checksum: return "body_checksum";
        case snapshot_defect::chain_mismatch: return "chain_mismatch";
        case snapshot_defect::misnamed: return "misnamed";
    }
    return "?";
}

namespace {

// ---- little-endian fields ------------------------------------------------------------

void put_u32(uint8_t * p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
void put_u64(uint8_t * p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
void put_hash(uint8_t * p, hash128 h) {
    put_u64(p, h.hi);
    put_u64(p + 8, h.lo);
}
uint32_t get_u32(const uint8_t * p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
uint64_t get_u64(const uint8_t * p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
hash128 get_hash(const uint8_t * p) { return {get_u64(p), get_u64(p + 8)}; }

// Streaming XXH3-128: the same value as hash_bytes(all bytes) with no seed.
class checksum {
  public:
    checksum() { XXH3_128bits_reset(&st_); }
    void update(const void * p, size_t n) { XXH3_128bits_update(&st_, p, n); }
    void update(std::span<const uint8_t> s) { update(s.data(), s.size()); }
    hash128 digest() const {
        XXH128_hash_t h = XXH3_128bits_digest(&st_);
        return {h.high64, h.low64};
    }

  private:
    XXH3_state_t st_;
};

status defect(snapshot_defect d, snapshot_defect * why, const std::string & detail) {
    if (why) *why = d;
    return corrupt(std::string(snapshot_defect_name(d)) + ": " + detail);
}

std::string hex_or_empty(hash128 h) { return h == hash128{} ? std::string("0") : h.hex(); }

// ---- validation shared by encode and decode ----------------------------------------

status check_workspace(std::string_view ws) {
    if (ws.size() > sf::k_max_workspace_bytes)
        return invalid_argument("workspace name has " + std::to_string(ws.size()) + " bytes (at most " +
                                std::to_string(sf::k_max_workspace_bytes) + ")");
    for (unsigned char c : ws)
        if (c < 0x20 || c == 0x7f) return invalid_argument("workspace name holds a control byte");
    return {};
}

status check_blocks(const std::vector<block> & blocks, size_t n_segments) {
    if (blocks.empty()) return invalid_argument("no blocks");
    pos_t at = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
        const block & b = blocks[i];
        std::string where = "block " + std::to_string(i);
        if (b.begin != at)
            return invalid_argument(where + " begins at " + std::to_string(b.begin) + ", expected " +
                                    std::to_string(at));
        if (b.end <= b.begin) return invalid_argument(where + " is empty or reversed");
        if ((int)b.retention >= k_retention_class_count) return invalid_argument(where + " has an unknown class");
        if (b.segment_index < k_generation_prompt_index ||
            (b.segment_index >= 0 && (size_t)b.segment_index >= n_segments))
            return invalid_argument(where + " names segment " + std::to_string(b.segment_index) + " of " +
                                    std::to_string(n_segments));
        at = b.end;
    }
    return {};
}

// The links a file can prove: every block after the first (the first needs the salt).
status check_chain(const std::vector<block> & blocks, std::span<const token_id> tokens) {
    for (size_t i = 1; i < blocks.size(); ++i) {
        const block & b = blocks[i];
        hash128 h = chain_hash(blocks[i - 1].chain, tokens.subspan((size_t)b.begin, (size_t)(b.end - b.begin)));
        if (h != b.chain)
            return invalid_argument("block " + std::to_string(i) + "'s chain hash does not match its tokens");
    }
    return {};
}

// Cross-field checks of decoded or to-be-encoded metadata (not the tokens).
status check_meta(const snapshot_meta & m) {
    WARMCTX_RETURN_IF_ERROR(check_workspace(m.workspace));
    WARMCTX_RETURN_IF_ERROR(check_blocks(m.blocks, m.prompt_manifest.segments.size()));
    if (m.profile_fingerprint != m.prof.fingerprint())
        return invalid_argument("profile_fingerprint " + m.profile_fingerprint.hex() + " is not the profile's " +
                                m.prof.fingerprint().hex());
    if (m.prompt_manifest.profile_fingerprint != hash128{} &&
        m.prompt_manifest.profile_fingerprint != m.profile_fingerprint)
        return invalid_argument("the manifest's profile_fingerprint " + m.prompt_manifest.profile_fingerprint.hex() +
                                " is not the snapshot's " + m.profile_fingerprint.hex());
    return {};
}

result<nlohmann::json> parse_section_json(std::span<const uint8_t> bytes, const char * what) {
    std::string_view s((const char *)bytes.data(), bytes.size());
    // A hostile (checksum-valid) file must not exhaust the parser's stack.
    json_read_options o;
    o.max_depth = 32;
    auto j = parse_json(s, o);
    if (!j) return invalid_argument(std::string(what) + " is " + j.error().message());
    return j;
}

// ---- encode --------------------------------------------------------------------------

// The head: fixed header, metadata sections, header checksum. Also returns the offsets of
// the body sections.
struct encoded_head {
    std::vector<uint8_t> bytes;
    uint64_t file_bytes = 0;
};

encoded_head encode_head(const snapshot_meta & m, size_t n_tokens, size_t kv_bytes) {
    std::string prof = m.prof.to_json().dump();
    std::string manifest_json = m.prompt_manifest.to_json().dump();
    std::vector<uint8_t> blocks(m.blocks.size() * sf::k_block_record_bytes, 0);
    for (size_t i = 0; i < m.blocks.size(); ++i) {
        uint8_t * p = blocks.data() + i * sf::k_block_record_bytes;
        const block & b = m.blocks[i];
        put_hash(p, b.chain);
        put_u32(p + 16, (uint32_t)b.begin);
        put_u32(p + 20, (uint32_t)b.end);
        put_u32(p + 24, (uint32_t)b.segment_index);
        p[28] = (uint8_t)b.retention;
    }
    const uint64_t sizes[sf::k_n_sections] = {prof.size(), m.workspace.size(), manifest_json.size(), blocks.size(),
                                              n_tokens * sizeof(int32_t), kv_bytes};
    uint64_t offsets[sf::k_n_sections];
    uint64_t at = sf::k_fixed_header_bytes;
    for (size_t s = 0; s < sf::k_n_sections; ++s) {
        if (s == sf::s_tokens) at += sf::k_checksum_bytes;  // the header checksum sits before the tokens
        offsets[s] = at;
        at += sizes[s];
    }
    encoded_head h;
    h.file_bytes = at + sf::k_checksum_bytes;

    std::vector<uint8_t> & out = h.bytes;
    out.assign(sf::k_fixed_header_bytes, 0);
    std::memcpy(out.data() + sf::k_off_magic, sf::k_magic.data(), sf::k_magic.size());
    put_u32(out.data() + sf::k_off_version, sf::k_version);
    put_u32(out.data() + sf::k_off_fixed_bytes, (uint32_t)sf::k_fixed_header_bytes);
    put_u64(out.data() + sf::k_off_file_bytes, h.file_bytes);
    put_u64(out.data() + sf::k_off_created_ms, m.created_unix_ms);
    put_hash(out.data() + sf::k_off_fingerprint, m.profile_fingerprint);
    put_hash(out.data() + sf::k_off_key, m.key());
    put_u32(out.data() + sf::k_off_n_tokens, (uint32_t)n_tokens);
    put_u32(out.data() + sf::k_off_n_blocks, (uint32_t)m.blocks.size());
    put_u32(out.data() + sf::k_off_last_class, (uint32_t)m.last_class());
    put_u32(out.data() + sf::k_off_flags, 0);
    for (size_t s = 0; s < sf::k_n_sections; ++s) {
        put_u64(out.data() + sf::k_off_sections + s * sf::k_section_entry_bytes, offsets[s]);
        put_u64(out.data() + sf::k_off_sections + s * sf::k_section_entry_bytes + 8, sizes[s]);
    }
    put_hash(out.data() + sf::k_off_fixed_checksum, hash_bytes(out.data(), sf::k_off_fixed_checksum));
    out.insert(out.end(), prof.begin(), prof.end());
    out.insert(out.end(), m.workspace.begin(), m.workspace.end());
    out.insert(out.end(), manifest_json.begin(), manifest_json.end());
    out.insert(out.end(), blocks.begin(), blocks.end());
    uint8_t sum[sf::k_checksum_bytes];
    put_hash(sum, hash_bytes(out.data(), out.size()));
    out.insert(out.end(), sum, sum + sizeof sum);
    return h;
}

std::vector<uint8_t> encode_tokens(std::span<const token_id> tokens) {
    std::vector<uint8_t> out(tokens.size() * sizeof(int32_t));
    for (size_t i = 0; i < tokens.size(); ++i) put_u32(out.data() + 4 * i, (uint32_t)tokens[i]);
    return out;
}

// ---- decode --------------------------------------------------------------------------

// The fixed header's fields, after its checks.
struct layout {
    uint32_t version = 0;
    uint64_t file_bytes = 0;
    uint64_t created_ms = 0;
    hash128 fingerprint, key;
    uint32_t n_tokens = 0, n_blocks = 0, last_class = 0;
    uint64_t offset[sf::k_n_sections] = {}, bytes[sf::k_n_sections] = {};
    uint64_t head_bytes() const { return offset[sf::s_tokens]; }  // through the header checksum
};

// Checks in a fixed order so every damage has one predictable name: magic, version,
// fixed-header length and checksum, then layout, then the file's size against it.
result<layout> decode_layout(std::span<const uint8_t> p, uint64_t file_size, snapshot_defect * why) {
    if (p.size() < sf::k_magic.size())
        return defect(snapshot_defect::truncated, why,
                      "file has " + std::to_string(file_size) + " bytes, not even a magic");
    if (std::memcmp(p.data(), sf::k_magic.data(), sf::k_magic.size()) != 0)
        return defect(snapshot_defect::bad_magic, why, "not a warmctx snapshot (magic is not WCTXSNAP)");
    if (p.size() < sf::k_off_version + 4)
        return defect(snapshot_defect::truncated, why, "file ends inside the fixed header");
    layout l;
    l.version = get_u32(p.data() + sf::k_off_version);
    if (l.version != sf::k_version)
        return defect(snapshot_defect::foreign_version, why,
                      "format version " + std::to_string(l.version) + " (this build reads " +
                          std::to_string(sf::k_version) + ")");
    if (p.size() < sf::k_fixed_header_bytes)
        return defect(snapshot_defect::truncated, why,
                      "file has " + std::to_string(file_size) + " bytes, the fixed header alone " +
                          std::to_string(sf::k_fixed_header_bytes));
    if (hash_bytes(p.data(), sf::k_off_fixed_checksum) != get_hash(p.data() + sf::k_off_fixed_checksum))
        return defect(snapshot_defect::header_checksum, why, "the fixed header fails its checksum");

    // The fixed header is what its writer wrote; what follows only catches a writer's bug
    // (or a checksum collision), and the file's size against what it claims.
    uint32_t fixed_bytes = get_u32(p.data() + sf::k_off_fixed_bytes);
    l.file_bytes = get_u64(p.data() + sf::k_off_file_bytes);
    l.created_ms = get_u64(p.data() + sf::k_off_created_ms);
    l.fingerprint = get_hash(p.data() + sf::k_off_fingerprint);
    l.key = get_hash(p.data() + sf::k_off_key);
    l.n_tokens = get_u32(p.data() + sf::k_off_n_tokens);
    l.n_blocks = get_u32(p.data() + sf::k_off_n_blocks);
    l.last_class = get_u32(p.data() + sf::k_off_last_class);
    uint32_t flags = get_u32(p.data() + sf::k_off_flags);
    for (size_t s = 0; s < sf::k_n_sections; ++s) {
        l.offset[s] = get_u64(p.data() + sf::k_off_sections + s * sf::k_section_entry_bytes);
        l.bytes[s] = get_u64(p.data() + sf::k_off_sections + s * sf::k_section_entry_bytes + 8);
    }
    auto bad = [&](const std::string & m) { return defect(snapshot_defect::bad_layout, why, m); };
    if (fixed_bytes != sf::k_fixed_header_bytes) return bad("fixed header length " + std::to_string(fixed_bytes));
    if (flags != 0) return bad("unknown flags " + std::to_string(flags));
    // Sections are contiguous from the fixed header, with the header checksum between
    // blocks and tokens, and the body checksum after the KV. Sizes are bounded first so
    // that no sum below can overflow.
    uint64_t at = sf::k_fixed_header_bytes;
    for (size_t s = 0; s < sf::k_n_sections; ++s) {
        if (s == sf::s_tokens) at += sf::k_checksum_bytes;
        if (l.offset[s] != at) return bad("section " + std::to_string(s) + " is not where the one before it ends");
        if (l.bytes[s] > (uint64_t{1} << 56)) return bad("section " + std::to_string(s) + " is impossibly large");
        at += l.bytes[s];
    }
    if (at + sf::k_checksum_bytes != l.file_bytes) return bad("file length field disagrees with the sections");
    if (l.head_bytes() > sf::k_max_head_bytes)
        return bad("metadata sections exceed " + std::to_string(sf::k_max_head_bytes) + " bytes");
    if (l.bytes[sf::s_blocks] != (uint64_t)l.n_blocks * sf::k_block_record_bytes)
        return bad("blocks section size disagrees with the block count");
    if (l.bytes[sf::s_tokens] != (uint64_t)l.n_tokens * sizeof(int32_t))
        return bad("tokens section size disagrees with the token count");
    if (l.n_tokens > (uint32_t)INT32_MAX) return bad("token count out of range");
    if (l.bytes[sf::s_kv] == 0) return bad("no KV bytes");
    if (l.bytes[sf::s_workspace] > sf::k_max_workspace_bytes) return bad("workspace section too large");
    if (file_size < l.file_bytes)
        return defect(snapshot_defect::truncated, why,
                      "file has " + std::to_string(file_size) + " of its " + std::to_string(l.file_bytes) + " bytes");
    if (file_size > l.file_bytes)
        return bad(std::to_string(file_size - l.file_bytes) + " bytes after the end of the snapshot");
    return l;
}

// The head's metadata: checks the header checksum, parses, cross-checks.
result<snapshot_meta> decode_meta(const layout & l, std::span<const uint8_t> head, snapshot_defect * why) {
    const uint64_t sum_at = l.head_bytes() - sf::k_checksum_bytes;
    if (hash_bytes(head.data(), sum_at) != get_hash(head.data() + sum_at))
        return defect(snapshot_defect::header_checksum, why, "the metadata sections fail the header checksum");
    auto section = [&](sf::section s) { return head.subspan(l.offset[s], l.bytes[s]); };

    snapshot_meta m;
    m.created_unix_ms = l.created_ms;
    m.profile_fingerprint = l.fingerprint;
    {
        auto j = parse_section_json(section(sf::s_profile), "profile");
        if (!j) return defect(snapshot_defect::malformed_profile, why, j.error().message());
        auto p = profile::from_json(*j);
        if (!p) return defect(snapshot_defect::malformed_profile, why, p.error().message());
        m.prof = std::move(*p);
    }
    {
        auto ws = section(sf::s_workspace);
        m.workspace.assign((const char *)ws.data(), ws.size());
        status st = check_workspace(m.workspace);
        if (!st.ok()) return defect(snapshot_defect::malformed_workspace, why, st.message());
    }
    {
        auto j = parse_section_json(section(sf::s_manifest), "manifest");
        if (!j) return defect(snapshot_defect::malformed_manifest, why, j.error().message());
        auto parsed = manifest::from_json(*j);
        if (!parsed) return defect(snapshot_defect::malformed_manifest, why, parsed.error().message());
        m.prompt_manifest = std::move(*parsed);
    }
    {
        auto bs = section(sf::s_blocks);
        m.blocks.resize(l.n_blocks);
        for (size_t i = 0; i < l.n_blocks; ++i) {
            const uint8_t * p = bs.data() + i * sf::k_block_record_bytes;
            block & b = m.blocks[i];
            b.chain = get_hash(p);
            b.begin = (pos_t)get_u32(p + 16);
            b.end = (pos_t)get_u32(p + 20);
            b.segment_index = (int)(int32_t)get_u32(p + 24);
            if (p[28] >= k_retention_class_count || p[29] || p[30] || p[31])
                return defect(snapshot_defect::malformed_blocks, why,
                              "block " + std::to_string(i) + " has a bad class or padding");
            b.retention = (retention_class)p[28];
        }
        status st = check_blocks(m.blocks, m.prompt_manifest.segments.size());
        if (!st.ok()) return defect(snapshot_defect::malformed_blocks, why, st.message());
    }
    auto inconsistent = [&](const std::string & d) { return defect(snapshot_defect::inconsistent, why, d); };
    if (m.prof.fingerprint() != l.fingerprint)
        return inconsistent("the header's profile fingerprint is not the profile's (" + l.fingerprint.hex() + " vs " +
                            m.prof.fingerprint().hex() + ")");
    if (m.prompt_manifest.profile_fingerprint != hash128{} && m.prompt_manifest.profile_fingerprint != l.fingerprint)
        return inconsistent("the manifest's profile fingerprint " +
                            hex_or_empty(m.prompt_manifest.profile_fingerprint) + " is not the header's");
    if (m.key() != l.key) return inconsistent("the header's key is not the last block's chain hash");
    if ((uint32_t)m.n_tokens() != l.n_tokens)
        return inconsistent("the blocks end at " + std::to_string(m.n_tokens()) + ", the header says " +
                            std::to_string(l.n_tokens) + " tokens");
    if ((uint32_t)m.last_class() != l.last_class) return inconsistent("the header's class is not the last block's");
    return m;
}

snapshot_header make_header(const layout & l, snapshot_meta meta) {
    snapshot_header h;
    h.meta = std::move(meta);
    h.file_bytes = l.file_bytes;
    h.head_bytes = l.head_bytes();
    h.kv_offset = l.offset[sf::s_kv];
    h.kv_bytes = l.bytes[sf::s_kv];
    return h;
}

// The body after the head has been decoded: the body checksum (streamed over the head,
// the tokens' bytes and the KV), then the tokens against the chain hashes.
result<std::vector<token_id>> check_body(const snapshot_header & h, std::span<const uint8_t> head,
                                         std::span<const uint8_t> token_bytes, std::span<const uint8_t> kv,
                                         std::span<const uint8_t> trailer, snapshot_defect * why) {
    checksum sum;
    sum.update(head);
    sum.update(token_bytes);
    sum.update(kv);
    if (sum.digest() != get_hash(trailer.data()))
        return defect(snapshot_defect::body_checksum, why, "the tokens or KV fail the body checksum");
    std::vector<token_id> tokens(token_bytes.size() / sizeof(int32_t));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (token_id)get_u32(token_bytes.data() + 4 * i);
    status st = check_chain(h.meta.blocks, tokens);
    if (!st.ok()) return defect(snapshot_defect::chain_mismatch, why, st.message());
    return tokens;
}

}  // namespace

// ---- public --------------------------------------------------------------------------

status validate_snapshot(const snapshot_meta & meta, std::span<const token_id> tokens, std::span<const uint8_t> kv) {
    WARMCTX_RETURN_IF_ERROR(check_meta(meta).with_context("snapshot"));
    if (tokens.size() != (size_t)meta.n_tokens())
        return invalid_argument("snapshot: " + std::to_string(tokens.size()) + " tokens, the blocks cover " +
                                std::to_string(meta.n_tokens()));
    if (kv.empty()) return invalid_argument("snapshot: no KV bytes");
    WARMCTX_RETURN_IF_ERROR(check_chain(meta.blocks, tokens).with_context("snapshot"));
    return {};
}

result<std::vector<uint8_t>> encode_snapshot(const snapshot_meta & meta, std::span<const token_id> tokens,
                                             std::span<const uint8_t> kv) {
    WARMCTX_RETURN_IF_ERROR(validate_snapshot(meta, tokens, kv));
    encoded_head h = encode_head(meta, tokens.size(), kv.size());
    std::vector<uint8_t> out = std::move(h.bytes);
    out.reserve(h.file_bytes);
    std::vector<uint8_t> tb = encode_tokens(tokens);
    out.insert(out.end(), tb.begin(), tb.end());
    out.insert(out.end(), kv.begin(), kv.end());
    uint8_t sum[sf::k_checksum_bytes];
    put_hash(sum, hash_bytes(out.data(), out.size()));
    out.insert(out.end(), sum, sum + sizeof sum);
    return out;
}

result<uint64_t> write_snapshot(writable_file & out, const snapshot_meta & meta, std::span<const token_id> tokens,
                                std::span<const uint8_t> kv) {
    WARMCTX_RETURN_IF_ERROR(validate_snapshot(meta, tokens, kv));
    encoded_head h = encode_head(meta, tokens.size(), kv.size());
    std::vector<uint8_t> tb = encode_tokens(tokens);
    checksum sum;
    sum.update(h.bytes);
    sum.update(tb);
    sum.update(kv);
    uint8_t trailer[sf::k_checksum_bytes];
    put_hash(trailer, sum.digest());
    WARMCTX_RETURN_IF_ERROR(out.append(h.bytes));
    WARMCTX_RETURN_IF_ERROR(out.append(tb));
    WARMCTX_RETURN_IF_ERROR(out.append(kv));
    WARMCTX_RETURN_IF_ERROR(out.append(trailer));
    return h.file_bytes;
}

result<snapshot_header> decode_snapshot_header(std::span<const uint8_t> file_prefix, uint64_t file_size,
                                               snapshot_defect * why) {
    if (why) *why = snapshot_defect::none;
    if (file_prefix.size() > file_size) return invalid_argument("decode_snapshot_header: prefix longer than the file");
    if (file_prefix.size() < std::min<uint64_t>(file_size, sf::k_fixed_header_bytes))
        return invalid_argument("decode_snapshot_header: need at least the first " +
                                std::to_string(sf::k_fixed_header_bytes) + " bytes");
    auto l = decode_layout(file_prefix, file_size, why);
    if (!l) return l.error();
    if (file_prefix.size() < l->head_bytes())
        return invalid_argument("decode_snapshot_header: need the first " + std::to_string(l->head_bytes()) + " bytes");
    auto head = file_prefix.first(l->head_bytes());
    auto m = decode_meta(*l, head, why);
    if (!m) return m.error();
    return make_header(*l, std::move(*m));
}

result<snapshot> decode_snapshot(std::span<const uint8_t> file, snapshot_defect * why) {
    auto h = decode_snapshot_header(file, file.size(), why);
    if (!h) return h.error();
    auto head = file.first(h->head_bytes);
    auto token_bytes = file.subspan(h->head_bytes, h->kv_offset - h->head_bytes);
    auto kv = file.subspan(h->kv_offset, h->kv_bytes);
    auto trailer = file.subspan(h->kv_offset + h->kv_bytes, sf::k_checksum_bytes);
    auto tokens = check_body(*h, head, token_bytes, kv, trailer, why);
    if (!tokens) return tokens.error();
    snapshot s;
    s.meta = std::move(h->meta);
    s.tokens = std::move(*tokens);
    s.kv.assign(kv.begin(), kv.end());
    return s;
}

namespace {

// Reads the fixed header, then the head, from an open file.
result<std::pair<snapshot_header, std::vector<uint8_t>>> read_head(const readable_file & f, snapshot_defect * why) {
    if (why) *why = snapshot_defect::none;
    const uint64_t size = f.size();
    std::vector<uint8_t> fixed((size_t)std::min<uint64_t>(size, sf::k_fixed_header_bytes));
    WARMCTX_RETURN_IF_ERROR(f.read_at(0, fixed.size(), fixed.data()));
    auto l = decode_layout(fixed, size, why);
    if (!l) return l.error();
    std::vector<uint8_t> head((size_t)l->head_bytes());
    std::memcpy(head.data(), fixed.data(), fixed.size());
    WARMCTX_RETURN_IF_ERROR(f.read_at(fixed.size(), head.size() - fixed.size(), head.data() + fixed.size()));
    auto m = decode_meta(*l, head, why);
    if (!m) return m.error();
    return std::pair{make_header(*l, std::move(*m)), std::move(head)};
}

}  // namespace

result<snapshot_header> read_snapshot_header(const readable_file & f, snapshot_defect * why) {
    auto r = read_head(f, why);
    if (!r) return r.error();
    return std::move(r->first);
}

result<snapshot> read_snapshot(const readable_file & f, snapshot_defect * why) {
    auto r = read_head(f, why);
    if (!r) return r.error();
    snapshot_header & h = r->first;
    const std::vector<uint8_t> & head = r->second;
    std::vector<uint8_t> token_bytes((size_t)(h.kv_offset - h.head_bytes));
    WARMCTX_RETURN_IF_ERROR(f.read_at(h.head_bytes, token_bytes.size(), token_bytes.data()));
    // The KV is read straight into the vector the caller gets: no second copy.
    snapshot s;
    s.kv.resize((size_t)h.kv_bytes);
    WARMCTX_RETURN_IF_ERROR(f.read_at(h.kv_offset, s.kv.size(), s.kv.data()));
    uint8_t trailer[sf::k_checksum_bytes];
    WARMCTX_RETURN_IF_ERROR(f.read_at(h.kv_offset + h.kv_bytes, sizeof trailer, trailer));
    auto tokens = check_body(h, head, token_bytes, s.kv, trailer, why);
    if (!tokens) return tokens.error();
    s.meta = std::move(h.meta);
    s.tokens = std::move(*tokens);
    return s;
}

status check_snapshot_profile(const snapshot_meta & meta, const profile & expected,
                              std::vector<std::string> * drifted) {
    std::vector<std::string> fields = meta.prof.drifted_fields(expected);
    if (drifted) *drifted = fields;
    if (fields.empty()) return {};
    std::string msg = "profile drift: ";
    std::vector<std::string> lines = meta.prof.describe_drift(expected);
    for (size_t i = 0; i < lines.size(); ++i) msg += (i ? "; " : "") + lines[i];
    return failed_precondition(std::move(msg));
}

std::string snapshot_file_name(hash128 key, std::string_view workspace) {
    return key.hex() + "-" + hash_string(workspace).hex().substr(0, 16) + std::string(sf::k_file_suffix);
}

}  // namespace warmctx
