// Assembly: validates and orders the segments, renders and tokenizes them (the
// per-message path in tokenize.cpp, the conversation path in conversation_tokens.cpp),
// and puts the prompt, its manifest and its blocks together.
#include "warmctx/assembler.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "assembly.h"
#include "quote.h"

namespace warmctx {

using detail::message_content;
using detail::piece;
using detail::quote_input;
using detail::tokenize_conversation;
using detail::tokenize_segments;

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
            return invalid_argument("segment id " + quote_input(id) +
                                    " has an empty path component (leading, trailing or doubled '/')");
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

bool is_chat_message(const segment & s) {
    return s.kind == segment_kind::user || (s.kind == segment_kind::history && !s.role.empty());
}

namespace {

// A chat message that is not an assistant's, right after a piece of another chat
// message, shares that piece's chunk run (build_blocks): a run begins at an assistant
// message. Pieces' segment_index is the segment's index in `order` (the manifest's).
void mark_continuing_messages(std::vector<detail::piece> & pieces, std::span<const segment * const> order,
                              const std::vector<std::string> & roles) {
    for (size_t p = 1; p < pieces.size(); ++p) {
        const int i = pieces[p].segment_index, before = pieces[p - 1].segment_index;
        if (i < 0 || before < 0 || before == i) continue;  // the generation prompt, or inside a segment
        pieces[p].after_message = is_chat_message(*order[(size_t)i]) && is_chat_message(*order[(size_t)before]);
        pieces[p].continues = pieces[p].after_message && roles[(size_t)i] != "assistant";
    }
}


constexpr auto k_max_tokens = static_cast<size_t>(std::numeric_limits<pos_t>::max());

status append_tokens(std::vector<token_id> & out, const std::vector<token_id> & more) {
    if (more.size() > k_max_tokens - out.size())
        return out_of_range("the prompt is longer than " + std::to_string(k_max_tokens) + " tokens");
    out.insert(out.end(), more.begin(), more.end());
    return {};
}

}  // namespace

// Canonical order: (kind order, id, path). Ids are unique, so this is total and the
// input order cannot leak through. Then each run of stable segments of one class takes
// the learned order.
std::vector<const segment *> ordered_segments(std::span<const segment> segs, const kind_table & kinds,
                                              std::span<const std::string> learned) {
    std::vector<const segment *> order(segs.size());
    for (size_t i = 0; i < segs.size(); ++i) order[i] = &segs[i];
    std::sort(order.begin(), order.end(), [&](const segment * a, const segment * b) {
        return std::forward_as_tuple(kinds.policy(a->kind).order, a->id, a->path) <
               std::forward_as_tuple(kinds.policy(b->kind).order, b->id, b->path);
    });
    if (learned.empty()) return order;
    std::unordered_map<std::string_view, size_t> rank;
    for (size_t i = 0; i < learned.size(); ++i) rank.emplace(learned[i], i + 1);
    auto rank_of = [&](const segment * s) {
        auto it = rank.find(s->id);
        return it == rank.end() ? size_t{0} : it->second;
    };
    for (size_t b = 0; b < order.size();) {
        const kind_policy & p = kinds.policy(order[b]->kind);
        size_t e = b + 1;
        if (is_reorderable(*order[b], kinds))
            while (e < order.size() && is_reorderable(*order[e], kinds) &&
                   kinds.policy(order[e]->kind).retention == p.retention)
                ++e;
        if (e - b > 1)
            std::stable_sort(order.begin() + (long)b, order.begin() + (long)e,
                             [&](const segment * x, const segment * y) { return rank_of(x) < rank_of(y); });
        b = e;
    }
    return order;
}

std::vector<segment> leading_segments(std::span<const segment> segs, const kind_table & kinds,
                                      const text_model & model, size_t min_rest_bytes, size_t max_lead_bytes,
                                      std::span<const std::string> learned) {
    const std::vector<const segment *> order = ordered_segments(segs, kinds, learned);
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

// The last segment's piece takes the generation prompt in (assembly_hints::
// fuse_generation_prompt: one decode call for the turn's tail); the piece is then of
// class none, never kept for another turn.
void fuse_generation_prompt(std::vector<piece> & pieces, size_t n_segments) {
    if (pieces.size() < 2 || pieces.back().segment_index != k_generation_prompt_index) return;
    piece & last = pieces[pieces.size() - 2];
    if (last.end != pieces.back().begin || last.segment_index != static_cast<int>(n_segments) - 1) return;
    last.end = pieces.back().end;
    last.retention = retention_class::none;
    pieces.pop_back();
}

// Per segment in `order`: cut into finer blocks from that many bytes of its text on
// (assembly_hints::fine, fine_from), or not.
std::vector<std::optional<size_t>> fine_segments(std::span<const segment * const> order, const kind_table & kinds,
                                                 const assembly_hints & hints) {
    std::vector<std::optional<size_t>> fine(order.size());
    for (size_t i = 0; i < order.size(); ++i)
        if (kinds.policy(order[i]->kind).how_stable == stability::stable &&
            std::find(hints.fine.begin(), hints.fine.end(), order[i]->id) != hints.fine.end()) {
            auto from = hints.fine_from.find(order[i]->id);
            fine[i] = from == hints.fine_from.end() ? 0 : (size_t)from->second;
        }
    return fine;
}

// From the first chat message on, every piece is of class none (assembly_hints::
// fuse_conversation): one chunk run, cut only by the chunk size, never kept for another
// turn. Pieces' segment_index is the segment's index in `order`.
void fuse_conversation(std::vector<piece> & pieces, std::span<const segment * const> order) {
    size_t p = 0;
    while (p < pieces.size() &&
           !(pieces[p].segment_index >= 0 && is_chat_message(*order[(size_t)pieces[p].segment_index])))
        ++p;
    for (; p < pieces.size(); ++p) pieces[p].retention = retention_class::none;
}

// The generation prompt (the conversation path's tokens, else the template's text), and
// the client's start of the answer after it: one piece of class none.
static status append_generation_prompt(assembled_prompt & out, std::vector<piece> & pieces, const text_model & model,
                                std::optional<std::vector<token_id>> gen_tokens, std::string_view continuation) {
    manifest & m = out.prompt_manifest;
    auto toks =
        gen_tokens ? result<std::vector<token_id>>(std::move(*gen_tokens)) : model.tokenize(model.generation_prompt());
    if (!toks.ok()) return toks.error().with_context("generation prompt: tokenizing");
    m.generation_prompt_begin = static_cast<pos_t>(out.tokens.size());
    WARMCTX_RETURN_IF_ERROR(append_tokens(out.tokens, *toks));
    if (!continuation.empty()) {  // text, as a message's: no special tokens read in it
        auto more = model.tokenize_plain(continuation);
        if (!more.ok()) return more.error().with_context("the assistant's continuation: tokenizing");
        WARMCTX_RETURN_IF_ERROR(append_tokens(out.tokens, *more));
    }
    m.generation_prompt_end = static_cast<pos_t>(out.tokens.size());
    if (m.generation_prompt_end > m.generation_prompt_begin)
        pieces.push_back(
            {m.generation_prompt_begin, m.generation_prompt_end, retention_class::none, k_generation_prompt_index});
    return {};
}

result<assembled_prompt> assemble(std::span<const segment> segs, const kind_table & kinds,
                                  const text_model & model, const profile & prof,
                                  std::string_view tenant_salt, uint32_t chunk_tokens,
                                  bool add_generation_prompt, const assembly_hints & hints,
                                  std::string_view continuation) {
    WARMCTX_RETURN_IF_ERROR(validate_segments(segs, kinds));
    if (segs.empty()) return invalid_argument("assemble: no segments");
    if (chunk_tokens == 0) return invalid_argument("assemble: chunk_tokens must be positive");
    // The fingerprint that roots every hash must describe the chunking used here.
    if (prof.chunk_tokens != chunk_tokens)
        return invalid_argument("assemble: chunk_tokens " + std::to_string(chunk_tokens) +
                                " differs from the profile's " + std::to_string(prof.chunk_tokens));

    const std::vector<const segment *> order = ordered_segments(segs, kinds, hints.order);

    assembled_prompt out;
    out.hints = hints;
    manifest & prompt_manifest = out.prompt_manifest;
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
        auto ct = tokenize_conversation(order, roles, kinds, model, add_generation_prompt,
                                        fine_segments(order, kinds, hints));
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
        e.how_stable = p.how_stable;
        e.retention = p.retention;
        // The first segment's range also holds the model's prefix tokens (BOS).
        e.token_begin = prompt_manifest.segments.empty() ? 0 : static_cast<pos_t>(out.tokens.size());
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
            pieces.push_back({piece_begin, at, piece_cls[i], static_cast<int>(prompt_manifest.segments.size())});
            piece_begin = at;
        }
        if (e.token_end > piece_begin)
            pieces.push_back(
                {piece_begin, e.token_end, piece_cls[i], static_cast<int>(prompt_manifest.segments.size())});
        prompt_manifest.segments.push_back(std::move(e));
    }

    if (add_generation_prompt)
        WARMCTX_RETURN_IF_ERROR(append_generation_prompt(out, pieces, model, std::move(gen_tokens), continuation));
    const auto n_tokens = static_cast<pos_t>(out.tokens.size());
    prompt_manifest.n_tokens = n_tokens;
    if (hints.fuse_generation_prompt) fuse_generation_prompt(pieces, prompt_manifest.segments.size());
    for (size_t i = 0; i < order.size() && !out.first_chat_message; ++i)
        if (is_chat_message(*order[i])) out.first_chat_message = i;
    if (hints.fuse_conversation) fuse_conversation(pieces, order);
    mark_continuing_messages(pieces, order, roles);
    detail::build_blocks(out, pieces, prof, tenant_salt, chunk_tokens);

    // The stable prefix: the leading run of `stable` segments.
    out.stable_prefix_hash = out.root_hash;
    for (const manifest_entry & e : prompt_manifest.segments) {
        if (e.how_stable != stability::stable) break;
        out.stable_end = e.token_end;
    }
    for (const block & b : out.blocks)
        if (b.end == out.stable_end) out.stable_prefix_hash = b.chain;
    for (const manifest_entry & e : prompt_manifest.segments)
        if (e.how_stable == stability::stable) out.n_stable_tokens += e.n_tokens();

    prompt_manifest.stable_end = out.stable_end;
    prompt_manifest.n_stable_tokens = out.n_stable_tokens;
    prompt_manifest.stable_prefix_hash = out.stable_prefix_hash;
    prompt_manifest.profile_fingerprint = prof.fingerprint();
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
    manifest & prompt_manifest = out.prompt_manifest;
    std::vector<piece> pieces;
    WARMCTX_RETURN_IF_ERROR(append_tokens(out.tokens, model.prefix_tokens()));
    if (fim) out.tokens.push_back(fim->prefix);
    auto toks = model.tokenize(prompt.content);
    if (!toks.ok()) return toks.error().with_context("the prompt: tokenizing");
    WARMCTX_RETURN_IF_ERROR(append_tokens(out.tokens, *toks));
    manifest_entry e;
    e.id = prompt.id;
    e.kind = prompt.kind;
    e.retention = retention_class::low;
    e.token_begin = 0;
    e.token_end = static_cast<pos_t>(out.tokens.size());
    e.content_bytes = prompt.content.size();
    e.content_hash = hash_string(prompt.content);
    e.token_hash = hash_tokens(out.tokens);
    pieces.push_back({e.token_begin, e.token_end, e.retention, 0});
    prompt_manifest.segments.push_back(std::move(e));
    if (fim) {
        manifest_entry f;
        f.id = "suffix";
        f.kind = segment_kind::user;
        f.retention = retention_class::none;
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
        pieces.push_back({f.token_begin, f.token_end, f.retention, 1});
        prompt_manifest.segments.push_back(std::move(f));
    }
    prompt_manifest.n_tokens = static_cast<pos_t>(out.tokens.size());
    detail::build_blocks(out, pieces, prof, tenant_salt, chunk_tokens);
    out.stable_prefix_hash = out.root_hash;
    prompt_manifest.stable_prefix_hash = out.stable_prefix_hash;
    prompt_manifest.profile_fingerprint = prof.fingerprint();
    return out;
}

}  // namespace warmctx
