// store/snapshot.h - the snapshot file: one sequence's KV on disk, with everything
// needed to prove it may be reused (profile, manifest, blocks, tokens) and checksums.
//
// The format is documented in docs/snapshot-format.md; the constants below mirror it and
// are the only place the code spells them. In short (all integers little-endian):
//
//   [0, 192)            fixed header: magic, version, sizes, key, counts, section table,
//                       and the fixed-header checksum (XXH3-128 of bytes [0, 176))
//   profile JSON        profile::to_json(), compact
//   workspace           UTF-8 bytes, no terminator
//   manifest JSON       manifest::to_json(), compact
//   blocks              32 bytes per block: chain hash, begin, end, segment index, class
//   header checksum     XXH3-128 of everything before it
//   tokens              int32 per token
//   KV                  engine::save_seq output (llama.cpp's state, one-stream form)
//   body checksum       XXH3-128 of everything before it (the whole file but these 16 bytes)
//
// The "head" (fixed header through header checksum) is what a listing reads: it says
// everything about the file but its tokens and KV, and its own checksum lets a reader
// trust it without reading the KV. A full read checks the body checksum too, and that
// the tokens reproduce the block chain hashes, before any byte is handed out.
//
// Every decode checks before it returns; a failure is `corrupt` whose message begins with
// the defect's name ("truncated: ..."), and the defect itself is reported through the
// optional `why` out-parameter. No input makes a decoder crash, allocate out of
// proportion to the input's size, or read outside its input.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/assembler.h"   // manifest, block
#include "warmctx/fs.h"
#include "warmctx/hash.h"
#include "warmctx/profile.h"
#include "warmctx/status.h"

namespace warmctx {

namespace snapshot_format {
inline constexpr std::array<char, 8> k_magic = {'W', 'C', 'T', 'X', 'S', 'N', 'A', 'P'};
// 2: the KV section is engine::save_seq's one-stream form (1: llama.cpp's state with
// the saving context's stream count), and the profile has no n_ctx or kv_streams.
inline constexpr uint32_t k_version = 2;

// The fixed header: field offsets.
inline constexpr size_t k_off_magic = 0;            // char[8]
inline constexpr size_t k_off_version = 8;          // u32
inline constexpr size_t k_off_fixed_bytes = 12;     // u32, == k_fixed_header_bytes
inline constexpr size_t k_off_file_bytes = 16;      // u64, the whole file
inline constexpr size_t k_off_created_ms = 24;      // u64, Unix time of the write, ms
inline constexpr size_t k_off_fingerprint = 32;     // u64 hi, u64 lo: profile fingerprint
inline constexpr size_t k_off_key = 48;             // u64 hi, u64 lo: last block's chain hash
inline constexpr size_t k_off_n_tokens = 64;        // u32
inline constexpr size_t k_off_n_blocks = 68;        // u32
inline constexpr size_t k_off_last_class = 72;      // u32, retention_class of the last block
inline constexpr size_t k_off_flags = 76;           // u32, 0 (reserved)
inline constexpr size_t k_off_sections = 80;        // k_n_sections x (u64 offset, u64 bytes)
inline constexpr size_t k_off_fixed_checksum = 176; // XXH3-128 of [0, 176): u64 hi, u64 lo
inline constexpr size_t k_fixed_header_bytes = 192;

// Sections, in file order (the table lists them in this order too).
enum section : uint8_t { s_profile = 0, s_workspace, s_manifest, s_blocks, s_tokens, s_kv };
inline constexpr size_t k_n_sections = 6;
inline constexpr size_t k_section_entry_bytes = 16;
inline constexpr size_t k_block_record_bytes = 32;  // u64 hi, u64 lo, i32 begin, i32 end,
                                                    // i32 segment_index, u8 class, u8[3] zero
inline constexpr size_t k_checksum_bytes = 16;

// Limits a decoder enforces before allocating.
inline constexpr uint64_t k_max_head_bytes = uint64_t{256} << 20;  // fixed header .. header checksum
inline constexpr size_t k_max_workspace_bytes = 4096;

// File names in a snapshot directory.
inline constexpr std::string_view k_file_suffix = ".wcsnap";
inline constexpr std::string_view k_temp_suffix = ".tmp";
}  // namespace snapshot_format

// Why a file is not a usable snapshot. Names are stable (counters, CLI, explain).
enum class snapshot_defect : uint8_t {
    none = 0,
    truncated,           // shorter than its header says (or than a header)
    bad_magic,           // not a snapshot file
    foreign_version,     // a format version this build does not read
    header_checksum,     // the fixed header or the metadata sections fail their checksum
    bad_layout,          // sizes/offsets inconsistent (or bytes after the end)
    malformed_profile,   // the profile JSON does not parse as a profile
    malformed_workspace, // the workspace name is too long or holds control bytes
    malformed_manifest,  // the manifest JSON does not parse as a manifest
    malformed_blocks,    // blocks not contiguous from 0, bad class or segment index
    inconsistent,        // fields disagree (fingerprint vs profile, key vs last block, ...)
    body_checksum,       // the tokens or KV fail the whole-file checksum
    chain_mismatch,      // the tokens do not reproduce the blocks' chain hashes
    misnamed,            // (store) the file's name is not the one its header implies
};
std::string_view snapshot_defect_name(snapshot_defect d);

// Everything about a snapshot but its tokens and KV (the head of the file).
struct snapshot_meta {
    profile prof;
    hash128 profile_fingerprint;   // == prof.fingerprint() (decode checks it)
    std::string workspace;         // may be empty; at most 4096 bytes, no control bytes
    manifest prompt_manifest;                  // of the prompt the KV was computed for (may cover more
                                   // than the snapshot: the uncached tail)
    std::vector<block> blocks;     // cover [0, n_tokens) in order, first begins at 0
    uint64_t created_unix_ms = 0;

    pos_t n_tokens() const { return blocks.empty() ? 0 : blocks.back().end; }
    // The key: the chain hash of the last block. It names the KV of [0, n_tokens).
    hash128 key() const { return blocks.empty() ? hash128{} : blocks.back().chain; }
    retention_class last_class() const { return blocks.empty() ? retention_class::none : blocks.back().retention; }
};

struct snapshot {
    snapshot_meta meta;
    std::vector<token_id> tokens;  // [0, n_tokens)
    std::vector<uint8_t> kv;       // engine::save_seq of a sequence holding exactly the tokens
};

// What decoding the head gives.
struct snapshot_header {
    snapshot_meta meta;
    uint64_t file_bytes = 0;
    uint64_t head_bytes = 0;       // [0, head_bytes): fixed header .. header checksum
    uint64_t kv_offset = 0;
    uint64_t kv_bytes = 0;
};

// The checks encode makes (decode makes the same ones on what it reads): blocks non-empty,
// contiguous from 0, begin < end, class valid, segment_index in [-1, segments) (-1: the
// generation prompt); tokens.size() == n_tokens; the tokens reproduce every chain link
// after the first (blocks[i].chain == chain_hash(blocks[i-1].chain, block i's tokens);
// the first link needs the tenant salt, which a file never holds); profile_fingerprint ==
// prof.fingerprint(); the manifest's profile_fingerprint, when set, equal to it; workspace
// valid; kv non-empty. Errors: invalid_argument naming the check.
status validate_snapshot(const snapshot_meta & meta, std::span<const token_id> tokens,
                         std::span<const uint8_t> kv);

// The whole file, in memory. Errors: as validate_snapshot.
result<std::vector<uint8_t>> encode_snapshot(const snapshot_meta & meta, std::span<const token_id> tokens,
                                             std::span<const uint8_t> kv);
// Streams the same bytes into `out` (no copy of the KV); returns the bytes written.
// Does not sync or close. Errors: as validate_snapshot, and out's errors.
result<uint64_t> write_snapshot(writable_file & out, const snapshot_meta & meta, std::span<const token_id> tokens,
                                std::span<const uint8_t> kv);

// Decodes and checks the head of a file whose first bytes are `file_prefix` and whose
// size is `file_size` (file_prefix may be the whole file). Checks magic, version, the
// fixed-header checksum, the layout against file_size, the header checksum, and parses
// and cross-checks the metadata. Reads no token or KV byte.
// Errors: corrupt (see snapshot_defect), invalid_argument when file_prefix is shorter
// than the head but the file is not (the caller must pass more bytes).
result<snapshot_header> decode_snapshot_header(std::span<const uint8_t> file_prefix, uint64_t file_size,
                                               snapshot_defect * why = nullptr);

// Decodes and checks a whole file: the head as above, then the body checksum, and that
// the tokens reproduce the chain hashes. Errors: corrupt (see snapshot_defect).
result<snapshot> decode_snapshot(std::span<const uint8_t> file, snapshot_defect * why = nullptr);

// The same over an open file: the head only (two small reads), or everything, read
// straight into the result's vectors. Errors: corrupt, io_error.
result<snapshot_header> read_snapshot_header(const readable_file & f, snapshot_defect * why = nullptr);
result<snapshot> read_snapshot(const readable_file & f, snapshot_defect * why = nullptr);

// ok when the snapshot was made under `expected`; else failed_precondition whose message
// names every drifted field ("profile drift: kv_type: 'f16' -> 'q8_0'; ..."),
// and `drifted`, if given, receives the field names (profile::drifted_fields).
status check_snapshot_profile(const snapshot_meta & meta, const profile & expected,
                              std::vector<std::string> * drifted = nullptr);

// "<32 hex of key>-<16 hex of hash(workspace)>.wcsnap": the name a snapshot directory
// gives the file of (key, workspace). The workspace is hashed so any name is safe.
std::string snapshot_file_name(hash128 key, std::string_view workspace);

}  // namespace warmctx
