// The crash loop: a child process computes a real KV on the tiny model and writes
// snapshots of it in a loop through the real file system; the parent SIGKILLs it at seeded
// random moments, again and again, then opens the store and checks that every file that
// loads is whole and that a restored prefix plus a tail gives logits bit-identical to a
// cold run of the same tokens.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "warmctx/engine.h"
#include "store/snapshot_store.h"

namespace warmctx {
namespace {

constexpr int k_kills = 30;
constexpr double k_max_kill_phase_s = 45;  // the loop stops killing early rather than run long
constexpr uint32_t k_seed = 20240611;
constexpr int32_t k_chunk = 64;
constexpr pos_t k_prefix = 320;
// Segment starts inside the prefix; every snapshot ends at one of k_cuts (block ends).
const std::vector<pos_t> k_segment_starts = {96, 200};
const std::vector<pos_t> k_cuts = {96, 200, 320};
const std::string k_dir = std::string(WARMCTX_TEST_TMP) + "/crash-loop-snapshots";

engine_options tiny_options() {
    engine_options o;
    o.model_path = WARMCTX_TINY_MODEL;
    o.n_ctx = 1024;
    o.n_seq_max = 2;
    o.chunk_tokens = k_chunk;
    o.n_threads = 1;
    return o;
}

std::vector<token_id> seeded_tokens(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<token_id> v(n);
    for (auto & t : v) t = (token_id)(rng() % 150000);  // inside the real Qwen2 vocabulary
    return v;
}

// Boundaries of a prompt that is the prefix cut at P plus a tail: the segment starts
// before P, and P itself (the tail is a segment of its own).
std::vector<pos_t> boundaries_for(pos_t P) {
    std::vector<pos_t> b;
    for (pos_t s : k_segment_starts)
        if (s < P) b.push_back(s);
    b.push_back(P);
    return b;
}

// What the child and the parent agree on without talking: the tokens, the blocks and
// their chain hashes, the profile, the manifest.
struct plan {
    std::vector<token_id> prefix = seeded_tokens(k_prefix, k_seed);
    std::vector<token_id> tail = seeded_tokens(70, k_seed + 1);
    profile prof;
    manifest prompt_manifest;
    std::vector<block> blocks;  // of the whole prefix

    plan() {
        auto digest = file_digest(WARMCTX_TINY_MODEL);
        prof.model_digest = digest.ok() ? digest->hex() : "unknown";
        prof.tokenizer_digest = "qwen2";
        prof.chat_template_digest = "none";
        prof.llama_commit = std::string(llama_commit());
        prof.backend = std::string(backend_name());
        prof.chunk_tokens = k_chunk;
        std::vector<pos_t> starts = {0, 96, 200, k_prefix};
        const retention_class classes[] = {retention_class::highest, retention_class::high, retention_class::low};
        for (int s = 0; s < 3; ++s) {
            manifest_entry e;
            e.id = "seg" + std::to_string(s);
            e.kind = segment_kind::repo_map;
            e.role = "system";
            e.retention = classes[s];
            e.how_stable = stability::stable;
            e.token_begin = starts[s];
            e.token_end = starts[s + 1];
            e.token_hash =
                hash_tokens(std::span(prefix).subspan((size_t)starts[s], (size_t)(starts[s + 1] - starts[s])));
            prompt_manifest.segments.push_back(e);
        }
        prompt_manifest.n_tokens = k_prefix;
        prompt_manifest.profile_fingerprint = prof.fingerprint();
        hash128 h = root_hash(prof, "crash-loop");
        for (auto [b, e] : plan_chunks(0, k_prefix, k_segment_starts, k_chunk)) {
            h = chain_hash(h, std::span(prefix).subspan((size_t)b, (size_t)(e - b)));
            int seg = b < 96 ? 0 : b < 200 ? 1 : 2;
            blocks.push_back({h, b, e, classes[seg], seg});
        }
    }

    snapshot_meta meta_for(pos_t P, const std::string & workspace) const {
        snapshot_meta m;
        m.prof = prof;
        m.profile_fingerprint = prof.fingerprint();
        m.workspace = workspace;
        m.prompt_manifest = prompt_manifest;
        for (const block & b : blocks)
            if (b.end <= P) m.blocks.push_back(b);
        return m;
    }
};

// ---- the child ---------------------------------------------------------------------------------

// Never returns. Writes 'R' to `fd` when its KV is computed, then one 'P' per completed put.
[[noreturn]] void child_main(int fd, uint64_t budget_bytes) {
    plan pl;
    auto eng_r = engine::open(tiny_options());
    if (!eng_r) _exit(3);
    engine & eng = **eng_r;
    if (!eng.prefill(0, pl.prefix, 0, k_segment_starts).ok()) _exit(4);
    std::map<pos_t, std::vector<uint8_t>> kv;
    for (auto it = k_cuts.rbegin(); it != k_cuts.rend(); ++it) {  // longest first: trim as we go
        if (!eng.trim_seq(0, *it).ok()) _exit(5);
        auto bytes = eng.save_seq(0);
        if (!bytes) _exit(6);
        kv[*it] = std::move(*bytes);
    }
    snapshot_store_options o;
    o.dir = k_dir;
    o.budget_bytes = budget_bytes;  // small enough that puts evict (removals get killed too)
    auto store = snapshot_store::open(o);
    if (!store) _exit(7);
    if (::write(fd, "R", 1) != 1) _exit(8);
    for (uint64_t i = 0;; ++i) {
        pos_t P = k_cuts[i % k_cuts.size()];
        std::string ws = "ws" + std::to_string((i / k_cuts.size()) % 2);
        std::span<const token_id> toks(pl.prefix.data(), (size_t)P);
        auto r = (*store)->put(pl.meta_for(P, ws), toks, kv[P]);
        if (!r.ok()) _exit(9);
        if (::write(fd, "P", 1) != 1) _exit(10);
    }
}

// ---- the parent ---------------------------------------------------------------------------------

size_t count_temp_files() {
    size_t n = 0;
    for (const auto & e : std::filesystem::directory_iterator(k_dir))
        if (e.path().string().ends_with(".tmp")) ++n;
    return n;
}

TEST(crash_loop, sigkill_during_snapshot_writes_never_leaves_a_loadable_torn_file) {
    std::filesystem::remove_all(k_dir);
    std::filesystem::create_directories(k_dir);
    const uint64_t budget = 240'000;  // ~4 of the 6 files (the KV of 320 tokens is ~80 kB)
    std::mt19937 rng(k_seed);
    const std::vector<token_id> plan_tokens = plan().prefix;
    int n_kills = 0, n_child_failures = 0, n_torn_loaded = 0;
    size_t n_checked_between_kills = 0, n_rejected_between_kills = 0;
    uint64_t n_puts_completed = 0;
    size_t n_temp_left = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int round = 0; round < k_kills; ++round) {
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > k_max_kill_phase_s) break;
        n_temp_left += count_temp_files();  // what the previous kill left behind
        int fds[2];
        ASSERT_EQ(::pipe(fds), 0);
        pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            ::close(fds[0]);
            child_main(fds[1], budget);
        }
        ::close(fds[1]);
        char c = 0;
        ASSERT_EQ(::read(fds[0], &c, 1), 1) << "the child died before it was ready";
        ASSERT_EQ(c, 'R');
        // Kill after 0..3 completed puts plus 0..4 ms: lands in every phase of a put
        // (temp write, fsync, rename, directory fsync, eviction).
        int n_wait_puts = (int)(rng() % 4);
        for (int i = 0; i < n_wait_puts; ++i) {
            ASSERT_EQ(::read(fds[0], &c, 1), 1);
            ++n_puts_completed;
        }
        struct timespec ts = {0, (long)(rng() % 4000) * 1000};
        ::nanosleep(&ts, nullptr);  // the random moment of the kill, not a synchronisation
        ::kill(pid, SIGKILL);
        int wstatus = 0;
        ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
        if (WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) ++n_kills;
        else ++n_child_failures;
        while (::read(fds[0], &c, 1) == 1) ++n_puts_completed;  // the puts it finished before dying
        ::close(fds[0]);

        // What the kill left, as a reader beside the directory sees it (scan-only: the
        // next child finds the directory exactly as the kill left it): every file the
        // index accepts must read back whole.
        snapshot_store_options ro;
        ro.dir = k_dir;
        ro.scan_only = true;
        auto reader = snapshot_store::open(ro);
        ASSERT_TRUE(reader.ok()) << reader.error().to_string();
        n_rejected_between_kills += (*reader)->rejected().size();
        for (const snapshot_entry & e : (*reader)->list()) {
            ++n_checked_between_kills;
            auto l = (*reader)->load(e.key);
            if (!l.ok())
                ADD_FAILURE() << "after kill " << round << ": " << e.file_name << ": " << l.error().to_string();
            else if (!std::equal((*l)->tokens.begin(), (*l)->tokens.end(), plan_tokens.begin())) ++n_torn_loaded;
        }
    }
    const double t_kill_phase_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    n_temp_left += count_temp_files();
    EXPECT_EQ(n_child_failures, 0);
    EXPECT_GE(n_kills, 5);  // 30 normally; fewer only when the 45 s cap stops a loaded machine

    // Restart: index the directory, then check every file fully and against a cold run.
    snapshot_store_options o;
    o.dir = k_dir;
    auto store_r = snapshot_store::open(o);
    ASSERT_TRUE(store_r.ok()) << store_r.error().to_string();
    snapshot_store & store = **store_r;
    EXPECT_EQ(count_temp_files(), 0u) << "open removes every temp file";
    const uint64_t n_quarantined_at_scan = store.stats().n_quarantined;

    plan pl;
    auto eng_r = engine::open(tiny_options());
    ASSERT_TRUE(eng_r.ok()) << eng_r.error().to_string();
    engine & eng = **eng_r;
    const size_t n_vocab = (size_t)eng.model().n_vocab;
    std::map<pos_t, std::vector<float>> cold;  // logits after prefix[0, P) + tail, by P
    for (pos_t P : k_cuts) {
        std::vector<token_id> prompt(pl.prefix.begin(), pl.prefix.begin() + P);
        prompt.insert(prompt.end(), pl.tail.begin(), pl.tail.end());
        eng.clear_seq(0);
        ASSERT_TRUE(eng.prefill(0, prompt, 0, boundaries_for(P), &cold[P]).ok());
        ASSERT_EQ(cold[P].size(), n_vocab);
    }

    int n_checked = 0, n_loaded = 0, n_load_failed = 0, n_identical = 0;
    for (const snapshot_entry & e : store.list()) {
        ++n_checked;
        auto l = store.load(e.key, &pl.prof);
        if (!l.ok()) {
            ++n_load_failed;
            ADD_FAILURE() << e.file_name << ": " << l.error().to_string();
            continue;
        }
        ++n_loaded;
        const snapshot & s = **l;
        const pos_t P = s.meta.n_tokens();
        // Whole: the checksums passed; and it is exactly what was written for its key.
        bool whole = std::find(k_cuts.begin(), k_cuts.end(), P) != k_cuts.end() &&
                     std::equal(s.tokens.begin(), s.tokens.end(), pl.prefix.begin()) &&
                     s.meta.blocks == pl.meta_for(P, s.meta.workspace).blocks;
        if (!whole) {
            ++n_torn_loaded;
            ADD_FAILURE() << e.file_name << " loaded but is not what was written";
            continue;
        }
        ASSERT_TRUE(eng.load_seq(1, s.kv).ok());
        ASSERT_EQ(eng.seq_n_tokens(1), P);
        std::vector<float> warm;
        ASSERT_TRUE(eng.prefill(1, pl.tail, P, boundaries_for(P), &warm).ok());
        ASSERT_EQ(warm.size(), n_vocab);
        if (std::memcmp(warm.data(), cold[P].data(), n_vocab * sizeof(float)) == 0) ++n_identical;
        else ADD_FAILURE() << e.file_name << ": restored logits differ from the cold run";
    }
    EXPECT_EQ(n_torn_loaded, 0);
    EXPECT_EQ(n_load_failed, 0);
    EXPECT_EQ(n_rejected_between_kills, 0u);
    EXPECT_EQ(n_quarantined_at_scan, 0u);  // a SIGKILL loses no written byte: nothing to quarantine
    EXPECT_GT(n_checked, 0);
    EXPECT_EQ(n_identical, n_loaded);
    std::printf(
        "crash loop: %d kills in %.1f s (%llu puts completed), %zu temp files left by kills (never indexed, "
        "removed at open); after the kills %zu files checked fully, %zu rejected; at the end %d files checked, "
        "%d loaded whole, %llu quarantined, %d load failures, %d torn loaded, %d restored == cold bit for bit\n",
        n_kills, t_kill_phase_s, (unsigned long long)n_puts_completed, n_temp_left, n_checked_between_kills,
        n_rejected_between_kills, n_checked, n_loaded, (unsigned long long)n_quarantined_at_scan, n_load_failed,
        n_torn_loaded, n_identical);
}

}  // namespace
}  // namespace warmctx
