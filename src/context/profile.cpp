#include "warmctx/profile.h"
#include "util/json.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <variant>


#include <nlohmann/json.hpp>
// XXH3_state_t (streaming a file) is complete only with the static-linking declarations.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "quote.h"

namespace warmctx {

using detail::quote_input;

namespace {

// ---- the field table: one list drives the fingerprint, drift, and JSON ----------

using member = std::variant<std::string profile::*, uint32_t profile::*, int32_t profile::*,
                            float profile::*, bool profile::*>;

struct field_desc {
    std::string_view name;
    member m;
};

// Declaration order of `profile`. Appending a field changes every fingerprint (an
// intended miss: old caches did not record it); bump k_profile_format too.
const field_desc k_fields[] = {
    {"model_digest", &profile::model_digest},
    {"tokenizer_digest", &profile::tokenizer_digest},
    {"chat_template_digest", &profile::chat_template_digest},
    {"llama_commit", &profile::llama_commit},
    {"backend", &profile::backend},
    {"rope_freq_base", &profile::rope_freq_base},
    {"rope_freq_scale", &profile::rope_freq_scale},
    {"yarn", &profile::yarn},
    {"kv_type", &profile::kv_type},
    {"chunk_tokens", &profile::chunk_tokens},
    {"kv_mode", &profile::kv_mode},
    {"flash_attn", &profile::flash_attn},
    {"n_gpu_layers", &profile::n_gpu_layers},
    {"free_splits", &profile::free_splits},
};

// v3: n_ctx and kv_streams left the profile (they size the cache, not its values).
// v4: chat messages share a chunk from one assistant message to the next, and are no
//     longer cut at diff units (the same tokens are chunked differently).
// v5: a changed stable segment's finer blocks are also cut before indented and
//     punctuation-led lines where the tokenizer allows it (text_model::plain_splits_at_any_line).
// v6: with flash attention on the CPU, a chunk of fewer than 64 tokens deep in a sequence
//     is decoded padded to 64 rows (engine::pad_rows): the same chunk's KV differs.
// v7: a run of chat messages goes on through assistant messages until it holds
//     profile::span_tokens (conversation_span): fewer, larger chunks of a conversation.
// v8: spans grow with depth (at most a run's start / 8, from 64 tokens on).
// v9: free_splits (an engine whose KV does not depend on its decode calls prefills in
//     calls of chunk_tokens, every shorter one padded).
constexpr std::string_view k_profile_format = "warmctx-profile-v9";

// Shortest decimal that reads back as the same float: exact and readable.
std::string float_text(float f) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, f);
    return std::string(buf, r.ptr);
}

std::string canonical_value(const profile & p, const member & m) {
    return std::visit(
        [&](auto ptr) -> std::string {
            using T = std::remove_cvref_t<decltype(p.*ptr)>;
            const T & v = p.*ptr;
            if constexpr (std::is_same_v<T, std::string>) return v;
            else if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
            else if constexpr (std::is_same_v<T, float>) return float_text(v);
            else return std::to_string(v);
        },
        m);
}

void update_length_prefixed(XXH3_state_t & st, std::string_view s) {
    // length-prefixed so that ("ab","c") and ("a","bc") hash differently
    const uint64_t n = s.size();
    XXH3_128bits_update(&st, &n, sizeof n);
    XXH3_128bits_update(&st, s.data(), s.size());
}

}  // namespace

std::vector<std::pair<std::string_view, std::string>> profile::canonical_fields() const {
    std::vector<std::pair<std::string_view, std::string>> out;
    out.reserve(std::size(k_fields));
    for (const auto & f : k_fields) out.emplace_back(f.name, canonical_value(*this, f.m));
    return out;
}

hash128 profile::fingerprint() const {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    update_length_prefixed(st, k_profile_format);
    for (const auto & [name, value] : canonical_fields()) {
        update_length_prefixed(st, name);
        update_length_prefixed(st, value);
    }
    const XXH128_hash_t h = XXH3_128bits_digest(&st);
    return {h.high64, h.low64};
}

std::vector<std::string> profile::drifted_fields(const profile & other) const {
    std::vector<std::string> out;
    const auto a = canonical_fields(), b = other.canonical_fields();
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].second != b[i].second) out.emplace_back(a[i].first);
    return out;
}

std::vector<std::string> profile::describe_drift(const profile & other) const {
    std::vector<std::string> out;
    const auto a = canonical_fields(), b = other.canonical_fields();
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].second != b[i].second)
            out.push_back(std::string(a[i].first) + ": " + quote_input(a[i].second) + " -> " +
                          quote_input(b[i].second));
    return out;
}

nlohmann::json profile::to_json() const {
    nlohmann::json j = nlohmann::json::object();
    for (const auto & f : k_fields)
        std::visit([&](auto ptr) { j[std::string(f.name)] = this->*ptr; }, f.m);
    return j;
}

result<profile> profile::from_json(const nlohmann::json & j) {
    if (!j.is_object()) return invalid_argument("profile: must be a JSON object");
    for (const auto & [key, _] : j.items()) {
        bool known = false;
        for (const auto & f : k_fields) known = known || f.name == key;
        if (!known) return invalid_argument("profile: unknown field " + quote_input(key));
    }
    profile p;
    for (const auto & f : k_fields) {
        const std::string name(f.name);
        auto field = json_field(j, name, "profile");
        if (!field.ok()) return field.error();
        const nlohmann::json & v = **field;
        const std::string where = "profile: field '" + name + "'";
        status st = std::visit(
            [&](auto ptr) -> status {
                using T = std::remove_cvref_t<decltype(p.*ptr)>;
                if constexpr (std::is_same_v<T, std::string>) {
                    auto x = json_as_string(v, where);
                    if (!x.ok()) return x.error();
                    p.*ptr = *x;
                } else if constexpr (std::is_same_v<T, bool>) {
                    auto x = json_as_bool(v, where);
                    if (!x.ok()) return x.error();
                    p.*ptr = *x;
                } else if constexpr (std::is_same_v<T, float>) {
                    auto x = json_as_number(v, where);
                    if (!x.ok()) return x.error();
                    // A double beyond float's range would become infinity, which to_json
                    // writes as null: a profile that could never be read back.
                    if (!(std::fabs(*x) <= static_cast<double>(std::numeric_limits<float>::max())))
                        return invalid_argument(where + " is out of range");
                    p.*ptr = static_cast<float>(*x);
                } else {
                    auto x = json_as_int(v, where, (int64_t)std::numeric_limits<T>::min(),
                                         (int64_t)std::numeric_limits<T>::max());
                    if (!x.ok()) return x.error();
                    p.*ptr = static_cast<T>(*x);
                }
                return {};
            },
            f.m);
        WARMCTX_RETURN_IF_ERROR(st);
    }
    if (p.kv_mode != "exact" && p.kv_mode != "shared")
        return invalid_argument("profile: field 'kv_mode' must be \"exact\" or \"shared\", not " +
                                quote_input(p.kv_mode));
    return p;
}

// ---- file digests ---------------------------------------------------------------

namespace {

constexpr size_t k_digest_buffer_bytes = size_t{4} << 20;  // 4 MiB
constexpr int k_digest_attempts = 3;  // a file rewritten while we read it: try again

struct memo_key {
    std::string path;
    uint64_t offset = 0, n_bytes = 0;
    bool operator<(const memo_key & o) const {
        return std::tie(path, offset, n_bytes) < std::tie(o.path, o.offset, o.n_bytes);
    }
};

struct memo_value {
    file_version identity;
    hash128 digest;
};

struct digest_memo {
    std::mutex mutex;                         // guards `entries` and `stats`
    std::map<memo_key, memo_value> entries;   // one per (path, range); last version seen
    file_digest_stats stats;
};

digest_memo & memo() {
    static digest_memo m;  // function-local: no static-initialisation-order trap
    return m;
}

// One attempt: hash [offset, offset+n) of the open file, then check the file's version
// did not change. Returns failed_precondition when it changed while reading (the caller
// retries).
result<hash128> hash_range(file_system & fs, const readable_file & f, const std::string & path, uint64_t offset,
                           uint64_t n, const file_version & before, uint64_t & n_read) {
    std::vector<uint8_t> buf(k_digest_buffer_bytes);
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    uint64_t done = 0;
    while (done < n) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), n - done));
        if (status r = f.read_at(offset + done, want, buf.data()); !r.ok()) {
            if (r.code() == status_code::out_of_range)  // shorter than when it was opened
                return failed_precondition("file " + quote_input(path) + " shrank while being read");
            return r;
        }
        XXH3_128bits_update(&st, buf.data(), want);
        done += want;
        n_read += want;
    }
    auto after = fs.stat_file(path);
    if (!after.ok()) return after.error();
    if (!(*after == before)) return failed_precondition("file " + quote_input(path) + " changed while being read");
    const XXH128_hash_t h = XXH3_128bits_digest(&st);
    return hash128{h.high64, h.low64};
}

}  // namespace

result<hash128> digest_bytes(const std::string & path, uint64_t offset, uint64_t n_bytes, file_system & fs) {
    const memo_key key{path, offset, n_bytes};
    status last_change;
    for (int attempt = 0; attempt < k_digest_attempts; ++attempt) {
        auto v = fs.stat_file(path);
        if (!v.ok()) return v.error().with_context("digest");
        const file_version id = *v;

        {
            digest_memo & m = memo();
            std::lock_guard lock(m.mutex);
            auto it = m.entries.find(key);
            if (it != m.entries.end() && it->second.identity == id) {
                ++m.stats.n_memo_hits;
                return it->second.digest;
            }
        }

        if (offset > id.size)
            return out_of_range("digest: offset " + std::to_string(offset) + " is past the end of " +
                                quote_input(path) + " (" + std::to_string(id.size) + " bytes)");
        const uint64_t n = n_bytes == k_to_end_of_file ? id.size - offset : n_bytes;
        if (n > id.size - offset)
            return out_of_range("digest: range [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                ") is past the end of " + quote_input(path) + " (" + std::to_string(id.size) +
                                " bytes)");

        // Read outside the lock: digesting a multi-GB model must not block other files.
        auto f = fs.open_readable(path);
        if (!f.ok()) return f.error().with_context("digest");
        uint64_t n_read = 0;
        auto h = hash_range(fs, **f, path, offset, n, id, n_read);
        digest_memo & m = memo();
        std::lock_guard lock(m.mutex);
        m.stats.n_bytes_read += n_read;
        if (h.ok()) {
            ++m.stats.n_computed;
            m.entries[key] = memo_value{id, *h};
            return h;
        }
        if (h.error().code() != status_code::failed_precondition) return h.error();
        last_change = h.error();
    }
    return io_error(last_change.message() + " (" + std::to_string(k_digest_attempts) + " attempts)");
}

result<hash128> file_digest(const std::string & path, file_system & fs) {
    return digest_bytes(path, 0, k_to_end_of_file, fs);
}

file_digest_stats get_file_digest_stats() {
    digest_memo & m = memo();
    std::lock_guard lock(m.mutex);
    return m.stats;
}

}  // namespace warmctx
