// The request flow over the engine, the assembler and the prefix cache.
#include "warmctx/context_engine.h"

#include "warmctx/fs.h"
#include "warmctx/snapshot_store.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <list>
#include <mutex>
#include <unordered_map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace warmctx {

namespace {

using clock_type = std::chrono::steady_clock;
double ms_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}


// text_model over the real engine: the model's tokenizer and its chat template.
class engine_text_model final : public text_model {
  public:
    explicit engine_text_model(const engine & e) : e_(e) {
        // The generation prompt is what add_generation_prompt appends to a conversation.
        std::vector<chat_message> one = {{"user", "x"}};
        auto with = e_.apply_chat_template(one, true);
        auto without = e_.apply_chat_template(one, false);
        if (with.ok() && without.ok() && with->size() >= without->size() &&
            with->compare(0, without->size(), *without) == 0)
            gen_prompt_ = with->substr(without->size());
    }
    result<std::vector<token_id>> tokenize(std::string_view text) const override { return e_.tokenize(text, true); }
    // Segment contents repeat turn after turn (a 47k-token stable context is mostly
    // the same few texts), and tokenizing them is most of a warm turn's CPU time; so
    // their tokens are remembered by content hash, least recently used first out.
    result<std::vector<token_id>> tokenize_plain(std::string_view text) const override {
        if (text.size() < k_memo_min_bytes) return e_.tokenize(text, false);
        const hash128 key = hash_string(text);
        {
            std::lock_guard lk(mu_);
            if (auto it = memo_.find(key); it != memo_.end() && it->second->n_bytes == text.size()) {
                lru_.splice(lru_.begin(), lru_, it->second);
                return it->second->tokens;
            }
        }
        auto t = e_.tokenize(text, false);
        if (!t.ok() || t->size() > k_memo_max_tokens / 4) return t;
        std::lock_guard lk(mu_);
        if (memo_.count(key)) return t;
        lru_.push_front({key, text.size(), *t});
        memo_[key] = lru_.begin();
        memo_tokens_ += t->size();
        while (memo_tokens_ > k_memo_max_tokens && !lru_.empty()) {
            memo_tokens_ -= lru_.back().tokens.size();
            memo_.erase(lru_.back().key);
            lru_.pop_back();
        }
        return t;
    }
    result<std::string> render_message(std::string_view role, std::string_view content) const override {
        std::vector<chat_message> m = {{std::string(role), std::string(content)}};
        return e_.apply_chat_template(m, false);
    }
    std::string generation_prompt() const override { return gen_prompt_; }

  private:
    static constexpr size_t k_memo_min_bytes = 256;
    static constexpr size_t k_memo_max_tokens = 8u << 20;  // 32 MiB of token ids
    struct memo_entry {
        hash128 key;
        size_t n_bytes = 0;
        std::vector<token_id> tokens;
    };
    const engine & e_;
    std::string gen_prompt_;
    mutable std::mutex mu_;
    mutable std::list<memo_entry> lru_;
    mutable std::unordered_map<hash128, std::list<memo_entry>::iterator, hash128_hasher> memo_;
    mutable size_t memo_tokens_ = 0;
};

// kv_ops over the real engine: the prefix cache moves KV only through these.
class engine_kv_ops final : public kv_ops {
  public:
    explicit engine_kv_ops(engine & e) : e_(e) {}
    status copy_seq(seq_id src, seq_id dst) override { return e_.copy_seq(src, dst); }
    status trim_seq(seq_id seq, pos_t from) override { return e_.trim_seq(seq, from); }
    void clear_seq(seq_id seq) override { e_.clear_seq(seq); }

  private:
    engine & e_;
};

std::string hex_digest_of_vocab(const engine & e) {
    // Every token's piece, in id order, with a separator: two tokenizers that would
    // map any text differently differ here (merges excepted; they are implied by the
    // vocabulary for BPE files written by the same converter).
    std::string all;
    all.reserve((size_t)e.model().n_vocab * 8);
    for (token_id t = 0; t < e.model().n_vocab; ++t) {
        all += e.token_piece(t);
        all.push_back('\x1f');
    }
    return hash_string(all).hex();
}

}  // namespace

std::string_view miss_kind_name(miss_kind k) {
    switch (k) {
        case miss_kind::full_hit: return "full_hit";
        case miss_kind::cold: return "cold";
        case miss_kind::segment_changed: return "segment_changed";
        case miss_kind::profile_drift: return "profile_drift";
        case miss_kind::evicted: return "evicted";
        case miss_kind::not_cached: return "not_cached";
    }
    return "cold";
}

nlohmann::json explain_report::to_json() const {
    nlohmann::json segs = nlohmann::json::array();
    for (const auto & s : segments)
        segs.push_back({{"id", s.id}, {"kind", segment_kind_name(s.kind)}, {"class", retention_class_name(s.cls)},
                        {"token_begin", s.token_begin}, {"token_end", s.token_end},
                        {"tokens_reused", s.n_reused}, {"tokens_prefilled", s.n_prefilled}});
    nlohmann::json j = {
        {"workspace", workspace}, {"prompt_tokens", n_prompt_tokens}, {"tokens_reused", n_reused},
        {"tokens_prefilled", n_prefilled}, {"tokens_cacheable", n_cacheable}, {"result", miss_kind_name(kind)},
        {"reason", reason}, {"missed_segment", missed_segment}, {"matched_workspace", matched_workspace},
        {"drifted_fields", drifted_fields}, {"changed_segments", changed_segments},
        {"common_tokens_with_previous_turn", n_common_tokens}, {"snapped_from", snapped_from},
        {"predicted_prefill_ms", predicted_prefill_ms}, {"stable_prefix_hash", stable_prefix_hash}, {"tier", tier},
        {"segments", segs},
    };
    if (eviction) {
        j["eviction"] = {{"class", retention_class_name(eviction->cls)}, {"at", eviction->at},
                         {"workspace", eviction->workspace}, {"reason", eviction->reason},
                         {"policy", eviction_policy_name(eviction->policy)},
                         {"token_begin", eviction->begin}, {"token_end", eviction->end}};
    } else {
        j["eviction"] = nullptr;
    }
    return j;
}

std::string explain_report::to_text() const {
    std::ostringstream o;
    char line[512];
    std::snprintf(line, sizeof line, "workspace %s: %d prompt tokens, %d reused (from %s), %d prefilled (%s)\n",
                  workspace.c_str(), n_prompt_tokens, n_reused, tier.c_str(), n_prefilled,
                  std::string(miss_kind_name(kind)).c_str());
    o << line << "  why: " << reason << "\n";
    if (predicted_prefill_ms >= 0) {
        std::snprintf(line, sizeof line, "  predicted prefill: %.0f ms\n", predicted_prefill_ms);
        o << line;
    }
    o << "  stable prefix hash: " << stable_prefix_hash << "\n";
    std::snprintf(line, sizeof line, "  %-28s %-13s %-8s %13s %8s %10s\n", "segment", "kind", "class", "tokens", "reused",
                  "prefilled");
    o << line;
    for (const auto & s : segments) {
        std::string range = std::to_string(s.token_begin) + ".." + std::to_string(s.token_end);
        std::snprintf(line, sizeof line, "  %-28.28s %-13s %-8s %13s %8d %10d\n", s.id.c_str(),
                      std::string(segment_kind_name(s.kind)).c_str(), std::string(retention_class_name(s.cls)).c_str(),
                      range.c_str(), s.n_reused, s.n_prefilled);
        o << line;
    }
    return o.str();
}

struct context_engine::impl {
    context_engine_options opts;
    seq_id cold_seq = 1;       // after the work sequences
    seq_id first_holder = 2;
    std::unique_ptr<engine> eng;
    std::unique_ptr<text_model> tm;
    std::unique_ptr<engine_kv_ops> kv;
    std::unique_ptr<prefix_cache> cache;
    profile prof;
    uint64_t now = 0;
    double prefill_tokens_per_ms = 0;  // exponential average of measured prefills
    std::unique_ptr<mem_fs> host_fs;   // the host-RAM tier is a snapshot store in memory
    std::unique_ptr<snapshot_store> host, disk;
    tier_counters tiers;
    // The last few snapshots restored, kept until the engine caches their prefix again.
    std::map<std::string, std::shared_ptr<const snapshot>> recent_loads;

    // The end of the leading run of cacheable blocks of at least `min` class, and how many.
    static std::pair<size_t, pos_t> tier_prefix(const std::vector<block> & blocks, retention_class min) {
        size_t k = 0;
        while (k < blocks.size() && blocks[k].cls != retention_class::none && blocks[k].cls >= min) ++k;
        return {k, k == 0 ? 0 : blocks[k - 1].end};
    }

    // Writes [0, end of blocks[k-1]) of `seq` (which holds at least that, computed or
    // restored, no copy pending) to `store` unless it already holds it. Trims `seq`.
    void write_through(snapshot_store & store, bool is_disk, seq_id seq, const std::string & ws,
                       const assembled_prompt & ap, size_t k) {
        if (k == 0) return;
        std::vector<block> path(ap.blocks.begin(), ap.blocks.begin() + (long)k);
        snapshot_match held = store.lookup(path);
        if (held.n_blocks >= k) return;
        const pos_t end = path.back().end;
        if (!eng->trim_seq(seq, end).ok()) { tiers.n_write_failures++; return; }
        auto kv = eng->save_seq(seq);
        if (!kv.ok()) { tiers.n_write_failures++; return; }
        snapshot snap;
        snap.meta.prof = prof;
        snap.meta.profile_fingerprint = prof.fingerprint();
        snap.meta.workspace = ws;
        snap.meta.man = ap.man;
        snap.meta.blocks = std::move(path);
        snap.tokens.assign(ap.tokens.begin(), ap.tokens.begin() + end);
        snap.kv = std::move(kv.value());
        auto put = store.put(snap);
        if (!put.ok()) { tiers.n_write_failures++; return; }
        (is_disk ? tiers.n_writes_disk : tiers.n_writes_host)++;
    }

    // The longest prefix a tier holds beyond `engine_tokens`: loads it into `seq`,
    // trimmed at the match. Returns the tokens restored (0: none) and the tier's name.
    std::pair<pos_t, std::string> restore(const assembled_prompt & ap, pos_t engine_tokens, seq_id seq, match & m) {
        const pos_t n = (pos_t)ap.tokens.size();
        for (int t = 0; t < 2; ++t) {
            snapshot_store * store = t == 0 ? host.get() : disk.get();
            if (!store) continue;
            snapshot_match sm = store->lookup(ap.blocks);
            size_t k = sm.n_blocks;
            while (k > 0 && ap.blocks[k - 1].end >= n) --k;  // the last token must be computed
            const pos_t reuse = k == 0 ? 0 : ap.blocks[k - 1].end;
            if (reuse <= engine_tokens) continue;
            // Requests admitted while an earlier restore of the same file is still being
            // decoded share its bytes instead of reading the file again.
            result<std::shared_ptr<const snapshot>> snap = std::shared_ptr<const snapshot>();
            const std::string memo_key = std::to_string(t) + ":" + sm.key.file_name();
            if (auto it = recent_loads.find(memo_key); it != recent_loads.end()) {
                snap = it->second;
                tiers.n_shared_restores++;
            } else {
                snap = store->load(sm.key, &prof);
                if (!snap.ok()) { tiers.n_restore_failures++; continue; }
                if (recent_loads.size() >= 4) recent_loads.erase(recent_loads.begin());
                recent_loads[memo_key] = *snap;
            }
            eng->clear_seq(seq);
            status st = eng->load_seq(seq, (*snap)->kv);
            if (st.ok()) st = eng->trim_seq(seq, reuse);
            if (!st.ok()) { eng->clear_seq(seq); tiers.n_restore_failures++; continue; }
            (t == 0 ? tiers.n_restores_host : tiers.n_restores_disk)++;
            tiers.n_restored_tokens += (uint64_t)reuse;
            m.n_blocks = k;
            m.n_tokens = reuse;
            m.holder = -1;
            m.workspace = sm.key.workspace;
            return {reuse, t == 0 ? "host" : "disk"};
        }
        return {0, ""};
    }

    struct workspace_state {
        manifest last_manifest;
        profile last_profile;
        std::vector<token_id> last_tokens;
        std::vector<block> last_blocks;
        pos_t last_stable_end = 0;
        bool has_turn = false;
    };
    std::map<std::string, workspace_state> workspaces;
    context_counters ctr;

    result<assembled_prompt> assemble(const turn_request & req) const {
        if (req.workspace.empty()) return invalid_argument("workspace name is empty");
        return warmctx::assemble(req.segments, opts.kinds, *tm, prof, opts.tenant_salt, prof.chunk_tokens,
                                 req.add_generation_prompt);
    }

    // The reuse point for `m`: a block end strictly before the prompt's end (the last
    // token must be computed to get its logits).
    static pos_t reuse_point(const assembled_prompt & ap, const match & m) {
        if (m.n_blocks == 0) return 0;
        pos_t n = (pos_t)ap.tokens.size();
        size_t k = m.n_blocks;
        while (k > 0 && ap.blocks[k - 1].end >= n) --k;
        return k == 0 ? 0 : ap.blocks[k - 1].end;
    }

    explain_report plan(const turn_request & req, const assembled_prompt & ap, const match & m, pos_t reuse) const {
        explain_report r;
        r.workspace = req.workspace;
        r.n_prompt_tokens = (pos_t)ap.tokens.size();
        r.n_reused = reuse;
        r.n_prefilled = r.n_prompt_tokens - reuse;
        r.matched_workspace = reuse > 0 ? m.workspace : "";
        r.stable_prefix_hash = ap.stable_prefix_hash.hex();
        r.n_cacheable = 0;
        for (const auto & b : ap.blocks) {
            if (b.cls == retention_class::none) break;
            r.n_cacheable = b.end;
        }
        for (const auto & e : ap.man.segments) {
            segment_explain s;
            s.id = e.id;
            s.kind = e.kind;
            s.cls = e.cls;
            s.token_begin = e.token_begin;
            s.token_end = e.token_end;
            s.n_reused = std::clamp(reuse - e.token_begin, 0, e.n_tokens());
            s.n_prefilled = e.n_tokens() - s.n_reused;
            r.segments.push_back(s);
        }
        if (prefill_tokens_per_ms > 0) r.predicted_prefill_ms = r.n_prefilled / prefill_tokens_per_ms;

        auto ws = workspaces.find(req.workspace);
        const workspace_state * st = ws == workspaces.end() ? nullptr : &ws->second;
        if (st && st->has_turn) {
            for (const auto & c : diff_manifests(st->last_manifest, ap.man))
                if (c.what != segment_change_kind::moved) r.changed_segments.push_back(c.to_string());
            pos_t common = 0;
            const size_t n = std::min(st->last_tokens.size(), ap.tokens.size());
            while ((size_t)common < n && st->last_tokens[common] == ap.tokens[common]) ++common;
            r.n_common_tokens = common;
        }
        // Where did reuse stop, and why?
        if (r.n_cacheable > 0 && m.n_tokens >= r.n_cacheable) {
            r.kind = miss_kind::full_hit;
            r.reason = "every cacheable block was reused; prefilling only the uncacheable tail";
        } else if (r.n_cacheable == 0) {
            r.kind = miss_kind::cold;
            r.reason = "nothing in this prompt is cacheable (it starts with a segment of class none)";
        } else {
            size_t next = 0;  // the first block not reused
            while (next + 1 < ap.blocks.size() && ap.blocks[next].end <= reuse) ++next;
            const block & b = ap.blocks[next];
            if (b.segment_index >= 0 && (size_t)b.segment_index < ap.man.segments.size())
                r.missed_segment = ap.man.segments[(size_t)b.segment_index].id;
            auto ev = cache->last_eviction(b.chain);
            if (st && st->has_turn && !(st->last_profile == prof)) {
                r.kind = miss_kind::profile_drift;
                r.drifted_fields = st->last_profile.describe_drift(prof);
                std::string f;
                for (const auto & d : r.drifted_fields) f += (f.empty() ? "" : "; ") + d;
                r.reason = "profile drift (" + f + "): KV computed under the old profile cannot be reused";
            } else if (ev) {
                r.kind = miss_kind::evicted;
                r.eviction = ev;
                r.reason = "segment '" + r.missed_segment + "' (class " + std::string(retention_class_name(ev->cls)) +
                           ") was evicted at t=" + std::to_string(ev->at) + ": " + ev->reason + " (policy " +
                           std::string(eviction_policy_name(ev->policy)) + ")";
            } else if (st && st->has_turn) {
                // The first change at or before the missed block explains the miss.
                std::string changed;
                for (const auto & c : diff_manifests(st->last_manifest, ap.man)) {
                    if (c.what == segment_change_kind::moved) continue;
                    if (c.after_begin > b.begin) continue;
                    changed = c.to_string();
                    break;
                }
                if (!changed.empty()) {
                    r.kind = miss_kind::segment_changed;
                    r.reason = changed + "; reuse stops at the first block that differs (token " +
                               std::to_string(reuse) + ")";
                } else {
                    r.kind = miss_kind::not_cached;
                    r.reason = "the prefix up to segment '" + r.missed_segment +
                               "' is not resident (its holder was replaced or never kept it)";
                }
            } else {
                r.kind = miss_kind::cold;
                r.reason = reuse > 0 ? "first turn of workspace '" + req.workspace + "'; " + std::to_string(reuse) +
                                           " tokens shared with workspace '" + m.workspace + "'"
                                     : "first turn of workspace '" + req.workspace +
                                           "' and no other workspace holds this prefix";
            }
        }
        // Snapping: the previous turn shares more cacheable tokens than were reused,
        // but reuse can only stop at a block end.
        if (std::min(r.n_common_tokens, r.n_cacheable) > reuse) {
            r.snapped_from = std::min(r.n_common_tokens, r.n_cacheable);
            r.reason += "; " + std::to_string(r.snapped_from) + " cacheable tokens match the previous turn, reuse snapped to " +
                        std::to_string(reuse) + " (a canonical block boundary)";
        }
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

    // Prefill + decode of ap in `seq`, which holds [0, reuse) already.
    status compute(seq_id seq, const assembled_prompt & ap, pos_t reuse, const turn_request & req, turn_result & out,
                   clock_type::time_point t0) {
        std::vector<float> logits;
        auto tp = clock_type::now();
        std::span<const token_id> tail(ap.tokens.data() + reuse, ap.tokens.size() - (size_t)reuse);
        WARMCTX_RETURN_IF_ERROR(eng->prefill(seq, tail, reuse, ap.boundaries, &logits, (int32_t)prof.chunk_tokens));
        auto tpe = clock_type::now();
        out.t_prefill_ms = ms_between(tp, tpe);
        note_prefill_rate((pos_t)tail.size(), out.t_prefill_ms);
        if (req.keep_logits) out.prompt_logits = logits;
        auto g = eng->generate(seq, std::move(logits), req.sampling, req.keep_logits ? &out.gen_logits : nullptr);
        if (!g.ok()) return g.error();
        out.gen = std::move(g.value());
        out.t_decode_ms = out.gen.t_decode_ms;
        // The first token is chosen right after the prefill (one argmax/sample).
        out.t_first_token_ms = ms_between(t0, tpe);
        out.t_total_ms = ms_between(t0, clock_type::now());
        return {};
    }
};

context_engine::context_engine(std::unique_ptr<impl> p) : p_(std::move(p)) {}
context_engine::~context_engine() = default;

result<std::unique_ptr<context_engine>> context_engine::open(const context_engine_options & opts) {
    if (opts.n_holders < 1 || opts.n_holders > 64) return invalid_argument("n_holders must be in [1, 64]");
    if (opts.n_work_seqs < 1 || opts.n_work_seqs > 64) return invalid_argument("n_work_seqs must be in [1, 64]");
    auto p = std::make_unique<impl>();
    p->opts = opts;
    p->cold_seq = (seq_id)opts.n_work_seqs;
    p->first_holder = p->cold_seq + 1;
    p->opts.engine.n_seq_max = opts.n_work_seqs + 1 + opts.n_holders;
    auto e = engine::open(p->opts.engine);
    if (!e.ok()) return e.error();
    p->eng = std::move(e.value());
    p->tm = make_engine_text_model(*p->eng);
    p->kv = std::make_unique<engine_kv_ops>(*p->eng);
    p->opts.budget.bytes_per_token = p->eng->context().kv_bytes_per_token;
    if (opts.workspace_max_bytes > 0 && p->opts.budget.bytes_per_token > 0) {
        const uint64_t t = opts.workspace_max_bytes / p->opts.budget.bytes_per_token;
        if (t == 0) return invalid_argument("the per-workspace byte budget holds less than one token of KV");
        auto & w = p->opts.budget.workspace_max_tokens;
        w = w == 0 ? t : std::min(w, t);
    }
    WARMCTX_RETURN_IF_ERROR(validate_budget(p->opts.budget));
    std::vector<seq_id> holders;
    for (uint32_t i = 0; i < opts.n_holders; ++i) holders.push_back(p->first_holder + (seq_id)i);
    p->cache = std::make_unique<prefix_cache>(*p->kv, holders, p->opts.budget, opts.policy,
                                              opts.engine.mode == kv_mode::exact ? kv_accounting::per_holder
                                                                                 : kv_accounting::shared_cells);
    if (opts.tiers.host_budget_bytes > 0) {
        p->host_fs = std::make_unique<mem_fs>();
        snapshot_store_options so;
        so.dir = "/host-tier";
        so.fs = p->host_fs.get();
        so.budget_bytes = opts.tiers.host_budget_bytes;
        so.policy = opts.policy;
        auto h = snapshot_store::open(so);
        if (!h.ok()) return h.error().with_context("host-RAM tier");
        p->host = std::move(h.value());
    }
    if (!opts.tiers.cache_dir.empty()) {
        snapshot_store_options so;
        so.dir = opts.tiers.cache_dir;
        so.budget_bytes = opts.tiers.disk_budget_bytes;
        so.policy = opts.policy;
        auto d = snapshot_store::open(so);  // indexes the directory (headers only, no KV)
        if (!d.ok()) return d.error().with_context("disk tier '" + opts.tiers.cache_dir + "'");
        p->disk = std::move(d.value());
    }
    // The profile: everything that decides the KV's bits.
    const auto & mi = p->eng->model();
    const auto & ci = p->eng->context();
    auto md = file_digest(mi.path);
    if (!md.ok()) return md.error().with_context("digest of the model file");
    p->prof.model_digest = md->hex();
    p->prof.tokenizer_digest = hex_digest_of_vocab(*p->eng);
    p->prof.chat_template_digest = hash_string(mi.chat_template).hex();
    p->prof.llama_commit = std::string(llama_commit());
    p->prof.backend = ci.backend;
    p->prof.n_ctx = ci.n_ctx_seq;
    p->prof.rope_freq_base = mi.rope_freq_base;
    p->prof.rope_freq_scale = 1.0f;
    p->prof.kv_type = ci.kv_type;
    p->prof.chunk_tokens = ci.chunk_tokens;
    p->prof.kv_mode = std::string(kv_mode_name(ci.mode));
    p->prof.flash_attn = opts.engine.flash_attn;
    p->prof.n_gpu_layers = opts.engine.n_gpu_layers;
    p->prof.kv_streams = ci.mode == kv_mode::exact ? ci.n_seq_max : 1;
    return std::unique_ptr<context_engine>(new context_engine(std::move(p)));
}

result<assembled_prompt> context_engine::assemble_request(const turn_request & req) const { return p_->assemble(req); }

result<explain_report> context_engine::explain(const turn_request & req) const {
    auto ap = p_->assemble(req);
    if (!ap.ok()) return ap.error();
    match m = p_->cache->peek(ap->blocks, req.workspace);
    pos_t reuse = impl::reuse_point(*ap, m);
    std::string tier = reuse > 0 ? "engine" : "none";
    for (int t = 0; t < 2; ++t) {  // what a tier would restore (nothing is loaded)
        snapshot_store * store = t == 0 ? p_->host.get() : p_->disk.get();
        if (!store) continue;
        snapshot_match sm = store->lookup(ap->blocks);
        size_t k = sm.n_blocks;
        while (k > 0 && ap->blocks[k - 1].end >= (pos_t)ap->tokens.size()) --k;
        const pos_t r = k == 0 ? 0 : ap->blocks[k - 1].end;
        if (r > reuse) {
            reuse = r;
            tier = t == 0 ? "host" : "disk";
            m.n_blocks = k;
            m.n_tokens = r;
            m.workspace = sm.key.workspace;
        }
    }
    auto r = p_->plan(req, *ap, m, reuse);
    r.tier = tier;
    return r;
}

result<pending_turn> context_engine::begin_turn(const turn_request & req, seq_id seq, std::vector<float> & logits) {
    if (seq < 0 || (uint32_t)seq >= p_->opts.n_work_seqs)
        return invalid_argument("work sequence " + std::to_string(seq) + " out of range");
    auto t0 = clock_type::now();
    auto ap_r = p_->assemble(req);
    if (!ap_r.ok()) return ap_r.error();
    pending_turn t;
    t.workspace = req.workspace;
    t.seq = seq;
    t.cache = req.cache;
    t.ap = std::move(ap_r.value());
    const assembled_prompt & ap = t.ap;
    t.t_assemble_ms = ms_between(t0, clock_type::now());
    if (ap.tokens.size() > p_->eng->context().n_ctx_seq)
        return out_of_range("prompt needs " + std::to_string(ap.tokens.size()) + " tokens but the context holds " +
                            std::to_string(p_->eng->context().n_ctx_seq));
    t.now = ++p_->now;
    match m = p_->cache->lookup(ap.blocks, t.now, req.workspace);
    const pos_t reuse = impl::reuse_point(ap, m);
    t.explain = p_->plan(req, ap, m, reuse);

    engine & e = *p_->eng;
    e.clear_seq(seq);
    // A tier may hold a longer prefix than the engine (evicted, or before a restart).
    pos_t reuse_final = reuse;
    std::string tier = reuse > 0 ? "engine" : "none";
    if (p_->host || p_->disk) {
        auto tr = clock_type::now();
        match tm = m;
        auto [restored, name] = p_->restore(ap, reuse, seq, tm);
        if (restored > 0) {
            reuse_final = restored;
            tier = name;
            t.explain = p_->plan(req, ap, tm, restored);
            t.t_restore_ms = ms_between(tr, clock_type::now());
        }
    }
    t.explain.tier = tier;
    if (tier == "engine") {
        auto tc = clock_type::now();
        status st = e.copy_seq(m.holder, seq);
        if (st.ok()) st = e.trim_seq(seq, reuse);
        if (!st.ok()) { e.clear_seq(seq); return st; }
        t.t_copy_ms = ms_between(tc, clock_type::now());
    }
    const pos_t reuse_used = reuse_final;
    auto tp = clock_type::now();
    std::span<const token_id> tail(ap.tokens.data() + reuse_used, ap.tokens.size() - (size_t)reuse_used);
    status st = e.prefill(seq, tail, reuse_used, ap.boundaries, &logits, (int32_t)p_->prof.chunk_tokens);
    if (!st.ok()) { e.clear_seq(seq); return st; }
    t.t_prefill_ms = ms_between(tp, clock_type::now());
    p_->note_prefill_rate((pos_t)tail.size(), t.t_prefill_ms);
    return t;
}

status context_engine::finish_turn(pending_turn & t, size_t n_generated) {
    engine & e = *p_->eng;
    status result_st;
    if (t.cache) {
        status ins = p_->cache->insert(t.workspace, t.ap.blocks, t.seq, t.now);
        // resource_exhausted: nothing fit the budget; the turn itself succeeded.
        if (!ins.ok() && ins.code() != status_code::resource_exhausted) result_st = ins.with_context("cache update");
        p_->recent_loads.clear();
        // Write-through to the tiers: the longer (host) prefix first, since each write
        // trims the work sequence to what it writes.
        if (p_->host) {
            auto [k, end] = impl::tier_prefix(t.ap.blocks, p_->opts.tiers.host_min_class);
            p_->write_through(*p_->host, false, t.seq, t.workspace, t.ap, k);
        }
        if (p_->disk) {
            auto [k, end] = impl::tier_prefix(t.ap.blocks, p_->opts.tiers.disk_min_class);
            p_->write_through(*p_->disk, true, t.seq, t.workspace, t.ap, k);
        }
    }
    e.clear_seq(t.seq);
    auto & ws = p_->workspaces[t.workspace];
    ws.last_manifest = t.ap.man;
    ws.last_profile = p_->prof;
    ws.last_tokens = t.ap.tokens;
    ws.last_blocks = t.ap.blocks;
    ws.last_stable_end = t.ap.stable_end;
    ws.has_turn = true;
    p_->count(t.workspace, t.explain, n_generated);
    return result_st;
}

void context_engine::abort_turn(pending_turn & t) { p_->eng->clear_seq(t.seq); }

uint32_t context_engine::n_work_seqs() const { return p_->opts.n_work_seqs; }

result<turn_result> context_engine::run_turn(const turn_request & req) {
    auto t0 = clock_type::now();
    std::vector<float> logits;
    auto pt = begin_turn(req, 0, logits);
    if (!pt.ok()) return pt.error();
    pending_turn & t = *pt;
    turn_result out;
    out.explain = t.explain;
    out.t_assemble_ms = t.t_assemble_ms;
    out.t_copy_ms = t.t_copy_ms;
    out.t_restore_ms = t.t_restore_ms;
    out.t_prefill_ms = t.t_prefill_ms;
    out.t_first_token_ms = ms_between(t0, clock_type::now());
    if (req.keep_logits) out.prompt_logits = logits;
    auto g = p_->eng->generate(t.seq, std::move(logits), req.sampling, req.keep_logits ? &out.gen_logits : nullptr);
    if (!g.ok()) { abort_turn(t); return g.error(); }
    out.gen = std::move(g.value());
    out.t_decode_ms = out.gen.t_decode_ms;
    out.t_total_ms = ms_between(t0, clock_type::now());
    auto ti = clock_type::now();
    WARMCTX_RETURN_IF_ERROR(finish_turn(t, out.gen.tokens.size()));
    out.t_cache_update_ms = ms_between(ti, clock_type::now());
    out.man = t.ap.man;
    out.stable_prefix_hash = t.ap.stable_prefix_hash.hex();
    return out;
}

result<turn_result> context_engine::run_cold(const turn_request & req) {
    auto t0 = clock_type::now();
    auto ap = p_->assemble(req);
    if (!ap.ok()) return ap.error();
    turn_result out;
    out.t_assemble_ms = ms_between(t0, clock_type::now());
    engine & e = *p_->eng;
    e.clear_seq(p_->cold_seq);
    status st = p_->compute(p_->cold_seq, *ap, 0, req, out, t0);
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
    auto it = p_->workspaces.find(workspace);
    if (it == p_->workspaces.end()) return not_found("workspace '" + workspace + "' has no turn yet");
    std::vector<block> stable;
    for (const auto & b : it->second.last_blocks)
        if (b.end <= it->second.last_stable_end) stable.push_back(b);
    if (pinned) p_->cache->pin(stable); else p_->cache->unpin(stable);
    return {};
}

void context_engine::drop_workspace(const std::string & workspace) {
    p_->cache->drop_workspace(workspace, ++p_->now);
    p_->workspaces.erase(workspace);
}

status context_engine::snapshot_workspace(const std::string & workspace) {
    if (!p_->disk) return failed_precondition("no disk tier (start with a cache directory)");
    auto it = p_->workspaces.find(workspace);
    if (it == p_->workspaces.end()) return not_found("workspace '" + workspace + "' has no turn yet");
    const auto & ws = it->second;
    match m = p_->cache->peek(ws.last_blocks, workspace);
    if (m.n_blocks == 0) {
        // Not resident: fine if the disk already holds its prefix.
        snapshot_match sm = p_->disk->lookup(ws.last_blocks);
        if (sm.n_blocks > 0) return {};
        return not_found("workspace '" + workspace + "' has nothing cached to snapshot");
    }
    // The holder may be the destination of a lazy copy: materialize it first.
    engine & e = *p_->eng;
    e.clear_seq(p_->cold_seq);
    WARMCTX_RETURN_IF_ERROR(e.apply_pending_copies(p_->cold_seq));
    std::vector<block> path(ws.last_blocks.begin(), ws.last_blocks.begin() + (long)m.n_blocks);
    if (p_->disk->lookup(path).n_blocks >= path.size()) return {};
    auto kv = e.save_seq(m.holder);
    if (!kv.ok()) return kv.error();
    // The holder may hold more than this workspace's path (another workspace's longer
    // path through the same blocks): keep only the matched part.
    if (e.seq_n_tokens(m.holder) != path.back().end) {
        WARMCTX_RETURN_IF_ERROR(e.load_seq(p_->cold_seq, *kv));
        WARMCTX_RETURN_IF_ERROR(e.trim_seq(p_->cold_seq, path.back().end));
        kv = e.save_seq(p_->cold_seq);
        e.clear_seq(p_->cold_seq);
        if (!kv.ok()) return kv.error();
    }
    snapshot snap;
    snap.meta.prof = p_->prof;
    snap.meta.profile_fingerprint = p_->prof.fingerprint();
    snap.meta.workspace = workspace;
    snap.meta.man = ws.last_manifest;
    snap.meta.blocks = path;
    snap.tokens.assign(ws.last_tokens.begin(), ws.last_tokens.begin() + path.back().end);
    snap.kv = std::move(kv.value());
    auto put = p_->disk->put(snap);
    if (!put.ok()) return put.error();
    p_->tiers.n_writes_disk++;
    return {};
}

status context_engine::suspend_workspace(const std::string & workspace) {
    WARMCTX_RETURN_IF_ERROR(snapshot_workspace(workspace));
    p_->cache->drop_workspace(workspace, ++p_->now);
    return {};
}

status context_engine::resume_workspace(const std::string & workspace) {
    auto it = p_->workspaces.find(workspace);
    if (it == p_->workspaces.end()) return not_found("workspace '" + workspace + "' has no turn yet");
    const auto & ws = it->second;
    if (p_->cache->peek(ws.last_blocks, workspace).n_blocks > 0) return {};  // already resident
    // Restore into the scratch sequence, then let the cache take it as a holder.
    assembled_prompt ap;
    ap.tokens = ws.last_tokens;
    ap.blocks = ws.last_blocks;
    match m;
    auto [restored, name] = p_->restore(ap, 0, p_->cold_seq, m);
    if (restored == 0) return not_found("no tier holds a prefix of workspace '" + workspace + "'");
    std::vector<block> path(ws.last_blocks.begin(), ws.last_blocks.begin() + (long)m.n_blocks);
    status st = p_->cache->insert(workspace, path, p_->cold_seq, ++p_->now);
    p_->eng->clear_seq(p_->cold_seq);
    return st;
}

status context_engine::branch_workspace(const std::string & from, const std::string & to) {
    if (from == to) return invalid_argument("branch: the new workspace must differ from the source");
    auto it = p_->workspaces.find(from);
    if (it == p_->workspaces.end()) return not_found("workspace '" + from + "' has no turn yet");
    if (p_->workspaces.count(to)) return failed_precondition("workspace '" + to + "' already exists");
    p_->workspaces[to] = it->second;  // same manifest and prefix; the cache shares by content
    return {};
}

void context_engine::drop_engine_cache() {
    p_->cache->clear();
    p_->recent_loads.clear();
}
void context_engine::clear_host_tier() {
    p_->recent_loads.clear();
    if (p_->host) (void)p_->host->remove_all();
}
snapshot_store * context_engine::disk_tier() { return p_->disk.get(); }
snapshot_store * context_engine::host_tier() { return p_->host.get(); }

status context_engine::set_chunk_tokens(uint32_t n) {
    if (n < 1 || n > p_->eng->context().chunk_tokens)
        return invalid_argument("chunk_tokens must be in [1, " + std::to_string(p_->eng->context().chunk_tokens) + "]");
    p_->prof.chunk_tokens = n;
    return {};
}

const profile & context_engine::current_profile() const { return p_->prof; }

context_counters context_engine::counters() const {
    context_counters c = p_->ctr;
    c.cache = p_->cache->counters();
    c.tiers = p_->tiers;
    if (p_->host) {
        auto st = p_->host->stats();
        c.tiers.host_bytes = st.n_bytes;
        c.tiers.host_files = st.n_files;
    }
    if (p_->disk) {
        auto st = p_->disk->stats();
        c.tiers.disk_bytes = st.n_bytes;
        c.tiers.disk_files = st.n_files;
    }
    return c;
}

engine & context_engine::raw_engine() { return *p_->eng; }
const model_info & context_engine::model() const { return p_->eng->model(); }
const context_info & context_engine::context() const { return p_->eng->context(); }
result<std::vector<token_id>> context_engine::tokenize(std::string_view text) const { return p_->eng->tokenize(text, true); }
const prefix_cache & context_engine::cache() const { return *p_->cache; }

std::unique_ptr<text_model> make_engine_text_model(const engine & e) { return std::make_unique<engine_text_model>(e); }

}  // namespace warmctx
