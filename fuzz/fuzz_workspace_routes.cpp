// The workspace routes' request bodies and path ids (src/server/workspace_routes.cpp),
// into the server-side segment store:
//
//   input = <workspace id> '\n' <segment id> '\n' <body>
//
//   PUT  /v1/workspaces/{id}/segments/{segment}: the path ids' checks, parse_json,
//        parse_segment_body, the refusal of kind user, validate_segments, then
//        workspace_store::put / get / list / erase on a small store
//   the `segments` extension: parse_segments on the body, merged over the store
//        (merge_stored_segments) and validated
//   POST /v1/workspaces/{id}/branch: {"to": "<workspace id>"}, then the stored segments
//        copied to the branch
//
// The routes' own glue (path_workspace, path_segment, the branch body's check) is a few
// lines inside the route table, which links the engine; it is mirrored here line for line.
//
// Checks, besides no crash: every refusal is a 4xx whose body is valid UTF-8; a stored
// segment reads back as it was put; the store's byte and segment counts follow every
// put, replace and erase, and return to their start; a merge keeps one segment per id.
#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <vector>

#include "fuzz_common.h"
#include "api/openai/openai.h"
#include "workspace_store.h"
#include "warmctx/assembler.h"
#include "warmctx/kind_table.h"

using namespace warmctx;
using namespace warmctx::server_detail;
using json = nlohmann::json;

namespace {

void check_error(const api_error & e) {
    FUZZ_CHECK(e.http_status >= 400 && e.http_status < 500);
    FUZZ_CHECK(!e.code.empty());
    fuzz::check_error_body(e.body());
}

bool same_segment(const segment & a, const segment & b) {
    return a.id == b.id && a.kind == b.kind && a.path == b.path && a.role == b.role && a.content == b.content;
}

size_t bytes_of(const segment & s) { return s.id.size() + s.content.size() + s.path.size() + s.role.size(); }

// A store with something in it already, its limits small enough to be reached.
struct store_fixture {
    workspace_store store{store_limits{.max_workspaces = 3,
                                       .max_segments_per_workspace = 4,
                                       .max_segment_bytes = 1024,
                                       .max_store_bytes = 4096}};
    store_fixture() {
        bool created = false;
        FUZZ_CHECK(!store.put("ws", {"rules", segment_kind::instructions, "", "", "Answer briefly."}, created));
        FUZZ_CHECK(!store.put("ws", {"repo-map", segment_kind::repo_map, "map.txt", "", "src/\n"}, created));
        FUZZ_CHECK(!store.put("other", {"rules", segment_kind::instructions, "", "", "Be terse."}, created));
    }
};

// path_workspace and path_segment of workspace_routes.cpp.
maybe_error path_ids(const std::string & ws_param, const std::string & seg_param) {
    if (auto e = validate_workspace_id(ws_param, "path")) return e;
    if (find_invalid_utf8(seg_param) != k_utf8_valid)
        return bad_request("invalid_segment_id", "segment id is not valid UTF-8", "path");
    if (status st = validate_segment_id(seg_param); !st.ok())
        return bad_request("invalid_segment_id", st.message(), "path");
    return std::nullopt;
}

void put_segment(const std::string & ws, const std::string & id, const json & body, const kind_table & kinds) {
    store_fixture f;
    workspace_store & store = f.store;
    segment seg;
    if (auto e = parse_segment_body(body, id, "", seg)) return check_error(*e);
    FUZZ_CHECK(seg.id == id);
    if (seg.kind == segment_kind::user) return;  // the route's 400 invalid_kind
    if (status st = validate_segments(std::span<const segment>(&seg, 1), kinds); !st.ok())
        return check_error(error_from_status(st));
    fuzz::check_json_text(dump_json(segment_json(seg)));

    const size_t bytes0 = store.n_bytes(), n0 = store.n_segments();
    const auto old = store.get(ws, id);
    bool created = false;
    if (auto e = store.put(ws, seg, created)) {
        check_error(*e);
        FUZZ_CHECK(e->http_status == 413 || e->http_status == 429);
        FUZZ_CHECK(store.n_bytes() == bytes0 && store.n_segments() == n0);  // refused: nothing changed
        return;
    }
    FUZZ_CHECK(created == !old.has_value());
    FUZZ_CHECK(store.n_segments() == n0 + (created ? 1 : 0));
    FUZZ_CHECK(store.n_bytes() == bytes0 - (old ? bytes_of(*old) : 0) + bytes_of(seg));
    auto back = store.get(ws, id);
    FUZZ_CHECK(back && same_segment(*back, seg));
    auto listed = store.list(ws);
    FUZZ_CHECK(listed.has_value());
    for (size_t i = 1; i < listed->size(); ++i) FUZZ_CHECK((*listed)[i - 1].id < (*listed)[i].id);

    // Put again: a replace, nothing grows.
    bool again = true;
    FUZZ_CHECK(!store.put(ws, seg, again));
    FUZZ_CHECK(!again);
    FUZZ_CHECK(store.n_segments() == n0 + (created ? 1 : 0));

    FUZZ_CHECK(store.erase(ws, id));
    FUZZ_CHECK(!store.get(ws, id));
    if (old) {
        bool c = false;
        FUZZ_CHECK(!store.put(ws, *old, c));
    }
    FUZZ_CHECK(store.n_bytes() == bytes0 && store.n_segments() == n0);
}

void segments_extension(const std::string & ws, const json & body, const kind_table & kinds) {
    store_fixture f;
    std::vector<segment> segs;
    if (auto e = parse_segments(body, "segments", segs)) return check_error(*e);
    FUZZ_CHECK(segs.size() <= k_max_request_segments);
    auto stored = f.store.list(ws);
    std::vector<segment> merged = merge_stored_segments(stored.value_or(std::vector<segment>{}), segs);
    // Every request segment is there once, in its order, after the stored ones it left.
    FUZZ_CHECK(merged.size() >= segs.size());
    for (size_t i = 0; i < segs.size(); ++i)
        FUZZ_CHECK(same_segment(merged[merged.size() - segs.size() + i], segs[i]));
    std::set<std::string> request_ids;
    for (const segment & s : segs) request_ids.insert(s.id);
    for (size_t i = 0; i + segs.size() < merged.size(); ++i) FUZZ_CHECK(!request_ids.count(merged[i].id));
    if (status st = validate_segments(merged, kinds); !st.ok()) return check_error(error_from_status(st));
    std::set<std::string> ids;
    for (const segment & s : merged) FUZZ_CHECK(ids.insert(s.id).second);
}

void branch(const std::string & ws, json body) {
    store_fixture f;
    // The branch route's check of its body.
    if (!body.is_object() || !body.contains("to") || !body["to"].is_string())
        return check_error(bad_request("invalid_request", "body must be {\"to\": \"<workspace id>\"}", "to"));
    const std::string to = body["to"].get<std::string>();
    if (auto e = validate_workspace_id(to, "to")) return check_error(*e);
    if (auto segs = f.store.list(ws)) {
        for (auto & sg : *segs) {
            bool created = false;
            if (auto e = f.store.put(to, sg, created)) return check_error(*e);
        }
        auto copy = f.store.list(to);
        FUZZ_CHECK(copy && copy->size() >= segs->size());
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static const kind_table kinds;
    const std::string_view in = fuzz::as_text(data, size);
    const size_t nl1 = in.find('\n');
    if (nl1 == std::string_view::npos) return 0;
    const size_t nl2 = in.find('\n', nl1 + 1);
    if (nl2 == std::string_view::npos) return 0;
    const std::string ws(in.substr(0, nl1)), seg_id(in.substr(nl1 + 1, nl2 - nl1 - 1));
    const std::string_view body_text = in.substr(nl2 + 1);

    const maybe_error path_error = path_ids(ws, seg_id);
    if (path_error) check_error(*path_error);

    json_error why = json_error::none;
    auto body = parse_json(body_text, json_read_options{}, &why);
    if (!body.ok()) {
        check_error(bad_request(why == json_error::invalid_utf8 ? "invalid_utf8" : "invalid_json",
                                "request body " + body.error().message()));
        return 0;
    }
    if (!path_error) put_segment(ws, seg_id, *body, kinds);
    if (!validate_workspace_id(ws, "path")) {
        segments_extension(ws, *body, kinds);
        branch(ws, *body);
    }
    return 0;
}
