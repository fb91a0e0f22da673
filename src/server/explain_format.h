// server/explain_format.h - an explain_report as JSON (the HTTP API, --json) and as a
// table for people (the command line). Formatting lives with the interfaces, not in
// the runtime that produces the report.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "warmctx/context_engine.h"

namespace warmctx {

// Every field of the report; the keys are documented in docs/api.md ("explain").
nlohmann::json explain_json(const explain_report & r);
// The pre-warm a turn was served from (explain_report::prewarm), or null.
nlohmann::json prewarm_json(const std::optional<prewarm_info> & p);
// One summary line, the reason, and a row per segment (tokens reused / prefilled).
std::string explain_text(const explain_report & r);

}  // namespace warmctx
