// warmctx-bench warm-overhead | restore - what reuse costs: a warm turn's tail prefill
// next to the same tail in a fresh sequence, and reuse in place, from the RAM pool and
// from disk next to a cold prefill.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "bench_harness.h"
#include "warmctx/context_engine.h"
#include "store/snapshot_store.h"
#include "workload/workload.h"

namespace warmctx::cli {
namespace {

using clock_type = std::chrono::steady_clock;

// ---- bench warm-overhead ----------------------------------------------------

struct overhead_args {
    model_flags mf;
    size_t prefix_tokens = 2048;
    int reps = 5;
    bool json = false;
};

int run_overhead(overhead_args a) {
    if (a.reps < 1) return fail(invalid_argument("--reps must be >= 1"));
    const uint32_t need = (uint32_t)a.prefix_tokens + 1024;
    if (a.mf.n_ctx < need) a.mf.n_ctx = need;
    auto eo = a.mf.to_options(1);
    if (!eo) return fail(eo.error());
    context_engine_options co;
    co.engine = *eo;
    co.n_holders = 2;
    auto ce_r = context_engine::open(co);
    if (!ce_r) return fail(ce_r.error());
    context_engine & ce = **ce_r;
    // The by-hand steps run on an engine of their own with the same options (and so the
    // same per-sequence KV buffers to copy): sequence 0 plays the holder, 1 the work
    // sequence. The context engine's sequences stay its own.
    engine_options ho = *eo;
    ho.n_seq_max = 2;
    auto he_r = engine::open(ho);
    if (!he_r) return fail(he_r.error());
    engine & e = **he_r;
    const seq_id holder = 0, work = 1;
    workload_generator g(7, counter_for(ce));
    std::vector<segment> segs = make_workspace(g, a.prefix_tokens, 2);
    turn_request req;
    req.workspace = "bench";
    req.segments = segs;
    req.sampling.max_tokens = 1;
    progress("priming the cache with a " + std::to_string(a.prefix_tokens) + "-token prefix");
    if (auto r = ce.run_turn(req); !r) return fail(r.error());
    std::vector<double> warm_prefill, warm_ttft, manual_copy_prefill, nocopy_prefill, fresh_prefill;
    pos_t tail_tokens = 0, reused = 0, held = 0;
    auto timed_prefill = [&](seq_id seq, std::span<const token_id> toks, pos_t pos0, const std::vector<pos_t> & bounds,
                             double & ms) -> status {
        std::vector<float> logits;
        auto t0 = clock_type::now();
        status st = e.prefill(seq, toks, pos0, bounds, &logits);
        ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
        return st;
    };
    for (int i = 0; i < a.reps; ++i) {
        req.segments.back().content = g.question();
        // 1. The warm turn, end to end through the context engine.
        auto w = ce.run_turn(req);
        if (!w) return fail(w.error());
        warm_prefill.push_back(w->t_prefill_ms);
        warm_ttft.push_back(w->t_first_token_ms);
        tail_tokens = w->explain.n_prefilled;
        reused = w->explain.n_reused;
        if (reused <= 0) return fail(internal_error("the warm turn reused nothing"));
        auto prompt = ce.assemble_request(req);
        if (!prompt) return fail(prompt.error());
        // The holder: the reused prefix, computed in the same canonical chunks.
        if (held != reused) {
            e.clear_seq(holder);
            double ms = 0;
            std::span<const token_id> prefix(prompt->tokens.data(), (size_t)reused);
            if (status st = timed_prefill(holder, prefix, 0, prompt->boundaries, ms); !st.ok()) return fail(st);
            held = reused;
        }
        std::span<const token_id> tail(prompt->tokens.data() + reused, prompt->tokens.size() - (size_t)reused);
        // 2. The same steps by hand: copy the holder, trim, prefill the tail. llama.cpp
        //    performs a sequence copy lazily inside the next decode, so the copy's cost
        //    lands in this prefill...
        double ms = 0;
        e.clear_seq(work);
        if (status st = e.copy_seq(holder, work); !st.ok()) return fail(st);
        if (status st = e.trim_seq(work, reused); !st.ok()) return fail(st);
        if (status st = timed_prefill(work, tail, reused, prompt->boundaries, ms); !st.ok()) return fail(st);
        manual_copy_prefill.push_back(ms);
        // 3. ...and the same tail once more on the now-resident prefix, with no copy
        //    pending: the difference is the copy.
        if (status st = e.trim_seq(work, reused); !st.ok()) return fail(st);
        if (status st = timed_prefill(work, tail, reused, prompt->boundaries, ms); !st.ok()) return fail(st);
        nocopy_prefill.push_back(ms);
        // 4. The same tail tokens alone in a fresh sequence, same chunking.
        std::vector<pos_t> bounds;
        for (pos_t b : prompt->boundaries) if (b > reused) bounds.push_back(b - reused);
        e.clear_seq(work);
        if (status st = timed_prefill(work, tail, 0, bounds, ms); !st.ok()) return fail(st);
        fresh_prefill.push_back(ms);
        e.clear_seq(work);
    }
    const double wp = median(warm_prefill), fp = median(fresh_prefill), np = median(nocopy_prefill);
    const double wc = std::max(0.0, median(manual_copy_prefill) - np);
    nlohmann::json j = {
        {"model", eo->model_path}, {"threads", ce.context().n_threads}, {"reps", a.reps},
        {"prefix_tokens_reused", reused}, {"tail_tokens", tail_tokens},
        {"warm_prefill_ms_median", wp}, {"warm_ttft_ms_median", median(warm_ttft)},
        {"copy_ms_median", wc}, {"resident_prefix_tail_prefill_ms_median", np},
        {"fresh_tail_prefill_ms_median", fp}, {"ratio_warm_prefill_to_fresh", fp > 0 ? wp / fp : 0.0},
        {"target", "warm_prefill <= 1.10 * fresh_tail_prefill + copy"},
        {"target_ms", 1.10 * fp + wc}, {"met", wp <= 1.10 * fp + wc},
        {"warm_prefill_ms", warm_prefill}, {"copy_then_prefill_ms", manual_copy_prefill},
        {"resident_prefix_tail_prefill_ms", nocopy_prefill}, {"fresh_tail_prefill_ms", fresh_prefill},
    };
    if (a.json) { std::printf("%s\n", j.dump(2).c_str()); return 0; }
    std::printf("reused %d tokens, tail %d tokens: warm prefill %.1f ms (copy %.1f ms of it; tail on a resident "
                "prefix %.1f ms) vs the tail alone in a fresh sequence %.1f ms: target %.1f ms, %s\n",
                reused, tail_tokens, wp, wc, np, fp, 1.10 * fp + wc, wp <= 1.10 * fp + wc ? "met" : "not met");
    return 0;
}

// ---- bench restore ----------------------------------------------------------

struct restore_args {
    model_flags mf;
    std::vector<size_t> prefix_tokens = {2048, 8192};
    std::string cache_dir;
    bool json = false;
};

// Drops the file's pages from the page cache (no root needed): the next read hits the disk.
void drop_page_cache(const std::string & path) {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
}

// Sequential read rate of `path` from the disk, MB/s (page cache dropped first).
double disk_read_mb_s(const std::string & path) {
    drop_page_cache(path);
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return 0;
    std::vector<char> buf(4 << 20);
    size_t total = 0;
    auto t0 = clock_type::now();
    ssize_t n;
    while ((n = ::read(fd, buf.data(), buf.size())) > 0) total += (size_t)n;
    ::close(fd);
    double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    return s > 0 ? (double)total / 1e6 / s : 0;
}

// Restart: a new process state on the same directory. The first turn of the workspace
// restores its prefix from disk instead of prefilling it.
status measure_restart(const context_engine_options & co, turn_request req, nlohmann::json & row) {
    auto t_open = clock_type::now();
    auto ce_r = context_engine::open(co);
    if (!ce_r) return ce_r.error();
    const double open_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t_open).count();
    context_engine & ce = **ce_r;
    for (const auto & e : ce.disk_tier()->list()) drop_page_cache(ce.disk_tier()->path_of(e.file_name));
    req.segments.back().content = "first question after the restart";
    auto first = ce.run_turn(req);
    if (!first) return first.error();
    row["restart_open_ms"] = open_ms;
    row["restart_tier"] = kv_tier_name(first->explain.tier);
    row["restart_first_turn_ttft_ms"] = first->t_first_token_ms;
    row["restart_ratio_to_cold"] = first->t_first_token_ms / row["cold_ttft_ms"].get<double>();
    return {};
}

// One prefix size: a cold turn, then the same prefix reused in place, from the RAM pool,
// from disk, and after a restart; the row of the report.
status measure_restore(const restore_args & a, size_t prefix, const std::string & root, nlohmann::json & row) {
    model_flags mf = a.mf;
    mf.n_ctx = std::max<uint32_t>(mf.n_ctx, (uint32_t)prefix + 1024);
    auto eo = mf.to_options(1);
    if (!eo) return eo.error();
    const std::string dir = root + "/p" + std::to_string(prefix);
    context_engine_options co;
    co.engine = *eo;
    co.n_holders = 2;
    co.tiers.cache_dir = dir;
    std::vector<segment> segs;
    turn_request req;
    req.workspace = "bench";
    req.sampling.max_tokens = 1;
    row["prefix_tokens_target"] = prefix;
    {
        auto ce_r = context_engine::open(co);
        if (!ce_r) return ce_r.error();
        context_engine & ce = **ce_r;
        workload_generator g(11 + prefix, counter_for(ce));
        segs = make_workspace(g, prefix, 2);
        req.segments = segs;
        progress("prefix " + std::to_string(prefix) + ": cold turn");
        auto cold = ce.run_turn(req);
        if (!cold) return cold.error();
        row["prompt_tokens"] = cold->explain.n_prompt_tokens;
        row["cold_ttft_ms"] = cold->t_first_token_ms;
        // Its write-through runs on the disk tier's writer thread: let it finish, so
        // that the turns measured next do not share the cores with it.
        (void)ce.disk_tier();
        // In place: the next turn finds the prefix still in its work stream.
        req.segments.back().content = g.question();
        auto inplace = ce.run_turn(req);
        if (!inplace) return inplace.error();
        row["in_place"] = inplace->explain.in_place;
        row["in_place_ttft_ms"] = inplace->t_first_token_ms;
        // From the pool: another workspace's turn takes the one work stream, then
        // this workspace comes back and its prefix is loaded from RAM.
        {
            workload_generator other_g(7 + prefix, counter_for(ce));
            turn_request other = req;
            other.workspace = "other";
            other.segments = make_workspace(other_g, 256, 1);
            if (auto o = ce.run_turn(other); !o) return o.error();
        }
        const kv_memory before = ce.counters().memory;
        req.segments.back().content = g.question();
        auto pooled = ce.run_turn(req);
        if (!pooled) return pooled.error();
        const kv_memory after = ce.counters().memory;
        const double load_ms = after.pool_load_ms - before.pool_load_ms;
        const uint64_t load_bytes = after.pool_loaded_bytes - before.pool_loaded_bytes;
        row["pool_reused_tokens"] = pooled->explain.n_reused;
        row["pool_load_bytes"] = load_bytes;
        row["pool_load_ms"] = load_ms;
        row["pool_load_gb_s"] = load_ms > 0 ? (double)load_bytes / 1e9 / (load_ms / 1000) : 0.0;
        row["pool_copy_ms"] = pooled->t_copy_ms;  // load + trim at the reuse point
        row["pool_ttft_ms"] = pooled->t_first_token_ms;
        // From disk: the engine's streams and pool emptied, the file's pages dropped.
        ce.drop_engine_cache();
        uint64_t file_bytes = 0;
        std::string file;
        for (const auto & e : ce.disk_tier()->list()) {
            file = ce.disk_tier()->path_of(e.file_name);
            file_bytes = e.file_bytes;
            drop_page_cache(file);
        }
        req.segments.back().content = g.question();
        auto disk = ce.run_turn(req);
        if (!disk) return disk.error();
        row["disk_tier"] = kv_tier_name(disk->explain.tier);
        row["disk_reused_tokens"] = disk->explain.n_reused;
        row["disk_restore_ms"] = disk->t_restore_ms;
        row["disk_ttft_ms"] = disk->t_first_token_ms;
        row["snapshot_bytes"] = file_bytes;
        row["restore_mb_s"] = disk->t_restore_ms > 0 ? (double)file_bytes / 1e6 / (disk->t_restore_ms / 1000) : 0.0;
        row["disk_sequential_read_mb_s"] = file.empty() ? 0.0 : disk_read_mb_s(file);
    }
    return measure_restart(co, std::move(req), row);
}

int run_restore(restore_args a) {
    nlohmann::json rows = nlohmann::json::array();
    std::string root = a.cache_dir;
    owned_dir made;  // removed on every way out, a failed measurement's too
    if (root.empty()) {
        auto d = make_owned_dir("/var/tmp", "warmctx-restore");  // on disk, not tmpfs
        if (!d) return fail(d.error());
        made = std::move(*d);
        root = made.path();
    }
    for (size_t prefix : a.prefix_tokens) {
        nlohmann::json row;
        if (status st = measure_restore(a, prefix, root, row); !st.ok()) return fail(st);
        rows.push_back(row);
    }
    nlohmann::json j = {{"model", a.mf.model.empty() ? "default" : a.mf.model}, {"rows", rows},
                        {"page_cache", "dropped per file with posix_fadvise(POSIX_FADV_DONTNEED) after fdatasync"}};
    if (a.json) { std::printf("%s\n", j.dump(2).c_str()); return 0; }
    std::printf("%8s %10s %10s %10s %10s %12s %12s %10s %10s %12s\n", "prefix", "cold ms", "in-place", "pool ttft",
                "pool GB/s", "disk ttft", "restart", "MB/s", "disk MB/s", "restart/cold");
    for (const auto & r : rows)
        std::printf("%8d %10.1f %10.1f %10.1f %10.2f %12.1f %12.1f %10.0f %10.0f %12.4f\n",
                    r["prompt_tokens"].get<int>(), r["cold_ttft_ms"].get<double>(), r["in_place_ttft_ms"].get<double>(),
                    r["pool_ttft_ms"].get<double>(), r["pool_load_gb_s"].get<double>(), r["disk_ttft_ms"].get<double>(),
                    r["restart_first_turn_ttft_ms"].get<double>(), r["restore_mb_s"].get<double>(),
                    r["disk_sequential_read_mb_s"].get<double>(), r["restart_ratio_to_cold"].get<double>());
    return 0;
}

}  // namespace

void register_overhead_bench(CLI::App & bench, int & rc) {
    auto o = std::make_shared<overhead_args>();
    auto * c = bench.add_subcommand("warm-overhead",
                                    "warm turn's tail prefill next to the same tail prefilled in a fresh sequence");
    o->mf.add_to(*c);
    c->add_option("--prefix-tokens", o->prefix_tokens, "stable prefix size, tokens")->capture_default_str();
    c->add_option("--reps", o->reps, "repetitions")->capture_default_str();
    c->add_flag("--json", o->json, "print JSON");
    on_run(c, rc, [o] { return run_overhead(*o); });
    register_restore_bench(bench, rc);
}

void register_restore_bench(CLI::App & bench, int & rc) {
    auto o = std::make_shared<restore_args>();
    auto * c = bench.add_subcommand(
        "restore",
        "cold prefill vs reuse in place, from the RAM pool and from disk, and the first turn after a restart");
    o->mf.add_to(*c, false);
    c->add_option("--prefix-tokens", o->prefix_tokens, "stable prefix sizes, tokens")
        ->capture_default_str()
        ->delimiter(',');
    c->add_option("--cache-dir", o->cache_dir, "where the snapshots go (default: a fresh directory under /var/tmp)");
    c->add_flag("--json", o->json, "print JSON");
    on_run(c, rc, [o] { return run_restore(*o); });
}

}  // namespace warmctx::cli
