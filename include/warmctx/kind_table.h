// warmctx/kind_table.h - what each segment kind is worth and where it goes.
//
// The kind table maps every segment_kind to a policy: its stability (does it change
// between turns?), its retention class (what eviction protects first), its place in
// the canonical order and the chat role its message is rendered with. The defaults
// are the table below (kind_table.cpp; docs/architecture.md, "Segment kinds"); a user
// may override any field of any kind by configuration, except that the `user` kind
// (this turn's question) must stay strictly last: everything after it would be
// re-prefilled every turn, and a generation prompt must follow the question.
//
// A kind_table is immutable after construction and safe to share between threads.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "warmctx/segments.h"
#include "warmctx/status.h"

namespace warmctx {

// "stable" | "stable_ish" | "volatile" (the names stability_name() prints).
result<stability> parse_stability(std::string_view s);

// True for the chat roles a rendered message may carry: system, user, assistant, tool.
bool is_chat_role(std::string_view role);

struct kind_policy {
    stability how_stable = stability::volatile_;
    retention_class retention = retention_class::low;
    // Place in the canonical order: lower first. Kinds may share an order; then
    // their segments interleave by id (still deterministic).
    int order = 0;
    // The chat role of the kind's messages ("system" or "user" by default).
    std::string role;
    // When true, a segment's own `role` (if set) replaces `role` - for history,
    // whose earlier turns are "user" or "assistant" messages.
    bool role_from_segment = false;
    // When true, the message content starts with a one-line header naming the kind
    // and the segment ("# repo_map: src/map.txt\n"), so the model can tell the
    // pieces of its context apart. Off for history and user, whose messages are the
    // conversation itself.
    bool header = true;

    bool operator==(const kind_policy &) const = default;
};

class kind_table {
  public:
    // The defaults (kind_table.cpp):
    //   kind          stability   retention  order role    header
    //   system        stable      highest    1     system  yes
    //   tools         stable      highest    2     system  yes
    //   instructions  stable      highest    3     system  yes
    //   repo_map      stable      high       4     system  yes
    //   pinned_file   stable      high       5     system  yes
    //   task_summary  stable_ish  high       6     system  yes
    //   history       volatile    low        7     user*   no    (* the segment's role if set)
    //   diff          volatile    medium     8     user    yes
    //   test_output   volatile    medium     9     user    yes
    //   terminal_log  volatile    low        10    user    yes
    //   snippet       volatile    low        11    user    yes
    //   user          volatile    none       12    user    no
    kind_table();

    // The defaults with overrides from a JSON document:
    //   {"kinds": {"repo_map": {"retention": "highest", "order": 2},
    //              "history":  {"role": "user", "segment_role": false}}}
    // Per kind, every field is optional: "stability", "retention", "order"
    // (integer in [0, 1000000]), "role" (a chat role), "segment_role" (bool),
    // "header" (bool). Errors (invalid_argument, the message names the offender):
    // not JSON, not an object, an unknown top-level key, an unknown kind, field or
    // value, a value of the wrong type, or an override that leaves `user` not
    // strictly last in the order.
    static result<kind_table> from_json(std::string_view json_text);
    // The same for an already parsed document (named apart: a string literal would
    // otherwise convert to both overloads).
    static result<kind_table> from_json_value(const nlohmann::json & doc);

    const kind_policy & policy(segment_kind k) const { return policies_[static_cast<size_t>(k)]; }

    // The full table (every kind, every field), in the from_json format.
    nlohmann::json to_json() const;

    bool operator==(const kind_table &) const = default;

  private:
    std::array<kind_policy, k_segment_kind_count> policies_;
};

}  // namespace warmctx
