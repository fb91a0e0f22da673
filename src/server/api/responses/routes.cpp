// The Responses route: POST /v1/responses. A request mapper (responses.h: the body as the
// chat request it means) in front of the one completion path (completion.h) with the
// Responses renderer. See docs/api.md.
#include "completion.h"
#include "json_util.h"
#include "api/openai/openai.h"
#include "responses.h"
#include "route_context.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

// POST /v1/responses: the body is mapped to the chat request it means (responses.h; the
// chat parser validates it, so both routes accept and refuse alike), and answered in
// the Responses shapes.
void run_responses(route_context & ctx, const http_request & req, http_response & res,
                   const std::shared_ptr<request_log> & log) {
    json_budget::ticket held;
    json body;
    if (auto e = parse_body(ctx, req, body, held, 2)) return respond_error(res, *log, *e);
    json chat_body;
    auto info = std::make_shared<responses_request_info>();
    if (auto e = responses_to_chat(body, chat_body, *info)) return respond_error(res, *log, *e);
    info->model = ctx.model_name;  // the served model, as the chat routes name it
    completion_request cr;
    if (auto e = parse_completion(ctx, chat_body, body_mode::chat, cr)) {
        chat_error_to_responses(*e, *info);
        return respond_error(res, *log, *e);
    }
    body = json();
    chat_body = json();
    held.release();
    serve_completion(ctx, req, res, log, std::move(cr), nullptr, make_responses_renderer(info));
}

}  // namespace

void add_responses_routes(route_table & t, route_context & ctx) {
    route_context * c = &ctx;
    t.push_back({"POST", "/v1/responses", "/v1/responses", true,
                 [c](const http_request & req, http_response & res, const std::shared_ptr<request_log> & log) {
                     run_responses(*c, req, res, log);
                 }});
}

}  // namespace warmctx::server_detail
