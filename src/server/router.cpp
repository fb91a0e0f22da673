// The transport without the socket: route table, auth, dispatch, unmatched requests.
// (route_context, the shared plumbing and the per-request record: route_context.cpp.)
#include "router.h"
#include "store/snapshot_store.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>

#include "json_util.h"
#include "util/clock.h"
#include "warmctx/fs.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

// Compares without an early exit, so the time taken does not tell how many leading
// bytes of a guessed key were right.
bool constant_time_equal(std::string_view a, std::string_view b) {
    volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
    const size_t n = std::max(a.size(), b.size());
    for (size_t i = 0; i < n; ++i) {
        unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff = diff | static_cast<unsigned char>(x ^ y);
    }
    return diff == 0;
}

}  // namespace

// ---- answering -----------------------------------------------------------------------------

std::string http_response::header(std::string_view name) const {
    for (const auto & [k, v] : headers)
        if (k == name) return v;
    return {};
}

void send_json(http_response & res, int http_status, const json & j) {
    res.status = http_status;
    res.content_type = "application/json";
    res.body = dump_json(j);
}

void respond_error_as(http_response & res, request_log & log, const api_error & e, std::string body) {
    res.status = e.http_status;
    if (e.retry_after_s > 0) res.headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
    res.content_type = "application/json";
    res.body = std::move(body);
    log.error_code = e.code;
}

void respond_error(http_response & res, request_log & log, const api_error & e) {
    respond_error_as(res, log, e, e.body());
}

maybe_error parse_body(route_context & ctx, const http_request & req, json & out, json_budget::ticket & held,
                       unsigned copies) {
    const uint64_t one = json_parsed_bytes_estimate(req.body), need = one * std::max(copies, 1u);
    auto mib = [](uint64_t b) { return std::to_string((b + (1u << 20) - 1) >> 20) + " MiB"; };
    // A text nested too deep is refused below before anything is built (400, which says
    // why better than a size would): its depth is counted only where a size refuses it.
    auto refusable = [&] { return json_nesting_depth(req.body) <= k_max_json_depth; };
    if (one > ctx.opts.max_body_json_bytes && refusable())
        return payload_too_large("request body would take about " + mib(one) + " as parsed JSON (" +
                                 std::to_string(req.body.size()) + " bytes of text); at most " +
                                 mib(ctx.opts.max_body_json_bytes));
    if (one <= ctx.opts.max_body_json_bytes && !ctx.json_memory.take(need, held) && refusable())
        return unavailable("the server is reading other large request bodies (" + mib(ctx.json_memory.used()) +
                               " of " + mib(ctx.json_memory.limit()) + " as parsed JSON); retry",
                           1);
    json_error why = json_error::none;
    auto parsed = parse_json(req.body, json_read_options{}, &why);
    if (!parsed.ok()) {
        // parse_json's messages name the check: "not valid UTF-8 (byte offset 3)",
        // "nests arrays/objects deeper than 100 levels", "not valid JSON: ...".
        const std::string m = parsed.error().message();  // error() is a copy
        const std::string message = (m.rfind("not ", 0) == 0 ? "request body is " : "request body ") + m;
        return bad_request(why == json_error::invalid_utf8 ? "invalid_utf8" : "invalid_json", message);
    }
    out = std::move(*parsed);
    return std::nullopt;
}

// ---- the router ----------------------------------------------------------------------------

bool authorized(const std::string & h, const std::string & api_key) {
    if (api_key.empty()) return true;
    constexpr std::string_view scheme = "bearer ";
    if (h.size() < scheme.size()) return false;
    for (size_t i = 0; i < scheme.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(h[i])) != scheme[i]) return false;
    std::string_view key = std::string_view(h).substr(scheme.size());
    while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
    return constant_time_equal(key, api_key);
}

router::router(route_context & ctx) : ctx_(ctx) {
    route_context * c = &ctx_;
    routes_.push_back({"GET", "/health", "/health", false, [c](const http_request &, http_response & res, auto &) {
                           if (c->stopping.load()) {
                               send_json(res, 503, {{"status", "stopping"}});
                           } else if (c->loading()) {
                               send_json(res, 503, {{"status", "loading"}});
                               res.headers.emplace_back("Retry-After", "1");
                           } else {
                               nlohmann::json j = {{"status", "ok"}};
                               if (c->sched) {
                                   // What the model's memory lets warmctx reuse (engine.h, memory_kind).
                                   const memory_info & mi = c->sched->context().memory;
                                   j["memory"] = {{"kind", memory_kind_name(mi.kind)}, {"reuse", mi.reuse},
                                                  {"checkpoint_bytes", mi.checkpoint_bytes}, {"note", mi.note}};
                               }
                               send_json(res, 200, j);
                           }
                       }});
    routes_.push_back({"GET", "/metrics", "/metrics", true, [c](const http_request &, http_response & res, auto &) {
                           engine_snapshot snap;
                           if (!c->loading() && c->sched) {
                               snap.sched = c->sched->stats();
                               snap.n_parallel = c->sched->n_parallel();
                           }
                           // What the engine thread last published: never waits on a prefill.
                           if (!c->loading() && c->sched) {
                               if (auto pc = c->sched->published_counters()) {
                                   snap.counters = *pc;
                                   snap.have_counters = true;
                               }
                           }
                           snap.store_workspaces = c->store.workspaces().size();
                           snap.store_segments = c->store.n_segments();
                           snap.store_bytes = c->store.n_bytes();
                           snap.store_write_failures = c->store.n_write_failures();
                           res.status = 200;
                           res.content_type = "text/plain; version=0.0.4; charset=utf-8";
                           res.body = with_label(c->metrics.render(snap), "replica", c->opts.replica);
                       }});
    add_openai_routes(routes_, ctx_);
    add_responses_routes(routes_, ctx_);
    add_workspace_routes(routes_, ctx_);
    add_anthropic_routes(routes_, ctx_);
    add_llama_server_routes(routes_, ctx_);
    add_ollama_routes(routes_, ctx_);
    add_ui_routes(routes_, ctx_);
    res_.reserve(routes_.size());
    for (const route & r : routes_) res_.emplace_back(r.regex_text);

    // --allowed-hosts: "*" or names separated by commas (spaces around them ignored).
    const std::string & ah = ctx_.opts.allowed_hosts;
    for (size_t pos = 0; pos <= ah.size();) {
        size_t end = ah.find(',', pos);
        if (end == std::string::npos) end = ah.size();
        std::string h = ah.substr(pos, end - pos);
        while (!h.empty() && h.front() == ' ') h.erase(h.begin());
        while (!h.empty() && (h.back() == ' ' || h.back() == '.')) h.pop_back();
        for (char & ch : h) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        if (h == "*") hosts_any_ = true;
        else if (!h.empty()) hosts_.push_back(h);
        pos = end + 1;
    }

    // --cors-origin: "*" or origins separated by commas (spaces around them ignored).
    const std::string & co = ctx_.opts.cors_origin;
    for (size_t pos = 0; pos <= co.size();) {
        size_t end = co.find(',', pos);
        if (end == std::string::npos) end = co.size();
        std::string o = co.substr(pos, end - pos);
        while (!o.empty() && o.front() == ' ') o.erase(o.begin());
        while (!o.empty() && o.back() == ' ') o.pop_back();
        if (o == "*") cors_any_ = true;
        else if (!o.empty()) cors_origins_.push_back(o);
        pos = end + 1;
    }
}

bool router::cors_allows(const std::string & origin) const {
    if (origin.empty()) return false;
    return cors_any_ || std::find(cors_origins_.begin(), cors_origins_.end(), origin) != cors_origins_.end();
}

void router::add_cors(const http_request & req, http_response & res) const {
    if (!cors_allows(req.origin)) return;
    res.headers.emplace_back("Access-Control-Allow-Origin", cors_any_ ? "*" : req.origin);
    if (!cors_any_) res.headers.emplace_back("Vary", "Origin");
    res.headers.emplace_back("Access-Control-Expose-Headers", "Retry-After");
}

bool router::host_allowed(const std::string & host_header) const {
    if (host_header.empty() || hosts_any_) return true;  // no Host: not a browser
    std::string name;
    if (host_header.front() == '[') {  // [v6]:port
        const size_t close = host_header.find(']');
        if (close == std::string::npos) return false;
        in6_addr a6{};
        return ::inet_pton(AF_INET6, host_header.substr(1, close - 1).c_str(), &a6) == 1;
    }
    const size_t colon = host_header.find(':');
    name = host_header.substr(0, colon);
    while (!name.empty() && name.back() == '.') name.pop_back();
    for (char & ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    in_addr a4{};
    if (::inet_pton(AF_INET, name.c_str(), &a4) == 1) return true;  // an address: no name to rebind
    const std::string_view n(name);
    if (n == "localhost" || (n.size() > 10 && n.substr(n.size() - 10) == ".localhost")) return true;
    std::string bound = ctx_.opts.host;
    for (char & ch : bound) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (name == bound) return true;  // --host names this machine by a name
    return std::find(hosts_.begin(), hosts_.end(), name) != hosts_.end();
}

namespace {
// A refusal of the router's own, in the route's API's error shape.
void respond_as(const route & r, http_response & res, request_log & log, const api_error & e) {
    switch (r.errors) {
        case error_style::anthropic: return respond_anthropic_error(res, log, e);
        case error_style::ollama: return respond_ollama_error(res, log, e);
        case error_style::openai: break;
    }
    respond_error(res, log, e);
}

// Routes that answer while the model loads: they tell how the server is.
bool served_while_loading(const route & r) { return r.pattern == "/health" || r.pattern == "/metrics"; }

// "application/json", parameters (charset) and case aside.
bool is_json_media_type(const std::string & content_type) {
    std::string t = content_type.substr(0, content_type.find(';'));
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.erase(t.begin());
    for (char & ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return t == "application/json";
}
}  // namespace

bool router::answered_on_headers(const route & r, const http_request & req, http_response & res,
                                 request_log & log) const {
    if (ctx_.loading() && !served_while_loading(r)) {
        api_error e = unavailable("the model is loading; GET /health says when the server is ready", 1);
        e.code = "loading";
        respond_as(r, res, log, e);
        return true;
    }
    if (r.auth && !authorized(req.authorization, ctx_.opts.api_key) &&
        !(ctx_.opts.api_key.size() > 0 && !req.api_key.empty() &&
          constant_time_equal(req.api_key, ctx_.opts.api_key))) {
        respond_as(r, res, log,
                   unauthorized(
                       r.errors != error_style::openai
                           ? "missing or wrong API key: send \"x-api-key: <key>\" (or \"Authorization: Bearer <key>\")"
                           : "missing or wrong API key: send \"Authorization: Bearer <key>\""));
        return true;
    }
    // Without a key, nothing but the network stands between a web page and the server:
    // a page must not reach it through a name it rebinds to 127.0.0.1 (DNS rebinding),
    // nor drive it with the requests a browser sends without asking (CSRF).
    if (ctx_.opts.api_key.empty()) {
        if (r.pattern != "/health" && !host_allowed(req.host)) {
            respond_as(r, res, log,
                          api_error{403, "invalid_request_error", "host_not_allowed",
                                    "Host '" + req.host.substr(0, 100) +
                                        "' is not allowed: without --api-key only IP addresses, localhost and the "
                                        "names in --allowed-hosts are served (a web page could rebind another name "
                                        "to this server)",
                                    "", 0});
            return true;
        }
        // A body a browser sends without a preflight (text/plain, a form, none) from a
        // page of any origin; application/json needs a preflight, which CORS decides.
        // Ollama's clients and its documented curl lines send JSON as a form (curl -d): a
        // request without an Origin is no browser's, and is read as JSON on its routes.
        const bool ollama_tool = r.errors == error_style::ollama && req.origin.empty();
        if ((r.method == "POST" || r.method == "PUT") && req.content_type && !cors_allows(req.origin) &&
            !is_json_media_type(*req.content_type) && !ollama_tool) {
            if (req.has_body) {
                api_error e = bad_request("unsupported_media_type",
                                          "Content-Type must be application/json (got '" +
                                              req.content_type->substr(0, 100) +
                                              "'): without --api-key other types are refused, since any web page "
                                              "can send them");
                e.http_status = 415;
                respond_as(r, res, log, e);
                return true;
            }
            if (!req.origin.empty()) {
                respond_as(r, res, log,
                              api_error{403, "invalid_request_error", "cross_origin_refused",
                                        "a request from origin '" + req.origin.substr(0, 100) +
                                            "' without application/json is refused (no --api-key; --cors-origin "
                                            "allows origins)",
                                        "", 0});
                return true;
            }
        }
    }
    return false;
}

bool router::refuse_early(const route & r, const http_request & req, http_response & res) {
    request_log log;
    log.method = req.method;
    log.route = r.pattern;
    if (!answered_on_headers(r, req, res, log)) return false;
    add_cors(req, res);
    ctx_.finish(log, res.status);
    return true;
}

void router::refuse(const route & r, const http_request & req, const api_error & e, http_response & res) {
    request_log log;
    log.method = req.method;
    log.route = r.pattern;
    respond_as(r, res, log, e);
    add_cors(req, res);
    ctx_.finish(log, res.status);
}

void router::preflight(const http_request & req, http_response & res) {
    std::string allow;
    std::string pattern;
    for (size_t i = 0; i < routes_.size(); ++i) {
        if (!std::regex_match(req.path, res_[i])) continue;
        if (pattern.empty()) pattern = routes_[i].pattern;
        if (allow.find(routes_[i].method) == std::string::npos)
            allow += (allow.empty() ? "" : ", ") + routes_[i].method;
    }
    if (allow.empty() || !cors_allows(req.origin)) {
        res.status = 404;  // unmatched: 405 with Allow for a known path, else 404
        return unmatched(req, res);
    }
    request_log log;
    log.method = req.method;
    log.route = pattern;
    res.status = 204;
    res.headers.emplace_back("Access-Control-Allow-Origin", cors_any_ ? "*" : req.origin);
    res.headers.emplace_back("Vary",
                             cors_any_ ? "Access-Control-Request-Headers" : "Origin, Access-Control-Request-Headers");
    res.headers.emplace_back("Access-Control-Allow-Methods", allow + ", OPTIONS");
    res.headers.emplace_back("Access-Control-Allow-Headers", req.cors_request_headers.empty()
                                                                 ? "Authorization, Content-Type"
                                                                 : req.cors_request_headers);
    res.headers.emplace_back("Access-Control-Max-Age", "600");
    ctx_.finish(log, res.status);
}

void router::dispatch(const route & r, const http_request & req, http_response & res) {
    auto log = std::make_shared<request_log>();
    log->method = req.method;
    log->route = r.pattern;
    try {
        if (!answered_on_headers(r, req, res, *log)) r.fn(req, res, log);
    } catch (const std::exception & e) {
        // Nothing a client sends should land here (parsers check types first);
        // this is the boundary that keeps one bad request from hurting others.
        res = http_response{};
        log->deferred = false;
        respond_error(res, *log, server_error(std::string("internal error: ") + e.what()));
    } catch (...) {
        res = http_response{};
        log->deferred = false;
        respond_error(res, *log, server_error("internal error"));
    }
    add_cors(req, res);
    if (!log->deferred) ctx_.finish(*log, res.status);
}

http_response router::handle(http_request req) {
    http_response res;
    for (size_t i = 0; i < routes_.size(); ++i) {
        std::smatch m;
        if (routes_[i].method != req.method || !std::regex_match(req.path, m, res_[i])) continue;
        req.params.clear();
        for (size_t k = 1; k < m.size(); ++k) req.params.push_back(m[k].str());
        dispatch(routes_[i], req, res);
        return res;
    }
    if (req.method == "OPTIONS") {
        preflight(req, res);
        return res;
    }
    res.status = 404;
    unmatched(req, res);
    return res;
}

void router::refuse_head(const api_error & e, http_response & res, const char * label) {
    request_log log;
    log.method = "-";
    log.route = label;
    respond_error(res, log, e);
    ctx_.finish(log, res.status);
}

void router::unmatched(const http_request & req, http_response & res) {
    const std::string & method = req.method;
    const std::string & path = req.path;
    request_log log;
    log.method = method;
    log.route = "unmatched";
    std::string allow;
    for (size_t i = 0; i < routes_.size(); ++i) {
        const route & r = routes_[i];
        if (!std::regex_match(path, res_[i])) continue;
        log.route = r.pattern;
        if (r.method != method && allow.find(r.method) == std::string::npos)
            allow += (allow.empty() ? "" : ", ") + r.method;
    }
    // The route label stays "unmatched" (a bounded set); the log line says which path.
    if (log.route == "unmatched") log.path = path.substr(0, 200);
    api_error e;
    if (res.status == 404 && !allow.empty()) {
        e = method_not_allowed("method " + method + " is not allowed on " + log.route + " (allowed: " + allow + ")");
        res.headers.emplace_back("Allow", allow);
    } else if (res.status == 404) {
        e = not_found_route("no route " + method + " " + path.substr(0, 200));
    } else if (res.status == 413) {
        e = payload_too_large("request body larger than " + std::to_string(ctx_.opts.max_body_bytes) + " bytes");
    } else if (res.status == 408) {
        e = request_timeout("the request line and headers did not arrive within " +
                            std::to_string(ctx_.opts.header_timeout_ms) + " ms");
    } else if (res.status >= 500) {
        e = server_error("HTTP error " + std::to_string(res.status));
    } else {
        e = bad_request("bad_request", "malformed HTTP request (status " + std::to_string(res.status) + ")");
        e.http_status = res.status;
    }
    respond_error(res, log, e);
    add_cors(req, res);
    ctx_.finish(log, res.status);
}

}  // namespace warmctx::server_detail
