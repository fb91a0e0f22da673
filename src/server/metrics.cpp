#include "metrics.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace warmctx::server_detail {

namespace {

// The shortest text that reads back as the same double ("0.005", not "0.0050000000000000001").
std::string num(double v) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}

// Label values are escaped per the exposition format (\\, \", \n).
std::string escape_label(const std::string & s) {
    std::string out;
    for (char c : s) {
        if (c == '\\') out += "\\\\";
        else if (c == '"') out += "\\\"";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

void header(std::string & out, const char * name, const char * type, const char * help) {
    out += "# HELP ";
    out += name;
    out += ' ';
    out += help;
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type;
    out += '\n';
}

void sample(std::string & out, const std::string & name, const std::string & labels, double v) {
    out += name;
    if (!labels.empty()) out += "{" + labels + "}";
    out += ' ';
    out += num(v);
    out += '\n';
}

void scalar(std::string & out, const char * name, const char * type, const char * help, double v,
            const std::string & labels = {}) {
    header(out, name, type, help);
    sample(out, name, labels, v);
}

}  // namespace

void histogram::observe(double v) {
    ++count_;
    sum_ += v;
    for (size_t i = 0; i < k_bounds.size(); ++i) {
        if (v <= k_bounds[i]) {
            ++buckets_[i];
            return;
        }
    }
}

void histogram::render(std::string & out, const std::string & name) const {
    uint64_t cum = 0;
    for (size_t i = 0; i < k_bounds.size(); ++i) {
        cum += buckets_[i];
        sample(out, name + "_bucket", "le=\"" + num(k_bounds[i]) + "\"", static_cast<double>(cum));
    }
    sample(out, name + "_bucket", "le=\"+Inf\"", static_cast<double>(count_));
    sample(out, name + "_sum", {}, sum_);
    sample(out, name + "_count", {}, static_cast<double>(count_));
}

void server_metrics::record(const request_outcome & o) {
    std::lock_guard<std::mutex> lk(mu_);
    ++requests_[{o.route, o.status}];
    duration_.observe(o.duration_s);
    if (o.ttft_s >= 0) ttft_.observe(o.ttft_s);
    prompt_tokens_ += static_cast<uint64_t>(std::max<int64_t>(0, o.prompt_tokens));
    cached_tokens_ += static_cast<uint64_t>(std::max<int64_t>(0, o.cached_tokens));
    prefilled_tokens_ += static_cast<uint64_t>(std::max<int64_t>(0, o.prefilled_tokens));
    completion_tokens_ += static_cast<uint64_t>(std::max<int64_t>(0, o.completion_tokens));
}

void server_metrics::count_shed_connection() {
    std::lock_guard<std::mutex> lk(mu_);
    ++shed_connections_;
}

namespace {

// The scheduler's queue and jobs, and the server-side store.
void render_scheduler(std::string & out, const engine_snapshot & snap) {
    const scheduler_stats & s = snap.sched;
    scalar(out, "warmctx_queue_depth", "gauge", "Jobs waiting for a work sequence.",
           static_cast<double>(s.queue_depth));
    scalar(out, "warmctx_active_sequences", "gauge", "Jobs holding a work sequence.",
           static_cast<double>(s.active_jobs));
    scalar(out, "warmctx_prefilling_sequences", "gauge", "Admitted jobs whose prompt is still being prefilled.",
           static_cast<double>(s.prefilling_jobs));
    scalar(out, "warmctx_prefill_remaining_tokens", "gauge", "Prompt tokens those jobs have still to prefill.",
           static_cast<double>(s.prefill_remaining_tokens));
    scalar(out, "warmctx_prefill_chunks_total", "counter",
           "Prefill chunks run one at a time between other jobs' work.", static_cast<double>(s.n_prefill_chunks));
    scalar(out, "warmctx_parallel_sequences", "gauge", "Work sequences (jobs decoded at once).",
           static_cast<double>(snap.n_parallel));
    scalar(out, "warmctx_jobs_submitted_total", "counter", "Jobs accepted by the scheduler.",
           static_cast<double>(s.n_submitted));
    scalar(out, "warmctx_jobs_rejected_total", "counter", "Jobs refused because the queue was full.",
           static_cast<double>(s.n_rejected));
    scalar(out, "warmctx_jobs_cancelled_total", "counter", "Jobs cancelled (client disconnected, shutdown).",
           static_cast<double>(s.n_cancelled));
    scalar(out, "warmctx_jobs_completed_total", "counter", "Jobs finished.", static_cast<double>(s.n_completed));
    scalar(out, "warmctx_jobs_failed_total", "counter", "Jobs that ended in an error.",
           static_cast<double>(s.n_failed));
    scalar(out, "warmctx_batched_steps_total", "counter", "Decode steps that served more than one job.",
           static_cast<double>(s.n_batched_steps));
    scalar(out, "warmctx_draft_steps_total", "counter", "Decode steps that carried a draft from the workspace.",
           static_cast<double>(s.drafts.n_steps));
    scalar(out, "warmctx_draft_tokens_total", "counter", "Draft tokens decoded.",
           static_cast<double>(s.drafts.n_drafted));
    scalar(out, "warmctx_draft_accepted_tokens_total", "counter", "Draft tokens sampling chose (decoded ahead).",
           static_cast<double>(s.drafts.n_accepted));

    scalar(out, "warmctx_store_workspaces", "gauge", "Workspaces with segments in the server-side store.",
           static_cast<double>(snap.store_workspaces));
    scalar(out, "warmctx_store_segments", "gauge", "Segments in the server-side store.",
           static_cast<double>(snap.store_segments));
    scalar(out, "warmctx_store_bytes", "gauge", "Bytes of the segments in the server-side store.",
           static_cast<double>(snap.store_bytes));
    scalar(out, "warmctx_store_write_failures_total", "counter",
           "Writes of the durable workspace store that failed (the request got 507, nothing changed).",
           static_cast<double>(snap.store_write_failures));
    scalar(out, "warmctx_prewarm_queue_depth", "gauge", "Pre-warms waiting (one per workspace).",
           static_cast<double>(s.prewarm_queue_depth));
    scalar(out, "warmctx_prewarms_submitted_total", "counter", "Pre-warms queued (a change of stored stable segments, "
           "POST .../prewarm, or a stored workspace on start).", static_cast<double>(s.n_prewarms_submitted));

}

// The prefix cache and the tiers below it, with evictions by retention class.
void render_cache(std::string & out, const engine_snapshot & snap) {
    const cache_counters & c = snap.counters.cache;
    const std::string tier = "tier=\"engine\"";
    const tier_counters & t = snap.counters.tiers;
    scalar(out, "warmctx_cache_tokens", "gauge", "Tokens of KV resident in the prefix cache.",
           static_cast<double>(c.resident_tokens), tier);
    // Per tier: the engine's KV (the pool of cached prefixes) and the disk snapshot store.
    header(out, "warmctx_cache_bytes", "gauge", "Bytes of KV held, by tier.");
    sample(out, "warmctx_cache_bytes", tier, static_cast<double>(c.resident_bytes));
    sample(out, "warmctx_cache_bytes", "tier=\"disk\"", static_cast<double>(t.disk_bytes));
    header(out, "warmctx_cache_entries", "gauge", "Cached prefixes, by tier (engine: pool entries; disk: snapshots).");
    sample(out, "warmctx_cache_entries", tier, static_cast<double>(c.n_holders_in_use));
    sample(out, "warmctx_cache_entries", "tier=\"disk\"", static_cast<double>(t.disk_files));
    header(out, "warmctx_tier_restores_total", "counter", "Prefixes restored from a tier below the engine.");
    sample(out, "warmctx_tier_restores_total", "tier=\"disk\"", static_cast<double>(t.n_restores_disk));
    header(out, "warmctx_tier_writes_total", "counter", "Prefixes written through to a tier.");
    sample(out, "warmctx_tier_writes_total", "tier=\"disk\"", static_cast<double>(t.n_writes_disk));
    header(out, "warmctx_tier_write_failures_total", "counter",
           "Write-throughs to a tier that failed (a full disk, say); each is also logged.");
    sample(out, "warmctx_tier_write_failures_total", "tier=\"disk\"", static_cast<double>(t.n_write_failures_disk));
    scalar(out, "warmctx_disk_copy_out_seconds_total", "counter",
           "Time the engine thread spent copying KV out for disk write-throughs (the writer thread does the rest).",
           t.disk_copy_out_ms / 1000.0);
    scalar(out, "warmctx_disk_copies_out_total", "counter", "KV copies out of the engine for disk write-throughs.",
           static_cast<double>(t.n_disk_copies_out));
    scalar(out, "warmctx_disk_write_queue_bytes", "gauge",
           "Bytes of snapshots queued for the disk tier's writer (the one being written included).",
           static_cast<double>(t.disk_write_queue_bytes));
    scalar(out, "warmctx_disk_write_queue_writes", "gauge", "Snapshots queued for the disk tier's writer.",
           static_cast<double>(t.disk_write_queue_writes));
    scalar(out, "warmctx_disk_write_drops_total", "counter",
           "Write-throughs dropped: the write queue was full (also counted as write failures).",
           static_cast<double>(t.n_write_drops_disk));
    scalar(out, "warmctx_disk_quarantine_files", "gauge",
           "Damaged snapshot files kept aside in quarantine/ (bounded; their bytes count in the disk budget).",
           static_cast<double>(t.disk_quarantine_files));
    scalar(out, "warmctx_disk_quarantine_bytes", "gauge", "Bytes in quarantine/.",
           static_cast<double>(t.disk_quarantine_bytes));
    scalar(out, "warmctx_disk_evicted_files_total", "counter",
           "Snapshot files this replica evicted to keep the disk tier's directory within its budget.",
           static_cast<double>(t.n_evicted_files_disk));
    scalar(out, "warmctx_disk_files_gone_total", "counter",
           "Snapshot files found removed when loaded (with --shared-cache-dir: evicted by another replica; a miss).",
           static_cast<double>(t.n_gone_files_disk));
    scalar(out, "warmctx_tier_restore_failures_total", "counter",
           "Tier files that failed their checks at restore (served as a miss).",
           static_cast<double>(t.n_restore_failures));
    scalar(out, "warmctx_cache_capacity_entries", "gauge", "Holders the cache may use.",
           static_cast<double>(c.n_holders_total), tier);
    scalar(out, "warmctx_cache_pinned_blocks", "gauge", "Distinct pinned blocks.",
           static_cast<double>(c.n_pinned_blocks), tier);
    header(out, "warmctx_evictions_total", "counter", "Blocks evicted from the prefix cache, by retention class.");
    for (int k = 1; k < k_retention_class_count; ++k)
        sample(out, "warmctx_evictions_total",
               "class=\"" + std::string(retention_class_name(static_cast<retention_class>(k))) + "\"",
               static_cast<double>(c.evictions_by_class[k]));
    header(out, "warmctx_evicted_tokens_total", "counter", "Tokens evicted from the prefix cache, by retention class.");
    for (int k = 1; k < k_retention_class_count; ++k)
        sample(out, "warmctx_evicted_tokens_total",
               "class=\"" + std::string(retention_class_name(static_cast<retention_class>(k))) + "\"",
               static_cast<double>(c.evicted_tokens_by_class[k]));
}

// The KV memory: allocated and used bytes, streams, the pool, one account across tiers.
void render_kv_memory(std::string & out, const engine_snapshot & snap) {
    const kv_memory & m = snap.counters.memory;
    scalar(out, "warmctx_kv_allocated_bytes", "gauge",
           "Every byte of KV the process allocated: work streams (whole), the RAM pool of cached prefixes, the "
           "streams' checkpoints and the buffers states move through.",
           static_cast<double>(m.allocated_bytes));
    scalar(out, "warmctx_kv_used_bytes", "gauge", "Bytes of that KV holding tokens.",
           static_cast<double>(m.used_bytes));
    header(out, "warmctx_kv_allocated_bytes_by_part", "gauge", "Allocated KV bytes, by where they live.");
    sample(out, "warmctx_kv_allocated_bytes_by_part", "part=\"streams\"",
           static_cast<double>(m.streams_allocated_bytes));
    sample(out, "warmctx_kv_allocated_bytes_by_part", "part=\"pool\"", static_cast<double>(m.pool_allocated_bytes));
    sample(out, "warmctx_kv_allocated_bytes_by_part", "part=\"checkpoints\"", static_cast<double>(m.checkpoint_bytes));
    sample(out, "warmctx_kv_allocated_bytes_by_part", "part=\"scratch\"", static_cast<double>(m.state_scratch_bytes));
    scalar(out, "warmctx_pool_loads_total", "counter", "Cached prefixes loaded from the pool into a work stream.",
           static_cast<double>(m.n_pool_loads));
    scalar(out, "warmctx_pool_loaded_bytes_total", "counter", "Bytes loaded from the pool.",
           static_cast<double>(m.pool_loaded_bytes));
    scalar(out, "warmctx_padded_decodes_total", "counter",
           "Decodes of fewer than 64 tokens padded to 64 rows (flash attention on the CPU).",
           static_cast<double>(m.n_padded_decodes));
    scalar(out, "warmctx_in_place_turns_total", "counter",
           "Warm turns whose work stream still held the prefix (nothing copied).",
           static_cast<double>(m.n_in_place_turns));
    {
        // One account across the tiers: the streams (in device memory when the
        // model's layers run on a GPU), the RAM pool, the disk tier.
        const tier_counters & tc = snap.counters.tiers;
        const std::string streams = m.streams_on_device ? "device" : "streams";
        header(out, "warmctx_tier_bytes", "gauge",
               "KV bytes by tier: device (or streams, on the CPU) = every KV stream, ram = the pool of cached "
               "prefixes, disk = snapshot files; state allocated or used.");
        sample(out, "warmctx_tier_bytes", "tier=\"" + streams + "\",state=\"allocated\"",
               static_cast<double>(m.streams_allocated_bytes));
        sample(out, "warmctx_tier_bytes", "tier=\"" + streams + "\",state=\"used\"",
               static_cast<double>(m.streams_used_bytes));
        sample(out, "warmctx_tier_bytes", "tier=\"ram\",state=\"allocated\"",
               static_cast<double>(m.pool_allocated_bytes));
        sample(out, "warmctx_tier_bytes", "tier=\"ram\",state=\"used\"", static_cast<double>(m.pool_bytes));
        sample(out, "warmctx_tier_bytes", "tier=\"disk\",state=\"allocated\"", static_cast<double>(tc.disk_bytes));
        sample(out, "warmctx_tier_bytes", "tier=\"disk\",state=\"used\"", static_cast<double>(tc.disk_bytes));
    }
    scalar(out, "warmctx_kv_streams", "gauge", "KV streams, the resident ones included.",
           static_cast<double>(m.n_streams));
    scalar(out, "warmctx_kv_resident_streams", "gauge",
           "Resident KV streams (the device tier): beside --parallel's, they keep workspaces' prefixes between turns.",
           static_cast<double>(m.n_resident_streams));
    scalar(out, "warmctx_stream_copies_total", "counter",
           "Prefixes copied stream to stream (device to device on a GPU) instead of through the RAM pool.",
           static_cast<double>(m.n_stream_copies));
    header(out, "warmctx_model_memory", "gauge",
           "The model's memory (plain, sliding_window, recurrent, hybrid, unsupported) and whether prefixes are "
           "reused across turns with it: always 1.");
    sample(out, "warmctx_model_memory",
           "kind=\"" + m.memory_kind + "\",reuse=\"" + (m.reuse_across_turns ? "true" : "false") + "\"", 1.0);
    scalar(out, "warmctx_checkpoint_bytes", "gauge",
           "Checkpoints the work streams hold in RAM (a sliding window's or a recurrent state at block ends).",
           static_cast<double>(m.checkpoint_bytes));
    scalar(out, "warmctx_state_scratch_bytes", "gauge",
           "Host memory allocated to move states that holds none: spare checkpoint buffers and, on a GPU, the "
           "page-locked buffer states pass through (counted in warmctx_kv_allocated_bytes).",
           static_cast<double>(m.state_scratch_bytes));
    scalar(out, "warmctx_checkpoint_max_bytes", "gauge",
           "The bound on the work streams' checkpoints in RAM (--checkpoint-budget-bytes; 0: none).",
           static_cast<double>(m.checkpoint_max_bytes));
    scalar(out, "warmctx_checkpoint_evictions_total", "counter",
           "Idle streams whose prefix went to the RAM pool and which were cleared, to keep the streams' checkpoints "
           "within their bound.",
           static_cast<double>(m.n_checkpoint_evictions));
    scalar(out, "warmctx_checkpoints_taken_total", "counter",
           "Checkpoints taken at block ends while prefilling (each a copy of the window or recurrent state; on a GPU "
           "out of the device).",
           static_cast<double>(m.n_checkpoints_taken));
    scalar(out, "warmctx_checkpoints_thinned_total", "counter",
           "Checkpoints a stream dropped past --checkpoints-per-stream or the checkpoints' byte bound (the one nearest "
           "to the one before it goes; a turn that would resume there prefills from that one).",
           static_cast<double>(m.n_checkpoints_thinned));
    scalar(out, "warmctx_checkpoint_seconds_total", "counter",
           "The engine thread's time taking checkpoints (in each turn's timings as checkpoint_ms).",
           m.checkpoint_ms / 1000.0);
    scalar(out, "warmctx_checkpoint_size_bytes", "gauge",
           "Bytes of one checkpoint of this model (0: its memory is cut back without any).",
           static_cast<double>(m.checkpoint_size_bytes));
    scalar(out, "warmctx_reuse_refused_total", "counter",
           "Turns served cold because their cached prefix could not be taken (say, no checkpoint there).",
           static_cast<double>(m.n_reuse_refused));
    scalar(out, "warmctx_branches_parked_total", "counter",
           "Blocks a turn trimmed away, kept by copying the stream into a free one.",
           static_cast<double>(m.n_branches_parked));
    scalar(out, "warmctx_deferred_writes_parked_total", "counter",
           "Deferred disk writes a turn would have made on its way, moved with their stream into a free one.",
           static_cast<double>(m.n_deferred_writes_parked));
    scalar(out, "warmctx_deferred_writes_cut_total", "counter",
           "Deferred disk writes cut to the blocks their workspace's next turn kept in place, or dropped "
           "where it cleared the stream (its own write covers what the prompts share).",
           static_cast<double>(m.n_deferred_writes_cut));
    scalar(out, "warmctx_write_throughs_overdue_total", "counter",
           "Deferred disk writes made while turns kept the engine busy, once they had waited "
           "write_through_max_delay_ms (what a crash can lose is bounded by it).",
           static_cast<double>(m.n_write_throughs_overdue));
    scalar(out, "warmctx_branches_dropped_total", "counter",
           "Blocks of low retention a turn trimmed away (history out of a window), not saved.",
           static_cast<double>(m.n_branches_dropped));
    scalar(out, "warmctx_branches_too_costly_total", "counter",
           "Blocks a turn trimmed away, not saved: the stream's copy into the pool would take longer than "
           "prefilling them again.",
           static_cast<double>(m.n_branches_too_costly));
    scalar(out, "warmctx_write_backs_ahead_total", "counter",
           "Write-backs an idle engine made ahead of a displacement (on no turn's way).",
           static_cast<double>(m.n_write_backs_ahead));
    scalar(out, "warmctx_write_back_seconds_total", "counter",
           "Time turns spent saving blocks they would overwrite into the pool, before their lookup.",
           m.write_back_ms / 1000.0);
    scalar(out, "warmctx_pool_write_backs_total", "counter",
           "Work streams' cached blocks offered to the pool before something overwrote them (lazy write-back).",
           static_cast<double>(m.n_write_backs));
}

// Pre-warms and lookups.
void render_prewarm(std::string & out, const engine_snapshot & snap) {
    const cache_counters & c = snap.counters.cache;
    const prewarm_counters & pw = snap.counters.prewarm;
    scalar(out, "warmctx_prewarms_total", "counter", "Pre-warms run to their end or stopped early.",
           static_cast<double>(pw.n_prewarms));
    scalar(out, "warmctx_prewarms_already_cached_total", "counter",
           "Pre-warms that found everything cached (did nothing).", static_cast<double>(pw.n_already_cached));
    scalar(out, "warmctx_prewarms_preempted_total", "counter",
           "Pre-warms stopped at a chunk boundary for a chat (what they did stays cached).",
           static_cast<double>(pw.n_preempted));
    scalar(out, "warmctx_prewarm_prefilled_tokens_total", "counter", "Tokens pre-warms prefilled.",
           static_cast<double>(pw.n_prefilled_tokens));
    scalar(out, "warmctx_prewarm_served_turns_total", "counter", "Turns that reused what a pre-warm left.",
           static_cast<double>(pw.n_served_turns));
    scalar(out, "warmctx_cache_lookups_total", "counter", "Prefix cache lookups.", static_cast<double>(c.n_lookups));
    scalar(out, "warmctx_cache_lookup_hits_total", "counter", "Prefix cache lookups that reused something.",
           static_cast<double>(c.n_lookup_hits));
    scalar(out, "warmctx_cache_not_admitted_tokens_total", "counter",
           "Tokens cut off inserted prefixes to fit the budget.", static_cast<double>(c.n_not_admitted_tokens));
}

}  // namespace

std::string server_metrics::render(const engine_snapshot & snap) const {
    std::string out;
    out.reserve(8192);
    {
        std::lock_guard<std::mutex> lk(mu_);
        header(out, "warmctx_requests_total", "counter", "HTTP requests finished, by route pattern and status.");
        for (const auto & [key, n] : requests_)
            sample(out, "warmctx_requests_total",
                   "route=\"" + escape_label(key.first) + "\",status=\"" + std::to_string(key.second) + "\"",
                   static_cast<double>(n));
        scalar(out, "warmctx_prompt_tokens_total", "counter", "Prompt tokens of finished completions.",
               static_cast<double>(prompt_tokens_));
        scalar(out, "warmctx_cached_tokens_total", "counter",
               "Prompt tokens whose KV was reused from the prefix cache.", static_cast<double>(cached_tokens_));
        scalar(out, "warmctx_prefilled_tokens_total", "counter", "Prompt tokens computed (not reused).",
               static_cast<double>(prefilled_tokens_));
        scalar(out, "warmctx_generated_tokens_total", "counter", "Completion tokens generated.",
               static_cast<double>(completion_tokens_));
        header(out, "warmctx_ttft_seconds", "histogram",
               "Time from receiving a completion request to its first generated token.");
        ttft_.render(out, "warmctx_ttft_seconds");
        header(out, "warmctx_request_duration_seconds", "histogram",
               "Time from receiving a request to its last byte (streams: the end of the stream).");
        duration_.render(out, "warmctx_request_duration_seconds");
        scalar(out, "warmctx_http_connections_shed_total", "counter",
               "Connections closed to give their thread to another (idle, or still sending a request).",
               static_cast<double>(shed_connections_));
    }

    render_scheduler(out, snap);

    if (snap.have_counters) {
        render_cache(out, snap);
        render_kv_memory(out, snap);
        render_prewarm(out, snap);
    }
    scalar(out, "warmctx_engine_reachable", "gauge",
           "1 when this scrape found cache counters the engine thread published (a scrape never waits on it).",
           snap.have_counters ? 1 : 0);
    return out;
}

std::string with_label(const std::string & text, const std::string & name, const std::string & value) {
    if (value.empty()) return text;
    std::string escaped;
    for (char ch : value) {
        if (ch == '\\' || ch == '"') escaped += '\\';
        if (ch == '\n') {
            escaped += "\\n";
            continue;
        }
        escaped += ch;
    }
    const std::string label = name + "=\"" + escaped + "\"";
    std::string out;
    out.reserve(text.size() + text.size() / 8);
    size_t at = 0;
    while (at < text.size()) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos) end = text.size();
        const std::string_view line(text.data() + at, end - at);
        const size_t name_end = line.find_first_of("{ ");
        if (line.empty() || line[0] == '#' || name_end == std::string_view::npos) {
            out += line;
        } else if (line[name_end] == '{') {  // name{a="b"} v: the label goes first
            out += line.substr(0, name_end + 1);
            out += label;
            if (line.size() > name_end + 1 && line[name_end + 1] != '}') out += ',';
            out += line.substr(name_end + 1);
        } else {  // name v
            out += line.substr(0, name_end);
            out += "{" + label + "}";
            out += line.substr(name_end);
        }
        if (end < text.size()) out += '\n';
        at = end + 1;
    }
    return out;
}

}  // namespace warmctx::server_detail
