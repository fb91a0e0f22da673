// The request flow over the engine, the assembler, the prefix cache and the tiers:
// assemble -> lookup (engine, then tiers) -> reuse (copy or restore) -> prefill the
// tail in canonical chunks -> generate -> cache update and write-through.
#include "warmctx/clock.h"
#include "warmctx/context_engine.h"

#include <chrono>
#include <limits>
#include <map>

#include "admission.h"
#include "explain.h"
#include "kv_pool.h"
#include "tiers.h"
#include "warmctx/chunking.h"
#include "warmctx/engine_adapters.h"

namespace warmctx {

namespace {

using clock_type = std::chrono::steady_clock;
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
    ap = std::move(o.ap);
    explain = std::move(o.explain);
    now = o.now;
    cache = o.cache;
    t_assemble_ms = o.t_assemble_ms;
    t_copy_ms = o.t_copy_ms;
    t_restore_ms = o.t_restore_ms;
    t_prefill_ms = o.t_prefill_ms;
    t_write_back_ms = o.t_write_back_ms;
    t_lookup_ms = o.t_lookup_ms;
    prefill_pos = o.prefill_pos;
    prefill_end = o.prefill_end;
    reused = o.reused;
    prewarm = o.prewarm;
    ahead = o.ahead;
    t_begin_unix_ms = o.t_begin_unix_ms;
    owner_ = o.owner_;
    o.owner_ = nullptr;
    return *this;
}

pending_turn::~pending_turn() {
    if (owner_) owner_->abort_turn(*this);
}

// What a work stream holds between turns: the cached blocks of the last prompt it ran
// (trimmed to them), so that the next turn that shares them reuses them in place.
// Write-back is lazy: they are offered to the pool (a copy) only when something is
// about to overwrite them - another prompt's turn in this stream, or a lookup that
// needs them from another stream - never after every turn.
struct stream_state {
    std::vector<block> blocks;  // [0, blocks.back().end) is in the stream
    std::string workspace;      // whose turn left it
    uint64_t t_finished = 0;
    bool busy = false;          // a pending turn runs in it
    bool unsaved = false;       // the blocks have not been offered to the pool yet
    // The leading blocks up to the last one a later turn of the same workspace would
    // still want; those after it are per-turn content (a diff, test output, a log or
    // a snippet), which that turn's own replaces.
    size_t n_durable = 0;
};

// Content a workspace sends fresh every turn: its next turn's supersedes it.
bool is_per_turn(segment_kind k) {
    return k == segment_kind::diff || k == segment_kind::test_output || k == segment_kind::terminal_log ||
           k == segment_kind::snippet || k == segment_kind::user;
}

// Holder ids of the RAM pool: far above any engine sequence.
constexpr seq_id k_first_pool_holder = seq_id{1} << 20;

struct context_engine::impl {
    context_engine_options opts;
    seq_id cold_seq = -1;      // after the work sequences, when options.cold_stream
    std::unique_ptr<engine> eng;
    std::unique_ptr<text_model> tm;
    std::unique_ptr<kv_pool> pool;
    std::vector<stream_state> streams;  // one per work sequence
    bool stream_copies = false;         // options.stream_copies, resolved
    // A finished turn's disk write-through, run after its answer is out
    // (flush_deferred_writes) or before anything touches a stream or the tiers.
    struct deferred_write {
        seq_id seq = -1;
        std::string workspace;
        assembled_prompt ap;
        size_t n_blocks = 0;
    };
    std::optional<deferred_write> deferred;
    void flush_deferred() {
        if (!deferred) return;
        deferred_write d = std::move(*deferred);
        deferred.reset();
        tiers->write_through(*eng, prof, d.seq, d.workspace, d.ap, d.n_blocks);
    }
    std::unique_ptr<prefix_cache> cache;
    std::unique_ptr<tier_set> tiers;
    profile prof;
    uint64_t now = 0;
    double prefill_tokens_per_ms = 0;  // exponential average of measured prefills
    uint64_t max_piece_bytes = 0;      // the longest text any one token stands for
    std::map<std::string, workspace_history> workspaces;
    size_t n_remembered_tokens = 0;  // sum of workspaces' last_tokens
    context_counters ctr;

    // Remembers `ws`'s last turn, then forgets least recently used workspaces (their
    // history and counters) past the bounds. The workspace just remembered stays.
    void remember(const std::string & ws, const pending_turn & t) {
        auto & h = workspaces[ws];
        n_remembered_tokens -= h.last_tokens.size();
        h.last_manifest = t.ap.man;
        h.last_profile = prof;
        h.last_tokens = t.ap.tokens;
        h.last_blocks = t.ap.blocks;
        h.last_stable_end = t.ap.stable_end;
        h.has_turn = true;
        h.t_last_used = t.now;
        n_remembered_tokens += h.last_tokens.size();
        while (workspaces.size() > 1 &&
               (workspaces.size() > opts.max_workspaces || n_remembered_tokens > opts.max_remembered_tokens)) {
            auto oldest = workspaces.end();
            for (auto it = workspaces.begin(); it != workspaces.end(); ++it)
                if (it->first != ws && (oldest == workspaces.end() || it->second.t_last_used < oldest->second.t_last_used))
                    oldest = it;
            if (oldest == workspaces.end()) break;
            forget(oldest->first);
        }
    }

    void forget(const std::string & ws) {
        if (auto it = workspaces.find(ws); it != workspaces.end()) {
            n_remembered_tokens -= it->second.last_tokens.size();
            workspaces.erase(it);
        }
        ctr.workspaces.erase(ws);
    }

    result<assembled_prompt> assemble(const turn_request & req) const {
        if (req.workspace.empty()) return invalid_argument("workspace name is empty");
        if (req.raw) {
            if (req.segments.size() != 1) return invalid_argument("a raw prompt is exactly one segment");
            return warmctx::assemble_raw(req.segments[0], req.suffix, *tm, prof, opts.tenant_salt, prof.chunk_tokens);
        }
        return warmctx::assemble(req.segments, opts.kinds, *tm, prof, opts.tenant_salt, prof.chunk_tokens,
                                 req.add_generation_prompt);
    }

    // No token covers more than max_piece_bytes of text: a request whose content plainly
    // needs more tokens than a sequence holds is refused before it is tokenized
    // (tokenizing megabytes takes seconds).
    status plausible(const turn_request & req) const {
        uint64_t bytes = 0;
        for (const segment & sg : req.segments) bytes += sg.content.size() + sg.path.size();
        const uint64_t n_ctx = eng->context().n_ctx_seq;
        if (max_piece_bytes > 0 && bytes / max_piece_bytes > n_ctx)
            return out_of_range("the request's segments hold " + std::to_string(bytes) + " bytes of text, at least " +
                                std::to_string(bytes / max_piece_bytes) + " tokens (no token of this model covers more than " +
                                std::to_string(max_piece_bytes) + " bytes), but the context holds " + std::to_string(n_ctx) +
                                " per sequence (start the server with a larger -c/--n-ctx)");
        return {};
    }

    status fits(const assembled_prompt & ap) const {
        if (ap.tokens.size() <= eng->context().n_ctx_seq) return {};
        return out_of_range("prompt needs " + std::to_string(ap.tokens.size()) + " tokens but the context holds " +
                            std::to_string(eng->context().n_ctx_seq) +
                            " per sequence (start the server with a larger -c/--n-ctx)");
    }

    const workspace_history * history(const std::string & ws) const {
        auto it = workspaces.find(ws);
        return it == workspaces.end() ? nullptr : &it->second;
    }

    explain_report explain(const std::string & ws, const assembled_prompt & ap, const match & m, pos_t reuse,
                           kv_tier tier) const {
        const workspace_history * h = history(ws);
        explain_report r = explain_turn({ws, ap, m, reuse, h, prof, *cache, prefill_tokens_per_ms,
                                         h && h->has_turn ? std::nullopt : tiers->newest_profile(ws)});
        r.tier = tier;
        return r;
    }

    void count(const std::string & ws, const explain_report & ex, size_t n_generated) {
        for (workspace_counters * c : {&ctr.total, &ctr.workspaces[ws]}) {
            c->n_turns++;
            c->n_prompt_tokens += (uint64_t)ex.n_prompt_tokens;
            c->n_reused_tokens += (uint64_t)ex.n_reused;
            c->n_prefilled_tokens += (uint64_t)ex.n_prefilled;
            c->n_generated_tokens += n_generated;
            c->misses_by_kind[std::string(miss_kind_name(ex.kind))]++;
        }
    }

    void note_prefill_rate(pos_t n, double ms) {
        // Short tails are dominated by fixed costs (the lazy KV copy, attention over the
        // reused prefix) and would make the rate useless for predicting a real miss.
        if (n < 128 || ms <= 0) return;
        const double r = n / ms;
        prefill_tokens_per_ms = prefill_tokens_per_ms <= 0 ? r : 0.7 * prefill_tokens_per_ms + 0.3 * r;
    }

    // The one prefill path: `seq` holds exactly [0, from) of `ap`; computes [from, end)
    // in canonical chunks (REQUIRES both chunk boundaries of `ap`). When `end` is the
    // prompt's end, `logits` receives the logits after it. Adds the time to `ms`.
    status prefill(seq_id seq, const assembled_prompt & ap, pos_t from, pos_t end, std::vector<float> & logits,
                   double & ms) {
        auto tp = clock_type::now();
        std::span<const token_id> part(ap.tokens.data() + from, (size_t)(end - from));
        const bool last = (size_t)end == ap.tokens.size();
        WARMCTX_RETURN_IF_ERROR(
            eng->prefill(seq, part, from, ap.boundaries, last ? &logits : nullptr, (int32_t)prof.chunk_tokens));
        const double took = ms_between(tp, clock_type::now());
        ms += took;
        note_prefill_rate((pos_t)part.size(), took);
        return {};
    }

    // Generates after a prefill (run_turn, run_cold): fills out.gen and the timings.
    status generate(seq_id seq, const turn_request & req, std::vector<float> logits, turn_result & out,
                    clock_type::time_point t0) {
        out.t_first_token_ms = ms_between(t0, clock_type::now());
        if (req.keep_logits) out.prompt_logits = logits;
        auto g = eng->generate(seq, std::move(logits), req.sampling, req.keep_logits ? &out.gen_logits : nullptr);
        if (!g.ok()) return g.error();
        out.gen = std::move(g.value());
        out.t_decode_ms = out.gen.t_decode_ms;
        out.t_total_ms = ms_between(t0, clock_type::now());
        return {};
    }

    // Loads a pool holder's prefix into `seq` (cleared first) and trims it at `reuse`;
    // a holder that is another stream is copied whole, the data at once, so that what
    // happens to either stream before the next decode (a load, a save) sees it done.
    status copy_from_holder(seq_id holder, seq_id seq, pos_t reuse) {
        status st = is_stream(holder) ? eng->copy_seq_now(holder, seq) : pool->copy_seq(holder, seq);
        if (st.ok()) st = eng->trim_seq(seq, reuse);
        if (!st.ok()) eng->clear_seq(seq);
        return st;
    }

    // How many leading blocks of `blocks` work stream `seq` still holds (equal chain
    // hashes name equal whole prefixes).
    size_t stream_match(seq_id seq, std::span<const block> blocks) const {
        const stream_state & s = streams[(size_t)seq];
        size_t n = 0;
        while (n < s.blocks.size() && n < blocks.size() && s.blocks[n].chain == blocks[n].chain) ++n;
        return n;
    }

    // Offers an idle stream's unsaved blocks (its first n_blocks, or all) to the pool (a
    // copy; the stream keeps them). Under the budget the pool may keep less, or nothing:
    // never an error.
    void write_back(seq_id seq, size_t n_blocks = SIZE_MAX) {
        stream_state & s = streams[(size_t)seq];
        n_blocks = std::min(n_blocks, s.blocks.size());
        if (s.busy || !s.unsaved || n_blocks == 0) return;
        s.unsaved = false;
        auto t = clock_type::now();
        status st = cache->insert(s.workspace, std::span<const block>(s.blocks.data(), n_blocks), seq, s.t_finished);
        if (st.ok() || st.code() == status_code::resource_exhausted) ctr.memory.n_write_backs++;
        ctr.memory.write_back_ms += ms_between(t, clock_type::now());
    }
    // An idle stream other than `except` that holds at least the first n of `blocks`.
    seq_id stream_holding(std::span<const block> blocks, seq_id except) const {
        for (size_t o = 0; o < streams.size(); ++o)
            if ((seq_id)o != except && !streams[o].busy && stream_match((seq_id)o, blocks) >= blocks.size())
                return (seq_id)o;
        return -1;
    }
    // An idle stream that holds nothing, other than `except`.
    seq_id free_stream(seq_id except) const {
        for (size_t o = 0; o < streams.size(); ++o)
            if ((seq_id)o != except && !streams[o].busy && streams[o].blocks.empty()) return (seq_id)o;
        return -1;
    }
    // A turn in place trims `seq` to its first n_keep blocks. The blocks it destroys
    // that a later turn may want are kept - parked whole in a free stream when stream
    // copies are on and one is free (no byte leaves the device), else offered to the
    // pool - unless they are only content of low retention (history that slid out of
    // an agent's window or was compacted away, a terminal log): a branch no agent
    // revisits is not worth a copy of the whole stream on the turn's way.
    void save_branch(seq_id seq, size_t n_keep) {
        stream_state & s = streams[(size_t)seq];
        const size_t n = std::min(s.blocks.size(), s.n_durable);
        if (!s.unsaved || n_keep >= n) return;
        retention_class top = retention_class::none;
        for (size_t i = n_keep; i < n; ++i) top = std::max(top, s.blocks[i].cls);
        if (top <= retention_class::low) {
            ctr.memory.n_branches_dropped++;
            return;
        }
        if (stream_copies) {
            if (const seq_id f = free_stream(seq); f >= 0 && eng->copy_seq_now(seq, f).ok()) {
                stream_state & d = streams[(size_t)f];
                d.blocks = s.blocks;
                d.workspace = s.workspace;
                d.t_finished = s.t_finished;
                d.n_durable = s.n_durable;
                d.unsaved = true;
                ctr.memory.n_branches_parked++;
                ctr.memory.n_stream_copies++;
                return;
            }
        }
        write_back(seq);
    }
    // Before another prompt overwrites an idle stream: its durable blocks go to the pool,
    // unless the pool holds them already; its per-turn blocks (the last turn's diff, test
    // output...) do not - that workspace's next turn brings its own.
    void write_back_displaced(seq_id seq) {
        stream_state & s = streams[(size_t)seq];
        const size_t n = std::min(s.n_durable, s.blocks.size());
        if (!s.unsaved || n == 0) return;
        const std::span<const block> durable(s.blocks.data(), n);
        if (cache->peek(durable, s.workspace).n_blocks >= n) {
            s.unsaved = false;
            return;
        }
        // Another stream of the device tier still holds them: nothing would be lost.
        if (stream_copies && stream_holding(durable, seq) >= 0) return;
        write_back(seq, n);
    }
    // Writes back every idle stream whose blocks `blocks` starts with: a lookup in
    // the pool then sees them wherever they ran.
    void write_back_sharing(std::span<const block> blocks, seq_id except) {
        for (size_t s = 0; s < streams.size(); ++s)
            if ((seq_id)s != except && stream_match((seq_id)s, blocks) > 0) write_back((seq_id)s);
    }

    // The pool's match `m`, or a stream's when it holds at least as many leading blocks
    // of `ap`: then the match's holder is that work stream. `seq` >= 0: only that
    // stream (in place); -1: any idle stream (explain: another stream's blocks would be
    // written back to the pool and found there).
    // With stream copies, any idle stream may serve a turn too (copied whole), and a
    // stream wins a tie with the pool (a device copy is cheaper than a load); `seq`
    // itself wins every tie (in place, nothing copied).
    match best_match(match m, std::span<const block> blocks, seq_id seq) const {
        const bool others = seq < 0 || stream_copies;
        const bool stream_wins_tie = seq >= 0 || stream_copies;
        bool have_stream = false;
        auto consider = [&](size_t s) {
            if (streams[s].busy) return;
            const size_t n = stream_match((seq_id)s, blocks);
            if (n == 0 || n < m.n_blocks || (n == m.n_blocks && (have_stream || !stream_wins_tie))) return;
            m.n_blocks = n;
            m.n_tokens = blocks[n - 1].end;
            m.holder = (seq_id)s;
            m.workspace = streams[s].workspace;
            have_stream = true;
        };
        if (seq >= 0) consider((size_t)seq);
        if (others)
            for (size_t s = 0; s < streams.size(); ++s)
                if ((seq_id)s != seq) consider(s);
        return m;
    }
    bool is_stream(seq_id s) const { return s >= 0 && (size_t)s < streams.size(); }

    void clear_stream(seq_id seq) {
        eng->clear_seq(seq);
        stream_state & s = streams[(size_t)seq];
        s.blocks.clear();
        s.workspace.clear();
        s.unsaved = false;
    }

    // The leading blocks of `ap` the cache may keep: up to the first of class none.
    static size_t n_cacheable_blocks(const assembled_prompt & ap) {
        size_t n = 0;
        while (n < ap.blocks.size() && ap.blocks[n].cls != retention_class::none) ++n;
        return n;
    }
};

context_engine::context_engine(std::unique_ptr<impl> p) : p_(std::move(p)) {}
context_engine::~context_engine() {
    if (p_) p_->flush_deferred();  // a clean stop keeps the disk tier complete
}

result<std::unique_ptr<context_engine>> context_engine::open(const context_engine_options & opts) {
    if (opts.n_holders < 1 || opts.n_holders > 65536) return invalid_argument("n_holders must be in [1, 65536]");
    if (opts.n_work_seqs < 1 || opts.n_work_seqs > 64) return invalid_argument("n_work_seqs must be in [1, 64]");
    if (opts.max_workspaces < 1) return invalid_argument("max_workspaces must be at least 1");
    auto p = std::make_unique<impl>();
    p->opts = opts;
    p->cold_seq = opts.cold_stream ? (seq_id)opts.n_work_seqs : -1;
    // The engine's KV streams: the work sequences and, for run_cold, the cold one; then
    // the resident streams (the device tier), which are work streams too. Cached
    // prefixes also live in the RAM pool.
    p->opts.engine.n_seq_max = opts.n_work_seqs + (opts.cold_stream ? 1 : 0);
    if (opts.cold_stream) p->opts.engine.n_seq_resident = 0;
    auto e = engine::open(p->opts.engine);
    if (!e.ok()) return e.error();
    p->eng = std::move(e.value());
    p->opts.n_work_seqs = opts.n_work_seqs + p->eng->context().n_seq_resident;
    using scm = context_engine_options::stream_copy_mode;
    p->stream_copies = opts.stream_copies == scm::on ||
                       (opts.stream_copies == scm::automatic && p->eng->context().n_gpu_layers > 0);
    if (p->eng->context().mode != kv_mode::exact) p->stream_copies = false;
    p->tm = make_engine_text_model(*p->eng);
    for (token_id t = 0; t < p->eng->model().n_vocab; ++t)
        p->max_piece_bytes = std::max<uint64_t>(p->max_piece_bytes, p->eng->token_piece(t).size());
    p->pool = std::make_unique<kv_pool>(*p->eng, k_first_pool_holder, opts.n_holders);
    p->streams.resize(p->opts.n_work_seqs);
    // A held prefix's bytes: its cells' K and V, and per cell the position and
    // sequence id llama.cpp's saved state carries.
    const uint64_t bpt = p->eng->context().kv_bytes_per_token;
    p->opts.budget.bytes_per_token = bpt > 0 ? bpt + k_pool_bytes_per_cell_meta : 0;
    if (opts.workspace_max_bytes > 0 && p->opts.budget.bytes_per_token > 0) {
        const uint64_t t = opts.workspace_max_bytes / p->opts.budget.bytes_per_token;
        if (t == 0) return invalid_argument("the per-workspace byte budget holds less than one token of KV");
        auto & w = p->opts.budget.workspace_max_tokens;
        w = w == 0 ? t : std::min(w, t);
    }
    WARMCTX_RETURN_IF_ERROR(validate_budget(p->opts.budget));
    // Every held prefix is its own copy of its cells, whatever the KV mode.
    p->cache = std::make_unique<prefix_cache>(*p->pool, p->pool->holder_ids(), p->opts.budget, opts.policy,
                                              kv_accounting::per_holder);
    auto tiers = tier_set::open(opts.tiers, opts.policy, (pos_t)p->eng->context().n_ctx_seq);
    if (!tiers.ok()) return tiers.error();
    p->tiers = std::move(tiers.value());
    auto prof = engine_profile(*p->eng, p->opts.engine);
    if (!prof.ok()) return prof.error();
    p->prof = std::move(prof.value());
    return std::unique_ptr<context_engine>(new context_engine(std::move(p)));
}

result<assembled_prompt> context_engine::assemble_request(const turn_request & req) const { return p_->assemble(req); }
status context_engine::check_fits(const assembled_prompt & ap) const { return p_->fits(ap); }
status context_engine::check_plausible(const turn_request & req) const { return p_->plausible(req); }
std::vector<segment> context_engine::leading_segments(const turn_request & req, size_t min_rest_bytes,
                                                      size_t max_lead_bytes) const {
    if (req.raw || req.segments.empty()) return {};
    return warmctx::leading_segments(req.segments, p_->opts.kinds, *p_->tm, min_rest_bytes, max_lead_bytes);
}

result<explain_report> context_engine::explain(const turn_request & req) const {
    // Assembled off the engine thread already when the caller could (as for a turn).
    auto ap = req.assembled && req.assembled->root_hash == root_hash(p_->prof, p_->opts.tenant_salt)
                  ? result<assembled_prompt>(*req.assembled)
                  : p_->assemble(req);
    if (!ap.ok()) return ap.error();
    match m = p_->best_match(p_->cache->peek(ap->blocks, req.workspace), ap->blocks, -1);
    reuse_point at = snap_reuse(*ap, m.n_blocks);
    kv_tier tier = at.n_tokens > 0 ? kv_tier::engine : kv_tier::none;
    // What a tier would restore (nothing is loaded, nothing counted).
    if (tier_set::hit h = p_->tiers->peek(*ap, at.n_tokens); h.tier != kv_tier::none) {
        tier = h.tier;
        at = h.at;
        m = h.as_match();
    }
    return p_->explain(req.workspace, *ap, m, at.n_tokens, tier);
}

result<pending_turn> context_engine::begin_turn_deferred(const turn_request & req, seq_id seq) {
    if (seq < 0 || (uint32_t)seq >= p_->opts.n_work_seqs)
        return invalid_argument("work sequence " + std::to_string(seq) + " out of range");
    auto t0 = clock_type::now();
    pending_turn t;
    t.workspace = req.workspace;
    t.seq = seq;
    t.cache = req.cache;
    if (req.assembled && req.assembled->root_hash == root_hash(p_->prof, p_->opts.tenant_salt)) {
        t.ap = *req.assembled;  // assembled off the engine thread, under this profile
    } else {
        auto ap_r = p_->assemble(req);
        if (!ap_r.ok()) return ap_r.error();
        t.ap = std::move(ap_r.value());
    }
    const assembled_prompt & ap = t.ap;
    t.t_assemble_ms = ms_between(t0, clock_type::now());
    WARMCTX_RETURN_IF_ERROR(p_->fits(ap));
    if (p_->streams[(size_t)seq].busy)
        return failed_precondition("work sequence " + std::to_string(seq) + " already runs a turn");
    p_->flush_deferred();  // the last turn's write-through, if its caller has not run it
    t.now = ++p_->now;
    auto tw = clock_type::now();
    // Other idle streams holding blocks this prompt starts with: into the pool, so
    // that the lookup finds them (with stream copies the lookup sees the streams).
    if (!p_->stream_copies) p_->write_back_sharing(ap.blocks, seq);
    {
        // Blocks of this stream the turn would overwrite go to the pool first. Every
        // write-back comes before the lookup: an insert may evict what a lookup found.
        const match peeked = p_->best_match(p_->cache->peek(ap.blocks, req.workspace), ap.blocks, seq);
        const reuse_point pat = snap_reuse(ap, peeked.n_blocks);
        const bool would_be_in_place = pat.n_tokens > 0 && peeked.holder == seq;
        // In place, trimming only the last turn's per-turn blocks (its diff, test
        // output...) loses nothing this workspace will ask for again: no write-back.
        // Trimming more keeps what is worth keeping (save_branch).
        if (!would_be_in_place) p_->write_back_displaced(seq);
        else p_->save_branch(seq, pat.n_blocks);
    }
    auto tl = clock_type::now();
    t.t_write_back_ms = ms_between(tw, tl);
    // In place: this stream still holds at least as much from the turn it ran last.
    match m = p_->best_match(p_->cache->lookup(ap.blocks, t.now, req.workspace), ap.blocks, seq);
    reuse_point at = snap_reuse(ap, m.n_blocks);
    bool in_place = at.n_tokens > 0 && m.holder == seq;
    if (!in_place) p_->clear_stream(seq);
    p_->streams[(size_t)seq].busy = true;
    t.owner_ = this;  // from here on, an early return aborts the turn (clears `seq`)

    // A tier may hold a longer prefix than the engine (evicted, or before a restart).
    kv_tier tier = at.n_tokens > 0 ? kv_tier::engine : kv_tier::none;
    if (!p_->tiers->empty()) {
        auto tr = clock_type::now();
        if (tier_set::hit h = p_->tiers->restore(*p_->eng, p_->prof, ap, at.n_tokens, seq); h.tier != kv_tier::none) {
            tier = h.tier;
            at = h.at;
            m = h.as_match();
            in_place = false;  // the restore replaced the stream's content
            t.t_restore_ms = ms_between(tr, clock_type::now());
        }
    }
    t.explain = p_->explain(req.workspace, ap, m, at.n_tokens, tier);
    t.explain.in_place = in_place;
    t.t_lookup_ms = ms_between(tl, clock_type::now()) - t.t_restore_ms;
    if (!req.prewarm && at.n_tokens > 0) {
        // The first turn after a pre-warm of this workspace says it was served from it.
        auto h = p_->workspaces.find(req.workspace);
        if (h != p_->workspaces.end() && h->second.prewarm) {
            t.explain.prewarm = std::move(h->second.prewarm);
            h->second.prewarm.reset();
            p_->ctr.prewarm.n_served_turns++;
        }
    }
    if (in_place) p_->ctr.memory.n_in_place_turns++;
    if (tier == kv_tier::engine) {
        auto tc = clock_type::now();
        if (in_place) {
            status st = p_->eng->trim_seq(seq, at.n_tokens);
            if (!st.ok()) return st;  // aborts the turn
        } else {
            WARMCTX_RETURN_IF_ERROR(p_->copy_from_holder(m.holder, seq, at.n_tokens));
            if (p_->is_stream(m.holder)) p_->ctr.memory.n_stream_copies++;
        }
        t.t_copy_ms = ms_between(tc, clock_type::now());
    }
    p_->streams[(size_t)seq].blocks.clear();  // until finish_turn says what it keeps
    t.prefill_pos = at.n_tokens;
    t.reused = at.n_tokens;
    t.prewarm = req.prewarm;
    t.ahead = req.ahead;
    t.t_begin_unix_ms = unix_ms_now();
    t.prefill_end = (pos_t)ap.tokens.size();
    if (req.prewarm) {
        const size_t n = impl::n_cacheable_blocks(ap);
        t.prefill_end = std::max(at.n_tokens, n > 0 ? ap.blocks[n - 1].end : 0);
        t.cache = true;
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
    const assembled_prompt & ap = t.ap;
    const auto chunks = plan_chunks(t.prefill_pos, (int32_t)(t.prefill_end - t.prefill_pos), ap.boundaries,
                                    (int32_t)p_->prof.chunk_tokens);
    // Whole chunks: [t.prefill_pos, end).
    pos_t end = t.prefill_pos;
    for (const auto & [b, e] : chunks) {
        end = e;
        if (end - t.prefill_pos >= max_tokens) break;
    }
    WARMCTX_RETURN_IF_ERROR(p_->prefill(t.seq, ap, t.prefill_pos, end, logits, t.t_prefill_ms));
    t.prefill_pos = end;
    return {};
}

status context_engine::finish_turn(pending_turn & t, size_t n_generated) {
    if (t.owner_ != this) return failed_precondition("finish_turn: the turn is not pending on this engine");
    p_->flush_deferred();
    t.owner_ = nullptr;
    status result_st;
    stream_state & s = p_->streams[(size_t)t.seq];
    s.busy = false;
    // The cacheable blocks, of those prefilled (all of them, unless a pre-warm stopped
    // early: it stops at a chunk end, and every block end is one).
    size_t n_keep = t.cache ? impl::n_cacheable_blocks(t.ap) : 0;
    while (n_keep > 0 && t.ap.blocks[n_keep - 1].end > t.prefill_pos) --n_keep;
    // The stream also keeps the blocks of the turn's own user message that follow them
    // (class none: never in the pool nor on disk). An agent's next turn carries this
    // message in its history, where the template renders it the same - the same piece,
    // the same tokens at the same positions - and reuses it in place. The generation
    // prompt and the answer go: the next turn renders the answer with its header in one
    // piece, so its KV would not be the cold run's.
    size_t n_stream = n_keep;
    if (t.cache && !t.prewarm && n_keep == impl::n_cacheable_blocks(t.ap)) {
        const auto & segs = t.ap.man.segments;
        while (n_stream < t.ap.blocks.size()) {
            const block & b = t.ap.blocks[n_stream];
            const int k = b.segment_index;
            if (k < 0 || (size_t)k >= segs.size() || segs[(size_t)k].kind != segment_kind::user ||
                b.end > t.prefill_pos)
                break;
            ++n_stream;
        }
    }
    if (n_stream > 0) {
        // The stream keeps the cacheable blocks (the tail and the generated tokens go)
        // for the next turn to reuse in place; the pool gets a copy only when something
        // is about to overwrite them (lazy write-back), unless it holds them already.
        std::span<const block> path(t.ap.blocks.data(), n_keep);
        std::span<const block> kept(t.ap.blocks.data(), n_stream);
        status st = p_->eng->trim_seq(t.seq, kept.back().end);
        if (st.ok()) {
            p_->tiers->forget_recent_loads();
            // A pre-warm stopped early was stopped for a chat, which continues from it in
            // place (and writes through what it ends with) or takes its stream (and puts
            // its blocks in the pool): no disk write of a partial prefix on that chat's way.
            // The write itself waits until the answer is out (flush_deferred_writes).
            if (n_keep > 0 && !(t.prewarm && !t.prefilled()) && !p_->tiers->empty())
                p_->deferred = impl::deferred_write{t.seq, t.workspace, t.ap, n_keep};
            s.blocks.assign(kept.begin(), kept.end());
            s.n_durable = 0;
            for (size_t i = 0; i < path.size(); ++i) {
                const int k = path[i].segment_index;
                const bool per_turn = k >= 0 && (size_t)k < t.ap.man.segments.size() &&
                                      is_per_turn(t.ap.man.segments[(size_t)k].kind);
                if (!per_turn) s.n_durable = i + 1;
            }
            if (kept.size() > path.size()) {
                // The user message it keeps is, from the next turn on, history: of that
                // class in the stream (so a write-back may put it in the pool), and
                // durable when nothing per-turn comes before it (a chat's whole tail is
                // its one message; a diff segment's turn is not carried as history).
                const retention_class hist = p_->opts.kinds.policy(segment_kind::history).retention;
                for (size_t i = path.size(); i < kept.size(); ++i) s.blocks[i].cls = hist;
                if (s.n_durable == path.size() && hist != retention_class::none) s.n_durable = kept.size();
            }
            s.workspace = t.workspace;
            s.t_finished = t.now;
            s.unsaved = p_->cache->peek(s.blocks, t.workspace).n_blocks < s.blocks.size();
        } else {
            result_st = st.with_context("cache update");
            p_->clear_stream(t.seq);
        }
    } else {
        p_->clear_stream(t.seq);
    }
    if (!t.prewarm) {
        p_->count(t.workspace, t.explain, n_generated);
        p_->remember(t.workspace, t);
        return result_st;
    }
    prewarm_info pw;
    pw.complete = t.prefilled();
    pw.finished_unix_ms = unix_ms_now();
    pw.duration_ms = (double)(pw.finished_unix_ms - t.t_begin_unix_ms);
    pw.n_prefilled = t.prefill_pos - t.reused;
    pw.n_cached = result_st.ok() && n_keep > 0 ? t.ap.blocks[n_keep - 1].end : 0;
    pw.n_target = t.prefill_end;
    pw.n_found = t.reused;
    pw.found_tier = t.explain.tier;
    pw.ahead = t.ahead;
    prewarm_counters & c = p_->ctr.prewarm;
    c.n_prewarms++;
    if (pw.n_prefilled == 0 && pw.complete) c.n_already_cached++;
    if (!pw.complete) c.n_preempted++;
    c.n_prefilled_tokens += (uint64_t)pw.n_prefilled;
    p_->remember(t.workspace, t);
    p_->workspaces[t.workspace].prewarm = pw;
    return result_st;
}

void context_engine::abort_turn(pending_turn & t) {
    p_->flush_deferred();
    if (t.owner_ != this) return;
    t.owner_ = nullptr;
    p_->streams[(size_t)t.seq].busy = false;
    p_->clear_stream(t.seq);
}

seq_id context_engine::pick_work_seq(std::string_view workspace, std::span<const seq_id> free_seqs) const {
    std::vector<stream_view> views;
    views.reserve(p_->streams.size());
    for (const stream_state & st : p_->streams) views.push_back({st.busy, st.blocks.empty(), st.workspace, st.t_finished});
    return choose_stream(workspace, views, free_seqs);
}

uint32_t context_engine::n_work_seqs() const { return p_->opts.n_work_seqs; }

result<std::unique_ptr<generation_step>> context_engine::start_generation(const sampling_params & sp) const {
    return generation_step::make(*p_->eng, sp);
}

status context_engine::decode_step(std::span<const step_input> inputs, std::vector<std::vector<float>> & logits) {
    for (const step_input & in : inputs)
        if (in.seq < 0 || (uint32_t)in.seq >= p_->opts.n_work_seqs)
            return invalid_argument("decode_step: sequence " + std::to_string(in.seq) + " is not a work sequence");
    return p_->eng->decode_step(inputs, logits);
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
    WARMCTX_RETURN_IF_ERROR(p_->generate(t.seq, req, std::move(logits), out, t0));  // aborts t on error
    auto ti = clock_type::now();
    WARMCTX_RETURN_IF_ERROR(finish_turn(t, out.gen.tokens.size()));
    p_->flush_deferred();  // nobody waits for an answer here: the write-through now
    out.t_cache_update_ms = ms_between(ti, clock_type::now());
    out.man = t.ap.man;
    out.stable_prefix_hash = t.ap.stable_prefix_hash.hex();
    return out;
}

result<turn_result> context_engine::run_cold(const turn_request & req) {
    if (p_->cold_seq < 0) return failed_precondition("run_cold needs the cold stream (context_engine_options::cold_stream)");
    auto t0 = clock_type::now();
    auto ap = p_->assemble(req);
    if (!ap.ok()) return ap.error();
    turn_result out;
    out.t_assemble_ms = ms_between(t0, clock_type::now());
    engine & e = *p_->eng;
    e.clear_seq(p_->cold_seq);
    std::vector<float> logits;
    status st = p_->prefill(p_->cold_seq, *ap, 0, (pos_t)ap->tokens.size(), logits, out.t_prefill_ms);
    if (st.ok()) st = p_->generate(p_->cold_seq, req, std::move(logits), out, t0);
    e.clear_seq(p_->cold_seq);
    if (!st.ok()) return st;
    out.man = ap->man;
    out.stable_prefix_hash = ap->stable_prefix_hash.hex();
    out.explain.workspace = req.workspace;
    out.explain.n_prompt_tokens = (pos_t)ap->tokens.size();
    out.explain.n_prefilled = (pos_t)ap->tokens.size();
    out.explain.reason = "cold reference run (cache not consulted)";
    return out;
}

status context_engine::pin_workspace(const std::string & workspace, bool pinned) {
    p_->flush_deferred();
    const workspace_history * ws = p_->history(workspace);
    if (!ws) return not_found("workspace '" + workspace + "' has no turn yet");
    p_->write_back_sharing(ws->last_blocks, -1);  // pins hold what the pool has
    std::vector<block> stable;
    for (const auto & b : ws->last_blocks)
        if (b.end <= ws->last_stable_end) stable.push_back(b);
    if (pinned) p_->cache->pin(stable); else p_->cache->unpin(stable);
    return {};
}

void context_engine::drop_workspace(const std::string & workspace) {
    p_->flush_deferred();
    p_->cache->drop_workspace(workspace, ++p_->now);
    for (size_t s = 0; s < p_->streams.size(); ++s)
        if (!p_->streams[s].busy && p_->streams[s].workspace == workspace) p_->clear_stream((seq_id)s);
    p_->forget(workspace);
}

size_t context_engine::n_remembered_workspaces() const { return p_->workspaces.size(); }

status context_engine::snapshot_workspace(const std::string & workspace) {
    p_->flush_deferred();
    snapshot_store * disk = p_->tiers->disk();
    if (!disk) return failed_precondition("no disk tier (start with a cache directory)");
    const workspace_history * ws = p_->history(workspace);
    if (!ws) return not_found("workspace '" + workspace + "' has no turn yet");
    p_->write_back_sharing(ws->last_blocks, -1);
    // The pool's copy, or (the budget kept none) a work stream's blocks.
    match m = p_->best_match(p_->cache->peek(ws->last_blocks, workspace), ws->last_blocks, -1);
    if (m.n_blocks == 0) {
        // Not resident: fine if the disk already holds its prefix.
        if (disk->lookup(ws->last_blocks).n_blocks > 0) return {};
        return not_found("workspace '" + workspace + "' has nothing cached to snapshot");
    }
    engine & e = *p_->eng;
    std::vector<block> path(ws->last_blocks.begin(), ws->last_blocks.begin() + (long)m.n_blocks);
    if (disk->lookup(path).n_blocks >= path.size()) return {};
    const bool from_stream = m.holder >= 0 && (uint32_t)m.holder < p_->opts.n_work_seqs;
    if (!from_stream && !p_->pool->state(m.holder))
        return internal_error("snapshot: the cache's holder has no state in the pool");
    // The pool's bytes and a stream's are in this context's own layout, a file's in the
    // stream-independent one; and the holder may hold more than this workspace's path
    // (another workspace's longer path through the same blocks): cut the copy.
    result<std::vector<uint8_t>> kv = from_stream ? e.save_seq(m.holder) : e.portable_state(*p_->pool->state(m.holder));
    if (!kv.ok()) return kv.error();
    WARMCTX_RETURN_IF_ERROR(truncate_seq_state(*kv, path.back().end));
    return p_->tiers->put_disk(
        make_snapshot(p_->prof, workspace, ws->last_manifest, std::move(path), ws->last_tokens, std::move(kv.value())));
}

status context_engine::suspend_workspace(const std::string & workspace) {
    p_->flush_deferred();
    WARMCTX_RETURN_IF_ERROR(snapshot_workspace(workspace));
    p_->cache->drop_workspace(workspace, ++p_->now);
    for (size_t s = 0; s < p_->streams.size(); ++s)
        if (!p_->streams[s].busy && p_->streams[s].workspace == workspace) p_->clear_stream((seq_id)s);
    return {};
}

status context_engine::resume_workspace(const std::string & workspace) {
    p_->flush_deferred();
    const workspace_history * ws = p_->history(workspace);
    if (!ws) return not_found("workspace '" + workspace + "' has no turn yet");
    if (p_->best_match(p_->cache->peek(ws->last_blocks, workspace), ws->last_blocks, -1).n_blocks > 0)
        return {};  // already resident
    // The file's state, made raw and cut in RAM, becomes a holder of the pool: no KV
    // stream is involved.
    assembled_prompt ap;
    ap.tokens = ws->last_tokens;
    ap.blocks = ws->last_blocks;
    auto [h, snap] = p_->tiers->fetch(p_->prof, ap, 0);
    if (!snap) return not_found("no tier holds a prefix of workspace '" + workspace + "'");
    auto raw = p_->eng->raw_state(snap->kv, 0);
    status st = raw.ok() ? truncate_seq_state(*raw, h.at.n_tokens) : raw.error();
    if (!st.ok()) return st.with_context("resume '" + workspace + "'");
    std::vector<block> path(ws->last_blocks.begin(), ws->last_blocks.begin() + (long)h.at.n_blocks);
    p_->pool->stage(std::move(raw.value()), h.at.n_tokens);
    st = p_->cache->insert(workspace, path, p_->pool->staging(), ++p_->now);
    p_->pool->clear_seq(p_->pool->staging());
    if (st.ok()) p_->tiers->count_restore(h.at.n_tokens);
    return st;
}

status context_engine::branch_workspace(const std::string & from, const std::string & to) {
    p_->flush_deferred();
    if (from == to) return invalid_argument("branch: the new workspace must differ from the source");
    auto it = p_->workspaces.find(from);
    if (it == p_->workspaces.end()) return not_found("workspace '" + from + "' has no turn yet");
    if (p_->workspaces.count(to)) return failed_precondition("workspace '" + to + "' already exists");
    workspace_history h = it->second;  // same manifest and prefix; the cache shares by content
    p_->n_remembered_tokens += h.last_tokens.size();
    p_->workspaces[to] = std::move(h);
    return {};
}

void context_engine::drop_engine_cache() {
    p_->flush_deferred();
    p_->cache->clear();
    for (size_t s = 0; s < p_->streams.size(); ++s)
        if (!p_->streams[s].busy) p_->clear_stream((seq_id)s);
    p_->tiers->forget_recent_loads();
}
void context_engine::drop_work_streams() {
    p_->flush_deferred();
    for (size_t s = 0; s < p_->streams.size(); ++s) {
        if (p_->streams[s].busy) continue;
        p_->write_back((seq_id)s);
        p_->clear_stream((seq_id)s);
    }
}
snapshot_store * context_engine::disk_tier() {
    p_->flush_deferred();
    return p_->tiers->disk();
}
void context_engine::flush_deferred_writes() { p_->flush_deferred(); }

bool context_engine::write_back_ahead() {
    p_->flush_deferred();
    seq_id victim = -1;
    uint64_t oldest = 0;
    for (size_t s = 0; s < p_->streams.size(); ++s) {
        const stream_state & st = p_->streams[s];
        if (st.busy) continue;
        if (st.blocks.empty()) return false;  // a free stream: nothing is displaced next
        if (victim < 0 || st.t_finished < oldest) {
            victim = (seq_id)s;
            oldest = st.t_finished;
        }
    }
    if (victim < 0 || !p_->streams[(size_t)victim].unsaved) return false;
    const uint64_t before = p_->ctr.memory.n_write_backs;
    p_->write_back_displaced(victim);  // nothing when the pool or another stream holds them
    if (p_->ctr.memory.n_write_backs == before) return false;
    p_->ctr.memory.n_write_backs_ahead++;
    return true;
}

status context_engine::set_chunk_tokens(uint32_t n) {
    p_->flush_deferred();
    if (n < 1 || n > p_->eng->context().chunk_tokens)
        return invalid_argument("chunk_tokens must be in [1, " + std::to_string(p_->eng->context().chunk_tokens) + "]");
    p_->prof.chunk_tokens = n;
    return {};
}

const profile & context_engine::current_profile() const { return p_->prof; }
const model_info & context_engine::model() const { return p_->eng->model(); }
const chat_templates * context_engine::chat_template() const { return engine_chat_templates(*p_->tm); }
const context_info & context_engine::context() const { return p_->eng->context(); }
result<std::vector<token_id>> context_engine::tokenize(std::string_view text) const { return p_->eng->tokenize(text, true); }
const prefix_cache & context_engine::cache() const { return *p_->cache; }

context_counters context_engine::counters() const {
    context_counters c = p_->ctr;
    c.cache = p_->cache->counters();
    c.tiers = p_->tiers->counters();
    kv_memory & m = c.memory;
    const context_info & ci = p_->eng->context();
    const uint64_t bpt = ci.kv_bytes_per_token;
    m.streams_allocated_bytes = ci.kv_streams_bytes;
    for (uint32_t s = 0; s < ci.n_seq_max; ++s) m.streams_used_bytes += (uint64_t)p_->eng->seq_n_tokens((seq_id)s) * bpt;
    const kv_pool_counters pc = p_->pool->counters();
    m.pool_bytes = pc.used_bytes;
    m.pool_allocated_bytes = pc.allocated_bytes;
    m.pool_entries = pc.n_entries;
    m.allocated_bytes = m.streams_allocated_bytes + m.pool_allocated_bytes;
    m.used_bytes = m.streams_used_bytes + m.pool_bytes;
    m.n_pool_loads = pc.n_loads;
    m.pool_loaded_bytes = pc.loaded_bytes;
    m.pool_load_ms = pc.load_ms;
    m.n_pool_saves = pc.n_saves;
    m.pool_saved_bytes = pc.saved_bytes;
    m.pool_save_ms = pc.save_ms;
    m.n_streams = p_->streams.size();
    m.n_resident_streams = ci.n_seq_resident;
    m.streams_on_device = ci.n_gpu_layers > 0;
    return c;
}

}  // namespace warmctx
