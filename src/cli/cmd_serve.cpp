// warmctx serve - the HTTP server (OpenAI-compatible and workspace routes, docs/api.md).
//
// Start-up: the flags are checked, the port is bound (GET /health answers 503
// "loading"), then the model is loaded (or generated) and the server attached to it;
// stdout's "listening" line says it is ready.
//
// Shutdown: SIGINT and SIGTERM are blocked in every thread (the mask is set before
// the HTTP pool and the scheduler start, and threads inherit it), and the main thread
// takes them with sigwait(). So no code runs in a signal handler; the main thread
// stops the HTTP server (requests still waiting get 503), then the scheduler. A
// signal during the load waits for the load to end.
//
// Every flag can also come from the environment: WARMCTX_ + its long name in capitals,
// '-' as '_' (--port: WARMCTX_PORT); a flag on the command line wins.
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "cli.h"
#include "warmctx/scheduler.h"
#include "warmctx/server.h"

namespace warmctx::cli {
namespace {

struct serve_args {
    model_flags mf;
    std::string host = "127.0.0.1";
    int port = 8080;
    uint32_t n_parallel = scheduler_options{}.n_parallel;
    size_t max_queue = 64;
    cache_flags cf;
    std::string api_key;
    size_t max_body_bytes = 8u << 20;
    int http_threads = 0;            // 0 = min_http_threads(n_parallel, max_queue)
    std::string cors_origin;
    std::string allowed_hosts;
    int sse_keep_alive_ms = 3000;
    int32_t default_max_tokens = 0;
    int32_t reasoning_budget = -1;
    int32_t draft_max = -1;
    int grammar_deadline_ms = 10000;
    unsigned grammar_builds = 0;
    std::string model_name;
    request_bounds bounds;
    bool quiet = false;
    bool no_disk = false;
    bool no_prewarm = false;
    bool isolate_workspaces = false;
    std::string prefill_ahead = "gpu";  // gpu, always, never
    bool disk_budget_given = false;
    bool api_key_given = false;         // --api-key on the command line, or WARMCTX_API_KEY set (even empty)
    uint32_t write_through_max_delay_ms = context_engine_options{}.write_through_max_delay_ms;
    int32_t resident_streams = -1;      // -1: as many as fit resident_share of the GPU
    double resident_share = 0.5;
    std::string stream_copies = "auto";  // auto, on, off
    bool shared_cache_dir = false;      // replicas share the cache directory (docs/scale-out.md)
    std::string replica;                // the replica label on /metrics
};

// Out of the box the disk tier and the workspace store live in the user's cache
// directory, so a restart loses no warm workspace.

// One start-up line: where the model's layers run and why.
std::string where_the_model_runs(const context_info & ci, const model_info & mi, const model_flags & mf) {
    const std::string fa = std::string("flash attention ") + (ci.flash_attn ? "on" : "off (--no-flash-attn)");
    if (ci.n_gpu_layers > 0) {
        std::string why = mf.gpu_layers < 0 ? "--gpu-layers -1, the default in a CUDA build"
                                            : "--gpu-layers " + std::to_string(mf.gpu_layers);
        return "model on " + ci.backend + ": " + std::to_string(ci.n_gpu_layers) + " of " + std::to_string(mi.n_layer) +
               " layers on the GPU (" + why + "), " + fa + "; " + std::to_string(ci.device_free_bytes >> 20) + " of " +
               std::to_string(ci.device_total_bytes >> 20) + " MiB of device memory were free after the model";
    }
    if (ci.backend == "CPU")
        return "model on the CPU (this build has no GPU backend; WARMCTX_CUDA=1 bash scripts/setup.sh builds one), " +
               fa;
    if (ci.device_total_bytes == 0) return "model on the CPU: this " + ci.backend + " build found no GPU, " + fa;
    return "model on the CPU (--gpu-layers 0), " + fa;
}

// One server per cache directory: an exclusive flock on <dir>/serve.lock, held until the
// process ends (the kernel lets go of it however the process ends, so a crash leaves no
// stale lock). Two servers on one directory each load the workspace store into memory,
// then serve different content for the same segment and overwrite each other's files.
// The file says who holds it ("pid N, http://host:port"), for the refusal's message.
// Replicas that share the directory on purpose (--shared-cache-dir: their stores follow
// the files) take a shared flock instead: any number of them, never beside a server that
// holds it alone. (flock is per machine on most network filesystems: replicas on other
// machines are not seen; docs/scale-out.md.)
result<int> lock_cache_dir(const std::string & dir, bool shared) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return io_error("cannot create the cache directory " + dir + ": " + ec.message());
    const std::string path = dir + "/serve.lock";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return io_error("cannot open " + path + ": " + std::strerror(errno));
    if (::flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
        const int err = errno;
        char buf[256];
        const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
        std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
        while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
        ::close(fd);
        if (err != EWOULDBLOCK) return io_error("cannot lock " + path + ": " + std::strerror(err));
        if (shared)
            return failed_precondition("a warmctx serve without --shared-cache-dir (" +
                                       (holder.empty() ? std::string("its pid unknown") : holder) +
                                       ") uses the cache directory " + dir + " alone (it holds " + path +
                                       "); replicas share a directory only when every one of them is started "
                                       "with --shared-cache-dir");
        if (holder.rfind("shared", 0) == 0)
            return failed_precondition("replicas started with --shared-cache-dir use the cache directory " + dir +
                                       " (they hold " + path + "); add --shared-cache-dir to share it with them, or "
                                       "give this one its own --cache-dir");
        return failed_precondition("another warmctx serve (" +
                                   (holder.empty() ? std::string("its pid unknown") : holder) +
                                   ") uses the cache directory " + dir + " (it holds " + path +
                                   "); two servers on one directory would serve different content for the same "
                                   "segment and overwrite each other's files: give this one its own --cache-dir (or "
                                   "WARMCTX_HOME), or --no-disk");
    }
    return fd;
}

// Writes who holds the lock into the lock file.
void note_lock_holder(int fd, const std::string & who) {
    if (fd < 0) return;
    if (::ftruncate(fd, 0) != 0) return;
    const std::string line = who + "\n";
    (void)!::pwrite(fd, line.data(), line.size(), 0);
}

// Refuses what serve must not start with: an empty API key, and an HTTP pool too small
// for --parallel and --queue. Errors: invalid_argument.
status check_serve_args(const serve_args & a) {
    // An empty key used to turn authentication off without a word: a script that meant
    // to require one (WARMCTX_API_KEY="$KEY" with KEY unset) served everyone.
    if (a.api_key_given && a.api_key.find_first_not_of(" \t\r\n") == std::string::npos)
        return invalid_argument("--api-key (or WARMCTX_API_KEY) is empty: that would turn authentication off; "
                                     "give a key, or leave both out to serve without one");
    // The server's rule (warmctx/server.h): the scheduler's queue, not the HTTP pool,
    // says 429, so every job it holds has a thread, and /health still gets one.
    const size_t need = min_http_threads(a.n_parallel, a.max_queue);
    if (need > static_cast<size_t>(http_server::k_max_http_threads)) {
        return invalid_argument("--parallel " + std::to_string(a.n_parallel) + " + --queue " +
                                std::to_string(a.max_queue) + " + " + std::to_string(k_http_thread_headroom) +
                                " need " + std::to_string(need) + " HTTP threads, more than the " +
                                std::to_string(http_server::k_max_http_threads) + " allowed: lower --queue");
    }
    if (a.http_threads > 0 && static_cast<size_t>(a.http_threads) < need) {
        return invalid_argument(
            "--http-threads " + std::to_string(a.http_threads) + " is too few: --parallel " +
            std::to_string(a.n_parallel) + " + --queue " + std::to_string(a.max_queue) + " + " +
            std::to_string(k_http_thread_headroom) +
            " (for /health, /metrics and quick answers) = " + std::to_string(need) +
            " are needed so that a full queue answers 429 instead of leaving requests unanswered (0 = that many)");
    }
    return {};
}

// The HTTP server's options from serve's flags (`cf`: the cache flags with serve's
// defaults applied; `so`: the scheduler's options, whose kind table the routes use).
server_options server_options_of(const serve_args & a, const cache_flags & cf, const scheduler_options & so) {
    server_options sv;
    sv.host = a.host;
    sv.port = a.port;
    sv.api_key = a.api_key;
    sv.max_body_bytes = a.max_body_bytes;
    sv.n_http_threads = a.http_threads;
    sv.max_queue = a.max_queue;
    sv.cors_origin = a.cors_origin;
    sv.allowed_hosts = a.allowed_hosts;
    sv.sse_keep_alive_ms = a.sse_keep_alive_ms;
    sv.default_max_tokens = a.default_max_tokens;
    sv.reasoning_budget = a.reasoning_budget;
    sv.draft_max = a.draft_max;
    sv.grammar_deadline_ms = a.grammar_deadline_ms;
    sv.grammar_builds = a.grammar_builds;
    sv.model_name = a.model_name;
    sv.bounds = a.bounds;
    sv.log_requests = !a.quiet;
    sv.kinds = so.engine.kinds;
    sv.workspace_dir = cf.cache_dir.empty() ? std::string() : cf.cache_dir + "/workspaces";
    sv.prewarm = !a.no_prewarm;
    sv.isolate_workspaces = a.isolate_workspaces;
    sv.shared_workspace_dir = a.shared_cache_dir;
    sv.replica = a.replica;
    return sv;
}

// What serve tells at start: where it listens, where the model runs, the context and KV
// it allocated, the chat template, and the disk tier.
void report_start(const serve_args & a, const server_options & sv, const scheduler_options & so, const cache_flags & cf,
                  scheduler & sched, int port) {
    const context_info & ci = sched.context();
    std::printf("warmctx: listening on http://%s:%d (model %s, n_ctx %u per sequence, %u parallel, queue %zu%s)\n",
                sv.host.c_str(), port, so.engine.engine.model_path.c_str(), ci.n_ctx_seq,
                sched.n_parallel(), so.max_queue, sv.api_key.empty() ? "" : ", API key required");
    std::fflush(stdout);
    progress("serve: " + where_the_model_runs(ci, sched.model(), a.mf));
    if (ci.n_seq_resident > 0 || a.resident_streams != 0)
        progress("serve: device tier: " + std::to_string(ci.n_seq_resident) + " resident KV streams beside the " +
                 std::to_string(sched.n_parallel()) + " of --parallel (" + ci.resident_reason +
                 "; --resident-streams, --resident-share): a workspace's prefix stays where the model runs between "
                 "its turns, and its next turn starts there even while --parallel requests run");
    progress("serve: memory: " + std::string(memory_kind_name(ci.memory.kind)) + ": " + ci.memory.note +
             (ci.memory.checkpoints ? "; the streams' checkpoints up to " +
                                          (so.engine.stream_checkpoint_max_bytes
                                               ? std::to_string(so.engine.stream_checkpoint_max_bytes >> 20) + " MiB"
                                               : std::string("unlimited")) +
                                          " of RAM (--checkpoint-budget-bytes)"
                                    : std::string()));
    progress("serve: context " + std::to_string(ci.n_ctx_seq) + " tokens per sequence (" + ci.n_ctx_reason +
             (ci.pads_rows ? "; 64 cells of each stream pad small batches on the CPU" : "") +
             (ci.splits_freely ? "; a prompt's KV measured the same whatever its decode calls (" +
                                     std::to_string((int)ci.splits_probe_ms) +
                                     " ms): prefill in full calls, warm turns resume at any token"
                               : std::string()) +
             (ci.pads_steps ? std::string("; a lone decode row goes as two (the same bits alone, batched or drafted") +
                                  (ci.pads_beside ? ", its pad in an empty stream beside it)" : ")")
              : ci.backend == "CPU" && !ci.steps_exact
                  ? "; a lone decode row alone parts from one among others (drafts off unless asked)"
                  : std::string()) +
             "; -c to change); KV streams " + std::to_string(ci.n_seq_max) + " x " +
             std::to_string((ci.kv_streams_bytes / std::max<uint32_t>(ci.n_seq_max, 1)) >> 20) +
             " MiB = " + std::to_string(ci.kv_streams_bytes >> 20) + " MiB allocated; cached prefixes up to " +
             (so.engine.budget.max_bytes ? std::to_string(so.engine.budget.max_bytes >> 20) + " MiB"
                                         : std::string("unlimited")) +
             " of RAM (--budget-bytes)");
    {
        const model_info & mi = sched.model();
        const std::string whose = mi.chat_template_overridden ? "from --chat-template-file" : "the model's own";
        if (sched.chat_template())
            progress("serve: chat template: " + whose + ", Jinja (tools in its own format, tool calls parsed)");
        else if (mi.chat_template.empty())
            progress("serve: chat template: none in the model (pass --chat-template-file)");
        else
            progress("serve: chat template: " + whose + ", llama.cpp's built-in per-message rendering" +
                     (so.engine.engine.jinja ? " (the Jinja template did not load)" : " (--no-jinja)") +
                     "; tool_choice \"required\" is refused");
    }
    if (cf.cache_dir.empty()) {
        progress("serve: nothing kept on disk (--no-disk): a restart starts cold and forgets stored workspaces");
    } else {
        progress(
            "serve: disk tier " + cf.cache_dir + ", up to " +
            (cf.disk_budget_bytes ? std::to_string(cf.disk_budget_bytes >> 20) + " MiB" : std::string("unlimited")) +
            " (--disk-budget-bytes); stored workspaces persist in " + sv.workspace_dir +
            " and are brought warm on start (--no-disk keeps nothing)" +
            (a.shared_cache_dir ? "; shared with the other replicas (--shared-cache-dir)" : ""));
    }
}

int run_serve(const serve_args & a) {
    if (status st = check_serve_args(a); !st.ok()) return fail(st);

    scheduler_options so;
    cache_flags cf = a.cf;
    if (a.no_disk) {
        if (!cf.cache_dir.empty()) return fail(invalid_argument("--no-disk and --cache-dir contradict each other"));
    } else if (cf.cache_dir.empty()) {
        cf.cache_dir = default_disk_dir();
        if (cf.disk_budget_bytes == 0 && !a.disk_budget_given) cf.disk_budget_bytes = k_default_disk_budget;
    }
    if (status st = cf.apply(so.engine); !st.ok()) return fail(st);
    int lock_fd = -1;  // held (never closed) until the process ends
    if (a.shared_cache_dir && cf.cache_dir.empty())
        return fail(invalid_argument("--shared-cache-dir and --no-disk contradict each other"));
    so.engine.tiers.shared_dir = a.shared_cache_dir;
    so.engine.write_through_max_delay_ms = a.write_through_max_delay_ms;
    if (!cf.cache_dir.empty()) {
        auto l = lock_cache_dir(cf.cache_dir, a.shared_cache_dir);
        if (!l) return fail(l.error());
        lock_fd = *l;
        note_lock_holder(lock_fd, a.shared_cache_dir ? std::string("shared by replicas (--shared-cache-dir)")
                                                     : "pid " + std::to_string(static_cast<long>(::getpid())));
    }
    so.n_parallel = a.n_parallel;
    so.max_queue = a.max_queue;
    so.prefill_ahead = a.prefill_ahead == "always"  ? scheduler_options::ahead_mode::always
                       : a.prefill_ahead == "never" ? scheduler_options::ahead_mode::never
                                                    : scheduler_options::ahead_mode::gpu;

    const server_options sv = server_options_of(a, cf, so);

    // Block the shutdown signals before any thread exists, so that only sigwait below
    // ever receives them.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);

    auto server = http_server::start(sv);
    if (!server) return fail(server.error());
    if (!a.shared_cache_dir)
        note_lock_holder(lock_fd, "pid " + std::to_string(static_cast<long>(::getpid())) + ", http://" + sv.host + ":" +
                                      std::to_string((*server)->port()));
    progress("serve: bound http://" + sv.host + ":" + std::to_string((*server)->port()) +
             ", loading the model (GET /health: 503 until ready)");
    auto eo = a.mf.to_options(a.n_parallel);  // may generate the default model
    if (!eo) {
        (*server)->stop();
        return fail(eo.error());
    }
    so.engine.engine = *eo;
    so.engine.engine.n_seq_resident = a.resident_streams;
    so.engine.engine.resident_vram_share = a.resident_share;
    so.engine.stream_copies = a.stream_copies == "on"    ? context_engine_options::stream_copy_mode::on
                              : a.stream_copies == "off" ? context_engine_options::stream_copy_mode::off
                                                         : context_engine_options::stream_copy_mode::automatic;
    so.engine.cold_stream = false;  // every KV stream runs turns
    progress("serve: loading " + so.engine.engine.model_path);
    auto sched = scheduler::start(so);
    if (!sched) {
        (*server)->stop();
        return fail(sched.error());
    }
    if (status st = (*server)->attach(**sched); !st.ok()) {
        (*server)->stop();
        (*sched)->stop();
        return fail(st);
    }
    report_start(a, sv, so, cf, **sched, (*server)->port());

    int sig = 0;
    sigwait(&signals, &sig);
    progress(std::string("serve: ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + ", shutting down");
    (*server)->stop();
    (*sched)->stop();
    progress("serve: stopped");
    return 0;
}

// WARMCTX_ + the option's first long name in capitals, '-' as '_'.
std::string env_name_of(const CLI::Option & o) {
    if (o.get_lnames().empty()) return {};
    std::string n = "WARMCTX_";
    for (char ch : o.get_lnames().front())
        n += ch == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return n;
}

// What one request may hold (--max-body-bytes, --max-messages, the tool and schema bounds).
void add_request_bounds(CLI::App & c, serve_args & a) {
    c.add_option("--max-body-bytes", a.max_body_bytes, "larger request bodies get 413")
        ->capture_default_str()
        ->check(CLI::Range(size_t{1024}, size_t{1} << 32));
    c.add_option("--max-messages", a.bounds.max_messages, "messages in one chat (more get 400 too_many_messages)")
        ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{10000}));
    c.add_option("--max-tools", a.bounds.max_tools, "function tools in one request (more get 400 too_many_tools)")
        ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{100000}));
    c.add_option("--max-tools-bytes", a.bounds.max_tools_bytes,
                  "a request's tools as canonical JSON, bytes (more get 400 tools_too_large)")
        ->capture_default_str()->check(CLI::Range(size_t{1024}, size_t{1} << 30));
    c.add_option("--max-enum-values", a.bounds.max_enum_values,
                  "enum values over a request's schemas (more get 400 too_many_enum_values)")
        ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1000000}));
    c.add_option("--max-optional-properties", a.bounds.max_optional_properties,
                  "properties not required in one object schema (more get 400 too_many_optional_properties)")
        ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{100000}));
    c.add_option("--max-schema-alternatives", a.bounds.max_schema_alternatives,
                  "anyOf/oneOf alternatives over a request's schemas (more get 400 too_many_alternatives)")
        ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1000000}));
    c.add_option("--max-schema-cost", a.bounds.max_schema_cost,
                  "the grammar a request's schemas make, estimated before it is built: each object schema counts its "
                  "properties plus the square of its optional ones (more get 400 schema_too_costly)")
        ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1} << 40));
    c.add_option("--max-grammar-bytes", a.bounds.max_grammar_bytes,
                  "an answer's grammar as built (GBNF text), bytes (larger get 400 grammar_too_large)")
        ->capture_default_str()->check(CLI::Range(size_t{1024}, size_t{1} << 40));
    c.add_option("--max-pattern-bytes", a.bounds.max_pattern_bytes,
                  "one schema pattern's length, bytes (longer get 400 pattern_too_long)")
        ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1} << 20));
    c.add_option(
         "--max-pattern-nesting", a.bounds.max_pattern_nesting,
         "groups open at once in one pattern (deeper get 400 pattern_too_deep; llama.cpp converts at most 100)")
        ->capture_default_str()
        ->check(CLI::Range(size_t{1}, size_t{100}));
}

}  // namespace

// The disk tier's flags beyond cache_flags': when a turn's write is made, and a directory
// shared by replicas.
void add_disk_flags(CLI::App & c, serve_args & a) {
    c.add_option("--write-through-max-delay-ms", a.write_through_max_delay_ms,
                  "a turn's disk write waits for an idle engine (500 ms without turns), but no longer than this while "
                  "turns keep it busy: what a crash or a kill can lose of what turns cached (0: until idle)")
        ->capture_default_str();
    c.add_flag("--shared-cache-dir", a.shared_cache_dir,
                "share the cache directory (disk tier and workspace store) with other replicas started with this "
                "flag, on this machine or over a shared filesystem: each follows the files the others write and "
                "evict, and --disk-budget-bytes is the directory's (docs/scale-out.md)");
}

void register_serve_command(CLI::App & app, int & rc) {
    auto a = std::make_shared<serve_args>();
    auto * c = app.add_subcommand("serve", "serve the OpenAI-compatible and workspace HTTP API (docs/api.md)");
    a->mf.add_to(*c);
    c->add_option("--host", a->host, "address to listen on")->capture_default_str();
    c->add_option("--port", a->port, "port to listen on (0 = any free port)")
        ->capture_default_str()
        ->check(CLI::Range(0, 65535));
    c->add_option("--parallel", a->n_parallel,
                  "requests decoded at once (each in a work stream); beyond it, a request whose workspace's "
                  "prefix sits in an idle resident stream (--resident-streams) starts there")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    c->add_option("--queue", a->max_queue, "requests waiting for a work sequence; beyond it 429")
        ->capture_default_str()
        ->check(CLI::Range(1, 100000));
    a->cf.add_to(*c);
    c->add_option("--api-key", a->api_key,
                  "require the key on every route but /health, / and /ui (the page asks for it), as "
                  "\"Authorization: Bearer KEY\" (OpenAI's clients) or \"x-api-key: KEY\" (Anthropic's)")
        ->envname("WARMCTX_API_KEY");
    add_request_bounds(*c, *a);
    c->add_option("--http-threads", a->http_threads,
                  "HTTP threads, at least parallel + queue + 4 so that a full queue answers 429 (0 = that many)")
        ->capture_default_str()
        ->check(CLI::Range(0, http_server::k_max_http_threads));
    c->add_option("--cors-origin", a->cors_origin,
                  "allow browsers from these origins: '*' or a comma-separated list (default: no CORS)");
    c->add_option("--allowed-hosts", a->allowed_hosts,
                  "without --api-key, the Host names served besides IP addresses and localhost (against DNS "
                  "rebinding): a comma-separated list, or '*' for any");
    c->add_option("--sse-keep-alive-ms", a->sse_keep_alive_ms,
                  "a streamed request that waits (queued, prefilling) gets its headers after at most this, then an SSE "
                  "comment this often")
        ->capture_default_str()
        ->check(CLI::Range(50, 600000));
    c->add_option("--grammar-deadline-ms", a->grammar_deadline_ms,
                  "a request whose answer grammar (tools, a JSON schema) is not built within this answers 503 "
                  "grammar_timeout")
        ->capture_default_str()
        ->check(CLI::Range(100, 600000));
    c->add_option("--grammar-builds", a->grammar_builds,
                  "answer grammars built at once, off the engine thread (0 = half the cores, at least one)")
        ->capture_default_str()
        ->check(CLI::Range(0u, 256u));
    c->add_option("--default-max-tokens", a->default_max_tokens,
                  "max_tokens of a request that names none (0 = to the end of the context, as OpenAI and llama-server)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 20));
    c->add_option("--reasoning-budget", a->reasoning_budget,
                  "reasoning tokens an answer may spend before its reasoning block is closed for it, when the "
                  "request names no reasoning_budget_tokens (-1 = no budget, 0 = close it at once; as llama-server)")
        ->capture_default_str()
        ->check(CLI::Range(-1, 1 << 20));
    c->add_option("--draft-max", a->draft_max,
                  "tokens a draft from the workspace may hold when the request names no speculative.n_max: the "
                  "text that followed the answer's last tokens in the prompt or an earlier answer, checked in the "
                  "same decode (the answer is the same as without; not a recurrent or hybrid model; 0 = no drafts; "
                  "-1 = 64 where the engine measured a step's rows exact (the CPU; info's steps_exact), else "
                  "none: a GPU, where verify found drafted answers parting from plain ones, --kv-mode shared)")
        ->capture_default_str()
        ->check(CLI::Range(-1, 64));
    c->add_option("--model-name", a->model_name,
                  "model id in /v1/models and responses (default: the model file's name)");
    c->add_flag("-q,--quiet", a->quiet, "no per-request log lines on stderr");
    c->add_flag("--no-disk", a->no_disk,
                "keep nothing on disk: no disk tier, no durable workspace store (default: both in the cache directory, "
                "$WARMCTX_HOME or $XDG_CACHE_HOME/warmctx or ~/.cache/warmctx, under kv/, the disk tier up to 8 GiB)");
    c->add_flag(
        "--isolate-workspaces", a->isolate_workspaces,
        "keep each workspace's prefix cache apart (its blocks salted with the workspace): no request reuses, or "
        "can tell by its cached tokens, what another workspace sent (default: blocks are shared by content, "
        "so two workspaces with the same system prompt share its KV)");
    c->add_flag(
        "--no-prewarm", a->no_prewarm,
        "do not pre-warm a workspace when its stored stable segments change, nor the stored workspaces on start");
    c->add_option(
         "--prefill-ahead", a->prefill_ahead,
         "prefill a cold prompt's leading segments (system, tools, rules: up to 32 KiB of new text) while the "
         "rest of it, at least 64 KiB of new text, is still tokenized: gpu (only when the model's layers run on "
         "a GPU; on the CPU prefill and tokenizing share the cores), always, never")
        ->check(CLI::IsMember({"gpu", "always", "never"}))
        ->capture_default_str();
    c->add_option("--resident-streams", a->resident_streams,
                  "the device tier: KV streams kept beside --parallel's, each holding a workspace's prefix where the "
                  "model runs between its turns (-1 = on a GPU as many as fit --resident-share of its free memory; on "
                  "the CPU up to 3 per --parallel stream, within --resident-share of the RAM available after the work "
                  "streams, the pool's share and a reserve, at most a quarter of RAM up to 8 GiB)")
        ->capture_default_str()
        ->check(CLI::Range(-1, 255));
    c->add_option("--resident-share", a->resident_share,
                  "for --resident-streams -1: the share of the device memory (on the CPU: RAM) free after the model, "
                  "the work streams and a reserve (on the CPU also the pool's share) that resident streams may take")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 0.95));
    c->add_option("--stream-copies", a->stream_copies,
                  "reuse a prefix another idle stream holds by copying the stream (on a GPU, device to device) instead "
                  "of through the RAM pool: auto (when layers run on a GPU), on, off")
        ->check(CLI::IsMember({"auto", "on", "off"}))
        ->capture_default_str();
    add_disk_flags(*c, *a);
    c->add_option("--replica", a->replica,
                  "a label replica=\"NAME\" on every /metrics sample, so one dashboard tells replicas apart");
    c->parse_complete_callback([a, c] {
        a->disk_budget_given = c->count("--disk-budget-bytes") > 0;
        // CLI11 ignores an empty environment variable: look for it ourselves.
        a->api_key_given = c->count("--api-key") > 0 || std::getenv("WARMCTX_API_KEY") != nullptr;
    });
    for (CLI::Option * o : c->get_options())
        if (o->get_envname().empty() && !env_name_of(*o).empty() && o != c->get_help_ptr()) o->envname(env_name_of(*o));
    c->footer("Every flag may also be set in the environment: WARMCTX_ + its long name in capitals, '-' as '_' "
              "(shown as Env above); a flag on the command line wins.");
    on_run(c, rc, [a] { return run_serve(*a); });
}

}  // namespace warmctx::cli
