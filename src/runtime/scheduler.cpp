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
#include "warmctx/clock.h"
#include "warmctx/scheduler.h"

#include "admission.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>


namespace warmctx {

namespace {
using clock_type = std::chrono::steady_clock;
struct queued_job {
    completion_job job;
    clock_type::time_point t_submit;
};

struct active_job {
    queued_job q;
    bool prewarm = false;
    pending_turn turn;
    std::unique_ptr<generation_step> gen;  // sampling and stop decisions (shared with engine::generate)
    std::vector<float> logits;   // of the last computed position
    std::vector<float> prompt_logits, gen_logits;  // the turn asked keep_logits
    pos_t pos = 0;               // next position to write
    token_id pending_token = -1; // sampled, to be decoded in the next step
    bool prefilling = false;     // admitted, prompt not yet fully prefilled
    uint64_t admitted = 0;       // admission order (the oldest prefilling job is never starved)
    bool finished = false;
    bool cancelled = false;
    bool failed = false;         // cancelled because serving it failed (counted as failed)
    bool kv_suspect = false;     // a decode failed: its sequence's KV is not cached
    finish_reason finish = finish_reason::length;
    double t_queue_ms = 0, t_first_token_ms = 0;
    double t_sampler_ms = 0;     // building its sampler chain (a grammar's too) at admission
    double t_interleave_ms = 0;  // admitted, waiting while other jobs' chunks and steps ran
    clock_type::time_point t_own_end;  // when its admission or last chunk ended
    std::vector<token_logprobs> logprobs;  // not yet sent with an event
};
}  // namespace

struct scheduler::impl {
    scheduler_options opts;
    std::unique_ptr<context_engine> ce;
    model_info minfo;
    context_info cinfo;

    // Guarded by mu: the queue, the calls, `stopping`.
    std::mutex mu;
    std::condition_variable cv;
    std::deque<queued_job> queue;
    std::deque<queued_job> prewarms;  // at most one per workspace
    struct pending_call {
        const std::function<void(context_engine &)> * fn;
        bool done = false;
        status outcome;  // internal when fn threw: an exception never crosses the engine thread
    };
    std::deque<pending_call *> calls;
    std::condition_variable calls_done;
    bool stopping = false;

    // Written by the engine thread only; read by stats() without the lock.
    std::atomic<size_t> a_queue_depth{0}, a_active{0};
    std::atomic<uint64_t> a_submitted{0}, a_rejected{0}, a_cancelled{0}, a_completed{0}, a_failed{0}, a_batched{0};
    std::atomic<size_t> a_prefilling{0};
    std::atomic<uint64_t> a_prefill_remaining{0}, a_prefill_chunks{0};
    std::atomic<size_t> a_prewarm_depth{0};
    std::atomic<uint64_t> a_prewarms_submitted{0}, a_prewarms_replaced{0}, a_prewarms_dropped{0};

    // What jobs() reports of the active jobs, as the engine thread last published it.
    struct active_progress {
        job_progress p;
        clock_type::time_point t_submit;
    };
    mutable std::mutex prog_mu;
    std::vector<active_progress> progress;  // guarded by prog_mu
    void publish_jobs() {
        std::vector<active_progress> v;
        for (auto & j : slots) {
            if (!j) continue;
            active_progress a;
            a.t_submit = j->q.t_submit;
            a.p.workspace = j->turn.workspace;
            a.p.prewarm = j->prewarm;
            a.p.what = j->prefilling ? job_progress::state::prefilling : job_progress::state::generating;
            a.p.prompt_tokens = j->prewarm ? j->turn.prefill_end : (pos_t)j->turn.ap.tokens.size();
            a.p.cached_tokens = j->turn.reused;
            a.p.prefill_pos = j->turn.prefill_pos;
            a.p.generated = j->gen ? j->gen->n_generated() : 0;
            v.push_back(std::move(a));
        }
        std::lock_guard<std::mutex> lk(prog_mu);
        progress = std::move(v);
    }
    uint64_t n_admitted = 0, n_prefill_rounds = 0;  // engine thread only

    // The counters readers see without waiting on the engine thread.
    mutable std::mutex pub_mu;
    std::shared_ptr<const context_counters> published;
    clock_type::time_point t_published{};
    void publish() {
        auto c = std::make_shared<const context_counters>(ce->counters());
        t_published = clock_type::now();
        std::lock_guard<std::mutex> lk(pub_mu);
        published = std::move(c);
    }

    std::vector<std::unique_ptr<active_job>> slots;  // one per work sequence; engine thread only
    std::thread thread;

    bool emit(active_job & j, const completion_event & ev) {
        if (j.cancelled) return false;
        bool keep = true;
        try {
            keep = j.q.job.sink(ev);
        } catch (...) {
            keep = false;  // a throwing sink is a gone client
        }
        if (!keep) j.cancelled = true;
        return keep;
    }

    static void emit_error(queued_job & q, status st) {
        completion_event ev;
        ev.what = completion_event::kind::error;
        ev.error = std::move(st);
        try { q.job.sink(ev); } catch (...) {}
    }

    completion_usage usage_of(const active_job & j) const {
        completion_usage u;
        u.prompt_tokens = j.turn.explain.n_prompt_tokens;
        u.cached_tokens = j.turn.explain.n_reused;
        u.completion_tokens = j.gen ? j.gen->n_generated() : 0;
        return u;
    }

    static void set_phases(completion_event & ev, const active_job & j) {
        const pending_turn & t = j.turn;
        ev.t_assemble_ms = t.t_assemble_ms;
        ev.t_restore_ms = t.t_restore_ms;
        ev.t_copy_ms = t.t_copy_ms;
        ev.t_prefill_ms = t.t_prefill_ms;
        ev.t_write_back_ms = t.t_write_back_ms;
        ev.t_lookup_ms = t.t_lookup_ms;
        ev.t_sampler_ms = j.t_sampler_ms;
        ev.t_interleave_ms = j.t_interleave_ms;
    }

    // The engine thread's exception boundary: a throw (bad_alloc, say) while serving one
    // job fails that job with `internal` and the thread carries on.
    static status thrown(const char * where) {
        try {
            throw;
        } catch (const std::exception & e) {
            return internal_error(std::string(where) + ": " + e.what());
        } catch (...) {
            return internal_error(std::string(where) + ": unknown exception");
        }
    }

    void admit(size_t slot, queued_job q) {
        auto j = std::make_unique<active_job>();
        j->q = std::move(q);
        status st;
        try {
            st = start(slot, *j);
        } catch (...) {
            st = thrown("admitting the job");
        }
        if (!st.ok()) {  // `j` goes, and with it its pending turn (aborted)
            a_failed++;
            emit_error(j->q, st);
            return;
        }
        slots[slot] = std::move(j);
        a_active++;
    }

    // Assembles and prefills the job in work sequence `slot`; emits `started`.
    status start(size_t slot, active_job & j) {
        if (opts.before_admit) opts.before_admit(j.q.job.turn);
        j.t_queue_ms = ms_between(j.q.t_submit, clock_type::now());
        j.prewarm = j.q.job.turn.prewarm;
        if (!j.prewarm) {
            const auto ts = clock_type::now();
            auto gen = ce->start_generation(j.q.job.turn.sampling);
            if (!gen.ok()) return gen.error();
            j.gen = std::move(gen.value());
            j.t_sampler_ms = ms_between(ts, clock_type::now());
        }
        auto t = ce->begin_turn_deferred(j.q.job.turn, (seq_id)slot);
        if (!t.ok()) return t.error();
        j.t_own_end = clock_type::now();
        j.turn = std::move(t.value());
        j.prefilling = true;
        j.admitted = ++n_admitted;
        completion_event ev;
        ev.what = completion_event::kind::admitted;
        ev.usage = usage_of(j);
        ev.explain = j.turn.explain;
        ev.prefill_pos = j.turn.prefill_pos;
        ev.prefill_end = j.turn.prefill_end;
        ev.t_queue_ms = j.t_queue_ms;
        emit(j, ev);
        if (j.prewarm && j.turn.prefilled()) prefilled(j);  // everything cached already
        return {};
    }

    // The prompt of `j` is prefilled: its first token can be sampled; emits `started`.
    void prefilled(active_job & j) {
        j.prefilling = false;
        if (j.prewarm) {  // nothing to generate: retired (and cached) next
            j.finished = true;
            return;
        }
        if (j.q.job.turn.keep_logits) j.prompt_logits = j.logits;
        j.pos = (pos_t)j.turn.ap.tokens.size();
        j.t_first_token_ms = ms_between(j.q.t_submit, clock_type::now());
        completion_event ev;
        ev.what = completion_event::kind::started;
        ev.usage = usage_of(j);
        ev.explain = j.turn.explain;
        ev.t_queue_ms = j.t_queue_ms;
        ev.t_first_token_ms = j.t_first_token_ms;
        set_phases(ev, j);
        emit(j, ev);
    }

    // One prefill chunk of one prefilling job (see the top of this file for which).
    void prefill_round() {
        active_job * pick = nullptr;
        active_job * background = nullptr;  // a pre-warm: only when no chat prefills
        const bool oldest = ++n_prefill_rounds % 4 == 0;
        size_t n = 0;
        uint64_t remaining = 0;
        bool generating = false;  // a chat decodes this round
        for (auto & j : slots) {
            if (j && !j->prefilling && !j->prewarm && !j->finished && !j->cancelled) generating = true;
            if (!j || !j->prefilling || j->cancelled) continue;
            ++n;
            remaining += (uint64_t)j->turn.prefill_remaining();
            if (j->prewarm) {
                background = j.get();
                continue;
            }
            if (!pick || (oldest ? j->admitted < pick->admitted
                                 : j->turn.prefill_remaining() < pick->turn.prefill_remaining()))
                pick = j.get();
        }
        if (!pick && background && (!generating || background->q.job.turn.ahead)) pick = background;
        a_prefilling = n;
        a_prefill_remaining = remaining;
        if (!pick) return;
        const pos_t before = pick->turn.prefill_remaining();
        status st;
        pick->t_interleave_ms += ms_between(pick->t_own_end, clock_type::now());
        try {
            st = ce->prefill_some(pick->turn, 1, pick->logits);  // one chunk
        } catch (...) {
            st = thrown("prefilling");
        }
        pick->t_own_end = clock_type::now();
        a_prefill_chunks++;
        a_prefill_remaining = remaining - (uint64_t)(before - pick->turn.prefill_remaining());
        if (!st.ok()) {
            fail_job(*pick, st);
            return;
        }
        if (opts.after_prefill_chunk) opts.after_prefill_chunk(pick->q.job.turn, pick->turn.prefill_pos);
        if (pick->turn.prefilled()) {
            a_prefilling = n - 1;
            prefilled(*pick);
        } else if (!pick->prewarm) {
            completion_event ev;
            ev.what = completion_event::kind::progress;
            ev.prefill_pos = pick->turn.prefill_pos;
            ev.prefill_end = pick->turn.prefill_end;
            emit(*pick, ev);
        }
        publish_jobs();
    }

    // Stops the pre-warm in `slot` at its chunk boundary: what it prefilled is cached
    // (in its work sequence, which a turn of its workspace then reuses in place).
    void preempt(size_t slot) {
        active_job & j = *slots[slot];
        a_active--;
        try {
            status st = ce->finish_turn(j.turn, 0);
            (void)st;  // a failed cache update only loses the pre-warm's work
        } catch (...) {
        }
        slots[slot].reset();
        publish_jobs();
    }

    // The slot of the active pre-warm (at most one runs), or -1.
    int prewarm_slot() const {
        for (size_t s = 0; s < slots.size(); ++s)
            if (slots[s] && slots[s]->prewarm) return (int)s;
        return -1;
    }

    // Fails a running job after a throw: its error is the last event; it is retired
    // without caching.
    void fail_job(active_job & j, status st) {
        completion_event ev;
        ev.what = completion_event::kind::error;
        ev.error = std::move(st);
        emit(j, ev);
        j.cancelled = true;
        j.failed = true;
        j.kv_suspect = true;
    }

    // Samples the next token of `j` from its logits, emits text, decides whether it ends
    // (generation_step: the same rules, in the same order, as engine::generate).
    void sample_next(active_job & j) {
        if (j.q.job.turn.keep_logits && j.gen->n_generated() < j.q.job.turn.sampling.max_tokens)
            j.gen_logits.insert(j.gen_logits.end(), j.logits.begin(), j.logits.end());
        auto d = j.gen->next(j.logits, j.pos);
        if (d.logprobs) j.logprobs.push_back(std::move(*d.logprobs));
        if (!d.delta.empty()) {
            completion_event ev;
            ev.what = completion_event::kind::delta;
            ev.text = std::move(d.delta);
            ev.token = d.token;
            ev.logprobs = std::move(j.logprobs);
            j.logprobs.clear();
            if (!emit(j, ev)) return;
        }
        if (d.finished) {
            j.finished = true;
            j.finish = d.finish;
            return;
        }
        j.pending_token = d.token;
    }

    void retire(size_t slot) {
        active_job & j = *slots[slot];
        // First, so that anyone who sees this job's last event or its counter sees it
        // no longer active.
        a_active--;
        if (j.cancelled) {
            // A client that left (or a stop) keeps what its prefill computed: the blocks
            // done so far are cached, as a pre-warm stopped early keeps them, so a retry
            // of the same request starts from them. A failed decode keeps nothing.
            if (j.kv_suspect) {
                ce->abort_turn(j.turn);
            } else {
                status st = ce->finish_turn(j.turn, 0);
                (void)st;  // nobody waits for it
                publish();
            }
            (j.failed ? a_failed : a_cancelled)++;
        } else if (j.prewarm) {
            status st = ce->finish_turn(j.turn, 0);
            (void)st;  // nobody waits for a pre-warm; its counters say what it did
            publish();
        } else {
            std::string rest = j.gen->finish();
            if (!rest.empty()) {
                completion_event ev;
                ev.what = completion_event::kind::delta;
                ev.text = std::move(rest);
                ev.logprobs = std::move(j.logprobs);
                j.logprobs.clear();
                emit(j, ev);
            }
            status st = ce->finish_turn(j.turn, (size_t)j.gen->n_generated());
            publish();  // before the client hears it is done
            completion_event ev;
            if (st.ok()) {
                ev.what = completion_event::kind::done;
                ev.finish = j.finish;
                ev.usage = usage_of(j);
                ev.explain = j.turn.explain;
                ev.t_queue_ms = j.t_queue_ms;
                ev.t_first_token_ms = j.t_first_token_ms;
                set_phases(ev, j);
                ev.t_total_ms = ms_between(j.q.t_submit, clock_type::now());
                if (j.q.job.turn.keep_logits) {
                    ev.tokens = j.gen->tokens();
                    ev.prompt_logits = std::move(j.prompt_logits);
                    ev.gen_logits = std::move(j.gen_logits);
                }
                a_completed++;
            } else {
                ev.what = completion_event::kind::error;
                ev.error = st;
                a_failed++;
            }
            emit(j, ev);
        }
        slots[slot].reset();
        publish_jobs();
        // The disk write-through of what the turn cached, now that its answer is out.
        ce->flush_deferred_writes();
        publish();
    }

    // One decode step over every active job that has a token to decode.
    void step() {
        std::vector<step_input> in;
        std::vector<size_t> who;
        for (size_t s = 0; s < slots.size(); ++s) {
            auto & j = slots[s];
            if (!j || j->prefilling || j->finished || j->cancelled || j->pending_token < 0) continue;
            in.push_back({(seq_id)s, j->pending_token, j->pos});
            who.push_back(s);
        }
        if (in.empty()) return;
        std::vector<std::vector<float>> logits;
        status st = ce->decode_step(in, logits);
        if (in.size() > 1) a_batched++;
        for (size_t k = 0; k < who.size(); ++k) {
            active_job & j = *slots[who[k]];
            j.pending_token = -1;
            if (!st.ok()) {
                completion_event ev;
                ev.what = completion_event::kind::error;
                ev.error = st;
                emit(j, ev);
                j.cancelled = true;  // retire without caching
                j.kv_suspect = true;
                continue;
            }
            j.pos++;
            j.logits = std::move(logits[k]);
        }
    }

    void run_calls() {
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

    // Admits queued jobs while admission (admission.h) says so: each into the work
    // sequence its workspace's last turn left, where the turn reuses the prefix in place.
    void admit_queued() {
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
                if (!queue.empty()) in.next_chat = queue.front().job.turn.workspace;
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

    // The first queued chat, off the queue; a queued pre-warm of its workspace goes too
    // (the chat does its work, and more). REQUIRES mu held, the queue not empty.
    queued_job take_chat() {
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

    void loop() {
        for (;;) {
            run_calls();
            admit_queued();
            // Sample for every job that has fresh logits, then decode them together.
            for (auto & j : slots) {
                if (!j || j->prefilling || j->finished || j->cancelled || j->pending_token >= 0) continue;
                try {
                    sample_next(*j);
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
            if (ms_between(t_published, clock_type::now()) >= 250) {
                try {
                    publish();
                    publish_jobs();
                } catch (...) {}
            }

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
                    try {
                        saved = ce->write_back_ahead();
                    } catch (...) {
                    }
                }
                if (saved) continue;
            }
            std::unique_lock<std::mutex> lk(mu);
            if (stopping && !any_active) break;
            if (!any_active && queue.empty() && prewarms.empty() && calls.empty())
                cv.wait(lk, [&] { return stopping || !queue.empty() || !prewarms.empty() || !calls.empty(); });
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
};

scheduler::scheduler(std::unique_ptr<impl> p) : p_(std::move(p)) {}

scheduler::~scheduler() { stop(); }

result<std::unique_ptr<scheduler>> scheduler::start(const scheduler_options & opts) {
    if (opts.n_parallel < 1 || opts.n_parallel > 64) return invalid_argument("n_parallel must be in [1, 64]");
    if (opts.max_queue < 1) return invalid_argument("max_queue must be at least 1");
    auto p = std::make_unique<impl>();
    p->opts = opts;
    context_engine_options co = opts.engine;
    co.n_work_seqs = opts.n_parallel;
    auto ce = context_engine::open(co);
    if (!ce.ok()) return ce.error();
    p->ce = std::move(ce.value());
    p->minfo = p->ce->model();
    p->cinfo = p->ce->context();
    p->slots.resize(p->ce->n_work_seqs());  // n_parallel, and the resident streams
    impl * raw = p.get();
    p->publish();
    p->thread = std::thread([raw] { raw->loop(); });
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
    req.prewarm = true;
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
    if (req.prewarm || !req.cache || !req.add_generation_prompt) return false;
    if (!p_->ce->check_plausible(req).ok()) return false;
    turn_request lead;
    lead.workspace = req.workspace;
    lead.segments = p_->ce->leading_segments(req, p_->opts.prefill_ahead_min_bytes, p_->opts.prefill_ahead_lead_bytes);
    if (lead.segments.empty()) return false;
    lead.ahead = true;
    auto ap = p_->ce->assemble_request(lead);
    if (!ap.ok()) return false;  // the whole prompt's assembly will say why
    lead.assembled = std::make_shared<const assembled_prompt>(std::move(*ap));
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
    auto ap = p_->ce->assemble_request(req);
    if (ap.ok()) WARMCTX_RETURN_IF_ERROR(p_->ce->check_fits(*ap));
    return ap;
}

result<assembled_prompt> scheduler::assemble_unchecked(const turn_request & req) const {
    return p_->ce->assemble_request(req);
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
