// warmctx/hash.h - the 128-bit hash behind every content, token and block hash.
// XXH3-128 (libxxhash): fast, stable across platforms and versions of the library.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace warmctx {

struct hash128 {
    uint64_t hi = 0, lo = 0;
    bool operator==(const hash128 &) const = default;
    auto operator<=>(const hash128 &) const = default;
    std::string hex() const;         // 32 lower-case hex digits
    std::string short_hex() const;   // the first 12, for tables
};

hash128 hash_bytes(const void * data, size_t n, hash128 seed = {});
inline hash128 hash_string(std::string_view s, hash128 seed = {}) { return hash_bytes(s.data(), s.size(), seed); }
// Chains: H(prev, data). Used for block chain hashes h_i = H(h_{i-1}, block_i).
hash128 hash_combine(hash128 prev, const void * data, size_t n);

struct hash128_hasher {
    size_t operator()(const hash128 & h) const noexcept { return (size_t)(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

}  // namespace warmctx
