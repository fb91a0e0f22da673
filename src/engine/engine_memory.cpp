// The engine's sequences: copied, trimmed, saved and loaded, for every memory kind
// (warmctx/engine.h, memory_kind), with the checkpoints of windows and recurrent states
// (seq_state.h). Plain models keep the direct paths they always had.
#include "engine_impl.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <unordered_set>

#include "llama.h"

namespace warmctx {

using namespace seq_state;

std::string_view memory_kind_name(memory_kind k) {
    switch (k) {
        case memory_kind::plain: return "plain";
        case memory_kind::sliding_window: return "sliding_window";
        case memory_kind::recurrent: return "recurrent";
        case memory_kind::hybrid: return "hybrid";
        case memory_kind::unsupported: return "unsupported";
    }
    return "unknown";
}

namespace {

std::vector<uint8_t> seq_header(int32_t seq) {
    std::vector<uint8_t> b;
    put_u32(b, k_seq_state_magic);
    put_u32(b, (uint32_t)seq);
    return b;
}

// llama.cpp's bytes of `seq` with `flags`.
result<std::vector<uint8_t>> llama_state(llama_context * ctx, seq_id seq, llama_state_seq_flags flags) {
    const size_t n = llama_state_seq_get_size_ext(ctx, seq, flags);
    std::vector<uint8_t> raw(n);
    const size_t w = llama_state_seq_get_data_ext(ctx, raw.data(), raw.size(), seq, flags);
    if (w == 0 && n != 0) return engine_error("llama_state_seq_get_data failed");
    raw.resize(w);
    return raw;
}

}  // namespace

// ---- checkpoints ---------------------------------------------------------------------

std::shared_ptr<const std::vector<uint8_t>> engine::impl::checkpoint_bytes(std::span<const uint8_t> src) {
    std::vector<uint8_t> buf;
    {
        std::lock_guard lock(spares->mu);
        for (size_t i = 0; i < spares->free.size(); ++i)
            if (spares->free[i].capacity() >= src.size()) {
                buf = std::move(spares->free[i]);
                spares->free.erase(spares->free.begin() + (long)i);
                break;
            }
    }
    buf.assign(src.begin(), src.end());
    // Given back when the last holder lets go; kept when there is room, else freed.
    std::weak_ptr<spare_buffers> home = spares;
    return std::shared_ptr<const std::vector<uint8_t>>(new std::vector<uint8_t>(std::move(buf)),
                                                       [home](const std::vector<uint8_t> * v) {
                                                           auto * own = const_cast<std::vector<uint8_t> *>(v);
                                                           if (auto s = home.lock()) {
                                                               std::lock_guard lock(s->mu);
                                                               if (s->free.size() < 2)
                                                                   s->free.push_back(std::move(*own));
                                                           }
                                                           delete own;
                                                       });
}

result<std::span<const uint8_t>> engine::impl::state_out(seq_id seq, llama_state_seq_flags flags,
                                                        std::vector<uint8_t> & own) {
    // Sized once either way (llama.cpp sizes a state by writing it to nothing).
    const size_t size = staging_buft ? llama_state_seq_get_size_ext(ctx.get(), seq, flags) : 0;
    if (uint8_t * staged = staging_buft ? staging_of(size) : nullptr) {
        const size_t w = llama_state_seq_get_data_ext(ctx.get(), staged, size, seq, flags);
        if (w == 0 && size != 0) return engine_error("llama_state_seq_get_data failed");
        return std::span<const uint8_t>(staged, w);
    }
    auto r = llama_state(ctx.get(), seq, flags);
    if (!r.ok()) return r.error();
    own = std::move(r.value());
    return std::span<const uint8_t>(own);
}

status engine::impl::take_checkpoint(seq_id seq, pos_t n_tokens) {
    // Out of the device through the staging buffer (state_out), then one copy into the
    // checkpoint (a spare buffer where there is one).
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<uint8_t> own;
    auto out = state_out(seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, own);
    if (!out.ok()) return out.error().with_context("checkpoint");
    const std::span<const uint8_t> raw = *out;
    std::shared_ptr<const std::vector<uint8_t>> bytes;
    if (layout.recurrent) {
        if (raw.size() < 8) return engine_error("checkpoint: an empty recurrent state");
        bytes = checkpoint_bytes(raw.subspan(8));
    } else {
        // The window alone reads as a one-part state; kept in the one-stream form (seq 0).
        state_layout one;  // the window alone, read as a one-part state
        one.cell_ext = layout.cell_ext;
        auto parsed = parse_seq_state(raw, seq, n_stream, one);
        if (!parsed.ok()) return engine_error("checkpoint: " + parsed.error().message());
        auto b = std::make_shared<std::vector<uint8_t>>();
        append_kv_part(*b, raw, parsed->parts.front().record, 1, 0, 0);
        bytes = std::move(b);
    }
    auto & list = ckpts[(size_t)seq];
    while (!list.empty() && list.back().n_tokens >= n_tokens) list.pop_back();
    list.push_back({n_tokens, std::move(bytes)});
    n_checkpoints_taken.fetch_add(1, std::memory_order_relaxed);
    const double took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    t_checkpoint_ms.store(t_checkpoint_ms.load(std::memory_order_relaxed) + took, std::memory_order_relaxed);
    return {};
}

double engine::checkpoint_ms() const { return p_->t_checkpoint_ms.load(std::memory_order_relaxed); }
double engine::checkpoint_mean_ms() const {
    const uint64_t n = p_->n_checkpoints_taken.load(std::memory_order_relaxed);
    return n == 0 ? 0.0 : checkpoint_ms() / (double)n;
}

bool engine::can_trim(seq_id seq, pos_t from) const {
    if (!p_->check_seq(seq).ok() || from < 0) return false;
    const pos_t n = seq_n_tokens(seq);
    return from == 0 || from >= n || p_->cuts_in_place(seq, from) || p_->checkpoint_at(seq, from) != nullptr;
}

void engine::drop_checkpoint(seq_id seq, pos_t n_tokens) {
    if (!p_->check_seq(seq).ok()) return;
    auto & list = p_->ckpts[(size_t)seq];
    std::erase_if(list, [&](const impl::checkpoint & c) { return c.n_tokens == n_tokens; });
}

uint64_t engine::checkpoints_taken() const { return p_->n_checkpoints_taken.load(std::memory_order_relaxed); }

status engine::impl::probe_memory(memory_info & mi, uint64_t & kv_per_token) {
    const llama_model * m = model.get();
    const bool hybrid = llama_model_is_hybrid(m), recurrent = llama_model_is_recurrent(m);
    mi.n_swa = std::max(0, llama_model_n_swa(m));
    if (hybrid && mi.n_swa > 0) {
        mi.kind = memory_kind::unsupported;
    } else if (hybrid) {
        mi.kind = memory_kind::hybrid;
        layout = state_layout{1, false, true};
    } else if (recurrent) {
        mi.kind = memory_kind::recurrent;
        layout = state_layout{0, false, true};
    } else if (mi.n_swa > 0) {
        mi.kind = memory_kind::sliding_window;
        layout = state_layout{2, true, false};
    }
    // Two tokens, then one: the per-token bytes of the KV parts and a checkpoint's size,
    // and whether warmctx reads this memory's state at all.
    const token_id toks[2] = {0, 0};
    auto sizes = [&](int32_t n, size_t & full, size_t & partial) -> status {
        llama_memory_seq_rm(mem(), 0, -1, -1);
        WARMCTX_RETURN_IF_ERROR(decode(0, toks, n, 0, false));
        full = llama_state_seq_get_size_ext(ctx.get(), 0, 0);
        partial =
            layout.has_partial() ? llama_state_seq_get_size_ext(ctx.get(), 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) : 0;
        return {};
    };
    size_t full1 = 0, part1 = 0, full2 = 0, part2 = 0;
    status st = sizes(1, full1, part1);
    if (st.ok()) st = sizes(2, full2, part2);
    bool readable = st.ok() && mi.kind != memory_kind::unsupported;
    std::string why = hybrid && mi.n_swa > 0 ? "a hybrid with a sliding window" : "";
    if (readable) {
        auto raw = llama_state(ctx.get(), 0, 0);
        status parsed = raw.ok() ? parse_seq_state(*raw, 0, n_stream, layout).error() : raw.error();
        if (!parsed.ok() && raw.ok()) {
            // Cells with an extension (M-RoPE's 2D position and the token: 12 bytes).
            state_layout with_ext = layout;
            with_ext.cell_ext = 12;
            if (parse_seq_state(*raw, 0, n_stream, with_ext).ok()) layout = with_ext, parsed = {};
        }
        readable = parsed.ok();
        if (!readable) why = parsed.message();
    }
    llama_memory_seq_rm(mem(), 0, -1, -1);
    if (!st.ok()) return st.with_context("probing the model's memory");
    const uint64_t per_cell = full2 > full1 ? full2 - full1 : 0;
    const uint64_t meta = (k_seq_state_cell_bytes + layout.cell_ext) * (uint64_t)layout.n_kv_parts;
    if (mi.kind != memory_kind::plain && per_cell >= meta) kv_per_token = per_cell - meta;
    if (layout.recurrent) mi.recurrent_bytes = mi.checkpoint_bytes = part2 > 8 ? part2 - 8 : 0;
    if (layout.window_last) {
        const uint64_t cell = part2 > part1 ? part2 - part1 : 0;
        mi.checkpoint_bytes = (part1 > cell ? part1 - cell : 0) + cell * (uint64_t)mi.n_swa;
    }
    if (!readable) {
        mi.kind = memory_kind::unsupported;
        layout = state_layout{};
    }
    mi.reuse = mi.kind != memory_kind::unsupported;
    mi.checkpoints = mi.reuse && layout.has_partial();
    const std::string ck = std::to_string(mi.checkpoint_bytes);
    switch (mi.kind) {
        case memory_kind::plain: mi.note = "plain attention KV: any block end is reused"; break;
        case memory_kind::sliding_window:
            mi.note = "sliding-window attention (window " + std::to_string(mi.n_swa) +
                      " tokens): work streams keep every cell, saved prefixes carry the window at each block end (" +
                      ck + " bytes a checkpoint)";
            break;
        case memory_kind::recurrent:
        case memory_kind::hybrid:
            mi.note = std::string(memory_kind_name(mi.kind)) + " memory: a recurrent state of " + ck +
                      " bytes per sequence, kept as a checkpoint at every block end; reuse resumes from the deepest "
                      "one shared";
            break;
        case memory_kind::unsupported:
            mi.note = "this model's memory is not one warmctx can save and cut (" + why +
                      "): served without reuse across turns";
            break;
    }
    return {};
}

const engine::impl::checkpoint * engine::impl::checkpoint_at(seq_id seq, pos_t n_tokens) const {
    for (const auto & c : ckpts[(size_t)seq])
        if (c.n_tokens == n_tokens) return &c;
    return nullptr;
}

std::vector<pos_t> engine::checkpoints(seq_id seq) const {
    std::vector<pos_t> out;
    if (!p_->check_seq(seq).ok()) return out;
    for (const auto & c : p_->ckpts[(size_t)seq]) out.push_back(c.n_tokens);
    return out;
}

uint64_t engine::checkpoint_bytes_held() const {
    // A stream copy shares its source's checkpoints: each buffer counted once.
    std::unordered_set<const std::vector<uint8_t> *> seen;
    uint64_t n = 0;
    for (const auto & list : p_->ckpts)
        for (const auto & c : list)
            if (seen.insert(c.bytes.get()).second) n += c.bytes->size();
    return n;
}

uint64_t engine::state_scratch_bytes() const {
    uint64_t n = p_->staging ? ggml_backend_buffer_get_size(p_->staging) : 0;
    std::lock_guard lock(p_->spares->mu);
    for (const auto & b : p_->spares->free) n += b.capacity();
    return n;
}

// ---- copy, trim, clear ---------------------------------------------------------------

status engine::copy_seq(seq_id src, seq_id dst) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(src));
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(dst));
    if (src == dst) return {};
    llama_memory_seq_rm(p_->mem(), dst, -1, -1);
    llama_memory_seq_cp(p_->mem(), src, dst, -1, -1);
    p_->ckpts[(size_t)dst] = p_->ckpts[(size_t)src];
    p_->window_real_from[(size_t)dst] = p_->window_real_from[(size_t)src];
    return {};
}

status engine::copy_seq_now(seq_id src, seq_id dst) {
    WARMCTX_RETURN_IF_ERROR(copy_seq(src, dst));
    if (src == dst) return {};
    // llama.cpp copies a stream's data at its next decode, of any sequence. A recurrent
    // state is shared, not copied: `dst` reads `src`'s cell until one of them decodes,
    // which then takes a copy of it on the device. So where another sequence is empty,
    // one token decoded into it (and removed) applies the copy and leaves `dst`'s state
    // as it is: no state out of the device or back on the turn's way.
    if (p_->layout.recurrent) {
        for (uint32_t s = 0; s < p_->cinfo.n_seq_max; ++s) {
            const auto scratch = (seq_id)s;
            if (scratch == src || scratch == dst || seq_n_tokens(scratch) != 0) continue;
            status st = apply_pending_copies(scratch);
            if (!st.ok()) clear_seq(dst);
            return st;
        }
    }
    // Else one token decoded into `dst` after what it holds, then removed. The token takes
    // the next free cell and gives it back, so the cells a later prefill takes are the same.
    const pos_t at = seq_n_tokens(dst);
    if ((uint64_t)at >= p_->cinfo.n_ctx_seq) {
        clear_seq(dst);
        return failed_precondition("copy_seq_now: the stream is full, no cell to decode into");
    }
    // A recurrent state is not cut back by removing the token: its state at `at` first,
    // unless the copy holds one there already (a stream cut back to a block end, as every
    // stream a turn finished on: then no copy out of the device on the turn's way).
    const bool need = p_->layout.recurrent && at > 0 && !p_->checkpoint_at(dst, at);
    status st = need ? p_->take_checkpoint(dst, at) : status{};
    const token_id t = 0;
    if (st.ok()) st = p_->decode(dst, &t, 1, at, false, impl::padding::never);
    if (st.ok()) st = trim_seq(dst, at);
    if (!st.ok()) clear_seq(dst);
    return st;
}

status engine::trim_seq(seq_id seq, pos_t from) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if (from < 0) return invalid_argument("trim position must not be negative");
    auto & list = p_->ckpts[(size_t)seq];
    const pos_t n = seq_n_tokens(seq);
    if (from == 0) {
        clear_seq(seq);
        return {};
    }
    if (from >= n) return {};
    const memory_info & mi = p_->cinfo.memory;
    // Plain KV, or a window whose cells before `from` are real: cut back as plain KV.
    if (p_->cuts_in_place(seq, from)) {
        if (!llama_memory_seq_rm(p_->mem(), seq, from, -1)) return engine_error("llama_memory_seq_rm refused the trim");
        while (!list.empty() && list.back().n_tokens > from) list.pop_back();
        return {};
    }
    const impl::checkpoint * c = p_->checkpoint_at(seq, from);
    if (!c)
        return failed_precondition("no checkpoint at " + std::to_string(from) + " tokens in sequence " +
                                   std::to_string(seq) + " (a " + std::string(memory_kind_name(mi.kind)) +
                                   " model's state cannot be cut back without one)");
    const auto payload = c->bytes;  // kept alive across the list's changes
    std::vector<uint8_t> part = seq_header(seq);
    if (p_->layout.recurrent) {
        // Into the device from page-locked memory where the backend has it.
        const size_t size = part.size() + payload->size();
        uint8_t * in = p_->staging_of(size);
        if (in) {
            std::memcpy(in, part.data(), part.size());
            std::memcpy(in + part.size(), payload->data(), payload->size());
        } else {
            part.insert(part.end(), payload->begin(), payload->end());
            in = part.data();
        }
        // The recurrent state first (the hybrid's cut refuses while it is past `from`).
        if (llama_state_seq_set_data_ext(p_->ctx.get(), in, size, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) == 0 ||
            !llama_memory_seq_rm(p_->mem(), seq, from, -1)) {
            clear_seq(seq);
            return engine_error("restoring the checkpoint at " + std::to_string(from) + " failed; sequence cleared");
        }
    } else {
        auto w = parse_partial(*payload, p_->layout);
        if (!w.ok() || !w->record) return engine_error("a checkpoint's window is unreadable");
        if (!llama_memory_seq_rm(p_->mem(), seq, from, -1)) return engine_error("llama_memory_seq_rm refused the trim");
        put_u32(part, p_->n_stream);
        for (uint32_t s = 0; s < p_->n_stream; ++s) {
            if (s == 0) append_padded_window(part, *payload, *w->record, seq);
            else put_u32(part, 0);
        }
        if (llama_state_seq_set_data_ext(p_->ctx.get(), part.data(), part.size(), seq,
                                         LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) == 0) {
            clear_seq(seq);
            return engine_error("restoring the window at " + std::to_string(from) + " failed; sequence cleared");
        }
        p_->window_real_from[(size_t)seq] = w->record->min_pos;
    }
    while (!list.empty() && list.back().n_tokens > from) list.pop_back();
    return {};
}

void engine::clear_seq(seq_id seq) {
    if (!p_->check_seq(seq).ok()) return;
    llama_memory_seq_rm(p_->mem(), seq, -1, -1);
    p_->ckpts[(size_t)seq].clear();
    p_->window_real_from[(size_t)seq] = 0;
}

void engine::clear_all() {
    llama_memory_clear(p_->mem(), true);
    for (auto & l : p_->ckpts) l.clear();
    std::fill(p_->window_real_from.begin(), p_->window_real_from.end(), 0);
}

pos_t engine::seq_n_tokens(seq_id seq) const {
    if (!p_->check_seq(seq).ok()) return 0;
    return llama_memory_seq_pos_max(p_->mem(), seq) + 1;  // pos_max is -1 when empty
}

status engine::apply_pending_copies(seq_id scratch) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(scratch));
    if (seq_n_tokens(scratch) != 0)
        return failed_precondition("apply_pending_copies: the scratch sequence is not empty");
    const token_id t = 0;
    status st = p_->decode(scratch, &t, 1, 0, false, impl::padding::never);  // pending copies first
    clear_seq(scratch);
    return st;
}

// ---- save and load -------------------------------------------------------------------

namespace {

// A parsed state to `n_stream` streams per KV part (record in stream 0) for sequence
// `seq`; the window padded to its positions when `pad_window`; the trailer kept when
// `keep_trailer`.
std::vector<uint8_t> convert_state(std::span<const uint8_t> src, const parsed_state & ps, const state_layout & layout,
                                   uint32_t n_stream, int32_t seq, bool pad_window, bool keep_trailer) {
    std::vector<uint8_t> out = seq_header(seq);
    for (size_t i = 0; i < ps.parts.size(); ++i) {
        const state_part & p = ps.parts[i];
        if (p.recurrent) {
            out.insert(out.end(), src.begin() + (long)p.begin, src.begin() + (long)p.end);
            continue;
        }
        const bool window = layout.window_last && i + 1 == layout.n_kv_parts;
        if (window && pad_window && p.record) {
            put_u32(out, n_stream);
            append_padded_window(out, src, *p.record, seq);
            for (uint32_t s = 1; s < n_stream; ++s) put_u32(out, 0);
        } else {
            append_kv_part(out, src, p.record, n_stream, 0, seq);
        }
    }
    if (keep_trailer && ps.llama_end < src.size()) {
        // The trailer's entries, with llama's new length.
        std::vector<std::pair<pos_t, std::span<const uint8_t>>> e;
        for (const auto & c : ps.checkpoints) e.push_back({c.n_tokens, src.subspan(c.begin, c.end - c.begin)});
        append_trailer(out, out.size(), e);
    }
    return out;
}

status check_fits(const parsed_state & ps, uint32_t n_ctx_seq) {
    const auto & rec = ps.record();
    if (rec && ((uint64_t)rec->n_cells > n_ctx_seq || (uint64_t)rec->max_pos >= n_ctx_seq))
        return out_of_range("load_seq: the state holds " + std::to_string(rec->n_cells) + " cells up to position " +
                            std::to_string(rec->max_pos) + " but a sequence holds " + std::to_string(n_ctx_seq) +
                            " tokens");
    return {};
}

}  // namespace

result<std::vector<uint8_t>> engine::save_seq(seq_id seq) const {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if (!p_->cinfo.memory.reuse) return engine_error("save_seq: this model's memory is not one warmctx can save");
    // Plain KV: straight from llama.cpp's bytes (through the staging buffer) to the portable
    // form; a state with checkpoints takes them along as save_seq_raw's trailer.
    std::vector<uint8_t> own;
    result<std::span<const uint8_t>> raw = std::span<const uint8_t>{};
    if (p_->layout == state_layout{}) {
        raw = p_->state_out(seq, 0, own);
    } else {
        auto saved = save_seq_raw(seq);
        if (!saved.ok()) return saved.error();
        own = std::move(saved.value());
        raw = std::span<const uint8_t>(own);
    }
    if (!raw.ok()) return raw.error();
    auto out = portable_state(*raw);
    if (!out.ok()) return engine_error("save_seq: " + out.error().message());
    return out;
}

result<std::vector<uint8_t>> engine::portable_state(std::span<const uint8_t> raw) const {
    // To the one-stream form (seq_state.h).
    uint32_t id = 0;
    if (raw.size() >= 8) std::memcpy(&id, raw.data() + 4, 4);
    auto st = parse_seq_state(raw, (int32_t)id, p_->n_stream, p_->layout);
    if (!st.ok()) return st.error();
    return convert_state(raw, *st, p_->layout, 1, 0, false, true);
}

result<std::vector<uint8_t>> engine::save_seq_raw(seq_id seq) const {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    // Through the staging buffer, as a checkpoint (state_out): into pageable memory a copy
    // out of a device runs at a fraction of the bus's speed (a 19k-token prefix of a 4B
    // shape, 1.5 GB: over a second on an H100's host).
    std::vector<uint8_t> own;
    auto out = p_->state_out(seq, 0, own);
    if (!out.ok()) return out.error();
    result<std::vector<uint8_t>> raw = own.empty() ? std::vector<uint8_t>(out->begin(), out->end()) : std::move(own);
    if (p_->layout.has_partial()) {
        const size_t llama_bytes = raw->size();
        const pos_t end = seq_n_tokens(seq);
        std::vector<std::pair<pos_t, std::span<const uint8_t>>> entries;
        for (const auto & c : p_->ckpts[(size_t)seq])
            if (c.n_tokens < end) entries.push_back({c.n_tokens, std::span<const uint8_t>(*c.bytes)});
        append_trailer(*raw, llama_bytes, entries);
    }
    return raw;
}

status engine::load_seq_raw(seq_id seq, std::span<const uint8_t> bytes) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if (bytes.empty()) return invalid_argument("load_seq_raw: empty state");
    if (!p_->layout.has_partial()) {
        clear_seq(seq);
        size_t r = llama_state_seq_set_data(p_->ctx.get(), bytes.data(), bytes.size(), seq);
        if (r == 0) return corrupt("llama_state_seq_set_data rejected the state");
        return {};
    }
    uint32_t id = 0;
    if (bytes.size() >= 8) std::memcpy(&id, bytes.data() + 4, 4);
    auto ps = parse_seq_state(bytes, (int32_t)id, 0, p_->layout);
    if (!ps.ok()) return ps.error();
    WARMCTX_RETURN_IF_ERROR(check_fits(*ps, p_->cinfo.n_ctx_seq));
    // A window goes in padded, so its cells sit where a cold run's do; without one,
    // llama.cpp reads its own bytes as they are (the trailer left out), with no copy.
    std::vector<uint8_t> padded;
    std::span<const uint8_t> llama_bytes = bytes.first(ps->llama_end);
    if (p_->layout.window_last) {
        padded = convert_state(bytes, *ps, p_->layout, p_->n_stream, seq, true, false);
        llama_bytes = padded;
    }
    clear_seq(seq);
    if (llama_state_seq_set_data(p_->ctx.get(), llama_bytes.data(), llama_bytes.size(), seq) == 0)
        return corrupt("llama_state_seq_set_data rejected the state (wrong model, KV type or corrupt bytes)");
    // Its checkpoints, and its own last part as the checkpoint at its end.
    auto & list = p_->ckpts[(size_t)seq];
    for (const auto & c : ps->checkpoints)
        list.push_back({c.n_tokens, std::make_shared<std::vector<uint8_t>>(bytes.begin() + (long)c.begin,
                                                                           bytes.begin() + (long)c.end)});
    const state_part & last = ps->parts.back();
    if (ps->n_tokens() > 0) {
        if (last.recurrent) {
            list.push_back({ps->n_tokens(), std::make_shared<std::vector<uint8_t>>(bytes.begin() + (long)last.begin,
                                                                                   bytes.begin() + (long)last.end)});
        } else {
            auto b = std::make_shared<std::vector<uint8_t>>();
            append_kv_part(*b, bytes, last.record, 1, 0, 0);
            list.push_back({ps->n_tokens(), std::move(b)});
        }
    }
    if (p_->layout.window_last && last.record) p_->window_real_from[(size_t)seq] = last.record->min_pos;
    return {};
}

namespace {

// The one record of a portable plain state, checked to fit a sequence of n_ctx_seq tokens.
result<std::optional<seq_state::stream_record>> raw_record(std::span<const uint8_t> bytes, uint32_t n_ctx_seq) {
    auto st = seq_state::parse_seq_state(bytes, 0, 1);  // save_seq's one-stream form only
    if (!st.ok()) return st.error();
    // A state made in a context with longer sequences may not fit this one's.
    WARMCTX_RETURN_IF_ERROR(check_fits(*st, n_ctx_seq));
    return st->record();
}

size_t raw_state_size(const std::optional<seq_state::stream_record> & rec, uint32_t n_stream) {
    return 12 + (rec ? rec->end - rec->begin : 4) + 4 * (size_t)(n_stream - 1);
}

// Expanded to a context of n_stream streams: the record (into `seq`'s own stream, whatever
// its place), then empty streams. `dst` holds raw_state_size(rec, n_stream) bytes.
void write_raw_state(std::span<const uint8_t> bytes, const std::optional<seq_state::stream_record> & rec, int32_t seq,
                     uint32_t n_stream, uint8_t * dst) {
    auto u32 = [&](uint32_t v) {
        std::memcpy(dst, &v, 4);
        dst += 4;
    };
    u32(seq_state::k_seq_state_magic);
    u32((uint32_t)seq);
    u32(n_stream);
    if (rec) {
        std::memcpy(dst, bytes.data() + rec->begin, rec->end - rec->begin);
        seq_state::set_record_seq(dst, *rec, seq);
        dst += rec->end - rec->begin;
    } else {
        u32(0);
    }
    for (uint32_t s = 1; s < n_stream; ++s) u32(0);
}

}  // namespace

status engine::load_seq(seq_id seq, std::span<const uint8_t> bytes) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if (bytes.empty()) return invalid_argument("load_seq: empty state");
    if (p_->layout.has_partial()) {
        auto raw = raw_state(bytes, seq);
        if (!raw.ok()) return raw.error();
        return load_seq_raw(seq, *raw);
    }
    auto rec = raw_record(bytes, p_->cinfo.n_ctx_seq);
    if (!rec.ok()) return rec.error();
    const size_t n = raw_state_size(*rec, p_->n_stream);
    std::vector<uint8_t> full;
    uint8_t * dst = p_->staging_of(n);  // built where the copy into the device reads it: page-locked
    if (!dst) {
        full.resize(n);
        dst = full.data();
    }
    write_raw_state(bytes, *rec, seq, p_->n_stream, dst);
    clear_seq(seq);
    size_t r = llama_state_seq_set_data(p_->ctx.get(), dst, n, seq);
    if (r == 0) return corrupt("llama_state_seq_set_data rejected the state (wrong model, KV type or corrupt bytes)");
    return {};
}

result<std::vector<uint8_t>> engine::raw_state(std::span<const uint8_t> bytes, seq_id seq) const {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if (p_->layout.has_partial()) {
        auto ps = parse_seq_state(bytes, 0, 1, p_->layout);
        if (!ps.ok()) return ps.error();
        WARMCTX_RETURN_IF_ERROR(check_fits(*ps, p_->cinfo.n_ctx_seq));
        return convert_state(bytes, *ps, p_->layout, p_->n_stream, seq, false, true);
    }
    auto rec = raw_record(bytes, p_->cinfo.n_ctx_seq);
    if (!rec.ok()) return rec.error();
    std::vector<uint8_t> full(raw_state_size(*rec, p_->n_stream));
    write_raw_state(bytes, *rec, seq, p_->n_stream, full.data());
    return full;
}

status engine::truncate_state(std::vector<uint8_t> & state, pos_t n_tokens) const {
    return seq_state::truncate_state(state, n_tokens, p_->layout);
}

}  // namespace warmctx
