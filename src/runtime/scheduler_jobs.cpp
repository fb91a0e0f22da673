// One job's life on the engine thread: admission into a work sequence, prefill chunks,
// sampling and batched decode steps, retirement, and the events it emits on the way
// (see scheduler.cpp for the state machine).
#include "util/clock.h"

#include <algorithm>
#include <utility>

#include "scheduler_impl.h"

namespace warmctx {

void scheduler::impl::publish_jobs() {
    std::vector<active_progress> v;
    for (auto & j : slots) {
        if (!j) continue;
        active_progress a;
        a.t_submit = j->q.t_submit;
        a.p.workspace = j->turn.workspace;
        a.p.prewarm = j->prewarm;
        a.p.what = j->prefilling ? job_progress::state::prefilling : job_progress::state::generating;
        a.p.prompt_tokens = j->prewarm ? j->turn.prefill_end : (pos_t)j->turn.prompt.tokens.size();
        a.p.cached_tokens = j->turn.reused;
        a.p.prefill_pos = j->turn.prefill_pos;
        a.p.generated = j->gen ? j->gen->n_generated() : 0;
        v.push_back(std::move(a));
    }
    std::lock_guard<std::mutex> lk(prog_mu);
    progress = std::move(v);
}

void scheduler::impl::publish() {
    auto c = std::make_shared<const context_counters>(ce->counters());
    t_published = clock_type::now();
    std::lock_guard<std::mutex> lk(pub_mu);
    published = std::move(c);
}

bool scheduler::impl::emit(active_job & j, const completion_event & ev) {
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

void scheduler::impl::emit_error(queued_job & q, status st) {
    completion_event ev;
    ev.what = completion_event::kind::error;
    ev.error = std::move(st);
    try { q.job.sink(ev); } catch (...) {}
}

completion_usage scheduler::impl::usage_of(const active_job & j) const {
    completion_usage u;
    u.prompt_tokens = j.turn.explain.n_prompt_tokens;
    u.cached_tokens = j.turn.explain.n_reused;
    u.completion_tokens = j.gen ? j.gen->n_generated() : 0;
    return u;
}

void scheduler::impl::set_phases(completion_event & ev, const active_job & j) {
    const pending_turn & t = j.turn;
    ev.t_assemble_ms = t.t_assemble_ms;
    ev.t_restore_ms = t.t_restore_ms;
    ev.t_copy_ms = t.t_copy_ms;
    ev.t_prefill_ms = t.t_prefill_ms;
    ev.t_checkpoint_ms = t.t_checkpoint_ms;
    ev.t_write_back_ms = t.t_write_back_ms;
    ev.t_lookup_ms = t.t_lookup_ms;
    ev.t_sampler_ms = j.t_sampler_ms;
    ev.t_interleave_ms = j.t_interleave_ms;
}

status scheduler::impl::thrown(const char * where) {
    try {
        throw;
    } catch (const std::exception & e) {
        return internal_error(std::string(where) + ": " + e.what());
    } catch (...) {
        return internal_error(std::string(where) + ": unknown exception");
    }
}

void scheduler::impl::admit(size_t slot, queued_job q) {
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

status scheduler::impl::start(size_t slot, active_job & j) {
    if (opts.before_admit) opts.before_admit(j.q.job.turn);
    j.t_queue_ms = ms_between(j.q.t_submit, clock_type::now());
    j.prewarm = is_prewarm(j.q.job.turn.kind);
    if (!j.prewarm && j.q.job.gen) {
        j.gen = std::move(j.q.job.gen);  // made beside the assembly (make_generation)
    } else if (!j.prewarm) {
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

void scheduler::impl::prefilled(active_job & j) {
    j.prefilling = false;
    if (j.prewarm) {  // nothing to generate: retired (and cached) next
        j.finished = true;
        return;
    }
    if (j.q.job.turn.keep_logits) j.prompt_logits = j.logits;
    j.pos = (pos_t)j.turn.prompt.tokens.size();
    j.drafts = ce->drafts_for(j.turn, j.q.job.turn.sampling);
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

// One chunk's worth of prompt a round, between decode steps: the chat with the least left
// (every fourth round the one admitted first, so a long prompt is not starved), and then,
// while that leaves room, other chats that finish within it (warm turns' few new tokens):
// a warm turn admitted while others decode starts its prefill before the next step, not
// one step per turn ahead of it. A pre-warm only when no chat prefills.
void scheduler::impl::prefill_round() {
    const bool oldest = ++n_prefill_rounds % 4 == 0;
    int64_t room = cinfo.chunk_tokens;
    for (bool first = true; room > 0; first = false) {
        active_job * pick = nullptr;
        active_job * background = nullptr;
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
            if (!first && j->turn.prefill_remaining() > room) continue;
            if (!pick || (first && oldest ? j->admitted < pick->admitted
                                          : j->turn.prefill_remaining() < pick->turn.prefill_remaining()))
                pick = j.get();
        }
        if (first && !pick && background &&
            (!generating || background->q.job.turn.kind == turn_kind::leading_prewarm))
            pick = background;
        if (first) {
            a_prefilling = n;
            a_prefill_remaining = remaining;
        }
        if (!pick) return;
        const pos_t before = pick->turn.prefill_remaining();
        if (!prefill_chunk(*pick)) return;
        room -= before - pick->turn.prefill_remaining();
    }
}

// One chunk of `pick`'s prompt; false when it failed (the job fails).
bool scheduler::impl::prefill_chunk(active_job & pick) {
    const pos_t before = pick.turn.prefill_remaining();
    status st;
    pick.t_interleave_ms += ms_between(pick.t_own_end, clock_type::now());
    try {
        st = ce->prefill_some(pick.turn, 1, pick.logits);  // one chunk
    } catch (...) {
        st = thrown("prefilling");
    }
    pick.t_own_end = clock_type::now();
    a_prefill_chunks++;
    a_prefill_remaining = a_prefill_remaining - (uint64_t)(before - pick.turn.prefill_remaining());
    if (!st.ok()) {
        fail_job(pick, st);
        return false;
    }
    if (opts.after_prefill_chunk) opts.after_prefill_chunk(pick.q.job.turn, pick.turn.prefill_pos);
    if (pick.turn.prefilled()) {
        a_prefilling = a_prefilling - 1;
        prefilled(pick);
    } else if (!pick.prewarm) {
        completion_event ev;
        ev.what = completion_event::kind::progress;
        ev.prefill_pos = pick.turn.prefill_pos;
        ev.prefill_end = pick.turn.prefill_end;
        emit(pick, ev);
    }
    publish_jobs();
    return true;
}

void scheduler::impl::preempt(size_t slot) {
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

void scheduler::impl::fail_job(active_job & j, status st) {
    completion_event ev;
    ev.what = completion_event::kind::error;
    ev.error = std::move(st);
    emit(j, ev);
    j.cancelled = true;
    j.failed = true;
    j.kv_suspect = true;
}

status scheduler::impl::drop_draft(active_job & j, seq_id seq) {
    if (j.drafts && j.step_drafted > 0) j.drafts->record(j.step_drafted, j.step_accepted);
    j.step_drafted = j.step_accepted = 0;
    if (j.draft.empty()) return {};
    j.draft.clear();
    j.draft_at = 0;
    return ce->drop_draft(seq, j.pos);
}

// Samples after the last decoded position, then after each position of the draft decoded
// with it while sampling chooses the draft's token there: those tokens are decoded already.
void scheduler::impl::sample_next(active_job & j) {
    token_id next = -1;
    // The text of every token decided here goes out as one event (a draft's tokens too).
    std::string text;
    token_id last = -1;
    auto flush = [&] {
        if (text.empty()) return true;
        completion_event ev;
        ev.what = completion_event::kind::delta;
        ev.text = std::move(text);
        ev.token = last;
        ev.logprobs = std::move(j.logprobs);
        j.logprobs.clear();
        return emit(j, ev);
    };
    for (;;) {
        if (j.q.job.turn.keep_logits && j.gen->n_generated() < j.q.job.turn.sampling.max_tokens)
            j.gen_logits.insert(j.gen_logits.end(), j.logits.begin(), j.logits.end());
        const token_id first_max = std::exchange(j.first_max, -1);
        auto d = first_max >= 0 ? j.gen->next_from_first_max(first_max, j.pos) : j.gen->next(j.logits, j.pos);
        if (d.logprobs) j.logprobs.push_back(std::move(*d.logprobs));
        if (!d.delta.empty()) {
            text += d.delta;
            last = d.token;
        }
        if (d.finished) {
            j.finished = true;
            j.finish = d.finish;
            if (!flush()) return;  // cancelled: retire drops the draft
            if (status st = drop_draft(j, j.turn.seq); !st.ok()) fail_job(j, st);
            return;
        }
        if (j.drafts) j.drafts->push(d.token);
        next = d.token;
        if (j.draft.empty() || d.token != j.draft.front()) break;
        j.draft.pop_front();
        j.first_max = j.draft_first_max[j.draft_at];
        std::swap(j.logits, j.draft_logits[j.draft_at++]);
        j.pos++;
        j.dc.n_accepted++;
        j.step_accepted++;
        a_draft_accepted++;
    }
    if (!flush()) return;  // cancelled: retire drops the draft
    if (status st = drop_draft(j, j.turn.seq); !st.ok()) {
        fail_job(j, st);
        return;
    }
    j.pending_token = next;
}

void scheduler::impl::retire(size_t slot) {
    active_job & j = *slots[slot];
    if (!drop_draft(j, (seq_id)slot).ok()) j.kv_suspect = true;  // the sequence is not what it says
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
        const auto tf = clock_type::now();
        status st = ce->finish_turn(j.turn, (size_t)j.gen->n_generated());
        publish();  // before the client hears it is done
        j.t_finish_ms = ms_between(tf, clock_type::now());
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
            ev.drafts = j.dc;
            ev.n_decode_steps = j.n_steps;
            ev.t_decode_step_ms = j.t_step_ms;
            ev.t_sample_ms = j.t_sample_ms;
            ev.t_finish_ms = j.t_finish_ms;
            if (j.q.job.turn.cache) ce->remember_answer(j.turn, j.gen->tokens());
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
    publish();
}

void scheduler::impl::step() {
    std::vector<step_input> in;
    std::vector<std::pair<size_t, size_t>> who;  // slot, its first row
    size_t n_jobs = 0;
    for (auto & j : slots)
        n_jobs += j && !j->prefilling && !j->finished && !j->cancelled && j->pending_token >= 0;
    if (n_jobs == 0) return;
    // Each job's token, and a draft after it where its workspace suggests one; the rows
    // of a step stay within one batch.
    const size_t per_job = n_jobs < cinfo.chunk_tokens ? (cinfo.chunk_tokens - n_jobs) / n_jobs : 0;
    for (size_t s = 0; s < slots.size(); ++s) {
        auto & j = slots[s];
        if (!j || j->prefilling || j->finished || j->cancelled || j->pending_token < 0) continue;
        who.push_back({s, in.size()});
        // Greedy with nothing else reading the distribution: only each row's pick comes back.
        const bool first_max_only = !j->q.job.turn.keep_logits && j->gen->needs_first_max_only();
        in.push_back({(seq_id)s, j->pending_token, j->pos, first_max_only});
        if (!j->drafts) continue;
        const size_t n = draft_room(j->q.job.turn.sampling, j->gen->n_generated(), j->pos, cinfo.n_ctx_seq, per_job);
        for (token_id t : j->drafts->propose(n)) {
            in.push_back({(seq_id)s, t, (pos_t)(j->pos + (in.size() - who.back().second)), first_max_only});
            j->draft.push_back(t);
        }
    }
    // The rows' buffers circulate between this and the jobs (swapped, never freed while
    // they serve): a 65-row step would otherwise allocate and fault in ~39 MB of logits.
    std::vector<std::vector<float>> & logits = step_rows;
    const auto t0 = clock_type::now();
    status st = ce->decode_step(in, logits, &step_first_max);
    const double step_ms = ms_between(t0, clock_type::now());
    if (who.size() > 1) a_batched++;
    for (size_t k = 0; k < who.size(); ++k) {
        active_job & j = *slots[who[k].first];
        j.pending_token = -1;
        j.n_steps++;
        j.t_step_ms += step_ms;
        if (!st.ok()) {
            completion_event ev;
            ev.what = completion_event::kind::error;
            ev.error = st;
            emit(j, ev);
            j.draft.clear();  // nothing of it was decoded
            j.cancelled = true;  // retire without caching
            j.kv_suspect = true;
            continue;
        }
        const size_t first = who[k].second, end = k + 1 < who.size() ? who[k + 1].second : in.size();
        j.pos++;
        std::swap(j.logits, logits[first]);
        j.first_max = step_first_max[first];
        if (j.draft_logits.size() < end - first - 1) j.draft_logits.resize(end - first - 1);
        j.draft_first_max.assign(step_first_max.begin() + (long)first + 1, step_first_max.begin() + (long)end);
        for (size_t r = first + 1; r < end; ++r) std::swap(j.draft_logits[r - first - 1], logits[r]);
        j.draft_at = 0;
        j.step_drafted = end - first - 1;
        if (end - first > 1) {
            j.dc.n_steps++;
            j.dc.n_drafted += end - first - 1;
            a_draft_steps++;
            a_drafted += end - first - 1;
        }
    }
}

}  // namespace warmctx
