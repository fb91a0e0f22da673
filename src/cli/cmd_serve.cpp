// warmctx serve - the HTTP server (OpenAI-compatible and workspace routes, docs/api.md).
//
// Shutdown: SIGINT and SIGTERM are blocked in every thread (the mask is set before
// the scheduler and the HTTP pool start, and threads inherit it), and the main thread
// takes them with sigwait(). So no code runs in a signal handler; the main thread
// stops the HTTP server (requests still waiting get 503), then the scheduler.
#include <pthread.h>

#include <csignal>
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
    uint32_t n_parallel = 4;
    size_t max_queue = 64;
    uint32_t holders = 4;
    cache_flags cf;
    std::string api_key;
    size_t max_body_bytes = 8u << 20;
    int http_threads = 0;            // 0 = n_parallel + max_queue + 4, at most 64
    int32_t default_max_tokens = 256;
    std::string model_name;
    bool quiet = false;
};

int run_serve(const serve_args & a) {
    auto eo = a.mf.to_options(2 + a.holders + a.n_parallel);  // may generate the default model
    if (!eo) return fail(eo.error());

    scheduler_options so;
    so.engine.engine = *eo;
    so.engine.n_holders = a.holders;
    if (status st = a.cf.apply(so.engine); !st.ok()) return fail(st);
    so.n_parallel = a.n_parallel;
    so.max_queue = a.max_queue;

    server_options sv;
    sv.host = a.host;
    sv.port = a.port;
    sv.api_key = a.api_key;
    sv.max_body_bytes = a.max_body_bytes;
    sv.n_http_threads = a.http_threads > 0
                            ? a.http_threads
                            : static_cast<int>(std::min<size_t>(64, a.n_parallel + a.max_queue + 4));
    sv.default_max_tokens = a.default_max_tokens;
    sv.model_name = a.model_name;
    sv.log_requests = !a.quiet;
    sv.kinds = so.engine.kinds;

    // Block the shutdown signals before any thread exists, so that only sigwait below
    // ever receives them.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);

    progress("serve: loading " + so.engine.engine.model_path);
    auto sched = scheduler::start(so);
    if (!sched) return fail(sched.error());
    auto server = http_server::start(**sched, sv);
    if (!server) {
        (*sched)->stop();
        return fail(server.error());
    }
    const context_info & ci = (*sched)->context();
    std::printf("warmctx: listening on http://%s:%d (model %s, n_ctx %u per sequence, %u parallel, queue %zu%s)\n",
                sv.host.c_str(), (*server)->port(), so.engine.engine.model_path.c_str(), ci.n_ctx_seq,
                (*sched)->n_parallel(), so.max_queue, sv.api_key.empty() ? "" : ", API key required");
    std::fflush(stdout);

    int sig = 0;
    sigwait(&signals, &sig);
    progress(std::string("serve: ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + ", shutting down");
    (*server)->stop();
    (*sched)->stop();
    progress("serve: stopped");
    return 0;
}

}  // namespace

void register_serve_command(CLI::App & app, int & rc) {
    auto a = std::make_shared<serve_args>();
    auto * c = app.add_subcommand("serve", "serve the OpenAI-compatible and workspace HTTP API (docs/api.md)");
    a->mf.add_to(*c);
    c->add_option("--host", a->host, "address to listen on")->capture_default_str();
    c->add_option("--port", a->port, "port to listen on (0 = any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
    c->add_option("--parallel", a->n_parallel, "requests decoded at once (work sequences)")->capture_default_str()->check(CLI::Range(1, 64));
    c->add_option("--queue", a->max_queue, "requests waiting for a work sequence; beyond it 429")->capture_default_str()->check(CLI::Range(1, 100000));
    c->add_option("--holders", a->holders, "cached prefixes kept resident")->capture_default_str()->check(CLI::Range(1, 256));
    a->cf.add_to(*c);
    c->add_option("--api-key", a->api_key, "require \"Authorization: Bearer KEY\" on every route but /health")->envname("WARMCTX_API_KEY");
    c->add_option("--max-body-bytes", a->max_body_bytes, "larger request bodies get 413")->capture_default_str()->check(CLI::Range(size_t{1024}, size_t{1} << 32));
    c->add_option("--http-threads", a->http_threads, "HTTP worker threads (0 = parallel + queue + 4, at most 64)")->capture_default_str()->check(CLI::Range(0, 1024));
    c->add_option("--default-max-tokens", a->default_max_tokens, "max_tokens of a request that names none")->capture_default_str()->check(CLI::Range(1, 1 << 20));
    c->add_option("--model-name", a->model_name, "model id in /v1/models and responses (default: the model file's name)");
    c->add_flag("-q,--quiet", a->quiet, "no per-request log lines on stderr");
    on_run(c, rc, [a] { return run_serve(*a); });
}

}  // namespace warmctx::cli
