// warmctx/resources.h - where the binary finds what it ships with, wherever it lives.
//
// Nothing is found through the source or build tree's path. Data files (the Qwen2
// vocabulary that generated models embed) and helper tools (llama-server, llama-bench,
// which the side-by-side benchmarks run) are looked up relative to the running
// executable, the same way in the build tree and in an installed prefix:
//
//   data file NAME:  $WARMCTX_DATA_DIR/NAME, then <exe dir>/../share/warmctx/NAME,
//                    then <exe dir>/share/warmctx/NAME (the build tree)
//   tool NAME:       $WARMCTX_TOOLS_DIR/NAME, then <exe dir>/../libexec/warmctx/NAME,
//                    then <exe dir>/bin/NAME (the build tree), then <exe dir>/NAME
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "warmctx/status.h"

namespace warmctx {

// The directory of the running executable (from /proc/self/exe); "" if unknown.
std::string executable_dir();

// The first existing regular file among the candidates above. Errors: not_found, naming
// every place looked at.
result<std::string> find_data_file(std::string_view name);
result<std::string> find_tool(std::string_view name);

// The candidate paths, in order (for messages and tests).
std::vector<std::string> data_file_candidates(std::string_view name);
std::vector<std::string> tool_candidates(std::string_view name);

}  // namespace warmctx
