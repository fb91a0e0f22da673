// The model's own chat template through llama.cpp's common/chat and its Jinja engine
// (warmctx/chat_template.h). This file is its own library (warmctx_chat): it sees
// llama-common's headers and JSON type (common_json), nothing else of warmctx but the
// plain types of conversation.h and status.h.
#include "warmctx/chat_template.h"

#include <list>
#include <map>
#include <mutex>
#include <regex>
#include <unordered_map>

#include "chat.h"
#include "common.h"
#include "json-schema-to-grammar.h"
#include "jinja/runtime.h"

namespace warmctx {

namespace {


class common_parser final : public chat_output_parser {
  public:
    explicit common_parser(common_chat_parser_params p) : p_(std::move(p)) {}
    result<parsed_answer> parse(const std::string & text, bool partial) const override {
        try {
            common_chat_msg m = common_chat_parse(text, partial, p_);
            parsed_answer a;
            a.content = std::move(m.content);
            a.reasoning = std::move(m.reasoning_content);
            for (auto & c : m.tool_calls)
                a.tool_calls.push_back({std::move(c.id), std::move(c.name), std::move(c.arguments)});
            return a;
        } catch (const std::exception & e) {
            return invalid_argument(std::string("the answer does not parse as the template's format: ") + e.what());
        }
    }

  private:
    common_chat_parser_params p_;
};

// The OpenAI `tools` array (JSON text) as common_chat_tool, optionally only `only`.
std::vector<common_chat_tool> parse_tools(std::string_view tools_json, const std::string & only) {
    std::vector<common_chat_tool> out;
    if (tools_json.empty()) return out;
    common_json arr = common_json::parse(std::string(tools_json));
    out = common_chat_tools_parse_oaicompat(arr);
    if (!only.empty()) {
        std::vector<common_chat_tool> one;
        for (auto & t : out)
            if (t.name == only) one.push_back(std::move(t));
        if (one.empty())
            throw std::invalid_argument("tool_choice names the function '" + only + "', which is not in tools");
        out = std::move(one);
    }
    return out;
}

// A required call comes first: llama.cpp's grammars for tool_choice "required" let the
// model write text before its calls (the root rule's "until-N" element, optional or not,
// text up to the call's opening marker). warmctx drops that element, so a required answer
// is its calls alone (after the reasoning a format opens with, Qwen3.5's: a reasoning
// block is not text before the calls); a grammar without it is returned as it is.
std::string calls_first(const std::string & grammar) {
    static const std::regex k_root(R"((^|\n)(root ::= [^\n]*?) until-[0-9]+\? ([^\n]*))");
    static const std::regex k_root_before_call(R"((^|\n)(root ::= [^\n]*?) until-[0-9]+ ((space )?tool-call[^\n]*))");
    std::smatch m;
    if (std::regex_search(grammar, m, k_root) || std::regex_search(grammar, m, k_root_before_call))
        return m.prefix().str() + m[1].str() + m[2].str() + " " + m[3].str() + m.suffix().str();
    return grammar;
}

// gpt-oss: the messages before a required call or a schema's answer are analysis
// (reasoning) or commentary (a preamble to the user, text), any number of them: the
// preambles go, one analysis stays (a reasoning budget then bounds what comes first).
std::string one_reasoning_block(const std::string & grammar) {
    static const std::regex k_blocks(
        R"((^|\n)root ::= \(start (any|analysis)\)\* start (tool-call|response-format)(\n|$))");
    const bool has_analysis =
        grammar.rfind("analysis ::= ", 0) == 0 || grammar.find("\nanalysis ::= ") != std::string::npos;
    std::smatch m;
    if (!has_analysis || !std::regex_search(grammar, m, k_blocks)) return grammar;
    return m.prefix().str() + m[1].str() + "root ::= (start analysis)? start " + m[3].str() + m[4].str() +
           m.suffix().str();
}

// The grammar's rule-name form of a name (llama.cpp's: runs of other characters as "-").
std::string rule_name(const std::string & s) {
    std::string out;
    for (char c : s) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
        if (ok) out += c;
        else if (out.empty() || out.back() != '-') out += '-';
    }
    return out;
}

std::string gbnf_literal(const std::string & s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else out += c;
    }
    return out + "\"";
}

// Arguments held to what their schemas allow where llama.cpp's grammar lets any text
// through. A format that writes each argument as XML text (Qwen3.5's "<parameter=city>\n
// Paris\n</parameter>") gets any text up to the closing tag, even for a string with an
// `enum`: such an argument is held to the enum's values, as the JSON formats' grammars
// hold it. gpt-oss's call header names a content type ("<|constrain|>json") of any
// length: at most 32 characters.
std::string schema_bound_args(const std::string & grammar, const std::vector<common_chat_tool> & tools) {
    std::string out = grammar;
    // Only that run, after "<|constrain|>": a user's schema may have a pattern like it.
    static const std::string k_type_run = "\"<|constrain|>\"? [A-Za-z0-9_-]+)?";
    for (size_t at = out.find(k_type_run); at != std::string::npos; at = out.find(k_type_run, at))
        out.replace(at, k_type_run.size(), "\"<|constrain|>\"? [A-Za-z0-9_-]{1,32})?");
    if (out.find(" xml-arg-string") == std::string::npos) return out;
    for (const auto & t : tools) {
        common_json params = common_json::parse_no_throw(t.parameters.empty() ? std::string("{}") : t.parameters);
        if (params.is_discarded() || !params.is_object() || !params.contains("properties") ||
            !params["properties"].is_object())
            continue;
        for (const auto & [name, schema] : params["properties"].items()) {
            if (!schema.is_object() || !schema.contains("enum") || !schema["enum"].is_array() || schema["enum"].empty())
                continue;
            std::string alts;
            bool strings = true;
            for (const auto & v : schema["enum"]) {
                if (!v.is_string()) strings = false;
                else alts += (alts.empty() ? "" : " | ") + gbnf_literal(v.get<std::string>());
            }
            if (!strings) continue;
            const std::string head = "\ntool-" + rule_name(t.name) + "-arg-" + rule_name(name) + " ::= ";
            const size_t r = out.find(head);
            if (r == std::string::npos) continue;
            const size_t eol = out.find('\n', r + 1);
            const size_t line_end = eol == std::string::npos ? out.size() : eol;
            static const std::string k_any = " xml-arg-string";
            if (line_end < k_any.size() || out.compare(line_end - k_any.size(), k_any.size(), k_any) != 0) continue;
            out.replace(line_end - k_any.size(), k_any.size(), " (" + alts + ") \"\\n</parameter>\\n\"");
        }
    }
    return out;
}

// One call only (parallel_tool_calls false): llama.cpp's grammars for formats that wrap
// each call on its own ("<tool_call>...</tool_call>") repeat the call whatever the flag
// says; the repetition goes.
std::string one_call(const std::string & grammar) {
    static const std::regex k_calls(R"((^|\n)tool-calls ::= \((tool-call space)\)\+(\n|$))");
    std::smatch m;
    if (!std::regex_search(grammar, m, k_calls)) return grammar;
    return m.prefix().str() + m[1].str() + "tool-calls ::= " + m[2].str() + m[3].str() + m.suffix().str();
}

class chat_templates_impl final : public chat_templates {
  public:
    explicit chat_templates_impl(const chat_template_source & src)
        : src_(src), tmpl_(src.source, src.bos_text, src.eos_text) {
        common_templates_ = common_chat_templates_init(nullptr, src.source, src.bos_text, src.eos_text);
        for (const std::string & t : src_.control_texts) {
            if (t.size() < 2) continue;
            by_start_[t.substr(0, 2)].push_back(&t);
            if (control_starts_.find(t[0]) == std::string::npos) control_starts_ += t[0];
        }
        one_system_ = probe_one_system();
        verbatim_ = probe_verbatim();
        try {
            const answer_format plain = answer_impl({}, answer_request{});
            reasons_ = !plain.reasoning_start.empty() && !plain.reasoning_ends.empty();
        } catch (const std::exception &) {
            reasons_ = false;
        }
    }

    bool reasons() const override { return reasons_; }

    bool contents_verbatim() const override { return verbatim_; }
    bool joins_system_messages() const override { return one_system_; }

    const std::string & source() const override { return src_.source; }

    result<rendered_conversation> render(std::span<const conversation_message> msgs, std::string_view tools_json,
                                         bool add_generation_prompt) const override {
        try {
            rendered_conversation r = render_impl(msgs, tools_json, add_generation_prompt);
            // Data holding a control token's text: the template must keep it data.
            std::string where;
            const std::string * hit = nullptr;
            for (size_t i = 0; i < msgs.size() && !hit; ++i)
                for (auto [f, name] :
                     {std::pair{&msgs[i].content, "content"}, std::pair{&msgs[i].tool_calls, "tool_calls"},
                      std::pair{&msgs[i].tool_call_id, "tool_call_id"}})
                    if ((hit = first_control(*f))) {
                        where = "message " + std::to_string(i) + "'s " + name;
                        break;
                    }
            std::string tools(tools_json);
            if (!hit && (hit = first_control(tools))) where = "the tools";
            if (!hit) return r;
            std::vector<conversation_message> clean(msgs.begin(), msgs.end());
            for (auto & m : clean) {
                neutralize(m.content);
                neutralize(m.tool_calls);
                neutralize(m.tool_call_id);
            }
            neutralize(tools);
            const rendered_conversation c = render_impl(clean, tools, add_generation_prompt);
            if (template_controls(r) > template_controls(c))
                return invalid_argument(where + " holds the text of the control token '" + *hit +
                                        "', which this chat template would pass to the model as that token (it "
                                        "copies the field through a filter such as tojson); remove or escape it");
            return r;
        } catch (const std::exception & e) {
            return invalid_argument(std::string("the chat template failed: ") + e.what());
        }
    }

    result<answer_format> answer(std::span<const conversation_message> tail,
                                 const answer_request & req) const override {
        std::string key;
        for (const auto & m : tail) key += m.role + '\x1f' + m.tool_calls + '\x1e';
        key += '\x1d' + req.tools_json + '\x1d' + std::to_string((int)req.choice) + req.named_function + '\x1d' +
               (req.parallel_tool_calls ? "p" : "1") + '\x1d' + req.json_schema;
        {
            std::lock_guard lk(mu_);
            if (auto it = memo_.find(key); it != memo_.end()) return it->second;
        }
        try {
            answer_format f = answer_impl(tail, req);
            std::lock_guard lk(mu_);
            if (memo_.size() >= 64) memo_.clear();
            memo_.emplace(key, f);
            return f;
        } catch (const std::exception & e) {
            return invalid_argument(e.what());
        }
    }

  private:
    // True when the template refuses a second system message but takes one.
    bool probe_one_system() const {
        const std::vector<conversation_message> one = {{"system", "a", "", ""}, {"user", "b", "", ""}};
        const std::vector<conversation_message> two = {
            {"system", "a", "", ""}, {"system", "c", "", ""}, {"user", "b", "", ""}};
        try {
            (void)render_impl(one, "", true);
        } catch (const std::exception &) {
            return false;
        }
        try {
            (void)render_impl(two, "", true);
            return false;
        } catch (const std::exception &) {
            return true;
        }
    }

    bool probe_verbatim() const {
        static const char * const k_probes[] = {
            "plain words",
            "  padded on both sides  \n",
            "\n",
            "a\n\n\nb",
            "<think>\nr\n</think>\n\nanswer",
            "<tool_response>\nx\n</tool_response>",
            "<tool_call>\n{}\n</tool_call>",
            "[TOOL_CALLS]",
            "{\"json\": [1, 2]}",
        };
        const std::string call =
            R"([{"id":"call0001a","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}])";
        const std::string tools = R"([{"type":"function","function":{"name":"f","description":"d",)"
                                  R"("parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}}])";
        const std::vector<std::vector<conversation_message>> shapes = {
            {{"system", "", "", ""}, {"user", "", "", ""}, {"assistant", "", "", ""}, {"user", "", "", ""}},
            {{"system", "", "", ""}, {"user", "", "", ""}, {"assistant", "", call, ""}, {"tool", "", "", "call0001a"},
             {"assistant", "", "", ""}, {"user", "", "", ""}},
        };
        size_t rendered = 0;
        for (const char * probe : k_probes)
            for (const auto & shape : shapes)
                for (const std::string & t : {std::string(), tools}) {
                    std::vector<conversation_message> real = shape, skel = shape;
                    for (size_t i = 0; i < real.size(); ++i) {
                        real[i].content = probe;
                        skel[i].content = content_placeholder(i);
                    }
                    rendered_conversation r, s;
                    try {
                        r = render_impl(real, t, true);
                        s = render_impl(skel, t, true);
                    } catch (const std::exception &) {
                        continue;  // a shape this template refuses says nothing
                    }
                    auto x = expand_skeleton(s, real);
                    if (!x || x->text.text != r.text) return false;
                    ++rendered;
                }
        return rendered > 0;
    }

    // The first control token text in `s` at or after `from`, and where (nullptr: none).
    // Texts are longest first.
    const std::string * first_control(std::string_view s, size_t from = 0, size_t * where = nullptr) const {
        for (size_t at = s.find_first_of(control_starts_, from); at != std::string_view::npos && at + 1 < s.size();
             at = s.find_first_of(control_starts_, at + 1)) {
            auto it = by_start_.find(std::string(s.substr(at, 2)));
            if (it == by_start_.end()) continue;
            for (const std::string * t : it->second)
                if (s.compare(at, t->size(), *t) == 0) {
                    if (where) *where = at;
                    return t;
                }
        }
        return nullptr;
    }
    const std::string * first_control(const std::string & s) const { return first_control(std::string_view(s)); }
    // Every control token text in `s` replaced by U+FFFD.
    void neutralize(std::string & s) const {
        size_t at = 0;
        while (const std::string * t = first_control(s, at, &at)) {
            s.replace(at, t->size(), "\xEF\xBF\xBD");
            at += 3;
        }
    }
    // Control token texts in the template's own runs.
    size_t template_controls(const rendered_conversation & r) const {
        size_t n = 0, prev = 0;
        for (const render_run & run : r.runs) {
            if (!run.input) {
                const std::string_view t(r.text.data() + prev, run.end - prev);
                size_t at = 0;
                while (const std::string * c = first_control(t, at, &at)) {
                    ++n;
                    at += c->size();
                }
            }
            prev = run.end;
        }
        return n;
    }

    // The messages as the template's context sees them, with llama.cpp's workarounds
    // for templates that lack a system role or want call arguments as objects.
    // A template that takes one system message, first (Qwen3.5's raises "System message
    // must be at the beginning" otherwise), gets the system messages as one: each joined
    // to the first by a blank line, in their order. (A workspace's system, instructions,
    // repository map and pinned files are several system messages.)
    common_json messages_json(std::span<const conversation_message> msgs) const {
        const auto & caps = tmpl_.caps;
        common_json arr = common_json::array();
        std::string pending_system;
        for (const auto & m : msgs) {
            if (!caps.supports_system_role && m.role == "system") {
                pending_system += (pending_system.empty() ? "" : "\n\n") + m.content;
                continue;
            }
            if (one_system_ && m.role == "system" && !arr.empty() && arr[0]["role"] == "system") {
                arr[0]["content"] = arr[0]["content"].get<std::string>() + "\n\n" + m.content;
                continue;
            }
            if (one_system_ && m.role == "system" && !arr.empty()) {
                common_json first = common_json::object();
                first["role"] = "system";
                first["content"] = m.content;
                common_json moved = common_json::array();
                moved.push_back(first);
                for (size_t i = 0; i < arr.size(); ++i) moved.push_back(arr[i]);
                arr = moved;
                continue;
            }
            common_json j = common_json::object();
            j["role"] = m.role;
            if (!pending_system.empty() && m.role == "user") {
                j["content"] = pending_system + "\n\n" + m.content;
                pending_system.clear();
            } else {
                j["content"] = m.content;
            }
            if (!m.tool_calls.empty()) {
                common_json calls = common_json::parse(m.tool_calls);
                if (!calls.is_array()) throw std::invalid_argument("tool_calls is not an array");
                common_json out = common_json::array();
                for (size_t i = 0; i < calls.size(); ++i) {
                    common_json c = calls[i];
                    if (caps.supports_object_arguments && c.contains("function") &&
                        c["function"].contains("arguments") && c["function"]["arguments"].is_string()) {
                        const std::string a = c["function"]["arguments"].get<std::string>();
                        common_json parsed = common_json::parse_no_throw(a);
                        if (!parsed.is_discarded() && parsed.is_object()) c["function"]["arguments"] = parsed;
                    }
                    out.push_back(c);
                }
                j["tool_calls"] = out;
            }
            if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
            arr.push_back(j);
        }
        if (!pending_system.empty()) {
            common_json j = common_json::object();
            j["role"] = "user";
            j["content"] = pending_system;
            arr.push_back(j);
        }
        return arr;
    }

    rendered_conversation render_impl(std::span<const conversation_message> msgs, std::string_view tools_json,
                                      bool add_generation_prompt) const {
        jinja::context ctx(tmpl_.source());
        common_json inp = common_json::object();
        inp["messages"] = messages_json(msgs);
        inp["enable_thinking"] = true;
        if (!tools_json.empty()) {
            common_json tools = common_json::parse(std::string(tools_json));
            if (!tools.is_array()) throw std::invalid_argument("tools is not an array");
            if (!tools.empty()) inp["tools"] = tools;
        }
        if (add_generation_prompt) inp["add_generation_prompt"] = true;
        jinja::global_from_json(ctx, inp, /*mark_input=*/true);
        // The template's own tokens are not request data: BOS and EOS stay control tokens.
        common_json own = common_json::object();
        own["bos_token"] = tmpl_.bos_token();
        own["eos_token"] = tmpl_.eos_token();
        jinja::global_from_json(ctx, own, /*mark_input=*/false);
        jinja::runtime rt(ctx);
        const jinja::value results = rt.execute(tmpl_.prog);
        auto parts = jinja::runtime::gather_string_parts(results);

        rendered_conversation out;
        for (const auto & p : parts->val_str.parts) {
            if (p.val.empty()) continue;
            out.text += p.val;
            if (!out.runs.empty() && out.runs.back().input == p.is_input) out.runs.back().end = out.text.size();
            else out.runs.push_back({out.text.size(), p.is_input});
        }
        // A tokenizer that adds BOS itself gets the template's BOS text removed, as
        // llama.cpp's server does.
        const std::string & bos = tmpl_.bos_token();
        if (src_.strip_bos && !bos.empty() && out.text.compare(0, bos.size(), bos) == 0) {
            out.text.erase(0, bos.size());
            std::vector<render_run> runs;
            for (auto r : out.runs) {
                if (r.end <= bos.size()) continue;
                r.end -= bos.size();
                runs.push_back(r);
            }
            out.runs = std::move(runs);
        }
        return out;
    }

    answer_format answer_impl(std::span<const conversation_message> tail, const answer_request & req) const {
        common_chat_templates_inputs in;
        for (const auto & m : tail) {
            common_chat_msg cm;
            cm.role = m.role;
            cm.content = m.content;
            if (!m.tool_calls.empty()) {
                common_json calls = common_json::parse(m.tool_calls);
                for (size_t i = 0; calls.is_array() && i < calls.size(); ++i) {
                    const common_json & c = calls[i];
                    common_chat_tool_call tc;
                    tc.id = c.value("id", std::string());
                    if (c.contains("function")) {
                        tc.name = c["function"].value("name", std::string());
                        const common_json & a = c["function"].value("arguments", common_json());
                        tc.arguments = a.is_string() ? a.get<std::string>() : a.dump();
                    }
                    cm.tool_calls.push_back(std::move(tc));
                }
            }
            cm.tool_call_id = m.tool_call_id;
            in.messages.push_back(std::move(cm));
        }
        if (in.messages.empty()) {
            common_chat_msg cm;
            cm.role = "user";
            in.messages.push_back(std::move(cm));
        }
        in.tools = parse_tools(req.tools_json, req.named_function);
        in.tool_choice = req.choice == tool_choice_mode::required || !req.named_function.empty()
                             ? COMMON_CHAT_TOOL_CHOICE_REQUIRED
                         : req.choice == tool_choice_mode::none ? COMMON_CHAT_TOOL_CHOICE_NONE
                                                                : COMMON_CHAT_TOOL_CHOICE_AUTO;
        in.parallel_tool_calls = req.parallel_tool_calls;
        in.json_schema = req.json_schema;
        in.add_generation_prompt = true;
        in.reasoning_format = COMMON_REASONING_FORMAT_AUTO;
        common_chat_params p = common_chat_templates_apply(common_templates_.get(), in);

        answer_format f;
        f.grammar = p.grammar;
        if (in.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED) f.grammar = calls_first(f.grammar);
        f.grammar = one_reasoning_block(schema_bound_args(f.grammar, in.tools));
        if (!in.parallel_tool_calls) f.grammar = one_call(f.grammar);
        f.grammar_lazy = p.grammar_lazy;
        for (const auto & t : p.grammar_triggers) {
            switch (t.type) {
                case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: f.trigger_words.push_back(t.value); break;
                case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: f.trigger_patterns.push_back(t.value); break;
                case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
                    std::string a = t.value.empty() ? "^$"
                                                    : (t.value.front() != '^' ? "^" : "") + t.value +
                                                          (t.value.back() != '$' ? "$" : "");
                    f.trigger_patterns.push_back(a);
                    break;
                }
                case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: break;  // never produced by templates
            }
        }
        f.additional_stops = p.additional_stops;
        f.generation_prompt = p.generation_prompt;
        if (p.supports_thinking) {
            f.reasoning_start = p.thinking_start_tag;
            f.reasoning_ends = p.thinking_end_tags;
        }
        f.preserved_tokens = p.preserved_tokens;
        f.format_name = common_chat_format_name(p.format);
        common_chat_parser_params pp(p);
        pp.reasoning_format = COMMON_REASONING_FORMAT_AUTO;
        pp.parse_tool_calls = !in.tools.empty() && in.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
        if (!p.parser.empty()) pp.parser.load(p.parser);
        f.parser = std::make_shared<common_parser>(std::move(pp));
        return f;
    }

    chat_template_source src_;
    std::map<std::string, std::vector<const std::string *>> by_start_;  // control texts by their first two bytes
    std::string control_starts_;                                         // their first bytes
    bool one_system_ = false;  // set before verbatim_ (probe_verbatim renders through it)
    bool verbatim_ = false;
    bool reasons_ = false;
    common_chat_template tmpl_;
    common_chat_templates_ptr common_templates_;
    mutable std::mutex mu_;
    mutable std::map<std::string, answer_format> memo_;
};

}  // namespace

result<std::unique_ptr<chat_templates>> chat_templates::load(const chat_template_source & src) {
    if (src.source.empty()) return invalid_argument("the chat template is empty");
    try {
        return std::unique_ptr<chat_templates>(std::make_unique<chat_templates_impl>(src));
    } catch (const std::exception & e) {
        return invalid_argument(std::string("the chat template does not parse: ") + e.what());
    }
}

result<std::string> json_schema_grammar(std::string_view schema_json) {
    try {
        common_json schema = common_json::parse(std::string(schema_json));
        return json_schema_to_grammar(schema);
    } catch (const std::exception & e) {
        return invalid_argument(std::string("the JSON schema cannot be turned into a grammar: ") + e.what());
    }
}

}  // namespace warmctx
