// runtime/admission.h - which queued job the engine thread admits next, and into which
// work stream: the scheduler's admission policy as pure functions over plain data (no
// model, no lock), so that its rules are tested alone (tests/unit/admission_test.cpp).
//
// The rules, in the order plan_admission applies them:
//   - at most n_parallel jobs hold a work stream at once; the other streams (resident
//     ones) keep their workspaces' prefixes for the turns to come. Beyond n_parallel, a
//     chat whose workspace's last turn left its prefix in an idle stream takes that stream
//     at once (it resumes there in place, displacing nothing): with the device tier's
//     streams, no agent whose prefix is resident waits for another's answer;
//   - a chat goes before any pre-warm;
//   - a chat of the running pre-warm's workspace stops that pre-warm (it keeps what it
//     prefilled) and may take its stream, where it starts from it in place;
//   - a chat that finds no free stream while a pre-warm runs stops the pre-warm, which
//     frees its stream for the next round; with neither, the chat waits;
//   - a pre-warm only when no chat waits, into a free stream, and one at a time;
//   - among the streams a job may take, a turn takes the one its workspace's last turn
//     left (reused in place), else an empty one, else the one left longest ago
//     (choose_stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/types.h"

namespace warmctx {

// What admission knows when it decides: which streams hold a job, the running pre-warm,
// and the heads of the two queues.
struct admission_input {
    uint32_t n_parallel = 1;              // jobs admitted at once, at most
    std::vector<bool> stream_busy;        // per work stream: a job holds it
    seq_id prewarm_stream = -1;           // the running pre-warm's stream (-1: none runs)
    std::string_view prewarm_workspace;   // ... and its workspace
    std::optional<std::string_view> next_chat;  // the first queued chat's workspace
    seq_id next_chat_stream = -1;         // an idle stream holding that workspace's prefix (-1: none)
    bool prewarm_waiting = false;         // a pre-warm is queued
};

struct admission_step {
    enum class action {
        wait,           // admit nothing now
        make_room,      // stop the running pre-warm (preempt_stream) and decide again
        admit_chat,     // the first queued chat, into one of `streams`
        admit_prewarm,  // the first queued pre-warm, into one of `streams`
    };
    action what = action::wait;
    // Stop the running pre-warm in this stream first (-1: none). With admit_chat, a
    // pre-warm of the chat's own workspace: its stream is one of `streams`.
    seq_id preempt_stream = -1;
    std::vector<seq_id> streams;  // admit_*: the streams the job may take (choose_stream)
};

// The next step of admission. Pure.
admission_step plan_admission(const admission_input & in);

// What stream choice knows of one work stream.
struct stream_view {
    bool busy = false;            // a turn runs in it
    bool empty = true;            // it holds no prefix
    std::string_view workspace;   // whose turn left what it holds
    uint64_t t_finished = 0;      // when that turn finished (a logical clock)
};

// Which of `candidates` a turn of `workspace` takes: the one its last turn left, else
// an empty one, else the one left longest ago (ties: the first). Candidates that are
// out of range or busy are skipped; -1 when none is left. Pure.
seq_id choose_stream(std::string_view workspace, std::span<const stream_view> streams,
                     std::span<const seq_id> candidates);

}  // namespace warmctx
