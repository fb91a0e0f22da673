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
    size_t left() const { return b.size() - at; }
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
    return corrupt("sequence state: " + why + " (only the state of a plain attention KV cache is supported)");
}

// Parses one stream record at r.at. `seq`: the seq id every cell must carry.
result<stream_record> read_stream_record(state_reader & r, int32_t seq) {
    stream_record rec;
    rec.begin = r.at;
    if (!r.u32(rec.n_cells)) return bad_state("truncated before a stream's cell count");
    if (rec.n_cells == 0) {
        rec.end = r.at;
        return rec;
    }
    if (rec.n_cells > r.left() / k_seq_state_cell_bytes) return bad_state("more cells than bytes");
    for (uint32_t i = 0; i < rec.n_cells; ++i) {
        uint32_t pos = 0, n_seq = 0, id = 0;
        (void)r.u32(pos), (void)r.u32(n_seq), (void)r.u32(id);
        if (n_seq != 1) return bad_state("a cell shared by " + std::to_string(n_seq) + " sequences");
        if ((int32_t)id != seq)
            return bad_state("a cell of sequence " + std::to_string((int32_t)id) + " in the state of sequence " +
                             std::to_string(seq));
        if ((int32_t)pos < 0) return bad_state("a negative position");
        rec.max_pos = std::max(rec.max_pos, (pos_t)(int32_t)pos);
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

}  // namespace

void put_u32(std::vector<uint8_t> & out, uint32_t v) {
    const size_t at = out.size();
    out.resize(at + 4);
    std::memcpy(out.data() + at, &v, 4);
}

void set_record_seq(uint8_t * copy, const stream_record & rec, int32_t seq) {
    for (uint32_t i = 0; i < rec.n_cells; ++i) std::memcpy(copy + 4 + (size_t)i * k_seq_state_cell_bytes + 8, &seq, 4);
}

void append_record(std::vector<uint8_t> & out, std::span<const uint8_t> state, const stream_record & rec,
                   int32_t seq) {
    const size_t at = out.size();
    out.insert(out.end(), state.begin() + (long)rec.begin, state.begin() + (long)rec.end);
    set_record_seq(out.data() + at, rec, seq);
}


result<parsed_state> parse_seq_state(std::span<const uint8_t> bytes, int32_t seq, uint32_t n_stream_expected) {
    state_reader r{bytes};
    uint32_t magic = 0, id = 0, n_stream = 0;
    if (!r.u32(magic) || magic != k_seq_state_magic) return bad_state("not llama.cpp's sequence state magic");
    if (!r.u32(id) || (int32_t)id != seq)
        return bad_state("made for sequence " + std::to_string((int32_t)id) + ", expected " + std::to_string(seq));
    if (!r.u32(n_stream) || n_stream == 0) return bad_state("no KV stream");
    if (n_stream_expected != 0 && n_stream != n_stream_expected)
        return bad_state(std::to_string(n_stream) + " KV streams where " + std::to_string(n_stream_expected) +
                         " were expected");
    parsed_state out;
    for (uint32_t s = 0; s < n_stream; ++s) {
        auto rec = read_stream_record(r, seq);
        if (!rec.ok()) return rec.error();
        if (rec->n_cells == 0) continue;
        if (out.record) return bad_state("the sequence has cells in two KV streams");
        out.record = *rec;
    }
    if (r.left() != 0)
        return bad_state(std::to_string(r.left()) + " bytes after the KV cache's streams (another memory type)");
    return out;
}


}  // namespace seq_state

using namespace seq_state;

status truncate_seq_state(std::vector<uint8_t> & state, pos_t n_keep) {
    if (n_keep < 0) return invalid_argument("truncate_seq_state: a negative token count");
    // The whole state is checked first (one non-empty stream, every size within the
    // bytes, nothing after them), so an error leaves it unchanged.
    int32_t id = 0;
    if (state.size() >= 8) std::memcpy(&id, state.data() + 4, 4);
    if (auto whole = parse_seq_state(state, id, 0); !whole.ok()) return whole.error();
    state_reader r{state};
    uint32_t magic = 0, n_stream = 0, id_again = 0;
    (void)r.u32(magic), (void)r.u32(id_again), (void)r.u32(n_stream);
    // Compacts record by record towards the front: the write cursor never passes the
    // read cursor, so memmove over the same buffer is safe.
    uint8_t * b = state.data();
    size_t w = r.at;
    auto put = [&](size_t from, size_t n) {
        if (n > 0 && w != from) std::memmove(b + w, b + from, n);
        w += n;
    };
    bool kept = false;
    for (uint32_t s = 0; s < n_stream; ++s) {
        auto rec = read_stream_record(r, id);  // sizes checked above
        if (!rec.ok()) return rec.error();
        const uint32_t n_cells = rec->n_cells;
        if (n_cells == 0) {
            put(rec->begin, 4);
            continue;
        }
        if ((uint64_t)n_keep > n_cells)
            return out_of_range("truncate_seq_state: the state holds " + std::to_string(n_cells) + " tokens, not " +
                                std::to_string(n_keep));
        const size_t cells = rec->begin + 4;
        for (pos_t i = 0; i < n_keep; ++i) {
            uint32_t pos = 0;
            std::memcpy(&pos, b + cells + (size_t)i * k_seq_state_cell_bytes, 4);
            if ((pos_t)pos != i) return bad_state("cell " + std::to_string(i) + " holds position " + std::to_string(pos));
        }
        kept = true;
        const uint32_t k = (uint32_t)n_keep;
        std::memcpy(b + w, &k, 4);
        w += 4;
        if (k == 0) continue;
        put(cells, (size_t)k * k_seq_state_cell_bytes);
        size_t at = cells + (size_t)n_cells * k_seq_state_cell_bytes;
        uint32_t v_trans = 0, n_layer = 0;
        std::memcpy(&v_trans, b + at, 4);
        std::memcpy(&n_layer, b + at + 4, 4);
        put(at, 8);
        at += 8;
        for (int part = 0; part < 2; ++part) {
            for (uint32_t l = 0; l < n_layer; ++l) {
                if (part == 0 || v_trans == 0) {
                    uint64_t row_bytes = 0;
                    std::memcpy(&row_bytes, b + at + 4, 8);
                    put(at, 12);
                    at += 12;
                    put(at, (size_t)(k * row_bytes));
                    at += (size_t)(n_cells * row_bytes);
                } else {
                    uint32_t elem_bytes = 0, n_embd = 0;
                    std::memcpy(&elem_bytes, b + at + 4, 4);
                    std::memcpy(&n_embd, b + at + 8, 4);
                    put(at, 12);
                    at += 12;
                    for (uint32_t j = 0; j < n_embd; ++j) {
                        put(at, (size_t)k * elem_bytes);
                        at += (size_t)n_cells * elem_bytes;
                    }
                }
            }
        }
    }
    if (!kept && n_keep > 0) return out_of_range("truncate_seq_state: the state holds no tokens");
    state.resize(w);
    return {};
}

}  // namespace warmctx
