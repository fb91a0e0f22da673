#include "bench_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>

#include "util/clock.h"
#include "warmctx/context_engine.h"
#include "util/json.h"
#include "warmctx/scheduler.h"
#include "warmctx/server.h"
#include "server/api/openai/openai.h"
#include "sse_reader.h"

extern char ** environ;

namespace warmctx::cli {
namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;

// POSTs `body` with stream=true and reads the server-sent events as they arrive.
// `on_event(payload)` returns true when the event carries the first generated token;
// `on_final(payload)` sees every event to pick up usage/timings.
template <class First, class Each>
turn_timing stream_post(int port, const std::string & path, const std::string & body, First is_token_event,
                        Each on_event) {
    turn_timing t;
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(7200, 0);
    c.set_write_timeout(600, 0);
    c.set_connection_timeout(30, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body;
    req.set_header("Content-Type", "application/json");
    sse_reader events;
    bool got_first = false;
    const auto t0 = clock_type::now();
    req.content_receiver = [&](const char * d, size_t n, uint64_t, uint64_t) {
        return events.feed({d, n}, [&](const sse_event & ev) {
            if (ev.n_data_lines == 0 || ev.done()) return true;
            auto j = parse_json(ev.data);
            if (!j) return true;
            if (!got_first && is_token_event(*j)) {
                got_first = true;
                t.ttft_ms = ms_between(t0, clock_type::now());
            }
            on_event(*j, t);
            return true;
        });
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = c.send(req, res, err);
    t.total_ms = ms_between(t0, clock_type::now());
    if (!sent) {
        t.error = "request failed: " + httplib::to_string(err);
        return t;
    }
    if (res.status != 200) {
        t.error = "HTTP " + std::to_string(res.status) + ": " + res.body.substr(0, 300);
        return t;
    }
    if (!got_first) {
        t.error = "the stream ended without a generated token";
        return t;
    }
    t.ok = true;
    return t;
}

}  // namespace

owned_dir & owned_dir::operator=(owned_dir && o) noexcept {
    if (this != &o) {
        owned_dir gone(std::move(*this));
        path_ = std::exchange(o.path_, {});
    }
    return *this;
}

owned_dir::~owned_dir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

result<owned_dir> make_owned_dir(const std::string & parent, const std::string & prefix) {
    std::string tmpl = parent + "/" + prefix + "-XXXXXX";
    if (!mkdtemp(tmpl.data()))
        return io_error("bench: cannot create a directory " + tmpl + ": " + std::strerror(errno));
    return owned_dir(tmpl);
}

namespace {

class warmctx_system final : public bench_system {
  public:
    warmctx_system(std::string name, std::unique_ptr<scheduler> s, std::unique_ptr<http_server> h, json desc,
                   owned_dir dir)
        : name_(std::move(name)), sched_(std::move(s)), http_(std::move(h)), desc_(std::move(desc)),
          dir_(std::move(dir)) {}
    ~warmctx_system() override {
        http_.reset();
        sched_.reset();  // finishes the disk tier's writes; dir_ goes after
    }
    std::string name() const override { return name_; }
    int port() const override { return http_->port(); }
    json describe() const override { return desc_; }
    json state() override {
        json j = json::object();
        (void)sched_->call([&j](context_engine & ce) {
            const kv_memory m = ce.counters().memory;
            j = {{"kv_allocated_bytes", m.allocated_bytes}, {"kv_used_bytes", m.used_bytes},
                 {"streams_allocated_bytes", m.streams_allocated_bytes}, {"pool_bytes", m.pool_bytes},
                 {"pool_allocated_bytes", m.pool_allocated_bytes}, {"pool_entries", m.pool_entries},
                 {"in_place_turns", m.n_in_place_turns}, {"pool_loads", m.n_pool_loads}};
        });
        return j;
    }
    turn_timing send(const std::string & workspace, const std::vector<segment> & segs, const std::vector<token_id> &,
                     int max_tokens) override {
        json s = json::array();
        for (const auto & x : segs) {
            json e = {{"id", x.id}, {"kind", std::string(segment_kind_name(x.kind))}, {"content", x.content}};
            if (!x.path.empty()) e["path"] = x.path;
            if (!x.role.empty()) e["role"] = x.role;
            s.push_back(std::move(e));
        }
        json body = {{"model", "warmctx"},      {"workspace", workspace},
                     {"messages", json::array()}, {"segments", std::move(s)},
                     {"max_tokens", max_tokens}, {"temperature", 0},
                     {"stream", true},          {"stream_options", {{"include_usage", true}}}};
        return post_chat(body);
    }
    turn_timing send_chat(const json & messages, const std::vector<token_id> &, int max_tokens) override {
        json body = {{"model", "warmctx"}, {"messages", messages}, {"max_tokens", max_tokens},
                     {"temperature", 0},   {"stream", true},       {"stream_options", {{"include_usage", true}}}};
        return post_chat(body);
    }

  private:
    turn_timing post_chat(const json & body) {
        return stream_post(
            http_->port(), "/v1/chat/completions", body.dump(),
            [](const json & j) {
                // The first chunk only announces the assistant role; it is sent before
                // the prefill. Any later chunk follows the first generated token.
                auto ch = j.find("choices");
                if (ch == j.end() || !ch->is_array() || ch->empty()) return j.contains("usage");
                const json & c0 = (*ch)[0];
                const json delta = c0.value("delta", json::object());
                if (delta.contains("role") && delta.value("content", "").empty() &&
                    c0.value("finish_reason", json()).is_null())
                    return false;
                return true;
            },
            [](const json & j, turn_timing & t) {
                if (auto w = j.find("warmctx"); w != j.end() && w->is_object()) {
                    t.server_ms = w->value("first_token_ms", 0.0);
                    if (auto why = w->find("reason"); why != w->end() && why->is_string()) t.reason = *why;
                    t.common_tokens = w->value("tokens_common_with_previous_turn", -1);
                    if (auto d = w->find("drafts"); d != w->end()) t.drafts = *d;
                    if (auto ph = w->find("timings"); ph != w->end() && ph->is_object()) t.phases = t.timings = *ph;
                    if (auto rq = w->find("request_ms"); rq != w->end() && rq->is_number())
                        t.phases["request_ms"] = *rq;
                }
                auto u = j.find("usage");
                if (u == j.end() || !u->is_object()) return;
                t.prompt_tokens = u->value("prompt_tokens", 0);
                t.completion_tokens = u->value("completion_tokens", 0);
                if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object())
                    t.cached_tokens = d->value("cached_tokens", 0);
            });
    }

    std::string name_;
    std::unique_ptr<scheduler> sched_;
    std::unique_ptr<http_server> http_;
    json desc_;
    owned_dir dir_;  // its disk tier's, when the bench made one
};

class llama_server_system final : public bench_system {
  public:
    llama_server_system(std::string name, pid_t pid, int port, json desc)
        : name_(std::move(name)), pid_(pid), port_(port), desc_(std::move(desc)) {}
    ~llama_server_system() override { stop(); }
    int port() const override { return port_; }
    std::string name() const override { return name_; }
    json describe() const override { return desc_; }
    json & description() { return desc_; }
    turn_timing send(const std::string &, const std::vector<segment> &, const std::vector<token_id> & tokens,
                     int max_tokens) override {
        json body = {{"prompt", tokens},   {"n_predict", max_tokens}, {"temperature", 0},
                     {"stream", true},     {"cache_prompt", true}};
        return stream_post(
            port_, "/completion", body.dump(), [](const json &) { return true; },
            [](const json & j, turn_timing & t) {
                auto tm = j.find("timings");
                if (tm == j.end() || !tm->is_object()) return;
                const int cached = tm->value("cache_n", 0), processed = tm->value("prompt_n", 0);
                t.cached_tokens = cached;
                t.prompt_tokens = cached + processed;
                t.completion_tokens = tm->value("predicted_n", 0);
                t.server_ms = tm->value("prompt_ms", 0.0);
            });
    }
    void forget() { pid_ = -1; }
    void stop() {
        if (pid_ <= 0) return;
        kill(pid_, SIGTERM);
        for (int i = 0; i < 200; ++i) {
            int st;
            if (waitpid(pid_, &st, WNOHANG) == pid_) { pid_ = -1; return; }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }

  private:
    std::string name_;
    pid_t pid_;
    int port_;
    json desc_;
};

int free_port() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (sockaddr *)&a, &len) == 0) port = ntohs(a.sin_port);
    close(fd);
    return port;
}

std::string tail_of_file(const std::string & path, size_t n) {
    FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) return "";
    std::fseek(f, 0, SEEK_END);
    long size = std::ftell(f);
    long from = std::max<long>(0, size - (long)n);
    std::fseek(f, from, SEEK_SET);
    std::string s((size_t)(size - from), '\0');
    size_t got = std::fread(s.data(), 1, s.size(), f);
    s.resize(got);
    std::fclose(f);
    return s;
}

}  // namespace

result<std::unique_ptr<bench_system>> start_warmctx_system(const warmctx_system_options & o) {
    auto eo = o.mf.to_options(o.parallel);
    if (!eo) return eo.error();
    cache_flags cf = o.cf;
    owned_dir dir;
    if (o.default_disk && cf.cache_dir.empty()) {
        const char * tmp = std::getenv("TMPDIR");
        auto made = make_owned_dir(tmp && *tmp ? tmp : "/tmp", "warmctx-bench-disk");
        if (!made) return made.error();
        dir = std::move(*made);
        cf.cache_dir = dir.path();
        if (cf.disk_budget_bytes == 0) cf.disk_budget_bytes = k_default_disk_budget;
    }
    scheduler_options so;
    so.engine.engine = *eo;
    so.engine.engine.n_seq_resident = o.resident_streams;
    so.engine.engine.padding_within_n_ctx = o.padding_within_n_ctx;
    so.engine.cold_stream = false;  // as serve: every stream runs turns
    so.engine.n_holders = o.holders;
    if (status st = cf.apply(so.engine); !st.ok()) return st;
    so.n_parallel = o.parallel;
    so.max_queue = 16;
    auto s = scheduler::start(so);
    if (!s) return s.error();
    server_options sv;
    sv.port = 0;
    sv.log_requests = false;
    sv.max_queue = so.max_queue;  // n_http_threads 0: parallel + queue + headroom
    sv.kinds = so.engine.kinds;
    sv.max_body_bytes = 64u << 20;
    sv.max_segment_bytes = 16u << 20;
    sv.workspace_dir = o.workspace_dir;
    sv.draft_max = o.draft_max;
    auto h = http_server::start(**s, sv);
    if (!h) return h.error();
    const uint64_t ckpt_bound = (*s)->context().memory.checkpoints ? so.engine.stream_checkpoint_max_bytes : 0;
    json desc = {{"n_ctx_per_seq", (*s)->context().n_ctx_seq},
                 {"n_streams", (*s)->context().n_seq_max},
                 {"n_resident_streams", (*s)->context().n_seq_resident},
                 {"streams_allocated_bytes", (*s)->context().kv_streams_bytes},
                 {"gpu_layers", (*s)->context().n_gpu_layers},
                 {"flash_attn", (*s)->context().flash_attn},
                 {"holders", o.holders},
                 {"draft_max", o.draft_max},
                 {"policy", o.cf.policy},
                 {"budget_tokens", o.cf.budget_tokens},
                 {"budget_bytes", o.cf.budget_bytes},
                 {"kv_bytes_per_token", (*s)->context().kv_bytes_per_token},
                 // streams, allocated whole; the pool grows up to budget_bytes, and the streams'
                 // checkpoints (hybrid, recurrent and sliding-window models) up to theirs (0: none)
                 {"kv_streams_bytes", (*s)->context().kv_streams_bytes},
                 {"checkpoint_budget_bytes", ckpt_bound},
                 {"kv_allocated_bytes_bound", (*s)->context().kv_streams_bytes + o.cf.budget_bytes + ckpt_bound},
                 {"flash_attn", eo->flash_attn},
                 {"backend", (*s)->context().backend},
                 {"disk_tier", !cf.cache_dir.empty()},
                 {"disk_budget_bytes", cf.cache_dir.empty() ? 0 : cf.disk_budget_bytes}};
    return std::unique_ptr<bench_system>(
        new warmctx_system(o.name, std::move(*s), std::move(*h), std::move(desc), std::move(dir)));
}


// What llama-server at its defaults chose: its slots and context per slot (GET /props),
// and the KV cells it allocated, from its log's "n_slots = S, n_ctx_slot = C, kv_unified =
// 'true'" line (unified: C cells shared by the slots; else S x C); its RAM prompt cache
// may add up to 8 GiB (--cache-ram's default).
static void describe_defaults(httplib::Client & c, const std::string & log_path, uint64_t kv_bytes_per_token,
                              json & desc) {
    if (auto r = c.Get("/props"); r && r->status == 200) {
        auto p = parse_json(r->body);
        if (p && p->is_object()) {
            desc["slots"] = p->value("total_slots", json());
            if (auto g = p->find("default_generation_settings"); g != p->end() && g->is_object())
                desc["n_ctx_per_slot"] = g->value("n_ctx", json());
        }
    }
    std::ifstream log(log_path);
    for (std::string line; std::getline(log, line);) {
        const size_t k = line.find("n_slots = ");
        const size_t n = line.find("n_ctx_slot = ");
        if (k == std::string::npos || n == std::string::npos) continue;
        const uint64_t slots = std::strtoull(line.c_str() + k + 10, nullptr, 10);
        const uint64_t per_slot = std::strtoull(line.c_str() + n + 13, nullptr, 10);
        const bool unified = line.find("kv_unified = 'true'") != std::string::npos;
        const uint64_t cells = unified ? per_slot : slots * per_slot;
        desc["kv_unified"] = unified;
        desc["kv_cells"] = cells;
        if (kv_bytes_per_token > 0) {
            desc["kv_slots_bytes"] = cells * kv_bytes_per_token;
            desc["kv_allocated_bytes_bound"] = cells * kv_bytes_per_token + (uint64_t{8192} << 20);
        }
        break;
    }
    desc["cache_ram_mib"] = 8192;  // its default
    desc["flash_attn"] = "auto";   // its default: on where the backend has it
}
result<std::unique_ptr<bench_system>> start_llama_server(const llama_server_options & o) {
    auto eo = o.mf.to_options(1);
    if (!eo) return eo.error();
    if (access(o.binary.c_str(), X_OK) != 0)
        return not_found("llama-server not found at '" + o.binary +
                         "' (build it: cmake --build build --target llama-server)");
    const int port = free_port();
    if (port <= 0) return io_error("no free loopback port");
    std::string log_path = o.log_path;
    if (log_path.empty()) {
        char tmpl[] = "/tmp/warmctx-llama-server-XXXXXX";
        int fd = mkstemp(tmpl);
        if (fd < 0) return io_error("cannot create a log file for llama-server");
        close(fd);
        log_path = tmpl;
    }
    const int threads = o.mf.threads > 0 ? o.mf.threads : (int)std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::string> args = {o.binary,
                                     "-m", eo->model_path,
                                     "--host", "127.0.0.1",
                                     "--port", std::to_string(port),
                                     "-t", std::to_string(threads),
                                     "-tb", std::to_string(threads),
                                     "--no-webui"};
    // At its defaults llama-server chooses its layers and flash attention itself (-ngl and
    // -fa auto: every layer that fits, flash attention where the backend has it); the
    // threads stay equal.
    if (!o.defaults) {
        for (const std::string & a :
             std::vector<std::string>{"-ngl", std::to_string(o.mf.gpu_layers < 0 ? 999 : o.mf.gpu_layers),
                                      "-fa", eo->flash_attn ? "on" : "off",
                                      "-c", std::to_string((uint64_t)o.mf.n_ctx * (uint64_t)o.slots),
                                      "-np", std::to_string(o.slots),
                                      "-b", std::to_string(eo->chunk_tokens), "-ub", std::to_string(eo->chunk_tokens),
                                      "-ctk", eo->kv_type, "-ctv", eo->kv_type})
            args.push_back(a);
    }
    if (o.cache_ram_mib >= 0 && !o.defaults) {
        args.push_back("--cache-ram");
        args.push_back(std::to_string(o.cache_ram_mib));
    }
    args.insert(args.end(), o.extra_args.begin(), o.extra_args.end());
    std::string cmdline;
    for (const auto & a : args) cmdline += (cmdline.empty() ? "" : " ") + a;
    progress("starting: " + cmdline + "  (log: " + log_path + ")");

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    std::vector<char *> argv;
    for (auto & a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, o.binary.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return io_error("cannot start llama-server: " + std::string(strerror(rc)));
    // At its defaults these are what llama-server chose, read back once it is up.
    json desc = {{"command", cmdline}, {"log", log_path}, {"defaults", o.defaults}};
    if (!o.defaults) {
        desc["slots"] = o.slots;
        desc["n_ctx_per_slot"] = o.mf.n_ctx;
        desc["cache_ram_mib"] = o.cache_ram_mib;
        desc["flash_attn"] = eo->flash_attn;
    }
    if (o.kv_bytes_per_token > 0 && !o.defaults) {
        // What it may allocate: its slots whole (llama.cpp pads a context to 256 cells)
        // and its prompt cache up to --cache-ram (8 GiB when not given).
        const uint64_t slots = (uint64_t)o.slots * ((o.mf.n_ctx + 255) / 256 * 256) * o.kv_bytes_per_token;
        const uint64_t cache = (uint64_t)(o.cache_ram_mib < 0 ? 8192 : o.cache_ram_mib) << 20;
        desc["kv_slots_bytes"] = slots;
        desc["kv_allocated_bytes_bound"] = slots + cache;
    }
    auto sys = std::make_unique<llama_server_system>(o.name, pid, port, desc);

    // Wait for /health to answer 200 (503 while the model loads).
    const auto t0 = clock_type::now();
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(1, 0);
    c.set_read_timeout(5, 0);
    while (true) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            sys->forget();  // already reaped
            return engine_error("llama-server exited during start-up; the end of its log (" + log_path + "):\n" +
                                tail_of_file(log_path, 1500));
        }
        if (auto r = c.Get("/health"); r && r->status == 200) break;
        if (ms_between(t0, clock_type::now()) > o.start_timeout_s * 1000)
            return engine_error("llama-server did not become healthy in " + std::to_string((int)o.start_timeout_s) +
                                " s; see " + log_path);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (o.defaults) describe_defaults(c, log_path, o.kv_bytes_per_token, sys->description());
    return std::unique_ptr<bench_system>(std::move(sys));
}

struct prompt_builder::impl {
    std::unique_ptr<context_engine> ce;
    std::string path;
};

prompt_builder::prompt_builder(std::unique_ptr<impl> p) : p_(std::move(p)) {}
prompt_builder::~prompt_builder() = default;

result<std::unique_ptr<prompt_builder>> prompt_builder::open(const model_flags & mf) {
    model_flags m = mf;
    m.n_ctx = 64;
    m.gpu_layers = 0;
    m.kv_type = "f16";
    m.flash_attn = false;
    auto eo = m.to_options(3);
    if (!eo) return eo.error();
    context_engine_options co;
    co.engine = *eo;
    co.n_holders = 1;
    // Opened on a thread of its own that ends here: opening decodes (the engine's probes),
    // and in a build with OpenMP the thread that decodes keeps a team of CPU threads. A
    // team left on the caller's thread beside the one of the system under test (served
    // in this process) makes libgomp count more threads than cores and sleep at every
    // barrier of every decode: each call of the in-process warmctx took 15-25 % longer.
    result<std::unique_ptr<context_engine>> ce = internal_error("not opened");
    std::thread([&] { ce = context_engine::open(co); }).join();
    if (!ce) return ce.error();
    auto p = std::make_unique<impl>();
    p->ce = std::move(*ce);
    p->path = eo->model_path;
    return std::unique_ptr<prompt_builder>(new prompt_builder(std::move(p)));
}

token_counter prompt_builder::counter() {
    const context_engine * ce = p_->ce.get();
    return [ce](const std::string & s) -> size_t {
        auto t = ce->tokenize(s);
        return t.ok() ? t->size() : s.size() / 4;
    };
}

result<std::vector<token_id>> prompt_builder::tokens(const std::vector<segment> & segs) {
    turn_request r;
    r.segments = segs;
    auto prompt = p_->ce->assemble_request(r);
    if (!prompt) return prompt.error();
    return std::move(prompt->tokens);
}

uint64_t prompt_builder::kv_bytes_per_token() const { return p_->ce->context().kv_bytes_per_token; }
const std::string & prompt_builder::model_path() const { return p_->path; }
std::string prompt_builder::model_description() const { return p_->ce->model().description; }

result<std::vector<segment>> chat_segments(const json & messages) {
    std::vector<segment> out;
    if (auto e = server_detail::map_messages(messages, nullptr, out)) return invalid_argument(e->message);
    return out;
}

result<std::unique_ptr<bench_system>> start_llama_server_at_defaults(const std::string & name,
                                                                     const std::string & binary,
                                                                     const model_flags & mf,
                                                                     std::vector<std::string> extra_args) {
    llama_server_options lo;
    lo.name = name;
    lo.binary = binary;
    lo.mf = mf;
    lo.defaults = true;
    lo.extra_args = std::move(extra_args);
    return start_llama_server(lo);
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    // linear interpolation between closest ranks
    const double x = p * (double)(v.size() - 1);
    const size_t lo = (size_t)std::floor(x), hi = std::min(v.size() - 1, lo + 1);
    return v[lo] + (v[hi] - v[lo]) * (x - (double)lo);
}
double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

sample_stats summarize(const std::vector<double> & v) {
    sample_stats r;
    if (v.empty()) return r;
    for (double x : v) r.mean += x;
    r.mean /= (double)v.size();
    for (double x : v) r.stddev += (x - r.mean) * (x - r.mean);
    r.stddev = v.size() > 1 ? std::sqrt(r.stddev / (double)(v.size() - 1)) : 0;
    return r;
}

result<std::string> run_capture(const std::string & cmd) {
    FILE * f = popen(cmd.c_str(), "r");
    if (!f) return io_error("cannot run: " + cmd);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    int rc = pclose(f);
    if (rc != 0) return engine_error("command failed (status " + std::to_string(rc) + "): " + cmd);
    return out;
}

result<llama_bench_rate> llama_bench_run(const std::string & binary, const engine_options & o, int32_t threads,
                                         int n_prompt, int n_gen, int depth, int reps, bool warmup) {
    std::string cmd = "'" + binary + "' -m '" + o.model_path + "' -p " + std::to_string(n_prompt) + " -n " +
                      std::to_string(n_gen) + " -d " + std::to_string(depth) + " -t " + std::to_string(threads) +
                      " -b " + std::to_string(o.chunk_tokens) + " -ub " + std::to_string(o.chunk_tokens) +
                      " -fa " + (o.flash_attn ? "1" : "0") + " -ctk " + o.kv_type + " -ctv " + o.kv_type +
                      " -ngl " + std::to_string(o.n_gpu_layers < 0 ? 999 : o.n_gpu_layers) + " -r " +
                      std::to_string(reps) + (warmup ? "" : " --no-warmup") + " -o json 2>/dev/null";
    progress("running: " + cmd);
    auto out = run_capture(cmd);
    if (!out) return out.error();
    auto j = parse_json(*out);
    if (!j || !j->is_array() || j->empty()) return engine_error("cannot parse llama-bench's JSON output");
    llama_bench_rate r;
    r.tps = (*j)[0].value("avg_ts", 0.0);
    r.stddev = (*j)[0].value("stddev_ts", 0.0);
    return r;
}

}  // namespace warmctx::cli
