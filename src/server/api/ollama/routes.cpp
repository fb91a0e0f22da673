// The Ollama routes (ollama.h): POST /api/chat and /api/generate on the one completion path
// with the Ollama renderer; GET /api/tags, /api/ps, /api/version and POST /api/show from
// what the server holds. See docs/api.md, "The Ollama API".
#include <sys/stat.h>

#include "completion.h"
#include "json_util.h"
#include "ollama.h"
#include "request_fields.h"
#include "route_context.h"
#include "warmctx/hash.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

void respond_ollama_error(http_response & res, request_log & log, const api_error & e) {
    respond_error_as(res, log, e, dump_json(ollama_error_json(e)));
}

namespace {

// The Ollama release whose API shapes these routes follow (/api/version).
constexpr const char * k_ollama_api_version = "0.12.0";

api_error stopping() { return unavailable("the engine is stopping: no engine", 1); }

// Ollama names carry a tag: the model is "<name>:latest" to its clients, and answers to
// either spelling.
std::string tagged(const std::string & name) { return name.find(':') == std::string::npos ? name + ":latest" : name; }
bool names_the_model(const route_context & ctx, const std::string & name) {
    return name == ctx.model_name || name == tagged(ctx.model_name);
}

// The model file's size and time, and a digest of what identifies it (its path, size and
// time: hashing gigabytes to list a model would take minutes).
struct model_file {
    int64_t size = 0;
    int64_t mtime = 0;
    std::string digest;
};
model_file file_of(const model_info & m) {
    model_file f;
    struct stat st {};
    if (::stat(m.path.c_str(), &st) == 0) f.size = st.st_size, f.mtime = st.st_mtime;
    f.digest = hash_string(m.path + "\n" + std::to_string(f.size) + "\n" + std::to_string(f.mtime)).hex();
    return f;
}

json model_entry(const route_context & ctx) {
    const model_info & m = ctx.sched->model();
    const model_file f = file_of(m);
    return {{"name", tagged(ctx.model_name)},
            {"model", tagged(ctx.model_name)},
            {"modified_at", ollama_time(f.mtime)},
            {"size", f.size},
            {"digest", f.digest},
            {"details", ollama_model_details(m)}};
}

// POST /api/chat and /api/generate: the body as the OpenAI request it means, then the one path.
void complete(route_context & ctx, const http_request & req, http_response & res,
              const std::shared_ptr<request_log> & log, bool generate) {
    json_budget::ticket held;
    json body;
    if (auto e = parse_body(ctx, req, body, held, 2)) return respond_ollama_error(res, *log, *e);
    ollama_request_info info;
    json openai_body;
    body_mode mode = body_mode::chat;
    bool load_only = false;
    maybe_error e = generate ? ollama_generate_to_openai(body, openai_body, mode, load_only, info)
                             : ollama_chat_to_openai(body, openai_body, load_only, info);
    if (e) return respond_ollama_error(res, *log, *e);
    if (load_only) {  // nothing to generate: the model is loaded (it always is)
        json out = {{"model", info.model.empty() ? tagged(ctx.model_name) : info.model},
                    {"created_at", ollama_time_now()}};
        if (generate) out["response"] = "";
        else out["message"] = {{"role", "assistant"}, {"content", ""}};
        out["done"] = true;
        out["done_reason"] = "load";
        return send_json(res, 200, out);
    }
    completion_request cr;
    if (auto pe = parse_completion(ctx, openai_body, mode, cr)) {
        openai_error_to_ollama(*pe);
        return respond_ollama_error(res, *log, *pe);
    }
    body = json();
    openai_body = json();
    held.release();
    serve_completion(ctx, req, res, log, std::move(cr), nullptr, make_ollama_renderer(std::move(info)));
}

void chat(route_context & ctx, const http_request & req, http_response & res,
          const std::shared_ptr<request_log> & log) {
    complete(ctx, req, res, log, false);
}
void generate(route_context & ctx, const http_request & req, http_response & res,
              const std::shared_ptr<request_log> & log) {
    complete(ctx, req, res, log, true);
}

// GET /api/tags: the one model served.
void tags(route_context & ctx, const http_request &, http_response & res, const std::shared_ptr<request_log> & log) {
    if (!ctx.sched) return respond_ollama_error(res, *log, stopping());
    send_json(res, 200, {{"models", json::array({model_entry(ctx)})}});
}

// GET /api/ps: the model as loaded: what it holds in memory (its weights and every KV
// stream the context allocated), on the GPU when its layers are there; never unloaded.
void ps(route_context & ctx, const http_request &, http_response & res, const std::shared_ptr<request_log> & log) {
    if (!ctx.sched) return respond_ollama_error(res, *log, stopping());
    const model_info & m = ctx.sched->model();
    const context_info & c = ctx.sched->context();
    json e = model_entry(ctx);
    const int64_t size = static_cast<int64_t>(m.size_bytes + c.kv_streams_bytes);
    e["size"] = size;
    e["size_vram"] = c.n_gpu_layers > 0 ? size : 0;
    e["expires_at"] = "2318-08-01T00:00:00Z";  // Ollama's "never" (keep_alive -1)
    e["context_length"] = c.n_ctx_seq;
    send_json(res, 200, {{"models", json::array({std::move(e)})}});
}

// POST /api/show {"model"}: the model's details, template and metadata.
void show(route_context & ctx, const http_request & req, http_response & res,
          const std::shared_ptr<request_log> & log) {
    json_budget::ticket held;
    json body;
    if (auto e = parse_body(ctx, req, body, held)) return respond_ollama_error(res, *log, *e);
    std::optional<std::string> name;
    if (auto e = get_string(body, "model", "model", name)) return respond_ollama_error(res, *log, *e);
    if (!name) {  // older clients send "name"
        if (auto e = get_string(body, "name", "name", name)) return respond_ollama_error(res, *log, *e);
    }
    if (!name) return respond_ollama_error(res, *log, bad_request("missing_field", "model is required", "model"));
    if (!ctx.sched) return respond_ollama_error(res, *log, stopping());
    if (!names_the_model(ctx, *name))
        return respond_ollama_error(
            res, *log,
            error_from_status(not_found("model '" + name->substr(0, 100) + "' not found (this server serves '" +
                                        tagged(ctx.model_name) + "')")));
    const model_info & m = ctx.sched->model();
    const std::string & a = m.architecture;
    json capabilities = json::array({"completion"});
    const chat_templates * ct = ctx.sched->chat_template();
    if (ct && ct->source().find("tools") != std::string::npos) capabilities.push_back("tools");
    if (ct && ct->reasons()) capabilities.push_back("thinking");
    send_json(res, 200,
              {{"license", ""},
               {"modelfile", ""},
               {"parameters", ""},
               {"template", m.chat_template},
               {"details", ollama_model_details(m)},
               {"model_info",
                {{"general.architecture", a},
                 {"general.parameter_count", m.n_params},
                 {a + ".context_length", m.n_ctx_train},
                 {a + ".embedding_length", m.n_embd},
                 {a + ".block_count", m.n_layer},
                 {a + ".attention.head_count", m.n_head},
                 {"tokenizer.ggml.vocab_size", m.n_vocab}}},
               {"capabilities", std::move(capabilities)},
               {"modified_at", ollama_time(file_of(m).mtime)}});
}

// GET /api/version.
void version(route_context &, const http_request &, http_response & res, const std::shared_ptr<request_log> &) {
    send_json(res, 200, {{"version", k_ollama_api_version}});
}

}  // namespace

void add_ollama_routes(route_table & t, route_context & ctx) {
    route_context * c = &ctx;
    auto add = [&](const char * method, const char * pattern, auto fn) {
        route r{method, pattern, pattern, true,
                [c, fn](const http_request & req, http_response & res, const std::shared_ptr<request_log> & log) {
                    fn(*c, req, res, log);
                }};
        r.errors = error_style::ollama;
        t.push_back(std::move(r));
    };
    add("POST", "/api/chat", chat);
    add("POST", "/api/generate", generate);
    add("GET", "/api/tags", tags);
    add("GET", "/api/ps", ps);
    add("POST", "/api/show", show);
    add("GET", "/api/version", version);
}

}  // namespace warmctx::server_detail
