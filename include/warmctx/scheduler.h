// warmctx/scheduler.h - the engine thread: one thread owns the context_engine (and so
// the llama context); other threads submit work through a bounded queue.
//
// Generation jobs run concurrently on up to n_parallel work sequences: each job is
// admitted (assemble, cache lookup, copy of the cached prefix, prefill of the rest),
// then every active job's next token is decoded in ONE batched llama_decode per step
// (continuous batching). A finished job's prompt goes into the prefix cache.
//
// Events are delivered ON THE ENGINE THREAD: a sink must be quick (copy the event into
// a queue of its own, or write to a socket buffer) and must not call back into the
// scheduler. A sink returning false cancels its job (client disconnected): its
// sequence is freed at the next step and no further event is sent.
//
// Exactness: a job decoded alone (n_parallel = 1, or no other job active) is
// bit-identical to a cold run in exact KV mode. Decoded in a batch with other jobs,
// its logits may differ in the last bits (the matrix kernels see another batch shape);
// `warmctx verify` checks the single-job path.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "warmctx/context_engine.h"
#include "warmctx/status.h"

namespace warmctx {

struct completion_usage {
    int32_t prompt_tokens = 0;
    int32_t completion_tokens = 0;
    int32_t cached_tokens = 0;      // prompt tokens whose KV was reused
};

struct completion_event {
    enum class kind {
        admitted, // a work sequence is its own: assembled, cached prefix reused, prefill next;
                  // `explain`, `usage.prompt_tokens/cached_tokens` and the prefill range set
        progress, // a chunk of its prompt was prefilled: `prefill_pos` moved
        started,  // prefill done; `explain` and `usage.prompt_tokens/cached_tokens` set
        delta,    // new generated text (never a partial stop string): `text` of the tokens a
                  // decode step decided (one, or a draft's with the one after it), `token` the last
        done,     // finished; `finish`, `usage`, `explain`, timings set; the last event
        error,    // failed; `error` set; the last event
    };
    kind what = kind::delta;
    std::string text;
    token_id token = -1;
    // delta: the log-probabilities of the tokens whose text this delta completes (the
    // request asked sampling.n_logprobs >= 0); tokens of a stop string are not reported.
    std::vector<token_logprobs> logprobs;
    finish_reason finish = finish_reason::length;
    completion_usage usage;
    explain_report explain;  // started, done
    status error;
    pos_t prefill_pos = 0;        // prompt tokens in its sequence so far (admitted, progress)
    pos_t prefill_end = 0;        // ... of this many (admitted, progress)
    double t_queue_ms = 0;        // submit .. admission (started, done)
    double t_first_token_ms = 0;  // submit .. first token chosen (started, done)
    double t_total_ms = 0;        // submit .. done (done)
    // Where the time to the first token went (started, done): assembling the prompt,
    // restoring a prefix from a tier, copying the cached prefix into the request's
    // sequence (llama.cpp copies the data at the next decode, so inside t_prefill_ms),
    // prefilling the rest.
    double t_assemble_ms = 0, t_restore_ms = 0, t_copy_ms = 0, t_prefill_ms = 0;
    // Taking checkpoints at block ends while prefilling (models that keep them).
    double t_checkpoint_ms = 0;
    // And: saving blocks the turn would overwrite (to the pool, or parked in a free
    // stream), the lookup and explain, building the sampler chain, and waiting while
    // other jobs' prefill chunks and decode steps ran. With queue_ms, these add up to
    // first_token_ms less the engine thread's own bookkeeping.
    double t_write_back_ms = 0, t_lookup_ms = 0, t_sampler_ms = 0, t_interleave_ms = 0;
    // Where the answer's time after first_token_ms went (done): the decode steps it was in
    // (each whole: the job waits for the step), choosing its tokens (sampling, stop
    // strings, the text sent), and caching its turn at the end (finish_turn); the rest is
    // other jobs' work between its steps (their prefill chunks and sampling).
    uint32_t n_decode_steps = 0;
    double t_decode_step_ms = 0, t_sample_ms = 0, t_finish_ms = 0;
    draft_counters drafts;  // done: what drafts from the workspace did for this answer
    // done, for a job whose turn asked keep_logits (verification): every generated token,
    // the logits after the prompt and those of every generation step (n_vocab each),
    // as turn_result carries them for run_turn and run_cold.
    std::vector<token_id> tokens;
    std::vector<float> prompt_logits, gen_logits;
};

// Returns false to cancel the job (e.g. the client went away).
using event_sink = std::function<bool(const completion_event &)>;

struct completion_job {
    turn_request turn;
    event_sink sink;
    // The generation (sampler, grammar, stop strings) for turn.sampling, made off the
    // engine thread (make_generation) beside the prompt's assembly; null: made at admission.
    std::unique_ptr<generation_step> gen;
};

struct scheduler_options {
    context_engine_options engine;   // engine.engine.n_seq_max is derived
    uint32_t n_parallel = 4;         // jobs admitted at once (each in a work stream; the
                                     // engine's resident streams are work streams too, which
                                     // keep other workspaces' prefixes between their turns)
    size_t max_queue = 64;           // jobs waiting for a work sequence
    size_t max_prewarm_queue = 1024; // pre-warms waiting (one per workspace)
    // prefill_ahead: a request whose prompt has at least this much content still to
    // tokenize (0: never) has its leading segments, up to prefill_ahead_lead_bytes of
    // content to tokenize, prefilled while the rest tokenizes - by default only when the
    // model's layers run on a GPU (on the CPU, prefill and tokenizing share the cores).
    enum class ahead_mode { gpu, always, never };
    ahead_mode prefill_ahead = ahead_mode::gpu;
    size_t prefill_ahead_min_bytes = 64 * 1024;
    size_t prefill_ahead_lead_bytes = 32 * 1024;
    // A test seam: called on the engine thread as a job is admitted. A throw from it is
    // handled as any failure while serving a job (the job fails with `internal`, the
    // engine thread carries on), which is what the tests of that boundary use it for.
    std::function<void(const turn_request &)> before_admit;
    // A test seam: called on the engine thread after each prefill chunk of a job (its
    // request and its prefill position after the chunk). It may submit().
    std::function<void(const turn_request &, pos_t)> after_prefill_chunk;
};

// Where one job stands (scheduler::jobs()).
struct job_progress {
    enum class state { queued, prefilling, generating };
    std::string workspace;
    bool prewarm = false;
    state what = state::queued;
    size_t queue_position = 0;   // queued: 1 = next of its queue (chats before pre-warms)
    pos_t prompt_tokens = 0;     // active: the prompt's tokens (a pre-warm: those it caches)
    pos_t cached_tokens = 0;     // active: reused from a cache
    pos_t prefill_pos = 0;       // active: in its sequence so far
    int32_t generated = 0;       // active: tokens generated
    double age_ms = 0;           // since it was submitted
};
std::string_view job_state_name(job_progress::state s);  // "queued" | "prefilling" | "generating"

struct scheduler_stats {
    size_t queue_depth = 0;          // jobs waiting
    size_t active_jobs = 0;          // jobs holding a work sequence
    uint64_t n_submitted = 0;
    uint64_t n_rejected = 0;         // queue full
    uint64_t n_cancelled = 0;
    uint64_t n_completed = 0;
    uint64_t n_failed = 0;
    uint64_t n_batched_steps = 0;    // decode steps that served more than one job
    size_t prefilling_jobs = 0;      // admitted jobs whose prompt is still being prefilled
    uint64_t prefill_remaining_tokens = 0;  // their tokens still to prefill
    uint64_t n_prefill_chunks = 0;   // prefill calls run between other work (one chunk each)
    size_t prewarm_queue_depth = 0;  // pre-warms waiting
    uint64_t n_prewarms_submitted = 0;
    uint64_t n_prewarms_replaced = 0;  // a newer pre-warm of the same workspace took its place
    uint64_t n_prewarms_dropped = 0;   // a turn of the workspace came first, or the queue was full
    draft_counters drafts;             // drafts from the workspaces (warmctx/drafts.h)
};

class scheduler {
  public:
    // Loads the model and starts the engine thread.
    static result<std::unique_ptr<scheduler>> start(const scheduler_options & opts);
    // Stops: pending jobs get an error event (cancelled), the thread is joined.
    ~scheduler();

    // Queues a generation job. Errors (nothing queued, no event sent):
    //   resource_exhausted - the queue is full (answer 429/503 with Retry-After);
    //   failed_precondition - the scheduler is stopping.
    status submit(completion_job job);

    // Queues a pre-warm of `req.workspace` (req.kind becomes a pre-warm here): its prompt's
    // cacheable blocks are prefilled at the lowest priority - only when no chat waits for
    // a work sequence and no chat's prompt is prefilling - and cached, as a turn would
    // cache them. A pre-warm of a prefix already cached does nothing. A queued pre-warm
    // of the same workspace is replaced by this one. A chat of the workspace stops a
    // running pre-warm at its chunk boundary and starts from what it has done (its
    // explain says so); a chat that needs its work sequence does the same. No events.
    // The prompt is assembled with the generation prompt (which is not cached), as a
    // chat's is.
    // Errors: resource_exhausted (max_prewarm_queue), failed_precondition (stopping).
    status prewarm(turn_request req);
    // Before assembling a chat's prompt on the calling thread: when the prompt has much
    // still to tokenize (scheduler_options::prefill_ahead_min_bytes), assembles its
    // leading segments (context_engine::leading_segments) and queues them as a pre-warm
    // of its workspace (turn_kind::leading_prewarm), so that the engine prefills them while the
    // caller tokenizes the rest; the chat, submitted next, stops that pre-warm at a chunk
    // boundary and continues from it in place (see prewarm). Cache semantics are a
    // pre-warm's: the warm tail is bit-identical to a cold run's, and whatever the
    // pre-warm computed that the prompt does not start with is simply not reused.
    // Returns true when a pre-warm was queued. Does nothing for a request that
    // check_plausible refuses.
    bool prefill_ahead(const turn_request & req);
    // Every queued and active job: chats, then pre-warms (a copy; the engine thread
    // updates what it reads after each admission, chunk and retirement).
    std::vector<job_progress> jobs() const;

    // Runs `fn` on the engine thread between steps and waits for it: explain,
    // manifest, pins, counters. `fn` must not block. Errors: failed_precondition (stopped),
    // internal (fn threw; the engine thread carries on).
    status call(const std::function<void(context_engine &)> & fn);

    // Lock-free snapshot (approximate while the engine runs).
    scheduler_stats stats() const;
    // Assembles `req` on the calling thread (context_engine::assemble_request: safe while
    // the engine thread works), so a server thread tokenizes and refuses a prompt that
    // does not fit before the job is queued - one whose text plainly cannot fit before
    // it is tokenized at all (check_plausible); put the result in turn_request::assembled.
    result<assembled_prompt> assemble(const turn_request & req) const;
    // A generation for `sp` (context_engine::start_generation), on the calling thread: it
    // reads only the model, so a server thread can build a grammar while the engine works.
    result<std::unique_ptr<generation_step>> make_generation(const sampling_params & sp) const;
    // The same without the size checks (a manifest, an explain of a prompt too long to run).
    result<assembled_prompt> assemble_unchecked(const turn_request & req) const;
    // The model's tokenizer on the calling thread (context_engine::tokenize, detokenize).
    result<std::vector<token_id>> tokenize(std::string_view text, bool parse_special) const;
    result<std::string> detokenize(std::span<const token_id> tokens, bool special) const;
    // The engine's counters as the engine thread last published them (after every
    // finished job and engine call, and at least every 250 ms while it works), so a
    // reader never waits on a prefill; nullptr before the first publication.
    std::shared_ptr<const context_counters> published_counters() const;
    const model_info & model() const;      // immutable after start
    const chat_templates * chat_template() const;  // context_engine::chat_template
    const context_info & context() const;  // immutable after start
    uint32_t n_parallel() const;

    // Stops accepting jobs and ends the engine thread (idempotent).
    void stop();

  private:
    struct impl;
    explicit scheduler(std::unique_ptr<impl> p);
    std::unique_ptr<impl> p_;
};

}  // namespace warmctx
