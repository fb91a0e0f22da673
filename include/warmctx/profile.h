// warmctx/profile.h - when may a cached KV be reused.
//
// The KV of a token is a function of the tokens before it AND of everything that
// computed it: the weights, the tokenizer and template that produced the tokens, the
// llama.cpp build and backend, the RoPE settings, the KV precision, the chunk
// composition and the KV mode. A `profile` names all of those. Its fingerprint roots
// every block chain hash (see assembler.h), so any drift forces a miss by construction,
// and drifted_fields() tells explain which field it was.
//
// What only sizes the cache is not in it: the context per sequence (n_ctx), the number
// of sequences (--parallel, holders) and so the KV stream count, and the budgets. The
// same prefix's KV is the same bytes under any of them (tests/model/exactness_test.cpp,
// SavedStateIsIndependentOfContextSizeAndStreamCount), and engine::save_seq writes a
// state that loads into any stream count; a saved prefix longer than the current
// context's sequences is refused when loaded, not by the profile.
//
// Digest fields are opaque lower-case hex strings (hash128::hex() of file_digest()
// or hash_string(), typically). Floats are compared and hashed by their shortest
// round-trip decimal form, so two profiles are equal exactly when their
// canonical_fields() are.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "warmctx/fs.h"
#include "warmctx/hash.h"
#include "warmctx/status.h"

namespace warmctx {

struct profile {
    std::string model_digest;          // digest of the whole model file (file_digest)
    std::string tokenizer_digest;      // digest of the vocabulary + merges + special tokens
    std::string chat_template_digest;  // digest of the chat template text
    std::string llama_commit;          // the llama.cpp commit warmctx was built against
    std::string backend;               // "CPU", "CUDA", ... (where the KV was computed)
    float rope_freq_base = 0;          // as passed to the context (0 = model default)
    float rope_freq_scale = 0;
    std::string yarn;                  // canonical YaRN settings, "" when not used,
                                       // e.g. "ext=1;attn=1;beta_fast=32;beta_slow=1;orig_ctx=32768"
    std::string kv_type = "f16";       // KV precision: f16, q8_0, ...
    uint32_t chunk_tokens = 512;       // canonical chunk size (changes the KV's last bits)
    std::string kv_mode = "exact";     // "exact" | "shared"
    // Not the model or the context, but both change the kernels that compute the KV, so they
    // change its last bits like a backend change does.
    bool flash_attn = false;
    int32_t n_gpu_layers = 0;          // layers offloaded (-1 = all)
    // The engine measured that a prompt's KV does not depend on its decode calls
    // (context_info::splits_freely): it prefills in calls of chunk_tokens from wherever a
    // turn starts, every call under 64 rows padded, which changes the last bits of KV that
    // canonical chunks would have made.
    bool free_splits = false;
    // Not a field of its own (not fingerprinted, not in the JSON): the least spacing, in
    // tokens, of the checkpoints a prefill takes for a model whose memory needs one to
    // resume (engine.h, memory_kind): the tokens whose attention KV outweighs a checkpoint;
    // 0 = any block end. Blocks are canonical chunks whatever it is. A pure function of
    // fields above (the model, its KV type, the chunk size: checkpoint_spacing).
    uint32_t checkpoint_tokens = 0;
    // Not a field of its own either: the fewest tokens a chunk run of chat messages
    // holds before the next assistant message may start another (build_blocks), so that a
    // conversation of many short messages prefills in calls of at least this size; 0 =
    // every assistant message starts a run (also where the engine splits freely: its calls
    // do not follow the blocks). A pure function of the backend, the chunk size and
    // free_splits (conversation_span).
    uint32_t span_tokens = 0;

    // (name, canonical value) of every field, in declaration order - the single
    // source of the fingerprint, the drift report and the JSON field names.
    std::vector<std::pair<std::string_view, std::string>> canonical_fields() const;

    // H(format version, canonical_fields()). Equal iff drifted_fields() is empty.
    hash128 fingerprint() const;

    // The names of the fields whose values differ, in declaration order
    // ("model_digest", "kv_type", ...). Empty when the profiles are compatible.
    std::vector<std::string> drifted_fields(const profile & other) const;

    // One line per drifted field: "kv_type: f16 -> q8_0". Empty when compatible.
    std::vector<std::string> describe_drift(const profile & other) const;

    // Every field, by its name. from_json is strict: an unknown or missing field or a
    // wrong type is invalid_argument naming it (a profile that silently defaulted a
    // field could claim a match it does not have). kv_mode must be exact|shared.
    nlohmann::json to_json() const;
    static result<profile> from_json(const nlohmann::json & j);

    bool operator==(const profile & o) const { return canonical_fields() == o.canonical_fields(); }
};

// XXH3-128 of a whole file's bytes (the same value as hash_bytes() over them),
// read in 4 MiB buffers through the file-system seam (the real one by default). Memoised in-process by (path, size,
// mtime, ctime, inode, device): a second call on an unchanged file does not read it; any write, replace or touch
// recomputes. A file that changes while being read is io_error (the memo is not updated). Errors: not_found, io_error.
// Thread-safe; two threads digesting the same new file may both read it (the digest is not computed under the lock).
result<hash128> file_digest(const std::string & path, file_system & fs = posix_fs());

// Like file_digest over the bytes [offset, offset + n_bytes) only - for a GGUF's
// tensor data region, so that editing metadata does not change the model digest.
// n_bytes == k_to_end_of_file means "to the end of the file". Memoised separately per
// (offset, n_bytes). Errors: as file_digest, and out_of_range when the range is not
// inside the file.
inline constexpr uint64_t k_to_end_of_file = ~uint64_t{0};
result<hash128> digest_bytes(const std::string & path, uint64_t offset, uint64_t n_bytes,
                             file_system & fs = posix_fs());

// Counters of the digest memo (for tests and metrics).
struct file_digest_stats {
    uint64_t n_computed = 0;    // digests computed by reading a file
    uint64_t n_memo_hits = 0;   // digests served from the memo
    uint64_t n_bytes_read = 0;
};
file_digest_stats get_file_digest_stats();

}  // namespace warmctx
