// The chat routes' request path, from the raw body to an assembled prompt:
//
//   body bytes -> parse_json (what parse_body does for every route) ->
//   parse_completion_request (messages mapping, `tools`, the `segments` extension,
//   sampling) -> merge_stored_segments (the workspace chat) -> validate_segments ->
//   derive_workspace -> assemble (on a byte-per-token stand-in for the model)
//
// Each body is read as all three routes read theirs: POST /v1/chat/completions (chat),
// POST /v1/workspaces/{id}/chat/completions (workspace_chat, over a fixed set of stored
// segments) and POST /v1/completions (text); then as a Responses and as an Anthropic
// Messages body, whose mappers either refuse it or make a chat body the chat path takes.
//
// Checks, besides no crash: every error is a 400 whose body is valid UTF-8; a parsed
// request keeps its sampling inside the documented ranges; a derived workspace id is a
// valid one; each segment survives segment_json -> parse_segment_body; a validated set
// of segments assembles, its blocks cover the prompt, its manifest survives to_json ->
// from_json, and the prompt does not depend on the order the segments came in.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "fake_text_model.h"
#include "fuzz_common.h"
#include "api/anthropic/anthropic.h"
#include "json_util.h"
#include "api/openai/openai.h"
#include "request_fields.h"
#include "api/responses/responses.h"
#include "workspace_store.h"
#include "warmctx/assembler.h"
#include "warmctx/kind_table.h"

using namespace warmctx;
using namespace warmctx::server_detail;
using json = nlohmann::json;

namespace {

void check_error(const api_error & e) {
    FUZZ_CHECK(e.http_status == 400);
    FUZZ_CHECK(!e.code.empty());
    fuzz::check_error_body(e.body());
}

bool same_segment(const segment & a, const segment & b) {
    return a.id == b.id && a.kind == b.kind && a.path == b.path && a.role == b.role && a.content == b.content;
}

std::vector<segment> stored_fixture() {
    return {
        {"repo-map", segment_kind::repo_map, "map.txt", "", "src/\n  main.cc\n"},
        {"rules", segment_kind::instructions, "", "", "Answer briefly."},
        {"h0000", segment_kind::history, "", "assistant", "an earlier answer"},
    };
}

// The stand-in model records every text it is given (for its own tests); a fuzzer that
// kept those records would grow without bound.
void forget_calls(const testing::fake_text_model & model) {
    model.tokenize_calls.clear();
    model.plain_calls.clear();
}

void check_assembly(const std::vector<segment> & segs, const kind_table & kinds, bool check_order) {
    static const testing::fake_text_model model;
    static const profile prof = fuzz::fixture_profile();
    auto prompt = assemble(segs, kinds, model, prof, "tenant", prof.chunk_tokens);
    FUZZ_CHECK_MSG(prompt.ok(), prompt.error().message());
    forget_calls(model);

    const pos_t n = static_cast<pos_t>(prompt->tokens.size());
    FUZZ_CHECK(n > 0);
    FUZZ_CHECK(prompt->prompt_manifest.n_tokens == n);
    FUZZ_CHECK(prompt->prompt_manifest.segments.size() == segs.size());
    pos_t at = 0;
    for (const block & b : prompt->blocks) {
        FUZZ_CHECK(b.begin == at && b.end > b.begin);
        FUZZ_CHECK(b.end - b.begin <= static_cast<pos_t>(prof.chunk_tokens));
        FUZZ_CHECK(b.segment_index == k_generation_prompt_index ||
                   (b.segment_index >= 0 && static_cast<size_t>(b.segment_index) < segs.size()));
        at = b.end;
    }
    FUZZ_CHECK(at == n);
    for (pos_t bd : prompt->boundaries) FUZZ_CHECK(bd > 0 && bd < n);
    for (size_t k = 0; k <= prompt->blocks.size(); ++k) {
        reuse_point r = snap_reuse(*prompt, k);
        FUZZ_CHECK(r.n_blocks <= k && r.n_tokens < n);
    }

    auto parsed = manifest::from_json(prompt->prompt_manifest.to_json());
    FUZZ_CHECK_MSG(parsed.ok(), parsed.error().message());
    FUZZ_CHECK(*parsed == prompt->prompt_manifest);
    fuzz::check_json_text(dump_json(prompt->prompt_manifest.to_json()));

    // Canonical order: the same segments in another order give the same prompt.
    if (!check_order) return;
    std::vector<segment> reversed(segs.rbegin(), segs.rend());
    auto again = assemble(reversed, kinds, model, prof, "tenant", prof.chunk_tokens);
    FUZZ_CHECK(again.ok());
    forget_calls(model);
    FUZZ_CHECK(again->tokens == prompt->tokens);
    FUZZ_CHECK(again->blocks == prompt->blocks);
    FUZZ_CHECK(again->prompt_manifest == prompt->prompt_manifest);
}

void check_request(const json & body, body_mode mode) {
    static const kind_table kinds;
    request_limits lim;
    lim.max_tokens_cap = 2048;
    lim.default_max_tokens = 256;
    // Small bounds, so that inputs reach them (issue 30: tools, enums, patterns, messages).
    lim.bounds.max_messages = 64;
    lim.bounds.max_tools = 8;
    lim.bounds.max_tools_bytes = 4096;
    lim.bounds.max_enum_values = 16;
    lim.bounds.max_pattern_bytes = 64;
    lim.bounds.max_pattern_nesting = 4;
    completion_request cr;
    if (auto e = parse_completion_request(body, mode, lim, cr)) return check_error(*e);

    // An accepted request is within its bounds.
    if (const json * m = field(body, "messages"); m && m->is_array()) FUZZ_CHECK(m->size() <= lim.bounds.max_messages);
    FUZZ_CHECK(!check_tools_segments(cr.segments, lim.bounds));
    if (!cr.tools_json.empty()) {
        FUZZ_CHECK(cr.tools_json.size() <= lim.bounds.max_tools_bytes);
        auto tools = parse_json(cr.tools_json);
        FUZZ_CHECK(tools.ok() && (!tools->is_array() || tools->size() <= lim.bounds.max_tools));
    }
    if (!cr.json_schema.empty()) {
        auto schema = parse_json(cr.json_schema);
        FUZZ_CHECK(schema.ok());
        schema_tally tally;
        FUZZ_CHECK(!check_schema_bounds(*schema, "schema", lim.bounds, tally));
    }

    FUZZ_CHECK(!cr.segments.empty());
    FUZZ_CHECK((cr.shape == api_shape::text) == (mode == body_mode::text));
    const sampling_params & sp = cr.sampling;
    FUZZ_CHECK(sp.max_tokens >= 1 && sp.max_tokens <= lim.max_tokens_cap);
    FUZZ_CHECK(sp.temperature >= 0 && sp.temperature <= 2);
    FUZZ_CHECK(sp.top_p >= std::numeric_limits<float>::min() && sp.top_p <= 1);  // the engine reads it as a float
    FUZZ_CHECK(sp.top_k >= 0 && sp.top_k <= 1000000);
    FUZZ_CHECK(sp.stop.size() <= k_max_stop_strings);
    for (const std::string & s : sp.stop) FUZZ_CHECK(!s.empty());
    FUZZ_CHECK(sp.presence_penalty >= -2 && sp.presence_penalty <= 2);
    FUZZ_CHECK(sp.frequency_penalty >= -2 && sp.frequency_penalty <= 2);
    FUZZ_CHECK(sp.logit_bias.size() <= 1024);
    FUZZ_CHECK(sp.n_logprobs >= -1 && sp.n_logprobs <= 20);
    for (const auto & [tok, b] : sp.logit_bias) FUZZ_CHECK(tok >= 0 && b >= -100 && b <= 100);
    if (!cr.workspace.empty()) FUZZ_CHECK(!validate_workspace_id(cr.workspace));

    std::vector<segment> segs = cr.segments;
    if (mode == body_mode::workspace_chat) segs = merge_stored_segments(stored_fixture(), std::move(segs));

    const std::string ws = derive_workspace(segs);
    FUZZ_CHECK(!validate_workspace_id(ws));
    FUZZ_CHECK(derive_workspace(segs) == ws);

    status st = validate_segments(segs, kinds);
    if (!st.ok()) {
        api_error e = error_from_status(st);
        return check_error(e);
    }
    for (const segment & s : segs) {
        const json j = segment_json(s);
        fuzz::check_json_text(dump_json(j));
        segment back;
        auto e = parse_segment_body(j, s.id, "segments[0]", back);
        FUZZ_CHECK_MSG(!e, e->message);
        FUZZ_CHECK(same_segment(back, s));
    }
    if (cr.raw) {  // a completion's prompt, as given
        FUZZ_CHECK(mode == body_mode::text && segs.size() == 1);
        static const testing::fake_text_model model;  // no FIM tokens: a suffix is refused
        static const profile prof = fuzz::fixture_profile();
        auto prompt = assemble_raw(segs[0], cr.suffix, model, prof, "tenant", prof.chunk_tokens);
        forget_calls(model);
        if (cr.suffix) {
            FUZZ_CHECK(!prompt.ok() && prompt.error().code() == status_code::invalid_argument);
            return;
        }
        FUZZ_CHECK_MSG(prompt.ok(), prompt.error().message());
        FUZZ_CHECK(prompt->prompt_manifest.n_tokens == static_cast<pos_t>(prompt->tokens.size()));
        for (const block & b : prompt->blocks) FUZZ_CHECK(b.retention == retention_class::low);
        return;
    }
    // (The order check once per body: the workspace chat's segments are the most.)
    check_assembly(segs, kinds, mode == body_mode::workspace_chat);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    // What parse_body does (src/server/router.cpp): the strict reader, default options.
    json_error why = json_error::none;
    auto body = parse_json(fuzz::as_text(data, size), json_read_options{}, &why);
    if (!body.ok()) {
        check_error(bad_request(why == json_error::invalid_utf8 ? "invalid_utf8" : "invalid_json",
                                "request body " + body.error().message()));
        return 0;
    }
    for (body_mode mode : {body_mode::chat, body_mode::workspace_chat, body_mode::text}) check_request(*body, mode);
    // The same body as a Responses request: refused with a well-formed error, or
    // translated into a chat body that the chat parser then takes or refuses.
    json chat_body;
    responses_request_info info;
    if (auto e = responses_to_chat(*body, chat_body, info)) {
        chat_error_to_responses(*e, info);
        check_error(*e);
    } else {
        check_request(chat_body, body_mode::chat);
    }
    // And as an Anthropic Messages request, the same way.
    anthropic_request_info ainfo;
    if (auto e = anthropic_to_chat(*body, "", 4096, chat_body, ainfo)) {
        chat_error_to_anthropic(*e, ainfo);
        check_error(*e);
        const nlohmann::json err = anthropic_error_json(*e);
        FUZZ_CHECK(err["type"] == "error" && err["error"]["message"].is_string());
    } else {
        check_request(chat_body, body_mode::chat);
    }
    return 0;
}
