// The OpenAI routes: /v1/models, /v1/chat/completions, /v1/completions.
// Each completion route is a request mapper (its body -> a completion_request) in front
// of the one completion path (completion.h), with its API's renderer. See docs/api.md.
#include "completion.h"
#include "json_util.h"
#include "openai.h"
#include "route_context.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

// The chat and text completion routes, and /v1/workspaces/{id}/chat/completions.
void run_completion(route_context & ctx, const http_request & req, http_response & res,
                    const std::shared_ptr<request_log> & log, body_mode mode, const std::string * path_ws) {
    json_budget::ticket held;
    json body;
    if (auto e = parse_body(ctx, req, body, held)) return respond_error(res, *log, *e);
    completion_request cr;
    if (auto e = parse_completion(ctx, body, mode, cr)) return respond_error(res, *log, *e);
    body = json();  // what the request means is in cr now
    held.release();
    serve_completion(ctx, req, res, log, std::move(cr), path_ws, make_openai_renderer());
}

namespace {

json model_json(const route_context & c) {
    const model_info & m = c.sched->model();
    const context_info & ci = c.sched->context();
    return json{{"id", c.model_name},
                {"object", "model"},
                {"created", c.t_created},
                {"owned_by", "warmctx"},
                {"meta",
                 {{"description", m.description},
                  {"n_params", m.n_params},
                  {"size_bytes", m.size_bytes},
                  {"n_ctx_train", m.n_ctx_train},
                  {"n_ctx_seq", ci.n_ctx_seq},
                  {"n_parallel", c.sched->n_parallel()},
                  {"chunk_tokens", ci.chunk_tokens},
                  {"kv_type", ci.kv_type},
                  {"kv_mode", kv_mode_name(ci.mode)},
                  {"backend", ci.backend}}}};
}

// GET /v1/models
void list_models(route_context & c, const http_request &, http_response & res, const std::shared_ptr<request_log> &) {
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model_json(c)})}});
}

// GET /v1/models/{model}
void get_model(route_context & c, const http_request & req, http_response & res,
               const std::shared_ptr<request_log> & log) {
    const std::string & name = req.params.at(0);
    if (name != c.model_name)
        return respond_error(res, *log,
                             error_from_status(not_found("no model '" + name.substr(0, 100) +
                                                         "' (this server serves '" + c.model_name + "')"),
                                               "model"));
    send_json(res, 200, model_json(c));
}

// POST /v1/chat/completions
void chat_completions(route_context & c, const http_request & req, http_response & res,
                      const std::shared_ptr<request_log> & log) {
    run_completion(c, req, res, log, body_mode::chat, nullptr);
}

// POST /v1/completions
void text_completions(route_context & c, const http_request & req, http_response & res,
                      const std::shared_ptr<request_log> & log) {
    run_completion(c, req, res, log, body_mode::text, nullptr);
}

using handler_fn = void (*)(route_context &, const http_request &, http_response &,
                            const std::shared_ptr<request_log> &);

struct named_route {
    const char * method;
    const char * pattern;     // the metrics label
    const char * regex_text;  // what the transport matches
    handler_fn fn;
};

// In the order the transport matches them.
constexpr named_route k_openai_routes[] = {
    {"GET", "/v1/models", "/v1/models", list_models},
    {"GET", "/v1/models/{model}", "/v1/models/([^/]+)", get_model},
    {"POST", "/v1/chat/completions", "/v1/chat/completions", chat_completions},
    {"POST", "/v1/completions", "/v1/completions", text_completions},
};

}  // namespace

void add_openai_routes(route_table & t, route_context & ctx) {
    route_context * c = &ctx;
    for (const named_route & r : k_openai_routes) {
        const handler_fn fn = r.fn;
        t.push_back({r.method, r.pattern, r.regex_text, true,
                     [c, fn](const http_request & req, http_response & res, const std::shared_ptr<request_log> & log) {
                         fn(*c, req, res, log);
                     }});
    }
}

}  // namespace warmctx::server_detail
