// Side-by-side benchmark plumbing: the systems a bench compares (warmctx's HTTP
// server in this process, llama.cpp's llama-server as a child process), one streamed
// request timed at the client, and the prompt builder that gives both the same tokens.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli.h"
#include "util/resources.h"
#include "warmctx/segments.h"
#include "workload/workload.h"

// llama-server and llama-bench of the same build: beside the binary (util/resources.h:
// libexec/warmctx/ when installed, bin/ in the build tree), else whatever PATH finds.
inline std::string default_tool(const char * name) {
    auto p = warmctx::find_tool(name);
    return p.ok() ? *p : std::string(name);
}

namespace warmctx::cli {

// One request as the client saw it.
struct turn_timing {
    bool ok = false;
    std::string error;
    double ttft_ms = 0;        // request sent .. first generated token's event
    double total_ms = 0;       // request sent .. last byte
    double server_ms = 0;      // the server's own account of request .. first token
                               // (warmctx: first_token_ms; llama-server: prompt_ms)
    int prompt_tokens = 0;
    int cached_tokens = 0;     // prompt tokens the system reused
    int completion_tokens = 0;
    int common_tokens = -1;    // warmctx: prompt tokens shared with the workspace's last turn's
                               // (`warmctx.tokens_common_with_previous_turn`; -1: none or unknown)
    nlohmann::json phases;     // warmctx: where first_token_ms went (assemble, copy, prefill)
    nlohmann::json timings;    // warmctx: the response's `warmctx.timings` object as it came
                               // (null when the response had none)
    std::string reason;        // warmctx: the response's `warmctx.reason` (why it reused what it did)
    nlohmann::json drafts;     // warmctx: the response's `warmctx.drafts` (null: none)
};

// A server under test, answering one streamed request at a time.
class bench_system {
  public:
    virtual ~bench_system() = default;
    virtual std::string name() const = 0;
    // Sends one turn. warmctx takes the typed segments under `workspace`; llama-server
    // takes `tokens`, the same prompt as warmctx assembles it (so both prefill the same
    // tokens and template differences cannot skew the comparison).
    virtual turn_timing send(const std::string & workspace, const std::vector<segment> & segs,
                             const std::vector<token_id> & tokens, int max_tokens) = 0;
    // Sends one turn as a plain OpenAI chat: `messages` ([{"role","content"}, ...]) with no
    // workspace and no segments. warmctx takes the messages; llama-server, as in send(),
    // `tokens` (the prompt warmctx assembles from those messages: chat_segments below).
    virtual turn_timing send_chat(const nlohmann::json & messages, const std::vector<token_id> & tokens,
                                  int max_tokens) {
        (void)messages;
        return send("", {}, tokens, max_tokens);
    }
    // What the system was started with (flags, budgets), for the JSON report.
    virtual nlohmann::json describe() const = 0;
    // What the system holds now, for the report after a run (warmctx: its KV memory).
    virtual nlohmann::json state() { return nlohmann::json::object(); }
    // Its HTTP port on 127.0.0.1 (for scrapes beside the requests). send() may be
    // called from several threads at once.
    virtual int port() const = 0;
};

// A directory the bench made (make_owned_dir), removed with all it holds when its owner
// goes, on every way out ("" = none).
class owned_dir {
  public:
    owned_dir() = default;
    explicit owned_dir(std::string path) : path_(std::move(path)) {}
    owned_dir(owned_dir && o) noexcept : path_(std::exchange(o.path_, {})) {}
    owned_dir & operator=(owned_dir && o) noexcept;
    owned_dir(const owned_dir &) = delete;
    owned_dir & operator=(const owned_dir &) = delete;
    ~owned_dir();
    const std::string & path() const { return path_; }

  private:
    std::string path_;
};

// A new directory `parent`/`prefix`-XXXXXX. Errors: io_error.
result<owned_dir> make_owned_dir(const std::string & parent, const std::string & prefix);

struct warmctx_system_options {
    std::string name = "warmctx";
    model_flags mf;                 // mf.n_ctx: per work sequence
    uint32_t holders = 4096;        // pool entries at most (the byte budget binds first)
    uint32_t parallel = 1;          // work sequences (requests decoded at once)
    int32_t resident_streams = 0;   // serve's --resident-streams (-1: its default, sized from
                                    // the GPU's free memory, on the CPU from RAM)
    cache_flags cf;
    std::string workspace_dir;      // the durable segment store ("" = memory only)
    // serve's default disk tier (a user's serve writes stable prefixes through to disk):
    // in a fresh directory with serve's default budget, removed when the system stops.
    bool default_disk = false;
    int32_t draft_max = -1;         // serve's --draft-max (0: no drafts from the workspace; -1: serve's default)
    // The cells small batches' padding needs come out of mf.n_ctx (engine_options::
    // padding_within_n_ctx): a stream of exactly another server's slot's cells.
    bool padding_within_n_ctx = false;
};
result<std::unique_ptr<bench_system>> start_warmctx_system(const warmctx_system_options & o);

struct llama_server_options {
    std::string name = "llama-server";
    std::string binary = default_tool("llama-server");
    model_flags mf;                 // model, n_ctx (per slot), threads, gpu layers, kv type, chunk, fa
    int slots = 1;
    int cache_ram_mib = -1;         // --cache-ram (-1: llama-server's default)
    uint64_t kv_bytes_per_token = 0; // for the report of its allocated KV (0 = not reported)
    bool defaults = false;          // llama-server's own defaults: no -c, -np, --cache-ram,
                                    // batch or KV-type flags (model, threads, GPU layers and
                                    // flash attention still given)
    std::string log_path;           // its stdout and stderr ("" = a temp file)
    std::vector<std::string> extra_args;  // after the others (e.g. --spec-type ngram-mod)
    double start_timeout_s = 600;
};
result<std::unique_ptr<bench_system>> start_llama_server(const llama_server_options & o);
// llama-server at its own defaults, as its users meet it (llama_server_options::defaults),
// with `extra_args` after them.
result<std::unique_ptr<bench_system>> start_llama_server_at_defaults(const std::string & name,
                                                                     const std::string & binary,
                                                                     const model_flags & mf,
                                                                     std::vector<std::string> extra_args = {});

// The tokenizer and chat template of a model (weights mapped, no GPU, a tiny context):
// counts tokens for the workload generators and assembles segments into exactly the
// tokens warmctx prefills.
class prompt_builder {
  public:
    static result<std::unique_ptr<prompt_builder>> open(const model_flags & mf);
    ~prompt_builder();
    token_counter counter();
    result<std::vector<token_id>> tokens(const std::vector<segment> & segs);
    uint64_t kv_bytes_per_token() const;   // f16 K+V of all layers, per token
    const std::string & model_path() const;
    std::string model_description() const;

  private:
    struct impl;
    std::unique_ptr<impl> p_;
    explicit prompt_builder(std::unique_ptr<impl> p);
};

// The segments warmctx's chat route makes of a plain `messages` array (the server's own
// mapping, server/api/openai/openai.h): what prompt_builder::tokens needs to give llama-server the
// prompt warmctx prefills for that chat. Errors: invalid_argument (what the route refuses).
result<std::vector<segment>> chat_segments(const nlohmann::json & messages);

double percentile(std::vector<double> v, double p);
double median(std::vector<double> v);
// Mean and sample standard deviation (as llama-bench reports them); {0, 0} when empty.
struct sample_stats { double mean = 0, stddev = 0; };
sample_stats summarize(const std::vector<double> & v);

// Runs a command, returns its stdout (stderr is discarded). Errors: io_error.
result<std::string> run_capture(const std::string & cmd);

// llama-bench's mean prompt-processing rate (tok/s) for `n_prompt` tokens after a context
// of `depth` tokens (0 = cold), or the generation rate when n_prompt == 0 and n_gen > 0.
struct llama_bench_rate { double tps = 0, stddev = 0; };
result<llama_bench_rate> llama_bench_run(const std::string & binary, const engine_options & o, int32_t threads,
                                         int n_prompt, int n_gen, int depth, int reps, bool warmup);

}  // namespace warmctx::cli
