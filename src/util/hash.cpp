#include "warmctx/hash.h"

#include <cstdio>
#include <cstring>
// XXH3_state_t is a complete type only with static linking declarations.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace warmctx {

std::string hash128::hex() const {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)hi, (unsigned long long)lo);
    return buf;
}

std::string hash128::short_hex() const { return hex().substr(0, 12); }

hash128 hash_bytes(const void * data, size_t n, hash128 seed) {
    // Seeded by folding the seed into the input: XXH3_128bits_withSeed takes 64 bits only.
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    if (seed.hi || seed.lo) {
        uint64_t s[2] = {seed.hi, seed.lo};
        XXH3_128bits_update(&st, s, sizeof s);
    }
    XXH3_128bits_update(&st, data, n);
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    return {h.high64, h.low64};
}

hash128 hash_combine(hash128 prev, const void * data, size_t n) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    uint64_t s[2] = {prev.hi, prev.lo};
    XXH3_128bits_update(&st, s, sizeof s);
    XXH3_128bits_update(&st, data, n);
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    return {h.high64, h.low64};
}

}  // namespace warmctx
