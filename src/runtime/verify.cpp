#include "runtime/verify.h"
#include "warmctx/drafts.h"

#include <algorithm>
#include <random>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdlib.h>

#include "store/snapshot_store.h"
#include "workload/workload.h"

namespace warmctx {

// ---- the report ---------------------------------------------------------------

namespace {

using clock_type = std::chrono::steady_clock;

struct comparison {
    bool tokens_equal = false;
    bool logits_equal = false;
    float max_diff = 0;
    size_t n_agree = 0, n_tokens = 0;
};

comparison compare(const turn_result & w, const turn_result & c) {
    comparison o;
    o.tokens_equal = w.gen.tokens == c.gen.tokens;
    o.n_tokens = c.gen.tokens.size();
    for (size_t i = 0; i < std::min(w.gen.tokens.size(), c.gen.tokens.size()); ++i)
        o.n_agree += w.gen.tokens[i] == c.gen.tokens[i];
    auto diff = [&](const float * a, const float * b, size_t n) {
        for (size_t i = 0; i < n; ++i) o.max_diff = std::max(o.max_diff, std::fabs(a[i] - b[i]));
    };
    diff(w.prompt_logits.data(), c.prompt_logits.data(), std::min(w.prompt_logits.size(), c.prompt_logits.size()));
    // Generation logits compare only while the tokens agree (after a divergence the
    // prompts differ and so must the logits).
    const size_t n_vocab = w.prompt_logits.size();
    const size_t same = o.tokens_equal ? w.gen_logits.size() : std::min(w.gen_logits.size(), (o.n_agree + 1) * n_vocab);
    diff(w.gen_logits.data(), c.gen_logits.data(), std::min({same, w.gen_logits.size(), c.gen_logits.size()}));
    o.logits_equal =
        w.prompt_logits.size() == c.prompt_logits.size() && w.gen_logits.size() == c.gen_logits.size() &&
        std::memcmp(w.prompt_logits.data(), c.prompt_logits.data(), w.prompt_logits.size() * sizeof(float)) == 0 &&
        std::memcmp(w.gen_logits.data(), c.gen_logits.data(), w.gen_logits.size() * sizeof(float)) == 0;
    return o;
}

struct dir_cleanup {
    std::string d;
    ~dir_cleanup() {
        if (d.empty()) return;
        std::error_code ec;
        std::filesystem::remove_all(d, ec);
    }
};

turn_expectation at_least(pos_t n, const char * tier = "") {
    turn_expectation e;
    e.min_reuse = n;
    e.tier = tier;
    return e;
}
turn_expectation after_drift_of(const char * field) {
    turn_expectation e;
    e.drifted_field = field;
    return e;
}

// One scenario: a workspace through every step, each turn warm and cold.
class scenario_runner {
  public:
    scenario_runner(context_engine & ce, cache_model & cm, verify_report & rep, const verify_options & o, int sc)
        : ce_(ce), cm_(cm), rep_(rep), o_(o), sc_(sc), ws_("scenario-" + std::to_string(sc)),
          g_(o.seed * 1000003ull + (uint64_t)sc, [&ce](const std::string & s) -> size_t {
              auto t = ce.tokenize(s);
              return t.ok() ? t->size() : s.size() / 4;
          }) {}

    status run() {
        auto & rng = g_.rng();
        const size_t stable = 150 + rng() % std::max<size_t>(1, o_.stable_tokens_max - 150);
        segs_ = make_workspace(g_, stable, (int)(rng() % 3));

        WARMCTX_RETURN_IF_ERROR(step("cold turn", {}));
        segs_.back().content = g_.question();
        turn_expectation again = at_least(stable_end(), "engine");
        again.in_place = 1;  // the work stream still holds the prefix
        WARMCTX_RETURN_IF_ERROR(step("new question", again));
        // The same request again (an agent retrying its turn): drafted from the answer before.
        turn_expectation retried = again;
        retried.drafted = o_.draft_max > 0;
        retried.sent_again = true;
        WARMCTX_RETURN_IF_ERROR(step("sent again", retried));
        // In another work stream: copied from the stream that holds it (with stream
        // copies, as on a GPU: device to device) or loaded through the pool.
        segs_.back().content = g_.question();
        turn_expectation other = at_least(stable_end(), "engine");
        other.in_place = 0;
        WARMCTX_RETURN_IF_ERROR(step("another stream", other, 1));
        // Out of the work stream: served from the RAM pool (a load into the stream).
        ce_.drop_work_streams();
        segs_.back().content = g_.question();
        turn_expectation pooled = at_least(stable_end(), "engine");
        pooled.in_place = 0;
        WARMCTX_RETURN_IF_ERROR(step("pool restore", pooled));
        if (o_.tiers) {
            // Evicted from the engine: served from disk.
            ce_.drop_engine_cache();
            segs_.back().content = g_.question();
            WARMCTX_RETURN_IF_ERROR(step("disk restore", at_least(stable_end(), "disk")));
        }
        add_history();
        segs_.push_back({"diff", segment_kind::diff, "", "", g_.diff("src/x.cc", 2)});
        WARMCTX_RETURN_IF_ERROR(step("history + diff", at_least(stable_end())));
        add_history();
        for (auto & s : segs_)
            if (s.id == "diff") s.content = g_.diff("src/y.cc", 1);  // volatile edit
        segs_.push_back({"tests", segment_kind::test_output, "", "", g_.test_output(1)});
        WARMCTX_RETURN_IF_ERROR(step("volatile edit", at_least(stable_end())));
        // A stable edit: one line of a random stable segment.
        std::vector<size_t> stable_idx;
        for (size_t i = 0; i < segs_.size(); ++i)
            if (segs_[i].kind == segment_kind::tools || segs_[i].kind == segment_kind::repo_map ||
                segs_[i].kind == segment_kind::pinned_file)
                stable_idx.push_back(i);
        const size_t edited_i = stable_idx[rng() % stable_idx.size()];
        const std::string edited_id = segs_[edited_i].id;
        const std::string before_edit = segs_[edited_i].content;
        const std::vector<block> before_edit_blocks = prev_blocks_;
        WARMCTX_RETURN_IF_ERROR(stable_edit("stable edit of '" + edited_id + "'", edited_i, 2));
        // The edit undone: the trimmed stable blocks were kept (parked in a free stream
        // with stream copies, else in the pool), so the stable prefix is reused as far as
        // it is the one before the edit (all of it, unless the edit cut the segment into
        // finer blocks or moved it: warmctx/volatility.h) or the edited turn's.
        segs_[edited_i].content = before_edit;
        segs_.back().content = g_.test_output(3);
        const pos_t undone =
            std::max(std::min(stable_end(), shared_block_end(before_edit_blocks)), shared_block_end(prev_blocks_));
        WARMCTX_RETURN_IF_ERROR(step("edit undone", at_least(undone, undone > 0 ? "engine" : "")));
        // Edited again, twice: ranked as often edited, the segment moves after the others
        // of its class (a reorder is a miss from its old place on), then an edit keeps its
        // unchanged head. Warm equals cold through each.
        WARMCTX_RETURN_IF_ERROR(stable_edit("second edit of '" + edited_id + "'", edited_i, 4));
        WARMCTX_RETURN_IF_ERROR(stable_edit("third edit of '" + edited_id + "'", edited_i, 5));
        // A sliding window of the last messages: each turn drops the oldest exchange, so
        // the whole conversation moves; from the second such turn on it is one chunk run
        // of class none (assembly_hints::fuse_conversation).
        for (int slide = 1; slide <= 3; ++slide) {
            drop_oldest_history();
            add_history();
            for (auto & seg : segs_)
                if (seg.kind == segment_kind::user) seg.content = g_.question();
            WARMCTX_RETURN_IF_ERROR(step("window slide " + std::to_string(slide), at_least(stable_end())));
        }
        // A long conversation of short messages (150 exchanges, 4k-8k tokens: packed into
        // spans from 512 tokens on, growing with depth, profile::span_tokens), then turns that each append an
        // exchange: each reuses what the turn before computed but its last span, warm
        // equal to cold. Every other scenario (the first among them): each of these turns
        // is a cold prefill of the whole conversation too, the costliest turns of a run.
        if (sc_ % 2 == 0) {
            std::erase_if(segs_, [](const segment & s) { return s.kind == segment_kind::history; });
            for (int i = 0; i < 150; ++i) add_history(true);
            WARMCTX_RETURN_IF_ERROR(step("long conversation", at_least(stable_end())));
            for (int turn = 1; turn <= 2; ++turn) {
                add_history(true);
                WARMCTX_RETURN_IF_ERROR(step("conversation appended " + std::to_string(turn),
                                             at_least(shared_block_end(prev_blocks_), "engine")));
            }
            // Back to a few messages: drift is about the stable prefix.
            std::erase_if(segs_, [](const segment & s) { return s.kind == segment_kind::history; });
            add_history();
        }
        if (rng() % 2 == 0) {
            // Profile drift: a different chunk size computes different KV bits. Sizes
            // repeat every chunk/2 scenarios, so a later scenario may find what all
            // prompts start with (the system prompt, the head of the tool schemas)
            // cached under its drifted size by an earlier one: a legitimate hit, bounded
            // by the cache model.
            const uint32_t chunk = ce_.context().chunk_tokens;
            const uint32_t drifted =
                std::max<uint32_t>(1, chunk - 1 - (uint32_t)sc_ % std::max<uint32_t>(1, chunk / 2));
            WARMCTX_RETURN_IF_ERROR(ce_.set_chunk_tokens(drifted));
            status st = step("profile drift", after_drift_of("chunk_tokens"));
            WARMCTX_RETURN_IF_ERROR(ce_.set_chunk_tokens(chunk));
            WARMCTX_RETURN_IF_ERROR(st);
        }
        if (mismatch_) ++rep_.mismatched_scenarios;
        return {};
    }

    bool mismatch() const { return mismatch_; }

  private:
    turn_request request(std::vector<segment> s, bool drafted = false) const {
        turn_request r;
        r.workspace = ws_;
        r.segments = std::move(s);
        r.sampling.max_tokens = o_.max_tokens;
        r.sampling.draft_max = drafted ? o_.draft_max : 0;
        r.keep_logits = true;
        return r;
    }

    // Runs the current segments warm and cold, compares them and checks `want`.
    status step(const std::string & what, turn_expectation want, seq_id seq = 0) {
        std::vector<segment> shuffled = segs_;
        // Input order must not matter. The turn sent again shuffles with a generator of its
        // own: the scenario's stays where it was without it.
        std::mt19937_64 own(sc_ * 7919u + 1);
        std::shuffle(shuffled.begin(), shuffled.end(), want.sent_again ? own : g_.rng());
        const turn_request req = request(std::move(shuffled), want.drafted);
        // What the cache may hold for this prompt, before the turn adds to it.
        auto prompt = ce_.assemble_request(req);
        if (!prompt) return prompt.error().with_context(ws_ + " " + what);
        if (!ce_.context().memory.reuse) {
            // A memory warmctx does not cut is served without reuse: any reuse is wrong.
            want = turn_expectation{};
            want.max_reuse = 0;
        } else if (ce_.context().memory.checkpoints && o_.engine.checkpoint_gap_tokens > 0) {
            // Block ends left out of the checkpoints: a turn may resume before what the
            // cache model expects; only exactness and the bound below are checked.
            want = turn_expectation{};
        }
        want.max_cached = cm_.max_reuse(prompt->blocks, (pos_t)prompt->tokens.size());
        auto w = ce_.run_turn(req, seq);
        if (!w) return w.error().with_context(ws_ + " " + what);
        cm_.note_cached(prompt->blocks);
        prev_blocks_ = prompt->blocks;
        // The cold reference computes the same prompt: the order and finer blocks the warm
        // turn was assembled with (its workspace's history moved on since).
        turn_request cold_req = req;
        cold_req.hints = prompt->hints;
        auto c = ce_.run_cold(cold_req);
        if (!c) return c.error().with_context(ws_ + " " + what + " (cold)");
        ++rep_.turns;
        if (prompt->hints.fuse_generation_prompt) ++rep_.n_fused_turns;
        if (prompt->hints.fuse_conversation) ++rep_.n_fused_conversations;
        const comparison cmp = compare(*w, *c);
        // A drafted answer's rows were decoded together: the same tokens, its logits but
        // for their last bits (warmctx/drafts.h); the prompt's stay exact.
        const bool drafted = w->gen.drafts.n_drafted > 0;
        (drafted ? rep_.max_drafted_logit_diff : rep_.max_logit_diff) =
            std::max(drafted ? rep_.max_drafted_logit_diff : rep_.max_logit_diff, cmp.max_diff);
        rep_.n_tokens_agree += cmp.n_agree;
        rep_.n_tokens_compared += cmp.n_tokens;
        const bool prompt_equal = w->prompt_logits == c->prompt_logits;
        if (!cmp.tokens_equal || (drafted ? !prompt_equal : !cmp.logits_equal)) {
            mismatch_ = true;
            rep_.mismatches.push_back(
                {sc_, what, cmp.tokens_equal, cmp.logits_equal, cmp.max_diff, cmp.n_agree, cmp.n_tokens});
        }
        rep_.n_drafted += w->gen.drafts.n_drafted;
        rep_.n_draft_accepted += w->gen.drafts.n_accepted;
        const bool can_draft = drops_a_draft(ce_.context().memory);
        if (want.drafted && !can_draft && w->gen.drafts.n_drafted > 0)
            rep_.failures.push_back({sc_, what, "a " + std::string(memory_kind_name(ce_.context().memory.kind)) +
                                     " memory drafted", 0, ""});
        // Every token but the first (sampled after the prompt) and the last (never decoded).
        if (want.drafted && can_draft && w->gen.drafts.n_accepted + 2 < w->gen.tokens.size())
            rep_.failures.push_back({sc_, what,
                                     "the answer before drafted " + std::to_string(w->gen.drafts.n_accepted) +
                                         " of its " + std::to_string(w->gen.tokens.size()) + " tokens",
                                     0, ""});
        const explain_report & ex = w->explain;
        rep_.tokens_reused += (uint64_t)ex.n_reused;
        rep_.tokens_prefilled += (uint64_t)ex.n_prefilled;
        rep_.results[std::string(miss_kind_name(ex.kind))]++;
        if (ex.n_reused > 0) rep_.reuses_by_tier[std::string(kv_tier_name(ex.tier))]++;
        if (!want.drifted_field.empty()) {
            rep_.drift_turns++;
            if (ex.n_reused > 0) rep_.drift_turns_reused++;
        }
        for (auto & m : check_turn(want, ex))
            rep_.failures.push_back({sc_, what, std::move(m), ex.n_reused, ex.reason});
        return {};
    }

    // One line of segs_[i] edited: reuse stops exactly where the prompt's blocks stop being
    // the previous turn's (the block holding the first changed token, or the first block a
    // reorder moved, is new; the previous turn's stream holds the rest).
    status stable_edit(const std::string & what, size_t i, int n_failures) {
        segs_[i].content = g_.edit_one_line(segs_[i].content);
        segs_.back().content = g_.test_output(n_failures);
        turn_expectation edit;
        edit.min_reuse = edit.max_reuse = shared_block_end(prev_blocks_);
        edit.changed_segment = segs_[i].id;
        return step(what, edit);
    }

    pos_t stable_end() const {
        auto prompt = ce_.assemble_request(request(segs_));
        return prompt.ok() ? prompt->stable_end : 0;
    }
    // The end of the current segments' leading blocks that are `blocks`' (same chain
    // hashes: the same tokens in the same chunks), snapped as a reuse is.
    pos_t shared_block_end(const std::vector<block> & blocks) const {
        auto prompt = ce_.assemble_request(request(segs_));
        if (!prompt.ok()) return 0;
        size_t n = 0;
        while (n < prompt->blocks.size() && n < blocks.size() && prompt->blocks[n].chain == blocks[n].chain) ++n;
        return snap_reuse(*prompt, n).n_tokens;
    }
    void drop_oldest_history() {
        auto it =
            std::find_if(segs_.begin(), segs_.end(), [](const segment & s) { return s.kind == segment_kind::history; });
        const std::string exchange = it == segs_.end() ? "" : it->id.substr(0, 5);  // "h0001" of "h0001a"
        std::erase_if(segs_,
                      [&](const segment & s) { return s.kind == segment_kind::history && s.id.starts_with(exchange); });
    }
    // An exchange: a question and an answer (`brief`: a few words each, as an agent's
    // small tool calls and results are).
    void add_history(bool brief = false) {
        ++n_hist_;
        char id[32];
        std::snprintf(id, sizeof id, "h%04d", n_hist_);
        const std::string n = std::to_string(n_hist_);
        segs_.push_back(
            {std::string(id) + "a", segment_kind::history, "", "user", brief ? "ok, step " + n : g_.question()});
        segs_.push_back({std::string(id) + "b", segment_kind::history, "", "assistant",
                         brief ? "ran tool " + n + ": exit 0" : g_.terminal_log(2)});
    }

    context_engine & ce_;
    cache_model & cm_;
    verify_report & rep_;
    const verify_options & o_;
    const int sc_;
    const std::string ws_;
    workload_generator g_;
    std::vector<segment> segs_;
    std::vector<block> prev_blocks_;  // the previous warm turn's prompt's blocks
    int n_hist_ = 0;
    bool mismatch_ = false;
};

}  // namespace

result<verify_report> run_verify(const verify_options & opts, const verify_progress & progress) {
    if (opts.scenarios < 1) return invalid_argument("verify needs at least one scenario");
    if (opts.stable_tokens_max < 200)
        return invalid_argument("verify's largest stable prefix must be at least 200 tokens");
    context_engine_options co = opts.engine;
    co.n_work_seqs = std::max<uint32_t>(co.n_work_seqs, 2);  // a step runs in another stream
    const uint32_t need = (uint32_t)opts.stable_tokens_max + 12288;  // and the long conversation
    if (co.engine.n_ctx < need) co.engine.n_ctx = need;
    // Scenarios also go through disk restores (a private directory unless the options
    // name one).
    dir_cleanup cleanup;
    if (opts.tiers) {
        if (co.tiers.cache_dir.empty()) {
            char templ[] = "/tmp/warmctx-verify-XXXXXX";
            if (!mkdtemp(templ)) return io_error("cannot create a temporary cache directory");
            cleanup.d = co.tiers.cache_dir = templ;
        }
    }
    auto ce_r = context_engine::open(co);
    if (!ce_r) return ce_r.error();
    context_engine & ce = **ce_r;
    verify_options o = opts;
    o.draft_max = default_draft_max(opts.draft_max, ce.context().backend, ce.context().steps_exact);

    verify_report rep;
    rep.mode = std::string(kv_mode_name(co.engine.mode));
    rep.model = co.engine.model_path;
    rep.seed = opts.seed;
    rep.policy = std::string(eviction_policy_name(co.policy));
    rep.budget_tokens = co.budget.max_tokens;
    rep.scenarios_asked = opts.scenarios;
    cache_model cm;
    if (ce.disk_tier())  // a directory from an earlier run may already serve these prompts
        for (const auto & e : ce.disk_tier()->list()) cm.note_cached(e.meta.blocks);

    const auto t_start = clock_type::now();
    for (int sc = 0; sc < opts.scenarios; ++sc) {
        if (sc > 0 && opts.max_seconds > 0 &&
            std::chrono::duration<double>(clock_type::now() - t_start).count() >= opts.max_seconds) {
            if (progress)
                progress("stopped after " + std::to_string(sc) + " of " + std::to_string(opts.scenarios) +
                         " scenarios: --seconds ran out");
            break;
        }
        scenario_runner s(ce, cm, rep, o, sc);
        WARMCTX_RETURN_IF_ERROR(s.run());
        rep.scenarios = sc + 1;
        if (progress)
            progress("scenario " + std::to_string(sc + 1) + "/" + std::to_string(opts.scenarios) + ": " +
                     (s.mismatch() ? "MISMATCH" : "ok"));
    }
    rep.elapsed_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t_start).count();
    const auto c = ce.counters().cache;
    for (int k = 1; k < k_retention_class_count; ++k)
        rep.evictions_by_class[std::string(retention_class_name((retention_class)k))] = c.evictions_by_class[(size_t)k];
    rep.whole_holder_evictions = c.n_whole_holder_evictions;
    const kv_memory m = ce.counters().memory;
    rep.backend = ce.context().backend;
    rep.memory = std::string(memory_kind_name(ce.context().memory.kind));
    rep.stream_copies = co.stream_copies == context_engine_options::stream_copy_mode::on ||
                        (co.stream_copies == context_engine_options::stream_copy_mode::automatic &&
                         ce.context().n_gpu_layers > 0);
    rep.n_stream_copies = m.n_stream_copies;
    rep.n_branches_parked = m.n_branches_parked;
    rep.n_pool_loads = m.n_pool_loads;
    rep.n_write_backs = m.n_write_backs;
    rep.n_padded_decodes = m.n_padded_decodes;
    return rep;
}

}  // namespace warmctx
