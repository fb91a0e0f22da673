// The engine thread: admission, continuous batching of decode steps, cancellation.
//
// State machine of a job:
//   queued ──admit──▶ prefilling ──chunk…──▶ prefilled ──step…──▶ finished
//      │                 │ error / cancelled              │ cancelled / error
//      └─ stop() ─▶ error └──────▶ error event, freed    └──────▶ sequence freed
//
// Admission only assembles the prompt and reuses its cached prefix; the rest is
// prefilled one canonical chunk per loop round, each chunk its own decode call carrying
// only that sequence (the same calls as a cold run, so the KV is the same). Each round
// runs, in order: the decode step of every generating job, then one prefill chunk of
// the prefilling job with the fewest tokens left (a warm tail before a cold prompt) -
// except every fourth chunk, which goes to the job admitted longest ago, so a cold
// prompt keeps progressing under a stream of warm turns.
//
// Pre-warms (prewarm()) are the lowest priority: one at a time, admitted only into a
// free work sequence when no chat waits, and given a chunk only in a round where no
// chat's prompt is prefilling and, unless it prefills a waiting request's leading
// segments (prefill_ahead), no chat is generating: a speculative chunk between two
// decode steps would slow every generating chat by a whole chunk's time. A chat that
// needs a work sequence, or is of the pre-warm's workspace, preempts it: finish_turn
// caches the blocks prefilled so far (every chunk end is a block end) and the chat
// starts from them.
#include <future>

#include "util/clock.h"
#include "warmctx/scheduler.h"

#include "admission.h"

#include "scheduler_impl.h"

namespace warmctx {

namespace {
std::vector<seq_id> idle_streams(const std::vector<bool> & busy) {
    std::vector<seq_id> idle;
    for (size_t s = 0; s < busy.size(); ++s)
        if (!busy[s]) idle.push_back((seq_id)s);
    return idle;
}
}  // namespace

void scheduler::impl::run_calls() {
    std::unique_lock<std::mutex> lk(mu);
    while (!calls.empty()) {
        pending_call * c = calls.front();
        calls.pop_front();
        lk.unlock();
        try {
            (*c->fn)(*ce);
        } catch (const std::exception & e) {
            c->outcome = internal_error(std::string("a call on the engine thread threw: ") + e.what());
        } catch (...) {
            c->outcome = internal_error("a call on the engine thread threw");
        }
        try { publish(); } catch (...) {}  // what the call changed, before its caller reads it
        lk.lock();
        c->done = true;
    }
    calls_done.notify_all();
}

void scheduler::impl::admit_queued() {
    for (;;) {
        admission_input in;
        in.n_parallel = opts.n_parallel;
        in.stream_busy.reserve(slots.size());
        for (const auto & j : slots) in.stream_busy.push_back(j != nullptr);
        in.prewarm_stream = prewarm_slot();
        if (in.prewarm_stream >= 0) in.prewarm_workspace = slots[(size_t)in.prewarm_stream]->turn.workspace;
        admission_step step;
        queued_job q;
        {
            std::lock_guard<std::mutex> lk(mu);
            if (stopping) return;
            if (!queue.empty()) {
                in.next_chat = queue.front().job.turn.workspace;
                in.next_chat_stream = ce->stream_of_workspace(*in.next_chat, idle_streams(in.stream_busy));
            }
            in.prewarm_waiting = !prewarms.empty();
            step = plan_admission(in);
            if (step.what == admission_step::action::admit_chat) q = take_chat();
            if (step.what == admission_step::action::admit_prewarm) {
                q = std::move(prewarms.front());
                prewarms.pop_front();
                a_prewarm_depth = prewarms.size();
            }
        }
        if (step.what == admission_step::action::wait) return;
        if (step.preempt_stream >= 0) preempt((size_t)step.preempt_stream);
        if (step.what == admission_step::action::make_room) continue;
        seq_id s = ce->pick_work_seq(q.job.turn.workspace, step.streams);
        if (s < 0) s = step.streams.front();
        admit((size_t)s, std::move(q));
        publish_jobs();
        run_calls();
    }
}

queued_job scheduler::impl::take_chat() {
    queued_job q = std::move(queue.front());
    queue.pop_front();
    a_queue_depth = queue.size();
    for (auto it = prewarms.begin(); it != prewarms.end(); ++it)
        if (it->job.turn.workspace == q.job.turn.workspace) {
            prewarms.erase(it);
            a_prewarms_dropped++;
            break;
        }
    a_prewarm_depth = prewarms.size();
    return q;
}

void scheduler::impl::loop() {
    for (;;) {
        run_calls();
        admit_queued();
        // Sample for every job that has fresh logits, then decode them together.
        for (auto & j : slots) {
            if (!j || j->prefilling || j->finished || j->cancelled || j->pending_token >= 0) continue;
            try {
                const auto ts = clock_type::now();
                sample_next(*j);
                j->t_sample_ms += ms_between(ts, clock_type::now());
            } catch (...) {
                fail_job(*j, thrown("sampling"));
            }
        }
        for (size_t s = 0; s < slots.size(); ++s) {
            if (!slots[s] || !(slots[s]->finished || slots[s]->cancelled)) continue;
            try {
                retire(s);
            } catch (...) {
                status st = thrown("finishing the job");
                if (slots[s]) {
                    emit_error(slots[s]->q, st);
                    slots[s].reset();  // aborts its turn if still pending
                }
                a_failed++;
            }
        }
        try {
            step();
        } catch (...) {
            status st = thrown("decoding");
            for (auto & j : slots)
                if (j && !j->cancelled && j->pending_token >= 0) fail_job(*j, st);
        }
        prefill_round();
        for (size_t s = 0; s < slots.size(); ++s)
            if (slots[s] && slots[s]->cancelled) retire(s);
        try {
            // A disk write busy turns kept waiting too long: when no request waits and no
            // prompt prefills (the copy delays only the answers being written), or, past
            // twice the bound, whatever waits.
            bool quiet = true;
            for (const auto & j : slots) quiet = quiet && !(j && j->prefilling);
            if (quiet) {
                std::lock_guard<std::mutex> lk(mu);
                quiet = queue.empty();
            }
            ce->write_through_overdue(quiet);
        } catch (...) {
        }
        if (ms_between(t_published, clock_type::now()) >= 250) {
            try {
                publish();
                publish_jobs();
            } catch (...) {}
        }

        std::chrono::milliseconds retry_ahead{0};  // write_back_ahead: ask again after this
        bool any_active = false;
        for (auto & j : slots) any_active |= (bool)j;
        if (!any_active) {
            // Idle: save ahead what the next displacement would have to save on a
            // turn's way (one stream at a time; the queue is looked at between).
            bool idle = false;
            {
                std::lock_guard<std::mutex> lk(mu);
                idle = !stopping && queue.empty() && prewarms.empty() && calls.empty();
            }
            bool saved = false;
            if (idle) {
                // The disk write-through of what turns cached, once no turn came for a
                // while; then the write-back ahead.
                try {
                    std::chrono::milliseconds retry_write{0};
                    saved = ce->write_through_idle(&retry_write);
                    if (!saved) saved = ce->write_back_ahead(&retry_ahead);
                    if (retry_write.count() > 0 && (retry_ahead.count() == 0 || retry_write < retry_ahead))
                        retry_ahead = retry_write;
                } catch (...) {
                }
            }
            if (saved) continue;
        }
        std::unique_lock<std::mutex> lk(mu);
        if (stopping && !any_active) break;
        if (!any_active && queue.empty() && prewarms.empty() && calls.empty()) {
            const auto woken = [&] { return stopping || !queue.empty() || !prewarms.empty() || !calls.empty(); };
            if (retry_ahead.count() > 0)
                cv.wait_for(lk, retry_ahead, woken);  // then the write-back ahead is asked again
            else
                cv.wait(lk, woken);
        }
        if (stopping) {
            // Fail what is still queued; active jobs are cancelled and retired above.
            while (!queue.empty()) {
                queued_job q = std::move(queue.front());
                queue.pop_front();
                lk.unlock();
                emit_error(q, {status_code::cancelled, "the server is shutting down"});
                a_failed++;
                lk.lock();
            }
            a_queue_depth = 0;
            prewarms.clear();  // nobody waits for them
            a_prewarm_depth = 0;
            for (auto & j : slots)
                if (j) j->cancelled = true;
        }
    }
    run_calls();
}

scheduler::scheduler(std::unique_ptr<impl> p) : p_(std::move(p)) {}

scheduler::~scheduler() { stop(); }

result<std::unique_ptr<scheduler>> scheduler::start(const scheduler_options & opts) {
    if (opts.n_parallel < 1 || opts.n_parallel > 64) return invalid_argument("n_parallel must be in [1, 64]");
    if (opts.max_queue < 1) return invalid_argument("max_queue must be at least 1");
    auto p = std::make_unique<impl>();
    p->opts = opts;
    context_engine_options co = opts.engine;
    co.n_work_seqs = opts.n_parallel;
    // The model is loaded on the engine thread, which runs every decode: llama.cpp's CPU
    // threads (OpenMP) belong to the thread that first computes, and a second thread's
    // team beside them makes each barrier of every decode sleep and wake (on 2 cores a
    // token took twice as long).
    impl * raw = p.get();
    std::promise<status> opened;
    std::future<status> is_open = opened.get_future();
    p->thread = std::thread([raw, co, &opened] {
        result<std::unique_ptr<context_engine>> ce = internal_error("opening the model threw");
        try {
            ce = context_engine::open(co);
        } catch (const std::exception & e) {
            ce = internal_error(std::string("opening the model threw: ") + e.what());
        } catch (...) {
        }
        if (!ce.ok()) {
            opened.set_value(ce.error());
            return;
        }
        raw->ce = std::move(ce.value());
        raw->minfo = raw->ce->model();
        raw->cinfo = raw->ce->context();
        raw->slots.resize(raw->ce->n_work_seqs());  // n_parallel, and the resident streams
        raw->publish();
        opened.set_value({});
        raw->loop();
    });
    if (status st = is_open.get(); !st.ok()) {
        p->thread.join();
        return st;
    }
    return std::unique_ptr<scheduler>(new scheduler(std::move(p)));
}

status scheduler::submit(completion_job job) {
    if (!job.sink) return invalid_argument("a job needs an event sink");
    std::lock_guard<std::mutex> lk(p_->mu);
    if (p_->stopping) return failed_precondition("the scheduler is stopping");
    if (p_->queue.size() >= p_->opts.max_queue) {
        p_->a_rejected++;
        return resource_exhausted("the request queue is full (" + std::to_string(p_->opts.max_queue) + " waiting)");
    }
    p_->queue.push_back({std::move(job), clock_type::now()});
    p_->a_queue_depth = p_->queue.size();
    p_->a_submitted++;
    p_->cv.notify_one();
    return {};
}

status scheduler::prewarm(turn_request req) {
    if (req.kind == turn_kind::answer) req.kind = turn_kind::prewarm;
    req.cache = true;
    // With the generation prompt (never cached) after it, the whole stored context is
    // a cacheable prefix that a lookup may match in full.
    if (!req.add_generation_prompt) req.assembled.reset();
    req.add_generation_prompt = true;
    completion_job job;
    job.turn = std::move(req);
    job.sink = [](const completion_event &) { return true; };
    std::lock_guard<std::mutex> lk(p_->mu);
    if (p_->stopping) return failed_precondition("the scheduler is stopping");
    p_->a_prewarms_submitted++;
    for (auto & q : p_->prewarms)
        if (q.job.turn.workspace == job.turn.workspace) {
            q = {std::move(job), clock_type::now()};  // the newer content, in the older one's place
            p_->a_prewarms_replaced++;
            return {};
        }
    if (p_->prewarms.size() >= p_->opts.max_prewarm_queue) {
        p_->a_prewarms_dropped++;
        return resource_exhausted("the pre-warm queue is full (" + std::to_string(p_->opts.max_prewarm_queue) +
                                  " waiting)");
    }
    p_->prewarms.push_back({std::move(job), clock_type::now()});
    p_->a_prewarm_depth = p_->prewarms.size();
    p_->cv.notify_one();
    return {};
}

bool scheduler::prefill_ahead(const turn_request & req) {
    using mode = scheduler_options::ahead_mode;
    if (p_->opts.prefill_ahead == mode::never || p_->opts.prefill_ahead_min_bytes == 0) return false;
    if (p_->opts.prefill_ahead == mode::gpu) {
        const profile & prof = p_->ce->current_profile();
        if (prof.n_gpu_layers == 0 || prof.backend == "CPU") return false;
    }
    if (is_prewarm(req.kind) || !req.cache || !req.add_generation_prompt) return false;
    if (!p_->ce->check_plausible(req).ok()) return false;
    turn_request lead;
    lead.workspace = req.workspace;
    lead.cache_salt = req.cache_salt;
    lead.segments = p_->ce->leading_segments(req, p_->opts.prefill_ahead_min_bytes, p_->opts.prefill_ahead_lead_bytes);
    if (lead.segments.empty()) return false;
    lead.kind = turn_kind::leading_prewarm;
    auto prompt = p_->ce->assemble_request(lead);
    if (!prompt.ok()) return false;  // the whole prompt's assembly will say why
    lead.assembled = std::make_shared<const assembled_prompt>(std::move(*prompt));
    return prewarm(std::move(lead)).ok();
}

std::string_view job_state_name(job_progress::state s) {
    switch (s) {
        case job_progress::state::queued: return "queued";
        case job_progress::state::prefilling: return "prefilling";
        case job_progress::state::generating: return "generating";
    }
    return "?";
}

std::vector<job_progress> scheduler::jobs() const {
    std::vector<job_progress> out;
    const auto now = clock_type::now();
    {
        std::lock_guard<std::mutex> lk(p_->prog_mu);
        for (const auto & a : p_->progress) {
            out.push_back(a.p);
            out.back().age_ms = ms_between(a.t_submit, now);
        }
    }
    std::lock_guard<std::mutex> lk(p_->mu);
    for (const auto * qu : {&p_->queue, &p_->prewarms}) {
        size_t pos = 0;
        for (const auto & q : *qu) {
            job_progress p;
            p.workspace = q.job.turn.workspace;
            p.prewarm = qu == &p_->prewarms;
            p.queue_position = ++pos;
            p.age_ms = ms_between(q.t_submit, now);
            out.push_back(std::move(p));
        }
    }
    return out;
}

status scheduler::call(const std::function<void(context_engine &)> & fn) {
    impl::pending_call c{&fn};
    std::unique_lock<std::mutex> lk(p_->mu);
    if (p_->stopping && !p_->thread.joinable()) return failed_precondition("the scheduler is stopped");
    p_->calls.push_back(&c);
    p_->cv.notify_one();
    p_->calls_done.wait(lk, [&] { return c.done; });
    return c.outcome;
}

scheduler_stats scheduler::stats() const {
    scheduler_stats s;
    s.queue_depth = p_->a_queue_depth;
    s.active_jobs = p_->a_active;
    s.n_submitted = p_->a_submitted;
    s.n_rejected = p_->a_rejected;
    s.n_cancelled = p_->a_cancelled;
    s.n_completed = p_->a_completed;
    s.n_failed = p_->a_failed;
    s.n_batched_steps = p_->a_batched;
    s.drafts = {p_->a_draft_steps, p_->a_drafted, p_->a_draft_accepted};
    s.prefilling_jobs = p_->a_prefilling;
    s.prefill_remaining_tokens = p_->a_prefill_remaining;
    s.n_prefill_chunks = p_->a_prefill_chunks;
    s.prewarm_queue_depth = p_->a_prewarm_depth;
    s.n_prewarms_submitted = p_->a_prewarms_submitted;
    s.n_prewarms_replaced = p_->a_prewarms_replaced;
    s.n_prewarms_dropped = p_->a_prewarms_dropped;
    return s;
}

result<assembled_prompt> scheduler::assemble(const turn_request & req) const {
    WARMCTX_RETURN_IF_ERROR(p_->ce->check_plausible(req));
    auto prompt = p_->ce->assemble_request(req);
    if (prompt.ok()) WARMCTX_RETURN_IF_ERROR(p_->ce->check_fits(*prompt));
    return prompt;
}

result<std::unique_ptr<generation_step>> scheduler::make_generation(const sampling_params & sp) const {
    return p_->ce->start_generation(sp);
}

result<assembled_prompt> scheduler::assemble_unchecked(const turn_request & req) const {
    return p_->ce->assemble_request(req);
}

result<std::vector<token_id>> scheduler::tokenize(std::string_view text, bool parse_special) const {
    return p_->ce->tokenize(text, parse_special);
}

result<std::string> scheduler::detokenize(std::span<const token_id> tokens, bool special) const {
    return p_->ce->detokenize(tokens, special);
}

std::shared_ptr<const context_counters> scheduler::published_counters() const {
    std::lock_guard<std::mutex> lk(p_->pub_mu);
    return p_->published;
}

const model_info & scheduler::model() const { return p_->minfo; }
const chat_templates * scheduler::chat_template() const { return p_->ce->chat_template(); }
const context_info & scheduler::context() const { return p_->cinfo; }
uint32_t scheduler::n_parallel() const { return p_->opts.n_parallel; }

void scheduler::stop() {
    {
        std::lock_guard<std::mutex> lk(p_->mu);
        p_->stopping = true;
        p_->cv.notify_all();
    }
    if (p_->thread.joinable()) p_->thread.join();
    // Calls that raced with the stop: nobody will run them now.
    std::lock_guard<std::mutex> lk(p_->mu);
    for (auto * c : p_->calls) c->done = true;
    p_->calls.clear();
    p_->calls_done.notify_all();
}

}  // namespace warmctx
