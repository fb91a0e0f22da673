// workload/workload.h - seeded synthetic coding-agent workspaces.
//
// The same seed always gives the same segments. Sizes are targets in tokens of the
// model that will read them (measured with its tokenizer), so a "2k-token repo map"
// is 2k tokens of that model.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "warmctx/segments.h"
#include "warmctx/status.h"

namespace warmctx {

// Counts the tokens of a text (the model's tokenizer).
using token_counter = std::function<size_t(const std::string &)>;

class workload_generator {
  public:
    workload_generator(uint64_t seed, token_counter count) : rng_(seed), count_(std::move(count)) {}

    std::string system_prompt();
    std::string tool_schemas(int n_tools);
    std::string repo_rules();
    // A repo map (one line per symbol) of about `target_tokens` tokens.
    std::string repo_map(size_t target_tokens);
    // A source file of about `target_tokens` tokens.
    std::string source_file(const std::string & path, size_t target_tokens);
    std::string diff(const std::string & path, int n_hunks);
    std::string test_output(int n_failures);
    std::string terminal_log(int n_lines);
    std::string question();
    // Changes one line of `text` (a stable-segment edit).
    std::string edit_one_line(const std::string & text);

    std::mt19937_64 & rng() { return rng_; }
    size_t count(const std::string & text) const { return count_(text); }

  private:
    std::string identifier();
    std::string words(int n);
    std::string fill_to_tokens(size_t target_tokens, const std::function<std::string()> & next_line);

    std::mt19937_64 rng_;
    token_counter count_;
};

// A whole agent workspace: system, tools, instructions, repo_map, pinned files and a
// question. The stable segments together take about `stable_tokens` tokens (pinned
// files a quarter of what the first three leave, the repo map the rest).
std::vector<segment> make_workspace(workload_generator & g, size_t stable_tokens, int n_pinned_files);

}  // namespace warmctx
