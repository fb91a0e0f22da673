#include "seq_state.h"

#include <algorithm>
#include <cstring>

#include "warmctx/engine.h"

namespace warmctx {
namespace seq_state {
namespace {

struct state_reader {
    std::span<const uint8_t> b;
    size_t at = 0;
    size_t limit = b.size();
    size_t left() const { return limit - at; }
    bool u32(uint32_t & v) {
        if (left() < 4) return false;
        std::memcpy(&v, b.data() + at, 4);
        at += 4;
        return true;
    }
    bool u64(uint64_t & v) {
        if (left() < 8) return false;
        std::memcpy(&v, b.data() + at, 8);
        at += 8;
        return true;
    }
    // Skips n x m bytes, refusing an overflow or a read past the end.
    bool skip(uint64_t n, uint64_t m) {
        if (m != 0 && n > left() / m) return false;
        at += (size_t)(n * m);
        return true;
    }
};

status bad_state(const std::string & why) {
    return corrupt("sequence state: " + why + " (not a state warmctx can read for this model's memory)");
}

// Parses one stream record at r.at. `seq`: the seq id every cell must carry.
result<stream_record> read_stream_record(state_reader & r, int32_t seq, uint32_t ext) {
    stream_record rec;
    rec.begin = r.at;
    rec.cell_bytes = (uint32_t)k_seq_state_cell_bytes + ext;
    if (!r.u32(rec.n_cells)) return bad_state("truncated before a stream's cell count");
    if (rec.n_cells == 0) {
        rec.end = r.at;
        return rec;
    }
    if (rec.n_cells > r.left() / rec.cell_bytes) return bad_state("more cells than bytes");
    for (uint32_t i = 0; i < rec.n_cells; ++i) {
        uint32_t pos = 0, n_seq = 0, id = 0;
        (void)r.u32(pos), (void)r.u32(n_seq), (void)r.skip(1, ext), (void)r.u32(id);
        if (n_seq != 1) return bad_state("a cell shared by " + std::to_string(n_seq) + " sequences");
        if ((int32_t)id != seq)
            return bad_state("a cell of sequence " + std::to_string((int32_t)id) + " in the state of sequence " +
                             std::to_string(seq));
        if ((int32_t)pos < 0) return bad_state("a negative position");
        rec.max_pos = std::max(rec.max_pos, (pos_t)(int32_t)pos);
        rec.min_pos = i == 0 ? (pos_t)(int32_t)pos : std::min(rec.min_pos, (pos_t)(int32_t)pos);
    }
    uint32_t v_trans = 0, n_layer = 0;
    if (!r.u32(v_trans) || !r.u32(n_layer)) return bad_state("truncated before the tensor data");
    if (v_trans > 1) return bad_state("v_trans is " + std::to_string(v_trans));
    if (n_layer == 0) return bad_state("no layers");
    for (int part = 0; part < 2; ++part) {  // K, then V
        for (uint32_t l = 0; l < n_layer; ++l) {
            uint32_t type = 0;
            if (!r.u32(type)) return bad_state("truncated in a layer's header");
            if (part == 0 || v_trans == 0) {
                uint64_t row_bytes = 0;
                if (!r.u64(row_bytes) || row_bytes == 0 || !r.skip(rec.n_cells, row_bytes))
                    return bad_state("truncated tensor rows");
            } else {
                uint32_t elem_bytes = 0, n_embd = 0;
                if (!r.u32(elem_bytes) || !r.u32(n_embd) || elem_bytes == 0 || n_embd == 0 ||
                    !r.skip((uint64_t)rec.n_cells * n_embd, elem_bytes))
                    return bad_state("truncated transposed V rows");
            }
        }
    }
    rec.end = r.at;
    return rec;
}

// One attention KV cache's part: its stream count, then the streams.
result<state_part> read_kv_part(state_reader & r, int32_t seq, uint32_t n_stream_expected, uint32_t ext) {
    state_part p;
    p.begin = r.at;
    if (!r.u32(p.n_stream) || p.n_stream == 0) return bad_state("no KV stream");
    if (n_stream_expected != 0 && p.n_stream != n_stream_expected)
        return bad_state(std::to_string(p.n_stream) + " KV streams where " + std::to_string(n_stream_expected) +
                         " were expected");
    for (uint32_t s = 0; s < p.n_stream; ++s) {
        auto rec = read_stream_record(r, seq, ext);
        if (!rec.ok()) return rec.error();
        if (rec->n_cells == 0) continue;
        if (p.record) return bad_state("the sequence has cells in two KV streams");
        p.record = *rec;
        p.record_stream = s;
    }
    p.end = r.at;
    return p;
}

// A recurrent memory's part: its cell (one sequence: 0 or 1 cells), then tensors to `end`.
result<state_part> read_recurrent_part(state_reader & r) {
    state_part p;
    p.recurrent = true;
    p.begin = r.at;
    uint32_t n_cells = 0;
    if (!r.u32(n_cells)) return bad_state("truncated before the recurrent cell count");
    if (n_cells > 1) return bad_state(std::to_string(n_cells) + " recurrent cells for one sequence");
    if (n_cells == 1) {
        uint32_t pos = 0, n_seq = 0;
        if (!r.u32(pos) || !r.u32(n_seq)) return bad_state("truncated recurrent cell");
        if (n_seq != 0) return bad_state("a recurrent cell that names its sequences");
        if ((int32_t)pos < 0) return bad_state("a negative recurrent position");
        p.recurrent_pos = (pos_t)(int32_t)pos;
    }
    uint32_t s_trans = 0, n_layer = 0;
    if (!r.u32(s_trans) || !r.u32(n_layer)) return bad_state("truncated before the recurrent tensors");
    r.at = r.limit;  // opaque from here
    p.end = r.at;
    return p;
}

// The trailer's checkpoints, if the bytes end with one (layouts with a last part only).
status read_trailer(std::span<const uint8_t> bytes, const state_layout & layout, parsed_state & out) {
    out.llama_end = bytes.size();
    if (!layout.has_partial() || bytes.size() < 8 + k_trailer_footer_bytes) return {};
    uint32_t magic = 0, n = 0;
    uint64_t llama_bytes = 0;
    const size_t foot = bytes.size() - k_trailer_footer_bytes;
    std::memcpy(&llama_bytes, bytes.data() + foot, 8);
    std::memcpy(&n, bytes.data() + foot + 8, 4);
    std::memcpy(&magic, bytes.data() + foot + 12, 4);
    if (magic != k_checkpoint_magic) return {};
    if (llama_bytes < 8 || llama_bytes > foot) return bad_state("a checkpoint trailer past its state");
    state_reader r{bytes};
    r.at = (size_t)llama_bytes;
    r.limit = foot;
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t n_tokens = 0;
        uint64_t len = 0;
        if (!r.u32(n_tokens) || !r.u64(len) || len > r.left()) return bad_state("a truncated checkpoint");
        checkpoint_ref c{(pos_t)n_tokens, r.at, r.at + (size_t)len};
        if ((int32_t)n_tokens <= 0 || (!out.checkpoints.empty() && c.n_tokens <= out.checkpoints.back().n_tokens))
            return bad_state("checkpoints out of order");
        auto payload = parse_partial(bytes.subspan(c.begin, c.end - c.begin), layout);
        if (!payload.ok()) return payload.error();
        out.checkpoints.push_back(c);
        r.at = c.end;
    }
    if (r.at != foot) return bad_state("bytes between the checkpoints and their footer");
    out.llama_end = (size_t)llama_bytes;
    return {};
}

void put_bytes(std::vector<uint8_t> & out, const uint8_t * p, size_t n) { out.insert(out.end(), p, p + n); }
void put_zeros(std::vector<uint8_t> & out, size_t n) { out.resize(out.size() + n, 0); }

// Walks a record's tensor section (after its cells), calling `rows(at, n_per_cell_bytes)`
// for every block of per-cell rows and `header(at, n)` for the bytes between them.
template <class Header, class Rows>
void walk_tensors(std::span<const uint8_t> src, const stream_record & rec, Header header, Rows rows) {
    size_t at = rec.begin + 4 + (size_t)rec.n_cells * rec.cell_bytes;
    uint32_t v_trans = 0, n_layer = 0;
    std::memcpy(&v_trans, src.data() + at, 4);
    std::memcpy(&n_layer, src.data() + at + 4, 4);
    header(at, 8);
    at += 8;
    for (int part = 0; part < 2; ++part) {
        for (uint32_t l = 0; l < n_layer; ++l) {
            if (part == 0 || v_trans == 0) {
                uint64_t row_bytes = 0;
                std::memcpy(&row_bytes, src.data() + at + 4, 8);
                header(at, 12);
                at += 12;
                rows(at, (size_t)row_bytes);
                at += (size_t)rec.n_cells * (size_t)row_bytes;
            } else {
                uint32_t elem_bytes = 0, n_embd = 0;
                std::memcpy(&elem_bytes, src.data() + at + 4, 4);
                std::memcpy(&n_embd, src.data() + at + 8, 4);
                header(at, 12);
                at += 12;
                for (uint32_t j = 0; j < n_embd; ++j) {
                    rows(at, (size_t)elem_bytes);
                    at += (size_t)rec.n_cells * elem_bytes;
                }
            }
        }
    }
}

// The first k cells of `rec` hold positions 0..k-1, in order.
status check_positions(std::span<const uint8_t> src, const stream_record & rec, uint32_t k) {
    const size_t cells = rec.begin + 4;
    for (uint32_t i = 0; i < k; ++i) {
        uint32_t pos = 0;
        std::memcpy(&pos, src.data() + cells + (size_t)i * rec.cell_bytes, 4);
        if ((pos_t)pos != (pos_t)i)
            return bad_state("cell " + std::to_string(i) + " holds position " + std::to_string(pos));
    }
    return {};
}

// Appends the first k cells of `rec` (which must hold positions 0..k-1 first, in order).
status append_cut_record(std::vector<uint8_t> & out, std::span<const uint8_t> src, const stream_record & rec,
                         uint32_t k) {
    WARMCTX_RETURN_IF_ERROR(check_positions(src, rec, k));
    const size_t cells = rec.begin + 4;
    put_u32(out, k);
    if (k == 0) return {};
    put_bytes(out, src.data() + cells, (size_t)k * rec.cell_bytes);
    walk_tensors(src, rec, [&](size_t at, size_t n) { put_bytes(out, src.data() + at, n); },
                 [&](size_t at, size_t row) { put_bytes(out, src.data() + at, (size_t)k * row); });
    return {};
}

}  // namespace

void put_u32(std::vector<uint8_t> & out, uint32_t v) {
    const size_t at = out.size();
    out.resize(at + 4);
    std::memcpy(out.data() + at, &v, 4);
}

void put_u64(std::vector<uint8_t> & out, uint64_t v) {
    const size_t at = out.size();
    out.resize(at + 8);
    std::memcpy(out.data() + at, &v, 8);
}

void set_record_seq(uint8_t * copy, const stream_record & rec, int32_t seq) {
    for (uint32_t i = 0; i < rec.n_cells; ++i) std::memcpy(copy + 4 + (size_t)(i + 1) * rec.cell_bytes - 4, &seq, 4);
}

void append_record(std::vector<uint8_t> & out, std::span<const uint8_t> state, const stream_record & rec,
                   int32_t seq) {
    const size_t at = out.size();
    out.insert(out.end(), state.begin() + (long)rec.begin, state.begin() + (long)rec.end);
    set_record_seq(out.data() + at, rec, seq);
}

void append_kv_part(std::vector<uint8_t> & out, std::span<const uint8_t> src, const std::optional<stream_record> & rec,
                    uint32_t n_stream, uint32_t at_stream, int32_t seq) {
    put_u32(out, n_stream);
    for (uint32_t s = 0; s < n_stream; ++s) {
        if (rec && s == at_stream) append_record(out, src, *rec, seq);
        else put_u32(out, 0);
    }
}

void append_padded_window(std::vector<uint8_t> & out, std::span<const uint8_t> src, const stream_record & rec,
                          int32_t seq) {
    const uint32_t pad = rec.min_pos > 0 ? (uint32_t)rec.min_pos : 0;
    put_u32(out, pad + rec.n_cells);
    for (uint32_t i = 0; i < pad; ++i) {
        put_u32(out, i);
        put_u32(out, 1);
        put_zeros(out, rec.cell_bytes - k_seq_state_cell_bytes);
        put_u32(out, (uint32_t)seq);
    }
    const size_t cells_at = out.size();
    put_bytes(out, src.data() + rec.begin + 4, (size_t)rec.n_cells * rec.cell_bytes);
    stream_record moved = rec;
    moved.begin = cells_at - 4;
    set_record_seq(out.data() + moved.begin, moved, seq);
    walk_tensors(src, rec, [&](size_t at, size_t n) { put_bytes(out, src.data() + at, n); },
                 [&](size_t at, size_t row) {
                     put_zeros(out, (size_t)pad * row);
                     put_bytes(out, src.data() + at, (size_t)rec.n_cells * row);
                 });
}

void append_trailer(std::vector<uint8_t> & out, size_t llama_bytes,
                    std::span<const std::pair<pos_t, std::span<const uint8_t>>> entries) {
    if (entries.empty()) return;
    for (const auto & [n, payload] : entries) {
        put_u32(out, (uint32_t)n);
        put_u64(out, payload.size());
        put_bytes(out, payload.data(), payload.size());
    }
    put_u64(out, llama_bytes);
    put_u32(out, (uint32_t)entries.size());
    put_u32(out, k_checkpoint_magic);
}

result<state_part> parse_partial(std::span<const uint8_t> bytes, const state_layout & layout) {
    if (!layout.has_partial()) return bad_state("a checkpoint for a model without a window or recurrent state");
    state_reader r{bytes};
    auto p = layout.recurrent ? read_recurrent_part(r) : read_kv_part(r, 0, 1, layout.cell_ext);
    if (!p.ok()) return p.error();
    if (r.at != bytes.size()) return bad_state("bytes after a checkpoint");
    return p;
}

result<parsed_state> parse_seq_state(std::span<const uint8_t> bytes, int32_t seq, uint32_t n_stream_expected,
                                     const state_layout & layout) {
    parsed_state out;
    WARMCTX_RETURN_IF_ERROR(read_trailer(bytes, layout, out));
    state_reader r{bytes};
    r.limit = out.llama_end;
    uint32_t magic = 0, id = 0;
    if (!r.u32(magic) || magic != k_seq_state_magic) return bad_state("not llama.cpp's sequence state magic");
    if (!r.u32(id) || (int32_t)id != seq)
        return bad_state("made for sequence " + std::to_string((int32_t)id) + ", expected " + std::to_string(seq));
    for (uint32_t i = 0; i < layout.n_kv_parts; ++i) {
        auto p = read_kv_part(r, seq, n_stream_expected, layout.cell_ext);
        if (!p.ok()) return p.error();
        out.parts.push_back(*p);
    }
    if (layout.recurrent) {
        auto p = read_recurrent_part(r);
        if (!p.ok()) return p.error();
        out.parts.push_back(*p);
    }
    if (r.left() != 0)
        return bad_state(std::to_string(r.left()) + " bytes after the memory's parts (another memory type)");
    // The parts agree on where the sequence ends.
    const pos_t n = out.n_tokens();
    for (size_t i = 1; i < out.parts.size(); ++i) {
        const state_part & p = out.parts[i];
        const pos_t end = p.recurrent ? p.recurrent_pos + 1 : (p.record ? p.record->max_pos + 1 : 0);
        if (end != n)
            return bad_state("a part ends at " + std::to_string(end) + " where the first ends at " + std::to_string(n));
    }
    for (const auto & c : out.checkpoints)
        if (c.n_tokens >= n && n > 0) return bad_state("a checkpoint at or past the state's end");
    return out;
}

status truncate_state(std::vector<uint8_t> & state, pos_t n_keep, const state_layout & layout) {
    if (n_keep < 0) return invalid_argument("truncate_seq_state: a negative token count");
    // The whole state is checked first, so an error leaves it unchanged.
    int32_t id = 0;
    if (state.size() >= 8) std::memcpy(&id, state.data() + 4, 4);
    auto parsed = parse_seq_state(state, id, 0, layout);
    if (!parsed.ok()) return parsed.error();
    // Its tokens: the first KV part's cells (the recurrent cell's position, for a model
    // with no attention), which must be positions 0..n-1 in order.
    const state_part & first = parsed->parts.front();
    const pos_t n = first.recurrent ? parsed->n_tokens() : (first.record ? (pos_t)first.record->n_cells : 0);
    if (n_keep > n)
        return out_of_range("truncate_seq_state: the state holds " + std::to_string(n) + " tokens, not " +
                            std::to_string(n_keep));
    const std::span<const uint8_t> src(state);
    if (!first.recurrent && first.record)
        WARMCTX_RETURN_IF_ERROR(check_positions(src, *first.record, (uint32_t)n_keep));
    const checkpoint_ref * ckpt = nullptr;
    if (layout.has_partial() && n_keep < n) {
        for (const auto & c : parsed->checkpoints)
            if (c.n_tokens == n_keep) ckpt = &c;
        if (!ckpt)
            return out_of_range("truncate_seq_state: no checkpoint at " + std::to_string(n_keep) +
                                " tokens (this model's window or recurrent state cannot be cut back without one)");
    }
    if (n_keep == n) return {};
    std::vector<uint8_t> out;
    out.reserve(state.size());
    put_u32(out, k_seq_state_magic);
    put_u32(out, (uint32_t)id);
    const size_t n_parts = parsed->parts.size();
    for (size_t i = 0; i < n_parts; ++i) {
        const state_part & p = parsed->parts[i];
        const bool last_partial = ckpt && i + 1 == n_parts;
        if (last_partial && p.recurrent) {
            put_bytes(out, src.data() + ckpt->begin, ckpt->end - ckpt->begin);
        } else if (last_partial) {
            // The window at n_keep: the checkpoint's one record, in this state's form.
            auto payload = parse_partial(src.subspan(ckpt->begin, ckpt->end - ckpt->begin), layout);
            if (!payload.ok()) return payload.error();
            std::optional<stream_record> rec = payload->record;
            if (rec) rec->begin += ckpt->begin, rec->end += ckpt->begin;
            append_kv_part(out, src, rec, p.n_stream, parsed->parts.front().record_stream, id);
        } else {
            put_u32(out, p.n_stream);
            for (uint32_t s = 0; s < p.n_stream; ++s) {
                if (p.record && s == p.record_stream && n_keep > 0) {
                    WARMCTX_RETURN_IF_ERROR(append_cut_record(out, src, *p.record, (uint32_t)n_keep));
                } else {
                    put_u32(out, 0);
                }
            }
        }
    }
    const size_t llama_bytes = out.size();
    std::vector<std::pair<pos_t, std::span<const uint8_t>>> kept;
    for (const auto & c : parsed->checkpoints)
        if (c.n_tokens < n_keep) kept.push_back({c.n_tokens, src.subspan(c.begin, c.end - c.begin)});
    append_trailer(out, llama_bytes, kept);
    state = std::move(out);
    return {};
}

}  // namespace seq_state

status truncate_seq_state(std::vector<uint8_t> & state, pos_t n_tokens) {
    return seq_state::truncate_state(state, n_tokens, seq_state::state_layout{});
}

}  // namespace warmctx
