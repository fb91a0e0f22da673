// runtime/scheduler_impl.h - the state of the engine thread, shared by the files that
// implement it: scheduler.cpp (the thread's loop, admission, engine calls, the public
// calls) and scheduler_jobs.cpp (one job's life: start, prefill chunks, decode steps,
// sampling, retirement, and the events it emits). See scheduler.cpp for the state
// machine of a job.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "warmctx/scheduler.h"

namespace warmctx {

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
    // After its prompt: the decode steps it was in, its sampling, caching its turn.
    uint32_t n_steps = 0;
    double t_step_ms = 0, t_sample_ms = 0, t_finish_ms = 0;
    double t_interleave_ms = 0;  // admitted, waiting while other jobs' chunks and steps ran
    clock_type::time_point t_own_end;  // when its admission or last chunk ended
    std::vector<token_logprobs> logprobs;  // not yet sent with an event
    // Drafts (warmctx/drafts.h): the index over the workspace's text, and the draft the
    // last step decoded after pending_token with the logits of each of its positions.
    std::unique_ptr<draft_index> drafts;
    std::deque<token_id> draft;
    std::vector<std::vector<float>> draft_logits;  // its positions' logits, from draft_at on
    // Where its sampling reads only the first maximum (step_input::first_max_only): that
    // index after its last decoded token (-1: `logits` holds them) and after each draft row.
    token_id first_max = -1;
    std::vector<token_id> draft_first_max;
    size_t draft_at = 0;
    size_t step_drafted = 0, step_accepted = 0;  // the last step's draft, for the pacing
    draft_counters dc;
};

struct scheduler::impl {
    scheduler_options opts;
    std::unique_ptr<context_engine> ce;
    std::vector<std::vector<float>> step_rows;  // a decode step's logits (step())
    std::vector<token_id> step_first_max;       // and its rows' first maxima
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
    std::atomic<uint64_t> a_draft_steps{0}, a_drafted{0}, a_draft_accepted{0};
    std::atomic<uint64_t> a_prewarms_submitted{0}, a_prewarms_replaced{0}, a_prewarms_dropped{0};

    // What jobs() reports of the active jobs, as the engine thread last published it.
    struct active_progress {
        job_progress p;
        clock_type::time_point t_submit;
    };
    mutable std::mutex prog_mu;
    std::vector<active_progress> progress;  // guarded by prog_mu
    void publish_jobs();
    uint64_t n_admitted = 0, n_prefill_rounds = 0;  // engine thread only

    // The counters readers see without waiting on the engine thread.
    mutable std::mutex pub_mu;
    std::shared_ptr<const context_counters> published;
    clock_type::time_point t_published{};
    void publish();

    std::vector<std::unique_ptr<active_job>> slots;  // one per work sequence; engine thread only
    std::thread thread;

    bool emit(active_job & j, const completion_event & ev);

    static void emit_error(queued_job & q, status st);

    completion_usage usage_of(const active_job & j) const;

    static void set_phases(completion_event & ev, const active_job & j);

    // The engine thread's exception boundary: a throw (bad_alloc, say) while serving one
    // job fails that job with `internal` and the thread carries on.
    static status thrown(const char * where);

    void admit(size_t slot, queued_job q);

    // Assembles and prefills the job in work sequence `slot`; emits `started`.
    status start(size_t slot, active_job & j);

    // The prompt of `j` is prefilled: its first token can be sampled; emits `started`.
    void prefilled(active_job & j);

    // One prefill chunk of one prefilling job (see the top of this file for which).
    void prefill_round();
    bool prefill_chunk(active_job & pick);

    // Stops the pre-warm in `slot` at its chunk boundary: what it prefilled is cached
    // (in its work sequence, which a turn of its workspace then reuses in place).
    void preempt(size_t slot);

    // The slot of the active pre-warm (at most one runs), or -1.
    int prewarm_slot() const {
        for (size_t s = 0; s < slots.size(); ++s)
            if (slots[s] && slots[s]->prewarm) return (int)s;
        return -1;
    }

    // Fails a running job after a throw: its error is the last event; it is retired
    // without caching.
    void fail_job(active_job & j, status st);

    // Samples the next token of `j` from its logits, emits text, decides whether it ends
    // (generation_step: the same rules, in the same order, as engine::generate).
    void sample_next(active_job & j);
    // Cuts the rest of j's draft (positions from j.pos on) out of its sequence.
    status drop_draft(active_job & j, seq_id seq);

    void retire(size_t slot);

    // One decode step over every active job that has a token to decode.
    void step();

    void run_calls();

    // Admits queued jobs while admission (admission.h) says so: each into the work
    // sequence its workspace's last turn left, where the turn reuses the prefix in place.
    void admit_queued();

    // The first queued chat, off the queue; a queued pre-warm of its workspace goes too
    // (the chat does its work, and more). REQUIRES mu held, the queue not empty.
    queued_job take_chat();

    void loop();
};

}  // namespace warmctx
