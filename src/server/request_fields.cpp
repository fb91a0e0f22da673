#include "request_fields.h"

#include <cmath>
#include <limits>

#include "json_util.h"

namespace warmctx::server_detail {

using json = nlohmann::json;

api_error wrong_type(std::string_view param, std::string_view expected, const json & got) {
    return bad_request("invalid_type", std::string(param) + " " + json_type_mismatch(expected, got),
                       std::string(param));
}

const json * field(const json & obj, const char * key) {
    if (!obj.is_object()) return nullptr;
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
}

maybe_error get_string(const json & obj, const char * key, std::string_view param, std::optional<std::string> & out) {
    const json * f = field(obj, key);
    if (!f) return std::nullopt;
    if (!f->is_string()) return wrong_type(param, "a string", *f);
    out = f->get<std::string>();
    return std::nullopt;
}

maybe_error get_bool(const json & obj, const char * key, std::string_view param, std::optional<bool> & out) {
    const json * f = field(obj, key);
    if (!f) return std::nullopt;
    if (!f->is_boolean()) return wrong_type(param, "true or false", *f);
    out = f->get<bool>();
    return std::nullopt;
}

maybe_error get_int(const json & obj, const char * key, std::string_view param, std::optional<int64_t> & out) {
    const json * f = field(obj, key);
    if (!f) return std::nullopt;
    if (f->is_number_unsigned()) {
        uint64_t u = f->get<uint64_t>();
        out = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                             : static_cast<int64_t>(u);
        return std::nullopt;
    }
    if (f->is_number_integer()) { out = f->get<int64_t>(); return std::nullopt; }
    return wrong_type(param, "an integer", *f);
}

maybe_error get_number(const json & obj, const char * key, std::string_view param, std::optional<double> & out) {
    const json * f = field(obj, key);
    if (!f) return std::nullopt;
    if (!f->is_number()) return wrong_type(param, "a number", *f);
    double v = f->get<double>();
    if (!std::isfinite(v))
        return bad_request("invalid_value", std::string(param) + " must be finite", std::string(param));
    out = v;
    return std::nullopt;
}

std::string index_param(std::string_view base, size_t i, std::string_view field_name) {
    std::string s = std::string(base) + "[" + std::to_string(i) + "]";
    if (!field_name.empty()) s += "." + std::string(field_name);
    return s;
}

}  // namespace warmctx::server_detail
