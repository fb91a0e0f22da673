// Tokenizing: segments rendered as messages one by one (the per-message path), and
// plain text on several threads when there is much of it.
#include "assembly.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "quote.h"

namespace warmctx {

using detail::message_content;
using detail::quote_input;

namespace {

// Stands in for a message's content when rendering its frame; cannot occur in a
// template's own text.
constexpr std::string_view k_content_sentinel = "\x1e\x1fwarmctx-content\x1f\x1e";

}  // namespace

std::string detail::message_text(const segment & s, const kind_policy & p) {
    if (!p.header || !s.header) return s.content;
    std::string c = "# ";
    c += segment_kind_name(s.kind);
    c += ": ";
    c += s.path.empty() ? s.id : s.path;
    c += '\n';
    c += s.content;
    return c;
}

std::string detail::message_content(const segment & s, const kind_policy & p) {
    std::string c = message_text(s, p);
    if (!s.tool_calls.empty()) {
        if (!c.empty()) c += '\n';
        c += s.tool_calls;
    }
    return c;
}

namespace {

// One segment rendered and tokenized alone: these tokens depend on this segment only.
// The frame (the template's text around the content) may hold control tokens; the
// content is plain text, whatever it contains. `content` is the content's tokens when
// already known.
result<std::vector<token_id>> tokenize_segment(const segment & s, const kind_policy & p, const std::string & role,
                                               const text_model & model,
                                               std::optional<std::vector<token_id>> content = std::nullopt) {
    const std::string where = "segment " + quote_input(s.id);
    auto frame = model.render_message(role, k_content_sentinel);
    if (!frame.ok()) return frame.error().with_context(where + ": rendering");
    const size_t at = frame->find(k_content_sentinel);
    if (at == std::string::npos)
        return failed_precondition("the chat template does not carry a message's content through verbatim");
    std::vector<token_id> toks;
    const std::string_view fv(*frame);
    for (int part = 0; part < 3; ++part) {
        if (part == 1 && content) {
            toks.insert(toks.end(), content->begin(), content->end());
            continue;
        }
        result<std::vector<token_id>> t = part == 0   ? model.tokenize(fv.substr(0, at))
                                          : part == 1 ? model.tokenize_plain(message_content(s, p))
                                                      : model.tokenize(fv.substr(at + k_content_sentinel.size()));
        if (!t.ok()) return t.error().with_context(where + ": tokenizing");
        toks.insert(toks.end(), t->begin(), t->end());
    }
    return toks;
}

// Below this much content still to tokenize, a prompt is tokenized on the calling
// thread: starting threads would cost more than they save. llama.cpp's tokenizer reads
// 2-3 MB/s on one thread, so 16 KiB is ~6 ms of work against ~50 us to start a thread
// (`warmctx-bench render --size 8192`, ~33 KB of new content, 2 cores: a cold assembly 11.9
// -> 8.8 ms with the Jinja template, 8.2 -> 4.5 with the built-in one, at 64 KiB -> 16 KiB).
// A prefill-ahead's lead (at most prefill_ahead_lead_bytes) is tokenized in parallel too.
constexpr size_t k_parallel_tokenize_min_bytes = 16 << 10;

// Runs one(i) for every i of `todo`. When the work is large (`todo_bytes` at least
// k_parallel_tokenize_min_bytes), it is spread over up to 8 threads, the largest item
// first on the least loaded thread; each item is done exactly once either way.
template <class Size, class One>
void run_spread(std::vector<size_t> todo, Size size_of, size_t todo_bytes, One one) {
    // Helper threads of all prompts being assembled at once (several server threads
    // may assemble at the same time) stay within the machine's cores.
    static std::atomic<int> helpers_in_use{0};
    // (hardware_concurrency reads sysfs on every call: once per process is enough.)
    static const int cores = (int)std::max(1u, std::thread::hardware_concurrency());
    int want = (int)std::min<size_t>({(size_t)cores, 8, todo.size()}) - 1;
    if (todo_bytes < k_parallel_tokenize_min_bytes) want = 0;
    int got = want > 0 ? helpers_in_use.fetch_add(want) : cores;
    const int n_helpers = std::clamp(cores - 1 - got, 0, std::max(want, 0));
    if (want > 0) helpers_in_use.fetch_sub(want - n_helpers);  // keep only what is used
    struct release {
        int n;
        ~release() { if (n > 0) helpers_in_use.fetch_sub(n); }
    } released{n_helpers};
    const size_t n_threads = (size_t)n_helpers + 1;
    if (n_threads < 2) {
        for (size_t i : todo) one(i);
        return;
    }
    std::sort(todo.begin(), todo.end(), [&](size_t a, size_t b) { return size_of(a) > size_of(b); });
    std::vector<std::vector<size_t>> work(n_threads);
    std::vector<size_t> load(n_threads, 0);
    for (size_t i : todo) {
        const size_t t = (size_t)(std::min_element(load.begin(), load.end()) - load.begin());
        work[t].push_back(i);
        load[t] += size_of(i) + 1;
    }
    std::vector<std::thread> threads;
    threads.reserve(n_threads - 1);
    for (size_t t = 1; t < n_threads; ++t)
        threads.emplace_back([&, t] { for (size_t i : work[t]) one(i); });
    for (size_t i : work[0]) one(i);
    for (auto & th : threads) th.join();
}

// A text at least this large is cut at line starts (text_model::plain_splits_at_lines)
// into parts of about k_part_bytes, so that one big segment spreads over threads too.
// Parts are small enough that 8 threads share a 47k-token prompt evenly: with 16 KiB
// parts one thread drew two of the nine largest and the others waited on it (a GPU
// host's cold S2 assembly, 12.9-18.1 ms of tokenizing, the slowest thread 16.7 ms, the
// fastest 6.5 ms); a part costs one tokenizer call more, nothing else.
constexpr size_t k_split_min_bytes = 8 << 10;
constexpr size_t k_part_bytes = 4 << 10;

// The parts of `t`: each cut is the first line start at or after k_part_bytes from the
// last cut whose first character is an ASCII letter or digit. Depends on the text only.
std::vector<std::string_view> cut_at_lines(std::string_view t) {
    std::vector<std::string_view> parts;
    size_t from = 0;
    while (t.size() - from >= k_part_bytes + k_part_bytes / 2) {
        size_t p = from + k_part_bytes;
        while (p < t.size() && !is_line_cut(t, p)) ++p;
        if (p >= t.size()) break;
        parts.push_back(t.substr(from, p - from));
        from = p;
    }
    parts.push_back(t.substr(from));
    return parts;
}


}  // namespace

std::vector<size_t> diff_unit_cuts(std::string_view t) {
    std::vector<size_t> cuts;
    size_t last = 0;
    bool hunk_seen = false;  // in the current file
    for (size_t p = 1; p < t.size() && cuts.size() < k_diff_max_cuts; ++p) {
        if (t[p - 1] != '\n') continue;
        const std::string_view line = t.substr(p);
        if (line.starts_with("diff --git ")) {
            cuts.push_back(p);
            last = p;
            hunk_seen = false;
        } else if (line.starts_with("@@ ")) {
            if (!hunk_seen || p - last >= k_diff_unit_min_bytes) {
                cuts.push_back(p);
                last = p;
            }
            hunk_seen = true;
        }
    }
    return cuts;
}

// Spread with run_spread; a large text cut with cut_at_lines.
std::vector<result<std::vector<token_id>>> detail::tokenize_plain_spread(const text_model & model,
                                                                         std::span<const std::string_view> texts) {
    struct part {
        size_t text;
        std::string_view s;
        bool whole;
        result<std::vector<token_id>> toks = std::vector<token_id>{};
    };
    std::vector<part> parts;
    std::vector<bool> in_parts(texts.size(), false);  // tokenized in more than one part
    size_t bytes = 0;
    const bool split = model.plain_splits_at_lines();
    for (size_t i = 0; i < texts.size(); ++i) {
        bytes += texts[i].size();
        if (!split || texts[i].size() < k_split_min_bytes) {
            parts.push_back({i, texts[i], true});
            continue;
        }
        auto cuts = cut_at_lines(texts[i]);
        in_parts[i] = cuts.size() > 1;
        for (std::string_view c : cuts) parts.push_back({i, c, !in_parts[i]});
    }
    std::vector<size_t> todo(parts.size());
    for (size_t j = 0; j < todo.size(); ++j) todo[j] = j;
    run_spread(todo, [&](size_t j) { return parts[j].s.size(); }, bytes, [&](size_t j) {
        parts[j].toks = parts[j].whole ? model.tokenize_plain(parts[j].s) : model.tokenize_plain_part(parts[j].s);
    });
    std::vector<result<std::vector<token_id>>> out(texts.size(), std::vector<token_id>{});
    for (part & p : parts) {
        if (!out[p.text].ok()) continue;
        if (!p.toks.ok()) {
            out[p.text] = p.toks.error();
            continue;
        }
        if (p.whole) out[p.text] = std::move(p.toks);
        else out[p.text]->insert(out[p.text]->end(), p.toks->begin(), p.toks->end());
    }
    for (size_t i = 0; i < texts.size(); ++i)
        if (out[i].ok() && in_parts[i]) model.remember_plain(texts[i], *out[i]);
    return out;
}

// Every segment's tokens, in `order`. Segments tokenize independently, so when a
// prompt has much content the model does not remember (a cold prompt), those
// contents are spread over threads (tokenize_plain_spread); the result does not
// depend on the split.
std::vector<result<std::vector<token_id>>> detail::tokenize_segments(std::span<const segment * const> order,
                                                                     std::span<const std::string> roles,
                                                                     const kind_table & kinds,
                                                                     const text_model & model) {
    std::vector<result<std::vector<token_id>>> out(order.size(), std::vector<token_id>{});
    std::vector<std::optional<std::vector<token_id>>> known(order.size());
    std::vector<std::string> contents(order.size());
    std::vector<size_t> todo;  // segments whose content is not remembered
    std::vector<std::string_view> texts;
    for (size_t i = 0; i < order.size(); ++i) {
        contents[i] = message_content(*order[i], kinds.policy(order[i]->kind));
        known[i] = model.remembered_plain(contents[i]);
        if (!known[i]) {
            todo.push_back(i);
            texts.push_back(contents[i]);
        }
    }
    auto toks = tokenize_plain_spread(model, texts);
    for (size_t k = 0; k < todo.size(); ++k) {
        if (toks[k].ok()) known[todo[k]] = std::move(*toks[k]);
        else out[todo[k]] = toks[k].error().with_context("segment " + quote_input(order[todo[k]]->id) + ": tokenizing");
    }
    for (size_t i = 0; i < order.size(); ++i)
        if (known[i])
            out[i] = tokenize_segment(*order[i], kinds.policy(order[i]->kind), roles[i], model, std::move(known[i]));
    return out;
}

}  // namespace warmctx
