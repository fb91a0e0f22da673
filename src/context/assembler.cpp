#include "warmctx/assembler.h"
#include "warmctx/chunking.h"
#include "warmctx/json.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <thread>
#include <tuple>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "quote.h"

namespace warmctx {

using detail::quote_input;

// ---- hashing ------------------------------------------------------------------------

namespace {

// Stands in for a message's content when rendering its frame; cannot occur in a
// template's own text.
constexpr std::string_view k_content_sentinel = "\x1e\x1fwarmctx-content\x1f\x1e";

// Token ids as little-endian int32 bytes: the hash must not depend on the host.
const void * token_bytes(std::span<const token_id> tokens, std::vector<uint32_t> & scratch) {
    if constexpr (std::endian::native == std::endian::little) {
        return tokens.data();
    } else {
        scratch.resize(tokens.size());
        for (size_t i = 0; i < tokens.size(); ++i) scratch[i] = __builtin_bswap32(static_cast<uint32_t>(tokens[i]));
        return scratch.data();
    }
}

}  // namespace

hash128 hash_tokens(std::span<const token_id> tokens) {
    std::vector<uint32_t> scratch;
    return hash_bytes(token_bytes(tokens, scratch), tokens.size_bytes());
}

hash128 chain_hash(hash128 prev, std::span<const token_id> tokens) {
    std::vector<uint32_t> scratch;
    return hash_combine(prev, token_bytes(tokens, scratch), tokens.size_bytes());
}

hash128 root_hash(const profile & prof, std::string_view tenant_salt) {
    // The salt is hashed after a domain tag so that h_0 can never equal a block hash
    // computed from the same fingerprint.
    constexpr std::string_view k_tag = "warmctx-root-v1";
    const hash128 tagged = hash_combine(prof.fingerprint(), k_tag.data(), k_tag.size());
    return hash_combine(tagged, tenant_salt.data(), tenant_salt.size());
}

result<hash128> parse_hash128(std::string_view hex) {
    if (hex.size() != 32) return invalid_argument("hash " + quote_input(hex) + " must be 32 hex digits");
    uint64_t parts[2] = {0, 0};
    for (size_t i = 0; i < 32; ++i) {
        const char c = hex[i];
        uint64_t d;
        if (c >= '0' && c <= '9') d = uint64_t(c - '0');
        else if (c >= 'a' && c <= 'f') d = uint64_t(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = uint64_t(c - 'A' + 10);
        else return invalid_argument("hash " + quote_input(hex) + " has a non-hex digit");
        parts[i / 16] = (parts[i / 16] << 4) | d;
    }
    return hash128{parts[0], parts[1]};
}

// ---- validation -----------------------------------------------------------------

status validate_segment_id(std::string_view id) {
    if (id.empty()) return invalid_argument("segment id is empty");
    if (id.size() > k_max_segment_id_chars)
        return invalid_argument("segment id " + quote_input(id) + " is longer than " +
                                std::to_string(k_max_segment_id_chars) + " characters");
    for (char c : id) {
        const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
                        c == '_' || c == ':' || c == '/' || c == '-';
        if (!ok)
            return invalid_argument("segment id " + quote_input(id) + " has a character outside [A-Za-z0-9._:/-]");
    }
    // The id becomes a relative file name and a URL path: no absolute paths, no
    // climbing out, no empty or "." components that alias another id.
    size_t start = 0;
    while (true) {
        const size_t slash = id.find('/', start);
        const std::string_view part = id.substr(start, slash == std::string_view::npos ? id.npos : slash - start);
        if (part.empty())
            return invalid_argument("segment id " + quote_input(id) + " has an empty path component (leading, trailing or doubled '/')");
        if (part == "." || part == "..")
            return invalid_argument("segment id " + quote_input(id) + " has a '" + std::string(part) + "' component");
        if (slash == std::string_view::npos) break;
        start = slash + 1;
    }
    return {};
}

status validate_segments(std::span<const segment> segs, const kind_table & kinds) {
    std::unordered_set<std::string_view> seen;
    const segment * user_seg = nullptr;
    for (const segment & s : segs) {
        WARMCTX_RETURN_IF_ERROR(validate_segment_id(s.id));
        if (!seen.insert(s.id).second) return invalid_argument("duplicate segment id " + quote_input(s.id));
        if (static_cast<int>(s.kind) >= k_segment_kind_count)
            return invalid_argument("segment " + quote_input(s.id) + " has an unknown kind");
        if (s.kind == segment_kind::user) {
            if (user_seg)
                return invalid_argument("more than one user segment (" + quote_input(user_seg->id) + " and " +
                                        quote_input(s.id) + "); a request has at most one");
            user_seg = &s;
        }
        if (s.path.size() > k_max_segment_path_bytes)
            return invalid_argument("segment " + quote_input(s.id) + ": path is longer than " +
                                    std::to_string(k_max_segment_path_bytes) + " bytes");
        for (char c : s.path)
            if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
                return invalid_argument("segment " + quote_input(s.id) + ": path " + quote_input(s.path) +
                                        " has a control character");
        if (!s.role.empty()) {
            if (!is_chat_role(s.role))
                return invalid_argument("segment " + quote_input(s.id) + ": unknown role " + quote_input(s.role) +
                                        " (expected one of system, user, assistant, tool)");
            const kind_policy & p = kinds.policy(s.kind);
            if (!p.role_from_segment && s.role != p.role)
                return invalid_argument("segment " + quote_input(s.id) + ": kind '" +
                                        std::string(segment_kind_name(s.kind)) + "' is rendered as '" + p.role +
                                        "' and takes no role of its own (got " + quote_input(s.role) + ")");
        }
    }
    return {};
}

// ---- assembly -------------------------------------------------------------------

namespace {

constexpr auto k_max_tokens = static_cast<size_t>(std::numeric_limits<pos_t>::max());

// One contiguous range of the prompt that chunks restart at: a segment or the
// generation prompt.
struct piece {
    pos_t begin = 0, end = 0;
    retention_class cls = retention_class::none;
    int segment_index = 0;
};

// A segment's message text: its content, after a one-line header for kinds that have
// one (the path says more to the model than the id).
std::string message_text(const segment & s, const kind_policy & p) {
    if (!p.header) return s.content;
    std::string c = "# ";
    c += segment_kind_name(s.kind);
    c += ": ";
    c += s.path.empty() ? s.id : s.path;
    c += '\n';
    c += s.content;
    return c;
}

// The message text of the per-message path: a template that renders one message alone
// has no place for tool calls, so an assistant message's calls follow its text as JSON.
std::string message_content(const segment & s, const kind_policy & p) {
    std::string c = message_text(s, p);
    if (!s.tool_calls.empty()) {
        if (!c.empty()) c += '\n';
        c += s.tool_calls;
    }
    return c;
}

// What a manifest entry's content_hash covers: the content, and a message's structure
// when it has one (so the hash of a plain segment is the hash of its content alone).
hash128 segment_content_hash(const segment & s) {
    if (s.tool_calls.empty() && s.tool_call_id.empty()) return hash_string(s.content);
    std::string all = s.content;
    all += '\x1f';
    all += s.tool_calls;
    all += '\x1f';
    all += s.tool_call_id;
    return hash_string(all);
}

status append_tokens(std::vector<token_id> & out, const std::vector<token_id> & more) {
    if (more.size() > k_max_tokens - out.size())
        return out_of_range("the prompt is longer than " + std::to_string(k_max_tokens) + " tokens");
    out.insert(out.end(), more.begin(), more.end());
    return {};
}

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
// thread: starting threads would cost more than they save.
constexpr size_t k_parallel_tokenize_min_bytes = 64 << 10;

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
constexpr size_t k_split_min_bytes = 32 << 10;
constexpr size_t k_part_bytes = 16 << 10;

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

namespace {

// tokenize_plain of every text, spread over threads when there is much (run_spread);
// a large text is tokenized in parts where the model allows it (cut_at_lines), and
// its joined tokens are then remembered whole.
std::vector<result<std::vector<token_id>>> tokenize_plain_spread(const text_model & model,
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
std::vector<result<std::vector<token_id>>> tokenize_segments(std::span<const segment * const> order,
                                                             std::span<const std::string> roles,
                                                             const kind_table & kinds, const text_model & model) {
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
        if (known[i]) out[i] = tokenize_segment(*order[i], kinds.policy(order[i]->kind), roles[i], model, std::move(known[i]));
    return out;
}

// ---- the model's own template (text_model::renders_conversations) -------------------
//
// The conversation is rendered whole, once, as the template renders it (F). It is then
// cut into one piece per segment at points where the text before the cut depends on
// the segments before it only: the end of the rendering of segments [0, k) without a
// generation prompt, when that rendering is a prefix of F. Those prefix renderings are
// made with every content replaced by a short placeholder ("skeletons": cheap, and the
// same turn after turn, so the text model may remember them), and mapped onto F by
// aligning the skeleton of the whole conversation with F, content by content (a
// template may trim a content; any other transformation fails the alignment, and then
// the prefixes are rendered with their real contents). A segment whose prefix is not a
// prefix of F (Qwen2.5's template writes a default system prompt when the tools come
// without one, so "tools alone" is no prefix of "tools and system") shares one piece
// with the segments after it, up to the next cut. Each piece is tokenized alone, the
// template's own text with special tokens parsed, the request's data as plain text.
// Where the cuts fall decides only how much a later turn can reuse: the prompt is F in
// every case.

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
    const nlohmann::json j = nlohmann::json::parse(t, nullptr, false);
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

struct conversation_plan {
    std::vector<conversation_message> msgs;   // real contents
    std::vector<conversation_message> skel;   // contents replaced by placeholders
    std::vector<int> msg_of;                  // segment -> message index, -1 for tools
    std::vector<std::string> tools_of;        // segment -> its tools array text (tools segments)
};

// The tools arrays of the segments [0, k) as one array text ("" when none).
std::string tools_upto(const conversation_plan & cp, size_t k) {
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
std::optional<skeleton_map> align(std::string_view skel, std::string_view f, const std::vector<conversation_message> & msgs) {
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
        while (q < skel.size() && skel[q] >= '0' && skel[q] <= '9') idx = idx * 10 + size_t(skel[q++] - '0'), digits = true;
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
    R"([{"type":"function","function":{"name":"warmctx_window","description":"","parameters":{"type":"object","properties":{}}}}])";

// The cut points: cut[k] (k = 1..n) = where the text of segments [0, k) ends in F, or
// nullopt when no such point exists.
// `expanded`: F made from the whole skeleton (a template that writes contents verbatim);
// else the skeleton is aligned with F here.
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
result<std::vector<std::optional<size_t>>> conversation_cuts(const conversation_plan & cp, const rendered_conversation & f,
                                                             const text_model & model, bool add_generation_prompt,
                                                             const rendered_conversation * whole_skel_in,
                                                             const expanded_skeleton * expanded) {
    const size_t n = cp.msg_of.size();
    std::vector<std::optional<size_t>> cut(n + 1);
    cut[0] = 0;
    prefix_tools tools(cp);
    result<rendered_conversation> whole_skel = whole_skel_in ? result<rendered_conversation>(*whole_skel_in)
                                                             : model.render_conversation(cp.skel, tools.upto(n),
                                                                                         add_generation_prompt);
    std::optional<skeleton_map> sm;
    if (!expanded && whole_skel.ok()) sm = align(whole_skel->text, f.text, cp.msgs);
    const bool skeleton = expanded || sm;
    auto to_f = [&](size_t skel_pos) { return expanded ? expanded->map(skel_pos) : sm->map(skel_pos); };

    // The prefix [0, k) rendered whole.
    auto whole_prefix = [&](size_t k) -> std::optional<size_t> {
        if (skeleton) {
            auto sk = model.render_conversation(msgs_upto(cp.skel, cp, k), tools.upto(k), false);
            if (!sk.ok() || whole_skel->text.compare(0, sk->text.size(), sk->text) != 0) return std::nullopt;
            return to_f(sk->text.size());
        }
        // The template changes contents in a way the alignment does not know: render
        // the prefixes with their real contents.
        auto pk = model.render_conversation(msgs_upto(cp.msgs, cp, k), tools.upto(k), false);
        if (!pk.ok() || f.text.compare(0, pk->text.size(), pk->text) != 0) return std::nullopt;
        return pk->text.size();
    };
    size_t budget = k_prefix_render_budget;
    auto budgeted = [&](size_t k) -> std::optional<size_t> {
        if (k > budget) return std::nullopt;
        budget -= k;
        return whole_prefix(k);
    };

    // The head: segments before the first message of a role other than system.
    size_t h = 0;
    std::vector<conversation_message> head;
    while (h < n && (cp.msg_of[h] < 0 || cp.skel[(size_t)cp.msg_of[h]].role == "system")) {
        if (cp.msg_of[h] >= 0) head.push_back(cp.skel[(size_t)cp.msg_of[h]]);
        ++h;
    }
    const size_t first_window = h + 3;  // windows for k in [first_window, n)
    const bool windows = skeleton && n > first_window && head.size() <= k_max_window_head &&
                         n * (n + 1) / 2 > k_prefix_render_budget;
    if (!windows) {
        for (size_t k = 1; k <= n; ++k) cut[k] = k == n ? whole_prefix(k) : budgeted(k);
    } else {
        // The placeholders of a text, in order: (message, begin, end).
        struct ph_at {
            size_t msg, begin, end;
        };
        auto placeholders = [&](const std::string & w) {
            std::vector<ph_at> out;
            for (size_t at = w.find(k_placeholder); at != std::string::npos; at = w.find(k_placeholder, at + 1)) {
                size_t q = at + k_placeholder.size(), idx = 0;
                bool digits = false;
                while (q < w.size() && w[q] >= '0' && w[q] <= '9' && q - at < 40)
                    idx = idx * 10 + size_t(w[q++] - '0'), digits = true;
                if (digits && q < w.size() && w[q] == 'Z' && idx < cp.msgs.size()) out.push_back({idx, at, q + 1});
            }
            return out;
        };
        // Where each message's placeholder lies in the whole skeleton, and its rank there.
        std::vector<size_t> ph_begin(cp.msgs.size(), std::string::npos), ph_end(cp.msgs.size(), std::string::npos),
            ph_rank(cp.msgs.size(), std::string::npos);
        {
            const auto all = placeholders(whole_skel->text);
            for (size_t r = 0; r < all.size(); ++r)
                if (ph_end[all[r].msg] == std::string::npos)
                    ph_begin[all[r].msg] = all[r].begin, ph_end[all[r].msg] = all[r].end, ph_rank[all[r].msg] = r;
        }
        // The text before the first message's content, as a window renders it (with the
        // stand-in tools): the whole's with the same tools.
        std::optional<std::string> head_text;
        {
            const size_t first = (size_t)cp.msg_of[h];
            if (tools.upto(n).empty()) {
                if (ph_begin[first] != std::string::npos) head_text = whole_skel->text.substr(0, ph_begin[first]);
            } else if (auto ws = model.render_conversation(cp.skel, k_window_tools, add_generation_prompt); ws.ok()) {
                for (const ph_at & x : placeholders(ws->text))
                    if (x.msg == first) {
                        head_text = ws->text.substr(0, x.begin);
                        break;
                    }
            }
        }
        // The window's cut for k, or nullopt when the window cannot say.
        auto windowed = [&](size_t k) -> std::optional<std::optional<size_t>> {
            // The conversation's first message stays first (a template may treat it apart:
            // Llama 3.1 writes the tools into it), then the window from an odd offset after it.
            // It reaches back (two messages at a time) to a message with a content: the
            // anchor (an assistant's call alone has none).
            size_t j = k - 1 - ((k - h - 2) & 1);
            std::optional<size_t> anchor;  // the window's last message with a placeholder
            for (;; j -= 2) {
                for (size_t i = k; i-- > j && !anchor;) {
                    if (cp.msg_of[i] < 0) return std::nullopt;
                    if (!cp.skel[(size_t)cp.msg_of[i]].content.empty()) anchor = (size_t)cp.msg_of[i];
                }
                if (anchor || j < h + 3 || k - j > 8) break;
            }
            if (!anchor || ph_end[*anchor] == std::string::npos || tools.upto(k) != tools.upto(n)) return std::nullopt;
            std::vector<conversation_message> win = head;
            win.push_back(cp.skel[(size_t)cp.msg_of[h]]);
            for (size_t i = j; i < k; ++i) {
                if (cp.msg_of[i] < 0) return std::nullopt;
                win.push_back(cp.skel[(size_t)cp.msg_of[i]]);
            }
            auto r = model.render_conversation(win, tools.upto(k).empty() ? std::string_view() : k_window_tools, false);
            if (!r.ok()) return std::nullopt;
            // The window's text must be the whole's: its contents in the same order, the same
            // text before the first message's content (the whole rendered with the same
            // stand-in tools), and the same text between two contents that follow each
            // other in both. (Messages the window leaves out lie between the first message
            // and the window.)
            const std::string & w = whole_skel->text;
            bool started = false;
            ph_at prev{};
            for (const ph_at & x : placeholders(r->text)) {
                if (ph_end[x.msg] == std::string::npos || (started && ph_rank[x.msg] <= ph_rank[prev.msg]))
                    return std::optional<size_t>();  // in another order (Mistral moves the system to the last user message)
                if (!started) {
                    started = x.msg == (size_t)cp.msg_of[h];
                    // The head's contents come before the first message's, as in the whole.
                    if (!started) {
                        if (ph_rank[x.msg] >= ph_rank[(size_t)cp.msg_of[h]]) return std::optional<size_t>();
                        continue;
                    }
                    // And so does their text (Mistral writes the tools before the last user
                    // message: before the window's first, not the whole's).
                    if (!head_text || std::string_view(r->text).substr(0, x.begin) != *head_text)
                        return std::optional<size_t>();
                    prev = x;
                    continue;
                }
                if (ph_rank[x.msg] == ph_rank[prev.msg] + 1 &&
                    std::string_view(r->text).substr(prev.end, x.begin - prev.end) !=
                        std::string_view(w).substr(ph_end[prev.msg], ph_begin[x.msg] - ph_end[prev.msg]))
                    return std::optional<size_t>();
                prev = x;
            }
            const std::string & ph = cp.skel[*anchor].content;
            const size_t at = r->text.rfind(ph);
            if (at == std::string::npos) return std::nullopt;
            const std::string_view tail = std::string_view(r->text).substr(at + ph.size());
            const size_t w_at = ph_end[*anchor];
            // No prefix render ends there: the window's text after the content is not the
            // whole's (a template whose last message differs from the others).
            if (whole_skel->text.compare(w_at, tail.size(), tail) != 0) return std::optional<size_t>();
            return to_f(w_at + tail.size());
        };
        // The windows, checked against whole prefixes at a spread of k.
        bool trusted = true;
        for (size_t off = 1; trusted && first_window + off - 1 < n; off *= 4) {
            const size_t k = first_window + off - 1;
            auto w = windowed(k);
            if (w && *w != whole_prefix(k)) trusted = false;
        }
        if (trusted && n - 1 >= first_window) {
            auto w = windowed(n - 1);
            if (w && *w != whole_prefix(n - 1)) trusted = false;
        }
        for (size_t k = 1; k <= n; ++k) {
            if (k == n) {
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
    for (size_t k = 1; k <= n; ++k) {
        if (cut[k] && *cut[k] < last) cut[k].reset();
        if (cut[k]) last = *cut[k];
    }
    return cut;
}

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

struct conversation_tokens {
    std::vector<result<std::vector<token_id>>> seg;  // per segment in `order` (empty: shares the next piece)
    std::vector<retention_class> piece_cls;          // per segment: the class of the piece it ends
    std::vector<token_id> gen;                       // the generation prompt's own tokens
    // Per segment: offsets into seg[i] where a piece of its own starts inside it (a
    // diff's files and hunks: diff_unit_cuts), ascending, in (0, seg[i].size()).
    std::vector<std::vector<size_t>> sub_cuts;
};

result<conversation_tokens> tokenize_conversation(std::span<const segment * const> order,
                                                  std::span<const std::string> roles, const kind_table & kinds,
                                                  const text_model & model, bool add_generation_prompt) {
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
    const size_t n = order.size();
    // F: from the skeleton when the template writes contents verbatim (the skeleton is
    // the same turn after turn, so the text model remembers its rendering), else rendered
    // with the real contents.
    std::optional<rendered_conversation> whole_skel;
    std::optional<expanded_skeleton> expanded;
    if (model.renders_contents_verbatim()) {
        auto ws = model.render_conversation(cp.skel, tools_upto(cp, n), add_generation_prompt);
        if (ws.ok()) {
            expanded = expand_skeleton(*ws, cp.msgs);
            if (expanded) whole_skel = std::move(*ws);
        }
    }
    result<rendered_conversation> f = expanded ? result<rendered_conversation>(std::move(expanded->text))
                                               : model.render_conversation(cp.msgs, tools_upto(cp, n), add_generation_prompt);
    if (!f.ok()) return f.error();
    auto cuts = conversation_cuts(cp, *f, model, add_generation_prompt, whole_skel ? &*whole_skel : nullptr,
                                  expanded ? &*expanded : nullptr);
    if (!cuts.ok()) return cuts.error();
    std::vector<std::optional<size_t>> & cut = *cuts;

    // Pieces: a segment with a cut after it ends a piece; the generation prompt is the
    // rest of F when the last segment has a cut, else part of the last piece.
    conversation_tokens out;
    out.seg.assign(n, std::vector<token_id>{});
    out.piece_cls.assign(n, retention_class::none);
    out.sub_cuts.assign(n, {});
    struct span_of {
        size_t seg;  // the segment that ends the piece (n: the generation prompt)
        size_t a, b;
        bool diff = false;  // the piece is one segment's alone that may carry a diff
                            // (a diff, a chat message): cut at its units
    };
    std::vector<span_of> spans;
    size_t from = 0, group = 0;
    retention_class cls = retention_class::highest;
    for (size_t k = 1; k <= n; ++k) {
        cls = std::min(cls, kinds.policy(order[k - 1]->kind).retention);
        const bool last = k == n;
        if (cut[k] || (last && !add_generation_prompt)) {
            const size_t to = last && !add_generation_prompt ? f->text.size() : *cut[k];
            // A diff is cut at its files and hunks; so is a chat message (history, or
            // this turn's) that carries one - an agent pastes diffs into its messages,
            // and a window of its last messages then begins with another message whose
            // diff header is the same.
            const segment_kind kk = order[k - 1]->kind;
            spans.push_back({k - 1, from, to,
                             group == k - 1 && (kk == segment_kind::diff || kk == segment_kind::history ||
                                                kk == segment_kind::user)});
            for (size_t g = group; g < k; ++g) out.piece_cls[g] = cls;
            from = to;
            group = k;
            cls = retention_class::highest;
        }
    }
    if (group < n) {  // no cut after the last segment: it shares the generation prompt's piece
        spans.push_back({n - 1, from, f->text.size()});
        for (size_t g = group; g < n; ++g) out.piece_cls[g] = retention_class::none;
        from = f->text.size();
    }
    if (add_generation_prompt && from < f->text.size()) spans.push_back({n, from, f->text.size()});

    // Tokenize: every run alone; data runs as plain text (remembered ones from the
    // model's memo), the big unknown ones spread over threads.
    struct job {
        size_t span;
        text_run run;
        std::optional<std::vector<token_id>> toks;
        status err;
        bool starts_piece = false;  // a diff unit: a piece of its own starts here
    };
    std::vector<job> jobs;
    const bool unit_cuts = model.plain_splits_at_lines();
    for (size_t i = 0; i < spans.size(); ++i)
        for (const text_run & r : runs_in(*f, spans[i].a, spans[i].b)) {
            if (!(unit_cuts && spans[i].diff && r.input)) {
                jobs.push_back({i, r, std::nullopt, {}});
                continue;
            }
            // A diff's data, cut at its units (is_line_cut points: the tokens are the
            // same as the whole text's).
            size_t from_at = r.begin;
            for (size_t c : diff_unit_cuts(std::string_view(f->text).substr(r.begin, r.end - r.begin))) {
                jobs.push_back({i, {from_at, r.begin + c, true}, std::nullopt, {}, from_at != r.begin});
                from_at = r.begin + c;
            }
            jobs.push_back({i, {from_at, r.end, true}, std::nullopt, {}, from_at != r.begin});
        }
    // Data runs the model does not remember: spread over threads (tokenize_plain_spread);
    // the template's own text between them, on this thread (it is small).
    std::vector<size_t> todo;
    std::vector<std::string_view> texts;
    const std::string_view text(f->text);
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
    auto toks = tokenize_plain_spread(model, texts);
    for (size_t k = 0; k < todo.size(); ++k) {
        if (toks[k].ok()) jobs[todo[k]].toks = std::move(*toks[k]);
        else jobs[todo[k]].err = toks[k].error();
    }
    for (const job & j : jobs) {
        const span_of & sp = spans[j.span];
        if (!j.err.ok()) {
            const std::string where = sp.seg < n ? "segment " + quote_input(order[sp.seg]->id) : "generation prompt";
            return j.err.with_context(where + ": tokenizing");
        }
        std::vector<token_id> & dst = sp.seg < n ? *out.seg[sp.seg] : out.gen;
        if (j.starts_piece && sp.seg < n && !dst.empty() && !j.toks->empty()) out.sub_cuts[sp.seg].push_back(dst.size());
        dst.insert(dst.end(), j.toks->begin(), j.toks->end());
    }
    return out;
}

}  // namespace

// Boundaries and blocks of an assembled prompt from its pieces (see assemble).
static void build_blocks(assembled_prompt & out, const std::vector<piece> & pieces, const profile & prof,
                  std::string_view tenant_salt, uint32_t chunk_tokens) {
    const auto n_tokens = static_cast<pos_t>(out.tokens.size());
    // A piece starts a chunk unless the piece before it has retention `none`: nothing
    // at or after a `none` block is cached in the pool, so no other turn starts there,
    // and chunking the uncached tail together saves a decode call per turn without
    // changing any KV that is reused. The generation prompt is the exception: it always
    // starts a chunk, so that the turn's own user message ends one. The work stream
    // keeps that message, and an agent's next turn, which carries it in its history
    // (the same piece, rendered the same), reuses it in place: one decode call more
    // per turn against prefilling the last message (often a tool's output) twice.
    // So do a segment's own parts (a message's diff units): the same message, as the
    // next turn's history, is chunked at them.
    std::vector<bool> starts_run(pieces.size(), true);
    for (size_t i = 1; i < pieces.size(); ++i)
        starts_run[i] = pieces[i - 1].cls != retention_class::none || pieces[i].segment_index == k_generation_prompt_index ||
                        (pieces[i].segment_index >= 0 && pieces[i].segment_index == pieces[i - 1].segment_index);
    for (size_t i = 0; i < pieces.size(); ++i) {
        const piece & pc = pieces[i];
        if (starts_run[i] && pc.begin > 0 && pc.begin < n_tokens &&
            (out.boundaries.empty() || out.boundaries.back() != pc.begin))
            out.boundaries.push_back(pc.begin);
    }

    // Blocks: the canonical chunks (warmctx/chunking.h) of the whole prompt, each named
    // by the chain hash of everything up to its end. A block that spans several pieces
    // is `none` (only pieces after a `none` one share a chunk) and is named after the
    // piece it starts in.
    out.root_hash = root_hash(prof, tenant_salt);
    hash128 h = out.root_hash;
    size_t at = 0;
    for (auto [b, e] : plan_chunks(0, n_tokens, out.boundaries, static_cast<int32_t>(chunk_tokens))) {
        while (pieces[at].end <= b) ++at;
        const bool one_piece = e <= pieces[at].end;
        h = chain_hash(h, std::span(out.tokens).subspan(b, e - b));
        out.blocks.push_back({h, b, e, one_piece ? pieces[at].cls : retention_class::none, pieces[at].segment_index});
    }
}

namespace {
// Canonical order: (kind order, id, path). Ids are unique, so this is total and the
// input order cannot leak through.
std::vector<const segment *> canonical_order(std::span<const segment> segs, const kind_table & kinds) {
    std::vector<const segment *> order(segs.size());
    for (size_t i = 0; i < segs.size(); ++i) order[i] = &segs[i];
    std::sort(order.begin(), order.end(), [&](const segment * a, const segment * b) {
        return std::forward_as_tuple(kinds.policy(a->kind).order, a->id, a->path) <
               std::forward_as_tuple(kinds.policy(b->kind).order, b->id, b->path);
    });
    return order;
}
}  // namespace

std::vector<segment> leading_segments(std::span<const segment> segs, const kind_table & kinds,
                                      const text_model & model, size_t min_rest_bytes, size_t max_lead_bytes) {
    const std::vector<const segment *> order = canonical_order(segs, kinds);
    // Bytes still to tokenize, per segment in order (a remembered content costs nothing).
    std::vector<size_t> todo(order.size(), 0);
    size_t total = 0;
    for (size_t i = 0; i < order.size(); ++i) {
        const std::string content = message_content(*order[i], kinds.policy(order[i]->kind));
        if (!model.remembered_plain(content)) todo[i] = content.size();
        total += todo[i];
    }
    size_t n = 0, lead = 0;
    while (n < order.size() && kinds.policy(order[n]->kind).retention != retention_class::none &&
           lead + todo[n] <= max_lead_bytes) {
        lead += todo[n];
        ++n;
    }
    // Nothing left to prefill ahead, or too little left to tokenize to be worth it.
    if (n == 0 || n == order.size() || lead == 0 || total - lead < min_rest_bytes) return {};
    std::vector<segment> out;
    for (size_t i = 0; i < n; ++i) out.push_back(*order[i]);
    return out;
}

result<assembled_prompt> assemble(std::span<const segment> segs, const kind_table & kinds,
                                  const text_model & model, const profile & prof,
                                  std::string_view tenant_salt, uint32_t chunk_tokens,
                                  bool add_generation_prompt) {
    WARMCTX_RETURN_IF_ERROR(validate_segments(segs, kinds));
    if (segs.empty()) return invalid_argument("assemble: no segments");
    if (chunk_tokens == 0) return invalid_argument("assemble: chunk_tokens must be positive");
    // The fingerprint that roots every hash must describe the chunking used here.
    if (prof.chunk_tokens != chunk_tokens)
        return invalid_argument("assemble: chunk_tokens " + std::to_string(chunk_tokens) +
                                " differs from the profile's " + std::to_string(prof.chunk_tokens));

    const std::vector<const segment *> order = canonical_order(segs, kinds);

    assembled_prompt out;
    manifest & man = out.man;
    std::vector<piece> pieces;
    WARMCTX_RETURN_IF_ERROR(append_tokens(out.tokens, model.prefix_tokens()));

    std::vector<std::string> roles;
    roles.reserve(order.size());
    for (const segment * s : order) {
        const kind_policy & p = kinds.policy(s->kind);
        roles.push_back((p.role_from_segment && !s->role.empty()) ? s->role : p.role);
    }
    // Per segment: its tokens and the class of the piece it ends (its own class, or in
    // a conversation rendered whole the lowest class of the segments sharing a piece).
    std::vector<result<std::vector<token_id>>> seg_tokens;
    std::vector<retention_class> piece_cls;
    std::vector<std::vector<size_t>> sub_cuts(order.size());  // pieces inside a segment (a diff's units)
    std::optional<std::vector<token_id>> gen_tokens;  // the conversation path's
    if (model.renders_conversations()) {
        auto ct = tokenize_conversation(order, roles, kinds, model, add_generation_prompt);
        if (!ct.ok()) return ct.error();
        seg_tokens = std::move(ct->seg);
        piece_cls = std::move(ct->piece_cls);
        gen_tokens = std::move(ct->gen);
        sub_cuts = std::move(ct->sub_cuts);
    } else {
        seg_tokens = tokenize_segments(order, roles, kinds, model);
        for (const segment * s : order) piece_cls.push_back(kinds.policy(s->kind).retention);
    }

    for (size_t i = 0; i < order.size(); ++i) {
        const segment * s = order[i];
        const kind_policy & p = kinds.policy(s->kind);
        const std::string & role = roles[i];
        if (!seg_tokens[i].ok()) return seg_tokens[i].error();
        const std::vector<token_id> & toks = *seg_tokens[i];

        manifest_entry e;
        e.id = s->id;
        e.kind = s->kind;
        e.path = s->path;
        e.role = role;
        e.order = p.order;
        e.stab = p.stab;
        e.cls = p.retention;
        // The first segment's range also holds the model's prefix tokens (BOS).
        e.token_begin = man.segments.empty() ? 0 : static_cast<pos_t>(out.tokens.size());
        const auto toks_begin = static_cast<pos_t>(out.tokens.size());
        WARMCTX_RETURN_IF_ERROR(append_tokens(out.tokens, toks));
        e.token_end = static_cast<pos_t>(out.tokens.size());
        e.content_bytes = s->content.size();
        e.content_hash = segment_content_hash(*s);
        e.token_hash = hash_tokens(std::span(out.tokens).subspan(e.token_begin, e.n_tokens()));
        // A segment that shares the next segment's piece has no tokens of its own.
        // (Pieces cover the prompt without gaps: the first also holds the prefix tokens.)
        pos_t piece_begin = pieces.empty() ? 0 : pieces.back().end;
        for (size_t c : sub_cuts[i]) {  // pieces inside it first
            const pos_t at = toks_begin + static_cast<pos_t>(c);
            if (at <= piece_begin || at >= e.token_end) continue;
            pieces.push_back({piece_begin, at, piece_cls[i], static_cast<int>(man.segments.size())});
            piece_begin = at;
        }
        if (e.token_end > piece_begin)
            pieces.push_back({piece_begin, e.token_end, piece_cls[i], static_cast<int>(man.segments.size())});
        man.segments.push_back(std::move(e));
    }

    if (add_generation_prompt) {
        auto toks = gen_tokens ? result<std::vector<token_id>>(std::move(*gen_tokens))
                               : model.tokenize(model.generation_prompt());
        if (!toks.ok()) return toks.error().with_context("generation prompt: tokenizing");
        man.generation_prompt_begin = static_cast<pos_t>(out.tokens.size());
        WARMCTX_RETURN_IF_ERROR(append_tokens(out.tokens, *toks));
        man.generation_prompt_end = static_cast<pos_t>(out.tokens.size());
        if (man.generation_prompt_end > man.generation_prompt_begin)
            pieces.push_back({man.generation_prompt_begin, man.generation_prompt_end, retention_class::none,
                              k_generation_prompt_index});
    }
    const auto n_tokens = static_cast<pos_t>(out.tokens.size());
    man.n_tokens = n_tokens;

    build_blocks(out, pieces, prof, tenant_salt, chunk_tokens);

    // The stable prefix: the leading run of `stable` segments.
    out.stable_prefix_hash = out.root_hash;
    for (const manifest_entry & e : man.segments) {
        if (e.stab != stability::stable) break;
        out.stable_end = e.token_end;
    }
    for (const block & b : out.blocks)
        if (b.end == out.stable_end) out.stable_prefix_hash = b.chain;
    for (const manifest_entry & e : man.segments)
        if (e.stab == stability::stable) out.n_stable_tokens += e.n_tokens();

    man.stable_end = out.stable_end;
    man.n_stable_tokens = out.n_stable_tokens;
    man.stable_prefix_hash = out.stable_prefix_hash;
    man.profile_fingerprint = prof.fingerprint();
    return out;
}

result<assembled_prompt> assemble_raw(const segment & prompt, const std::optional<std::string> & suffix,
                                      const text_model & model, const profile & prof, std::string_view tenant_salt,
                                      uint32_t chunk_tokens) {
    if (prompt.content.empty()) return invalid_argument("assemble_raw: the prompt is empty");
    if (chunk_tokens == 0 || prof.chunk_tokens != chunk_tokens)
        return invalid_argument("assemble_raw: chunk_tokens must be the profile's");
    std::optional<text_model::fim_tokens> fim;
    if (suffix) {
        fim = model.fim();
        if (!fim) return invalid_argument("this model's vocabulary has no fill-in-the-middle tokens");
    }
    assembled_prompt out;
    manifest & man = out.man;
    std::vector<piece> pieces;
    WARMCTX_RETURN_IF_ERROR(append_tokens(out.tokens, model.prefix_tokens()));
    if (fim) out.tokens.push_back(fim->prefix);
    auto toks = model.tokenize(prompt.content);
    if (!toks.ok()) return toks.error().with_context("the prompt: tokenizing");
    WARMCTX_RETURN_IF_ERROR(append_tokens(out.tokens, *toks));
    manifest_entry e;
    e.id = prompt.id;
    e.kind = prompt.kind;
    e.cls = retention_class::low;
    e.token_begin = 0;
    e.token_end = static_cast<pos_t>(out.tokens.size());
    e.content_bytes = prompt.content.size();
    e.content_hash = hash_string(prompt.content);
    e.token_hash = hash_tokens(out.tokens);
    pieces.push_back({e.token_begin, e.token_end, e.cls, 0});
    man.segments.push_back(std::move(e));
    if (fim) {
        manifest_entry f;
        f.id = "suffix";
        f.kind = segment_kind::user;
        f.cls = retention_class::none;
        f.token_begin = static_cast<pos_t>(out.tokens.size());
        out.tokens.push_back(fim->suffix);
        auto st = model.tokenize(*suffix);
        if (!st.ok()) return st.error().with_context("the suffix: tokenizing");
        WARMCTX_RETURN_IF_ERROR(append_tokens(out.tokens, *st));
        out.tokens.push_back(fim->middle);
        f.token_end = static_cast<pos_t>(out.tokens.size());
        f.content_bytes = suffix->size();
        f.content_hash = hash_string(*suffix);
        f.token_hash = hash_tokens(std::span(out.tokens).subspan(f.token_begin, f.n_tokens()));
        pieces.push_back({f.token_begin, f.token_end, f.cls, 1});
        man.segments.push_back(std::move(f));
    }
    man.n_tokens = static_cast<pos_t>(out.tokens.size());
    build_blocks(out, pieces, prof, tenant_salt, chunk_tokens);
    out.stable_prefix_hash = out.root_hash;
    man.stable_prefix_hash = out.stable_prefix_hash;
    man.profile_fingerprint = prof.fingerprint();
    return out;
}

reuse_point snap_reuse(const assembled_prompt & ap, size_t n_blocks) {
    const auto n = static_cast<pos_t>(ap.tokens.size());
    size_t k = std::min(n_blocks, ap.blocks.size());
    while (k > 0 && ap.blocks[k - 1].end >= n) --k;
    return {k, k == 0 ? 0 : ap.blocks[k - 1].end};
}

// ---- manifest JSON and table -------------------------------------------------------

nlohmann::json manifest::to_json() const {
    nlohmann::json segs = nlohmann::json::array();
    for (const manifest_entry & e : segments) {
        segs.push_back({
            {"id", e.id},
            {"kind", segment_kind_name(e.kind)},
            {"path", e.path},
            {"role", e.role},
            {"order", e.order},
            {"stability", stability_name(e.stab)},
            {"class", retention_class_name(e.cls)},
            {"token_begin", e.token_begin},
            {"token_end", e.token_end},
            {"n_tokens", e.n_tokens()},
            {"content_bytes", e.content_bytes},
            {"content_hash", e.content_hash.hex()},
            {"token_hash", e.token_hash.hex()},
        });
    }
    return {
        {"n_tokens", n_tokens},
        {"generation_prompt_begin", generation_prompt_begin},
        {"generation_prompt_end", generation_prompt_end},
        {"stable_end", stable_end},
        {"n_stable_tokens", n_stable_tokens},
        {"stable_prefix_hash", stable_prefix_hash.hex()},
        {"profile_fingerprint", profile_fingerprint.hex()},
        {"segments", std::move(segs)},
    };
}

namespace {

// Strict field readers for manifest::from_json (warmctx/json.h); `where` names the object.
std::string field_where(const std::string & where, const char * key) { return where + ": field '" + key + "'"; }

result<std::string> get_string(const nlohmann::json & j, const char * key, const std::string & where) {
    auto f = json_field(j, key, where);
    if (!f.ok()) return f.error();
    return json_as_string(**f, field_where(where, key));
}

template <typename T>
result<T> get_int(const nlohmann::json & j, const char * key, const std::string & where) {
    auto f = json_field(j, key, where);
    if (!f.ok()) return f.error();
    constexpr int64_t hi = std::numeric_limits<T>::max() > uint64_t(std::numeric_limits<int64_t>::max())
                               ? std::numeric_limits<int64_t>::max()
                               : int64_t(std::numeric_limits<T>::max());
    auto v = json_as_int(**f, field_where(where, key), int64_t(std::numeric_limits<T>::min()), hi);
    if (!v.ok()) return v.error();
    return static_cast<T>(*v);
}

result<hash128> get_hash(const nlohmann::json & j, const char * key, const std::string & where) {
    auto s = get_string(j, key, where);
    if (!s.ok()) return s.error();
    auto h = parse_hash128(*s);
    if (!h.ok()) return h.error().with_context(where + ": field '" + key + "'");
    return h;
}

#define WARMCTX_ASSIGN(lhs, expr)             \
    do {                                      \
        auto _wc_r = (expr);                  \
        if (!_wc_r.ok()) return _wc_r.error(); \
        lhs = std::move(*_wc_r);              \
    } while (0)

}  // namespace

result<manifest> manifest::from_json(const nlohmann::json & j) {
    const std::string where = "manifest";
    if (!j.is_object()) return invalid_argument("manifest: must be a JSON object");
    manifest m;
    WARMCTX_ASSIGN(m.n_tokens, get_int<pos_t>(j, "n_tokens", where));
    WARMCTX_ASSIGN(m.generation_prompt_begin, get_int<pos_t>(j, "generation_prompt_begin", where));
    WARMCTX_ASSIGN(m.generation_prompt_end, get_int<pos_t>(j, "generation_prompt_end", where));
    WARMCTX_ASSIGN(m.stable_end, get_int<pos_t>(j, "stable_end", where));
    WARMCTX_ASSIGN(m.n_stable_tokens, get_int<pos_t>(j, "n_stable_tokens", where));
    WARMCTX_ASSIGN(m.stable_prefix_hash, get_hash(j, "stable_prefix_hash", where));
    WARMCTX_ASSIGN(m.profile_fingerprint, get_hash(j, "profile_fingerprint", where));
    auto segs_field = json_field(j, "segments", where);
    if (!segs_field.ok()) return segs_field.error();
    if (!(*segs_field)->is_array()) return invalid_argument("manifest: field 'segments' must be an array");
    for (size_t i = 0; i < j.at("segments").size(); ++i) {
        const auto & s = j.at("segments")[i];
        const std::string at = "manifest: segments[" + std::to_string(i) + "]";
        if (!s.is_object()) return invalid_argument(at + ": must be an object");
        manifest_entry e;
        WARMCTX_ASSIGN(e.id, get_string(s, "id", at));
        std::string name;
        WARMCTX_ASSIGN(name, get_string(s, "kind", at));
        WARMCTX_ASSIGN(e.kind, parse_segment_kind(name));
        WARMCTX_ASSIGN(e.path, get_string(s, "path", at));
        WARMCTX_ASSIGN(e.role, get_string(s, "role", at));
        WARMCTX_ASSIGN(e.order, get_int<int>(s, "order", at));
        WARMCTX_ASSIGN(name, get_string(s, "stability", at));
        WARMCTX_ASSIGN(e.stab, parse_stability(name));
        WARMCTX_ASSIGN(name, get_string(s, "class", at));
        WARMCTX_ASSIGN(e.cls, parse_retention_class(name));
        WARMCTX_ASSIGN(e.token_begin, get_int<pos_t>(s, "token_begin", at));
        WARMCTX_ASSIGN(e.token_end, get_int<pos_t>(s, "token_end", at));
        WARMCTX_ASSIGN(e.content_bytes, get_int<uint64_t>(s, "content_bytes", at));
        WARMCTX_ASSIGN(e.content_hash, get_hash(s, "content_hash", at));
        WARMCTX_ASSIGN(e.token_hash, get_hash(s, "token_hash", at));
        if (e.token_begin < 0 || e.token_end < e.token_begin)
            return invalid_argument(at + ": bad token range");
        m.segments.push_back(std::move(e));
    }
    return m;
}

std::string manifest::to_table() const {
    std::string out;
    char line[512];
    std::snprintf(line, sizeof line, "%3s  %-12s  %-10s  %-7s  %-15s  %7s  %-12s  %-12s  %s\n", "#", "kind",
                  "stability", "class", "tokens", "n", "content", "token_hash", "id (path)");
    out += line;
    for (size_t i = 0; i < segments.size(); ++i) {
        const manifest_entry & e = segments[i];
        char range[48];
        std::snprintf(range, sizeof range, "[%d, %d)", e.token_begin, e.token_end);
        std::string name = e.id;
        if (!e.path.empty() && e.path != e.id) name += " (" + e.path + ")";
        std::snprintf(line, sizeof line, "%3zu  %-12s  %-10s  %-7s  %-15s  %7d  %-12s  %-12s  ", i,
                      std::string(segment_kind_name(e.kind)).c_str(), std::string(stability_name(e.stab)).c_str(),
                      std::string(retention_class_name(e.cls)).c_str(), range, e.n_tokens(),
                      e.content_hash.short_hex().c_str(), e.token_hash.short_hex().c_str());
        out += line;
        out += name;
        out += '\n';
    }
    if (generation_prompt_begin >= 0) {
        std::snprintf(line, sizeof line, "  -  %-12s  %-10s  %-7s  [%d, %d)\n", "(generation)", "-", "none",
                      generation_prompt_begin, generation_prompt_end);
        out += line;
    }
    std::snprintf(line, sizeof line, "%d tokens, stable prefix [0, %d) %s, %d tokens in stable segments, profile %s\n",
                  n_tokens, stable_end, stable_prefix_hash.short_hex().c_str(), n_stable_tokens,
                  profile_fingerprint.short_hex().c_str());
    out += line;
    return out;
}

// ---- manifest diff ---------------------------------------------------------------------

std::string_view segment_change_kind_name(segment_change_kind k) {
    switch (k) {
        case segment_change_kind::appeared: return "appeared";
        case segment_change_kind::disappeared: return "disappeared";
        case segment_change_kind::content_changed: return "content_changed";
        case segment_change_kind::tokens_changed: return "tokens_changed";
        case segment_change_kind::moved: return "moved";
    }
    return "unknown";
}

std::string segment_change::to_string() const {
    std::string s = "segment " + quote_input(id);
    switch (what) {
        case segment_change_kind::appeared: return s + " appeared";
        case segment_change_kind::disappeared: return s + " disappeared";
        case segment_change_kind::content_changed: return s + " changed (content)";
        case segment_change_kind::tokens_changed:
            return s + " changed (tokens: same content, different kind, role, template or tokenizer)";
        case segment_change_kind::moved:
            return s + " moved (unchanged, now starts at token " + std::to_string(after_begin) + ", was " +
                   std::to_string(before_begin) + ")";
    }
    return s;
}

std::vector<segment_change> diff_manifests(const manifest & before, const manifest & after) {
    std::map<std::string_view, const manifest_entry *> old_by_id, new_by_id;
    for (const auto & e : before.segments) old_by_id[e.id] = &e;
    for (const auto & e : after.segments) new_by_id[e.id] = &e;

    // The union, each under the entry that describes it best (after's when present).
    std::vector<const manifest_entry *> all;
    for (const auto & e : after.segments) all.push_back(&e);
    for (const auto & e : before.segments)
        if (!new_by_id.count(e.id)) all.push_back(&e);
    std::sort(all.begin(), all.end(), [](const manifest_entry * a, const manifest_entry * b) {
        return std::tie(a->order, a->id, a->path) < std::tie(b->order, b->id, b->path);
    });

    std::vector<segment_change> out;
    for (const manifest_entry * e : all) {
        const auto o = old_by_id.find(e->id);
        const auto n = new_by_id.find(e->id);
        segment_change c;
        c.id = e->id;
        if (o == old_by_id.end()) {
            c.what = segment_change_kind::appeared;
            c.after_begin = n->second->token_begin;
        } else if (n == new_by_id.end()) {
            c.what = segment_change_kind::disappeared;
            c.before_begin = o->second->token_begin;
        } else {
            c.before_begin = o->second->token_begin;
            c.after_begin = n->second->token_begin;
            if (o->second->content_hash != n->second->content_hash) c.what = segment_change_kind::content_changed;
            else if (o->second->token_hash != n->second->token_hash) c.what = segment_change_kind::tokens_changed;
            else if (c.before_begin != c.after_begin) c.what = segment_change_kind::moved;
            else continue;  // unchanged
        }
        out.push_back(std::move(c));
    }
    return out;
}

}  // namespace warmctx
