// The learned order of a workspace's stable segments and its finer blocks
// (warmctx/volatility.h says what and why).
#include "warmctx/volatility.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <unordered_map>

#include "warmctx/assembler.h"
#include "util/json.h"
#include "warmctx/manifest.h"
#include "warmctx/text_model.h"

namespace warmctx {

std::vector<size_t> line_block_cuts(std::string_view t, size_t block_bytes, bool any_line) {
    std::vector<size_t> cuts;
    if (block_bytes == 0) block_bytes = 1;
    size_t last = 0;
    for (size_t p = block_bytes; p < t.size() && cuts.size() < k_line_block_max_cuts; ++p) {
        if (p - last < block_bytes || !(any_line ? is_any_line_cut(t, p) : is_line_cut(t, p))) continue;
        cuts.push_back(p);
        last = p;
        p = last + block_bytes - 1;  // the loop's ++p lands on last + block_bytes
    }
    return cuts;
}

bool is_reorderable(const segment & s, const kind_table & kinds) {
    return kinds.policy(s.kind).how_stable == stability::stable && s.kind != segment_kind::tools;
}

hash128 segment_content_hash(const segment & s) {
    if (s.tool_calls.empty() && s.tool_call_id.empty() && s.header) return hash_string(s.content);
    std::string all = s.header ? s.content : "\x1dno-header\x1d" + s.content;
    all += '\x1f';
    all += s.tool_calls;
    all += '\x1f';
    all += s.tool_call_id;
    return hash_string(all);
}

namespace {

uint64_t window_mask(uint32_t n) { return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1; }

}  // namespace

uint32_t segment_volatility::n_changes(uint32_t window) const {
    return (uint32_t)std::popcount(changed_bits & window_mask(std::min(window, n_observed)));
}

double segment_volatility::rate(uint32_t window) const {
    const uint32_t n = std::min(window, n_observed);
    return n == 0 ? 0.0 : (double)n_changes(window) / n;
}

namespace {

// One stable segment as the decision sees it.
struct item {
    const segment * s = nullptr;
    size_t run = 0;            // which run of same-class stable segments it is in
    uint64_t bytes = 0;
    bool changed_now = false;  // its content differs from the workspace's last turn
    bool fine = false;         // cut finer since an earlier change
    uint64_t fine_from = UINT64_MAX;  // where its finer blocks begin (UINT64_MAX: not fine)
    uint32_t changes = 0;      // in the window, this turn included
    uint32_t observed = 0;     // turns in the window, this turn included
    double rank_rate = 0;      // its rate once it changed min_changes times, else 0
};

// E[bytes re-prefilled per turn] when the segments sit in `order`: the first segment
// that changes costs the half of itself after the change (on average) and everything
// after it; segments change independently at their rates.
double expected_cost(const std::vector<const item *> & order) {
    double cost = 0, none_before = 1, after = 0;
    for (const item * it : order) after += (double)it->bytes;
    for (const item * it : order) {
        after -= (double)it->bytes;
        cost += none_before * it->rank_rate * ((double)it->bytes / 2 + after);
        none_before *= 1 - it->rank_rate;
    }
    return cost;
}

// Bytes from position i to the end of `order`.
double tail_bytes(const std::vector<const item *> & order, size_t i) {
    double t = 0;
    for (; i < order.size(); ++i) t += (double)order[i]->bytes;
    return t;
}

std::string describe_moves(const std::vector<const item *> & cur, const std::vector<const item *> & cand) {
    std::string out;
    for (size_t i = 0; i < cand.size(); ++i) {
        if (cand[i] == cur[i] || cand[i]->rank_rate <= 0) continue;
        char buf[96];
        std::snprintf(buf, sizeof buf, " (changed in %u of the last %u turns)", cand[i]->changes, cand[i]->observed);
        out += (out.empty() ? "'" : ", '") + cand[i]->s->id + "'" + buf;
    }
    return out.empty() ? "rarely changed segments earlier" : out + " later";
}

// The order this turn is assembled in (d.hints.order, d.reordered, d.note): `cur`, the
// current one, or a candidate that pays for itself within the horizon.
void choose_order(order_decision & d, const std::vector<const item *> & cur, const volatility_options & o) {
    // Within each run, rarely changed first; ties keep the current order.
    auto sorted_from = [&cur](size_t from) {
        std::vector<const item *> v = cur;
        std::stable_sort(v.begin() + (long)std::min(from, v.size()), v.end(), [](const item * a, const item * b) {
            return a->run != b->run ? a->run < b->run : a->rank_rate < b->rank_rate;
        });
        return v;
    };
    auto ids = [](const std::vector<const item *> & v) {
        std::vector<std::string> out;
        for (const item * it : v) out.push_back(it->s->id);
        return out;
    };
    d.hints.order = ids(cur);
    // This turn's own edits already re-prefill from the first changed segment on (from
    // about its middle, with finer blocks): a reorder costs only what lies before that.
    double forced = 0;
    size_t first_changed = cur.size();
    for (size_t i = 0; i < cur.size(); ++i)
        if (cur[i]->changed_now) {
            forced = tail_bytes(cur, i) - (double)cur[i]->bytes / 2;
            first_changed = i;
            break;
        }
    // The candidates: every stable segment sorted; and at an edit, only what this turn
    // re-prefills anyway sorted - from the edited segment on (its head before the edit
    // moves too: about half of it), or after it (free). The one that pays best is taken.
    struct candidate {
        std::vector<const item *> order;
        size_t first_diff = 0;
        double saving = 0, cost = 0;
    };
    const double now = expected_cost(cur), total = tail_bytes(cur, 0);
    auto make = [&](std::vector<const item *> v) {
        candidate c;
        c.order = std::move(v);
        while (c.first_diff < cur.size() && cur[c.first_diff] == c.order[c.first_diff]) ++c.first_diff;
        c.saving = now - expected_cost(c.order);
        c.cost = std::max(0.0, tail_bytes(cur, c.first_diff) - forced);
        return c;
    };
    const candidate whole = make(sorted_from(0));
    if (whole.first_diff == cur.size()) return;
    std::vector<candidate> cands{whole};
    if (first_changed < cur.size()) {
        cands.push_back(make(sorted_from(first_changed)));
        cands.push_back(make(sorted_from(first_changed + 1)));
    }
    const candidate * best = nullptr;
    for (const candidate & c : cands) {
        if (c.first_diff == cur.size() || c.saving * o.horizon_turns <= c.cost ||
            c.saving < o.min_saving_fraction * total)
            continue;
        if (!best || c.saving * o.horizon_turns - c.cost > best->saving * o.horizon_turns - best->cost) best = &c;
    }
    auto numbers = [&](const candidate & c) {
        char nums[200];
        std::snprintf(nums, sizeof nums,
                      "expected saving %.0f bytes a turn over %u turns against a reorder cost of %.0f bytes this turn",
                      c.saving, o.horizon_turns, c.cost);
        return std::string(nums);
    };
    if (best) {
        d.hints.order = ids(best->order);
        d.reordered = true;
        d.note = "stable order changed: " + describe_moves(cur, best->order) + "; " + numbers(*best);
    } else {
        d.note =
            "stable order kept: moving " + describe_moves(cur, whole.order) + " would not pay (" + numbers(whole) + ")";
    }
}

}  // namespace

order_decision decide_order(const volatility_state & st, std::span<const segment> segs, const kind_table & kinds,
                            const volatility_options & o) {
    order_decision d;
    if (!o.enabled) return d;
    // The stable segments in the order the state gives them now, and their rates with
    // this turn counted.
    std::vector<item> items;
    std::vector<const segment *> order = ordered_segments(segs, kinds, st.order);
    for (size_t i = 0; i < order.size(); ++i) {
        const kind_policy & p = kinds.policy(order[i]->kind);
        if (!is_reorderable(*order[i], kinds)) continue;
        item it;
        it.s = order[i];
        const bool joins = !items.empty() && items.back().s == order[i - 1] &&
                           kinds.policy(items.back().s->kind).retention == p.retention;
        it.run = items.empty() ? 0 : items.back().run + (joins ? 0 : 1);
        it.bytes = order[i]->content.size() + order[i]->path.size() + 16;
        std::vector<uint64_t> & digest = d.digests[order[i]->id];
        auto h = st.segs.find(order[i]->id);
        const bool same = h != st.segs.end() && h->second.content_hash == segment_content_hash(*order[i]);
        // An unchanged segment's digest is the one kept: hashed again only when it changed.
        digest = same && !h->second.digest.empty() ? h->second.digest : content_digest(order[i]->content);
        if (h != st.segs.end()) {
            segment_volatility v = h->second;
            it.changed_now = !same;
            it.fine_from = v.fine ? v.fine_from : UINT64_MAX;
            if (it.changed_now) {  // the edit's first block: finer blocks from there on
                size_t k = 0;
                while (k < v.digest.size() && k < digest.size() && v.digest[k] == digest[k]) ++k;
                it.fine_from = std::min<uint64_t>(it.fine_from, (uint64_t)k * k_edit_digest_bytes);
            }
            it.fine = v.fine;
            v.changed_bits = (v.changed_bits << 1) | (it.changed_now ? 1 : 0);
            v.n_observed = std::min<uint32_t>(v.n_observed + 1, 64);
            it.changes = v.n_changes(o.window_turns);
            it.observed = std::min(o.window_turns, v.n_observed);
            if (it.changes >= std::max<uint32_t>(o.min_changes, 1)) it.rank_rate = v.rate(o.window_turns);
        }
        if (it.changes > 0 || it.fine) {
            d.hints.fine.push_back(it.s->id);
            if (it.fine_from > 0 && it.fine_from != UINT64_MAX) d.hints.fine_from[it.s->id] = it.fine_from;
        }
        items.push_back(it);
    }
    // This request, and the turns before it, did not carry their last segment (their
    // first chat message) forward.
    d.hints.fuse_generation_prompt = !st.tail.carried_by(order) && st.tail.habit();
    // A conversation of one message (a question alone) has no boundary to save.
    const auto n_chat =
        std::count_if(order.begin(), order.end(), [](const segment * s) { return is_chat_message(*s); });
    d.hints.fuse_conversation = n_chat >= 2 && !st.head.carried_by(order) && st.head.habit();
    std::vector<const item *> cur;
    for (const item & it : items) cur.push_back(&it);
    choose_order(d, cur, o);
    return d;
}

bool carry_watch::carried_by(std::span<const segment * const> order) const {
    return has && index < order.size() && segment_content_hash(*order[index]) == hash;
}

void carry_watch::observe(const manifest & prompt_manifest, std::optional<size_t> at) {
    if (has) {
        const bool carried =
            index < prompt_manifest.segments.size() && prompt_manifest.segments[index].content_hash == hash;
        carried_bits = (carried_bits << 1) | (carried ? 1 : 0);
        observed = std::min<uint32_t>(observed + 1, 64);
    }
    has = at.has_value() && *at < prompt_manifest.segments.size();
    if (has) {
        hash = prompt_manifest.segments[*at].content_hash;
        index = (uint32_t)*at;
    }
}

bool carry_watch::habit() const {
    const uint32_t past = k_fuse_after_turns - 1;
    const uint64_t recent = (uint64_t{1} << past) - 1;
    return observed >= past && (carried_bits & recent) == 0;
}

std::vector<uint64_t> content_digest(std::string_view content) {
    std::vector<uint64_t> out;
    for (size_t at = 0; at < content.size(); at += k_edit_digest_bytes)
        out.push_back(hash_bytes(content.data() + at, std::min(k_edit_digest_bytes, content.size() - at)).lo);
    return out;
}

bool observe_turn(volatility_state & st, const manifest & prompt_manifest, std::optional<size_t> first_chat,
                  const assembly_hints & hints,
                  const std::map<std::string, std::vector<uint64_t>> & digests) {
    const std::vector<std::string> order_before = st.order;
    size_t fine_before = 0, fine_after = 0;
    for (const auto & [id, v] : st.segs) fine_before += v.fine;
    const bool tail_before = st.tail.habit(), head_before = st.head.habit();
    std::map<std::string, segment_volatility> next;
    std::vector<std::string> order;
    for (const manifest_entry & e : prompt_manifest.segments) {
        if (e.how_stable != stability::stable) continue;
        order.push_back(e.id);
        segment_volatility v;
        if (auto h = st.segs.find(e.id); h != st.segs.end()) {
            v = h->second;
            const bool changed = v.content_hash != e.content_hash;
            v.changed_bits = (v.changed_bits << 1) | (changed ? 1 : 0);
            v.n_observed = std::min<uint32_t>(v.n_observed + 1, 64);
            v.fine = v.fine || changed;
        }
        if (v.fine) {
            auto f = hints.fine_from.find(e.id);
            v.fine_from = f == hints.fine_from.end() ? 0 : f->second;
        }
        auto dg = digests.find(e.id);
        v.digest = dg == digests.end() ? std::vector<uint64_t>{} : dg->second;
        v.content_hash = e.content_hash;
        v.content_bytes = e.content_bytes;
        next[e.id] = v;
    }
    st.segs = std::move(next);
    st.order = std::move(order);
    st.n_turns++;
    st.tail.observe(prompt_manifest, prompt_manifest.segments.empty()
                                         ? std::nullopt
                                         : std::optional<size_t>(prompt_manifest.segments.size() - 1));
    st.head.observe(prompt_manifest, first_chat < prompt_manifest.segments.size() ? first_chat : std::nullopt);
    for (const auto & [id, v] : st.segs) fine_after += v.fine;
    return st.order != order_before || fine_after != fine_before || st.tail.habit() != tail_before ||
           st.head.habit() != head_before;
}

namespace {
constexpr std::string_view k_volatility_format = "warmctx-volatility-v1";

// A digest as 16 lower-case hex digits per block, and back (nullopt: not that).
std::string digest_hex(const std::vector<uint64_t> & d) {
    std::string out;
    char buf[17];
    for (uint64_t x : d) {
        std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)x);
        out += buf;
    }
    return out;
}

std::optional<std::vector<uint64_t>> digest_from_hex(std::string_view s) {
    if (s.size() % 16 != 0) return std::nullopt;
    std::vector<uint64_t> out;
    for (size_t at = 0; at < s.size(); at += 16) {
        uint64_t x = 0;
        for (char c : s.substr(at, 16)) {
            const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (v < 0) return std::nullopt;
            x = x << 4 | (uint64_t)v;
        }
        out.push_back(x);
    }
    return out;
}

// "<name>_carried_bits", "<name>_observed" and "last_<name>": {"content_hash", "index"}.
void watch_to_json(nlohmann::json & j, const std::string & name, const carry_watch & w) {
    j[name + "_carried_bits"] = w.carried_bits;
    j[name + "_observed"] = w.observed;
    if (w.has) j["last_" + name] = {{"content_hash", w.hash.hex()}, {"index", w.index}};
}

status watch_from_json(const nlohmann::json & j, const std::string & name, carry_watch & w) {
    auto bad = [](const std::string & what) { return invalid_argument("volatility state: " + what); };
    const std::string bits = name + "_carried_bits", observed = name + "_observed", last = "last_" + name;
    if (j.contains(bits) || j.contains(observed)) {
        if (!j.contains(bits) || !j[bits].is_number_unsigned() || !j.contains(observed) ||
            !j[observed].is_number_unsigned())
            return bad(bits + ", " + observed);
        w.carried_bits = j[bits].get<uint64_t>();
        w.observed = (uint32_t)std::min<uint64_t>(j[observed].get<uint64_t>(), 64);
    }
    if (j.contains(last)) {
        const nlohmann::json & t = j[last];
        if (!t.is_object() || !t.contains("content_hash") || !t["content_hash"].is_string() || !t.contains("index") ||
            !t["index"].is_number_unsigned() || t["index"].get<uint64_t>() > UINT32_MAX)
            return bad(last);
        auto h = parse_hash128(t["content_hash"].get<std::string>());
        if (!h.ok()) return bad(last + ": content_hash");
        w.hash = *h;
        w.index = (uint32_t)t["index"].get<uint64_t>();
        w.has = true;
    }
    return {};
}
}  // namespace

std::string volatility_to_json(const volatility_state & st) {
    nlohmann::json segs = nlohmann::json::object();
    for (const auto & [id, v] : st.segs)
        segs[id] = {{"content_hash", v.content_hash.hex()}, {"content_bytes", v.content_bytes},
                    {"changed_bits", v.changed_bits}, {"n_observed", v.n_observed}, {"fine", v.fine},
                    {"fine_from", v.fine_from}, {"digest", digest_hex(v.digest)}};
    nlohmann::json j = {{"format", k_volatility_format}, {"n_turns", st.n_turns}, {"order", st.order}, {"segs", segs}};
    watch_to_json(j, "tail", st.tail);
    watch_to_json(j, "head", st.head);
    return dump_json(j);
}

result<volatility_state> volatility_from_json(std::string_view text) {
    auto parsed = parse_json(text);
    if (!parsed.ok()) return invalid_argument("volatility state: " + parsed.error().message());
    const nlohmann::json & j = *parsed;
    auto bad = [](const std::string & what) { return invalid_argument("volatility state: " + what); };
    if (!j.is_object() || !j.contains("format") || j["format"] != k_volatility_format)
        return bad("not " + std::string(k_volatility_format));
    volatility_state st;
    if (!j.contains("n_turns") || !j["n_turns"].is_number_unsigned()) return bad("n_turns");
    st.n_turns = j["n_turns"].get<uint64_t>();
    if (!j.contains("order") || !j["order"].is_array()) return bad("order");
    for (const auto & id : j["order"]) {
        if (!id.is_string()) return bad("order: an id that is not a string");
        st.order.push_back(id.get<std::string>());
    }
    if (!j.contains("segs") || !j["segs"].is_object()) return bad("segs");
    for (const auto & [id, v] : j["segs"].items()) {
        if (!v.is_object() || !v.contains("content_hash") || !v["content_hash"].is_string() ||
            !v.contains("content_bytes") || !v["content_bytes"].is_number_unsigned() || !v.contains("changed_bits") ||
            !v["changed_bits"].is_number_unsigned() || !v.contains("n_observed") ||
            !v["n_observed"].is_number_unsigned() || !v.contains("fine") || !v["fine"].is_boolean())
            return bad("segment '" + id.substr(0, 64) + "'");
        auto h = parse_hash128(v["content_hash"].get<std::string>());
        if (!h.ok()) return bad("segment '" + id.substr(0, 64) + "': content_hash");
        segment_volatility s;
        s.content_hash = *h;
        s.content_bytes = v["content_bytes"].get<uint64_t>();
        s.changed_bits = v["changed_bits"].get<uint64_t>();
        s.n_observed = (uint32_t)std::min<uint64_t>(v["n_observed"].get<uint64_t>(), 64);
        s.fine = v["fine"].get<bool>();
        // Absent in files written before they were kept: finer blocks from the start, and
        // the next edit located at the start.
        if (v.contains("fine_from")) {
            if (!v["fine_from"].is_number_unsigned()) return bad("segment '" + id.substr(0, 64) + "': fine_from");
            s.fine_from = v["fine_from"].get<uint64_t>();
        }
        if (v.contains("digest")) {
            auto dg = v["digest"].is_string() ? digest_from_hex(v["digest"].get<std::string>()) : std::nullopt;
            if (!dg) return bad("segment '" + id.substr(0, 64) + "': digest");
            s.digest = std::move(*dg);
        }
        st.segs[id] = s;
    }
    // Whether turns carry their last segment (first chat message) forward; absent in
    // files written before it was kept: nothing learned.
    WARMCTX_RETURN_IF_ERROR(watch_from_json(j, "tail", st.tail));
    WARMCTX_RETURN_IF_ERROR(watch_from_json(j, "head", st.head));
    return st;
}

}  // namespace warmctx
