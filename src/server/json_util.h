// server/json_util.h - the HTTP layer reads and writes JSON through util/json.h.
#pragma once

#include "util/json.h"

namespace warmctx::server_detail {
using warmctx::dump_json;
using warmctx::find_invalid_utf8;
using warmctx::json_nesting_depth;
using warmctx::k_max_json_depth;
using warmctx::k_utf8_valid;
}  // namespace warmctx::server_detail
