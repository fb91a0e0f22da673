// The workspace routes, /v1/workspaces/...: the server-side segment store, the
// manifest and explain of the stored context, pins, the tiers (snapshot, suspend,
// resume, branch) and chat on the stored segments. See docs/api.md.
//
// Every route is registered through add_route below: it validates the path's {id}
// (and {segment}), names the workspace in the request's record and turns the body's
// reply - a JSON body, an api_error, or a failed status (error_from_status, the one
// table) - into the response. A route's body is only its own logic.
#include <optional>
#include <span>

#include "json_util.h"
#include "route_context.h"
#include "segments_json.h"
#include "warmctx/assembler.h"
#include "server/explain_format.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

// What a route's body answers.
class reply {
  public:
    reply(int http_status, json body) : http_status_(http_status), body_(std::move(body)) {}
    reply(api_error e) : error_(std::move(e)) {}                 // NOLINT(google-explicit-constructor)
    reply(const status & st) : error_(error_from_status(st)) {}  // NOLINT: REQUIRES !st.ok()
    // The body wrote the response itself (a completion: JSON or a stream).
    static reply written() {
        reply r(0, json());
        r.written_ = true;
        return r;
    }

    void apply(http_response & res, request_log & log) const {
        if (written_) return;
        if (error_) return respond_error(res, log, *error_);
        send_json(res, http_status_, body_);
    }

  private:
    int http_status_ = 0;
    json body_;
    maybe_error error_;
    bool written_ = false;
};

// One call of a workspace route, its path already validated.
struct ws_call {
    const http_request & req;
    http_response & res;
    const std::shared_ptr<request_log> & log;
    std::string ws;       // the path's {id}
    std::string segment;  // the path's {segment} (routes that have one)
};

// The path's workspace id: 1..64 chars of [A-Za-z0-9._-], not starting with '.'.
maybe_error path_workspace(const std::string & param, std::string & ws) {
    ws = param;
    return validate_workspace_id(ws, "path");
}

// The path's segment id (the rest of the path; it may contain '/').
maybe_error path_segment(const std::string & param, std::string & id) {
    id = param;
    if (size_t bad = find_invalid_utf8(id); bad != k_utf8_valid)
        return bad_request("invalid_segment_id", "segment id is not valid UTF-8", "path");
    if (status st = validate_segment_id(id); !st.ok()) return bad_request("invalid_segment_id", st.message(), "path");
    return std::nullopt;
}

// Registers `pattern` ({id} matches one path component, {segment} the rest of the path).
void add_route(route_table & t, const char * method, const std::string & pattern,
               std::function<reply(ws_call &)> body) {
    std::string regex = pattern;
    const size_t at_id = regex.find("{id}");
    if (at_id != std::string::npos) regex.replace(at_id, 4, "([^/]+)");
    const size_t at_seg = regex.find("{segment}");
    if (at_seg != std::string::npos) regex.replace(at_seg, 9, "(.+)");
    const bool has_id = at_id != std::string::npos, has_segment = at_seg != std::string::npos;
    t.push_back({method, pattern, regex, true,
                 [has_id, has_segment, body = std::move(body)](const http_request & req, http_response & res,
                                                                const std::shared_ptr<request_log> & log) {
                     ws_call c{req, res, log, {}, {}};
                     if (has_id) {
                         if (auto e = path_workspace(req.params.at(0), c.ws)) return respond_error(res, *log, *e);
                         log->workspace = c.ws;
                     }
                     if (has_segment)
                         if (auto e = path_segment(req.params.at(1), c.segment)) return respond_error(res, *log, *e);
                     body(c).apply(res, *log);
                 }});
}

result<std::vector<segment>> stored_segments(route_context & ctx, const std::string & ws) {
    auto segs = ctx.store.list(ws);
    if (!segs) return not_found("workspace '" + ws + "' has no stored segments");
    return std::move(*segs);
}

status no_segment(const std::string & ws, const std::string & id) {
    return not_found("no segment '" + id + "' in workspace '" + ws + "'");
}

// Tiers: snapshot now, suspend (snapshot + drop from the engine), resume.
struct tier_op {
    const char * route;
    const char * name;
    status (context_engine::*fn)(const std::string &);
};
constexpr tier_op k_tier_ops[] = {
    {"/v1/workspaces/{id}/snapshot", "snapshot", &context_engine::snapshot_workspace},
    {"/v1/workspaces/{id}/suspend", "suspend", &context_engine::suspend_workspace},
    {"/v1/workspaces/{id}/resume", "resume", &context_engine::resume_workspace},
};

// A segment whose change starts a pre-warm: stable context (class high or highest).
bool is_stable(const route_context & c, const segment & s) {
    return c.opts.kinds.policy(s.kind).retention >= retention_class::high;
}

// The workspace's queued and running jobs: state, queue position, prefill progress.
json jobs_json(const route_context & c, const std::string & ws) {
    json out = json::array();
    if (!c.sched) return out;
    for (const job_progress & p : c.sched->jobs()) {
        if (p.workspace != ws) continue;
        json j = {{"type", p.prewarm ? "prewarm" : "chat"}, {"state", job_state_name(p.what)}, {"age_ms", p.age_ms}};
        if (p.what == job_progress::state::queued) {
            j["queue_position"] = p.queue_position;
        } else {
            j["prompt_tokens"] = p.prompt_tokens;
            j["tokens_cached"] = p.cached_tokens;
            j["tokens_in_sequence"] = p.prefill_pos;
            j["tokens_generated"] = p.generated;
        }
        out.push_back(std::move(j));
    }
    return out;
}

// PUT /v1/workspaces/{id}/segments/{segment}: stores a segment; a change of a stable one
// starts a pre-warm.
reply put_segment(route_context * c, ws_call & call) {
    json_budget::ticket held;
    json body;
    if (auto e = parse_body(*c, call.req, body, held)) return *e;
    segment seg;
    if (auto e = parse_segment_body(body, call.segment, "", seg)) return *e;
    canonicalize_stored_tools(seg);
    if (seg.kind == segment_kind::user)
        return bad_request("invalid_kind",
                           "a stored segment cannot be of kind user (this turn's question travels with the chat "
                           "request)",
                           "kind");
    if (status st = validate_segments(std::span<const segment>(&seg, 1), c->opts.kinds); !st.ok()) return st;
    bool created = false;
    json summary = {{"workspace", call.ws},
                    {"id", seg.id},
                    {"kind", segment_kind_name(seg.kind)},
                    {"content_bytes", seg.content.size()}};
    bool changed = false;
    const bool stable = is_stable(*c, seg);
    if (auto e = c->store.put(call.ws, std::move(seg), created, &changed)) return *e;
    if (changed && stable && c->prewarm) c->prewarm->mark(call.ws);
    summary["created"] = created;
    summary["changed"] = changed;
    summary["prewarm"] = changed && stable && c->prewarm != nullptr;
    return {created ? 201 : 200, std::move(summary)};
}

// A turn of the workspace's stored segments (its cache salt included).
result<turn_request> stored_turn(route_context & c, const std::string & ws) {
    auto segs = stored_segments(c, ws);
    if (!segs.ok()) return segs.error();
    turn_request tr;
    tr.workspace = ws;
    tr.cache_salt = c.cache_salt(ws, "");
    tr.segments = std::move(*segs);
    return tr;
}

// GET /v1/workspaces/{id}/manifest: the stored context assembled (no engine needed).
reply get_manifest(route_context * c, ws_call & call) {
    auto stored = stored_turn(*c, call.ws);
    if (!stored.ok()) return stored.error();
    turn_request tr = std::move(*stored);
    tr.add_generation_prompt = false;  // the stored context itself
    // Assembled here: the engine thread is not needed (nor waited for).
    if (!c->sched) return unavailable("the engine is stopping: no engine", 1);
    auto r = c->sched->assemble_unchecked(tr);  // a manifest need not fit a sequence
    if (!r.ok()) return r.error();
    json j = r->prompt_manifest.to_json();
    j["workspace"] = call.ws;
    return {200, std::move(j)};
}

// GET /v1/workspaces/{id}/explain[?question=]: what the next turn would reuse, and the
// workspace's jobs.
reply get_explain(route_context * c, ws_call & call) {
    auto stored = stored_turn(*c, call.ws);
    if (!stored.ok()) return stored.error();
    turn_request tr = std::move(*stored);
    if (auto q = call.req.query.find("question"); q != call.req.query.end()) {
        if (find_invalid_utf8(q->second) != k_utf8_valid)
            return bad_request("invalid_utf8", "question is not valid UTF-8", "question");
        if (!q->second.empty()) tr.segments.push_back(segment{"user", segment_kind::user, "", "", q->second});
    }
    // Tokenized here, not on the engine thread, which only looks the blocks up.
    if (c->sched) {
        auto prompt = c->sched->assemble_unchecked(tr);
        if (!prompt.ok()) return prompt.error();
        tr.assembled = std::make_shared<const assembled_prompt>(std::move(*prompt));
    }
    std::optional<result<explain_report>> r;
    if (auto e = c->engine_call([&](context_engine & ce) { r.emplace(ce.explain(tr)); })) return *e;
    if (!r->ok()) return r->error();
    json j = explain_json(**r);
    j["jobs"] = jobs_json(*c, call.ws);
    return {200, std::move(j)};
}

// POST /v1/workspaces/{id}/branch {"to": id}: a new workspace from this one's last turn
// and stored segments.
reply branch_workspace(route_context * c, ws_call & call) {
    json_budget::ticket held;
    json body;
    if (auto e = parse_body(*c, call.req, body, held)) return *e;
    if (!body.is_object() || !body.contains("to") || !body["to"].is_string())
        return bad_request("invalid_request", "body must be {\"to\": \"<workspace id>\"}", "to");
    const std::string to = body["to"].get<std::string>();
    if (auto e = validate_workspace_id(to, "to")) return *e;
    status st;
    if (auto e = c->engine_call([&](context_engine & ce) { st = ce.branch_workspace(call.ws, to); })) return *e;
    if (!st.ok()) return st;
    if (auto segs = c->store.list(call.ws)) {
        for (auto & sg : *segs) {
            bool created = false;
            if (auto e = c->store.put(to, sg, created)) return *e;
        }
    }
    return {200, {{"workspace", call.ws}, {"branch", to}}};
}

}  // namespace

void add_workspace_routes(route_table & t, route_context & ctx) {
    route_context * c = &ctx;

    add_route(t, "GET", "/v1/workspaces", [c](ws_call &) -> reply {
        json data = json::array();
        for (const std::string & ws : c->store.workspaces()) data.push_back({{"id", ws}, {"object", "workspace"}});
        return {200, {{"object", "list"}, {"data", std::move(data)}}};
    });
    add_route(t, "GET", "/v1/workspaces/{id}", [c](ws_call & call) -> reply {
        auto segs = stored_segments(*c, call.ws);
        if (!segs.ok()) return segs.error();
        json ids = json::array();
        size_t bytes = 0;
        for (const segment & s : *segs) {
            ids.push_back(s.id);
            bytes += s.content.size();
        }
        return {200,
                {{"id", call.ws}, {"object", "workspace"}, {"segments", std::move(ids)}, {"content_bytes", bytes}}};
    });
    add_route(t, "DELETE", "/v1/workspaces/{id}", [c](ws_call & call) -> reply {
        auto dropped = c->store.drop(call.ws);
        if (!dropped.ok()) return store_write_error(dropped.error());
        const size_t n = *dropped;
        c->forget_carried(call.ws);
        if (auto e = c->engine_call([&](context_engine & ce) { ce.drop_workspace(call.ws); })) return *e;
        return {200, {{"id", call.ws}, {"object", "workspace"}, {"deleted", true}, {"segments_deleted", n}}};
    });
    add_route(t, "GET", "/v1/workspaces/{id}/segments", [c](ws_call & call) -> reply {
        auto segs = stored_segments(*c, call.ws);
        if (!segs.ok()) return segs.error();
        json data = json::array();
        for (const segment & s : *segs) data.push_back(segment_json(s));
        return {200, {{"object", "list"}, {"workspace", call.ws}, {"data", std::move(data)}}};
    });
    add_route(t, "PUT", "/v1/workspaces/{id}/segments/{segment}", [c](ws_call & call) { return put_segment(c, call); });
    add_route(t, "GET", "/v1/workspaces/{id}/segments/{segment}", [c](ws_call & call) -> reply {
        auto seg = c->store.get(call.ws, call.segment);
        if (!seg) return no_segment(call.ws, call.segment);
        json j = segment_json(*seg);
        j["workspace"] = call.ws;
        return {200, std::move(j)};
    });
    add_route(t, "DELETE", "/v1/workspaces/{id}/segments/{segment}", [c](ws_call & call) -> reply {
        auto old = c->store.get(call.ws, call.segment);
        auto erased = c->store.erase(call.ws, call.segment);
        if (!erased.ok()) return store_write_error(erased.error());
        if (!*erased) return no_segment(call.ws, call.segment);
        if (old && is_stable(*c, *old) && c->prewarm) c->prewarm->mark(call.ws);
        return {200, {{"workspace", call.ws}, {"id", call.segment}, {"deleted", true}}};
    });
    add_route(t, "GET", "/v1/workspaces/{id}/manifest", [c](ws_call & call) { return get_manifest(c, call); });
    add_route(t, "GET", "/v1/workspaces/{id}/explain", [c](ws_call & call) { return get_explain(c, call); });
    // Pre-warm the stored context now (lowest priority; a chat preempts it).
    add_route(t, "POST", "/v1/workspaces/{id}/prewarm", [c](ws_call & call) -> reply {
        auto segs = stored_segments(*c, call.ws);
        if (!segs.ok()) return segs.error();
        if (!c->prewarm) return failed_precondition("pre-warm is off (serve --no-prewarm)");
        c->prewarm->mark(call.ws, true);
        return {202, {{"workspace", call.ws}, {"prewarm", "queued"}}};
    });
    for (bool pin : {true, false}) {
        add_route(t, "POST", pin ? "/v1/workspaces/{id}/pin" : "/v1/workspaces/{id}/unpin",
                  [c, pin](ws_call & call) -> reply {
                      status st;
                      if (auto e = c->engine_call([&](context_engine & ce) { st = ce.pin_workspace(call.ws, pin); }))
                          return *e;
                      if (!st.ok()) return st;
                      return {200, {{"workspace", call.ws}, {"pinned", pin}}};
                  });
    }
    for (const tier_op & op : k_tier_ops) {
        add_route(t, "POST", op.route, [c, &op](ws_call & call) -> reply {
            status st;
            if (auto e = c->engine_call([&](context_engine & ce) { st = (ce.*op.fn)(call.ws); })) return *e;
            if (!st.ok()) return st;
            return {200, {{"workspace", call.ws}, {"done", op.name}}};
        });
    }
    add_route(t, "POST", "/v1/workspaces/{id}/branch", [c](ws_call & call) { return branch_workspace(c, call); });
    add_route(t, "POST", "/v1/workspaces/{id}/chat/completions", [c](ws_call & call) -> reply {
        run_completion(*c, call.req, call.res, call.log, body_mode::workspace_chat, &call.ws);
        return reply::written();
    });
}

}  // namespace warmctx::server_detail
