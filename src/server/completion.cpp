// The one completion path (completion.h): prepare, submit, wait, and one loop from the
// engine's events to a renderer's output, whole or streamed. See docs/api.md.
#include "completion.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <deque>

#include "answer_build.h"
#include "api/openai/openai.h"
#include "json_util.h"
#include "segments_json.h"
#include "server/explain_format.h"
#include "warmctx/assembler.h"
#include "warmctx/chat_template.h"
#include "util/clock.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

answer_report report_of(const std::string & workspace, const completion_event & done, const request_timings & rt) {
    answer_report r;
    r.workspace = workspace;
    r.explain = done.explain;
    r.drafts = done.drafts;
    r.t_queue_ms = done.t_queue_ms;
    r.t_first_token_ms = done.t_first_token_ms;
    r.t_total_ms = done.t_total_ms;
    r.t_assemble_ms = done.t_assemble_ms;
    r.t_restore_ms = done.t_restore_ms;
    r.t_copy_ms = done.t_copy_ms;
    r.t_prefill_ms = done.t_prefill_ms;
    r.t_checkpoint_ms = done.t_checkpoint_ms;
    r.t_write_back_ms = done.t_write_back_ms;
    r.t_lookup_ms = done.t_lookup_ms;
    r.t_sampler_ms = done.t_sampler_ms;
    r.t_interleave_ms = done.t_interleave_ms;
    r.n_decode_steps = done.n_decode_steps;
    r.t_decode_step_ms = done.t_decode_step_ms;
    r.t_sample_ms = done.t_sample_ms;
    r.t_finish_ms = done.t_finish_ms;
    r.n_generated = done.usage.completion_tokens;
    r.rt = rt;
    return r;
}

const char * reuse_result(const explain_report & ex) {
    if (ex.n_reused <= 0) return "cold";
    return ex.n_reused >= ex.n_cacheable ? "warm" : "partial";
}

json warmctx_json(const answer_report & r) {
    const explain_report & ex = r.explain;
    const answer_report & done = r;
    const request_timings & rt = r.rt;
    return {
        {"workspace", r.workspace},
        {"tokens_reused", ex.n_reused},
        {"tokens_prefilled", ex.n_prefilled},
        {"tokens_cacheable", ex.n_cacheable},
        // The prompt's token prefix shared with the workspace's last turn (-1: none):
        // what reuse exact to the token could keep at most.
        {"tokens_common_with_previous_turn", ex.n_common_tokens},
        {"result", reuse_result(ex)},
        {"miss", miss_kind_name(ex.kind)},
        {"tier", kv_tier_name(ex.tier)},
        {"reason", ex.reason},
        {"missed_segment", ex.missed_segment},
        {"stable_prefix_hash", ex.stable_prefix_hash},
        {"prewarm", prewarm_json(ex.prewarm)},
        // Drafts from the workspace (warmctx/drafts.h): tokens decoded ahead, and the
        // ones sampling chose.
        {"drafts",
         {{"steps", done.drafts.n_steps}, {"drafted", done.drafts.n_drafted}, {"accepted", done.drafts.n_accepted}}},
        {"queue_ms", done.t_queue_ms},
        {"first_token_ms", done.t_first_token_ms},
        {"total_ms", done.t_total_ms},
        // The answer after its first token: the time, and the tokens a second it took
        // (the first token is the prompt's; llama-server's timings.predicted_*).
        {"decode_ms", std::max(0.0, done.t_total_ms - done.t_first_token_ms)},
        {"decode_tokens_per_second",
         done.t_total_ms > done.t_first_token_ms && r.n_generated > 1
             ? 1000.0 * (double)(r.n_generated - 1) / (done.t_total_ms - done.t_first_token_ms)
             : 0.0},
        // Where decode_ms went: the decode steps the answer was in (each whole), choosing its
        // tokens, caching its turn at the end, and other jobs' work between its steps.
        {"decode_timings",
         {{"steps", done.n_decode_steps},
          {"step_ms", done.t_decode_step_ms},
          {"sample_ms", done.t_sample_ms},
          {"finish_ms", done.t_finish_ms},
          {"other_ms", std::max(0.0, done.t_total_ms - done.t_first_token_ms - done.t_decode_step_ms -
                                         done.t_sample_ms - done.t_finish_ms)}}},
        {"request_ms", rt.request_ms},
        // Every phase of the wait for the first token, each once: their sum is
        // request_ms + first_token_ms less the engine thread's bookkeeping.
        {"timings",
         {{"parse_ms", std::max(0.0, rt.request_ms - rt.assemble_ms - rt.answer_wait_ms)},
          {"assemble_ms", rt.assemble_ms + done.t_assemble_ms},
          {"answer_wait_ms", rt.answer_wait_ms},
          {"queue_ms", done.t_queue_ms},
          {"sampler_ms", done.t_sampler_ms},
          {"write_back_ms", done.t_write_back_ms},
          {"lookup_ms", done.t_lookup_ms},
          {"restore_ms", done.t_restore_ms},
          {"copy_ms", done.t_copy_ms},
          {"prefill_ms", done.t_prefill_ms},
          {"checkpoint_ms", done.t_checkpoint_ms},
          {"interleave_ms", done.t_interleave_ms}}}};
}


maybe_error parse_completion(const route_context & ctx, const json & body, body_mode mode, completion_request & cr) {
    request_limits limits = ctx.limits;
    limits.bounds = ctx.opts.bounds;  // checked while parsing
    return parse_completion_request(body, mode, limits, cr);
}

void renderer::error_response(http_response & res, request_log & log, api_error e) { respond_error(res, log, e); }

namespace {

// How long a waiting HTTP thread sleeps between looks at its channel. Events wake it
// at once; the timeout only bounds how late it notices a dead client or a stop.
constexpr auto k_poll = std::chrono::milliseconds(100);

// A long prefill shows on the request log: a progress line at most every 5 s.
constexpr auto k_progress_log_every = std::chrono::seconds(5);

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
        auto args = parse_json(c.arguments);
        if (!args.ok() || !args->is_object()) continue;
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

int64_t unix_ms_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

bool is_cut(finish_reason f) { return f == finish_reason::length || f == finish_reason::context_full; }

// ---- preparing ------------------------------------------------------------------------

// A /v1/workspaces/{id}/... request: the workspace's stored segments merged in.
maybe_error merge_workspace(route_context & ctx, completion_request & cr, const std::string & ws) {
    if (!cr.workspace.empty() && !cr.workspace_from_cache_key && cr.workspace != ws)
        return bad_request("invalid_workspace",
                           "the body names workspace '" + cr.workspace + "' but the path names '" + ws + "'",
                           "workspace");
    auto stored = ctx.store.list(ws);
    if (!stored)
        return error_from_status(not_found(
            "workspace '" + ws + "' has no stored segments: PUT /v1/workspaces/{id}/segments/{segment} first"));
    // The stable context this chat carries itself (tools, system messages): the
    // workspace's next pre-warm includes it, as its next chat most likely will.
    std::vector<segment> carried;
    for (const segment & sg : cr.segments)
        if (ctx.opts.kinds.policy(sg.kind).retention >= retention_class::high) carried.push_back(sg);
    ctx.remember_carried(ws, std::move(carried));
    cr.segments = merge_stored_segments(std::move(*stored), std::move(cr.segments));
    // A stored tools segment is rendered and may become the answer's grammar: the same
    // bounds as a body's.
    if (auto e = check_tools_segments(cr.segments, ctx.opts.bounds)) return e;
    cr.workspace = ws;
    ctx.store.note_use(ws);
    return std::nullopt;
}

// A request made ready for the scheduler: its job (prompt assembled and tokenized here,
// not on the engine thread: a prompt that does not fit is refused without queueing),
// the answer's parser, and the time it took.
struct prepared {
    completion_job job;
    std::shared_ptr<const chat_output_parser> parser;
    request_timings rt;
};

maybe_error prepare(route_context & ctx, const http_request & req, completion_request & cr, prepared & out) {
    const bool with_tools = !cr.tools_json.empty() && cr.tool_choice != tool_choice_mode::none;
    const chat_templates * ct = ctx.sched->chat_template();
    // A template whose answers reason has every chat answer parsed (the reasoning apart
    // from the content) and its reasoning budget kept - unless the request asks for
    // log-probabilities, which are reported per token of the text as generated.
    const bool reasoning = ct && ct->reasons() && cr.sampling.n_logprobs < 0;
    // A prefill continues the answer where the client left it; a template whose answers
    // open a reasoning block would put it inside the reasoning (llama-server refuses it
    // too, with thinking on).
    if (!cr.continuation.empty() && ct && ct->reasons())
        return bad_request("invalid_value",
                           cr.continuation_param +
                               ": the last message is the assistant's, to be continued, but this model's answers open "
                               "with a reasoning block: an answer cannot be continued with it",
                           cr.continuation_param);
    const bool with_answer = cr.shape == api_shape::chat && (with_tools || !cr.json_schema.empty() || reasoning);
    if (with_answer && with_tools && cr.tool_choice == tool_choice_mode::required && !ct)
        return bad_request("unsupported_parameter",
                           "tool_choice requires a call, which needs the model's Jinja chat template "
                           "(the server runs with --no-jinja, or the template did not load)",
                           "tool_choice");
    const auto t_build = steady::now();
    std::shared_ptr<answer_build> answer;
    if (with_answer) answer = start_answer_format(ctx, cr, ct, with_tools);

    completion_job & job = out.job;
    job.turn.workspace = cr.workspace;
    job.turn.segments = std::move(cr.segments);
    job.turn.raw = cr.raw;
    job.turn.suffix = cr.suffix;
    job.turn.continuation = std::move(cr.continuation);
    job.turn.cache_salt = ctx.cache_salt(cr.workspace, cr.cache_salt);
    const auto t_asm = steady::now();
    // A cold prompt with much to tokenize: its leading segments are prefilled while the
    // rest tokenizes here.
    ctx.sched->prefill_ahead(job.turn);
    auto prompt = ctx.sched->assemble(job.turn);
    out.rt.assemble_ms = ms_since(t_asm);
    if (answer) {
        // Its error first, as when it was built before the prompt.
        const auto t_wait = steady::now();
        maybe_error refusal;
        auto af = wait_answer_format(ctx, req, *answer,
                                     t_build + std::chrono::milliseconds(ctx.opts.grammar_deadline_ms), refusal);
        out.rt.answer_wait_ms = ms_since(t_wait);
        if (refusal) return refusal;
        const char * param = with_tools && ct ? "tool_choice" : "response_format";
        if (!af.ok()) return error_from_status(af.error(), param);
        if (af->grammar_bytes > ctx.opts.bounds.max_grammar_bytes)
            return bad_request("grammar_too_large",
                               std::string("the answer's grammar (tools, or a JSON schema) is ") +
                                   with_commas(af->grammar_bytes) + " bytes as built; at most " +
                                   with_commas(ctx.opts.bounds.max_grammar_bytes) +
                                   " are allowed (the server's --max-grammar-bytes)",
                               param);
        cr.sampling = std::move(af->sampling);
        out.parser = std::move(af->af.parser);
        job.gen = std::move(af->gen);
    }
    if (!prompt.ok()) return error_from_status(prompt.error());
    job.turn.assembled = std::make_shared<const assembled_prompt>(std::move(*prompt));
    job.turn.sampling = cr.sampling;
    return std::nullopt;
}

api_error submit_error(const status & st) {
    if (st.code() == status_code::resource_exhausted)
        return too_many_requests("queue_full", "the request queue is full: " + st.message() + "; retry after a second",
                                 1);
    if (st.code() == status_code::failed_precondition) return unavailable("the engine is stopping: " + st.message(), 1);
    return error_from_status(st);
}

// ---- the answer as it grows -----------------------------------------------------------

// An answer parsed by the template's tool-call format while it streams: the raw text so
// far, and what of its parse has been sent (content bytes; per call, whether its head
// went out and how many bytes of arguments).
struct answer_parse {
    std::shared_ptr<const chat_output_parser> parser;
    bool parallel = true;     // parallel_tool_calls: else only the first call is sent
    std::string raw;
    size_t content_sent = 0;
    size_t reasoning_sent = 0;
    std::vector<size_t> args_sent;
    bool any_call = false;

    // What brings a client from what it has to `now`: new content, each new call's head
    // (id, name), new argument bytes. A parse that rewrote what was sent (content that
    // turned out to open a call) sends only what extends it.
    answer_delta advance(parsed_answer now, const std::string & response_id) {
        name_calls(now, response_id);
        answer_delta d;
        if (now.reasoning.size() > reasoning_sent) {
            d.reasoning = now.reasoning.substr(reasoning_sent);
            reasoning_sent = now.reasoning.size();
        }
        if (now.content.size() > content_sent) {
            d.text = now.content.substr(content_sent);
            content_sent = now.content.size();
        }
        for (size_t i = 0; i < now.tool_calls.size() && (parallel || i == 0); ++i) {
            const parsed_tool_call & c = now.tool_calls[i];
            if (i >= args_sent.size()) {
                if (c.name.empty()) break;  // its head is not complete yet
                d.calls.push_back({i, true, c.id, c.name, c.arguments});
                args_sent.push_back(c.arguments.size());
                any_call = true;
            } else if (c.arguments.size() > args_sent[i]) {
                d.calls.push_back({i, false, {}, {}, c.arguments.substr(args_sent[i])});
                args_sent[i] = c.arguments.size();
            }
        }
        return d;
    }
    // The text so far, parsed (partial) or finished; nullopt when it does not parse.
    std::optional<answer_delta> step(const std::string & more, bool partial, const std::string & response_id) {
        raw += more;
        auto p = parser->parse(raw, partial);
        if (!p.ok()) return std::nullopt;
        return advance(std::move(*p), response_id);
    }
};

// ---- whole ------------------------------------------------------------------------------

// Waits for the answer and renders it whole.
void answer_whole(route_context & ctx, const http_request & req, http_response & res, request_log & log,
                  const completion_request & cr, prepared & p, std::shared_ptr<request_channel> ch,
                  std::deque<timed_event> pending, const response_meta & meta, renderer & r) {
    std::string text;
    std::vector<token_logprobs> lps;
    prefill_progress progress;
    auto t_asked = steady::now();
    for (;;) {
        while (!pending.empty()) {
            timed_event te = std::move(pending.front());
            pending.pop_front();
            note_event(log, te);
            note_progress(ctx, log, te.ev, progress);
            const completion_event & ev = te.ev;
            if (ev.what == completion_event::kind::delta) {
                text += ev.text;
                lps.insert(lps.end(), ev.logprobs.begin(), ev.logprobs.end());
            } else if (ev.what == completion_event::kind::error) {
                return r.error_response(res, log, job_error(ev.error));
            } else if (ev.what == completion_event::kind::done) {
                std::optional<parsed_answer> parsed;
                if (p.parser) {
                    // An answer the format cannot parse (cut short by max_tokens, say) is
                    // returned as text.
                    auto pa = p.parser->parse(text, /*partial=*/false);
                    if (!pa.ok()) pa = p.parser->parse(text, /*partial=*/true);
                    if (pa.ok()) {
                        parsed = std::move(*pa);
                        keep_whole_calls(*parsed, cr.parallel_tool_calls);
                        name_calls(*parsed, meta.id);
                    }
                }
                answer_end end{ev.finish, parsed && !parsed->tool_calls.empty() && !is_cut(ev.finish), ev.usage,
                               report_of(cr.workspace, ev, p.rt)};
                ctx.turns.note({unix_ms_now(), end.report, ev.usage});
                whole_answer a{text, parsed ? &*parsed : nullptr,
                               cr.sampling.n_logprobs >= 0 ? logprobs_json(meta.shape, lps) : json(nullptr),
                               std::move(end)};
                return send_json(res, 200, r.whole(a));
            }
        }
        for (auto & te : ch->pop_all(k_poll)) pending.push_back(std::move(te));
        // Asked at most every k_poll, whether events flow or not.
        if (const auto now = steady::now(); now - t_asked >= k_poll) {
            t_asked = now;
            if (req.client_gone && req.client_gone()) {
                ch->cancel();
                return r.error_response(res, log, client_gone_error());
            }
        }
    }
}

// ---- streamed ---------------------------------------------------------------------------

// A streamed completion, between the handler's return and the stream's end.
struct stream_state {
    route_context * ctx = nullptr;
    std::shared_ptr<request_channel> ch;
    std::shared_ptr<request_log> log;
    std::shared_ptr<renderer> r;
    std::string response_id;    // names the calls
    std::string workspace;
    request_timings timings;
    std::deque<timed_event> pending;
    bool opened = false;
    bool finished = false;      // the stream's last bytes were written, or the client left
    prefill_progress progress;
    bool logprobs = false;      // the request asked for them
    size_t text_bytes = 0;      // text sent so far (a completion's text_offset)
    std::optional<answer_parse> parse;  // an answer with a tool-call format
    steady::time_point t_last_write{};
};

// Writes `data`; on failure (the client went away) cancels the job.
bool write_or_cancel(stream_state & st, chunk_sink & sink, const std::string & data) {
    if (data.empty()) return true;  // a chunk of nothing would end a chunked body
    st.t_last_write = steady::now();
    if (sink.write(data)) return true;
    st.ch->cancel();
    st.finished = true;
    st.ctx->finish(*st.log, k_status_client_closed);
    return false;
}

// What became of the stream after an event.
enum class step { more, ended, lost };  // lost: the client went away

step written(bool ok) { return ok ? step::more : step::lost; }

// The stream's last bytes: written, and the request finished.
step write_last(stream_state & st, chunk_sink & sink, const std::string & data) {
    if (!write_or_cancel(st, sink, data)) return step::lost;
    st.finished = true;
    sink.done();
    st.ctx->finish(*st.log, 200);
    return step::ended;
}

// Writes what one event adds to the stream.
step stream_event(stream_state & st, chunk_sink & sink, const completion_event & ev) {
    renderer & r = *st.r;
    switch (ev.what) {
        case completion_event::kind::admitted:
        case completion_event::kind::progress:
        case completion_event::kind::started: return step::more;
        case completion_event::kind::delta: {
            if (st.parse) {
                auto d = st.parse->step(ev.text, /*partial=*/true, st.response_id);
                if (!d) return step::more;
                const std::string out = r.delta(*d);
                return out.empty() ? step::more : written(write_or_cancel(st, sink, out));
            }
            if (ev.text.empty()) return step::more;
            answer_delta d;
            d.text = ev.text;
            d.logprobs = st.logprobs ? &ev.logprobs : nullptr;
            d.text_offset = st.text_bytes;
            st.text_bytes += ev.text.size();
            return written(write_or_cancel(st, sink, r.delta(d)));
        }
        case completion_event::kind::done: {
            std::string out;
            // The final parse: what the partial ones held back (a call's last bytes).
            if (st.parse)
                if (auto d = st.parse->step("", /*partial=*/false, st.response_id)) out += r.delta(*d);
            answer_end end{ev.finish, st.parse && st.parse->any_call && !is_cut(ev.finish), ev.usage,
                           report_of(st.workspace, ev, st.timings)};
            st.ctx->turns.note({unix_ms_now(), end.report, ev.usage});
            out += r.finish(end);
            return write_last(st, sink, out);
        }
        case completion_event::kind::error: {
            // Headers are sent: the error travels in the stream.
            api_error e = job_error(ev.error);
            st.log->error_code = e.code;
            return write_last(st, sink, r.stream_error(e));
        }
    }
    return step::more;
}

// One call of the transport: the renderer's opening first, then whatever events are
// there (waiting up to k_poll for some). true: call again (or done() was called).
bool stream_step(stream_state & st, chunk_sink & sink) {
    if (st.finished) return false;
    if (!st.opened) {
        // At once, before any token: the headers and the opening go out.
        st.opened = true;
        if (!write_or_cancel(st, sink, st.r->open())) return false;
    }
    if (st.pending.empty()) {
        for (auto & te : st.ch->pop_all(k_poll)) st.pending.push_back(std::move(te));
        if (st.pending.empty()) {
            // Nothing yet (queued or prefilling): a comment now and then, so proxies and
            // clients see the connection alive and a client that left is noticed (its
            // job cancelled) without waiting for the first token. The comment tells how
            // far the prefill has got, once it is admitted.
            if (steady::now() - st.t_last_write < std::chrono::milliseconds(st.ctx->opts.sse_keep_alive_ms))
                return true;
            const std::string comment = st.progress.pos < 0
                                            ? std::string(": keep-alive\n\n")
                                            : ": keep-alive prefill " + std::to_string(st.progress.pos) + "/" +
                                                  std::to_string(st.progress.end) + "\n\n";
            return write_or_cancel(st, sink, st.r->waiting(comment));  // the transport calls again
        }
    }
    while (!st.pending.empty()) {
        timed_event te = std::move(st.pending.front());
        st.pending.pop_front();
        note_event(*st.log, te);
        note_progress(*st.ctx, *st.log, te.ev, st.progress);
        const step s = stream_event(st, sink, te.ev);
        if (s == step::lost) return false;
        if (s == step::ended) return true;
    }
    return true;
}

// Hands the answer to the transport as a stream; the channel stays registered until
// the stream ends (stream_end).
void answer_streamed(route_context & ctx, http_response & res, const std::shared_ptr<request_log> & log,
                     const completion_request & cr, prepared & p, std::shared_ptr<request_channel> ch,
                     std::deque<timed_event> pending, const response_meta & meta, std::shared_ptr<renderer> r) {
    auto st = std::make_shared<stream_state>();
    st->ctx = &ctx;
    st->ch = std::move(ch);
    st->log = log;
    st->r = std::move(r);
    st->response_id = meta.id;
    st->workspace = cr.workspace;
    st->timings = p.rt;
    st->logprobs = cr.sampling.n_logprobs >= 0;
    if (p.parser) {
        st->parse.emplace();
        st->parse->parser = p.parser;
        st->parse->parallel = cr.parallel_tool_calls;
    }
    st->pending = std::move(pending);
    log->deferred = true;
    res.status = 200;
    res.headers.emplace_back("Cache-Control", "no-cache");
    res.headers.emplace_back("X-Accel-Buffering", "no");
    res.content_type = st->r->stream_content_type();
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

// Waits for the job's first event - `admitted`, as soon as a work sequence takes the
// job, before its prefill: an error before that (prompt too long, bad segment) is still a
// plain HTTP error, even for a stream; a stream's headers go out right after it. A stream
// waits at most sse_keep_alive_ms (queued behind busy work sequences): then its headers
// go out anyway, and a later error travels in the stream. false: the client left.
bool wait_first_event(route_context & ctx, const http_request & req, const completion_request & cr,
                      request_channel & ch, std::deque<timed_event> & pending) {
    const auto t_wait = steady::now();
    while (pending.empty()) {
        for (auto & te : ch.pop_all(k_poll)) pending.push_back(std::move(te));
        if (!cr.stream && pending.empty() && req.client_gone && req.client_gone()) return false;
        if (cr.stream && steady::now() - t_wait >= std::chrono::milliseconds(ctx.opts.sse_keep_alive_ms)) break;
    }
    return true;
}

}  // namespace

void serve_completion(route_context & ctx, const http_request & req, http_response & res,
                      const std::shared_ptr<request_log> & log, completion_request cr, const std::string * path_ws,
                      std::shared_ptr<renderer> r) {
    const auto t_arrival = log->t_start;
    auto fail = [&](api_error e) { r->error_response(res, *log, std::move(e)); };
    if (path_ws)
        if (auto e = merge_workspace(ctx, cr, *path_ws)) return fail(*e);
    if (status st = validate_segments(cr.segments, ctx.opts.kinds); !st.ok()) return fail(error_from_status(st));
    if (cr.workspace.empty()) cr.workspace = derive_workspace(cr.segments);
    log->workspace = cr.workspace;
    if (!ctx.sched) return fail(unavailable("the engine is stopping: no engine", 1));

    prepared p;
    if (auto e = prepare(ctx, req, cr, p)) return fail(*e);
    p.rt.request_ms = ms_since(t_arrival);
    // Gone while the prompt and the grammar were built: nothing is queued.
    if (req.client_gone && req.client_gone()) return fail(client_gone_error());
    auto ch = std::make_shared<request_channel>(cr.stream);
    p.job.sink = [ch](const completion_event & ev) { return ch->push(ev); };
    if (!ctx.register_channel(ch)) return fail(unavailable("the server is shutting down", 1));
    // Unregisters on every path out of this function, unless a stream takes over.
    std::shared_ptr<request_channel> registered = ch;
    struct unregister_guard {
        route_context * ctx;
        std::shared_ptr<request_channel> * ch;
        ~unregister_guard() {
            if (*ch) ctx->unregister_channel(*ch);
        }
    } guard{&ctx, &registered};

    if (status st = ctx.sched->submit(std::move(p.job)); !st.ok()) return fail(submit_error(st));
    std::deque<timed_event> pending;
    if (!wait_first_event(ctx, req, cr, *ch, pending)) {
        ch->cancel();
        return fail(client_gone_error());
    }
    if (!pending.empty() && pending.front().ev.what == completion_event::kind::error)
        return fail(job_error(pending.front().ev.error));

    response_meta meta;
    meta.shape = cr.shape;
    meta.id = ctx.next_request_id(cr.shape == api_shape::chat ? "chatcmpl-" : "cmpl-");
    meta.created = static_cast<int64_t>(std::time(nullptr));
    meta.model = ctx.model_name;
    r->begin(meta, cr);
    if (!cr.stream) return answer_whole(ctx, req, res, *log, cr, p, ch, std::move(pending), meta, *r);
    registered.reset();  // stream_end unregisters
    answer_streamed(ctx, res, log, cr, p, std::move(ch), std::move(pending), meta, std::move(r));
}

}  // namespace warmctx::server_detail
