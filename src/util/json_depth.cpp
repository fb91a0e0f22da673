#include "warmctx/json_depth.h"

#include <algorithm>

namespace warmctx {

size_t json_nesting_depth(std::string_view s) {
    size_t depth = 0, deepest = 0;
    bool in_string = false, escaped = false;
    for (char c : s) {
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') in_string = true;
        else if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
        else if ((c == ']' || c == '}') && depth > 0) --depth;
    }
    return deepest;
}

}  // namespace warmctx
