// server/request_fields.h - the HTTP layer's JSON readers: a request body's field present
// or not, of the right type or a 400 naming the field. Every request mapper (chat and
// text completions, Responses, the workspace routes) reads its body through these; they
// word a wrong type as util's readers do (util/json.h: json_type_mismatch), which the
// file formats below the server read through.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api_error.h"

namespace warmctx::server_detail {

// 400 invalid_type: "<param> must be <expected>, not <got's type>".
api_error wrong_type(std::string_view param, std::string_view expected, const nlohmann::json & got);

// The field, or nullptr when absent or null (OpenAI clients send explicit nulls for "use
// the default"). `obj` may be any JSON value: a non-object has no fields.
const nlohmann::json * field(const nlohmann::json & obj, const char * key);

// Each leaves `out` unset when the field is absent or null; a field of another type is a
// 400 naming `param`.
maybe_error get_string(const nlohmann::json & obj, const char * key, std::string_view param,
                       std::optional<std::string> & out);
maybe_error get_bool(const nlohmann::json & obj, const char * key, std::string_view param, std::optional<bool> & out);
// An integer; a huge unsigned value is clamped to INT64_MAX so range checks see it.
maybe_error get_int(const nlohmann::json & obj, const char * key, std::string_view param,
                    std::optional<int64_t> & out);
// A finite number.
maybe_error get_number(const nlohmann::json & obj, const char * key, std::string_view param,
                       std::optional<double> & out);

// "base[i]" or "base[i].field".
std::string index_param(std::string_view base, size_t i, std::string_view field_name = {});

}  // namespace warmctx::server_detail
