// Unit tests of the prefix cache on a fake engine: deterministic, no model, no sleeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "warmctx/prefix_cache.h"

namespace warmctx {
namespace {

using rc = retention_class;
constexpr auto k_semantic = eviction_policy::semantic;
constexpr auto k_lru = eviction_policy::lru;
constexpr auto k_per_holder = kv_accounting::per_holder;
constexpr auto k_shared = kv_accounting::shared_cells;

std::string_view class_str(rc c) {  // retention_class_name belongs to src/context
    static const char * names[] = {"none", "low", "medium", "high", "highest"};
    return names[(int)c];
}

// ---- paths ---------------------------------------------------------------

struct spec {
    std::string label;
    pos_t n_tokens;
    rc retention;
};

// chain_i = H(chain_{i-1}, label_i), rooted in H(tenant): the planner's hash chain in small.
std::vector<block> make_path(std::string_view tenant, const std::vector<spec> & specs) {
    std::vector<block> out;
    hash128 prev = hash_string(tenant);
    pos_t pos = 0;
    for (const spec & s : specs) {
        hash128 c = hash_combine(prev, s.label.data(), s.label.size());
        out.push_back({c, pos, pos + s.n_tokens, s.retention});
        pos += s.n_tokens;
        prev = c;
    }
    return out;
}

std::vector<block> one_block(std::string_view tenant, pos_t n, rc retention) {
    return make_path(tenant, {{"b", n, retention}});
}

// ---- the fake engine ---------------------------------------------------------

// Tracks how many tokens each sequence holds and logs every call. Copying or trimming a
// sequence it does not know fails, like the real engine would.
class fake_kv final : public kv_ops {
  public:
    explicit fake_kv(const std::vector<seq_id> & seqs) {
        for (seq_id s : seqs) n_tokens[s] = 0;
    }
    status copy_seq(seq_id src, seq_id dst) override {
        ops.push_back("copy " + std::to_string(src) + "->" + std::to_string(dst));
        if (!n_tokens.count(src) || !n_tokens.count(dst)) return not_found("fake kv: unknown seq");
        if (fail_copies > 0) {
            --fail_copies;
            n_tokens[dst] = n_tokens[src] / 2;  // a half-done copy: the cache must clear it
            return engine_error("fake kv: injected copy failure");
        }
        n_tokens[dst] = n_tokens[src];
        return {};
    }
    status trim_seq(seq_id seq, pos_t from) override {
        ops.push_back("trim " + std::to_string(seq) + "@" + std::to_string(from));
        if (!n_tokens.count(seq)) return not_found("fake kv: unknown seq");
        if (from < 0) return invalid_argument("fake kv: negative position");
        if (fail_trims > 0 || fail_trims_on.count(seq)) {
            if (fail_trims > 0) --fail_trims;
            return engine_error("fake kv: injected trim failure");
        }
        n_tokens[seq] = std::min(n_tokens[seq], from);
        return {};
    }
    void clear_seq(seq_id seq) override {
        ops.push_back("clear " + std::to_string(seq));
        if (!n_tokens.count(seq)) {
            ++n_unknown_clears;
            return;
        }
        n_tokens[seq] = 0;
    }
    // A holder that holds more than its tokens (a hybrid's recurrent states): per token and
    // a fixed part, once held_per_holder is set.
    uint64_t held_bytes(seq_id seq) const override {
        auto it = n_tokens.find(seq);
        if (held_per_holder == 0 || it == n_tokens.end() || it->second == 0) return 0;
        return (uint64_t)it->second * held_per_token + held_per_holder;
    }

    std::map<seq_id, pos_t> n_tokens;
    uint64_t held_per_token = 0, held_per_holder = 0;
    std::vector<std::string> ops;
    int fail_copies = 0;
    int fail_trims = 0;             // fail the next n trims
    std::set<seq_id> fail_trims_on; // fail every trim of these seqs
    int n_unknown_clears = 0;
};

constexpr seq_id k_src = 100;  // the request's working sequence (not a holder)

std::vector<seq_id> holder_seqs(int n) {
    std::vector<seq_id> v;
    for (int i = 0; i < n; ++i) v.push_back(i);
    return v;
}

std::vector<seq_id> with_src(std::vector<seq_id> v) {
    v.push_back(k_src);
    return v;
}

struct harness {
    harness(int n_holders, cache_budget b, eviction_policy p = k_semantic, kv_accounting a = k_per_holder)
        : seqs(holder_seqs(n_holders)), kv(with_src(seqs)), cache(kv, seqs, b, p, a) {}

    // The planner's flow: the work seq holds the prompt (and a bit more, e.g. the
    // generated reply); the cache is told to keep the path.
    status insert(const std::string & ws, const std::vector<block> & path, uint64_t now,
                  insert_outcome * out = nullptr) {
        kv.n_tokens[k_src] = path.empty() ? 0 : path.back().end + 7;
        return cache.insert(ws, path, k_src, now, out);
    }
    void must_insert(const std::string & ws, const std::vector<block> & path, uint64_t now) {
        status st = insert(ws, path, now);
        ASSERT_TRUE(st.ok()) << st.to_string();
    }
    size_t cached_blocks(const std::vector<block> & path) const { return cache.peek(path).n_blocks; }

    std::vector<seq_id> seqs;
    fake_kv kv;
    prefix_cache cache;
};

// Everything a caller may rely on after any call: invariants, budgets, and the fake
// engine's sequences agreeing token for token with the cache's accounting.
::testing::AssertionResult consistent(harness & h) {
    status st = h.cache.check_invariants();
    if (!st.ok()) return ::testing::AssertionFailure() << st.to_string();
    const auto hs = h.cache.holders();
    const auto c = h.cache.counters();
    const cache_budget & b = h.cache.budget();

    std::set<seq_id> used;
    uint64_t sum_holder_tokens = 0, beyond = 0;  // beyond: what holders hold past their tokens' charge
    std::map<hash128, pos_t> distinct;
    std::map<std::string, uint64_t> ws_sum;
    std::map<std::string, std::map<hash128, pos_t>> ws_distinct;
    for (const holder_info & hi : hs) {
        used.insert(hi.seq);
        if (h.kv.n_tokens[hi.seq] != hi.n_tokens)
            return ::testing::AssertionFailure() << "holder seq " << hi.seq << " holds " << h.kv.n_tokens[hi.seq]
                                                 << " tokens in the engine, the cache says " << hi.n_tokens;
        if (hi.blocks.empty() || hi.blocks.back().end != hi.n_tokens)
            return ::testing::AssertionFailure() << "holder seq " << hi.seq << " blocks disagree with n_tokens";
        sum_holder_tokens += hi.n_tokens;
        ws_sum[hi.workspace] += hi.n_tokens;
        const uint64_t held = h.kv.held_bytes(hi.seq), charged = (uint64_t)hi.n_tokens * b.bytes_per_token;
        beyond += b.bytes_per_token > 0 && held > charged ? held - charged : 0;
        for (const block & bl : hi.blocks) {
            if (bl.retention == rc::none) return ::testing::AssertionFailure() << "a none block is cached";
            distinct[bl.chain] = bl.end - bl.begin;
            ws_distinct[hi.workspace][bl.chain] = bl.end - bl.begin;
        }
    }
    for (seq_id s : h.seqs)
        if (!used.count(s) && h.kv.n_tokens[s] != 0)
            return ::testing::AssertionFailure() << "free holder seq " << s << " is not empty";
    uint64_t expect_total = 0;
    std::map<std::string, uint64_t> expect_ws;
    if (h.cache.accounting() == k_per_holder) {
        expect_total = sum_holder_tokens;
        expect_ws = ws_sum;
    } else {
        for (auto & [k, n] : distinct) expect_total += n;
        for (auto & [ws, m] : ws_distinct)
            for (auto & [k, n] : m) expect_ws[ws] += n;
    }
    if (c.resident_tokens != expect_total)
        return ::testing::AssertionFailure() << "resident_tokens " << c.resident_tokens << " != " << expect_total;
    const uint64_t expect_bytes = expect_total * b.bytes_per_token + beyond;
    if (c.resident_bytes != expect_bytes)
        return ::testing::AssertionFailure() << "resident_bytes " << c.resident_bytes << " != " << expect_bytes;
    if (c.workspaces.size() != expect_ws.size()) return ::testing::AssertionFailure() << "workspace count";
    for (auto & [ws, n] : expect_ws) {
        auto it = c.workspaces.find(ws);
        if (it == c.workspaces.end() || it->second.tokens != n)
            return ::testing::AssertionFailure() << "workspace '" << ws << "' tokens wrong";
        uint64_t cap = h.cache.workspace_max_tokens(ws);
        if (cap && n > cap) return ::testing::AssertionFailure() << "workspace '" << ws << "' over budget";
    }
    if (b.max_tokens && expect_total > b.max_tokens) return ::testing::AssertionFailure() << "over token budget";
    if (b.max_bytes && expect_bytes > b.max_bytes) return ::testing::AssertionFailure() << "over byte budget";
    if (c.n_holders_in_use != hs.size()) return ::testing::AssertionFailure() << "n_holders_in_use";
    if (h.kv.n_unknown_clears) return ::testing::AssertionFailure() << "cleared an unknown seq";
    return ::testing::AssertionSuccess();
}

cache_budget tokens(uint64_t max_tokens) {
    cache_budget b;
    b.max_tokens = max_tokens;
    return b;
}

// ---- eviction order ----------------------------------------------------------

// Four disjoint one-block holders, inserted highest first (so plain LRU would evict the
// highest first), then four more highest-class inserts that each need room.
std::vector<std::vector<block>> fill_four_classes(harness & h) {
    std::vector<std::vector<block>> p = {one_block("t-highest", 10, rc::highest), one_block("t-high", 10, rc::high),
                                         one_block("t-medium", 10, rc::medium), one_block("t-low", 10, rc::low)};
    for (size_t i = 0; i < p.size(); ++i) h.must_insert("ws", p[i], 1 + i);  // t = 1..4
    return p;
}

TEST(PrefixCache, SemanticEvictsLowThenMediumThenHighThenHighest) {
    harness h(8, tokens(40));
    auto p = fill_four_classes(h);
    ASSERT_TRUE(consistent(h));
    // Expected victims, in order: low, medium, high, highest.
    const size_t order[] = {3, 2, 1, 0};
    for (int i = 0; i < 4; ++i) {
        h.must_insert("ws", one_block("new-" + std::to_string(i), 10, rc::highest), 10 + i);
        ASSERT_TRUE(consistent(h));
        for (int j = 0; j < 4; ++j) {
            bool evicted_by_now = std::find(order, order + i + 1, (size_t)j) != order + i + 1;
            EXPECT_EQ(h.cached_blocks(p[j]), evicted_by_now ? 0u : 1u) << "after insert " << i << ", path " << j;
        }
        auto r = h.cache.last_eviction(p[order[i]][0].chain);
        ASSERT_TRUE(r.has_value());
        EXPECT_EQ(r->at, 10u + i);
        EXPECT_EQ(r->reason, "global token budget");
        EXPECT_TRUE(r->was_resident);
    }
    auto c = h.cache.counters();
    for (rc retention : {rc::low, rc::medium, rc::high, rc::highest}) {
        EXPECT_EQ(c.evictions_by_class[(int)retention], 1u) << class_str(retention);
        EXPECT_EQ(c.evicted_tokens_by_class[(int)retention], 10u) << class_str(retention);
    }
}

TEST(PrefixCache, PlainLruIgnoresClasses) {
    harness h(8, tokens(40), k_lru);
    auto p = fill_four_classes(h);
    // Oldest first: highest (t=1), high, medium, low.
    for (int i = 0; i < 4; ++i) {
        h.must_insert("ws", one_block("new-" + std::to_string(i), 10, rc::low), 10 + i);
        ASSERT_TRUE(consistent(h));
        for (int j = 0; j < 4; ++j) EXPECT_EQ(h.cached_blocks(p[j]), j <= i ? 0u : 1u) << i << " " << j;
        auto r = h.cache.last_eviction(p[i][0].chain);
        ASSERT_TRUE(r.has_value());
        EXPECT_EQ(r->policy, k_lru);
    }
}

TEST(PrefixCache, LeastRecentlyUsedWithinAClassAndLookupRefreshes) {
    harness h(8, tokens(30));
    auto a = one_block("a", 10, rc::high), b = one_block("b", 10, rc::high), c = one_block("c", 10, rc::high);
    h.must_insert("ws", a, 1);
    h.must_insert("ws", b, 2);
    h.must_insert("ws", c, 3);
    EXPECT_EQ(h.cache.lookup(a, 4).n_blocks, 1u);  // a is now the most recent
    EXPECT_EQ(h.cache.peek(b).n_blocks, 1u);       // peek must not refresh b
    h.must_insert("ws", one_block("d", 10, rc::high), 5);
    EXPECT_EQ(h.cached_blocks(b), 0u);
    EXPECT_EQ(h.cached_blocks(a), 1u);
    EXPECT_EQ(h.cached_blocks(c), 1u);
    h.must_insert("ws", one_block("e", 10, rc::high), 6);
    EXPECT_EQ(h.cached_blocks(c), 0u);
    EXPECT_EQ(h.cached_blocks(a), 1u);
    EXPECT_TRUE(consistent(h));
}

// Semantic, within a class: a block never asked for twice goes before one that was
// reused, or cached again after an eviction (2Q-style probation with a memory of
// evicted blocks), so workspaces seen once cannot push out one that keeps coming back.
// Plain LRU evicts by recency alone.
TEST(PrefixCache, SemanticKeepsReusedBlocksOverBlocksSeenOnce) {
    for (auto policy : {eviction_policy::semantic, k_lru}) {
        harness h(8, tokens(30), policy);
        auto a = one_block("a", 10, rc::high), b = one_block("b", 10, rc::high), c = one_block("c", 10, rc::high);
        h.must_insert("ws", a, 1);
        EXPECT_EQ(h.cache.lookup(a, 2).n_blocks, 1u);  // a is reused once
        h.must_insert("ws", b, 3);
        h.must_insert("ws", c, 4);
        h.must_insert("ws", one_block("d", 10, rc::high), 5);  // a is the least recently used
        const bool sem = policy == eviction_policy::semantic;
        EXPECT_EQ(h.cached_blocks(a), sem ? 1u : 0u);
        EXPECT_EQ(h.cached_blocks(b), sem ? 0u : 1u);
        if (!sem) continue;
        h.must_insert("ws", b, 6);  // b comes back: remembered as evicted, so it counts as asked for twice
        EXPECT_EQ(h.cached_blocks(c), 0u);
        h.must_insert("ws", one_block("e", 10, rc::high), 7);
        h.must_insert("ws", one_block("f", 10, rc::high), 8);
        EXPECT_EQ(h.cached_blocks(a), 1u);
        EXPECT_EQ(h.cached_blocks(b), 1u);
        EXPECT_EQ(h.cached_blocks(one_block("e", 10, rc::high)), 0u);
        EXPECT_TRUE(consistent(h));
    }
}

// Semantic, between stable blocks: how often a block was reused decides before its
// class, so a busy workspace's repository map outlives a rarely used workspace's system
// prompt; a new block that was never reused is not admitted over reused ones until it
// comes back (then it counts one reuse). LRU evicts the least recently used.
TEST(PrefixCache, SemanticKeepsTheMostReusedStableBlocksWhateverTheirClass) {
    for (auto policy : {k_semantic, k_lru}) {
        harness h(8, tokens(30), policy);
        auto a = one_block("a", 10, rc::highest), b = one_block("b", 10, rc::high), c = one_block("c", 10, rc::highest);
        auto d = one_block("d", 10, rc::highest);
        h.must_insert("ws-a", a, 1);
        h.must_insert("ws-b", b, 2);
        h.must_insert("ws-c", c, 3);
        for (uint64_t t : {4, 5, 6}) EXPECT_EQ(h.cache.lookup(b, t).n_blocks, 1u);  // b: 3 reuses
        EXPECT_EQ(h.cache.lookup(a, 7).n_blocks, 1u);                               // a: 1
        for (uint64_t t : {8, 9}) EXPECT_EQ(h.cache.lookup(c, t).n_blocks, 1u);     // c: 2
        const status first = h.insert("ws-d", d, 10);
        if (policy == k_lru) {
            EXPECT_TRUE(first.ok()) << first.to_string();  // b was used least recently
            EXPECT_EQ(h.cached_blocks(b), 0u);
            EXPECT_EQ(h.cached_blocks(d), 1u);
            continue;
        }
        EXPECT_EQ(first.code(), status_code::resource_exhausted) << first.to_string();
        EXPECT_EQ(h.cached_blocks(d), 0u) << "never reused: not admitted over reused blocks";
        auto r = h.cache.last_eviction(d[0].chain);
        ASSERT_TRUE(r.has_value());
        EXPECT_FALSE(r->was_resident);
        h.must_insert("ws-d", d, 11);  // d comes back: one reuse, and more recent than a
        EXPECT_EQ(h.cached_blocks(d), 1u);
        EXPECT_EQ(h.cached_blocks(a), 0u) << "a: highest class but the fewest reuses and the oldest";
        EXPECT_EQ(h.cached_blocks(b), 1u) << "b: a lower class, the most reuses";
        EXPECT_EQ(h.cached_blocks(c), 1u);
        EXPECT_EQ(h.cache.last_eviction(a[0].chain)->hits, 1u);
        EXPECT_TRUE(consistent(h));
    }
}

// Reuse counts age: every 256 lookups they halve, so popularity long past stops
// outranking recency. x, evicted with 10 reuses, comes back and must evict a or b.
TEST(PrefixCache, SemanticReuseCountsHalveEvery256Lookups) {
    for (bool aged : {false, true}) {
        harness h(8, tokens(20));
        auto a = one_block("a", 10, rc::high), b = one_block("b", 10, rc::high), x = one_block("x", 10, rc::high);
        h.must_insert("ws-x", x, 1);
        for (uint64_t t = 2; t < 12; ++t) EXPECT_EQ(h.cache.lookup(x, t).n_blocks, 1u);
        h.cache.drop_workspace("ws-x", 12);
        ASSERT_TRUE(h.cache.last_eviction(x[0].chain).has_value());
        EXPECT_EQ(h.cache.last_eviction(x[0].chain)->hits, 10u);
        h.must_insert("ws", a, 13);
        h.must_insert("ws", b, 14);
        for (uint64_t t : {15, 16, 17}) EXPECT_EQ(h.cache.lookup(a, t).n_blocks, 1u);  // a: 3
        for (uint64_t t : {18, 19}) EXPECT_EQ(h.cache.lookup(b, t).n_blocks, 1u);      // b: 2, more recent
        ASSERT_EQ(h.cache.n_lookups(), 15u);
        if (aged)  // the 256th lookup halves: a 3 -> 1, b 2 -> 1; x's remembered 10 -> 5
            for (int i = 0; i < 241; ++i)
                EXPECT_EQ(h.cache.lookup(one_block("missing", 10, rc::high), 20).n_blocks, 0u);
        h.must_insert("ws-x", x, 21);
        EXPECT_EQ(h.cached_blocks(x), 1u);
        EXPECT_EQ(h.cached_blocks(a), aged ? 0u : 1u) << "aged: a tie on reuse, a is older";
        EXPECT_EQ(h.cached_blocks(b), aged ? 1u : 0u) << "fresh: a's 3 reuses beat b's 2";
        EXPECT_TRUE(consistent(h));
    }
}

// Semantic: when a workspace's request leaves its cached path at a block of class high
// after a common start (an edited repository map or pinned file), the old branch is a
// superseded version: it counts no reuse, so it goes before the new version however
// often it was reused. Another workspace's path does not supersede it.
TEST(PrefixCache, SemanticEvictsASupersededVersionOfAWorkspacesContextFirst) {
    for (bool same_workspace : {true, false}) {
        harness h(8, tokens(50));  // per-holder accounting: v2's holder has its own "sys"
        auto v1 = make_path("t", {{"sys", 10, rc::highest}, {"map", 10, rc::high}});
        auto v2 = make_path("t", {{"sys", 10, rc::highest}, {"map-edited", 10, rc::high}});
        auto other = one_block("o", 10, rc::highest);
        auto p = one_block("p", 10, rc::high);
        h.must_insert("ws", v1, 1);
        for (uint64_t t : {2, 3, 4}) EXPECT_EQ(h.cache.lookup(v1, t).n_blocks, 2u);  // the old map: 3 reuses
        h.must_insert("ws-o", other, 5);
        EXPECT_EQ(h.cache.lookup(other, 6).n_blocks, 1u);
        h.must_insert(same_workspace ? "ws" : "ws-x", v2, 7);  // 50 tokens: full
        h.must_insert("ws-p", p, 8);                            // something must go
        EXPECT_EQ(h.cached_blocks(p), 1u);
        EXPECT_EQ(h.cached_blocks(other), 1u);
        if (same_workspace) {
            EXPECT_EQ(h.cached_blocks(v1), 1u) << "the superseded map goes";
            EXPECT_EQ(h.cached_blocks(v2), 2u);
        } else {
            EXPECT_EQ(h.cached_blocks(v1), 2u) << "not superseded: its 3 reuses keep it";
            EXPECT_EQ(h.cached_blocks(v2), 1u);
        }
        EXPECT_TRUE(consistent(h));
    }
}

TEST(PrefixCache, SuffixIsEvictedBeforePrefix) {
    harness h(8, tokens(30));
    // A low-class block under a highest-class one: only last blocks are candidates,
    // so A must outlive B even though A's class is lower.
    auto ab = make_path("t", {{"A", 10, rc::low}, {"B", 10, rc::highest}});
    auto c = one_block("c", 10, rc::medium);
    h.must_insert("ws", ab, 1);
    h.must_insert("ws", c, 2);
    const seq_id ab_seq = h.cache.peek(ab).holder;

    h.must_insert("ws", one_block("d", 10, rc::highest), 3);  // candidates B(highest) C(medium) D
    EXPECT_EQ(h.cached_blocks(c), 0u);
    EXPECT_EQ(h.cached_blocks(ab), 2u);

    h.kv.ops.clear();
    h.must_insert("ws", one_block("e", 10, rc::highest), 4);  // B (t=1) before D (t=3), never A
    EXPECT_EQ(h.cached_blocks(ab), 1u);
    EXPECT_EQ(h.kv.n_tokens[ab_seq], 10);
    EXPECT_NE(std::find(h.kv.ops.begin(), h.kv.ops.end(), "trim " + std::to_string(ab_seq) + "@10"), h.kv.ops.end());
    EXPECT_FALSE(h.cache.last_eviction(ab[0].chain).has_value());
    ASSERT_TRUE(h.cache.last_eviction(ab[1].chain).has_value());
    EXPECT_EQ(h.cache.last_eviction(ab[1].chain)->retention, rc::highest);

    h.must_insert("ws", one_block("f", 10, rc::highest), 5);  // now A is a last block, and the lowest
    EXPECT_EQ(h.cached_blocks(ab), 0u);
    EXPECT_EQ(h.kv.n_tokens[ab_seq], 0) << "an emptied holder is cleared";
    ASSERT_TRUE(h.cache.last_eviction(ab[0].chain).has_value());
    EXPECT_EQ(h.cache.last_eviction(ab[0].chain)->retention, rc::low);
    EXPECT_TRUE(consistent(h));
}

// ---- pins ----------------------------------------------------------------------

TEST(PrefixCache, PinnedBlocksAreNeverEvicted) {
    for (auto policy : {k_semantic, k_lru}) {
        harness h(8, tokens(30), policy);
        auto pinned = make_path("p", {{"S", 10, rc::high}, {"L", 10, rc::low}});
        h.cache.pin(pinned);
        h.must_insert("ws", pinned, 1);
        for (int i = 0; i < 5; ++i) {
            h.must_insert("ws", one_block("x" + std::to_string(i), 10, rc::highest), 2 + i);
            ASSERT_TRUE(consistent(h));
            EXPECT_EQ(h.cached_blocks(pinned), 2u) << eviction_policy_name(policy) << " insert " << i;
        }
        // Unpinned, its low last block goes first under semantic, and (oldest) under lru.
        h.cache.unpin(pinned);
        h.must_insert("ws", one_block("y", 10, rc::highest), 20);
        EXPECT_EQ(h.cached_blocks(pinned), 1u) << eviction_policy_name(policy);
        EXPECT_TRUE(consistent(h));
    }
}

TEST(PrefixCache, PinsAreCounted) {
    harness h(8, tokens(20));
    auto p = one_block("p", 10, rc::low);
    h.cache.pin(p);
    h.cache.pin(p);
    h.must_insert("ws", p, 1);
    h.cache.unpin(p);
    EXPECT_TRUE(h.cache.is_pinned(p[0].chain));
    EXPECT_EQ(h.cache.counters().n_pinned_blocks, 1u);
    h.must_insert("ws", one_block("q", 10, rc::highest), 2);
    h.must_insert("ws", one_block("r", 10, rc::highest), 3);  // must evict q, not the pinned p
    EXPECT_EQ(h.cached_blocks(p), 1u);
    h.cache.unpin(p);
    h.cache.unpin(p);  // extra unpin: no-op
    EXPECT_FALSE(h.cache.is_pinned(p[0].chain));
    h.must_insert("ws", one_block("s", 10, rc::highest), 4);
    EXPECT_EQ(h.cached_blocks(p), 0u);
    EXPECT_TRUE(consistent(h));
}

TEST(PrefixCache, PinnedInsertIsCutWhenNothingElseIsEvictable) {
    harness h(8, tokens(30));
    auto base = make_path("base", {{"a", 10, rc::highest}, {"b", 10, rc::highest}});
    auto q = one_block("q", 5, rc::low);
    auto v = make_path("v", {{"v1", 5, rc::highest}, {"v2", 10, rc::highest}});
    h.cache.pin(base);
    h.cache.pin(v);
    h.must_insert("ws", base, 1);
    h.must_insert("ws", q, 2);
    // 20 (pinned) + 5 (q) + 15 (v) = 40 > 30. Evicting q is not enough; v2 must be cut,
    // pinned or not. After that cut, v1 fits WITH q, so q must not have been evicted.
    insert_outcome out;
    ASSERT_TRUE(h.insert("ws", v, 3, &out).ok());
    EXPECT_EQ(out.n_blocks_cached, 1u);
    EXPECT_EQ(out.n_tokens_cached, 5);
    EXPECT_EQ(out.n_blocks_not_admitted, 1u);
    EXPECT_EQ(out.n_blocks_evicted, 0u);
    EXPECT_EQ(h.cached_blocks(q), 1u) << "q was evicted for nothing";
    EXPECT_EQ(h.kv.n_tokens[out.holder], 5);
    auto r = h.cache.last_eviction(v[1].chain);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->reason, "not admitted: global token budget");
    EXPECT_FALSE(r->was_resident);
    EXPECT_EQ(h.cache.counters().n_not_admitted_tokens, 10u);
    EXPECT_EQ(h.cache.counters().n_forced_cuts, 1u);
    EXPECT_TRUE(consistent(h));
}

// ---- budgets ---------------------------------------------------------------------

TEST(PrefixCache, InsertIsCutToFitAndRejectedWhenNothingFits) {
    harness h(8, tokens(25));
    auto p = make_path("t", {{"a", 10, rc::highest}, {"b", 10, rc::highest}, {"c", 10, rc::highest}});
    insert_outcome out;
    ASSERT_TRUE(h.insert("ws", p, 1, &out).ok());
    EXPECT_EQ(out.n_blocks_cached, 2u);
    EXPECT_EQ(out.n_tokens_cached, 20);
    EXPECT_EQ(out.n_blocks_not_admitted, 1u);
    EXPECT_EQ(h.cached_blocks(p), 2u);
    EXPECT_EQ(h.kv.n_tokens[out.holder], 20);
    auto r = h.cache.last_eviction(p[2].chain);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->reason, "not admitted: global token budget");
    EXPECT_TRUE(consistent(h));

    // A single block larger than the whole budget: nothing fits, and nothing resident
    // may be evicted for it.
    h.kv.ops.clear();
    status st = h.insert("ws", one_block("huge", 30, rc::highest), 2, &out);
    EXPECT_EQ(st.code(), status_code::resource_exhausted) << st.to_string();
    EXPECT_EQ(out.n_blocks_cached, 0u);
    EXPECT_TRUE(h.kv.ops.empty()) << h.kv.ops.front();
    EXPECT_EQ(h.cached_blocks(p), 2u);
    EXPECT_EQ(h.cache.counters().n_inserts_rejected, 1u);
    EXPECT_TRUE(consistent(h));
}

TEST(PrefixCache, ByteBudgetBindsThroughBytesPerToken) {
    cache_budget b;
    b.max_bytes = 100;
    b.bytes_per_token = 4;  // 25 tokens
    ASSERT_TRUE(validate_budget(b).ok());
    harness h(8, b);
    auto p = make_path("t", {{"a", 10, rc::high}, {"b", 10, rc::high}, {"c", 10, rc::high}});
    h.must_insert("ws", p, 1);
    EXPECT_EQ(h.cached_blocks(p), 2u);
    EXPECT_EQ(h.cache.counters().resident_bytes, 80u);
    EXPECT_EQ(h.cache.last_eviction(p[2].chain)->reason, "not admitted: global byte budget");
    EXPECT_TRUE(consistent(h));

    cache_budget bad;
    bad.max_bytes = 100;
    EXPECT_EQ(validate_budget(bad).code(), status_code::invalid_argument);
}

TEST(PrefixCache, WorkspaceBudgetEvictsOnlyThatWorkspace) {
    cache_budget b;
    b.workspace_max_tokens = 100;
    b.workspace_max_tokens_override["a"] = 20;
    harness h(8, b);
    auto other = one_block("other", 10, rc::low);  // oldest and lowest: first pick globally
    h.must_insert("b", other, 1);
    auto a1 = one_block("a1", 10, rc::highest), a2 = one_block("a2", 10, rc::highest);
    h.must_insert("a", a1, 2);
    h.must_insert("a", a2, 3);
    insert_outcome out;
    ASSERT_TRUE(h.insert("a", one_block("a3", 10, rc::highest), 4, &out).ok());
    EXPECT_EQ(out.n_blocks_evicted, 1u);
    EXPECT_EQ(out.n_blocks_cached, 1u);
    EXPECT_EQ(h.cached_blocks(other), 1u) << "another workspace paid for a's budget";
    EXPECT_EQ(h.cached_blocks(a1), 0u);
    EXPECT_EQ(h.cached_blocks(a2), 1u);
    auto r = h.cache.last_eviction(a1[0].chain);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->reason, "workspace budget");
    EXPECT_EQ(r->workspace, "a");
    auto c = h.cache.counters();
    EXPECT_EQ(c.workspaces["a"].tokens, 20u);
    EXPECT_EQ(c.workspaces["b"].tokens, 10u);
    EXPECT_EQ(h.cache.workspace_max_tokens("zzz"), 100u);
    EXPECT_TRUE(consistent(h));
}

TEST(PrefixCache, SharedAccountingCountsSharedBlocksOnce) {
    auto x = make_path("t", {{"s", 10, rc::highest}, {"t", 10, rc::high}, {"x", 5, rc::low}});
    auto y = make_path("t", {{"s", 10, rc::highest}, {"t", 10, rc::high}, {"y", 5, rc::low}});
    {
        harness h(8, tokens(30), k_semantic, k_shared);
        h.must_insert("ws", x, 1);
        h.must_insert("ws", y, 2);
        EXPECT_EQ(h.cache.counters().resident_tokens, 30u);
        EXPECT_EQ(h.cached_blocks(x), 3u);
        EXPECT_EQ(h.cached_blocks(y), 3u);
        EXPECT_TRUE(consistent(h));
    }
    {
        harness h(8, tokens(30), k_semantic, k_per_holder);  // each holder its own copy
        h.must_insert("ws", x, 1);
        h.must_insert("ws", y, 2);
        EXPECT_LE(h.cache.counters().resident_tokens, 30u);
        EXPECT_EQ(h.cached_blocks(x) + h.cached_blocks(y), 5u);  // one of them lost its tail
        EXPECT_TRUE(consistent(h));
    }
}

// ---- matching --------------------------------------------------------------------

TEST(PrefixCache, TenantsNeverMatchEachOther) {
    harness h(8, {});
    std::vector<spec> same = {{"system", 10, rc::highest}, {"tools", 10, rc::highest}};
    auto a = make_path("tenant-a", same), b = make_path("tenant-b", same);
    h.must_insert("ws", a, 1);
    EXPECT_EQ(h.cache.peek(a).n_blocks, 2u);
    EXPECT_EQ(h.cache.peek(b).n_blocks, 0u);
    EXPECT_EQ(h.cache.peek(b).holder, -1);
    h.must_insert("ws", b, 2);
    EXPECT_EQ(h.cache.holders().size(), 2u) << "different roots must not share a holder";
}

TEST(PrefixCache, LongestMatchAcrossWorkspaces) {
    harness h(8, {});
    auto pa = make_path("t", {{"s", 10, rc::highest}, {"t", 10, rc::high}, {"x", 5, rc::low}});
    auto pb = make_path("t", {{"s", 10, rc::highest}, {"t", 10, rc::high}, {"c", 5, rc::medium}, {"d", 5, rc::low}});
    h.must_insert("a", pa, 1);
    h.must_insert("b", pb, 2);
    const seq_id seq_a = h.cache.peek(pa).holder, seq_b = h.cache.peek(pb).holder;
    ASSERT_NE(seq_a, seq_b);

    auto q1 = make_path("t", {{"s", 10, rc::highest}, {"t", 10, rc::high}, {"c", 5, rc::medium}, {"e", 3, rc::none}});
    match m = h.cache.lookup(q1, 3);
    EXPECT_EQ(m.n_blocks, 3u);
    EXPECT_EQ(m.n_tokens, 25);
    EXPECT_EQ(m.holder, seq_b);
    EXPECT_EQ(m.workspace, "b");

    auto q2 = make_path("t", {{"s", 10, rc::highest}, {"t", 10, rc::high}, {"x", 5, rc::low}, {"y", 9, rc::low}});
    m = h.cache.lookup(q2, 4);
    EXPECT_EQ(m.n_blocks, 3u);
    EXPECT_EQ(m.holder, seq_a);
    EXPECT_EQ(m.workspace, "a");

    // Both hold [s, t]: the preferred workspace wins, else the most recently used.
    auto q3 = make_path("t", {{"s", 10, rc::highest}, {"t", 10, rc::high}, {"z", 4, rc::low}});
    EXPECT_EQ(h.cache.peek(q3, "a").holder, seq_a);
    EXPECT_EQ(h.cache.peek(q3, "b").holder, seq_b);
    EXPECT_EQ(h.cache.peek(q3).holder, seq_a);  // a was used at t=4
    EXPECT_EQ(h.cache.peek(q3).n_tokens, 20);   // snapped to a block end

    auto c = h.cache.counters();
    EXPECT_EQ(c.n_lookups, 2u);
    EXPECT_EQ(c.n_lookup_hits, 2u);
    EXPECT_EQ(c.n_hit_tokens, 50u);
}

TEST(PrefixCache, MalformedPathMatchesOnlyItsWellFormedPrefix) {
    harness h(8, {});
    auto p = make_path("t", {{"s", 10, rc::highest}, {"t", 10, rc::high}});
    h.must_insert("ws", p, 1);
    auto shifted = p;
    shifted[1].begin = 11;  // the right chain at the wrong place is not a hit
    shifted[1].end = 21;
    EXPECT_EQ(h.cache.peek(shifted).n_blocks, 1u);
    auto skipped = std::vector<block>{p[1]};  // block 1 without block 0
    EXPECT_EQ(h.cache.peek(skipped).n_blocks, 0u);
    EXPECT_EQ(h.insert("ws", shifted, 2).code(), status_code::invalid_argument);
    EXPECT_TRUE(consistent(h));
}

// ---- holders -----------------------------------------------------------------------

TEST(PrefixCache, RedundantPrefixHolderIsDropped) {
    harness h(8, {});
    auto ab = make_path("t", {{"a", 10, rc::highest}, {"b", 10, rc::high}});
    auto abc = make_path("t", {{"a", 10, rc::highest}, {"b", 10, rc::high}, {"c", 10, rc::low}});
    h.must_insert("ws", ab, 1);
    const seq_id first = h.cache.peek(ab).holder;
    h.must_insert("ws", abc, 2);
    auto hs = h.cache.holders();
    ASSERT_EQ(hs.size(), 1u);
    EXPECT_EQ(hs[0].n_tokens, 30);
    EXPECT_EQ(hs[0].seq, first) << "the redundant holder's slot is reused";
    EXPECT_EQ(h.cache.counters().resident_tokens, 30u);
    EXPECT_EQ(h.cache.counters().n_redundant_holders_dropped, 1u);
    EXPECT_TRUE(consistent(h));
}

TEST(PrefixCache, HolderLeftAsAPrefixOfAnotherAfterEvictionIsDropped) {
    harness h(8, tokens(55));
    auto stx = make_path("t", {{"s", 10, rc::highest}, {"t", 10, rc::high}, {"x", 5, rc::low}});
    auto stc = make_path("t", {{"s", 10, rc::highest}, {"t", 10, rc::high}, {"c", 5, rc::medium}});
    h.must_insert("ws", stx, 1);
    h.must_insert("ws", stc, 2);  // 25 + 25 = 50 tokens in two holders
    const seq_id seq_x = h.cache.peek(stx).holder;
    h.must_insert("ws", one_block("n", 10, rc::highest), 3);  // 60 > 55: evict x (low)
    // Without x, stx's holder holds [s, t], a prefix of stc's holder: dropped entirely.
    EXPECT_EQ(h.cached_blocks(stx), 2u);
    EXPECT_EQ(h.cache.peek(stx).holder, h.cache.peek(stc).holder);
    EXPECT_EQ(h.kv.n_tokens[seq_x], 0) << "the redundant holder's sequence was not cleared";
    EXPECT_EQ(h.cache.counters().n_holders_in_use, 2u);
    EXPECT_EQ(h.cache.counters().resident_tokens, 35u);
    EXPECT_TRUE(consistent(h));
}

TEST(PrefixCache, NoFreeHolderEvictsAWholeHolderChosenByPolicy) {
    for (auto policy : {k_semantic, k_lru}) {
        harness h(2, {}, policy);
        auto a = make_path("a", {{"a1", 10, rc::highest}, {"a2", 10, rc::highest}});
        auto b = one_block("b", 10, rc::low);
        h.must_insert("ws", a, 1);
        h.must_insert("ws", b, 2);
        const seq_id seq_a = h.cache.peek(a).holder, seq_b = h.cache.peek(b).holder;
        insert_outcome out;
        ASSERT_TRUE(h.insert("ws2", one_block("c", 10, rc::highest), 3, &out).ok());
        if (policy == k_semantic) {  // lowest class: b, though a is older
            EXPECT_EQ(h.cached_blocks(b), 0u);
            EXPECT_EQ(h.cached_blocks(a), 2u);
            EXPECT_EQ(out.holder, seq_b);
            EXPECT_EQ(h.cache.last_eviction(b[0].chain)->reason, "no free holder");
        } else {  // oldest: a, both blocks
            EXPECT_EQ(h.cached_blocks(a), 0u);
            EXPECT_EQ(h.cached_blocks(b), 1u);
            EXPECT_EQ(out.holder, seq_a);
            for (const block & bl : a) {
                auto r = h.cache.last_eviction(bl.chain);
                ASSERT_TRUE(r.has_value());
                EXPECT_EQ(r->reason, "no free holder");
                EXPECT_EQ(r->workspace, "ws");
                EXPECT_EQ(r->at, 3u);
            }
        }
        EXPECT_EQ(h.cache.counters().n_whole_holder_evictions, 1u);
        EXPECT_TRUE(consistent(h));
    }
}

TEST(PrefixCache, NoFreeHolderAndEverythingPinnedIsExhausted) {
    harness h(1, {});
    auto a = one_block("a", 10, rc::low);
    h.cache.pin(a);
    h.must_insert("ws", a, 1);
    h.kv.ops.clear();
    EXPECT_EQ(h.insert("ws", one_block("b", 10, rc::highest), 2).code(), status_code::resource_exhausted);
    EXPECT_TRUE(h.kv.ops.empty());
    EXPECT_EQ(h.cached_blocks(a), 1u);
    EXPECT_TRUE(consistent(h));
}

TEST(PrefixCache, NoneBlocksAreNeverCached) {
    harness h(8, {});
    auto p = make_path("t", {{"sys", 10, rc::highest}, {"user", 6, rc::none}});
    insert_outcome out;
    ASSERT_TRUE(h.insert("ws", p, 1, &out).ok());
    EXPECT_EQ(out.n_tokens_cached, 10);
    EXPECT_EQ(h.cache.peek(p).n_blocks, 1u);
    EXPECT_EQ(h.kv.n_tokens[out.holder], 10) << "src held 23 tokens: the copy must be trimmed at 10";
    // Nothing after a none block can be cached either.
    auto q = make_path("u", {{"user", 6, rc::none}, {"later", 10, rc::high}});
    ASSERT_TRUE(h.insert("ws", q, 2).ok());
    EXPECT_EQ(h.cache.peek(q).n_blocks, 0u);
    EXPECT_EQ(h.cache.holders().size(), 1u);
    EXPECT_TRUE(consistent(h));
}

TEST(PrefixCache, InsertingAResidentPathOnlyTouchesIt) {
    harness h(8, tokens(20));
    auto a = one_block("a", 10, rc::high), b = one_block("b", 10, rc::high);
    h.must_insert("ws", a, 1);
    h.must_insert("ws", b, 2);
    h.kv.ops.clear();
    insert_outcome out;
    ASSERT_TRUE(h.insert("ws", a, 3, &out).ok());
    EXPECT_TRUE(out.already_cached);
    EXPECT_TRUE(h.kv.ops.empty());
    h.must_insert("ws", one_block("c", 10, rc::high), 4);  // the touch made b the older one
    EXPECT_EQ(h.cached_blocks(a), 1u);
    EXPECT_EQ(h.cached_blocks(b), 0u);
}

// ---- errors and the engine seam -----------------------------------------------------

TEST(PrefixCache, BadInputIsAnError) {
    harness h(2, {});
    auto gap = make_path("t", {{"a", 10, rc::high}, {"b", 10, rc::high}});
    gap[1].begin = 12;
    EXPECT_EQ(h.insert("ws", gap, 1).code(), status_code::invalid_argument);
    auto empty_block = make_path("t", {{"a", 0, rc::high}});
    EXPECT_EQ(h.insert("ws", empty_block, 1).code(), status_code::invalid_argument);
    EXPECT_EQ(h.cache.insert("ws", one_block("a", 5, rc::high), /*src=*/0, 1).code(), status_code::invalid_argument)
        << "a holder seq is not a valid source";
    EXPECT_EQ(h.cache.insert("ws", one_block("a", 5, rc::high), /*src=*/77, 1).code(), status_code::not_found)
        << "the engine's error comes back";
    EXPECT_TRUE(h.cache.holders().empty());
    EXPECT_TRUE(consistent(h));
}

TEST(PrefixCache, EngineFailuresLeaveAConsistentCache) {
    harness h(8, tokens(30));
    auto x = make_path("x", {{"x1", 10, rc::highest}, {"x2", 5, rc::low}});
    h.must_insert("ws", x, 1);
    const seq_id seq_x = h.cache.peek(x).holder;

    // The copy into the new holder fails: error back, the half-copied holder is cleared
    // and free, nothing else changed.
    h.kv.fail_copies = 1;
    EXPECT_EQ(h.insert("ws", one_block("b", 10, rc::high), 2).code(), status_code::engine_error);
    EXPECT_EQ(h.cached_blocks(x), 2u);
    EXPECT_EQ(h.cache.holders().size(), 1u);
    EXPECT_EQ(h.cache.counters().n_engine_errors, 1u);
    EXPECT_TRUE(consistent(h));

    // A trim that evicts from another holder fails: that holder is cleared and dropped
    // instead (it must not keep tokens the cache no longer counts), the insert succeeds.
    h.must_insert("ws", one_block("c", 10, rc::highest), 3);  // 25 tokens
    h.kv.fail_trims_on.insert(seq_x);
    insert_outcome out;
    ASSERT_TRUE(h.insert("ws", one_block("d", 10, rc::highest), 4, &out).ok());  // 35 > 30: evict x2
    h.kv.fail_trims_on.clear();
    EXPECT_EQ(h.cached_blocks(x), 0u);
    EXPECT_EQ(h.kv.n_tokens[seq_x], 0);
    EXPECT_EQ(h.cache.last_eviction(x[0].chain)->reason, "engine error");
    EXPECT_EQ(h.cache.last_eviction(x[1].chain)->reason, "global token budget");
    EXPECT_EQ(h.cache.counters().n_engine_errors, 2u);
    EXPECT_TRUE(consistent(h));
}

// ---- records --------------------------------------------------------------------

TEST(PrefixCache, EvictionRecordsAreBounded) {
    harness h(4, tokens(10));
    std::vector<std::vector<block>> paths;
    const size_t n = prefix_cache::k_max_eviction_records + 100;
    for (size_t i = 0; i <= n; ++i) {
        paths.push_back(one_block("p" + std::to_string(i), 10, rc::medium));
        h.must_insert("ws", paths.back(), i + 1);
    }
    // paths[i] was evicted by insert i+1 (at i+2); records exist for the newest 4096.
    EXPECT_FALSE(h.cache.last_eviction(paths[0][0].chain).has_value());
    auto r = h.cache.last_eviction(paths[n - 1][0].chain);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->at, n + 1);
    EXPECT_EQ(r->retention, rc::medium);
    EXPECT_EQ(r->begin, 0);
    EXPECT_EQ(r->end, 10);
    EXPECT_TRUE(h.cache.last_eviction(paths[n - prefix_cache::k_max_eviction_records][0].chain).has_value());
    EXPECT_FALSE(h.cache.last_eviction(paths[n - prefix_cache::k_max_eviction_records - 1][0].chain).has_value());
    EXPECT_EQ(h.cache.counters().evictions_by_class[(int)rc::medium], n);
}

TEST(PrefixCache, DropWorkspaceAndClearFreeHolders) {
    harness h(8, {});
    auto shared_prefix = make_path("t", {{"s", 10, rc::highest}, {"x", 5, rc::low}});
    auto other = make_path("t", {{"s", 10, rc::highest}, {"y", 5, rc::low}});
    h.cache.pin(shared_prefix);
    h.must_insert("a", shared_prefix, 1);
    h.must_insert("b", other, 2);
    h.cache.drop_workspace("a", 3);
    EXPECT_EQ(h.cached_blocks(shared_prefix), 1u) << "s is still held by b";
    EXPECT_EQ(h.cache.last_eviction(shared_prefix[1].chain)->reason, "workspace dropped");
    EXPECT_FALSE(h.cache.last_eviction(shared_prefix[0].chain).has_value());
    EXPECT_EQ(h.cache.counters().workspaces.count("a"), 0u);
    EXPECT_EQ(h.cache.counters().evictions_by_class[(int)rc::low], 0u) << "a drop is not an eviction";
    EXPECT_TRUE(consistent(h));
    h.cache.clear();
    EXPECT_EQ(h.cache.counters().resident_tokens, 0u);
    EXPECT_EQ(h.cache.n_free_holders(), 8u);
    EXPECT_TRUE(h.cache.is_pinned(shared_prefix[0].chain)) << "clear keeps pins";
    EXPECT_TRUE(consistent(h));
}

TEST(PrefixCache, PolicyAndAccountingNames) {
    EXPECT_EQ(*parse_eviction_policy("lru"), k_lru);
    EXPECT_EQ(*parse_eviction_policy(eviction_policy_name(k_semantic)), k_semantic);
    EXPECT_EQ(parse_eviction_policy("fifo").error().code(), status_code::invalid_argument);
    EXPECT_EQ(*parse_kv_accounting("shared_cells"), k_shared);
    EXPECT_EQ(*parse_kv_accounting(kv_accounting_name(k_per_holder)), k_per_holder);
    EXPECT_FALSE(parse_kv_accounting("exact").ok());
}

// ---- the randomized sweep -------------------------------------------------------

// Prompts shaped like the segment table: system, tools, repo map, history, diff, user.
// A block's length is a function of its chain, as real blocks are of their content.
struct prompt_maker {
    std::mt19937 & rng;
    int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); }

    std::vector<block> make(const std::string & tenant) {
        std::vector<std::pair<std::string, rc>> labels = {{"system", rc::highest},
                                                          {"tools" + std::to_string(pick(2)), rc::highest},
                                                          {"map" + std::to_string(pick(3)), rc::high}};
        for (int i = 0, n = pick(4); i < n; ++i) labels.push_back({"hist" + std::to_string(pick(2)), rc::low});
        if (pick(2)) labels.push_back({"diff" + std::to_string(pick(4)), rc::medium});
        if (pick(5)) labels.push_back({"user" + std::to_string(pick(1000)), rc::none});
        std::vector<block> out;
        hash128 prev = hash_string(tenant);
        pos_t pos = 0;
        for (auto & [label, retention] : labels) {
            hash128 c = hash_combine(prev, label.data(), label.size());
            pos_t n = 1 + (pos_t)(c.lo % 12);
            out.push_back({c, pos, pos + n, retention});
            pos += n;
            prev = c;
        }
        return out;
    }
};

// The longest common prefix of `path` with any holder, by brute force.
size_t brute_force_match(const std::vector<holder_info> & hs, const std::vector<block> & path) {
    size_t best = 0;
    for (const auto & hi : hs) {
        size_t k = 0;
        while (k < hi.blocks.size() && k < path.size() && hi.blocks[k].chain == path[k].chain &&
               hi.blocks[k].begin == path[k].begin && hi.blocks[k].end == path[k].end)
            ++k;
        best = std::max(best, k);
    }
    return best;
}

class PrefixCacheSweep : public ::testing::TestWithParam<std::tuple<eviction_policy, kv_accounting, bool>> {};

TEST_P(PrefixCacheSweep, BudgetsHoldAndEngineAgreesAfterEveryCall) {
    const auto [policy, accounting, carrying] = GetParam();
    cache_budget b;
    b.max_tokens = 120;
    b.bytes_per_token = 3;
    b.max_bytes = 330;  // 110 tokens: the byte cap binds before the token cap
    b.workspace_max_tokens = 70;
    b.workspace_max_tokens_override["ws3"] = 35;
    harness h(5, b, policy, accounting);
    if (carrying) {  // each holder holds 40 bytes more than its tokens show
        h.kv.held_per_token = b.bytes_per_token;
        h.kv.held_per_holder = 40;
    }
    std::mt19937 rng(12345);
    prompt_maker pm{rng};
    const std::string ws_names[] = {"ws0", "ws1", "ws2", "ws3"};
    const std::string tenant_of[] = {"tenant-0", "tenant-0", "tenant-1", "tenant-1"};
    std::vector<std::vector<block>> pins;
    size_t n_ok = 0, n_exhausted = 0, n_engine_errors = 0, n_hits = 0;

    for (uint64_t step = 1; step <= 1200; ++step) {
        const int w = pm.pick(4);
        const int op = pm.pick(100);
        auto insert = [&](const std::vector<block> & path) {
            // Now and then the engine fails: the copy, the new holder's trim, or a trim
            // of some holder (which may be an eviction's).
            switch (pm.pick(60)) {
                case 0: h.kv.fail_copies = 1; break;
                case 1: h.kv.fail_trims = 1; break;
                case 2: case 3: h.kv.fail_trims_on.insert(pm.pick(5)); break;
                default: break;
            }
            status st = h.insert(ws_names[w], path, step);
            h.kv.fail_copies = h.kv.fail_trims = 0;
            h.kv.fail_trims_on.clear();
            if (st.ok()) ++n_ok;
            else if (st.code() == status_code::resource_exhausted) ++n_exhausted;
            else if (st.code() == status_code::engine_error) ++n_engine_errors;
            else ADD_FAILURE() << "step " << step << ": " << st.to_string();
        };
        if (op < 60) {
            insert(pm.make(tenant_of[w]));
        } else if (op < 88) {
            auto path = pm.make(tenant_of[w]);
            auto expect = brute_force_match(h.cache.holders(), path);
            match m = h.cache.lookup(path, step, ws_names[w]);
            ASSERT_EQ(m.n_blocks, expect) << "step " << step;
            if (expect > 0) {
                ++n_hits;
                ASSERT_EQ(m.n_tokens, path[expect - 1].end);
                auto hs = h.cache.holders();
                auto it = std::find_if(hs.begin(), hs.end(), [&](auto & hi) { return hi.seq == m.holder; });
                ASSERT_NE(it, hs.end());
                ASSERT_EQ(it->workspace, m.workspace);
                ASSERT_GE(it->blocks.size(), expect);
                ASSERT_EQ(it->blocks[expect - 1].chain, path[expect - 1].chain);
                ASSERT_GE(h.kv.n_tokens[m.holder], m.n_tokens);
            }
        } else if (op < 93) {
            if (pins.size() < 3) {
                // Pin a stable prefix, or a whole prompt, and send it: pinned paths that
                // cannot all fit exercise the forced cut.
                auto p = pm.make(tenant_of[w]);
                if (pm.pick(2)) p.resize(std::min<size_t>(p.size(), 3));
                h.cache.pin(p);
                pins.push_back(p);
                insert(p);
            }
        } else if (op < 98) {
            if (!pins.empty()) {
                h.cache.unpin(pins.front());
                pins.erase(pins.begin());
            }
        } else {
            h.cache.drop_workspace(ws_names[w], step);
        }
        ASSERT_TRUE(consistent(h)) << "step " << step;
    }
    // The sweep must actually exercise the interesting paths.
    auto c = h.cache.counters();
    uint64_t n_evictions = 0;
    for (auto e : c.evictions_by_class) n_evictions += e;
    EXPECT_GT(n_ok, 100u);
    EXPECT_GT(n_hits, 50u);
    EXPECT_GT(n_evictions, 50u);
    EXPECT_GT(n_engine_errors, 0u);
    EXPECT_GT(c.n_redundant_holders_dropped, 0u);
    EXPECT_GT(c.n_whole_holder_evictions + c.n_not_admitted_tokens, 0u);
    EXPECT_EQ(c.evictions_by_class[(int)rc::none], 0u);
    RecordProperty("inserts_ok", (int)n_ok);
    RecordProperty("inserts_exhausted", (int)n_exhausted);
    RecordProperty("engine_errors", (int)n_engine_errors);
    RecordProperty("lookup_hits", (int)n_hits);
    RecordProperty("evictions", (int)n_evictions);
    RecordProperty("whole_holder_evictions", (int)c.n_whole_holder_evictions);
    RecordProperty("redundant_dropped", (int)c.n_redundant_holders_dropped);
    RecordProperty("not_admitted_tokens", (int)c.n_not_admitted_tokens);
    RecordProperty("forced_cuts", (int)c.n_forced_cuts);
}

INSTANTIATE_TEST_SUITE_P(AllModes, PrefixCacheSweep,
                         ::testing::Combine(::testing::Values(k_semantic, k_lru),
                                            ::testing::Values(k_per_holder, k_shared), ::testing::Bool()),
                         [](const auto & info) {
                             return std::string(eviction_policy_name(std::get<0>(info.param))) + "_" +
                                    std::string(kv_accounting_name(std::get<1>(info.param))) +
                                    (std::get<2>(info.param) ? "_carrying" : "");
                         });

// A holder that holds more than its tokens show (a hybrid's prefix: its recurrent state at
// its end and at its checkpoints) is charged what it holds: the byte budget admits fewer
// prefixes, evicting by the policy after the insert, its last blocks first.
TEST(PrefixCache, WhatAHolderHoldsBeyondItsTokensCountsAgainstTheByteBudget) {
    cache_budget b;
    b.bytes_per_token = 1;
    b.max_bytes = 1000;
    harness h(6, b);
    h.kv.held_per_token = 1;
    h.kv.held_per_holder = 150;  // each prefix: 300 tokens, 450 bytes
    auto path = [](const std::string & t) {
        return make_path(t, {{"sys", 100, rc::highest}, {"map", 100, rc::high}, {"log", 100, rc::low}});
    };
    h.must_insert("a", path("a"), 1);
    h.must_insert("b", path("b"), 2);
    EXPECT_EQ(h.cache.counters().resident_bytes, 900u);
    insert_outcome out;
    ASSERT_TRUE(h.insert("c", path("c"), 3, &out).ok());
    EXPECT_TRUE(consistent(h));
    const auto c = h.cache.counters();
    EXPECT_LE(c.resident_bytes, b.max_bytes);
    uint64_t held = 0;
    for (const holder_info & hi : h.cache.holders()) held += h.kv.held_bytes(hi.seq);
    EXPECT_EQ(c.resident_bytes, held);  // 900 tokens alone would have fitted
    // 1,350 bytes held: the three volatile logs went first (semantic; each trim leaves the
    // fixed part: 1,050), then the least recently used repository map, a's (950).
    EXPECT_EQ(c.resident_bytes, 950u);
    EXPECT_EQ(out.n_blocks_evicted, 4u);
    auto r = h.cache.last_eviction(path("a")[2].chain);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->reason, "global byte budget");
    EXPECT_EQ(h.cache.peek(path("a")).n_blocks, 1u);
    EXPECT_EQ(h.cache.peek(path("b")).n_blocks, 2u);
    EXPECT_EQ(h.cache.peek(path("c")).n_blocks, 2u);
    EXPECT_EQ(out.n_blocks_cached, 2u);
    EXPECT_EQ(out.n_tokens_cached, 200);
}

}  // namespace
}  // namespace warmctx
