// route_context: what every route shares - the scheduler and the engine calls on its
// thread, the request ids, the per-request record (metrics + log line), the carried
// segments, the live request channels and the background jobs.
#include "route_context.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>

#include "json_util.h"
#include "util/clock.h"
#include "warmctx/drafts.h"
#include "warmctx/fs.h"
#include "store/snapshot_store.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

std::string iso8601_now() {
    auto now = std::chrono::system_clock::now();
    std::time_t t = std::chrono::system_clock::to_time_t(now);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[64];
    size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms));
    return buf;
}

std::string model_name_from_path(const std::string & path) {
    auto slash = path.find_last_of('/');
    std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
    auto dot = base.rfind(".gguf");
    if (dot != std::string::npos && dot + 5 == base.size()) base.resize(dot);
    return base.empty() ? "warmctx" : base;
}

}  // namespace


route_context::route_context(server_options o)
    : opts(std::move(o)),
      store(store_limits{opts.max_workspaces, opts.max_segments_per_workspace, opts.max_segment_bytes,
                         opts.max_store_bytes},
            store_persistence{opts.workspace_dir.empty() ? nullptr : &posix_fs(), opts.workspace_dir,
                              [this](uint64_t bytes) { return make_disk_room(bytes); }, opts.shared_workspace_dir}) {
    limits.default_max_tokens = std::max(0, opts.default_max_tokens);  // 0: to the end of the context
    limits.default_reasoning_budget = std::max(-1, opts.reasoning_budget);
    limits.default_draft_max = std::clamp<int32_t>(opts.draft_max, 0, (int32_t)k_max_draft_tokens);
    model_name = !opts.model_name.empty() ? opts.model_name : "warmctx";
    t_created = static_cast<int64_t>(std::time(nullptr));
    id_salt_ = std::random_device{}();
    id_salt_ = (id_salt_ << 32) ^ std::random_device{}();
    loading_.store(true, std::memory_order_relaxed);
}

// A durable store write found the disk full: the disk tier's snapshots (a cache) give
// room back, on the engine thread that owns the tier.
uint64_t route_context::make_disk_room(uint64_t bytes) {
    if (loading() || !sched) return 0;
    uint64_t freed = 0;
    auto e = engine_call([&](context_engine & ce) {
        if (snapshot_store * disk = ce.disk_tier()) freed = disk->evict_for_space(bytes);
    });
    if (e) return 0;
    log_event({{"event", "disk_full"}, {"needed_bytes", bytes}, {"snapshot_bytes_freed", freed}});
    return freed;
}

route_context::route_context(scheduler * s, server_options o) : route_context(std::move(o)) {
    if (s) {
        attach(*s);
    } else {
        loading_.store(false, std::memory_order_release);
    }
}

void route_context::attach(scheduler & s) {
    sched = &s;
    limits.max_tokens_cap = static_cast<int32_t>(std::max<uint32_t>(1, s.context().n_ctx_seq));
    limits.n_vocab = s.model().n_vocab;
    const context_info & ci = s.context();
    const int32_t drafts = default_draft_max(opts.draft_max, ci.backend, ci.steps_exact);
    limits.default_draft_max = std::clamp<int32_t>(drafts, 0, (int32_t)k_max_draft_tokens);
    if (opts.model_name.empty()) model_name = model_name_from_path(s.model().path);
    // The durable store comes back; its workspaces are brought warm, most used first,
    // while the server already answers.
    auto rep = store.load(opts.kinds);
    if (!rep.ok()) {
        log_event({{"event", "workspace_store"}, {"error", rep.error().message()}});
    } else if (store.durable()) {
        log_event({{"event", "workspace_store"},
                   {"dir", opts.workspace_dir},
                   {"workspaces", rep->n_workspaces},
                   {"segments", rep->n_segments},
                   {"quarantined", rep->n_quarantined},
                   {"skipped", rep->n_skipped}});
        for (const std::string & p : rep->problems) log_event({{"event", "workspace_store"}, {"problem", p}});
    }
    if (opts.prewarm) {
        prewarm = std::make_unique<prewarmer>(*this, opts.prewarm_delay_ms);
        prewarm->start();
        prewarm->mark_all(store.use_order());
    }
    loading_.store(false, std::memory_order_release);
}

route_context::~route_context() { stop_background(); }

void route_context::remember_carried(const std::string & ws, std::vector<segment> segs) {
    size_t bytes = 0;
    for (const segment & sg : segs) bytes += sg.id.size() + sg.content.size() + sg.path.size() + sg.role.size();
    std::lock_guard<std::mutex> lk(carried_mu_);
    if (segs.empty() || bytes > opts.max_segment_bytes) {
        carried_.erase(ws);
        return;
    }
    if (!carried_.count(ws) && carried_.size() >= opts.max_workspaces) carried_.erase(carried_.begin());
    carried_[ws] = std::move(segs);
}

std::vector<segment> route_context::carried(const std::string & ws) const {
    std::lock_guard<std::mutex> lk(carried_mu_);
    auto it = carried_.find(ws);
    return it == carried_.end() ? std::vector<segment>{} : it->second;
}

void route_context::forget_carried(const std::string & ws) {
    std::lock_guard<std::mutex> lk(carried_mu_);
    carried_.erase(ws);
}

void route_context::stop_background() {
    if (prewarm) prewarm->stop();
    grammars.stop();
}

void route_context::log_event(json line) {
    if (!opts.log_requests) return;
    json out = {{"ts", iso8601_now()}};
    for (auto & [k, v] : line.items()) out[k] = v;
    std::string s = dump_json(out) + "\n";
    std::lock_guard<std::mutex> lk(log_mu_);
    std::fputs(s.c_str(), stderr);
    std::fflush(stderr);
}

std::string route_context::next_request_id(const char * prefix) {
    uint64_t v = (next_id_.fetch_add(1) * 0x9E3779B97F4A7C15ull) ^ id_salt_;
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(v));
    return buf;
}

maybe_error route_context::engine_call(const std::function<void(context_engine &)> & fn) {
    if (loading()) return unavailable("the model is loading", 1);
    if (!sched) return unavailable("the engine is stopping: no engine", 1);
    bool ran = false;
    status st = sched->call([&](context_engine & ce) {
        fn(ce);
        ran = true;
    });
    if (st.ok() && ran) return std::nullopt;
    if (st.ok() || st.code() == status_code::failed_precondition)
        return unavailable("the engine is stopping" + (st.ok() ? std::string() : ": " + st.message()), 1);
    return error_from_status(st);
}

bool route_context::register_channel(const std::shared_ptr<request_channel> & ch) {
    std::lock_guard<std::mutex> lk(live_mu_);
    if (stopping.load()) return false;
    live_.insert(ch);
    return true;
}

void route_context::unregister_channel(const std::shared_ptr<request_channel> & ch) {
    std::lock_guard<std::mutex> lk(live_mu_);
    live_.erase(ch);
}

void route_context::stop_channels(const std::string & why) {
    std::lock_guard<std::mutex> lk(live_mu_);
    stopping = true;
    for (const auto & ch : live_) ch->abort(why);
}

void route_context::finish(request_log & log, int http_status) {
    if (log.finished) return;
    log.finished = true;
    const double duration_ms = ms_between(log.t_start, steady::now());
    request_outcome o;
    o.route = log.route;
    o.status = http_status;
    o.duration_s = duration_ms / 1000.0;
    o.ttft_s = log.ttft_ms >= 0 ? log.ttft_ms / 1000.0 : -1;
    o.prompt_tokens = log.prompt_tokens;
    o.cached_tokens = log.tokens_reused;
    o.prefilled_tokens = log.tokens_prefilled;
    o.completion_tokens = log.completion_tokens;
    metrics.record(o);
    if (!opts.log_requests) return;
    auto opt_int = [](int64_t v) { return v < 0 ? json(nullptr) : json(v); };
    json line = {{"ts", iso8601_now()},
                 {"method", log.method},
                 {"route", log.route},
                 {"status", http_status},
                 {"workspace", log.workspace.empty() ? json(nullptr) : json(log.workspace)},
                 {"prompt_tokens", opt_int(log.prompt_tokens)},
                 {"tokens_reused", opt_int(log.tokens_reused)},
                 {"tokens_prefilled", opt_int(log.tokens_prefilled)},
                 {"completion_tokens", opt_int(log.completion_tokens)},
                 {"ttft_ms", log.ttft_ms < 0 ? json(nullptr) : json(std::round(log.ttft_ms * 1000) / 1000)},
                 {"duration_ms", std::round(duration_ms * 1000) / 1000}};
    if (!log.error_code.empty()) line["error"] = log.error_code;
    if (!log.path.empty()) line["path"] = log.path;
    std::string s = dump_json(line) + "\n";
    std::lock_guard<std::mutex> lk(log_mu_);
    std::fputs(s.c_str(), stderr);
    std::fflush(stderr);
}

}  // namespace warmctx::server_detail
