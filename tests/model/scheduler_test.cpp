// The engine thread on the tiny model: streaming events, continuous batching,
// cancellation, a full queue, and a lone job equal to the cold run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>

#include "tiny_model.h"
#include "warmctx/scheduler.h"
#include "workload/workload.h"

namespace warmctx {
namespace {

scheduler_options tiny_scheduler(uint32_t n_parallel, size_t max_queue = 64) {
    scheduler_options o;
    o.engine.engine = testing::tiny_options();
    o.engine.engine.n_ctx = 2048;
    o.engine.n_holders = 3;
    o.n_parallel = n_parallel;
    o.max_queue = max_queue;
    return o;
}

// A fresh directory under /tmp, removed with everything in it at the end of the scope
// ("" when it could not be made).
struct temp_dir {
    std::string path;
    explicit temp_dir(const std::string & prefix) {
        std::string t = prefix + "-XXXXXX";
        if (mkdtemp(t.data())) path = t;
    }
    ~temp_dir() {
        if (!path.empty()) std::filesystem::remove_all(path);
    }
    temp_dir(const temp_dir &) = delete;
    temp_dir & operator=(const temp_dir &) = delete;
};

// Collects one job's events; wait() blocks until its last event.
struct collector {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<completion_event> events;
    bool ended = false;
    int cancel_after_deltas = -1;  // >= 0: return false after that many deltas
    int n_deltas = 0;

    event_sink sink() {
        return [this](const completion_event & ev) {
            std::lock_guard<std::mutex> lk(mu);
            events.push_back(ev);
            if (ev.what == completion_event::kind::delta) ++n_deltas;
            if (ev.what == completion_event::kind::done || ev.what == completion_event::kind::error) {
                ended = true;
                cv.notify_all();
            }
            if (cancel_after_deltas >= 0 && n_deltas > cancel_after_deltas) {
                ended = true;
                cv.notify_all();
                return false;
            }
            return true;
        };
    }
    bool wait(std::chrono::seconds limit = std::chrono::seconds(120)) {
        std::unique_lock<std::mutex> lk(mu);
        return cv.wait_for(lk, limit, [&] { return ended; });
    }
    const completion_event * last() {
        std::lock_guard<std::mutex> lk(mu);
        return events.empty() ? nullptr : &events.back();
    }
    std::string text() {
        std::lock_guard<std::mutex> lk(mu);
        std::string s;
        for (auto & e : events) if (e.what == completion_event::kind::delta) s += e.text;
        return s;
    }
};

std::vector<segment> small_workspace(uint64_t seed) {
    workload_generator g(seed, [](const std::string & s) { return s.size() / 3; });
    return make_workspace(g, 300, 1);
}

turn_request req(const std::string & ws, std::vector<segment> segs, int max_tokens) {
    turn_request r;
    r.workspace = ws;
    r.segments = std::move(segs);
    r.sampling.max_tokens = max_tokens;
    return r;
}

// A gate the engine thread waits at as it admits a job (scheduler_options::before_admit)
// while closed: jobs submitted meanwhile are all queued when it opens.
struct admission_gate {
    std::mutex mu;
    std::condition_variable cv;
    bool closed = false;
    void install(scheduler_options & o) {
        o.before_admit = [this](const turn_request &) {
            std::unique_lock lk(mu);
            cv.wait(lk, [this] { return !closed; });
        };
    }
    void close() {
        std::lock_guard lk(mu);
        closed = true;
    }
    void open() {
        {
            std::lock_guard lk(mu);
            closed = false;
        }
        cv.notify_all();
    }
};

TEST(Scheduler, StreamsStartedDeltasAndDone) {
    auto s = scheduler::start(tiny_scheduler(2));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    collector c;
    ASSERT_TRUE((*s)->submit({req("a", small_workspace(1), 8), c.sink()}).ok());
    ASSERT_TRUE(c.wait());
    ASSERT_GE(c.events.size(), 2u);
    EXPECT_EQ(c.events[0].what, completion_event::kind::admitted);  // before the prefill
    EXPECT_GT(c.events[0].usage.prompt_tokens, 100);
    EXPECT_EQ(c.events[0].prefill_end, c.events[0].usage.prompt_tokens);
    // One progress event per chunk of the prompt but its last, moving forward.
    size_t k = 1;
    pos_t at = c.events[0].prefill_pos;
    for (; k < c.events.size() && c.events[k].what == completion_event::kind::progress; ++k) {
        EXPECT_GT(c.events[k].prefill_pos, at);
        EXPECT_LT(c.events[k].prefill_pos, c.events[k].prefill_end);
        at = c.events[k].prefill_pos;
    }
    EXPECT_GE(k, 2u) << "a prompt of several chunks reports its progress";
    ASSERT_LT(k, c.events.size());
    EXPECT_EQ(c.events[k].what, completion_event::kind::started);   // the prefill done
    EXPECT_GT(c.events[k].usage.prompt_tokens, 100);
    const completion_event * done = c.last();
    ASSERT_EQ(done->what, completion_event::kind::done);
    EXPECT_GT(done->usage.completion_tokens, 0);
    EXPECT_LE(done->usage.completion_tokens, 8);
    EXPECT_FALSE(c.text().empty());
    EXPECT_EQ((*s)->stats().n_completed, 1u);
}

// A throw on the engine thread (bad_alloc while admitting a job, or inside a call)
// fails that job or call with `internal`; the process and the other jobs carry on.
TEST(Scheduler, AThrowOnTheEngineThreadFailsOnlyThatJob) {
    auto o = tiny_scheduler(2);
    o.before_admit = [](const turn_request & r) {
        if (r.workspace == "boom") throw std::bad_alloc();
    };
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok());
    collector bad, good;
    ASSERT_TRUE((*s)->submit({req("boom", small_workspace(1), 4), bad.sink()}).ok());
    ASSERT_TRUE(bad.wait());
    ASSERT_EQ(bad.last()->what, completion_event::kind::error);
    EXPECT_EQ(bad.last()->error.code(), status_code::internal);
    EXPECT_NE(bad.last()->error.message().find("bad_alloc"), std::string::npos) << bad.last()->error.message();
    ASSERT_TRUE((*s)->submit({req("fine", small_workspace(1), 4), good.sink()}).ok());
    ASSERT_TRUE(good.wait());
    EXPECT_EQ(good.last()->what, completion_event::kind::done);
    status thrown = (*s)->call([](context_engine &) { throw std::runtime_error("no"); });
    EXPECT_EQ(thrown.code(), status_code::internal);
    EXPECT_TRUE((*s)->call([](context_engine &) {}).ok());
    EXPECT_EQ((*s)->stats().n_failed, 1u);
    EXPECT_EQ((*s)->stats().n_completed, 1u);
}

// `done` (a job run with keep_logits) equals the cold run of `r` bit for bit.
void expect_equals_cold(scheduler & s, const turn_request & r, const completion_event & done,
                        const std::string * streamed = nullptr) {
    std::optional<turn_result> cold;
    ASSERT_TRUE(s.call([&](context_engine & ce) {
        auto c = ce.run_cold(r);
        if (c.ok()) cold = std::move(c.value());
    }).ok());
    ASSERT_TRUE(cold.has_value());
    EXPECT_EQ(done.tokens, cold->gen.tokens);
    if (streamed) EXPECT_EQ(*streamed, cold->gen.text);
    ASSERT_FALSE(done.prompt_logits.empty());
    ASSERT_EQ(done.prompt_logits.size(), cold->prompt_logits.size());
    EXPECT_EQ(0, std::memcmp(done.prompt_logits.data(), cold->prompt_logits.data(), cold->prompt_logits.size() * 4));
    ASSERT_EQ(done.gen_logits.size(), cold->gen_logits.size());
    EXPECT_EQ(0, std::memcmp(done.gen_logits.data(), cold->gen_logits.data(), cold->gen_logits.size() * 4));
}

// A job decoded alone (the warm path: its prefix copied from the cache) gives the same
// tokens and bit-identical logits, after the prompt and at every generation step, as
// the cold reference run; and its streamed deltas are exactly the cold text.
TEST(Scheduler, ALoneJobEqualsTheColdRun) {
    auto s = scheduler::start(tiny_scheduler(1));
    ASSERT_TRUE(s.ok());
    auto segs = small_workspace(2);
    collector first, second;
    ASSERT_TRUE((*s)->submit({req("a", segs, 12), first.sink()}).ok());
    ASSERT_TRUE(first.wait());
    segs.back().content = "and now another question";
    turn_request warm_req = req("a", segs, 12);
    warm_req.keep_logits = true;
    ASSERT_TRUE((*s)->submit({warm_req, second.sink()}).ok());
    ASSERT_TRUE(second.wait());
    ASSERT_EQ(second.last()->what, completion_event::kind::done);
    const completion_event & done = *second.last();
    EXPECT_GT(done.usage.cached_tokens, 0);  // the warm path was taken
    ASSERT_FALSE(done.tokens.empty());       // something was generated to compare
    std::string streamed;
    for (auto & e : second.events) if (e.what == completion_event::kind::delta) streamed += e.text;

    expect_equals_cold(**s, warm_req, done, &streamed);
}

// A cold prompt is prefilled one canonical chunk per round: a small job admitted
// while it prefills finishes first, and the big job, its prefill interleaved with the
// other's chunks and decode steps, still equals its cold run bit for bit.
TEST(Scheduler, AnInterleavedPrefillEqualsTheColdRunAndDoesNotStallOthers) {
    auto s = scheduler::start(tiny_scheduler(2));
    ASSERT_TRUE(s.ok());
    workload_generator g(9, [](const std::string & x) { return x.size() / 3; });
    turn_request big = req("big", make_workspace(g, 1600, 2), 6);  // about 25 chunks of 64
    big.keep_logits = true;
    std::atomic<int> order{0};
    int big_started = -1, small_done = -1;
    collector cb, cs;
    auto big_sink = cb.sink();
    auto small_sink = cs.sink();
    ASSERT_TRUE((*s)->submit({big, [&](const completion_event & ev) {
                                  if (ev.what == completion_event::kind::started) big_started = order++;
                                  return big_sink(ev);
                              }}).ok());
    ASSERT_TRUE((*s)->submit({req("small", small_workspace(3), 4), [&](const completion_event & ev) {
                                  if (ev.what == completion_event::kind::done) small_done = order++;
                                  return small_sink(ev);
                              }}).ok());
    ASSERT_TRUE(cb.wait());
    ASSERT_TRUE(cs.wait());
    ASSERT_EQ(cs.last()->what, completion_event::kind::done);
    ASSERT_EQ(cb.last()->what, completion_event::kind::done);
    EXPECT_LT(small_done, big_started) << "the small job waited for the whole cold prefill";
    EXPECT_GT((*s)->stats().n_prefill_chunks, 20u);
    EXPECT_EQ((*s)->stats().prefilling_jobs, 0u);
    const completion_event & done = *cb.last();
    EXPECT_EQ(done.usage.cached_tokens, 0);
    expect_equals_cold(**s, big, done);
}

// Two warm turns admitted while another job decodes: the prefill round after the next step
// takes both (each finishes within one chunk), not one a step.
TEST(Scheduler, WarmTurnsAdmittedTogetherPrefillBeforeTheNextStep) {
    scheduler_options o = tiny_scheduler(3);
    std::atomic<int> order{0};
    admission_gate gate;
    gate.install(o);
    std::mutex om;
    std::vector<std::pair<std::string, int>> chunks;  // (workspace, order) of each prefill chunk
    o.after_prefill_chunk = [&](const turn_request & r, pos_t) {
        std::lock_guard lk(om);
        chunks.push_back({r.workspace, order++});
    };
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    auto ask = [&](const std::string & ws, uint64_t seed, const std::string & q, int n, collector & c,
                   std::function<void(const completion_event &)> also = {}) {
        auto segs = small_workspace(seed);
        segs.back().content = q;
        auto inner = c.sink();
        return (*s)->submit({req(ws, segs, n), [inner, also](const completion_event & ev) {
                                 if (also) also(ev);
                                 return inner(ev);
                             }});
    };
    for (auto [ws, seed] : {std::pair{"b", 11}, std::pair{"c", 12}}) {  // their prefixes, cached
        collector c;
        ASSERT_TRUE(ask(ws, (uint64_t)seed, "first", 2, c).ok());
        ASSERT_TRUE(c.wait());
    }
    // "a" decodes a long answer; its deltas mark its steps.
    collector ca, cb, cc;
    std::vector<int> a_deltas;
    std::atomic<bool> a_writes{false};
    ASSERT_TRUE(ask("a", 13, "write", 200, ca, [&](const completion_event & ev) {
                    if (ev.what != completion_event::kind::delta) return;
                    std::lock_guard lk(om);
                    a_deltas.push_back(order++);
                    a_writes = true;
                }).ok());
    for (int i = 0; i < 2000 && !a_writes; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(a_writes);
    gate.close();  // b's admission waits until c is queued too
    ASSERT_TRUE(ask("b", 11, "second", 2, cb).ok());
    ASSERT_TRUE(ask("c", 12, "second", 2, cc).ok());
    gate.open();
    ASSERT_TRUE(cb.wait());
    ASSERT_TRUE(cc.wait());
    ASSERT_TRUE(ca.wait());
    EXPECT_GT(cb.last()->usage.cached_tokens, 0);
    EXPECT_GT(cc.last()->usage.cached_tokens, 0);
    std::lock_guard lk(om);
    int b_at = -1, c_at = -1;  // their second turns' chunks (each one chunk: a few new tokens)
    for (const auto & [ws, at] : chunks) {
        if (ws == "b") b_at = at;
        if (ws == "c") c_at = at;
    }
    ASSERT_GE(b_at, 0);
    ASSERT_GE(c_at, 0);
    int a_between = 0;  // a's steps between the two
    for (int d : a_deltas) a_between += d > std::min(b_at, c_at) && d < std::max(b_at, c_at);
    EXPECT_EQ(a_between, 0) << "b's chunk at " << b_at << ", c's at " << c_at;
}

TEST(Scheduler, BatchesConcurrentJobsAndCompletesThemAll) {
    auto s = scheduler::start(tiny_scheduler(4));
    ASSERT_TRUE(s.ok());
    std::vector<std::unique_ptr<collector>> cs;
    for (int i = 0; i < 8; ++i) {
        cs.push_back(std::make_unique<collector>());
        ASSERT_TRUE(
            (*s)->submit({req("w" + std::to_string(i % 3), small_workspace(10 + i), 16), cs.back()->sink()}).ok());
    }
    for (auto & c : cs) {
        ASSERT_TRUE(c->wait());
        EXPECT_EQ(c->last()->what, completion_event::kind::done);
    }
    auto st = (*s)->stats();
    EXPECT_EQ(st.n_completed, 8u);
    EXPECT_GT(st.n_batched_steps, 0u);  // some steps decoded several jobs at once
    EXPECT_EQ(st.active_jobs, 0u);
}

TEST(Scheduler, ACancelledJobFreesItsSequence) {
    auto s = scheduler::start(tiny_scheduler(2));
    ASSERT_TRUE(s.ok());
    collector gone, ok;
    gone.cancel_after_deltas = 0;
    ASSERT_TRUE((*s)->submit({req("a", small_workspace(3), 64), gone.sink()}).ok());
    ASSERT_TRUE((*s)->submit({req("b", small_workspace(4), 8), ok.sink()}).ok());
    ASSERT_TRUE(gone.wait());
    ASSERT_TRUE(ok.wait());
    EXPECT_EQ(ok.last()->what, completion_event::kind::done);
    // The cancellation is counted when the engine thread retires the job.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((*s)->stats().n_cancelled == 0 && std::chrono::steady_clock::now() < deadline) {
        ASSERT_TRUE((*s)->call([](context_engine &) {}).ok());  // one engine-loop round trip
    }
    EXPECT_EQ((*s)->stats().n_cancelled, 1u);
    EXPECT_EQ((*s)->stats().active_jobs, 0u);
}

TEST(Scheduler, AFullQueueRejectsAndErrorsAreEvents) {
    auto s = scheduler::start(tiny_scheduler(1, 1));
    ASSERT_TRUE(s.ok());
    std::vector<std::unique_ptr<collector>> cs;
    int rejected = 0;
    for (int i = 0; i < 6; ++i) {
        cs.push_back(std::make_unique<collector>());
        status st = (*s)->submit({req("q", small_workspace(20 + i), 32), cs.back()->sink()});
        if (!st.ok()) {
            EXPECT_EQ(st.code(), status_code::resource_exhausted);
            ++rejected;
            cs.pop_back();
        }
    }
    EXPECT_GT(rejected, 0);
    for (auto & c : cs) ASSERT_TRUE(c->wait());
    // A bad request fails through its sink, and the engine thread carries on.
    collector bad;
    turn_request r = req("q", {{"../x", segment_kind::user, "", "", "hi"}}, 4);
    ASSERT_TRUE((*s)->submit({r, bad.sink()}).ok());
    ASSERT_TRUE(bad.wait());
    EXPECT_EQ(bad.last()->what, completion_event::kind::error);
    EXPECT_EQ(bad.last()->error.code(), status_code::invalid_argument);
}

// Two workspaces take turns on two work streams: each turn runs in the stream its
// workspace's last turn left, and reuses its prefix in place (nothing copied).
TEST(Scheduler, AWorkspacesTurnRunsInTheStreamItsLastTurnLeft) {
    auto s = scheduler::start(tiny_scheduler(2));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    auto wa = small_workspace(1), wb = small_workspace(2);
    auto run = [&](const std::string & ws, std::vector<segment> segs, const std::string & q) {
        segs.back().content = q;
        collector c;
        EXPECT_TRUE((*s)->submit({req(ws, segs, 2), c.sink()}).ok());
        EXPECT_TRUE(c.wait());
        return c.last() ? c.last()->explain : explain_report{};
    };
    run("a", wa, "first");
    run("b", wb, "first");
    for (int round = 0; round < 2; ++round) {
        for (const char * ws : {"a", "b"}) {
            explain_report r = run(ws, ws[0] == 'a' ? wa : wb, "round " + std::to_string(round));
            EXPECT_EQ(r.kind, miss_kind::full_hit) << ws;
            EXPECT_TRUE(r.in_place) << ws << " round " << round;
        }
    }
}


// ---- pre-warm ------------------------------------------------------------------------

// The workspace's stored part: everything but this turn's question.
std::vector<segment> stored_part(std::vector<segment> segs) {
    std::erase_if(segs, [](const segment & x) { return x.kind == segment_kind::user; });
    return segs;
}

turn_request prewarm_req(const std::string & ws, std::vector<segment> segs) {
    turn_request r;
    r.workspace = ws;
    r.segments = stored_part(std::move(segs));
    r.add_generation_prompt = false;
    return r;
}

context_counters counters_of(scheduler & s) {
    context_counters c;
    EXPECT_TRUE(s.call([&](context_engine & ce) { c = ce.counters(); }).ok());
    return c;
}

// Waits until the engine has finished `n` pre-warms (complete or preempted).
bool wait_prewarms(scheduler & s, uint64_t n) {
    for (int i = 0; i < 2000; ++i) {
        if (counters_of(s).prewarm.n_prewarms >= n) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
}


// A pre-warm caches the stored context without generating; the chat sent after it is a
// full hit that prefills only its question, says it was served from the pre-warm, and
// equals the cold run. A second pre-warm of the same content does nothing.
TEST(Scheduler, APrewarmMakesTheNextChatAFullHitAndAPrewarmOfACachedPrefixDoesNothing) {
    auto s = scheduler::start(tiny_scheduler(2));
    ASSERT_TRUE(s.ok());
    workload_generator g(21, [](const std::string & x) { return x.size() / 3; });
    auto segs = make_workspace(g, 1200, 1);
    ASSERT_TRUE((*s)->prewarm(prewarm_req("pw", segs)).ok());
    ASSERT_TRUE(wait_prewarms(**s, 1));
    context_counters c1 = counters_of(**s);
    EXPECT_EQ(c1.prewarm.n_already_cached, 0u);
    EXPECT_GT(c1.prewarm.n_prefilled_tokens, 500u);
    EXPECT_EQ(c1.total.n_turns, 0u) << "a pre-warm is not a turn";
    EXPECT_EQ((*s)->stats().n_completed, 0u);

    ASSERT_TRUE((*s)->prewarm(prewarm_req("pw", segs)).ok());
    ASSERT_TRUE(wait_prewarms(**s, 2));
    context_counters c2 = counters_of(**s);
    EXPECT_EQ(c2.prewarm.n_already_cached, 1u);
    EXPECT_EQ(c2.prewarm.n_prefilled_tokens, c1.prewarm.n_prefilled_tokens);

    turn_request chat = req("pw", segs, 6);
    chat.keep_logits = true;
    collector c;
    ASSERT_TRUE((*s)->submit({chat, c.sink()}).ok());
    ASSERT_TRUE(c.wait());
    const completion_event & done = *c.last();
    ASSERT_EQ(done.what, completion_event::kind::done);
    EXPECT_EQ(done.explain.kind, miss_kind::full_hit) << done.explain.reason;
    EXPECT_TRUE(done.explain.in_place);
    EXPECT_EQ(done.explain.n_reused, done.explain.n_cacheable);
    ASSERT_TRUE(done.explain.prewarm.has_value());
    EXPECT_TRUE(done.explain.prewarm->complete);
    EXPECT_EQ(done.explain.prewarm->n_cached, done.explain.n_cacheable);
    EXPECT_GT(done.explain.prewarm->finished_unix_ms, 0);
    EXPECT_EQ(counters_of(**s).prewarm.n_served_turns, 1u);
    expect_equals_cold(**s, chat, done);
}

// A chat of the workspace sent while its pre-warm runs stops the pre-warm at a chunk
// boundary and starts from what it has done (in place, nothing prefilled twice); the
// answer still equals the cold run bit for bit. With a disk tier: the stopped pre-warm
// writes through only the blocks it holds (a snapshot claiming the whole prefix would
// be restored short).
TEST(Scheduler, AChatDuringItsPrewarmStartsFromWhatThePrewarmHasDone) {
    temp_dir tmp("/tmp/warmctx-prewarm-disk");
    ASSERT_FALSE(tmp.path.empty());
    workload_generator g(22, [](const std::string & x) { return x.size() / 3; });
    auto segs = make_workspace(g, 1600, 1);  // about 25 chunks of 64
    turn_request chat = req("pw", segs, 6);
    chat.keep_logits = true;
    collector c;
    std::atomic<int> chunks{0};
    std::atomic<bool> sent{false};
    scheduler * self = nullptr;
    auto o = tiny_scheduler(2);
    o.engine.tiers.cache_dir = tmp.path;
    o.after_prefill_chunk = [&](const turn_request & r, pos_t) {
        // The pre-warm's third chunk: the chat arrives.
        if (is_prewarm(r.kind) && ++chunks == 3 && !sent.exchange(true))
            ASSERT_TRUE(self->submit({chat, c.sink()}).ok());
    };
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok());
    self = s->get();
    ASSERT_TRUE((*s)->prewarm(prewarm_req("pw", segs)).ok());
    ASSERT_TRUE(c.wait());
    const completion_event & done = *c.last();
    ASSERT_EQ(done.what, completion_event::kind::done);
    ASSERT_TRUE(done.explain.prewarm.has_value());
    EXPECT_FALSE(done.explain.prewarm->complete);
    EXPECT_GT(done.explain.prewarm->n_cached, 0);
    EXPECT_LT(done.explain.prewarm->n_cached, done.explain.n_cacheable);
    EXPECT_EQ(done.explain.n_reused, done.explain.prewarm->n_cached) << "reuses exactly what the pre-warm did";
    EXPECT_TRUE(done.explain.in_place);
    // The write-through is the disk tier's writer thread's: wait for it (disk_tier()
    // flushes the queue) before counting writes.
    ASSERT_TRUE((*s)->call([](context_engine & ce) { (void)ce.disk_tier(); }).ok());
    context_counters cc = counters_of(**s);
    EXPECT_EQ(cc.prewarm.n_preempted, 1u);
    EXPECT_EQ(cc.prewarm.n_prefilled_tokens + (uint64_t)done.explain.n_prefilled,
              (uint64_t)done.explain.n_prompt_tokens)
        << "no token prefilled twice";
    EXPECT_EQ(cc.tiers.n_writes_disk, 1u) << "the stopped pre-warm wrote nothing to disk; the chat wrote its prefix";
    expect_equals_cold(**s, chat, done);
}

// Runs one job to its end; the last event.
completion_event run_one(scheduler & s, const turn_request & r) {
    collector c;
    EXPECT_TRUE(s.submit({r, c.sink()}).ok());
    EXPECT_TRUE(c.wait());
    return c.last() ? *c.last() : completion_event{};
}

// One work stream, a disk tier in `dir` and no idle write (never idle that long here).
scheduler_options one_stream_on_disk(const std::string & dir) {
    auto o = tiny_scheduler(1);
    o.engine.tiers.cache_dir = dir;
    o.engine.write_through_delay_ms = 3600 * 1000;
    o.engine.write_through_max_delay_ms = 0;
    return o;
}

// After a restart with `o`, workspace "a" on `segs` with `question`: served from disk, with
// the cold run's logits. Its explain.
explain_report restored_from_disk(const scheduler_options & o, std::vector<segment> segs, const std::string & question) {
    auto s = scheduler::start(o);
    EXPECT_TRUE(s.ok()) << s.error().to_string();
    if (!s.ok()) return {};
    segs.back().content = question;
    turn_request r = req("a", segs, 3);
    r.keep_logits = true;
    const completion_event done = run_one(**s, r);
    EXPECT_EQ(done.what, completion_event::kind::done);
    EXPECT_EQ(done.explain.tier, kv_tier::disk);
    expect_equals_cold(**s, r, done);
    return done.explain;
}

// A turn's disk write-through (the copy of its prefix out of the stream) is not made
// while turns keep coming: the workspace's next turn, in place, waits for nothing (also
// when it replaces the last turn's diff, which the stream held but the disk does not); a
// turn that takes the stream for another workspace makes it first, while the stream
// still holds that prefix; the file then restores into a fresh engine with the cold
// run's logits.
TEST(Scheduler, ADiskWriteThroughWaitsUntilTheStreamWouldChange) {
    temp_dir tmp("/tmp/warmctx-deferred-disk");
    ASSERT_FALSE(tmp.path.empty());
    workload_generator g(31, [](const std::string & x) { return x.size() / 3; });
    auto segs_a = make_workspace(g, 1200, 1);
    const auto segs_b = make_workspace(g, 1200, 2);
    const std::string diff =
        "diff --git a/src/x.cc b/src/x.cc\n--- a/src/x.cc\n+++ b/src/x.cc\n@@ -1,2 +1,2 @@\n-int a;\n+int b;\n";
    segs_a.insert(segs_a.end() - 1, segment{"diff", segment_kind::diff, "", "", diff});
    const auto o = one_stream_on_disk(tmp.path);
    {
        auto s = scheduler::start(o);
        ASSERT_TRUE(s.ok()) << s.error().to_string();
        ASSERT_EQ(run_one(**s, req("a", segs_a, 2)).what, completion_event::kind::done);
        auto next = segs_a;
        next.back().content = "and a second question";
        next[next.size() - 2].content = diff + "@@ -9 +9 @@\n-int c;\n+int d;\n";
        const completion_event second = run_one(**s, req("a", next, 2));
        ASSERT_EQ(second.what, completion_event::kind::done);
        EXPECT_TRUE(second.explain.in_place);
        EXPECT_EQ(counters_of(**s).tiers.n_disk_copies_out, 0u) << "nothing copied out between the two turns";
        ASSERT_EQ(run_one(**s, req("b", segs_b, 2)).what, completion_event::kind::done);
        EXPECT_EQ(counters_of(**s).tiers.n_disk_copies_out, 1u) << "a's prefix, before b's turn cleared the stream";
    }  // the stop writes b's
    EXPECT_GT(restored_from_disk(o, segs_a, "a third question, after a restart").n_reused, 1000);
}

// A workspace's next turn that cuts its stream back below the stream's deferred disk write
// (an edit of a pinned file: the turn resumes in place before it) does not make the write
// on its way (a copy of the whole prefix out of the engine: seconds for a 19k-token prefix
// of a 4B model on a GPU): the write is cut to the blocks the turn keeps, which the turn's
// own write, at the stop, covers. After a restart the prompt as it was before the edit
// restores those blocks from disk, with the cold run's logits.
TEST(Scheduler, AWorkspacesNextTurnInPlaceCutsItsDeferredDiskWriteToWhatItKeeps) {
    temp_dir tmp("/tmp/warmctx-cut-disk");
    ASSERT_FALSE(tmp.path.empty());
    workload_generator g(31, [](const std::string & x) { return x.size() / 3; });
    const auto segs_a = make_workspace(g, 1200, 1);
    auto edited = segs_a;
    for (segment & x : edited)
        if (x.kind == segment_kind::pinned_file) x.content += "\nint added_by_the_agent = 1;\n";
    edited.back().content = "and after the edit?";
    const auto o = one_stream_on_disk(tmp.path);
    pos_t kept = 0;
    {
        auto s = scheduler::start(o);
        ASSERT_TRUE(s.ok()) << s.error().to_string();
        ASSERT_EQ(run_one(**s, req("a", segs_a, 2)).what, completion_event::kind::done);
        const completion_event second = run_one(**s, req("a", edited, 2));
        ASSERT_EQ(second.what, completion_event::kind::done);
        EXPECT_TRUE(second.explain.in_place);
        kept = second.explain.n_reused;
        const context_counters cc = counters_of(**s);
        EXPECT_EQ(cc.tiers.n_disk_copies_out, 0u) << "the first turn's prefix was not copied out on the second's way";
        EXPECT_EQ(cc.memory.n_deferred_writes_cut, 1u);
        EXPECT_EQ(cc.memory.n_deferred_writes_parked, 0u);
    }  // the stop writes the second turn's prefix
    ASSERT_GT(kept, 500);
    EXPECT_EQ(restored_from_disk(o, segs_a, "a question after a restart, on the file as it was").n_reused, kept)
        << "what both versions share";
}

// Another workspace's turn that shares only the head of a stream (the system prompt) and
// takes it, with stream copies and a free stream: the stream's deferred write is not made on
// its way either, but goes with the stream, parked whole in the free one, and is made later
// (here: when every deferred write is flushed), from the parked copy.
TEST(Scheduler, AnotherWorkspacesTurnParksTheStreamWithItsDeferredDiskWrite) {
    temp_dir tmp("/tmp/warmctx-parked-disk");
    ASSERT_FALSE(tmp.path.empty());
    workload_generator g(31, [](const std::string & x) { return x.size() / 3; });
    const auto segs_a = make_workspace(g, 1200, 1);
    const auto segs_b = make_workspace(g, 1200, 2);
    auto o = one_stream_on_disk(tmp.path);
    o.engine.engine.n_seq_resident = 2;
    o.engine.cold_stream = false;  // else no resident streams
    o.engine.stream_copies = context_engine_options::stream_copy_mode::on;
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    ASSERT_TRUE((*s)->call([&](context_engine & ce) {
        // Turns as the scheduler runs them (run_turn writes through at once), on stream 0.
        std::vector<float> logits;
        auto a = ce.begin_turn(req("a", segs_a, 2), 0, logits);
        ASSERT_TRUE(a.ok()) << a.error().to_string();
        ASSERT_TRUE(ce.finish_turn(*a, 0).ok());
        auto b = ce.begin_turn(req("b", segs_b, 2), 0, logits);  // on a's stream
        ASSERT_TRUE(b.ok()) << b.error().to_string();
        ASSERT_TRUE(b->explain.in_place) << "b shares the head of a's stream";
        ASSERT_TRUE(ce.finish_turn(*b, 0).ok());
        const context_counters cc = ce.counters();
        EXPECT_EQ(cc.tiers.n_disk_copies_out, 0u);
        EXPECT_EQ(cc.memory.n_deferred_writes_parked, 1u);
        EXPECT_EQ(cc.memory.n_deferred_writes_cut, 0u);
        ce.flush_deferred_writes();
        EXPECT_EQ(ce.counters().tiers.n_disk_copies_out, 2u) << "a's, from the parked stream, and b's";
    }).ok());
}

// While turns keep the engine busy, a stream's deferred disk write waits no longer than
// write_through_max_delay_ms (twice that while a request waits), counted from the first
// turn whose write it still owes: a workspace's next turn in place takes the write over
// but not its age.
TEST(Scheduler, ADeferredDiskWriteWaitsNoLongerThanItsBoundWhileTurnsKeepTheEngineBusy) {
    temp_dir tmp("/tmp/warmctx-overdue-disk");
    ASSERT_FALSE(tmp.path.empty());
    workload_generator g(33, [](const std::string & x) { return x.size() / 3; });
    auto segs = make_workspace(g, 1200, 1);
    auto o = one_stream_on_disk(tmp.path);
    o.engine.write_through_max_delay_ms = 300;
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    ASSERT_TRUE((*s)->call([&](context_engine & ce) {
        std::vector<float> logits;
        auto a = ce.begin_turn(req("a", segs, 2), 0, logits);
        ASSERT_TRUE(a.ok()) << a.error().to_string();
        ASSERT_TRUE(ce.finish_turn(*a, 0).ok());
        EXPECT_FALSE(ce.write_through_overdue()) << "just deferred";
        std::this_thread::sleep_for(std::chrono::milliseconds(180));
        segs.back().content = "a second question, in place";
        auto b = ce.begin_turn(req("a", segs, 2), 0, logits);
        ASSERT_TRUE(b.ok()) << b.error().to_string();
        ASSERT_TRUE(b->explain.in_place);
        ASSERT_TRUE(ce.finish_turn(*b, 0).ok());
        std::this_thread::sleep_for(std::chrono::milliseconds(180));
        EXPECT_EQ(ce.counters().tiers.n_disk_copies_out, 0u);
        EXPECT_FALSE(ce.write_through_overdue(false)) << "while a request waits: twice the bound";
        EXPECT_TRUE(ce.write_through_overdue()) << "owed since the first turn, 360 ms ago";
        EXPECT_EQ(ce.counters().tiers.n_disk_copies_out, 1u);
        EXPECT_EQ(ce.counters().memory.n_write_throughs_overdue, 1u);
        EXPECT_FALSE(ce.write_through_overdue()) << "nothing is owed any more";
    }).ok());
}

// Once no turn has come for write_through_delay_ms, the idle engine makes the deferred
// write on its own.
TEST(Scheduler, AnIdleEngineMakesTheDeferredDiskWrite) {
    temp_dir tmp("/tmp/warmctx-idle-disk");
    ASSERT_FALSE(tmp.path.empty());
    auto o = tiny_scheduler(1);
    o.engine.tiers.cache_dir = tmp.path;
    o.engine.write_through_delay_ms = 50;
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok());
    ASSERT_EQ(run_one(**s, req("a", small_workspace(3), 2)).what, completion_event::kind::done);
    bool written = false;
    for (int i = 0; i < 600 && !written; ++i) {
        written = counters_of(**s).tiers.n_disk_copies_out == 1;
        if (!written) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(written) << "no copy out within 30 s of idleness";
}

// A pre-warm never slows a generating chat: between the chat's first token and its end
// no pre-warm chunk runs (on 2 cores one chunk costs several decode steps); the pre-warm
// goes on when the chat is done, and completes.
TEST(Scheduler, APrewarmWaitsWhileAChatGenerates) {
    workload_generator g(25, [](const std::string & x) { return x.size() / 3; });
    auto big = make_workspace(g, 1600, 1);  // about 25 chunks of 64
    std::mutex log_mu;
    std::string log;  // 'P': a pre-warm chunk, 'D': a token of the chat, 'E': its end
    collector c;
    event_sink chat_sink = [&, inner = c.sink()](const completion_event & ev) {
        {
            std::lock_guard<std::mutex> lk(log_mu);
            if (ev.what == completion_event::kind::delta) log += 'D';
            if (ev.what == completion_event::kind::done) log += 'E';
        }
        return inner(ev);
    };
    std::atomic<bool> sent{false};
    scheduler * self = nullptr;
    auto o = tiny_scheduler(2);
    o.after_prefill_chunk = [&](const turn_request & r, pos_t) {
        if (!is_prewarm(r.kind)) return;
        {
            std::lock_guard<std::mutex> lk(log_mu);
            log += 'P';
        }
        if (!sent.exchange(true)) ASSERT_TRUE(self->submit({req("other", small_workspace(9), 12), chat_sink}).ok());
    };
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok());
    self = s->get();
    ASSERT_TRUE((*s)->prewarm(prewarm_req("pw", big)).ok());
    ASSERT_TRUE(c.wait());
    ASSERT_EQ(c.last()->what, completion_event::kind::done);
    ASSERT_TRUE(wait_prewarms(**s, 1));
    std::string seen;
    {
        std::lock_guard<std::mutex> lk(log_mu);
        seen = log;
    }
    const size_t first = seen.find('D'), end = seen.find('E');
    ASSERT_NE(first, std::string::npos) << seen;
    ASSERT_NE(end, std::string::npos) << seen;
    EXPECT_EQ(seen.substr(first, end - first).find('P'), std::string::npos)
        << "a pre-warm chunk ran between two tokens: " << seen;
    EXPECT_NE(seen.find('P', end), std::string::npos) << "the pre-warm went on after the chat: " << seen;
    context_counters cc = counters_of(**s);
    EXPECT_EQ(cc.prewarm.n_preempted, 0u);
    EXPECT_EQ(cc.prewarm.n_prewarms, 1u);
}

// A chat whose prompt has much to tokenize: its leading segments are prefilled while the
// rest tokenizes (prefill_ahead), and the chat continues from them in place, its
// logits equal to a cold run's.
TEST(Scheduler, APromptsLeadingSegmentsArePrefilledAheadAndItsChatContinuesFromThem) {
    workload_generator g(23, [](const std::string & x) { return x.size() / 3; });
    auto segs = make_workspace(g, 1600, 1);
    turn_request chat = req("ahead", segs, 6);
    chat.keep_logits = true;
    collector c;
    std::atomic<bool> sent{false};
    scheduler * self = nullptr;
    auto o = tiny_scheduler(2);
    o.prefill_ahead = scheduler_options::ahead_mode::always;
    o.prefill_ahead_min_bytes = 1024;
    o.prefill_ahead_lead_bytes = 1500;  // the system prompt, tools and rules, not the repository map
    o.after_prefill_chunk = [&](const turn_request & r, pos_t) {
        // The whole prompt is assembled once the pre-warm has done a chunk.
        if (r.kind == turn_kind::leading_prewarm && !sent.exchange(true))
            ASSERT_TRUE(self->submit({chat, c.sink()}).ok());
    };
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok());
    self = s->get();
    ASSERT_TRUE((*s)->prefill_ahead(chat));
    ASSERT_TRUE(c.wait());
    const completion_event & done = *c.last();
    ASSERT_EQ(done.what, completion_event::kind::done);
    ASSERT_TRUE(done.explain.prewarm.has_value());
    EXPECT_TRUE(done.explain.prewarm->leading);
    EXPECT_GT(done.explain.prewarm->n_cached, 0);
    EXPECT_EQ(done.explain.n_reused, done.explain.prewarm->n_cached) << "reuses exactly what was prefilled ahead";
    EXPECT_TRUE(done.explain.in_place);
    context_counters cc = counters_of(**s);
    EXPECT_EQ(cc.prewarm.n_prefilled_tokens + (uint64_t)done.explain.n_prefilled,
              (uint64_t)done.explain.n_prompt_tokens)
        << "no token prefilled twice";
    expect_equals_cold(**s, chat, done);
    // The same prompt again: everything is remembered, nothing to prefill ahead.
    EXPECT_FALSE((*s)->prefill_ahead(chat));
}

TEST(Scheduler, PrefillAheadIsOffOnTheCpuByDefaultAndForSmallPrompts) {
    workload_generator g(24, [](const std::string & x) { return x.size() / 3; });
    const turn_request chat = req("ahead", make_workspace(g, 1600, 1), 4);
    auto o = tiny_scheduler(1);
    o.prefill_ahead_min_bytes = 1024;
    auto s = scheduler::start(o);  // prefill_ahead: gpu, and the tiny model runs on the CPU
    ASSERT_TRUE(s.ok());
    EXPECT_FALSE((*s)->prefill_ahead(chat));
    auto o2 = tiny_scheduler(1);
    o2.prefill_ahead = scheduler_options::ahead_mode::always;  // the default 64 KiB: this prompt is smaller
    auto s2 = scheduler::start(o2);
    ASSERT_TRUE(s2.ok());
    EXPECT_FALSE((*s2)->prefill_ahead(chat));
    EXPECT_EQ((*s2)->stats().n_prewarms_submitted, 0u);
}

// With every work sequence taken, a chat of another workspace takes the pre-warm's:
// the pre-warm stops and keeps what it did; no chat waits behind a pre-warm.
TEST(Scheduler, AChatThatNeedsASequencePreemptsAPrewarm) {
    workload_generator g(23, [](const std::string & x) { return x.size() / 3; });
    auto big = make_workspace(g, 1600, 1);
    collector c;
    std::atomic<bool> sent{false};
    scheduler * self = nullptr;
    auto o = tiny_scheduler(1);
    o.after_prefill_chunk = [&](const turn_request & r, pos_t) {
        if (is_prewarm(r.kind) && !sent.exchange(true))
            ASSERT_TRUE(self->submit({req("other", small_workspace(4), 4), c.sink()}).ok());
    };
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok());
    self = s->get();
    ASSERT_TRUE((*s)->prewarm(prewarm_req("pw", big)).ok());
    ASSERT_TRUE(c.wait());
    EXPECT_EQ(c.last()->what, completion_event::kind::done);
    context_counters cc = counters_of(**s);
    EXPECT_EQ(cc.prewarm.n_preempted, 1u);
    EXPECT_EQ(cc.prewarm.n_prewarms, 1u);
    // What it did stays cached: explain of the pre-warmed context reuses it.
    std::optional<result<explain_report>> ex;
    turn_request q = req("pw", big, 4);
    ASSERT_TRUE((*s)->call([&](context_engine & ce) { ex.emplace(ce.explain(q)); }).ok());
    ASSERT_TRUE(ex->ok());
    EXPECT_GT((*ex)->n_reused, 0);
}

// Pre-warms wait behind chats; a newer pre-warm of a workspace replaces its queued one;
// jobs() tells each job's state and queue position.
TEST(Scheduler, PrewarmsQueueBehindChatsAndANewerOneReplacesTheQueuedOne) {
    auto o = tiny_scheduler(1);
    std::mutex gate_mu;
    std::condition_variable gate_cv;
    bool open = false;
    o.before_admit = [&](const turn_request & r) {
        if (r.workspace != "hold") return;
        std::unique_lock<std::mutex> lk(gate_mu);
        gate_cv.wait(lk, [&] { return open; });
    };
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok());
    collector hold, after;
    ASSERT_TRUE((*s)->submit({req("hold", small_workspace(5), 2), hold.sink()}).ok());
    // The engine thread now waits in before_admit of "hold".
    for (int i = 0; i < 400 && (*s)->stats().queue_depth > 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto segs = small_workspace(6);
    ASSERT_TRUE((*s)->prewarm(prewarm_req("x", segs)).ok());
    segs.front().content += " (edited)";
    ASSERT_TRUE((*s)->prewarm(prewarm_req("x", segs)).ok());
    ASSERT_TRUE((*s)->prewarm(prewarm_req("y", small_workspace(7))).ok());
    ASSERT_TRUE((*s)->submit({req("z", small_workspace(8), 2), after.sink()}).ok());
    std::vector<job_progress> jobs = (*s)->jobs();
    ASSERT_EQ(jobs.size(), 3u);  // "hold" is being admitted: not published yet
    EXPECT_EQ(jobs[0].workspace, "z");
    EXPECT_FALSE(jobs[0].prewarm);
    EXPECT_EQ(jobs[0].queue_position, 1u);
    EXPECT_EQ(jobs[1].workspace, "x");
    EXPECT_TRUE(jobs[1].prewarm);
    EXPECT_EQ(jobs[1].queue_position, 1u);
    EXPECT_EQ(jobs[2].workspace, "y");
    EXPECT_EQ(jobs[2].queue_position, 2u);
    EXPECT_EQ((*s)->stats().n_prewarms_replaced, 1u);
    {
        std::lock_guard<std::mutex> lk(gate_mu);
        open = true;
    }
    gate_cv.notify_all();
    ASSERT_TRUE(hold.wait());
    ASSERT_TRUE(after.wait());
    ASSERT_TRUE(wait_prewarms(**s, 2));
    // The chat "z" ran before any pre-warm: when it was admitted nothing had been pre-warmed.
    EXPECT_FALSE(after.last()->explain.prewarm.has_value());
    // The edited content was pre-warmed, not the first version.
    turn_request q = req("x", segs, 2);
    std::optional<result<explain_report>> ex;
    ASSERT_TRUE((*s)->call([&](context_engine & ce) { ex.emplace(ce.explain(q)); }).ok());
    ASSERT_TRUE(ex->ok());
    EXPECT_EQ((*ex)->kind, miss_kind::full_hit) << (*ex)->reason;
}

// Resident streams: with one job at a time (n_parallel 1) and two more streams, three
// workspaces each keep their own stream between turns - every later turn is in place -
// and never more than one job runs.
TEST(Scheduler, ResidentStreamsKeepEachWorkspacesPrefixBetweenItsTurns) {
    scheduler_options o = tiny_scheduler(1);
    o.engine.cold_stream = false;
    o.engine.engine.n_seq_resident = 2;
    o.engine.cold_stream = false;  // else no resident streams
    o.engine.stream_copies = context_engine_options::stream_copy_mode::on;  // as on a GPU
    admission_gate gate;
    gate.install(o);
    auto s = scheduler::start(o);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    std::vector<std::vector<segment>> ws = {small_workspace(1), small_workspace(2), small_workspace(3)};
    const std::vector<std::string> names = {"a", "b", "c"};
    auto run = [&](size_t i, const std::string & q) {
        auto segs = ws[i];
        segs.back().content = q;
        collector c;
        EXPECT_TRUE((*s)->submit({req(names[i], segs, 2), c.sink()}).ok());
        EXPECT_TRUE(c.wait());
        return c.last() ? c.last()->explain : explain_report{};
    };
    for (size_t i = 0; i < 3; ++i) run(i, "first");
    for (int round = 0; round < 2; ++round)
        for (size_t i = 0; i < 3; ++i) {
            explain_report r = run(i, "round " + std::to_string(round));
            EXPECT_EQ(r.kind, miss_kind::full_hit) << names[i];
            EXPECT_TRUE(r.in_place) << names[i] << " round " << round;
        }
    auto c = counters_of(**s);
    EXPECT_EQ(c.memory.n_resident_streams, 2u);
    EXPECT_EQ(c.memory.n_pool_loads, 0u);  // no stream was ever displaced: nothing came from the pool
    // Several submitted at once, each workspace's prefix in a stream of its own: beyond
    // n_parallel (1) each is admitted into its own stream at once (runtime/admission.h),
    // all three before the first is done, each in place.
    std::atomic<int> clock{0};
    std::vector<int> admitted(3, -1), done(3, -1);
    std::vector<std::unique_ptr<collector>> cs;
    gate.close();  // the first admission waits until all three are queued
    for (size_t i = 0; i < 3; ++i) {
        cs.push_back(std::make_unique<collector>());
        auto segs = ws[i];
        segs.back().content = "together";
        event_sink inner = cs.back()->sink();
        event_sink sink = [&, i, inner](const completion_event & ev) {
            if (ev.what == completion_event::kind::admitted) admitted[i] = clock++;
            if (ev.what == completion_event::kind::done) done[i] = clock++;
            return inner(ev);
        };
        ASSERT_TRUE((*s)->submit({req(names[i], segs, 4), sink}).ok());
    }
    gate.open();
    for (auto & x : cs) ASSERT_TRUE(x->wait());
    EXPECT_EQ((*s)->stats().n_completed, 12u);
    const int last_admitted = *std::max_element(admitted.begin(), admitted.end());
    const int first_done = *std::min_element(done.begin(), done.end());
    EXPECT_GE(*std::min_element(admitted.begin(), admitted.end()), 0);
    EXPECT_LT(last_admitted, first_done);
    for (auto & x : cs) EXPECT_TRUE(x->last()->explain.in_place);
}

// Where the time to the first token went adds up: queue, sampler, write-back, lookup,
// restore, copy, prefill and the wait for other jobs' work, with the assembly, are
// first_token_ms less the engine thread's own bookkeeping.
TEST(Scheduler, TheNamedPhasesAddUpToTheTimeToTheFirstToken) {
    auto s = scheduler::start(tiny_scheduler(2));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    auto wa = small_workspace(1), wb = small_workspace(2);
    for (int turn = 0; turn < 3; ++turn) {
        std::vector<std::unique_ptr<collector>> cs;
        for (auto * w : {&wa, &wb}) {
            auto segs = *w;
            segs.back().content = "turn " + std::to_string(turn);
            cs.push_back(std::make_unique<collector>());
            ASSERT_TRUE((*s)->submit({req(w == &wa ? "a" : "b", segs, 2), cs.back()->sink()}).ok());
        }
        for (auto & c : cs) {
            ASSERT_TRUE(c->wait());
            const completion_event * started = nullptr;
            for (auto & e : c->events)
                if (e.what == completion_event::kind::started) started = &e;
            ASSERT_NE(started, nullptr);
            const completion_event & e = *started;
            const double sum = e.t_queue_ms + e.t_sampler_ms + e.t_assemble_ms + e.t_write_back_ms + e.t_lookup_ms +
                               e.t_restore_ms + e.t_copy_ms + e.t_prefill_ms + e.t_checkpoint_ms + e.t_interleave_ms;
            EXPECT_LE(sum, e.t_first_token_ms + 0.05) << "turn " << turn;
            EXPECT_GE(sum, std::min(e.t_first_token_ms * 0.95, e.t_first_token_ms - 2.0))
                << "turn " << turn << ": " << sum << " of " << e.t_first_token_ms << " ms named";
        }
    }
}

// After the first token: the decode steps an answer was in (one per token but its last,
// greedy without drafts), its sampling and the caching of its turn are named, and they fit
// in its decode time beside another job's (the rest: the other's work between its steps).
TEST(Scheduler, AnAnswersDecodeTimeIsNamedStepBySamplingAndCaching) {
    auto s = scheduler::start(tiny_scheduler(2));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    std::vector<std::unique_ptr<collector>> cs;
    for (uint64_t w : {1, 2}) {
        turn_request r = req(w == 1 ? "a" : "b", small_workspace(w), 16);
        r.sampling.draft_max = 0;
        cs.push_back(std::make_unique<collector>());
        ASSERT_TRUE((*s)->submit({r, cs.back()->sink()}).ok());
    }
    for (auto & c : cs) {
        ASSERT_TRUE(c->wait());
        const completion_event & d = *c->last();
        ASSERT_EQ(d.what, completion_event::kind::done);
        const int32_t n = d.usage.completion_tokens;
        EXPECT_EQ((int32_t)d.n_decode_steps, d.finish == finish_reason::length ? n - 1 : n);
        EXPECT_GT(d.t_decode_step_ms, 0.0);
        EXPECT_GT(d.t_sample_ms, 0.0);
        EXPECT_GE(d.t_finish_ms, 0.0);
        const double decode = d.t_total_ms - d.t_first_token_ms;
        EXPECT_LE(d.t_decode_step_ms + d.t_sample_ms + d.t_finish_ms, decode + 0.05);
    }
}

// The stream a turn has just finished on is left alone for a moment: its workspace's
// next turn, coming at once, continues in place with no write-back before it (the
// write-back ahead of the only stream held the next turn of one workspace in the queue
// for a copy of its whole prefix: 370 ms at 47k tokens on an H200).
TEST(Scheduler, AWorkspacesQuickNextTurnWaitsForNoWriteBackAhead) {
    auto s = scheduler::start(tiny_scheduler(1));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    for (int turn = 0; turn < 4; ++turn) {
        auto w = small_workspace(1);
        w.back().content = "question " + std::to_string(turn);
        collector c;
        ASSERT_TRUE((*s)->submit({req("a", std::move(w), 2), c.sink()}).ok());
        ASSERT_TRUE(c.wait());
        if (turn > 0) EXPECT_EQ(c.last()->explain.kind, miss_kind::full_hit) << c.last()->explain.reason;
    }
    auto c = counters_of(**s);
    EXPECT_EQ(c.memory.n_write_backs_ahead, 0u) << "the stream of the last turn was saved ahead at once";
    // Left idle past the delay, it is saved ahead (the test below: another workspace's
    // turn then writes nothing back on its way).
    bool saved = false;
    for (int i = 0; i < 2000 && !saved; ++i) {
        saved = counters_of(**s).memory.n_write_backs_ahead >= 1;
        if (!saved) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_TRUE(saved) << "the idle engine never saved the stream ahead";
}

// Idle, with no free stream left, the engine thread saves the stream the next
// workspace would take into the pool ahead: that workspace's turn then writes nothing
// back on its way.
TEST(Scheduler, AnIdleEngineSavesTheNextDisplacedStreamAhead) {
    auto s = scheduler::start(tiny_scheduler(1));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    auto run = [&](const std::string & ws, std::vector<segment> segs) {
        collector c;
        EXPECT_TRUE((*s)->submit({req(ws, std::move(segs), 2), c.sink()}).ok());
        EXPECT_TRUE(c.wait());
        const completion_event * started = nullptr;
        for (auto & e : c.events)
            if (e.what == completion_event::kind::started) started = &e;
        return started ? *started : completion_event{};
    };
    auto wb = small_workspace(2);
    for (auto & x : wb)
        if (x.id == "system") x.content = "You are another agent, of another team.\n";
    run("a", small_workspace(1));
    // The one stream holds a's prefix, unsaved; idle, it goes to the pool.
    bool saved = false;
    for (int i = 0; i < 2000 && !saved; ++i) {
        saved = counters_of(**s).memory.n_write_backs >= 1;
        if (!saved) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(saved) << "the idle engine did not save the stream ahead";
    run("b", wb);  // takes the stream: nothing left to save on its way
    auto c = counters_of(**s);
    EXPECT_GE(c.memory.n_write_backs, 1u);
    EXPECT_EQ(c.memory.n_write_backs, c.memory.n_write_backs_ahead);  // every one off a turn's way
    // a comes back: its prefix from the pool, all of it
    auto wa = small_workspace(1);
    wa.back().content = "again";
    collector ca;
    ASSERT_TRUE((*s)->submit({req("a", wa, 2), ca.sink()}).ok());
    ASSERT_TRUE(ca.wait());
    EXPECT_EQ(ca.last()->explain.kind, miss_kind::full_hit) << ca.last()->explain.reason;
}

}  // namespace
}  // namespace warmctx
