// The conversation path: the segments rendered whole through the model's own template,
// cut into pieces (template_cuts.h), and each piece tokenized apart, run by run.
#include "assembly.h"
#include "template_cuts.h"

#include <algorithm>

#include "quote.h"
#include "warmctx/volatility.h"

namespace warmctx {

using detail::conversation_plan;
using detail::conversation_tokens;
using detail::quote_input;

namespace {

// F's text in [a, b), cut into runs of template text and data.
struct text_run {
    size_t begin = 0, end = 0;
    bool input = false;
};
std::vector<text_run> runs_in(const rendered_conversation & f, size_t a, size_t b) {
    std::vector<text_run> out;
    size_t prev = 0;
    for (const render_run & r : f.runs) {
        const size_t lo = std::max(prev, a), hi = std::min(r.end, b);
        if (lo < hi) {
            if (!out.empty() && out.back().input == r.input && out.back().end == lo) out.back().end = hi;
            else out.push_back({lo, hi, r.input});
        }
        prev = r.end;
        if (prev >= b) break;
    }
    if (f.runs.empty() && a < b) out.push_back({a, b, false});
    return out;
}

// The conversation rendered whole (F), and, when F was made from it, the whole
// skeleton's rendering and how it maps onto F.
struct whole_rendering {
    rendered_conversation f;
    std::optional<rendered_conversation> skel;
    std::optional<expanded_skeleton> expanded;  // its text moved into f
};

// F: from the skeleton when the template writes contents verbatim (the skeleton is
// the same turn after turn, so the text model remembers its rendering), else rendered
// with the real contents.
result<whole_rendering> render_whole(const conversation_plan & cp, const text_model & model,
                                     bool add_generation_prompt) {
    const size_t n = cp.msg_of.size();
    whole_rendering out;
    if (model.renders_contents_verbatim()) {
        auto ws = model.render_conversation(cp.skel, detail::tools_upto(cp, n), add_generation_prompt);
        if (ws.ok()) {
            out.expanded = expand_skeleton(*ws, cp.msgs);
            if (out.expanded) out.skel = std::move(*ws);
        }
    }
    result<rendered_conversation> f =
        out.expanded ? result<rendered_conversation>(std::move(out.expanded->text))
                     : model.render_conversation(cp.msgs, detail::tools_upto(cp, n), add_generation_prompt);
    if (!f.ok()) return f.error();
    out.f = std::move(*f);
    return out;
}

// A range of F whose tokens belong to one segment (or to the generation prompt).
struct span_of {
    size_t seg;  // the segment that ends the piece (n: the generation prompt)
    size_t a, b;
    bool diff = false;  // the piece is one segment's alone that may carry a diff
                        // (a diff, a chat message): cut at its units
    bool fine = false;  // the piece is one stable segment's alone, cut into finer
                        // blocks at line starts (warmctx/volatility.h)
    size_t fine_from = 0;  // its input's bytes before the first finer cut
};

// Pieces: a segment with a cut after it ends a piece; the generation prompt is the
// rest of F when the last segment has a cut, else part of the last piece. Sets
// piece_cls[i] for every segment.
std::vector<span_of> piece_spans(std::span<const segment * const> order, const kind_table & kinds,
                                 const std::vector<std::optional<size_t>> & cut, size_t f_size,
                                 bool add_generation_prompt, const std::vector<std::optional<size_t>> & fine,
                                 std::vector<retention_class> & piece_cls) {
    const size_t n = order.size();
    std::vector<span_of> spans;
    size_t from = 0, group = 0;
    retention_class group_cls = retention_class::highest;
    for (size_t k = 1; k <= n; ++k) {
        group_cls = std::min(group_cls, kinds.policy(order[k - 1]->kind).retention);
        const bool last = k == n;
        if (cut[k] || (last && !add_generation_prompt)) {
            const size_t to = last && !add_generation_prompt ? f_size : *cut[k];
            // A diff is cut at its files and hunks. A chat message is not: its parts
            // would each be a decode call of their own (on a GPU at depth a call costs
            // milliseconds whatever its size), and no other prompt reuses a prefix that
            // ends inside a message whose start differs (the chain hash covers all before).
            const segment_kind kind = order[k - 1]->kind;
            const bool alone = group == k - 1;
            spans.push_back({k - 1, from, to, alone && kind == segment_kind::diff, alone && fine[k - 1].has_value(),
                             alone && fine[k - 1] ? *fine[k - 1] : 0});
            for (size_t g = group; g < k; ++g) piece_cls[g] = group_cls;
            from = to;
            group = k;
            group_cls = retention_class::highest;
        }
    }
    if (group < n) {  // no cut after the last segment: it shares the generation prompt's piece
        spans.push_back({n - 1, from, f_size});
        for (size_t g = group; g < n; ++g) piece_cls[g] = retention_class::none;
        from = f_size;
    }
    if (add_generation_prompt && from < f_size) spans.push_back({n, from, f_size});
    return spans;
}

// One run of F to tokenize.
struct job {
    size_t span;
    text_run run;
    std::optional<std::vector<token_id>> toks;
    status err;
    bool starts_piece = false;  // a diff unit: a piece of its own starts here
};

// Every run of every span, a diff's data cut at its units where the tokenizer allows it.
std::vector<job> jobs_of(const std::vector<span_of> & spans, const rendered_conversation & f,
                         const text_model & model) {
    std::vector<job> jobs;
    const bool unit_cuts = model.plain_splits_at_lines();
    const bool any_line = unit_cuts && model.plain_splits_at_any_line();
    for (size_t i = 0; i < spans.size(); ++i) {
        size_t input_before = 0;  // the span's input bytes in the runs before this one
        for (const text_run & r : runs_in(f, spans[i].a, spans[i].b)) {
            if (!(unit_cuts && (spans[i].diff || spans[i].fine) && r.input)) {
                jobs.push_back({i, r, std::nullopt, {}});
                continue;
            }
            // A diff's data, cut at its units, or a stable segment's at its line blocks
            // (is_line_cut or is_any_line_cut points: the tokens are the same as the
            // whole text's).
            const std::string_view data = std::string_view(f.text).substr(r.begin, r.end - r.begin);
            size_t from_at = r.begin;
            for (size_t c :
                 spans[i].fine ? line_block_cuts(data, k_line_block_bytes, any_line) : diff_unit_cuts(data)) {
                if (spans[i].fine && input_before + c < spans[i].fine_from) continue;  // whole chunks before it
                jobs.push_back({i, {from_at, r.begin + c, true}, std::nullopt, {}, from_at != r.begin});
                from_at = r.begin + c;
            }
            jobs.push_back({i, {from_at, r.end, true}, std::nullopt, {}, from_at != r.begin});
            input_before += data.size();
        }
    }
    return jobs;
}

// Tokenizes every job: data runs the model does not remember spread over threads
// (tokenize_plain_spread); the template's own text between them on this thread (it is
// small).
void tokenize_jobs(std::vector<job> & jobs, std::string_view text, const text_model & model) {
    std::vector<size_t> todo;
    std::vector<std::string_view> texts;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const std::string_view t = text.substr(jobs[j].run.begin, jobs[j].run.end - jobs[j].run.begin);
        if (!jobs[j].run.input) {
            auto r = model.tokenize(t);
            if (r.ok()) jobs[j].toks = std::move(*r);
            else jobs[j].err = r.error();
        } else if (auto known = model.remembered_plain(t)) {
            jobs[j].toks = std::move(known);
        } else {
            todo.push_back(j);
            texts.push_back(t);
        }
    }
    auto toks = detail::tokenize_plain_spread(model, texts);
    for (size_t k = 0; k < todo.size(); ++k) {
        if (toks[k].ok()) jobs[todo[k]].toks = std::move(*toks[k]);
        else jobs[todo[k]].err = toks[k].error();
    }
}

}  // namespace

result<conversation_tokens> detail::tokenize_conversation(std::span<const segment * const> order,
                                                          std::span<const std::string> roles,
                                                          const kind_table & kinds, const text_model & model,
                                                          bool add_generation_prompt,
                                                          const std::vector<std::optional<size_t>> & fine) {
    const conversation_plan cp = plan_conversation(order, roles, kinds);
    const size_t n = order.size();
    prefix_renders_ahead ahead(cp, model);
    auto whole = render_whole(cp, model, add_generation_prompt);
    ahead.join();
    if (!whole.ok()) return whole.error();
    const rendered_conversation & f = whole->f;
    const std::vector<std::optional<size_t>> cut =
        conversation_cuts(cp, f, model, add_generation_prompt, whole->skel ? &*whole->skel : nullptr,
                          whole->expanded ? &*whole->expanded : nullptr);

    conversation_tokens out;
    out.seg.assign(n, std::vector<token_id>{});
    out.piece_cls.assign(n, retention_class::none);
    out.sub_cuts.assign(n, {});
    const std::vector<span_of> spans = piece_spans(order, kinds, cut, f.text.size(), add_generation_prompt, fine,
                                                   out.piece_cls);

    // Tokenize: every run alone; data runs as plain text (remembered ones from the
    // model's memo), the big unknown ones spread over threads.
    std::vector<job> jobs = jobs_of(spans, f, model);
    tokenize_jobs(jobs, f.text, model);
    for (const job & j : jobs) {
        const span_of & sp = spans[j.span];
        if (!j.err.ok()) {
            const std::string where = sp.seg < n ? "segment " + quote_input(order[sp.seg]->id) : "generation prompt";
            return j.err.with_context(where + ": tokenizing");
        }
        std::vector<token_id> & dst = sp.seg < n ? *out.seg[sp.seg] : out.gen;
        if (j.starts_piece && sp.seg < n && !dst.empty() && !j.toks->empty())
            out.sub_cuts[sp.seg].push_back(dst.size());
        dst.insert(dst.end(), j.toks->begin(), j.toks->end());
    }
    return out;
}

}  // namespace warmctx
