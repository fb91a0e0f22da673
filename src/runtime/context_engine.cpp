// The request flow over the engine, the assembler, the prefix cache and the tiers:
// assemble -> lookup (engine, then tiers) -> reuse (copy or restore) -> prefill the
// tail in canonical chunks -> generate -> cache update and write-through.
#include "util/clock.h"
#include "warmctx/context_engine.h"

#include <chrono>
#include <limits>

#include "context_engine_impl.h"
#include "warmctx/chunking.h"
#include "engine/engine_adapters.h"

namespace warmctx {

namespace {

int64_t unix_ms_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

}  // namespace

pending_turn::pending_turn(pending_turn && o) noexcept { *this = std::move(o); }

pending_turn & pending_turn::operator=(pending_turn && o) noexcept {
    if (this == &o) return *this;
    if (owner_) owner_->abort_turn(*this);
    workspace = std::move(o.workspace);
    seq = o.seq;
    prompt = std::move(o.prompt);
    explain = std::move(o.explain);
    tick = o.tick;
    cache = o.cache;
    t_assemble_ms = o.t_assemble_ms;
    t_copy_ms = o.t_copy_ms;
    t_restore_ms = o.t_restore_ms;
    t_prefill_ms = o.t_prefill_ms;
    t_checkpoint_ms = o.t_checkpoint_ms;
    t_write_back_ms = o.t_write_back_ms;
    t_lookup_ms = o.t_lookup_ms;
    prefill_pos = o.prefill_pos;
    prefill_end = o.prefill_end;
    reused = o.reused;
    kind = o.kind;
    t_begin_unix_ms = o.t_begin_unix_ms;
    owner_ = o.owner_;
    o.owner_ = nullptr;
    return *this;
}

pending_turn::~pending_turn() {
    if (owner_) owner_->abort_turn(*this);
}


std::string context_engine::impl::salt_of(const turn_request & req) const {
    // The unit separator keeps ("ab", "") and ("a", "b") apart.
    return req.cache_salt.empty() ? opts.tenant_salt : opts.tenant_salt + '\x1f' + req.cache_salt;
}

result<assembled_prompt> context_engine::impl::assemble(const turn_request & req) const {
    if (req.workspace.empty()) return invalid_argument("workspace name is empty");
    const std::string salt = salt_of(req);
    if (req.raw) {
        if (req.segments.size() != 1) return invalid_argument("a raw prompt is exactly one segment");
        return warmctx::assemble_raw(req.segments[0], req.suffix, *run.tm, run.prof, salt, run.prof.chunk_tokens);
    }
    order_decision d;
    if (req.hints) {
        d.hints = *req.hints;
    } else if (opts.volatility.enabled) {
        std::unique_lock lock(volatility.mu);
        const volatility_state * st = volatility.state_of(req.workspace, lock);
        d = decide_order(st ? *st : volatility_state{}, req.segments, opts.kinds, opts.volatility);
    }
    auto prompt = warmctx::assemble(req.segments, opts.kinds, *run.tm, run.prof, salt, run.prof.chunk_tokens,
                                    req.add_generation_prompt, d.hints, req.continuation);
    if (prompt.ok()) {
        prompt->reordered = d.reordered;
        prompt->order_note = std::move(d.note);
        prompt->content_digests = std::move(d.digests);
    }
    return prompt;
}

void context_engine::impl::count(const std::string & ws, const explain_report & ex, size_t n_generated) {
    for (workspace_counters * c : {&ctr.total, &ctr.workspaces[ws]}) {
        c->n_turns++;
        c->n_prompt_tokens += (uint64_t)ex.n_prompt_tokens;
        c->n_reused_tokens += (uint64_t)ex.n_reused;
        c->n_prefilled_tokens += (uint64_t)ex.n_prefilled;
        c->n_generated_tokens += n_generated;
        c->misses_by_kind[std::string(miss_kind_name(ex.kind))]++;
    }
}

explain_report context_engine::impl::explain(const std::string & ws, const assembled_prompt & prompt, const match & m,
                                             pos_t reuse, kv_tier tier) const {
    const workspace_history * h = workspaces.find(ws);
    explain_report r = explain_turn({ws, prompt, m, reuse, h, run.prof, *tiers.cache, run.prefill_tokens_per_ms,
                                     h && h->has_turn ? std::nullopt : tiers.disk->newest_profile(ws)});
    r.tier = tier;
    const memory_info & mi = run.eng->context().memory;
    r.memory_kind = std::string(memory_kind_name(mi.kind));
    r.memory_note = mi.note;
    if (!mi.reuse && r.n_reused == 0) r.reason = mi.note;  // says it is served without reuse, and why
    return r;
}

context_engine::impl::impl(const context_engine_options & o, std::unique_ptr<engine> e)
    : opts(o), tiers(*e, run.prof), moves(*e, opts, streams, tiers, ctr.memory) {
    run.eng = std::move(e);
    run.checkpoint_gap_tokens = o.checkpoint_gap_tokens;
}

context_engine::context_engine(std::unique_ptr<impl> p) : p_(std::move(p)) {}
context_engine::~context_engine() {
    if (p_) p_->flush_deferred();  // a clean stop keeps the disk tier complete
}

result<std::unique_ptr<context_engine>> context_engine::open(const context_engine_options & opts) {
    if (opts.n_holders < 1 || opts.n_holders > 65536) return invalid_argument("n_holders must be in [1, 65536]");
    if (opts.n_work_seqs < 1 || opts.n_work_seqs > 64) return invalid_argument("n_work_seqs must be in [1, 64]");
    if (opts.max_workspaces < 1) return invalid_argument("max_workspaces must be at least 1");
    // The engine's KV streams: the work sequences and, for run_cold, the cold one; then
    // the resident streams (the device tier), which are work streams too. Cached
    // prefixes also live in the RAM pool.
    engine_options eo = opts.engine;
    eo.n_seq_max = opts.n_work_seqs + (opts.cold_stream ? 1 : 0);
    if (opts.cold_stream) eo.n_seq_resident = 0;
    auto e = engine::open(eo);
    if (!e.ok()) return e.error();
    context_engine_options resolved = opts;
    resolved.engine = eo;
    auto p = std::make_unique<impl>(resolved, std::move(e.value()));
    engine & eng = *p->run.eng;
    p->run.cold_seq = opts.cold_stream ? (seq_id)opts.n_work_seqs : -1;
    p->opts.n_work_seqs = opts.n_work_seqs + eng.context().n_seq_resident;
    using scm = context_engine_options::stream_copy_mode;
    p->streams.copies =
        opts.stream_copies == scm::on || (opts.stream_copies == scm::automatic && eng.context().n_gpu_layers > 0);
    if (eng.context().mode != kv_mode::exact) p->streams.copies = false;
    p->run.tm = make_engine_text_model(eng);
    for (token_id t = 0; t < eng.model().n_vocab; ++t)
        p->run.max_piece_bytes = std::max<uint64_t>(p->run.max_piece_bytes, eng.token_piece(t).size());
    p->tiers.pool = std::make_unique<kv_pool>(eng, k_first_pool_holder, opts.n_holders);
    p->streams.resize(p->opts.n_work_seqs);
    // A held prefix's bytes: its cells' K and V, and per cell the position and sequence
    // id llama.cpp's saved state carries. What it holds beyond (a window or a recurrent
    // state at its end and at each checkpoint, framing) the cache reads from the pool.
    const uint64_t bpt = eng.context().kv_bytes_per_token;
    p->opts.budget.bytes_per_token = bpt > 0 ? bpt + k_pool_bytes_per_cell_meta : 0;
    if (opts.workspace_max_bytes > 0 && p->opts.budget.bytes_per_token > 0) {
        // A workspace's cap is in tokens: its checkpoints (at block ends at least a chunk
        // and a checkpoint spacing apart) spread over the tokens between.
        uint64_t per_token = p->opts.budget.bytes_per_token;
        if (const memory_info & mi = eng.context().memory; mi.checkpoints && bpt > 0) {
            const uint32_t chunk = eng.context().chunk_tokens;
            const uint64_t apart = std::max<uint64_t>(chunk, checkpoint_spacing(mi.checkpoint_bytes, bpt, chunk));
            per_token += (mi.checkpoint_bytes + apart - 1) / apart;
        }
        const uint64_t t = opts.workspace_max_bytes / per_token;
        if (t == 0) return invalid_argument("the per-workspace byte budget holds less than one token of KV");
        auto & w = p->opts.budget.workspace_max_tokens;
        w = w == 0 ? t : std::min(w, t);
    }
    WARMCTX_RETURN_IF_ERROR(validate_budget(p->opts.budget));
    // Every held prefix is its own copy of its cells, whatever the KV mode.
    p->tiers.cache = std::make_unique<prefix_cache>(*p->tiers.pool, p->tiers.pool->holder_ids(), p->opts.budget,
                                                    opts.policy, kv_accounting::per_holder);
    // What a saved prefix of n tokens can hold: its cells (K, V and their position and
    // sequence), a checkpoint per block where the memory keeps them, twice over, and 1 MiB
    // of llama.cpp's own framing. A file's head that declares more is not read further.
    const memory_info & mem = eng.context().memory;
    auto max_kv = [bpt = eng.context().kv_bytes_per_token, ckpt = mem.checkpoints ? mem.checkpoint_bytes : 0](
                      const snapshot_meta & m) -> uint64_t {
        if (bpt == 0) return 0;
        return 2 * ((uint64_t)m.n_tokens() * (bpt + k_pool_bytes_per_cell_meta) + (uint64_t)m.blocks.size() * ckpt) +
               (uint64_t{1} << 20);
    };
    auto disk = disk_kv_tier::open(opts.tiers, opts.policy, (pos_t)eng.context().n_ctx_seq, {}, max_kv);
    if (!disk.ok()) return disk.error();
    p->tiers.disk = std::move(disk.value());
    if (!opts.tiers.cache_dir.empty() && opts.volatility.enabled) {
        file_system & fs = opts.tiers.disk_fs ? *opts.tiers.disk_fs : posix_fs();
        // A link, or a directory that cannot be made: memory only, as without a directory.
        auto vs = volatility_store::open(fs, opts.tiers.cache_dir + "/volatility");
        if (vs.ok()) p->volatility.store = std::move(vs.value());
        else
            std::fprintf(stderr, "warmctx: %s; the learned order is kept in memory only\n",
                         vs.error().message().c_str());
    }
    auto prof = engine_profile(eng, p->opts.engine);
    if (!prof.ok()) return prof.error();
    p->run.prof = std::move(prof.value());
    return std::unique_ptr<context_engine>(new context_engine(std::move(p)));
}

result<assembled_prompt> context_engine::assemble_request(const turn_request & req) const { return p_->assemble(req); }
status context_engine::check_fits(const assembled_prompt & prompt) const { return p_->run.fits(prompt); }
status context_engine::check_plausible(const turn_request & req) const { return p_->run.plausible(req); }
std::vector<segment> context_engine::leading_segments(const turn_request & req, size_t min_rest_bytes,
                                                      size_t max_lead_bytes) const {
    if (req.raw || req.segments.empty()) return {};
    return warmctx::leading_segments(req.segments, p_->opts.kinds, *p_->run.tm, min_rest_bytes, max_lead_bytes);
}

result<explain_report> context_engine::explain(const turn_request & req) const {
    // Assembled off the engine thread already when the caller could (as for a turn).
    auto prompt = req.assembled && req.assembled->root_hash == root_hash(p_->run.prof, p_->salt_of(req))
                  ? result<assembled_prompt>(*req.assembled)
                  : p_->assemble(req);
    if (!prompt.ok()) return prompt.error();
    match m = p_->streams.best_match(p_->tiers.cache->peek(prompt->blocks, req.workspace), prompt->blocks, -1);
    reuse_point at = snap_reuse(*prompt, m.n_blocks);
    kv_tier tier = at.n_tokens > 0 ? kv_tier::engine : kv_tier::none;
    // What a tier would restore (nothing is loaded, nothing counted).
    if (disk_kv_tier::hit h = p_->tiers.disk->peek(*prompt, at.n_tokens); h.tier != kv_tier::none) {
        tier = h.tier;
        at = h.at;
        m = h.as_match();
    }
    return p_->explain(req.workspace, *prompt, m, at.n_tokens, tier);
}

result<pending_turn> context_engine::begin_turn_deferred(const turn_request & req, seq_id seq) {
    if (seq < 0 || (uint32_t)seq >= p_->opts.n_work_seqs)
        return invalid_argument("work sequence " + std::to_string(seq) + " out of range");
    auto t0 = clock_type::now();
    pending_turn t;
    t.workspace = req.workspace;
    t.seq = seq;
    // A model whose memory warmctx cannot save and cut keeps nothing across turns.
    const bool reusable = p_->run.eng->context().memory.reuse;
    t.cache = req.cache && reusable;
    if (req.assembled && req.assembled->root_hash == root_hash(p_->run.prof, p_->salt_of(req))) {
        t.prompt = *req.assembled;  // assembled off the engine thread, under this profile
    } else {
        auto ap_r = p_->assemble(req);
        if (!ap_r.ok()) return ap_r.error();
        t.prompt = std::move(ap_r.value());
    }
    const assembled_prompt & prompt = t.prompt;
    t.t_assemble_ms = ms_between(t0, clock_type::now());
    WARMCTX_RETURN_IF_ERROR(p_->run.fits(prompt));
    if (p_->streams[(size_t)seq].busy)
        return failed_precondition("work sequence " + std::to_string(seq) + " already runs a turn");
    t.tick = ++p_->turn_clock;
    auto tw = clock_type::now();
    // Other idle streams holding blocks this prompt starts with: into the pool, so
    // that the lookup finds them (with stream copies the lookup sees the streams).
    if (!p_->streams.copies) p_->moves.write_back_sharing(prompt.blocks, seq);
    {
        // Blocks of this stream the turn would overwrite go to the pool first. Every
        // write-back comes before the lookup: an insert may evict what a lookup found.
        const match peeked = p_->streams.prefer_in_place(
            p_->streams.best_match(p_->tiers.cache->peek(prompt.blocks, req.workspace), prompt.blocks, seq), prompt,
            seq);
        const reuse_point pat = snap_reuse(prompt, peeked.n_blocks);
        const bool would_be_in_place = pat.n_tokens > 0 && peeked.holder == seq;
        // The stream's deferred disk write, unless the turn keeps all it saves.
        p_->moves.keep_deferred(seq, would_be_in_place ? pat.n_tokens : 0, req.workspace, prompt.blocks);
        // In place, trimming only the last turn's per-turn blocks (its diff, test
        // output...) loses nothing this workspace will ask for again: no write-back.
        // Trimming more keeps what is worth keeping (save_branch).
        if (!would_be_in_place)
            p_->moves.write_back_displaced(seq, req.workspace, prompt.blocks, p_->run.prefill_tokens_per_ms);
        else p_->moves.save_branch(seq, pat.n_blocks, p_->run.prefill_tokens_per_ms);
    }
    auto tl = clock_type::now();
    t.t_write_back_ms = ms_between(tw, tl);
    // In place: this stream still holds at least as much from the turn it ran last.
    match m = p_->streams.prefer_in_place(
        p_->streams.best_match(p_->tiers.cache->lookup(prompt.blocks, t.tick, req.workspace), prompt.blocks, seq),
        prompt, seq);
    reuse_point at = snap_reuse(prompt, m.n_blocks);
    bool in_place = at.n_tokens > 0 && m.holder == seq;
    p_->moves.keep_deferred(seq, in_place ? at.n_tokens : 0, req.workspace, prompt.blocks);
    if (!in_place) p_->moves.clear_stream(seq);
    p_->streams[(size_t)seq].busy = true;
    t.owner_ = this;  // from here on, an early return aborts the turn (clears `seq`)

    // A tier may hold a longer prefix than the engine (evicted, or before a restart).
    kv_tier tier = at.n_tokens > 0 ? kv_tier::engine : kv_tier::none;
    std::string restore_failed;
    if (!p_->tiers.disk->empty())
        p_->moves.restore_from_tiers(prompt, seq, m, at, in_place, tier, restore_failed, t.t_restore_ms);
    std::string refused;
    if (tier == kv_tier::engine) {
        auto tc = clock_type::now();
        p_->moves.take_prefix(seq, prompt, m, at, in_place, refused);
        t.t_copy_ms = ms_between(tc, clock_type::now());
        if (in_place) p_->ctr.memory.n_in_place_turns++;
        if (at.n_tokens == 0) tier = kv_tier::none;
    }
    p_->streams[(size_t)seq].resumed_at = at.n_tokens;
    t.explain = p_->explain(req.workspace, prompt, m, at.n_tokens, tier);
    if (!refused.empty()) t.explain.reason = at.n_tokens > 0 ? t.explain.reason + "; " + refused : refused;
    if (!restore_failed.empty())
        t.explain.reason += "; a longer prefix on disk could not be restored (" + restore_failed + ")";
    t.explain.in_place = in_place;
    t.t_lookup_ms = ms_between(tl, clock_type::now()) - t.t_restore_ms - t.t_copy_ms;
    if (!is_prewarm(req.kind) && at.n_tokens > 0) {
        // The first turn after a pre-warm of this workspace says it was served from it.
        auto h = p_->workspaces.by_name.find(req.workspace);
        if (h != p_->workspaces.by_name.end() && h->second.prewarm) {
            t.explain.prewarm = std::move(h->second.prewarm);
            h->second.prewarm.reset();
            p_->ctr.prewarm.n_served_turns++;
        }
    }
    p_->streams[(size_t)seq].blocks.clear();  // until finish_turn says what it keeps
    t.prefill_pos = at.n_tokens;
    t.reused = at.n_tokens;
    t.kind = req.kind;
    t.t_begin_unix_ms = unix_ms_now();
    t.prefill_end = (pos_t)prompt.tokens.size();
    if (is_prewarm(req.kind)) {
        const size_t n = n_cacheable_blocks(prompt);
        t.prefill_end = std::max(at.n_tokens, n > 0 ? prompt.blocks[n - 1].end : 0);
        t.cache = reusable;
    }
    return t;
}

result<pending_turn> context_engine::begin_turn(const turn_request & req, seq_id seq, std::vector<float> & logits) {
    auto t = begin_turn_deferred(req, seq);
    if (!t.ok()) return t;
    // The whole rest in one call (still one decode call per canonical chunk).
    WARMCTX_RETURN_IF_ERROR(prefill_some(*t, std::numeric_limits<pos_t>::max(), logits));  // aborts t on error
    return t;
}

status context_engine::prefill_some(pending_turn & t, pos_t max_tokens, std::vector<float> & logits) {
    if (t.owner_ != this) return failed_precondition("prefill_some: the turn is not pending on this engine");
    if (t.prefilled()) return {};
    const assembled_prompt & prompt = t.prompt;
    // Where the engine splits freely its calls are chunk_tokens from where the turn is
    // (engine::prefill): a step of the scheduler is one full call, not one block's chunk.
    const pos_t from[1] = {t.prefill_pos};
    const bool free = p_->run.eng->context().splits_freely;
    const auto chunks = plan_chunks(t.prefill_pos, (int32_t)(t.prefill_end - t.prefill_pos),
                                    free ? std::span<const pos_t>(from) : std::span<const pos_t>(prompt.boundaries),
                                    (int32_t)p_->run.prof.chunk_tokens);
    // Whole chunks: [t.prefill_pos, end).
    pos_t end = t.prefill_pos;
    for (const auto & [b, e] : chunks) {
        end = e;
        if (end - t.prefill_pos >= max_tokens) break;
    }
    WARMCTX_RETURN_IF_ERROR(
        p_->run.prefill(t.seq, prompt, t.prefill_pos, end, logits, t.t_prefill_ms, t.t_checkpoint_ms));
    t.prefill_pos = end;
    return {};
}

status context_engine::finish_turn(pending_turn & t, size_t n_generated) {
    if (t.owner_ != this) return failed_precondition("finish_turn: the turn is not pending on this engine");
    t.owner_ = nullptr;
    status result_st;
    work_stream & s = p_->streams[(size_t)t.seq];
    s.busy = false;
    // The cacheable blocks prefilled (all, unless a pre-warm stopped early: at a chunk end, a block end).
    size_t n_keep = t.cache ? n_cacheable_blocks(t.prompt) : 0;
    while (n_keep > 0 && t.prompt.blocks[n_keep - 1].end > t.prefill_pos) --n_keep;
    // The stream also keeps the blocks of the turn's own user message that follow them
    // (class none: never in the pool nor on disk), with the chat messages before it in
    // the same chunk run (from the last assistant message on). An agent's next turn
    // carries them in its history, where the template renders them the same - the same
    // tokens at the same positions, chunked the same - and reuses them in place. The
    // generation prompt and the answer go: the next turn renders the answer with its
    // header in one piece, so its KV would not be the cold run's.
    size_t n_stream = n_keep;
    if (t.cache && !is_prewarm(t.kind) && n_keep == n_cacheable_blocks(t.prompt)) {
        const auto & segs = t.prompt.prompt_manifest.segments;
        while (n_stream < t.prompt.blocks.size()) {
            const block & b = t.prompt.blocks[n_stream];
            const int k = b.segment_index;
            if (k < 0 || (size_t)k >= segs.size() ||
                (segs[(size_t)k].kind != segment_kind::user && segs[(size_t)k].kind != segment_kind::history) ||
                b.end > t.prefill_pos)
                break;
            ++n_stream;
        }
    }
    n_stream = p_->moves.cuttable(t.seq, t.prompt.blocks, n_stream);  // fewer where a checkpoint was left out
    n_keep = std::min(n_keep, n_stream);
    if (n_stream > 0) {
        // The stream keeps the cacheable blocks (the tail and the generated tokens go)
        // for the next turn to reuse in place; the pool gets a copy only when something
        // is about to overwrite them (lazy write-back), unless it holds them already.
        std::span<const block> path(t.prompt.blocks.data(), n_keep);
        std::span<const block> kept(t.prompt.blocks.data(), n_stream);
        p_->moves.keep_deferred(t.seq, kept.back().end, t.workspace);
        status st = p_->run.eng->trim_seq(t.seq, kept.back().end);
        if (st.ok()) {
            p_->tiers.disk->forget_recent_loads();
            // A pre-warm stopped early was stopped for a chat, which continues from it in
            // place (and writes through what it ends with) or takes its stream (and puts
            // its blocks in the pool): no disk write of a partial prefix on that chat's way.
            // The write itself waits until the engine is idle (write_through_idle) or
            // the stream is about to change below it.
            const size_t n_saved =
                p_->moves.cuttable(t.seq, t.prompt.blocks, p_->tiers.disk->n_saved_blocks(t.prompt, n_keep));
            if (n_saved > 0 && !(is_prewarm(t.kind) && !t.prefilled()))
                p_->tiers.defer({t.seq, t.workspace, t.prompt, n_keep, t.prompt.blocks[n_saved - 1].end});
            s.blocks.assign(kept.begin(), kept.end());
            s.n_durable = 0;
            for (size_t i = 0; i < path.size(); ++i) {
                const int k = path[i].segment_index;
                const bool per_turn = k >= 0 && (size_t)k < t.prompt.prompt_manifest.segments.size() &&
                                      is_per_turn(t.prompt.prompt_manifest.segments[(size_t)k].kind);
                if (!per_turn) s.n_durable = i + 1;
            }
            if (kept.size() > path.size()) {
                // The user message it keeps is, from the next turn on, history: of that
                // class in the stream (so a write-back may put it in the pool), and
                // durable when nothing per-turn comes before it (a chat's whole tail is
                // its one message; a diff segment's turn is not carried as history).
                const retention_class hist = p_->opts.kinds.policy(segment_kind::history).retention;
                for (size_t i = path.size(); i < kept.size(); ++i) s.blocks[i].retention = hist;
                if (s.n_durable == path.size() && hist != retention_class::none) s.n_durable = kept.size();
            }
            s.workspace = t.workspace;
            s.t_finished = t.tick;
            s.unsaved = p_->tiers.cache->peek(s.blocks, t.workspace).n_blocks < s.blocks.size();
            p_->streams.last_finished_seq = t.seq;
            p_->streams.last_finished_at = clock_type::now();
        } else {
            result_st = st.with_context("cache update");
            p_->moves.clear_stream(t.seq);
        }
    } else {
        p_->moves.clear_stream(t.seq);
    }
    p_->moves.bound_stream_checkpoints(t.seq);
    if (!is_prewarm(t.kind)) {
        if (p_->opts.volatility.enabled && !t.prompt.prompt_manifest.segments.empty())
            p_->volatility.observe(t.workspace, t.prompt);
        p_->count(t.workspace, t.explain, n_generated);
        p_->remember(t.workspace, t);
        return result_st;
    }
    prewarm_info pw;
    pw.complete = t.prefilled();
    pw.finished_unix_ms = unix_ms_now();
    pw.duration_ms = (double)(pw.finished_unix_ms - t.t_begin_unix_ms);
    pw.n_prefilled = t.prefill_pos - t.reused;
    pw.n_cached = result_st.ok() && n_keep > 0 ? t.prompt.blocks[n_keep - 1].end : 0;
    pw.n_target = t.prefill_end;
    pw.n_found = t.reused;
    pw.found_tier = t.explain.tier;
    pw.leading = t.kind == turn_kind::leading_prewarm;
    prewarm_counters & c = p_->ctr.prewarm;
    c.n_prewarms++;
    if (pw.n_prefilled == 0 && pw.complete) c.n_already_cached++;
    if (!pw.complete) c.n_preempted++;
    c.n_prefilled_tokens += (uint64_t)pw.n_prefilled;
    p_->remember(t.workspace, t);
    p_->workspaces.by_name[t.workspace].prewarm = pw;
    return result_st;
}

void context_engine::abort_turn(pending_turn & t) {
    p_->flush_deferred();
    if (t.owner_ != this) return;
    t.owner_ = nullptr;
    p_->streams[(size_t)t.seq].busy = false;
    p_->moves.clear_stream(t.seq);
}

uint32_t context_engine::n_work_seqs() const { return p_->opts.n_work_seqs; }

result<std::unique_ptr<generation_step>> context_engine::start_generation(const sampling_params & sp) const {
    return generation_step::make(*p_->run.eng, sp);
}

std::unique_ptr<draft_index> context_engine::drafts_for(const pending_turn & t, const sampling_params & sp) const {
    if (sp.draft_max <= 0 || !drops_a_draft(p_->run.eng->context().memory)) return nullptr;
    return p_->run.answers.index_for(t.workspace, t.prompt.tokens);
}

void context_engine::remember_answer(const pending_turn & t, std::span<const token_id> answer) {
    p_->run.answers.remember(t.workspace, t.prompt.tokens, answer);
}

status context_engine::drop_draft(seq_id seq, pos_t n_tokens) {
    if (seq < 0 || (uint32_t)seq >= p_->opts.n_work_seqs)
        return invalid_argument("drop_draft: sequence " + std::to_string(seq) + " is not a work sequence");
    return p_->run.eng->trim_seq(seq, n_tokens);
}

status context_engine::decode_step(std::span<const step_input> inputs, std::vector<std::vector<float>> & logits,
                                   std::vector<token_id> * first_max) {
    for (const step_input & in : inputs)
        if (in.seq < 0 || (uint32_t)in.seq >= p_->opts.n_work_seqs)
            return invalid_argument("decode_step: sequence " + std::to_string(in.seq) + " is not a work sequence");
    return p_->run.eng->decode_step(inputs, logits, first_max);
}

result<turn_result> context_engine::run_turn(const turn_request & req, seq_id seq) {
    auto t0 = clock_type::now();
    std::vector<float> logits;
    auto pt = begin_turn(req, seq, logits);
    if (!pt.ok()) return pt.error();
    pending_turn & t = *pt;
    turn_result out;
    out.explain = t.explain;
    out.t_assemble_ms = t.t_assemble_ms;
    out.t_copy_ms = t.t_copy_ms;
    out.t_restore_ms = t.t_restore_ms;
    out.t_prefill_ms = t.t_prefill_ms;
    out.t_checkpoint_ms = t.t_checkpoint_ms;
    WARMCTX_RETURN_IF_ERROR(
        p_->run.generate(t.seq, req, t.prompt.tokens, std::move(logits), out, t0));  // aborts t on error
    auto ti = clock_type::now();
    WARMCTX_RETURN_IF_ERROR(finish_turn(t, out.gen.tokens.size()));
    p_->flush_deferred();  // nobody waits for an answer here: the write-through now
    out.t_cache_update_ms = ms_between(ti, clock_type::now());
    out.prompt_manifest = t.prompt.prompt_manifest;
    out.stable_prefix_hash = t.prompt.stable_prefix_hash.hex();
    return out;
}

result<turn_result> context_engine::run_cold(const turn_request & req) {
    if (p_->run.cold_seq < 0)
        return failed_precondition("run_cold needs the cold stream (context_engine_options::cold_stream)");
    auto t0 = clock_type::now();
    auto prompt = p_->assemble(req);
    if (!prompt.ok()) return prompt.error();
    turn_result out;
    out.t_assemble_ms = ms_between(t0, clock_type::now());
    engine & e = *p_->run.eng;
    e.clear_seq(p_->run.cold_seq);
    std::vector<float> logits;
    status st = p_->run.prefill(p_->run.cold_seq, *prompt, 0, (pos_t)prompt->tokens.size(), logits, out.t_prefill_ms,
                                out.t_checkpoint_ms);
    if (st.ok()) st = p_->run.generate(p_->run.cold_seq, req, {}, std::move(logits), out, t0);
    e.clear_seq(p_->run.cold_seq);
    if (!st.ok()) return st;
    out.prompt_manifest = prompt->prompt_manifest;
    out.stable_prefix_hash = prompt->stable_prefix_hash.hex();
    out.explain.workspace = req.workspace;
    out.explain.n_prompt_tokens = (pos_t)prompt->tokens.size();
    out.explain.n_prefilled = (pos_t)prompt->tokens.size();
    out.explain.reason = "cold reference run (cache not consulted)";
    return out;
}
snapshot_store * context_engine::disk_tier() {
    p_->flush_deferred();
    return p_->tiers.disk->disk();
}
void context_engine::flush_deferred_writes() { p_->flush_deferred(); }

status context_engine::set_chunk_tokens(uint32_t n) {
    p_->flush_deferred();
    if (n < 1 || n > p_->run.eng->context().chunk_tokens)
        return invalid_argument("chunk_tokens must be in [1, " + std::to_string(p_->run.eng->context().chunk_tokens) +
                                "]");
    p_->run.prof.chunk_tokens = n;
    set_block_grid(p_->run.prof, *p_->run.eng);
    return {};
}

const profile & context_engine::current_profile() const { return p_->run.prof; }
const model_info & context_engine::model() const { return p_->run.eng->model(); }
const chat_templates * context_engine::chat_template() const { return engine_chat_templates(*p_->run.tm); }
const context_info & context_engine::context() const { return p_->run.eng->context(); }
result<std::vector<token_id>> context_engine::tokenize(std::string_view text, bool parse_special) const {
    return p_->run.eng->tokenize(text, parse_special);
}
result<std::string> context_engine::detokenize(std::span<const token_id> tokens, bool special) const {
    if (!special) return p_->run.eng->detokenize(tokens);
    std::string out;
    for (token_id t : tokens) {
        if (t < 0 || t >= p_->run.eng->model().n_vocab)
            return invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary");
        out += p_->run.eng->token_piece(t, true);
    }
    return out;
}
const prefix_cache & context_engine::cache() const { return *p_->tiers.cache; }
}  // namespace warmctx
