// A deterministic stand-in for a model's tokenizer and ChatML template.
//
// Every byte is one token (its value, 0..255); "<|im_start|>" and "<|im_end|>" are
// single special tokens, so the token boundaries of a rendered message are easy to
// reason about and a test can turn tokens back into text.
#pragma once

#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "warmctx/assembler.h"

namespace warmctx::testing {

class fake_text_model : public text_model {
  public:
    static constexpr token_id k_im_start = 256;
    static constexpr token_id k_im_end = 257;
    static constexpr token_id k_bos = 258;

    bool add_bos = false;                 // prefix_tokens() = {k_bos}
    std::string fail_on;                  // tokenize fails on text containing this (if set)
    std::string template_tag;             // inserted after the role: a "different template"
    // Calls may come from several threads (a large prompt's segments tokenize in parallel).
    mutable std::mutex mu;
    mutable std::vector<std::string> tokenize_calls;  // every text tokenize() was given
    mutable std::vector<std::string> plain_calls;     // every text tokenize_plain() was given
    mutable std::set<std::thread::id> threads;        // every thread that tokenized

    result<std::vector<token_id>> tokenize(std::string_view text) const override {
        if (!fail_on.empty() && text.find(fail_on) != text.npos)
            return invalid_argument("fake tokenizer refuses '" + fail_on + "'");
        {
            std::lock_guard lk(mu);
            tokenize_calls.emplace_back(text);
            threads.insert(std::this_thread::get_id());
        }
        std::vector<token_id> out;
        for (size_t i = 0; i < text.size();) {
            if (text.substr(i).starts_with("<|im_start|>")) {
                out.push_back(k_im_start);
                i += 12;
            } else if (text.substr(i).starts_with("<|im_end|>")) {
                out.push_back(k_im_end);
                i += 10;
            } else {
                out.push_back(static_cast<unsigned char>(text[i]));
                ++i;
            }
        }
        return out;
    }

    // Plain text: every byte is its own token, "<|im_end|>" included.
    result<std::vector<token_id>> tokenize_plain(std::string_view text) const override {
        return plain(text, plain_calls);
    }
    // Records `text` in `calls`, then one token per byte.
    result<std::vector<token_id>> plain(std::string_view text, std::vector<std::string> & calls) const {
        if (!fail_on.empty() && text.find(fail_on) != text.npos)
            return invalid_argument("fake tokenizer refuses '" + fail_on + "'");
        {
            std::lock_guard lk(mu);
            calls.emplace_back(text);
            threads.insert(std::this_thread::get_id());
        }
        std::vector<token_id> out;
        for (char c : text) out.push_back(static_cast<unsigned char>(c));
        return out;
    }

    result<std::string> render_message(std::string_view role, std::string_view content) const override {
        return "<|im_start|>" + std::string(role) + template_tag + "\n" + std::string(content) + "<|im_end|>\n";
    }

    std::string generation_prompt() const override { return "<|im_start|>assistant\n"; }

    std::vector<token_id> prefix_tokens() const override {
        if (add_bos) return {k_bos};
        return {};
    }

    static constexpr token_id k_fim_pre = 259, k_fim_suf = 260, k_fim_mid = 261;
    bool has_fim = false;  // fim() answers
    std::optional<fim_tokens> fim() const override {
        if (!has_fim) return std::nullopt;
        return fim_tokens{k_fim_pre, k_fim_suf, k_fim_mid};
    }

    // plain_splits_at_lines() answers this; the parts and the remembered wholes are kept.
    bool splits_at_lines = false;
    mutable std::vector<std::string> part_calls;      // every text tokenize_plain_part() was given
    mutable std::vector<std::string> remembered;      // every text remember_plain() was given
    bool plain_splits_at_lines() const override { return splits_at_lines; }
    result<std::vector<token_id>> tokenize_plain_part(std::string_view text) const override {
        return plain(text, part_calls);
    }
    void remember_plain(std::string_view text, const std::vector<token_id> &) const override {
        std::lock_guard lk(mu);
        remembered.emplace_back(text);
    }

    // The model "remembers" the tokens of every content longer than this
    // (remembered_plain answers for them).
    size_t remember_over = std::string::npos;
    std::optional<std::vector<token_id>> remembered_plain(std::string_view text) const override {
        if (text.size() <= remember_over) return std::nullopt;
        std::vector<token_id> out;
        for (char c : text) out.push_back(static_cast<unsigned char>(c));
        return out;
    }

    // Tokens back to text (for assertions).
    static std::string detokenize(std::span<const token_id> tokens) {
        std::string s;
        for (token_id t : tokens) {
            if (t == k_im_start) s += "<|im_start|>";
            else if (t == k_im_end) s += "<|im_end|>";
            else if (t == k_bos) s += "<BOS>";
            else s += static_cast<char>(t);
        }
        return s;
    }
};

}  // namespace warmctx::testing
