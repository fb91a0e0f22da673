// The OpenAI routes: /v1/models, /v1/chat/completions, /v1/completions, and the
// request -> job -> response flow they share with /v1/workspaces/{id}/chat/completions
// (plain JSON or server-sent events). See docs/api.md.
#include <chrono>
#include <cmath>
#include <ctime>
#include <deque>
#include <future>

#include "json_util.h"
#include "route_context.h"
#include "warmctx/clock.h"
#include "warmctx/assembler.h"
#include "responses.h"
#include "warmctx/chat_template.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

namespace {

// How long a waiting HTTP thread sleeps between looks at its channel. Events wake it
// at once; the timeout only bounds how late it notices a dead client or a stop.
constexpr auto k_poll = std::chrono::milliseconds(100);

std::string sse(const json & j) { return "data: " + dump_json(j) + "\n\n"; }

void note_event(request_log & log, const timed_event & te) {
    const completion_event & ev = te.ev;
    if (ev.what == completion_event::kind::delta && log.ttft_ms < 0) log.ttft_ms = ms_between(log.t_start, te.at);
    if (ev.what == completion_event::kind::started || ev.what == completion_event::kind::done) {
        log.prompt_tokens = ev.usage.prompt_tokens;
        log.tokens_reused = ev.usage.cached_tokens;
        log.tokens_prefilled = ev.explain.n_prefilled;
    }
    if (ev.what == completion_event::kind::done) {
        log.completion_tokens = ev.usage.completion_tokens;
        if (log.ttft_ms < 0 && ev.usage.completion_tokens > 0) log.ttft_ms = ev.t_first_token_ms;
    }
}

// A long prefill shows on the request log: a progress line at most every 5 s.
constexpr auto k_progress_log_every = std::chrono::seconds(5);

struct prefill_progress {
    pos_t pos = -1, end = 0;
    steady::time_point last_logged = steady::now();
};

void note_progress(route_context & ctx, const request_log & log, const completion_event & ev, prefill_progress & p) {
    if (ev.what != completion_event::kind::admitted && ev.what != completion_event::kind::progress) return;
    p.pos = ev.prefill_pos;
    p.end = ev.prefill_end;
    if (ev.what != completion_event::kind::progress || steady::now() - p.last_logged < k_progress_log_every) return;
    p.last_logged = steady::now();
    ctx.log_event({{"event", "prefill_progress"},
                   {"route", log.route},
                   {"workspace", log.workspace},
                   {"tokens_in_sequence", p.pos},
                   {"prompt_tokens", p.end},
                   {"elapsed_ms", std::round(ms_between(log.t_start, steady::now()))}});
}

// Calls whose arguments are not a whole JSON object (an answer cut short by max_tokens)
// are dropped; without parallel_tool_calls only the first call counts.
void keep_whole_calls(parsed_answer & a, bool parallel) {
    std::vector<parsed_tool_call> kept;
    for (auto & c : a.tool_calls) {
        json args = json::parse(c.arguments, nullptr, false);
        if (args.is_discarded() || !args.is_object()) continue;
        kept.push_back(std::move(c));
        if (!parallel) break;
    }
    a.tool_calls = std::move(kept);
}

// Tool call ids: the model's own when its format has them, else the response id and
// the call's index.
void name_calls(parsed_answer & a, const std::string & response_id) {
    for (size_t i = 0; i < a.tool_calls.size(); ++i)
        if (a.tool_calls[i].id.empty()) a.tool_calls[i].id = "call_" + response_id + "_" + std::to_string(i);
}

api_error job_error(const status & st) {
    if (st.code() == status_code::cancelled) return unavailable("request cancelled: " + st.message(), 1);
    return error_from_status(st);
}

// A streamed completion, between the handler's return and the stream's end.
struct stream_state {
    route_context * ctx = nullptr;
    std::shared_ptr<request_channel> ch;
    std::shared_ptr<request_log> log;
    response_meta meta;
    std::string workspace;
    request_timings timings;
    bool include_usage = false;
    std::deque<timed_event> pending;
    bool role_sent = false;
    bool finished = false;  // the stream's last chunk was written, or the client left
    prefill_progress progress;
    bool logprobs = false;  // the request asked for them
    size_t text_bytes = 0;  // text sent so far (a completion's text_offset)
    // An answer parsed by the template's tool-call format: the raw text so far, and what
    // of its parse has been sent (content bytes; per call, whether its head went out and
    // how many bytes of arguments).
    std::shared_ptr<const chat_output_parser> parser;
    std::string raw;
    size_t content_sent = 0;
    std::vector<size_t> args_sent;
    bool any_call = false;
    bool parallel_calls = true;  // parallel_tool_calls: else only the first call is sent
    std::chrono::steady_clock::time_point t_last_write{};
};

// Writes `data`; on failure (the client went away) cancels the job.
bool write_or_cancel(stream_state & st, chunk_sink & sink, const std::string & data) {
    st.t_last_write = std::chrono::steady_clock::now();
    if (sink.write(data)) return true;
    st.ch->cancel();
    st.finished = true;
    st.ctx->finish(*st.log, k_status_client_closed);
    return false;
}

// The chunks that bring a client from what it has of a parsed answer to `now`: new
// content, each new call's head (id, name), new argument bytes. A parse that rewrote
// what was sent (content that turned out to open a call) sends only what extends it.
std::string parsed_deltas(stream_state & st, parsed_answer now) {
    name_calls(now, st.meta.id);
    std::string out;
    if (now.content.size() > st.content_sent) {
        out += sse(chunk_delta(st.meta, now.content.substr(st.content_sent), st.include_usage));
        st.content_sent = now.content.size();
    }
    json frags = json::array();
    for (size_t i = 0; i < now.tool_calls.size() && (st.parallel_calls || i == 0); ++i) {
        const parsed_tool_call & c = now.tool_calls[i];
        if (i >= st.args_sent.size()) {
            if (c.name.empty()) break;  // its head is not complete yet
            frags.push_back({{"index", i},
                             {"id", c.id},
                             {"type", "function"},
                             {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
            st.args_sent.push_back(c.arguments.size());
            st.any_call = true;
        } else if (c.arguments.size() > st.args_sent[i]) {
            frags.push_back({{"index", i}, {"function", {{"arguments", c.arguments.substr(st.args_sent[i])}}}});
            st.args_sent[i] = c.arguments.size();
        }
    }
    if (!frags.empty()) out += sse(chunk_tool_calls(st.meta, std::move(frags), st.include_usage));
    return out;
}

// One call of the transport: the role chunk first (chat), then whatever events are
// there (waiting up to k_poll for some). true: call again (or done() was called).
bool stream_step(stream_state & st, chunk_sink & sink) {
    if (st.finished) return false;
    if (!st.role_sent) {
        // At once, before any token: the headers and a first chunk go out.
        st.role_sent = true;
        const std::string first = st.meta.shape == api_shape::chat ? sse(chunk_role(st.meta, st.include_usage))
                                                                    : std::string(": keep-alive\n\n");
        if (!write_or_cancel(st, sink, first)) return false;
    }
    if (st.pending.empty()) {
        for (auto & te : st.ch->pop_all(k_poll)) st.pending.push_back(std::move(te));
        if (st.pending.empty()) {
            // Nothing yet (queued or prefilling): a comment now and then, so proxies and
            // clients see the connection alive and a client that left is noticed (its
            // job cancelled) without waiting for the first token.
            // The comment tells how far the prefill has got, once it is admitted.
            const std::string comment = st.progress.pos < 0 ? std::string(": keep-alive\n\n")
                                                            : ": keep-alive prefill " + std::to_string(st.progress.pos) +
                                                                  "/" + std::to_string(st.progress.end) + "\n\n";
            if (std::chrono::steady_clock::now() - st.t_last_write >= std::chrono::milliseconds(st.ctx->opts.sse_keep_alive_ms) &&
                !write_or_cancel(st, sink, comment))
                return false;
            return true;  // the transport calls again
        }
    }
    while (!st.pending.empty()) {
        timed_event te = std::move(st.pending.front());
        st.pending.pop_front();
        note_event(*st.log, te);
        note_progress(*st.ctx, *st.log, te.ev, st.progress);
        const completion_event & ev = te.ev;
        switch (ev.what) {
            case completion_event::kind::admitted:
            case completion_event::kind::progress:
            case completion_event::kind::started: break;
            case completion_event::kind::delta:
                if (st.parser) {
                    st.raw += ev.text;
                    auto p = st.parser->parse(st.raw, /*partial=*/true);
                    if (p.ok()) {
                        const std::string out = parsed_deltas(st, std::move(*p));
                        if (!out.empty() && !write_or_cancel(st, sink, out)) return false;
                    }
                    break;
                }
                if (!ev.text.empty() &&
                    !write_or_cancel(st, sink,
                                     sse(chunk_delta(st.meta, ev.text, st.include_usage,
                                                     st.logprobs ? logprobs_json(st.meta.shape, ev.logprobs, st.text_bytes)
                                                                 : json(nullptr)))))
                    return false;
                st.text_bytes += ev.text.size();
                break;
            case completion_event::kind::done: {
                std::string out;
                if (st.parser) {
                    // The final parse: what the partial ones held back (a call's last bytes).
                    auto p = st.parser->parse(st.raw, /*partial=*/false);
                    if (p.ok()) out += parsed_deltas(st, std::move(*p));
                }
                out += sse(chunk_finish(st.meta, ev.finish, st.include_usage, warmctx_json(st.workspace, ev.explain, ev, st.timings),
                                        st.any_call && ev.finish != finish_reason::length &&
                                            ev.finish != finish_reason::context_full));
                if (st.include_usage) out += sse(chunk_usage(st.meta, ev.usage));
                out += "data: [DONE]\n\n";
                if (!write_or_cancel(st, sink, out)) return false;
                st.finished = true;
                sink.done();
                st.ctx->finish(*st.log, 200);
                return true;
            }
            case completion_event::kind::error: {
                // Headers are sent: the error travels as a data chunk.
                api_error e = job_error(ev.error);
                st.log->error_code = e.code;
                std::string out = "data: " + e.body() + "\n\ndata: [DONE]\n\n";
                if (!write_or_cancel(st, sink, out)) return false;
                st.finished = true;
                sink.done();
                st.ctx->finish(*st.log, 200);
                return true;
            }
        }
    }
    return true;
}

}  // namespace

namespace {
// The client left a request that is not streamed: its job is cancelled, and the log and
// metrics say 499 (nobody reads the answer).
void answer_client_gone(http_response & res, request_log & log) {
    res.status = k_status_client_closed;
    res.content_type = "application/json";
    res.body = R"({"error":{"message":"the client closed the connection","type":"invalid_request_error","param":null,"code":"client_closed"}})";
    log.error_code = "client_closed";
}
}  // namespace

void run_completion(route_context & ctx, const http_request & req, http_response & res,
                    const std::shared_ptr<request_log> & log, body_mode mode, const std::string * path_ws) {
    auto gone = [&req] { return req.client_gone && req.client_gone(); };
    const auto t_arrival = std::chrono::steady_clock::now();
    json body;
    if (auto e = parse_body(req, body)) return respond_error(res, *log, *e);
    completion_request cr;
    request_limits limits = ctx.limits;
    limits.bounds = ctx.opts.bounds;  // the server's bounds (warmctx/server.h): checked while parsing
    if (auto e = parse_completion_request(body, mode, limits, cr)) return respond_error(res, *log, *e);
    if (path_ws) {
        if (!cr.workspace.empty() && !cr.workspace_from_cache_key && cr.workspace != *path_ws)
            return respond_error(res, *log,
                                 bad_request("invalid_workspace",
                                             "the body names workspace '" + cr.workspace + "' but the path names '" +
                                                 *path_ws + "'",
                                             "workspace"));
        auto stored = ctx.store.list(*path_ws);
        if (!stored)
            return respond_error(res, *log,
                                 error_from_status(not_found("workspace '" + *path_ws +
                                                             "' has no stored segments: PUT "
                                                             "/v1/workspaces/{id}/segments/{segment} first")));
        // The stable context this chat carries itself (tools, system messages): the
        // workspace's next pre-warm includes it, as its next chat most likely will.
        std::vector<segment> carried;
        for (const segment & sg : cr.segments)
            if (ctx.opts.kinds.policy(sg.kind).retention >= retention_class::high) carried.push_back(sg);
        ctx.remember_carried(*path_ws, std::move(carried));
        cr.segments = merge_stored_segments(std::move(*stored), std::move(cr.segments));
        // A stored tools segment is rendered and may become the answer's grammar: the
        // same bounds as a body's.
        if (auto e = check_tools_segments(cr.segments, limits.bounds)) return respond_error(res, *log, *e);
        cr.workspace = *path_ws;
        ctx.store.note_use(*path_ws);
    }
    if (status st = validate_segments(cr.segments, ctx.opts.kinds); !st.ok())
        return respond_error(res, *log, error_from_status(st));
    if (cr.workspace.empty()) cr.workspace = derive_workspace(cr.segments);
    log->workspace = cr.workspace;
    if (!ctx.sched) return respond_error(res, *log, unavailable("the engine is stopping: no engine", 1));

    // Tools (and a JSON schema): the template's grammar and parser for the answer. Built
    // on another thread while this one assembles the prompt (a large tools array's
    // grammar takes milliseconds the first time), unless there is none to build.
    const bool with_tools = !cr.tools_json.empty() && cr.tool_choice != tool_choice_mode::none;
    const bool with_answer = cr.shape == api_shape::chat && (with_tools || !cr.json_schema.empty());
    const chat_templates * ct = ctx.sched->chat_template();
    if (with_answer && with_tools && cr.tool_choice == tool_choice_mode::required && !ct)
        return respond_error(res, *log,
                             bad_request("unsupported_parameter",
                                         "tool_choice requires a call, which needs the model's Jinja chat template "
                                         "(the server runs with --no-jinja, or the template did not load)",
                                         "tool_choice"));
    auto build_answer = [&cr, ct, with_tools]() -> result<answer_format> {
        if (with_tools && ct) {
            answer_request ar{cr.tools_json, cr.tool_choice, cr.tool_choice_name, cr.parallel_tool_calls, cr.json_schema};
            return ct->answer({}, ar);
        }
        answer_format af;
        if (!cr.json_schema.empty()) {
            auto g = json_schema_grammar(cr.json_schema);
            if (!g.ok()) return g.error();
            af.grammar = std::move(*g);
        }
        return af;
    };
    std::shared_ptr<const chat_output_parser> parser;
    std::future<result<answer_format>> answer;
    if (with_answer) answer = std::async(std::launch::async, build_answer);

    auto ch = std::make_shared<request_channel>();
    completion_job job;
    job.turn.workspace = cr.workspace;
    job.turn.segments = std::move(cr.segments);
    job.turn.raw = cr.raw;
    job.turn.suffix = cr.suffix;
    request_timings rt;
    {
        // Assembled and tokenized here, not on the engine thread: a prompt that does not
        // fit is refused without queueing, and the engine thread only looks it up.
        const auto t_asm = std::chrono::steady_clock::now();
        // A cold prompt with much to tokenize: its leading segments are prefilled while
        // the rest tokenizes here.
        ctx.sched->prefill_ahead(job.turn);
        auto ap = ctx.sched->assemble(job.turn);
        rt.assemble_ms = ms_since(t_asm);
        if (answer.valid()) {
            // Its error first, as when it was built before the prompt.
            const auto t_wait = std::chrono::steady_clock::now();
            auto af = answer.get();
            rt.answer_wait_ms = ms_since(t_wait);
            if (!af.ok()) {
                return respond_error(res, *log, error_from_status(af.error(), with_tools && ct ? "tool_choice"
                                                                                               : "response_format"));
            }
            cr.sampling.grammar = std::move(af->grammar);
            cr.sampling.grammar_lazy = af->grammar_lazy;
            cr.sampling.grammar_trigger_patterns = std::move(af->trigger_patterns);
            cr.sampling.grammar_trigger_words = std::move(af->trigger_words);
            cr.sampling.grammar_prefill = std::move(af->generation_prompt);
            for (auto & st : af->additional_stops) cr.sampling.stop.push_back(std::move(st));
            parser = std::move(af->parser);
        }
        if (!ap.ok()) return respond_error(res, *log, error_from_status(ap.error()));
        job.turn.assembled = std::make_shared<const assembled_prompt>(std::move(*ap));
    }
    job.turn.sampling = cr.sampling;
    rt.request_ms = ms_since(t_arrival);
    // Gone while the prompt and the grammar were built: nothing is queued.
    if (gone()) return answer_client_gone(res, *log);
    job.sink = [ch](const completion_event & ev) { return ch->push(ev); };
    if (!ctx.register_channel(ch)) return respond_error(res, *log, unavailable("the server is shutting down", 1));
    // Unregisters on every path out of this function, unless a stream takes over.
    std::shared_ptr<request_channel> registered = ch;
    struct unregister_guard {
        route_context * ctx;
        std::shared_ptr<request_channel> * ch;
        ~unregister_guard() {
            if (*ch) ctx->unregister_channel(*ch);
        }
    } guard{&ctx, &registered};

    if (status st = ctx.sched->submit(std::move(job)); !st.ok()) {
        if (st.code() == status_code::resource_exhausted)
            return respond_error(res, *log,
                                 too_many_requests("queue_full", "the request queue is full: " + st.message() +
                                                                     "; retry after a second", 1));
        if (st.code() == status_code::failed_precondition)
            return respond_error(res, *log, unavailable("the engine is stopping: " + st.message(), 1));
        return respond_error(res, *log, error_from_status(st));
    }

    // Wait for the first event - `admitted`, as soon as a work sequence takes the job,
    // before its prefill: an error before that (prompt too long, bad segment) is still a
    // plain HTTP error, even for a stream; a stream's headers go out right after it.
    // A stream waits at most sse_keep_alive_ms (queued behind busy work sequences):
    // then its headers go out anyway, and a later error travels in the stream.
    std::deque<timed_event> pending;
    const auto t_wait = std::chrono::steady_clock::now();
    while (pending.empty()) {
        for (auto & te : ch->pop_all(k_poll)) pending.push_back(std::move(te));
        if (!cr.stream && pending.empty() && gone()) {
            ch->cancel();
            return answer_client_gone(res, *log);
        }
        if (cr.stream && std::chrono::steady_clock::now() - t_wait >= std::chrono::milliseconds(ctx.opts.sse_keep_alive_ms))
            break;
    }
    if (!pending.empty() && pending.front().ev.what == completion_event::kind::error)
        return respond_error(res, *log, job_error(pending.front().ev.error));

    response_meta meta;
    meta.shape = cr.shape;
    meta.id = ctx.next_request_id(cr.shape == api_shape::chat ? "chatcmpl-" : "cmpl-");
    meta.created = static_cast<int64_t>(std::time(nullptr));
    meta.model = ctx.model_name;

    const bool want_logprobs = cr.sampling.n_logprobs >= 0;
    if (!cr.stream) {
        std::string text;
        std::vector<token_logprobs> lps;
        prefill_progress progress;
        auto t_asked = std::chrono::steady_clock::now();
        for (;;) {
            while (!pending.empty()) {
                timed_event te = std::move(pending.front());
                pending.pop_front();
                note_event(*log, te);
                note_progress(ctx, *log, te.ev, progress);
                const completion_event & ev = te.ev;
                switch (ev.what) {
                    case completion_event::kind::admitted:
            case completion_event::kind::progress:
            case completion_event::kind::started: break;
                    case completion_event::kind::delta:
                        text += ev.text;
                        lps.insert(lps.end(), ev.logprobs.begin(), ev.logprobs.end());
                        break;
                    case completion_event::kind::error: return respond_error(res, *log, job_error(ev.error));
                    case completion_event::kind::done: {
                        std::optional<parsed_answer> parsed;
                        if (parser) {
                            // An answer the format cannot parse (cut short by max_tokens, say)
                            // is returned as text.
                            auto p = parser->parse(text, /*partial=*/false);
                            if (!p.ok()) p = parser->parse(text, /*partial=*/true);
                            if (p.ok()) {
                                parsed = std::move(*p);
                                keep_whole_calls(*parsed, cr.parallel_tool_calls);
                                name_calls(*parsed, meta.id);
                            }
                        }
                        send_json(res, 200,
                                  completion_response(meta, text, ev.finish, ev.usage,
                                                      warmctx_json(cr.workspace, ev.explain, ev, rt),
                                                      want_logprobs ? logprobs_json(meta.shape, lps) : json(nullptr),
                                                      parsed ? &*parsed : nullptr));
                        return;
                    }
                }
            }
            for (auto & te : ch->pop_all(k_poll)) pending.push_back(std::move(te));
            // Asked at most every k_poll, whether events flow or not.
            if (const auto now = std::chrono::steady_clock::now(); now - t_asked >= k_poll) {
                t_asked = now;
                if (gone()) {
                    ch->cancel();
                    return answer_client_gone(res, *log);
                }
            }
        }
    }

    // Streamed: the transport runs the steps after the handler returns; the channel
    // stays registered until the stream ends (stream_end).
    auto st = std::make_shared<stream_state>();
    st->ctx = &ctx;
    st->ch = ch;
    st->log = log;
    st->meta = meta;
    st->workspace = cr.workspace;
    st->timings = rt;
    st->include_usage = cr.include_usage;
    st->logprobs = want_logprobs;
    st->parser = parser;
    st->parallel_calls = cr.parallel_tool_calls;
    st->pending = std::move(pending);
    log->deferred = true;
    registered.reset();  // stream_end unregisters
    res.status = 200;
    res.headers.emplace_back("Cache-Control", "no-cache");
    res.headers.emplace_back("X-Accel-Buffering", "no");
    res.content_type = "text/event-stream";
    res.stream = [st](chunk_sink & sink) { return stream_step(*st, sink); };
    res.stream_end = [st] {
        // Called once the response is done with, however it ended.
        if (!st->finished) {
            st->finished = true;
            st->ch->cancel();
            st->ctx->finish(*st->log, k_status_client_closed);
        }
        st->ctx->unregister_channel(st->ch);
    };
}

namespace {

// A chat error body ({"error": {...}}) back as an api_error, its param renamed to the
// Responses field it came from.
api_error parse_error_body(const http_response & chat, const responses_request_info & info) {
    api_error e;
    e.http_status = chat.status;
    json j = json::parse(chat.body, nullptr, false);
    if (j.is_object() && j.contains("error") && j["error"].is_object()) {
        const json & x = j["error"];
        auto str = [&](const char * k) { return x.contains(k) && x[k].is_string() ? x[k].get<std::string>() : std::string(); };
        e.type = str("type");
        e.code = str("code");
        e.message = str("message");
        e.param = str("param");
    }
    chat_error_to_responses(e, info);
    return e;
}

// A chunk_sink that takes the chat route's server-sent events and writes the Responses
// events they become.
class responses_sink final : public chunk_sink {
  public:
    responses_sink(chunk_sink & out, responses_stream & rs, responses_request_info & info, std::string & buf)
        : out_(out), rs_(rs), info_(info), buf_(buf) {}
    bool write(std::string_view data) override {
        buf_.append(data);
        size_t end;
        while ((end = buf_.find("\n\n")) != std::string::npos) {
            const std::string ev = buf_.substr(0, end);
            buf_.erase(0, end + 2);
            if (ev.rfind(": ", 0) == 0) {
                // A keep-alive comment: passed on, and before the answer begins a
                // response.in_progress event too (Codex's idle timer counts events only).
                std::string text = ev + "\n\n";
                for (const auto & e : rs_.heartbeat()) text += sse_text(e);
                if (!out_.write(text)) return false;
                continue;
            }
            if (ev.rfind("data: ", 0) != 0) continue;
            const std::string payload = ev.substr(6);
            std::vector<responses_event> events;
            if (payload == "[DONE]") {
                if (!rs_.done()) events = rs_.finish();
            } else {
                json c = json::parse(payload, nullptr, false);
                if (c.is_object() && c.contains("error")) {
                    http_response r;
                    r.status = 500;
                    r.body = payload;
                    events = rs_.error(parse_error_body(r, info_));
                } else if (c.is_object()) {
                    events = rs_.chunk(c);
                }
            }
            std::string text;
            for (const auto & e : events) text += sse_text(e);
            if (!text.empty() && !out_.write(text)) return false;
        }
        return true;
    }
    void done() override { out_.done(); }

  private:
    chunk_sink & out_;
    responses_stream & rs_;
    responses_request_info & info_;
    std::string & buf_;  // an event cut between two writes waits here
};

// POST /v1/responses: the request becomes a chat request (responses.h), runs as one, and
// its answer - whole or streamed - is translated back.
void run_responses(route_context & ctx, const http_request & req, http_response & res,
                   const std::shared_ptr<request_log> & log) {
    json body;
    if (auto e = parse_body(req, body)) return respond_error(res, *log, *e);
    json chat_body;
    auto info = std::make_shared<responses_request_info>();
    if (auto e = responses_to_chat(body, chat_body, *info)) return respond_error(res, *log, *e);
    info->model = ctx.model_name;  // the served model, as the chat routes name it
    http_request chat_req = req;
    chat_req.body = dump_json(chat_body);
    http_response chat_res;
    run_completion(ctx, chat_req, chat_res, log, body_mode::chat, nullptr);
    const std::string id = make_response_id();
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    if (!chat_res.stream) {
        if (chat_res.status != 200) {
            api_error e = parse_error_body(chat_res, *info);
            res.status = chat_res.status;
            res.headers = chat_res.headers;
            res.content_type = "application/json";
            res.body = e.body();
            return;
        }
        json cc = json::parse(chat_res.body, nullptr, false);
        send_json(res, 200, chat_to_response(cc, *info, id, created));
        return;
    }
    auto rs = std::make_shared<responses_stream>(*info, id, created);
    res.status = chat_res.status;
    res.headers = chat_res.headers;
    res.content_type = chat_res.content_type;
    auto started = std::make_shared<bool>(false);
    auto buf = std::make_shared<std::string>();
    auto inner = chat_res.stream;
    res.stream = [rs, info, inner, started, buf](chunk_sink & sink) {
        if (!*started) {
            *started = true;
            std::string text;
            for (const auto & e : rs->start()) text += sse_text(e);
            if (!sink.write(text)) return false;
        }
        responses_sink rsink(sink, *rs, *info, *buf);
        return inner(rsink);
    };
    res.stream_end = chat_res.stream_end;
}

}  // namespace

void add_openai_routes(route_table & t, route_context & ctx) {
    route_context * c = &ctx;
    auto model_json = [c] {
        const model_info & m = c->sched->model();
        const context_info & ci = c->sched->context();
        return json{{"id", c->model_name},
                    {"object", "model"},
                    {"created", c->t_created},
                    {"owned_by", "warmctx"},
                    {"meta",
                     {{"description", m.description},
                      {"n_params", m.n_params},
                      {"size_bytes", m.size_bytes},
                      {"n_ctx_train", m.n_ctx_train},
                      {"n_ctx_seq", ci.n_ctx_seq},
                      {"n_parallel", c->sched->n_parallel()},
                      {"chunk_tokens", ci.chunk_tokens},
                      {"kv_type", ci.kv_type},
                      {"kv_mode", kv_mode_name(ci.mode)},
                      {"backend", ci.backend}}}};
    };
    t.push_back({"GET", "/v1/models", "/v1/models", true, [model_json](const http_request &, http_response & res, auto &) {
                     send_json(res, 200, {{"object", "list"}, {"data", json::array({model_json()})}});
                 }});
    t.push_back({"GET", "/v1/models/{model}", "/v1/models/([^/]+)", true,
                 [c, model_json](const http_request & req, http_response & res, const auto & log) {
                     const std::string & name = req.params.at(0);
                     if (name != c->model_name)
                         return respond_error(res, *log,
                                              error_from_status(not_found("no model '" + name.substr(0, 100) +
                                                                          "' (this server serves '" + c->model_name + "')"),
                                                                "model"));
                     send_json(res, 200, model_json());
                 }});
    t.push_back({"POST", "/v1/chat/completions", "/v1/chat/completions", true,
                 [c](const http_request & req, http_response & res, const auto & log) {
                     run_completion(*c, req, res, log, body_mode::chat, nullptr);
                 }});
    t.push_back({"POST", "/v1/responses", "/v1/responses", true,
                 [c](const http_request & req, http_response & res, const auto & log) {
                     run_responses(*c, req, res, log);
                 }});
    t.push_back({"POST", "/v1/completions", "/v1/completions", true,
                 [c](const http_request & req, http_response & res, const auto & log) {
                     run_completion(*c, req, res, log, body_mode::text, nullptr);
                 }});
}

}  // namespace warmctx::server_detail
