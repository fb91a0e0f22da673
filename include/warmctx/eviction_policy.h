// warmctx/eviction_policy.h - how a cache tier picks what to drop, and how exact and
// shared KV count against a budget. Small on purpose: the tiers below the engine (the
// snapshot stores) choose by the same policy without depending on the prefix cache.
#pragma once

#include <string_view>

#include "warmctx/status.h"

namespace warmctx {

// semantic: volatile content first, then the least reused stable content (see
//           docs/architecture.md, "Eviction"); lru: least recently used only.
enum class eviction_policy { semantic, lru };
// per_holder: every holder's copy of a block counts (exact mode: each stream its own
// cells); shared_cells: a block counts once however many holders share it (shared mode).
enum class kv_accounting { per_holder, shared_cells };

std::string_view eviction_policy_name(eviction_policy p);  // "semantic" | "lru"
result<eviction_policy> parse_eviction_policy(std::string_view s);
std::string_view kv_accounting_name(kv_accounting a);      // "per_holder" | "shared_cells"
result<kv_accounting> parse_kv_accounting(std::string_view s);

}  // namespace warmctx
