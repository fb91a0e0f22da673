// The page and its data (ui.h): GET /, HEAD /, GET /ui and GET /v1/status.
#include <chrono>

#include "json_util.h"
#include "route_context.h"
#include "ui.h"
#include "server/explain_format.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

bool wants_html(const http_request & req) { return req.accept.find("text/html") != std::string::npos; }

void send_page(http_response & res) {
    res.status = 200;
    res.content_type = "text/html; charset=utf-8";
    res.headers.emplace_back("Cache-Control", "no-cache");
    // The page runs its own script and fetches from this server only.
    res.headers.emplace_back("Content-Security-Policy",
                             "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                             "connect-src 'self'; img-src 'self' data:");
    res.body = std::string(ui_page_html());
}

// GET / (and HEAD /): the page for a browser; the server is there, for any other client.
void root(route_context & ctx, const http_request & req, http_response & res, const std::shared_ptr<request_log> &) {
    if (wants_html(req)) return send_page(res);
    send_json(res, 200, {{"status", "ok"}, {"service", "warmctx"}, {"model", ctx.model_name}});
}

void page(route_context &, const http_request &, http_response & res, const std::shared_ptr<request_log> &) {
    send_page(res);
}

json phases_json(const answer_report & r) {
    // Where the client's wait went, in the order it happened: the HTTP thread's work, the
    // queue, the engine's (lookup, restore, copy, prefill, write-back), then the decode.
    const double engine_before =
        r.t_lookup_ms + r.t_restore_ms + r.t_copy_ms + r.t_prefill_ms + r.t_checkpoint_ms + r.t_write_back_ms;
    return {{"request", r.rt.request_ms},
            {"queue", r.t_queue_ms},
            {"lookup", r.t_lookup_ms},
            {"restore", r.t_restore_ms},
            {"copy", r.t_copy_ms},
            {"prefill", r.t_prefill_ms},
            {"checkpoint", r.t_checkpoint_ms},
            {"write_back", r.t_write_back_ms},
            {"first_token_other", std::max(0.0, r.t_first_token_ms - r.t_queue_ms - engine_before)},
            {"decode", std::max(0.0, r.t_total_ms - r.t_first_token_ms)}};
}

json turn_json(const turn_record & t) {
    const explain_report & ex = t.report.explain;
    return {{"unix_ms", t.unix_ms},
            {"workspace", t.report.workspace},
            {"result", reuse_result(ex)},
            {"miss", miss_kind_name(ex.kind)},
            {"tier", kv_tier_name(ex.tier)},
            {"in_place", ex.in_place},
            {"reason", ex.reason},
            {"missed_segment", ex.missed_segment},
            {"prompt_tokens", t.usage.prompt_tokens},
            {"reused", ex.n_reused},
            {"prefilled", ex.n_prefilled},
            {"generated", t.usage.completion_tokens},
            {"ttft_ms", t.report.rt.request_ms + t.report.t_first_token_ms},
            {"total_ms", t.report.rt.request_ms + t.report.t_total_ms},
            {"phases_ms", phases_json(t.report)}};
}

json memory_json(const kv_memory & m, const tier_counters & t) {
    return {{"kind", m.memory_kind},
            {"reuse_across_turns", m.reuse_across_turns},
            {"streams_on_device", m.streams_on_device},
            {"streams", m.n_streams},
            {"resident_streams", m.n_resident_streams},
            {"streams_allocated_bytes", m.streams_allocated_bytes},
            {"streams_used_bytes", m.streams_used_bytes},
            {"pool_bytes", m.pool_bytes},
            {"pool_allocated_bytes", m.pool_allocated_bytes},
            {"pool_entries", m.pool_entries},
            {"checkpoint_bytes", m.checkpoint_bytes},
            {"disk_bytes", t.disk_bytes},
            {"disk_files", t.disk_files}};
}

// GET /v1/status: the model, memory by tier, each workspace's counts (and its stored
// segments), the last turns and the jobs running. Reads what the engine thread last
// published: never waits for a prefill.
void status_route(route_context & ctx, const http_request &, http_response & res,
                  const std::shared_ptr<request_log> & log) {
    if (!ctx.sched) return respond_error(res, *log, unavailable("the engine is stopping: no engine", 1));
    const context_info & c = ctx.sched->context();
    json out = {{"model",
                 {{"name", ctx.model_name},
                  {"description", ctx.sched->model().description},
                  {"n_ctx", c.n_ctx_seq},
                  {"backend", c.backend},
                  {"parallel", ctx.sched->n_parallel()}}},
                {"unix_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count()}};
    json workspaces = json::object();
    if (auto pc = ctx.sched->published_counters()) {
        out["memory"] = memory_json(pc->memory, pc->tiers);
        out["totals"] = {{"turns", pc->total.n_turns},
                         {"prompt_tokens", pc->total.n_prompt_tokens},
                         {"reused", pc->total.n_reused_tokens},
                         {"prefilled", pc->total.n_prefilled_tokens},
                         {"generated", pc->total.n_generated_tokens}};
        for (const auto & [ws, w] : pc->workspaces)
            workspaces[ws] = {{"turns", w.n_turns},
                              {"prompt_tokens", w.n_prompt_tokens},
                              {"reused", w.n_reused_tokens},
                              {"prefilled", w.n_prefilled_tokens},
                              {"misses", w.misses_by_kind},
                              {"held_in", w.held_in.empty() ? "unknown" : w.held_in},
                              {"held_tokens", w.n_held_tokens}};
    }
    for (const std::string & ws : ctx.store.workspaces()) {
        json segs = json::array();
        if (auto list = ctx.store.list(ws))
            for (const segment & s : *list)
                segs.push_back({{"id", s.id}, {"kind", segment_kind_name(s.kind)}, {"bytes", s.content.size()}});
        workspaces[ws]["segments"] = std::move(segs);
    }
    json turns = json::array();
    for (const turn_record & t : ctx.turns.last()) {
        turns.push_back(turn_json(t));
        workspaces[t.report.workspace]["last"] = turns.back();
    }
    json jobs = json::array();
    for (const job_progress & j : ctx.sched->jobs())
        if (!j.prewarm)
            jobs.push_back({{"workspace", j.workspace},
                            {"state", job_state_name(j.what)},
                            {"prompt_tokens", j.prompt_tokens},
                            {"cached_tokens", j.cached_tokens},
                            {"prefill_pos", j.prefill_pos},
                            {"generated", j.generated}});
    out["workspaces"] = std::move(workspaces);
    out["turns"] = std::move(turns);
    out["jobs"] = std::move(jobs);
    send_json(res, 200, out);
}

}  // namespace

void add_ui_routes(route_table & t, route_context & ctx) {
    route_context * c = &ctx;
    auto add = [&](const char * method, const char * pattern, bool auth, auto fn) {
        t.push_back({method, pattern, pattern, auth,
                     [c, fn](const http_request & req, http_response & res, const std::shared_ptr<request_log> & log) {
                         fn(*c, req, res, log);
                     }});
    };
    add("GET", "/", false, root);
    add("GET", "/ui", false, page);
    add("GET", "/v1/status", true, status_route);
}

}  // namespace warmctx::server_detail
