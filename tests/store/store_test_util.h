// Helpers of the store tests: deterministic profiles, prompt paths and snapshots.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "warmctx/assembler.h"
#include "store/snapshot.h"

namespace warmctx::testing {

inline profile test_profile() {
    profile p;
    p.model_digest = hash_string("model").hex();
    p.tokenizer_digest = hash_string("tokenizer").hex();
    p.chat_template_digest = hash_string("template").hex();
    p.llama_commit = "80fb11ac73e66d89eae2c6a91d8a77428fa733ed";
    p.backend = "CPU";
    p.kv_type = "f16";
    p.chunk_tokens = 16;
    p.kv_mode = "exact";
    return p;
}

// A prompt as the assembler would give it: segments of `tokens_per_segment` tokens each,
// one class per segment, blocks of at most `chunk` tokens that restart at every segment,
// chain hashes rooted in the profile and a tenant salt.
struct test_path {
    profile prof;
    manifest prompt_manifest;
    std::vector<token_id> tokens;
    std::vector<block> blocks;
};

inline test_path make_path(uint32_t seed, const std::vector<retention_class> & classes, int tokens_per_segment = 40,
                           int chunk = 16, const profile & prof = test_profile()) {
    test_path t;
    t.prof = prof;
    std::mt19937 rng(seed);
    hash128 h = root_hash(prof, "tenant");
    pos_t at = 0;
    for (size_t s = 0; s < classes.size(); ++s) {
        manifest_entry e;
        e.id = "seg" + std::to_string(s);
        e.kind = segment_kind::repo_map;
        e.role = "system";
        e.order = (int)s;
        e.how_stable = stability::stable;
        e.retention = classes[s];
        e.token_begin = at;
        e.token_end = at + tokens_per_segment;
        e.content_bytes = 100;
        e.content_hash = hash_string(e.id + std::to_string(seed));
        std::vector<token_id> seg((size_t)tokens_per_segment);
        for (auto & x : seg) x = (token_id)(rng() % 150000);
        e.token_hash = hash_tokens(seg);
        for (pos_t b = 0; b < tokens_per_segment; b += chunk) {
            pos_t e_end = std::min<pos_t>(b + chunk, tokens_per_segment);
            std::span<const token_id> toks(seg.data() + b, (size_t)(e_end - b));
            h = chain_hash(h, toks);
            t.blocks.push_back({h, at + b, at + e_end, classes[s], (int)s});
        }
        t.tokens.insert(t.tokens.end(), seg.begin(), seg.end());
        t.prompt_manifest.segments.push_back(e);
        at += tokens_per_segment;
    }
    t.prompt_manifest.n_tokens = at;
    t.prompt_manifest.profile_fingerprint = prof.fingerprint();
    return t;
}

inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(n);
    for (auto & b : v) b = (uint8_t)rng();
    return v;
}

// The first n_blocks blocks of a path as a snapshot with seeded pseudo-KV.
inline snapshot snapshot_of(const test_path & p, size_t n_blocks, const std::string & workspace, uint32_t kv_seed = 7,
                            size_t kv_bytes = 1000, uint64_t created_ms = 1'700'000'000'000) {
    snapshot s;
    s.meta.prof = p.prof;
    s.meta.profile_fingerprint = p.prof.fingerprint();
    s.meta.workspace = workspace;
    s.meta.prompt_manifest = p.prompt_manifest;
    s.meta.blocks.assign(p.blocks.begin(), p.blocks.begin() + (ptrdiff_t)n_blocks);
    s.meta.created_unix_ms = created_ms;
    s.tokens.assign(p.tokens.begin(), p.tokens.begin() + s.meta.n_tokens());
    s.kv = random_bytes(kv_bytes, kv_seed);
    return s;
}

inline std::vector<hash128> chains_of(const test_path & p) {
    std::vector<hash128> v;
    for (const block & b : p.blocks) v.push_back(b.chain);
    return v;
}

inline void expect_same_snapshot(const snapshot & a, const snapshot & b) {
    EXPECT_EQ(a.meta.prof, b.meta.prof);
    EXPECT_EQ(a.meta.profile_fingerprint, b.meta.profile_fingerprint);
    EXPECT_EQ(a.meta.workspace, b.meta.workspace);
    EXPECT_EQ(a.meta.prompt_manifest, b.meta.prompt_manifest);
    EXPECT_EQ(a.meta.blocks, b.meta.blocks);
    EXPECT_EQ(a.meta.created_unix_ms, b.meta.created_unix_ms);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.kv, b.kv);
}

}  // namespace warmctx::testing
