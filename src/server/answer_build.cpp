// The answer's format built beside the prompt's assembly (answer_build.h).
#include "answer_build.h"

#include <chrono>
#include <string>
#include <utility>

namespace warmctx::server_detail {

// The client left a request that is not streamed: its job is cancelled, and the log and
// metrics say 499 (nobody reads the answer).
api_error client_gone_error() {
    api_error e;
    e.http_status = k_status_client_closed;
    e.type = "invalid_request_error";
    e.code = "client_closed";
    e.message = "the client closed the connection";
    return e;
}

void apply_answer_format(answer_format & af, sampling_params & s) {
    s.grammar = std::move(af.grammar);
    s.grammar_lazy = af.grammar_lazy;
    s.grammar_trigger_patterns = std::move(af.trigger_patterns);
    s.grammar_trigger_words = std::move(af.trigger_words);
    s.reasoning_start = af.reasoning_start;
    s.reasoning_ends = af.reasoning_ends;
    s.reasoning_prompt = af.generation_prompt;
    s.preserved_tokens = af.preserved_tokens;
    s.grammar_prefill = std::move(af.generation_prompt);
    for (auto & st : af.additional_stops) s.stop.push_back(std::move(st));
}

namespace {

result<answer_ready> build_answer_format(const answer_request & ar, bool use_template, const sampling_params & sp,
                                         const chat_templates * ct, const scheduler * sched, size_t max_bytes) {
    answer_ready out;
    if (use_template) {
        auto af = ct->answer({}, ar);
        if (!af.ok()) return af.error();
        out.af = std::move(*af);
    } else if (!ar.json_schema.empty()) {
        auto g = json_schema_grammar(ar.json_schema);
        if (!g.ok()) return g.error();
        out.af.grammar = std::move(*g);
    }
    out.grammar_bytes = out.af.grammar.size();
    if (out.grammar_bytes > max_bytes) return out;  // refused by the request: no parse
    out.sampling = sp;
    apply_answer_format(out.af, out.sampling);
    if (auto gen = sched->make_generation(out.sampling); gen.ok()) out.gen = std::move(*gen);
    return out;
}

}  // namespace

std::shared_ptr<answer_build> start_answer_format(route_context & ctx, const completion_request & cr,
                                                  const chat_templates * ct, bool with_tools) {
    answer_request ar{with_tools ? cr.tools_json : std::string(), with_tools ? cr.tool_choice : tool_choice_mode::none,
                      with_tools ? cr.tool_choice_name : std::string(), cr.parallel_tool_calls, cr.json_schema};
    const bool use_template = ct && (with_tools || (ct->reasons() && cr.sampling.n_logprobs < 0));
    auto b = std::make_shared<answer_build>();
    auto work = [b, ar = std::move(ar), use_template, sp = cr.sampling, ct, sched = ctx.sched,
                 max_bytes = ctx.opts.bounds.max_grammar_bytes](bool run) {
        std::optional<result<answer_ready>> r;
        if (run) r.emplace(build_answer_format(ar, use_template, sp, ct, sched, max_bytes));
        std::lock_guard<std::mutex> lk(b->mu);
        if (r)
            b->out = std::move(*r);
        else
            b->skipped = true;
        b->cv.notify_all();
    };
    if (!ctx.grammars.start(std::move(work), b->abandoned)) {
        std::lock_guard<std::mutex> lk(b->mu);
        b->skipped = true;
    }
    return b;
}

// Waits for the build: its result, or an error when the deadline passes, the client
// leaves or the server stops first (the build is then abandoned).
result<answer_ready> wait_answer_format(route_context & ctx, const http_request & req, answer_build & b,
                                        steady::time_point deadline, maybe_error & refusal) {
    std::unique_lock<std::mutex> lk(b.mu);
    for (;;) {
        if (b.out) return std::move(*b.out);
        if (b.skipped) break;
        b.cv.wait_for(lk, std::chrono::milliseconds(20));
        if (b.out || b.skipped) continue;
        if (req.client_gone && req.client_gone())
            refusal = client_gone_error();
        else if (ctx.stopping.load())
            break;
        else if (steady::now() >= deadline) {
            refusal = unavailable("the answer's grammar (tools, or a JSON schema) was not built within " +
                                      std::to_string(ctx.opts.grammar_deadline_ms) +
                                      " ms (the server's --grammar-deadline-ms); retry, or send smaller schemas",
                                  1);
            refusal->code = "grammar_timeout";
        }
        if (refusal) break;
    }
    lk.unlock();
    ctx.grammars.abandon(*b.abandoned);
    if (!refusal) refusal = unavailable("the server is shutting down", 1);
    return failed_precondition("the answer's grammar was not waited for");
}

}  // namespace warmctx::server_detail
