// llama-server's routes (llama_server.h): POST /completion and /completions on the one
// completion path with the llama-server renderer; /tokenize, /detokenize and
// /apply-template through the model's tokenizer and template on the HTTP thread; GET
// /props and /slots from what the server holds. See docs/api.md.
#include "../openai/openai.h"
#include "completion.h"
#include "json_util.h"
#include "llama_server.h"
#include "request_fields.h"
#include "route_context.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

api_error stopping() { return unavailable("the engine is stopping: no engine", 1); }

// POST /completion: the body as the /v1/completions request it means, then the one path.
void completion(route_context & ctx, const http_request & req, http_response & res,
                const std::shared_ptr<request_log> & log) {
    json_budget::ticket held;
    json body;
    if (auto e = parse_body(ctx, req, body, held, 2)) return respond_error(res, *log, *e);
    json text_body;
    if (auto e = completion_to_openai(body, text_body)) return respond_error(res, *log, *e);
    completion_request cr;
    if (auto e = parse_completion(ctx, text_body, body_mode::text, cr)) return respond_error(res, *log, *e);
    body = json();
    text_body = json();
    held.release();
    serve_completion(ctx, req, res, log, std::move(cr), nullptr, make_llama_server_renderer());
}

// POST /tokenize: {"tokens": [ids]}, or with_pieces [{"id", "piece"}].
void tokenize(route_context & ctx, const http_request & req, http_response & res,
              const std::shared_ptr<request_log> & log) {
    json_budget::ticket held;
    json body;
    if (auto e = parse_body(ctx, req, body, held)) return respond_error(res, *log, *e);
    tokenize_request tr;
    if (auto e = parse_tokenize(body, tr)) return respond_error(res, *log, *e);
    if (!ctx.sched) return respond_error(res, *log, stopping());
    std::vector<token_id> ids;
    if (tr.add_special && !ctx.sched->model().bos_text.empty()) {
        auto bos = ctx.sched->tokenize(ctx.sched->model().bos_text, true);
        if (bos.ok()) ids = std::move(*bos);
    }
    auto t = ctx.sched->tokenize(tr.content, tr.parse_special);
    if (!t.ok()) return respond_error(res, *log, error_from_status(t.error(), "content"));
    ids.insert(ids.end(), t->begin(), t->end());
    log->prompt_tokens = (int64_t)ids.size();
    json out = json::array();
    for (token_id id : ids) {
        if (!tr.with_pieces) {
            out.push_back(id);
            continue;
        }
        auto piece = ctx.sched->detokenize(std::span<const token_id>(&id, 1), true);
        const std::string p = piece.ok() ? *piece : std::string();
        // A piece that is not whole UTF-8 (a byte of a longer character): its bytes, as
        // llama-server gives them.
        if (find_invalid_utf8(p) == k_utf8_valid) {
            out.push_back({{"id", id}, {"piece", p}});
        } else {
            json bytes = json::array();
            for (unsigned char ch : p) bytes.push_back((int)ch);
            out.push_back({{"id", id}, {"piece", std::move(bytes)}});
        }
    }
    send_json(res, 200, {{"tokens", std::move(out)}});
}

// POST /detokenize: {"content": text}, control tokens written as their text.
void detokenize(route_context & ctx, const http_request & req, http_response & res,
                const std::shared_ptr<request_log> & log) {
    json_budget::ticket held;
    json body;
    if (auto e = parse_body(ctx, req, body, held)) return respond_error(res, *log, *e);
    std::vector<token_id> ids;
    if (auto e = parse_detokenize(body, ids)) return respond_error(res, *log, *e);
    if (!ctx.sched) return respond_error(res, *log, stopping());
    auto text = ctx.sched->detokenize(ids, true);
    if (!text.ok()) return respond_error(res, *log, error_from_status(text.error(), "tokens"));
    send_json(res, 200, {{"content", *text}});
}

// POST /apply-template: {"prompt": text}, the prompt the model would read for these
// messages (and tools), as warmctx assembles it.
void apply_template(route_context & ctx, const http_request & req, http_response & res,
                    const std::shared_ptr<request_log> & log) {
    json_budget::ticket held;
    json body;
    if (auto e = parse_body(ctx, req, body, held)) return respond_error(res, *log, *e);
    if (!body.is_object()) return respond_error(res, *log, wrong_type("body", "an object", body));
    const json * messages = field(body, "messages");
    if (!messages) return respond_error(res, *log, bad_request("missing_field", "messages is required", "messages"));
    turn_request tr;
    if (auto e = map_messages(*messages, field(body, "tools"), tr.segments, ctx.opts.bounds))
        return respond_error(res, *log, *e);
    if (!ctx.sched) return respond_error(res, *log, stopping());
    tr.workspace = derive_workspace(tr.segments);
    auto prompt = ctx.sched->assemble_unchecked(tr);
    if (!prompt.ok()) return respond_error(res, *log, error_from_status(prompt.error(), "messages"));
    auto text = ctx.sched->detokenize(prompt->tokens, true);
    if (!text.ok()) return respond_error(res, *log, error_from_status(text.error()));
    log->prompt_tokens = (int64_t)prompt->tokens.size();
    send_json(res, 200, {{"prompt", *text}});
}

// GET /props: the model and the server's settings, in llama-server's names.
void props(route_context & ctx, const http_request &, http_response & res, const std::shared_ptr<request_log> & log) {
    if (!ctx.sched) return respond_error(res, *log, stopping());
    const model_info & m = ctx.sched->model();
    const context_info & c = ctx.sched->context();
    const int32_t n_predict = ctx.limits.default_max_tokens > 0 ? ctx.limits.default_max_tokens : -1;
    send_json(res, 200,
              {{"default_generation_settings",
                {{"n_ctx", c.n_ctx_seq},
                 {"params", {{"n_predict", n_predict}, {"temperature", 1.0}, {"top_p", 1.0}, {"top_k", 0}}}}},
               {"total_slots", ctx.sched->n_parallel()},
               {"model_alias", ctx.model_name},
               {"model_path", m.path},
               {"chat_template", m.chat_template},
               {"bos_token", m.bos_text},
               {"eos_token", m.eos_text},
               {"modalities", {{"vision", false}, {"audio", false}}},
               {"build_info", "warmctx"}});
}

// GET /slots: the jobs the engine runs now, one slot each (then the idle ones, up to
// --parallel). A slot's id numbers the jobs; it is not a work stream's.
void slots(route_context & ctx, const http_request &, http_response & res, const std::shared_ptr<request_log> & log) {
    if (!ctx.sched) return respond_error(res, *log, stopping());
    const uint32_t n_ctx = ctx.sched->context().n_ctx_seq;
    json out = json::array();
    for (const job_progress & j : ctx.sched->jobs()) {
        if (j.prewarm || j.what == job_progress::state::queued) continue;
        out.push_back({{"id", out.size()},
                       {"n_ctx", n_ctx},
                       {"is_processing", true},
                       {"state", job_state_name(j.what)},
                       {"workspace", j.workspace},
                       {"n_prompt_tokens", j.prompt_tokens},
                       {"n_prompt_tokens_cache", j.cached_tokens},
                       {"n_prompt_tokens_processed", j.prefill_pos},
                       {"n_decoded", j.generated}});
    }
    while (out.size() < ctx.sched->n_parallel())
        out.push_back({{"id", out.size()}, {"n_ctx", n_ctx}, {"is_processing", false}});
    send_json(res, 200, out);
}

}  // namespace

void add_llama_server_routes(route_table & t, route_context & ctx) {
    route_context * c = &ctx;
    auto add = [&](const char * method, const char * pattern, auto fn) {
        t.push_back({method, pattern, pattern, true,
                     [c, fn](const http_request & req, http_response & res, const std::shared_ptr<request_log> & log) {
                         fn(*c, req, res, log);
                     }});
    };
    add("POST", "/completion", completion);
    add("POST", "/completions", completion);
    add("POST", "/tokenize", tokenize);
    add("POST", "/detokenize", detokenize);
    add("POST", "/apply-template", apply_template);
    add("GET", "/props", props);
    add("GET", "/slots", slots);
}

}  // namespace warmctx::server_detail
