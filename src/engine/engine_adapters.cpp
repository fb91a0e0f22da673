// The engine behind the seam of the layers below it, text_model (the assembler), and the
// profile of the KV it computes.
#include "engine/engine_adapters.h"
#include "warmctx/assembler.h"

#include <list>
#include <mutex>
#include <unordered_map>

#include "warmctx/chat_template.h"

namespace warmctx {

namespace {

// Tokens of texts by content hash (and length), least recently used out past a bound of
// token ids, each entry charged k_entry_cost more for its bookkeeping (so many tiny texts
// cannot grow it without bound); a text with more than a quarter of the bound is not
// kept. Thread-safe.
class token_memo {
  public:
    explicit token_memo(size_t max_tokens) : max_tokens_(max_tokens) {}
    std::optional<std::vector<token_id>> get(std::string_view text) const {
        const hash128 key = hash_string(text);
        std::lock_guard lk(mu_);
        if (auto it = index_.find(key); it != index_.end() && it->second->n_bytes == text.size()) {
            lru_.splice(lru_.begin(), lru_, it->second);
            return it->second->tokens;
        }
        return std::nullopt;
    }
    void put(std::string_view text, const std::vector<token_id> & t) const {
        if (t.size() > max_tokens_ / 4) return;
        const hash128 key = hash_string(text);
        std::lock_guard lk(mu_);
        if (index_.count(key)) return;
        lru_.push_front({key, text.size(), t});
        index_[key] = lru_.begin();
        tokens_ += t.size() + k_entry_cost;
        while (tokens_ > max_tokens_ && !lru_.empty()) {
            tokens_ -= lru_.back().tokens.size() + k_entry_cost;
            index_.erase(lru_.back().key);
            lru_.pop_back();
        }
    }

  private:
    static constexpr size_t k_entry_cost = 32;  // in token ids: 128 bytes
    struct entry {
        hash128 key;
        size_t n_bytes = 0;
        std::vector<token_id> tokens;
    };
    const size_t max_tokens_;
    mutable std::mutex mu_;
    mutable std::list<entry> lru_;
    mutable std::unordered_map<hash128, std::list<entry>::iterator, hash128_hasher> index_;
    mutable size_t tokens_ = 0;
};

// text_model over the real engine: the model's tokenizer and its chat template.
class engine_text_model final : public text_model {
  public:
    explicit engine_text_model(const engine & e) : e_(e) {
        const model_info & mi = e.model();
        if (e.options().jinja && !mi.chat_template.empty()) {
            auto t = chat_templates::load({mi.chat_template, mi.bos_text, mi.eos_text, /*strip_bos=*/false,
                                           e.special_token_texts()});
            if (t.ok()) jinja_ = std::move(*t);
        }
        // The generation prompt is what add_generation_prompt appends to a conversation.
        std::vector<chat_message> one = {{"user", "x"}};
        auto with = e_.apply_chat_template(one, true);
        auto without = e_.apply_chat_template(one, false);
        if (with.ok() && without.ok() && with->size() >= without->size() &&
            with->compare(0, without->size(), *without) == 0)
            gen_prompt_ = with->substr(without->size());
        splits_at_lines_ = probe_line_splits(k_line_probe, is_line_cut);
        splits_at_any_line_ = splits_at_lines_ && probe_line_splits(k_any_line_probe, is_any_line_cut);
    }
    // Text with special tokens: the template's own text between contents (the system
    // prompt's tools block, role headers), the same turn after turn; remembered too.
    result<std::vector<token_id>> tokenize(std::string_view text) const override {
        if (auto m = special_memo_.get(text)) return std::move(*m);
        auto t = e_.tokenize(text, true);
        if (t.ok()) special_memo_.put(text, *t);
        return t;
    }
    std::optional<fim_tokens> fim() const override {
        auto f = e_.fim_tokens();
        if (!f) return std::nullopt;
        return fim_tokens{(*f)[0], (*f)[1], (*f)[2]};
    }
    // Segment contents repeat turn after turn (a 47k-token stable context is mostly
    // the same few texts), and tokenizing them is most of a warm turn's CPU time; so
    // their tokens are remembered by content hash, least recently used first out.
    std::optional<std::vector<token_id>> remembered_plain(std::string_view text) const override {
        if (text.size() < k_memo_min_bytes) return std::nullopt;
        return plain_memo_.get(text);
    }
    result<std::vector<token_id>> tokenize_plain(std::string_view text) const override {
        if (text.size() < k_memo_min_bytes) return e_.tokenize(text, false);
        if (auto m = remembered_plain(text)) return std::move(*m);
        auto t = e_.tokenize(text, false);
        if (t.ok()) remember_plain(text, *t);
        return t;
    }
    result<std::vector<token_id>> tokenize_plain_part(std::string_view text) const override {
        return e_.tokenize(text, false);
    }
    bool plain_splits_at_lines() const override { return splits_at_lines_; }
    bool plain_splits_at_any_line() const override { return splits_at_any_line_; }
    void remember_plain(std::string_view text, const std::vector<token_id> & t) const override {
        if (text.size() < k_memo_min_bytes) return;
        plain_memo_.put(text, t);
    }
    result<std::string> render_message(std::string_view role, std::string_view content) const override {
        std::vector<chat_message> m = {{std::string(role), std::string(content)}};
        return e_.apply_chat_template(m, false);
    }
    std::string generation_prompt() const override { return gen_prompt_; }
    bool renders_conversations() const override { return jinja_ != nullptr; }
    bool renders_contents_verbatim() const override { return jinja_ && jinja_->contents_verbatim(); }
    bool remembers_renders() const override { return true; }
    // Renders of small inputs (the assembler's skeletons: the same every turn) are
    // remembered, least recently used out past k_render_memo_bytes.
    result<rendered_conversation> render_conversation(std::span<const conversation_message> msgs,
                                                      std::string_view tools_json,
                                                      bool add_generation_prompt) const override {
        if (!jinja_) return failed_precondition("the model's chat template is not rendered as Jinja");
        size_t in_bytes = tools_json.size();
        for (const auto & m : msgs)
            in_bytes += m.role.size() + m.content.size() + m.tool_calls.size() + m.tool_call_id.size();
        if (in_bytes > k_render_memo_max_input) return jinja_->render(msgs, tools_json, add_generation_prompt);
        std::string key;
        key.reserve(in_bytes + 8 * msgs.size() + 2);
        key += add_generation_prompt ? 'g' : 'n';
        for (const auto & m : msgs)
            for (const std::string * f : {&m.role, &m.content, &m.tool_calls, &m.tool_call_id}) {
                key += std::to_string(f->size());
                key += ':';
                key += *f;
            }
        key += tools_json;
        const hash128 h = hash_string(key);
        {
            std::lock_guard lk(render_mu_);
            if (auto it = renders_.find(h); it != renders_.end()) {
                render_lru_.splice(render_lru_.begin(), render_lru_, it->second);
                return it->second->r;
            }
        }
        auto r = jinja_->render(msgs, tools_json, add_generation_prompt);
        if (!r.ok()) return r;
        std::lock_guard lk(render_mu_);
        if (!renders_.count(h)) {
            render_lru_.push_front({h, *r});
            renders_[h] = render_lru_.begin();
            render_bytes_ += r->text.size() + 64;
            while (render_bytes_ > k_render_memo_bytes && !render_lru_.empty()) {
                render_bytes_ -= render_lru_.back().r.text.size() + 64;
                renders_.erase(render_lru_.back().key);
                render_lru_.pop_back();
            }
        }
        return r;
    }
    const chat_templates * templates() const { return jinja_.get(); }

  private:
    // Whether cutting a text before a line that starts with an ASCII letter or digit, or
    // with a diff's "@@ " (is_line_cut), leaves its plain tokens unchanged
    // (text_model::plain_splits_at_lines): true for byte-level BPE tokenizers whose
    // pre-tokenizer ends a word at a line break (Qwen2, Llama 3, GPT-style); false for
    // SentencePiece, which adds a space to each text. Asked of this tokenizer on a probe
    // of code, prose, markup and diff lines.
    static constexpr std::string_view k_line_probe =
        "src/engine/engine.cpp: 923 lines\n  class engine; struct impl {};\nint main(int argc, char ** argv) {\n"
        "    return 0;\n}\n\nThe quick brown fox, again.\n- item one\n1. first\nfoo_bar = {\"a\": 1}\n\t\tx\n"
        "<|im_end|> not special here\n  \nEnd\n\r\nZ99 and 42\n7 days\n"
        "diff --git a/src/x.cc b/src/x.cc\n--- a/src/x.cc\n+++ b/src/x.cc\n@@ -1,3 +1,4 @@\n int a;\n-int b;\n+int c;\n"
        "@@ -40,2 +41,2 @@ void f() {\n   return;\n";
    // The same before any line that is not blank (is_any_line_cut: indented code,
    // closing braces, comments, markup, list items), over indentation of spaces and tabs,
    // blank lines with and without spaces, CRLF endings, trailing spaces, contractions and
    // non-ASCII text. GPT-2's pre-tokenizer joins a line break to the next line's
    // indentation and fails it; Qwen2's and Llama 3's keep them apart.
    static constexpr std::string_view k_any_line_probe =
        "#include <vector>\n\nnamespace x {\n// A comment.\nstruct impl {\n    int a = 0;  \n\tint b;\n\t\t\tc();\n"
        "  }\n}  // namespace x\n    \n\n\n        if (a) {\n            return \"s\";\n        }\n"
        "def f(x):\n    '''doc'''\n    return x  # done\n\n\n  \n    's and 't\n's\n"
        "<div>\n  <p>caf\xc3\xa9</p>\n</div>\n* item\n  - sub item\n> quote\n| a | b |\n"
        "\r\n    win();\r\n\t}\r\n@@ -1 +1 @@\n-  old\n+  new\n ctx\n"
        "   \xe4\xb8\xad\xe6\x96\x87\n{\"k\": [1, 2]}\n  ...\n!!\n$ ls -la\n";
    bool probe_line_splits(std::string_view probe, bool (*is_cut)(std::string_view, size_t)) const {
        auto whole = e_.tokenize(probe, false);
        if (!whole.ok() || whole->empty()) return false;
        std::vector<token_id> joined;
        size_t from = 0;
        for (size_t p = 1; p <= probe.size(); ++p) {
            const bool cut = p == probe.size() || is_cut(probe, p);
            if (!cut) continue;
            auto t = e_.tokenize(probe.substr(from, p - from), false);
            if (!t.ok()) return false;
            joined.insert(joined.end(), t->begin(), t->end());
            from = p;
        }
        return joined == *whole;
    }

    static constexpr size_t k_memo_min_bytes = 256;
    static constexpr size_t k_memo_max_tokens = 8u << 20;          // 32 MiB of token ids
    static constexpr size_t k_special_memo_max_tokens = 256u << 10;  // 1 MiB
    static constexpr size_t k_render_memo_max_input = 256u << 10;
    static constexpr size_t k_render_memo_bytes = 32u << 20;
    struct render_entry {
        hash128 key;
        rendered_conversation r;
    };
    const engine & e_;
    std::unique_ptr<chat_templates> jinja_;
    std::string gen_prompt_;
    mutable std::mutex render_mu_;
    mutable std::list<render_entry> render_lru_;
    mutable std::unordered_map<hash128, std::list<render_entry>::iterator, hash128_hasher> renders_;
    mutable size_t render_bytes_ = 0;
    token_memo plain_memo_{k_memo_max_tokens};
    token_memo special_memo_{k_special_memo_max_tokens};
    bool splits_at_lines_ = false;
    bool splits_at_any_line_ = false;
};

std::string hex_digest_of_vocab(const engine & e) {
    // Every token's piece, in id order, with a separator: two tokenizers that would
    // map any text differently differ here (merges excepted; they are implied by the
    // vocabulary for BPE files written by the same converter).
    std::string all;
    all.reserve((size_t)e.model().n_vocab * 8);
    for (token_id t = 0; t < e.model().n_vocab; ++t) {
        all += e.token_piece(t);
        all.push_back('\x1f');
    }
    return hash_string(all).hex();
}

}  // namespace

std::unique_ptr<text_model> make_engine_text_model(const engine & e) { return std::make_unique<engine_text_model>(e); }

const chat_templates * engine_chat_templates(const text_model & tm) {
    const auto * etm = dynamic_cast<const engine_text_model *>(&tm);
    return etm ? etm->templates() : nullptr;
}

result<profile> engine_profile(const engine & e, const engine_options & opts) {
    const auto & mi = e.model();
    const auto & ci = e.context();
    auto md = file_digest(mi.path);
    if (!md.ok()) return md.error().with_context("digest of the model file");
    profile p;
    p.model_digest = md->hex();
    p.tokenizer_digest = hex_digest_of_vocab(e);
    // How the template is rendered is part of it: Jinja and the built-in per-message
    // templates make different prompts of the same messages.
    p.chat_template_digest = hash_string((opts.jinja ? "jinja\n" : "builtin\n") + mi.chat_template).hex();
    p.llama_commit = std::string(llama_commit());
    p.backend = ci.backend;
    p.rope_freq_base = mi.rope_freq_base;
    p.rope_freq_scale = 1.0f;
    p.kv_type = ci.kv_type;
    p.chunk_tokens = ci.chunk_tokens;
    p.kv_mode = std::string(kv_mode_name(ci.mode));
    p.flash_attn = opts.flash_attn;
    p.n_gpu_layers = opts.n_gpu_layers;
    p.free_splits = ci.splits_freely;
    set_block_grid(p, e);
    return p;
}

void set_block_grid(profile & p, const engine & e) {
    const context_info & ci = e.context();
    p.checkpoint_tokens = ci.memory.checkpoints
                              ? checkpoint_spacing(ci.memory.checkpoint_bytes, ci.kv_bytes_per_token, p.chunk_tokens)
                              : 0;
    const model_info & mi = e.model();
    const uint64_t embedding = (uint64_t)mi.n_vocab * (uint64_t)std::max(mi.n_embd, 0);
    const uint64_t per_row = mi.n_params > embedding ? mi.n_params - embedding : mi.n_params;
    // Where the engine splits freely its calls do not follow the blocks: a conversation's
    // blocks stay one exchange each (an appended turn reuses every one), and its cold
    // prefill is still calls of chunk_tokens.
    p.span_tokens =
        ci.splits_freely ? 0 : conversation_span(p.backend, p.chunk_tokens, ci.n_threads, mi.n_head, per_row);
}

}  // namespace warmctx
