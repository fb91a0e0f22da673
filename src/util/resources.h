// util/resources.h - where the binary finds what it ships with, wherever it lives.
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
#include <cstdint>
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

// Physical memory of the machine in bytes (0 if unknown).
uint64_t physical_memory_bytes();
// Memory the kernel says new allocations can take now without swapping (/proc/meminfo's
// MemAvailable), in bytes; 0 if unknown.
uint64_t available_memory_bytes();

// The share of memory warmctx takes for each of its two KV uses by default - the work
// streams (they size the default context) and the pool of cached prefixes (the default
// byte budget): a quarter of physical memory, at most 8 GiB (llama-server keeps 8 GiB
// of prompts by default); 2 GiB when the memory is unknown.
uint64_t default_kv_share_bytes();

// The candidate paths, in order (for messages and tests).
std::vector<std::string> data_file_candidates(std::string_view name);
std::vector<std::string> tool_candidates(std::string_view name);

}  // namespace warmctx
