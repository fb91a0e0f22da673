// The readers of llama.cpp's saved sequence state (src/engine/seq_state.cpp) on arbitrary
// bytes: a snapshot file's KV section is whatever the disk holds, and the pool cuts saved
// states in RAM (truncate_seq_state).
//
// The first input byte picks a mode: odd, the rest of the input is taken as a state as it
// is; even, a well-formed state is built from the next bytes (stream count, cells, layers,
// V transposed or not, row sizes) and then one byte of it, chosen by the input, is
// replaced - so the fuzzer reaches the cutting code behind the parser's checks.
// Each state is parsed, and cut at a token count the input chooses.
//
// Checks, besides no crash and no read or write outside the buffer: a refusal is
// corrupt, out_of_range or invalid_argument; an accepted cut is never longer than the
// state, parses again, holds exactly the tokens asked for at positions 0..n-1, and
// cutting it again at the same count leaves it unchanged; a well-formed state cut at its
// own length is unchanged.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#include "seq_state.h"
#include "warmctx/engine.h"

using namespace warmctx;
using namespace warmctx::seq_state;

namespace {

struct input {
    const uint8_t * p;
    size_t n;
    uint8_t byte() {
        if (n == 0) return 0;
        --n;
        return *p++;
    }
    uint32_t u16() { return (uint32_t)byte() | (uint32_t)byte() << 8; }
};

// A well-formed state: n_stream streams, one of which holds `cells` cells at positions
// 0..cells-1 of sequence `seq`.
std::vector<uint8_t> build_state(input & in, int32_t seq, uint32_t & cells_out) {
    const uint32_t n_stream = 1 + in.byte() % 4, holder = in.byte() % n_stream;
    const uint32_t cells = in.byte() % 40, n_layer = 1 + in.byte() % 3, v_trans = in.byte() & 1;
    const uint64_t row = 1 + in.byte() % 16;
    const uint32_t elem = 1 + in.byte() % 4, n_embd = 1 + in.byte() % 6;
    cells_out = cells;
    std::vector<uint8_t> b;
    put_u32(b, k_seq_state_magic);
    put_u32(b, (uint32_t)seq);
    put_u32(b, n_stream);
    for (uint32_t s = 0; s < n_stream; ++s) {
        if (s != holder || cells == 0) {
            put_u32(b, 0);
            continue;
        }
        put_u32(b, cells);
        for (uint32_t i = 0; i < cells; ++i) {
            put_u32(b, i);
            put_u32(b, 1);
            put_u32(b, (uint32_t)seq);
        }
        put_u32(b, v_trans);
        put_u32(b, n_layer);
        uint8_t fill = 1;
        for (int part = 0; part < 2; ++part) {
            for (uint32_t l = 0; l < n_layer; ++l) {
                put_u32(b, 1);  // type
                if (part == 0 || v_trans == 0) {
                    const size_t at = b.size();
                    b.resize(at + 8);
                    std::memcpy(b.data() + at, &row, 8);
                    for (uint64_t k = 0; k < row * cells; ++k) b.push_back(fill++);
                } else {
                    put_u32(b, elem);
                    put_u32(b, n_embd);
                    for (uint64_t k = 0; k < (uint64_t)elem * n_embd * cells; ++k) b.push_back(fill++);
                }
            }
        }
    }
    return b;
}

bool allowed(status_code c) {
    return c == status_code::corrupt || c == status_code::out_of_range || c == status_code::invalid_argument;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    input in{data, size};
    const uint8_t mode = in.byte();
    const pos_t n_keep = (pos_t)(in.u16() % 64) - (in.byte() == 0xff ? 1 : 0);
    std::vector<uint8_t> state;
    uint32_t cells = 0;
    bool well_formed = false;
    if (mode & 1) {
        state.assign(in.p, in.p + in.n);
    } else {
        state = build_state(in, 7, cells);
        if (!state.empty() && in.n >= 3) {
            const size_t at = in.u16() % state.size();
            const uint8_t v = in.byte();
            if (mode & 2) state[at] = v;  // else leave it well formed
            else well_formed = true;
        } else {
            well_formed = true;
        }
    }
    int32_t id = 0;
    if (state.size() >= 8) std::memcpy(&id, state.data() + 4, 4);
    // The other memories' layouts (a sliding window's two KV parts, a hybrid's recurrent
    // part, cells with an extension) read the same bytes, their checkpoint trailer too:
    // refused as corrupt or out of range, or cut to a state that parses again.
    for (const state_layout layout : {state_layout{2, true, false, 0}, state_layout{1, false, true, 12},
                                      state_layout{0, false, true, 0}}) {
        auto p = parse_seq_state(state, id, 0, layout);
        if (!p.ok()) FUZZ_CHECK(p.error().code() == status_code::corrupt);
        auto c = state;
        status cs = truncate_state(c, n_keep, layout);
        if (!cs.ok()) {
            FUZZ_CHECK(allowed(cs.code()));
            FUZZ_CHECK(c == state);
        } else {
            FUZZ_CHECK(parse_seq_state(c, id, 0, layout).ok());
        }
    }
    auto parsed = parse_seq_state(state, id, 0);
    if (!parsed.ok()) FUZZ_CHECK(parsed.error().code() == status_code::corrupt);
    if (well_formed) {
        FUZZ_CHECK(parsed.ok());
        auto same = state;
        FUZZ_CHECK(truncate_seq_state(same, (pos_t)cells).ok());
        FUZZ_CHECK(same == state);
    }

    auto cut = state;
    status st = truncate_seq_state(cut, n_keep);
    if (!st.ok()) {
        FUZZ_CHECK(allowed(st.code()));
        return 0;
    }
    FUZZ_CHECK(n_keep >= 0);
    FUZZ_CHECK(cut.size() <= state.size());
    auto again = parse_seq_state(cut, id, 0);
    FUZZ_CHECK(again.ok());
    if (n_keep == 0) FUZZ_CHECK(!again->record().has_value());
    else FUZZ_CHECK(again->record() && (pos_t)again->record()->n_cells == n_keep && again->record()->max_pos == n_keep - 1);
    auto twice = cut;
    FUZZ_CHECK(truncate_seq_state(twice, n_keep).ok());
    FUZZ_CHECK(twice == cut);
    return 0;
}
