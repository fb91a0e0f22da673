// A conversation rendered whole through the model's own template: where it may be cut
// into one piece per segment (template_cuts.h says how).
#include "template_cuts.h"

#include <algorithm>
#include <map>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "assembly.h"
#include "util/json.h"

namespace warmctx {

using detail::conversation_plan;
using detail::message_text;
using detail::tools_upto;

namespace {

constexpr std::string_view k_placeholder = k_content_placeholder;

std::string strip_ws(std::string_view s) {
    const size_t b = s.find_first_not_of(" \t\r\n");
    if (b == std::string_view::npos) return {};
    const size_t e = s.find_last_not_of(" \t\r\n");
    return std::string(s.substr(b, e - b + 1));
}

// An OpenAI `tools` array (JSON text of [{"type":"function","function":{"name":...}}]):
// the template renders it in its own tool format. A tools segment holding anything else
// (free text describing tools) is rendered as a message of the kind's role.
bool is_openai_tools(const std::string & content) {
    const std::string t = strip_ws(content);
    if (t.empty() || t.front() != '[') return false;
    auto parsed = parse_json(t);
    if (!parsed.ok()) return false;
    const nlohmann::json & j = *parsed;
    if (!j.is_array() || j.empty()) return false;
    for (const auto & tool : j) {
        if (!tool.is_object()) return false;
        auto f = tool.find("function");
        if (f == tool.end() || !f->is_object()) return false;
        auto n = f->find("name");
        if (n == f->end() || !n->is_string()) return false;
    }
    return true;
}

}  // namespace

conversation_plan detail::plan_conversation(std::span<const segment * const> order,
                                           std::span<const std::string> roles, const kind_table & kinds) {
    conversation_plan cp;
    for (size_t i = 0; i < order.size(); ++i) {
        const segment & s = *order[i];
        if (s.kind == segment_kind::tools && is_openai_tools(s.content)) {
            cp.msg_of.push_back(-1);
            cp.tools_of.push_back(s.content);
            continue;
        }
        cp.msg_of.push_back((int)cp.msgs.size());
        cp.tools_of.emplace_back();
        conversation_message m{roles[i], message_text(s, kinds.policy(s.kind)), s.tool_calls, s.tool_call_id};
        conversation_message k = m;
        // An empty content stays empty: templates test it ("if message.content"), and
        // there is nothing to put back.
        if (!k.content.empty()) k.content = content_placeholder(cp.msgs.size());
        cp.msgs.push_back(std::move(m));
        cp.skel.push_back(std::move(k));
    }
    return cp;
}

std::string detail::tools_upto(const conversation_plan & cp, size_t k) {
    std::string out;
    for (size_t i = 0; i < k; ++i) {
        const std::string & t = cp.tools_of[i];
        if (t.empty()) continue;
        const std::string inner = strip_ws(t);
        if (inner.size() < 2) continue;
        const std::string body = strip_ws(std::string_view(inner).substr(1, inner.size() - 2));
        if (body.empty()) continue;
        out += out.empty() ? "[" : ",";
        out += body;
    }
    if (!out.empty()) out += "]";
    return out;
}

namespace {

std::vector<conversation_message> msgs_upto(const std::vector<conversation_message> & all, const conversation_plan & cp,
                                            size_t k) {
    std::vector<conversation_message> out;
    for (size_t i = 0; i < k; ++i)
        if (cp.msg_of[i] >= 0) out.push_back(all[(size_t)cp.msg_of[i]]);
    return out;
}

// Maps positions of the whole skeleton onto F: a list of (skeleton end, F end) anchors
// after each placeholder; literal text between them has the same length in both.
struct skeleton_map {
    std::vector<std::pair<size_t, size_t>> anchors;  // sorted by skeleton position
    std::vector<std::pair<size_t, size_t>> holes;    // [begin, end) of each placeholder in the skeleton
    std::optional<size_t> map(size_t skel_pos) const { return map_skeleton_pos(holes, anchors, skel_pos); }
};

// Aligns the skeleton with F. nullopt when F is not the skeleton with each content (or
// the content stripped of surrounding whitespace) in its placeholder's place.
std::optional<skeleton_map> align(std::string_view skel, std::string_view f,
                                  const std::vector<conversation_message> & msgs) {
    skeleton_map m;
    size_t sp = 0, fp = 0;
    while (true) {
        const size_t at = skel.find(k_placeholder, sp);
        const size_t lit_end = at == std::string_view::npos ? skel.size() : at;
        const std::string_view lit = skel.substr(sp, lit_end - sp);
        if (f.substr(fp, lit.size()) != lit) return std::nullopt;
        fp += lit.size();
        if (at == std::string_view::npos) break;
        size_t q = at + k_placeholder.size();
        size_t idx = 0;
        bool digits = false;
        while (q < skel.size() && skel[q] >= '0' && skel[q] <= '9')
            idx = idx * 10 + size_t(skel[q++] - '0'), digits = true;
        if (!digits || q >= skel.size() || skel[q] != 'Z' || idx >= msgs.size()) return std::nullopt;
        ++q;
        // The literal after this placeholder decides between the content as given and
        // the content stripped (a template that trims).
        const size_t next = skel.find(k_placeholder, q);
        const std::string_view after = skel.substr(q, (next == std::string_view::npos ? skel.size() : next) - q);
        const std::string & raw = msgs[idx].content;
        auto fits = [&](std::string_view c) {
            return f.substr(fp, c.size()) == c && f.substr(fp + c.size(), after.size()) == after;
        };
        size_t used;
        if (fits(raw)) {
            used = raw.size();
        } else {
            const std::string st = strip_ws(raw);
            if (!fits(st)) return std::nullopt;
            used = st.size();
        }
        m.holes.push_back({at, q});
        fp += used;
        m.anchors.push_back({q, fp});
        sp = q;
    }
    if (fp != f.size()) return std::nullopt;
    return m;
}

// The tools text of each prefix: it changes only at a tools segment, so it is joined
// once per tools segment, not once per prefix.
class prefix_tools {
  public:
    explicit prefix_tools(const conversation_plan & cp) : cp_(cp), last_(cp.msg_of.size() + 1, 0) {
        for (size_t k = 1; k < last_.size(); ++k) last_[k] = cp.tools_of[k - 1].empty() ? last_[k - 1] : k;
    }
    const std::string & upto(size_t k) {
        const size_t at = last_[k];
        auto it = memo_.find(at);
        if (it == memo_.end()) it = memo_.emplace(at, tools_upto(cp_, at)).first;
        return it->second;
    }

  private:
    const conversation_plan & cp_;
    std::vector<size_t> last_;  // per k: 1 + the last tools segment in [0, k), 0 for none
    std::map<size_t, std::string> memo_;
};

// Prefix renders are O(k) each: rendering every prefix whole is O(n^2) in the message
// count (4,000 messages took 140 s). A request renders at most this many messages in
// whole prefixes; a conversation of up to 256 messages (32,896) renders all of them.
constexpr size_t k_prefix_render_budget = 33000;
// The conversation's head (system messages) goes into every window render: beyond this
// many head messages, windows are not used.
constexpr size_t k_max_window_head = 32;
// A window render's tools, when the prefix has any: a template asks whether there are
// tools, rarely which, and rendering the real ones per window would cost their size
// per message.
constexpr std::string_view k_window_tools =
    R"([{"type":"function","function":{"name":"warmctx_window","description":"",)"
    R"("parameters":{"type":"object","properties":{}}}}])";

// A placeholder in a skeleton's rendering: its message and its [begin, end).
struct placeholder_at {
    size_t msg, begin, end;
};

// The cut points of one conversation (conversation_cuts).
//
// A cut is the end of the rendering of the prefix [0, k) without a generation prompt,
// when that rendering is a prefix of the whole. With the skeleton, the prefixes of a long
// conversation are not rendered whole: the cut after message k-1 is where the template's
// text after k-1's content ends when k-1 is the last message, and that text comes from a
// window - the head (system messages), the conversation's first message, and the last one
// or two messages of [0, k), starting at an odd offset from the first, so roles alternate
// as the whole's do - checked against the whole skeleton's text after the same
// placeholder. Whole prefix renders at a spread of k check the windows; if any disagrees
// (a template whose messages' frames depend on what came long before), every prefix is
// rendered whole again, up to k_prefix_render_budget messages, first ones first (so the
// cuts of a conversation that grows stay where they were). A window that fails (the
// template refuses it, no placeholder to anchor on) falls back to its whole prefix, in
// the same budget. Where the cuts fall decides only how much a later turn can reuse, and
// the same conversation always gets the same cuts: the prompt is F in every case.
class cut_finder {
  public:
    cut_finder(const conversation_plan & cp, const rendered_conversation & f, const text_model & model,
               bool add_generation_prompt, const rendered_conversation * whole_skel,
               const expanded_skeleton * expanded)
        : cp_(cp), f_(f), model_(model), add_generation_prompt_(add_generation_prompt), expanded_(expanded),
          n_(cp.msg_of.size()), tools_(cp),
          whole_skel_(whole_skel ? result<rendered_conversation>(*whole_skel)
                                 : model.render_conversation(cp.skel, tools_.upto(n_), add_generation_prompt)) {
        if (!expanded_ && whole_skel_.ok()) aligned_ = align(whole_skel_->text, f_.text, cp_.msgs);
        skeleton_ = expanded_ || aligned_;
    }

    std::vector<std::optional<size_t>> cuts() {
        std::vector<std::optional<size_t>> cut(n_ + 1);
        cut[0] = 0;
        find_head();
        const size_t first_window = head_end_ + 3;  // windows for k in [first_window, n)
        const bool windows = skeleton_ && n_ > first_window && head_.size() <= k_max_window_head &&
                             n_ * (n_ + 1) / 2 > k_prefix_render_budget;
        if (!windows) {
            for (size_t k = 1; k <= n_; ++k) cut[k] = k == n_ ? whole_prefix(k) : budgeted(k);
        } else {
            index_placeholders();
            const bool trusted = windows_agree_with_whole_prefixes(first_window);
            if (trusted) render_windows_ahead(first_window);
            for (size_t k = 1; k <= n_; ++k) {
                if (k == n_) {
                    cut[k] = whole_prefix(k);
                } else if (!trusted || k < first_window) {
                    cut[k] = budgeted(k);
                } else if (auto w = windowed(k)) {
                    cut[k] = *w;
                } else {
                    cut[k] = budgeted(k);
                }
            }
        }
        // Cuts only move forward.
        size_t last = 0;
        for (size_t k = 1; k <= n_; ++k) {
            if (cut[k] && *cut[k] < last) cut[k].reset();
            if (cut[k]) last = *cut[k];
        }
        return cut;
    }

  private:
    // A position in the whole skeleton's rendering -> the same position in F.
    std::optional<size_t> to_f(size_t skel_pos) const {
        return expanded_ ? expanded_->map(skel_pos) : aligned_->map(skel_pos);
    }

    // The prefix [0, k) rendered whole.
    std::optional<size_t> whole_prefix(size_t k) {
        if (skeleton_) {
            auto sk = model_.render_conversation(msgs_upto(cp_.skel, cp_, k), tools_.upto(k), false);
            if (!sk.ok() || whole_skel_->text.compare(0, sk->text.size(), sk->text) != 0) {
                auto c = asks_for_query(sk, k, cp_.skel, whole_skel_->text)
                             ? sentinel_cut(k, cp_.skel, whole_skel_->text)
                             : std::nullopt;
                return c ? to_f(*c) : std::nullopt;
            }
            return to_f(sk->text.size());
        }
        // The template changes contents in a way the alignment does not know: render
        // the prefixes with their real contents.
        auto pk = model_.render_conversation(msgs_upto(cp_.msgs, cp_, k), tools_.upto(k), false);
        if (!pk.ok() || f_.text.compare(0, pk->text.size(), pk->text) != 0)
            return asks_for_query(pk, k, cp_.msgs, f_.text) ? sentinel_cut(k, cp_.msgs, f_.text) : std::nullopt;
        return pk->text.size();
    }

    // Whether [0, k) may render as it does in the whole only with a user query after it:
    // refused for want of one, or ending with an assistant message or a tool result while
    // its rendering agrees with the whole through its last user message (the Qwen3 family
    // renders the answers after the last user query with their reasoning, earlier ones
    // without: an agent's next question after a call's result moves the call before the
    // last query; Mistral's, which writes the system text into the last user message,
    // differs before that, and is not asked again).
    bool asks_for_query(const result<rendered_conversation> & prefix, size_t k,
                        const std::vector<conversation_message> & all, const std::string & whole) const {
        if (!prefix.ok()) return wants_user_query(prefix.error());
        const auto m = msgs_upto(all, cp_, k);
        if (m.size() < 2 || (m.back().role != "assistant" && m.back().role != "tool")) return false;
        auto user = std::find_if(m.rbegin(), m.rend(), [](const conversation_message & x) { return x.role == "user"; });
        if (user == m.rend()) return false;
        const std::string content = strip_ws(user->content);
        const std::string & text = prefix->text;
        const size_t at = content.empty() ? std::string::npos : text.rfind(content);
        if (at == std::string::npos) return false;
        size_t lcp = 0;
        while (lcp < text.size() && lcp < whole.size() && text[lcp] == whole[lcp]) ++lcp;
        if (m.back().role == "tool") {
            // Only where an answer before the result renders otherwise (the reasoning rule):
            // where the result's own frame differs (a template that groups the results of
            // one call), the rendering is no prefix for another reason.
            const std::string result = strip_ws(m.back().content);
            const size_t result_at = result.empty() ? std::string::npos : text.rfind(result);
            if (result_at == std::string::npos || lcp >= result_at) return false;
        }
        return lcp >= at + content.size();
    }

    // The Qwen3 family's templates (Qwen3, Qwen3.5, Qwen3-Coder) refuse a conversation
    // with no user query in it ("No user query found in messages"), so no prefix of
    // system messages renders alone. Other refusals (Llama 3.1's tools that need a first
    // user message, roles that must alternate) mean the prefix is no message boundary.
    static bool wants_user_query(const status & refused) {
        return refused.message().find("No user query found") != std::string::npos;
    }

    // For such a template, [0, k) is rendered with a user query after it, and cut where
    // its last message closes (below); or not at all.
    std::optional<size_t> sentinel_cut(size_t k, const std::vector<conversation_message> & all,
                                       const std::string & whole) {
        static constexpr std::string_view k_sentinel = "WARMCTXSENTINELQUERY";
        auto m = msgs_upto(all, cp_, k);
        if (m.empty()) return std::nullopt;
        m.push_back({"user", std::string(k_sentinel), "", ""});
        auto r = model_.render_conversation(m, tools_.upto(k), false);
        if (!r.ok()) return std::nullopt;
        const size_t sent = r->text.rfind(k_sentinel);  // the added message is the last
        if (sent == std::string::npos) return std::nullopt;
        size_t lcp = 0;
        while (lcp < sent && lcp < whole.size() && r->text[lcp] == whole[lcp]) ++lcp;
        if (auto c = joined_system_cut(k, m[m.size() - 2], all, whole, lcp)) return c;
        // The end of the prefix's last content in that rendering (a template may trim it);
        // a message with no content (an assistant's tool calls alone): the end of the last
        // run of request data before the sentinel (its calls' names and arguments).
        const std::string last = strip_ws(m[m.size() - 2].content);
        const size_t last_at = last.empty() ? std::string::npos : r->text.rfind(last, sent);
        size_t data_end = last_at == std::string::npos ? 0 : last_at + last.size();
        if (last.empty() && !m[m.size() - 2].tool_calls.empty())
            for (size_t i = 0, begin = 0; i < r->runs.size(); begin = r->runs[i].end, ++i)
                if (r->runs[i].input && r->runs[i].end <= sent && begin < r->runs[i].end) data_end = r->runs[i].end;
        // The template's own text right after the prefix's last data closes its last
        // message (and opens the next): the cut is its first line end, or else its end,
        // where that rendering and the whole still agree. Data there (Mistral's template
        // writes the system text into the next user message) means no cut.
        if (data_end == 0) return std::nullopt;
        size_t run_end = std::string::npos;
        for (size_t i = 0, begin = 0; i < r->runs.size(); begin = r->runs[i].end, ++i)
            if (r->runs[i].end > data_end) {
                if (r->runs[i].input || begin > data_end) return std::nullopt;
                run_end = r->runs[i].end;
                break;
            }
        if (run_end == std::string::npos) return std::nullopt;
        const size_t nl = r->text.find('\n', data_end);
        const size_t cut = nl != std::string::npos && nl < run_end ? nl + 1 : run_end;
        if (cut > lcp || cut > sent) return std::nullopt;
        return cut;
    }

    // A template that joins the system messages into one (Qwen3.5's): in the whole, the
    // prefix's last system content goes on with the join's blank line and the next
    // system segment's content, in the same message. The cut is at that content's start
    // (a segment end a later turn may resume from: another session's attribution line,
    // say), where the tokenizer splits plain text at a line start; else none.
    std::optional<size_t> joined_system_cut(size_t k, const conversation_message & last,
                                            const std::vector<conversation_message> & all, const std::string & whole,
                                            size_t lcp) const {
        if (k >= n_ || cp_.msg_of[k] < 0 || last.role != "system") return std::nullopt;
        const conversation_message & next = all[(size_t)cp_.msg_of[k]];
        if (next.role != "system" || next.content.empty()) return std::nullopt;
        if (whole.compare(lcp, 2, "\n\n") != 0 || whole.compare(lcp + 2, next.content.size(), next.content) != 0)
            return std::nullopt;
        const std::string t = "\n\n" + cp_.msgs[(size_t)cp_.msg_of[k]].content;  // the real text's first line
        const bool splits = model_.plain_splits_at_any_line() ? is_any_line_cut(t, 2)
                                                              : model_.plain_splits_at_lines() && is_line_cut(t, 2);
        return splits ? std::optional<size_t>(lcp + 2) : std::nullopt;
    }

    // whole_prefix(k) while the budget of whole prefix renders lasts.
    std::optional<size_t> budgeted(size_t k) {
        if (k > budget_) return std::nullopt;
        budget_ -= k;
        return whole_prefix(k);
    }

    // The head: segments before the first message of a role other than system.
    void find_head() {
        head_end_ = 0;
        while (head_end_ < n_ &&
               (cp_.msg_of[head_end_] < 0 || cp_.skel[(size_t)cp_.msg_of[head_end_]].role == "system")) {
            if (cp_.msg_of[head_end_] >= 0) head_.push_back(cp_.skel[(size_t)cp_.msg_of[head_end_]]);
            ++head_end_;
        }
    }

    // The placeholders of a text, in order.
    std::vector<placeholder_at> placeholders(const std::string & w) const {
        std::vector<placeholder_at> out;
        for (size_t at = w.find(k_placeholder); at != std::string::npos; at = w.find(k_placeholder, at + 1)) {
            size_t q = at + k_placeholder.size(), idx = 0;
            bool digits = false;
            while (q < w.size() && w[q] >= '0' && w[q] <= '9' && q - at < 40)
                idx = idx * 10 + size_t(w[q++] - '0'), digits = true;
            if (digits && q < w.size() && w[q] == 'Z' && idx < cp_.msgs.size()) out.push_back({idx, at, q + 1});
        }
        return out;
    }

    // Where each message's placeholder lies in the whole skeleton, and its rank there;
    // and the text before the first message's content, as a window renders it (with the
    // stand-in tools): the whole's with the same tools.
    void index_placeholders() {
        ph_begin_.assign(cp_.msgs.size(), std::string::npos);
        ph_end_.assign(cp_.msgs.size(), std::string::npos);
        ph_rank_.assign(cp_.msgs.size(), std::string::npos);
        const auto all = placeholders(whole_skel_->text);
        for (size_t r = 0; r < all.size(); ++r)
            if (ph_end_[all[r].msg] == std::string::npos)
                ph_begin_[all[r].msg] = all[r].begin, ph_end_[all[r].msg] = all[r].end, ph_rank_[all[r].msg] = r;
        const size_t first = (size_t)cp_.msg_of[head_end_];
        if (tools_.upto(n_).empty()) {
            if (ph_begin_[first] != std::string::npos) head_text_ = whole_skel_->text.substr(0, ph_begin_[first]);
        } else if (auto ws = model_.render_conversation(cp_.skel, k_window_tools, add_generation_prompt_); ws.ok()) {
            for (const placeholder_at & x : placeholders(ws->text))
                if (x.msg == first) {
                    head_text_ = ws->text.substr(0, x.begin);
                    break;
                }
        }
    }

    // The windows, checked against whole prefixes at a spread of k.
    bool windows_agree_with_whole_prefixes(size_t first_window) {
        for (size_t off = 1; first_window + off - 1 < n_; off *= 4) {
            const size_t k = first_window + off - 1;
            auto w = windowed(k);
            if (w && *w != whole_prefix(k)) return false;
        }
        if (n_ - 1 >= first_window) {
            auto w = windowed(n_ - 1);
            if (w && *w != whole_prefix(n_ - 1)) return false;
        }
        return true;
    }

    // The window's text must be the whole's: its contents in the same order, the same
    // text before the first message's content (the whole rendered with the same
    // stand-in tools), and the same text between two contents that follow each other in
    // both. (Messages the window leaves out lie between the first message and the
    // window.)
    bool window_text_is_the_wholes(const std::string & text) const {
        const std::string & w = whole_skel_->text;
        const size_t first = (size_t)cp_.msg_of[head_end_];
        bool started = false;
        placeholder_at prev{};
        for (const placeholder_at & x : placeholders(text)) {
            if (ph_end_[x.msg] == std::string::npos || (started && ph_rank_[x.msg] <= ph_rank_[prev.msg]))
                return false;  // in another order (Mistral moves the system to the last user message)
            if (!started) {
                started = x.msg == first;
                // The head's contents come before the first message's, as in the whole.
                if (!started) {
                    if (ph_rank_[x.msg] >= ph_rank_[first]) return false;
                    continue;
                }
                // And so does their text (Mistral writes the tools before the last user
                // message: before the window's first, not the whole's).
                if (!head_text_ || std::string_view(text).substr(0, x.begin) != *head_text_) return false;
                prev = x;
                continue;
            }
            if (ph_rank_[x.msg] == ph_rank_[prev.msg] + 1 &&
                std::string_view(text).substr(prev.end, x.begin - prev.end) !=
                    std::string_view(w).substr(ph_end_[prev.msg], ph_begin_[x.msg] - ph_end_[prev.msg]))
                return false;
            prev = x;
        }
        return true;
    }

    // The window's cut for k, or nullopt when the window cannot say.
    std::optional<std::optional<size_t>> windowed(size_t k) {
        auto win = window_of(k);
        if (!win) return std::nullopt;
        auto r = model_.render_conversation(win->msgs, win->tools, false);
        if (!r.ok()) return std::nullopt;
        if (!window_text_is_the_wholes(r->text)) return std::optional<size_t>();
        const std::string & ph = cp_.skel[win->anchor].content;
        const size_t at = r->text.rfind(ph);
        if (at == std::string::npos) return std::nullopt;
        const std::string_view tail = std::string_view(r->text).substr(at + ph.size());
        const size_t w_at = ph_end_[win->anchor];
        // No prefix render ends there: the window's text after the content is not the
        // whole's (a template whose last message differs from the others).
        if (whole_skel_->text.compare(w_at, tail.size(), tail) != 0) return std::optional<size_t>();
        return to_f(w_at + tail.size());
    }

    // The windows of k in [first, n) rendered ahead, every other one on a thread of its
    // own, where the text model remembers renders: the loop over k then finds them made
    // (a cold conversation of 1,000 messages renders ~1,000 windows).
    void render_windows_ahead(size_t first) {
        if (!model_.remembers_renders() || n_ < first + 64) return;
        std::vector<window> wins;
        for (size_t k = first; k < n_; ++k)
            if (auto w = window_of(k)) wins.push_back(std::move(*w));
        auto render_from = [&](size_t i0) {
            for (size_t i = i0; i < wins.size(); i += 2) {
                try {
                    (void)model_.render_conversation(wins[i].msgs, wins[i].tools, false);
                } catch (...) {  // rendered again in the loop, which reports what fails
                }
            }
        };
        std::thread beside;
        try {
            beside = std::thread(render_from, 1);
        } catch (const std::system_error &) {  // no thread to be had: the loop renders them
            return;
        }
        render_from(0);
        beside.join();
    }

    // The window of messages whose rendering places the cut after message k-1, its tools
    // and the message its last placeholder is (the anchor); nullopt where it has none.
    struct window {
        std::vector<conversation_message> msgs;
        std::string_view tools;
        size_t anchor = 0;
    };
    std::optional<window> window_of(size_t k) {
        const size_t h = head_end_;
        // The conversation's first message stays first (a template may treat it apart:
        // Llama 3.1 writes the tools into it), then the window from an odd offset after it.
        // It reaches back (two messages at a time) to a message with a content: the
        // anchor (an assistant's call alone has none).
        size_t j = k - 1 - ((k - h - 2) & 1);
        std::optional<size_t> anchor;  // the window's last message with a placeholder
        for (;; j -= 2) {
            for (size_t i = k; i-- > j && !anchor;) {
                if (cp_.msg_of[i] < 0) return std::nullopt;
                if (!cp_.skel[(size_t)cp_.msg_of[i]].content.empty()) anchor = (size_t)cp_.msg_of[i];
            }
            if (anchor || j < h + 3 || k - j > 8) break;
        }
        if (!anchor || ph_end_[*anchor] == std::string::npos || tools_.upto(k) != tools_.upto(n_)) return std::nullopt;
        window w;
        w.msgs = head_;
        w.msgs.push_back(cp_.skel[(size_t)cp_.msg_of[h]]);
        for (size_t i = j; i < k; ++i) {
            if (cp_.msg_of[i] < 0) return std::nullopt;
            w.msgs.push_back(cp_.skel[(size_t)cp_.msg_of[i]]);
        }
        w.tools = tools_.upto(k).empty() ? std::string_view() : k_window_tools;
        w.anchor = *anchor;
        return w;
    }

    const conversation_plan & cp_;
    const rendered_conversation & f_;
    const text_model & model_;
    const bool add_generation_prompt_;
    const expanded_skeleton * expanded_;
    const size_t n_;
    prefix_tools tools_;
    result<rendered_conversation> whole_skel_;
    std::optional<skeleton_map> aligned_;  // the whole skeleton aligned with F (when not expanded_)
    bool skeleton_ = false;                // positions in the whole skeleton map onto F
    size_t budget_ = k_prefix_render_budget;
    size_t head_end_ = 0;                      // the head is the segments [0, head_end_)
    std::vector<conversation_message> head_;   // the head's messages (skeletons)
    // Per message, in the whole skeleton: its placeholder's [begin, end) and rank.
    std::vector<size_t> ph_begin_, ph_end_, ph_rank_;
    std::optional<std::string> head_text_;
};


}  // namespace

detail::prefix_renders_ahead::prefix_renders_ahead(const conversation_plan & cp, const text_model & model) {
    const size_t n = cp.msg_of.size();
    if (!model.remembers_renders() || !model.renders_contents_verbatim() || n < 2 ||
        n * (n + 1) / 2 <= k_prefix_render_budget)
        return;
    for (size_t k : {n, n - 1}) {
        // What the cut finder's whole_prefix(k) renders, made here so that the thread
        // needs nothing of the caller's but the model. No thread to be had: the cut
        // finder renders it itself.
        try {
            threads_.emplace_back([&model, msgs = msgs_upto(cp.skel, cp, k), tools = tools_upto(cp, k)] {
                try {
                    (void)model.render_conversation(msgs, tools, false);
                } catch (...) {  // the cut finder renders it again and reports what fails
                }
            });
        } catch (const std::system_error &) {
            break;
        }
    }
}

void detail::prefix_renders_ahead::join() {
    for (std::thread & t : threads_)
        if (t.joinable()) t.join();
}

std::vector<std::optional<size_t>> detail::conversation_cuts(const conversation_plan & cp,
                                                             const rendered_conversation & f,
                                                             const text_model & model, bool add_generation_prompt,
                                                             const rendered_conversation * whole_skel,
                                                             const expanded_skeleton * expanded) {
    return cut_finder(cp, f, model, add_generation_prompt, whole_skel, expanded).cuts();
}

}  // namespace warmctx
