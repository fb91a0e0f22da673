// The scheduler's admission policy (see admission.h for its rules).
#include "admission.h"

namespace warmctx {

admission_step plan_admission(const admission_input & in) {
    admission_step step;
    // The streams a job may take now: none while n_parallel jobs run.
    std::vector<seq_id> free_streams;
    size_t n_busy = 0;
    for (bool b : in.stream_busy) n_busy += b ? 1 : 0;
    if (n_busy < in.n_parallel)
        for (size_t s = 0; s < in.stream_busy.size(); ++s)
            if (!in.stream_busy[s]) free_streams.push_back((seq_id)s);
    const bool prewarm_runs = in.prewarm_stream >= 0;
    const seq_id own = in.next_chat_stream;
    if (in.next_chat && free_streams.empty() && own >= 0 && (size_t)own < in.stream_busy.size() &&
        !in.stream_busy[(size_t)own])
        free_streams.push_back(own);  // beyond n_parallel: its own prefix, in place
    if (in.next_chat) {
        if (free_streams.empty() && !prewarm_runs) return step;  // wait
        const bool of_prewarm = prewarm_runs && in.prewarm_workspace == *in.next_chat;
        if (free_streams.empty() && !of_prewarm) {
            // The pre-warm gives its stream up; the chat takes a stream next round.
            step.what = admission_step::action::make_room;
            step.preempt_stream = in.prewarm_stream;
            return step;
        }
        step.what = admission_step::action::admit_chat;
        step.streams = std::move(free_streams);
        if (of_prewarm) {  // its workspace's pre-warm stops here; the chat starts from it
            step.preempt_stream = in.prewarm_stream;
            step.streams.push_back(in.prewarm_stream);
        }
        return step;
    }
    if (in.prewarm_waiting && !free_streams.empty() && !prewarm_runs) {
        step.what = admission_step::action::admit_prewarm;
        step.streams = std::move(free_streams);
    }
    return step;
}

seq_id choose_stream(std::string_view workspace, std::span<const stream_view> streams,
                     std::span<const seq_id> candidates) {
    seq_id best = -1;
    int best_rank = -1;  // 2: its workspace's own, 1: empty, 0: another's
    uint64_t best_t = 0;
    for (seq_id s : candidates) {
        if (s < 0 || (size_t)s >= streams.size() || streams[(size_t)s].busy) continue;
        const stream_view & v = streams[(size_t)s];
        const int rank = !v.empty && v.workspace == workspace ? 2 : v.empty ? 1 : 0;
        if (rank > best_rank || (rank == best_rank && rank == 0 && v.t_finished < best_t)) {
            best = s;
            best_rank = rank;
            best_t = v.t_finished;
        }
    }
    return best;
}

}  // namespace warmctx
