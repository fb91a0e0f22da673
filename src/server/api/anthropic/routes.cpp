// The Anthropic Messages routes: POST /v1/messages (whole or streamed) and POST
// /v1/messages/count_tokens (GET /, which its clients check, is in ui/routes.cpp). A
// request mapper (anthropic.h) in front of the one completion path (completion.h) with
// the Anthropic renderer. See docs/api.md.
#include "anthropic.h"
#include "../openai/openai.h"
#include "completion.h"
#include "json_util.h"
#include "route_context.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

void respond_anthropic_error(http_response & res, request_log & log, const api_error & e) {
    respond_error_as(res, log, e, dump_json(anthropic_error_json(e)));
}

namespace {

// The body as a completion_request, with what the renderer needs to know of it.
maybe_error map_messages_request(route_context & ctx, const http_request & req, bool counting, completion_request & cr,
                                 anthropic_request_info & info) {
    json_budget::ticket held;
    json body;
    if (auto e = parse_body(ctx, req, body, held, 2)) return e;
    // count_tokens takes no max_tokens: any will do to count the prompt.
    if (counting && body.is_object() && !body.contains("max_tokens")) body["max_tokens"] = 1;
    json chat_body;
    if (auto e = anthropic_to_chat(body, req.session_id, ctx.limits.max_tokens_cap, chat_body, info)) return e;
    if (auto e = parse_completion(ctx, chat_body, body_mode::chat, cr)) {
        chat_error_to_anthropic(*e, info);
        return e;
    }
    return std::nullopt;
}

// POST /v1/messages
void messages(route_context & ctx, const http_request & req, http_response & res,
              const std::shared_ptr<request_log> & log) {
    completion_request cr;
    auto info = std::make_shared<anthropic_request_info>();
    if (auto e = map_messages_request(ctx, req, false, cr, *info)) return respond_anthropic_error(res, *log, *e);
    serve_completion(ctx, req, res, log, std::move(cr), nullptr, make_anthropic_renderer(info));
}

// POST /v1/messages/count_tokens: the prompt the request would be, tokenized here (the
// engine thread is not needed).
void count_tokens(route_context & ctx, const http_request & req, http_response & res,
                  const std::shared_ptr<request_log> & log) {
    completion_request cr;
    anthropic_request_info info;
    if (auto e = map_messages_request(ctx, req, true, cr, info)) return respond_anthropic_error(res, *log, *e);
    if (status st = validate_segments(cr.segments, ctx.opts.kinds); !st.ok())
        return respond_anthropic_error(res, *log, error_from_status(st));
    if (!ctx.sched) return respond_anthropic_error(res, *log, unavailable("the engine is stopping: no engine", 1));
    turn_request tr;
    tr.workspace = cr.workspace.empty() ? derive_workspace(cr.segments) : cr.workspace;
    tr.segments = std::move(cr.segments);
    auto prompt = ctx.sched->assemble_unchecked(tr);
    if (!prompt.ok()) return respond_anthropic_error(res, *log, error_from_status(prompt.error()));
    log->prompt_tokens = static_cast<int64_t>(prompt->tokens.size());
    send_json(res, 200, {{"input_tokens", prompt->tokens.size()}});
}


}  // namespace

void add_anthropic_routes(route_table & t, route_context & ctx) {
    route_context * c = &ctx;
    auto add = [&](const char * method, const char * pattern, bool auth, bool anthropic_errors, auto fn) {
        route r{method, pattern, pattern, auth,
                [c, fn](const http_request & req, http_response & res, const std::shared_ptr<request_log> & log) {
                    fn(*c, req, res, log);
                }};
        r.errors = anthropic_errors ? error_style::anthropic : error_style::openai;
        t.push_back(std::move(r));
    };
    add("POST", "/v1/messages", true, true, messages);
    add("POST", "/v1/messages/count_tokens", true, true, count_tokens);
}

}  // namespace warmctx::server_detail
