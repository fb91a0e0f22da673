// The engine adapter. The only translation unit family that includes llama.h.
#include "warmctx/engine.h"

#include "seq_state.h"
#include "warmctx/text_stream.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "ggml.h"
#include "ggml-backend.h"
#include "gguf.h"
#include "llama.h"

#ifndef WARMCTX_LLAMA_COMMIT
#define WARMCTX_LLAMA_COMMIT "unknown"
#endif
#ifndef WARMCTX_BACKEND
#define WARMCTX_BACKEND "CPU"
#endif

namespace warmctx {

using namespace seq_state;  // llama.cpp's sequence state layout (seq_state.h)

std::string_view llama_commit() { return WARMCTX_LLAMA_COMMIT; }
std::string_view backend_name() { return WARMCTX_BACKEND; }

std::string_view kv_mode_name(kv_mode m) { return m == kv_mode::exact ? "exact" : "shared"; }

result<kv_mode> parse_kv_mode(std::string_view s) {
    if (s == "exact") return kv_mode::exact;
    if (s == "shared") return kv_mode::shared;
    return invalid_argument("unknown KV mode '" + std::string(s) + "' (expected exact or shared)");
}

std::string_view finish_reason_name(finish_reason r) {
    switch (r) {
        case finish_reason::length: return "length";
        case finish_reason::stop: return "stop";
        case finish_reason::eos: return "eos";
        case finish_reason::context_full: return "context_full";
    }
    return "length";
}

namespace {

// The one mapping of llama_decode's return codes (llama.h: 0 ok, 1 no KV slot for the
// batch, 2 aborted, -1 invalid batch, < -1 error).
status decode_status(int32_t rc) {
    if (rc == 0) return {};
    if (rc == 1) return resource_exhausted("llama_decode: no free KV slot for the batch (context full)");
    if (rc == 2) return {status_code::cancelled, "llama_decode: aborted"};
    if (rc == -1) return invalid_argument("llama_decode: invalid batch");
    return engine_error("llama_decode failed with code " + std::to_string(rc));
}

}  // namespace

namespace {

std::once_flag g_backend_once;
bool g_verbose = false;

void log_callback(ggml_log_level level, const char * text, void *) {
    // errors always reach the user: they explain a failed load
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

void init_backend(bool verbose) {
    g_verbose = verbose || g_verbose;
    std::call_once(g_backend_once, [] {
        llama_log_set(log_callback, nullptr);
        ggml_log_set(log_callback, nullptr);
        llama_backend_init();
    });
}

struct model_deleter { void operator()(llama_model * m) const { llama_model_free(m); } };
struct context_deleter { void operator()(llama_context * c) const { llama_free(c); } };
struct sampler_deleter { void operator()(llama_sampler * s) const { llama_sampler_free(s); } };
struct gguf_deleter { void operator()(gguf_context * g) const { gguf_free(g); } };
using model_ptr = std::unique_ptr<llama_model, model_deleter>;
using context_ptr = std::unique_ptr<llama_context, context_deleter>;
using sampler_ptr = std::unique_ptr<llama_sampler, sampler_deleter>;
using gguf_ptr = std::unique_ptr<gguf_context, gguf_deleter>;

result<ggml_type> parse_kv_type(std::string_view s) {
    static const std::pair<const char *, ggml_type> k_types[] = {
        {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
        {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1},
        {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1}, {"iq4_nl", GGML_TYPE_IQ4_NL},
    };
    for (auto & [name, t] : k_types)
        if (s == name) return t;
    return invalid_argument("unknown KV type '" + std::string(s) +
                            "' (expected one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)");
}

// Checks that `path` names a readable GGUF file, with a message a user can act on.
status check_gguf_file(const std::string & path) {
    std::error_code ec;
    if (path.empty()) return invalid_argument("no model path given");
    if (!std::filesystem::exists(path, ec)) return not_found("model file '" + path + "' does not exist");
    if (std::filesystem::is_directory(path, ec)) return invalid_argument("model path '" + path + "' is a directory");
    std::ifstream f(path, std::ios::binary);
    if (!f) return io_error("cannot open model file '" + path + "'");
    char magic[4] = {};
    f.read(magic, 4);
    if (f.gcount() != 4 || std::memcmp(magic, "GGUF", 4) != 0)
        return invalid_argument("'" + path + "' is not a GGUF model file (bad magic)");
    return {};
}

std::string gguf_str(const gguf_context * g, const char * key) {
    int64_t id = gguf_find_key(g, key);
    if (id < 0 || gguf_get_kv_type(g, id) != GGUF_TYPE_STRING) return {};
    return gguf_get_val_str(g, id);
}

}  // namespace

result<model_info> read_model_info(const std::string & path) {
    WARMCTX_RETURN_IF_ERROR(check_gguf_file(path));
    init_backend(false);
    gguf_init_params gp{/*no_alloc=*/true, /*ctx=*/nullptr};
    gguf_ptr g(gguf_init_from_file(path.c_str(), gp));
    if (!g) return invalid_argument("'" + path + "' is not a valid GGUF file (header unreadable or truncated)");
    model_info mi;
    mi.path = path;
    mi.architecture = gguf_str(g.get(), "general.architecture");
    mi.chat_template = gguf_str(g.get(), "tokenizer.chat_template");
    auto u32 = [&](const std::string & key) -> int64_t {
        int64_t id = gguf_find_key(g.get(), key.c_str());
        if (id < 0) return 0;
        switch (gguf_get_kv_type(g.get(), id)) {
            case GGUF_TYPE_UINT32: return gguf_get_val_u32(g.get(), id);
            case GGUF_TYPE_INT32: return gguf_get_val_i32(g.get(), id);
            case GGUF_TYPE_UINT64: return (int64_t)gguf_get_val_u64(g.get(), id);
            default: return 0;
        }
    };
    const std::string & a = mi.architecture;
    mi.n_ctx_train = (int32_t)u32(a + ".context_length");
    mi.n_layer = (int32_t)u32(a + ".block_count");
    mi.n_embd = (int32_t)u32(a + ".embedding_length");
    int64_t fb = gguf_find_key(g.get(), (a + ".rope.freq_base").c_str());
    if (fb >= 0 && gguf_get_kv_type(g.get(), fb) == GGUF_TYPE_FLOAT32) mi.rope_freq_base = gguf_get_val_f32(g.get(), fb);
    int64_t tok = gguf_find_key(g.get(), "tokenizer.ggml.tokens");
    if (tok >= 0) mi.n_vocab = (int32_t)gguf_get_arr_n(g.get(), tok);
    for (int64_t i = 0; i < gguf_get_n_tensors(g.get()); ++i) {
        mi.size_bytes += gguf_get_tensor_size(g.get(), i);
        const int64_t * ne = gguf_get_tensor_ne(g.get(), i);
        uint64_t n = 1;
        for (int d = 0; d < GGML_MAX_DIMS; ++d) n *= (uint64_t)ne[d];
        mi.n_params += n;
    }
    return mi;
}

struct engine::impl {
    engine_options opts;
    model_ptr model;
    context_ptr ctx;
    const llama_vocab * vocab = nullptr;
    model_info minfo;
    context_info cinfo;
    uint32_t n_stream = 1;  // llama.cpp's KV streams: n_seq_max in exact mode, 1 in shared
    llama_batch batch{};

    ~impl() {
        if (batch.token) llama_batch_free(batch);
    }

    llama_memory_t mem() const { return llama_get_memory(ctx.get()); }

    status check_seq(seq_id s) const {
        if (s < 0 || (uint32_t)s >= cinfo.n_seq_max)
            return invalid_argument("sequence id " + std::to_string(s) + " out of range [0, " +
                                    std::to_string(cinfo.n_seq_max) + ")");
        return {};
    }

    // Decodes `n` tokens at positions [pos, pos+n) of seq, logits for the last if asked.
    status decode(seq_id seq, const token_id * toks, int32_t n, pos_t pos, bool want_last_logits) {
        batch.n_tokens = n;
        for (int32_t i = 0; i < n; ++i) {
            batch.token[i] = toks[i];
            batch.pos[i] = pos + i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = seq;
            batch.logits[i] = (want_last_logits && i == n - 1) ? 1 : 0;
        }
        return decode_status(llama_decode(ctx.get(), batch));
    }

    void copy_logits(std::vector<float> * out) const {
        const float * l = llama_get_logits_ith(ctx.get(), -1);
        out->assign(l, l + minfo.n_vocab);
    }
};

engine::engine(std::unique_ptr<impl> p) : p_(std::move(p)) {}
engine::~engine() = default;

result<std::unique_ptr<engine>> engine::open(const engine_options & opts) {
    WARMCTX_RETURN_IF_ERROR(check_gguf_file(opts.model_path));
    auto kvt = parse_kv_type(opts.kv_type);
    if (!kvt) return kvt.error();
    if (opts.n_ctx != 0 && opts.n_ctx < 16) return invalid_argument("n_ctx must be at least 16 tokens");
    if (opts.n_seq_max < 1 || opts.n_seq_max > 256) return invalid_argument("n_seq_max must be in [1, 256]");
    if (opts.chunk_tokens < 1 || opts.chunk_tokens > 8192) return invalid_argument("chunk_tokens must be in [1, 8192]");
    if (ggml_is_quantized(*kvt) && !opts.flash_attn)
        return invalid_argument("a quantized KV type (" + opts.kv_type + ") needs flash attention (--flash-attn)");
    init_backend(opts.verbose);

    auto p = std::make_unique<impl>();
    p->opts = opts;
    auto mi = read_model_info(opts.model_path);
    if (!mi) return mi.error();
    p->minfo = std::move(mi.value());

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = opts.n_gpu_layers < 0 ? 999 : opts.n_gpu_layers;
    p->model.reset(llama_model_load_from_file(opts.model_path.c_str(), mp));
    if (!p->model) return engine_error("llama.cpp could not load model '" + opts.model_path + "' (see the error above)");
    p->vocab = llama_model_get_vocab(p->model.get());

    char buf[256];
    if (llama_model_desc(p->model.get(), buf, sizeof buf) > 0) p->minfo.description = buf;
    if (!opts.chat_template.empty()) {
        p->minfo.chat_template = opts.chat_template;
        p->minfo.chat_template_overridden = true;
    } else if (const char * t = llama_model_chat_template(p->model.get(), nullptr)) {
        p->minfo.chat_template = t;
    }
    for (auto [tok, out] : {std::pair{llama_vocab_bos(p->vocab), &p->minfo.bos_text},
                            std::pair{llama_vocab_eos(p->vocab), &p->minfo.eos_text}}) {
        if (tok < 0) continue;
        char tb[256];
        const int32_t n = llama_token_to_piece(p->vocab, tok, tb, sizeof tb, 0, true);
        if (n > 0) out->assign(tb, (size_t)n);
    }
    p->minfo.n_vocab = llama_vocab_n_tokens(p->vocab);
    p->minfo.n_ctx_train = llama_model_n_ctx_train(p->model.get());
    p->minfo.n_layer = llama_model_n_layer(p->model.get());
    p->minfo.n_embd = llama_model_n_embd(p->model.get());
    p->minfo.size_bytes = llama_model_size(p->model.get());
    p->minfo.n_params = llama_model_n_params(p->model.get());

    const int32_t n_threads = opts.n_threads > 0 ? opts.n_threads : (int32_t)std::max(1u, std::thread::hardware_concurrency());
    const int32_t n_head = llama_model_n_head(p->model.get());
    const int32_t n_head_kv = llama_model_n_head_kv(p->model.get());
    const uint64_t head_dim = n_head > 0 ? (uint64_t)p->minfo.n_embd / (uint64_t)n_head : 0;
    const double bytes_per_elem = ggml_type_sizef(*kvt);
    const uint64_t kv_bytes_per_token =
        (uint64_t)((double)p->minfo.n_layer * 2.0 * (double)n_head_kv * (double)head_dim * bytes_per_elem);

    uint32_t n_ctx = opts.n_ctx;
    if (n_ctx == 0) {
        const uint32_t train = p->minfo.n_ctx_train > 0 ? (uint32_t)p->minfo.n_ctx_train : 4096;
        n_ctx = train;
        p->cinfo.n_ctx_reason = "the model's training context";
        if (opts.auto_ctx_max_bytes > 0 && kv_bytes_per_token > 0) {
            const uint64_t fit = opts.auto_ctx_max_bytes / ((uint64_t)opts.n_seq_max * kv_bytes_per_token) / 256 * 256;
            if (fit < n_ctx) {
                n_ctx = (uint32_t)std::max<uint64_t>(fit, 256);
                p->cinfo.n_ctx_reason = "the largest whose " + std::to_string(opts.n_seq_max) + " KV streams fit " +
                                        std::to_string(opts.auto_ctx_max_bytes >> 20) + " MiB (training context " +
                                        std::to_string(train) + ")";
            }
        }
    } else {
        p->cinfo.n_ctx_reason = "as asked";
    }
    // The GPU's memory once the model is in it, and the resident streams it has room for.
    uint64_t dev_free = 0, dev_total = 0;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_GPU) continue;
        size_t f = 0, t = 0;
        ggml_backend_dev_memory(dev, &f, &t);
        dev_free = f;
        dev_total = t;
        break;
    }
    const bool on_gpu = dev_total > 0 && opts.n_gpu_layers != 0;
    p->cinfo.device_free_bytes = dev_free;
    p->cinfo.device_total_bytes = dev_total;
    p->cinfo.n_gpu_layers = on_gpu ? (opts.n_gpu_layers < 0 ? p->minfo.n_layer
                                                            : std::min(opts.n_gpu_layers, p->minfo.n_layer))
                                   : 0;
    uint32_t n_resident = 0;
    const uint64_t stream_bytes = (uint64_t)n_ctx * kv_bytes_per_token;
    if (opts.n_seq_resident >= 0) {
        n_resident = (uint32_t)opts.n_seq_resident;
        p->cinfo.resident_reason = n_resident > 0 ? "as asked" : "none asked";
    } else if (opts.mode != kv_mode::exact) {
        p->cinfo.resident_reason = "none: shared KV mode";
    } else if (!on_gpu) {
        p->cinfo.resident_reason = "none: the model runs on the CPU, where the RAM pool holds prefixes compactly";
    } else if (stream_bytes > 0) {
        // A reserve for llama.cpp's compute buffers, then the share of what is left.
        const uint64_t reserve = std::max<uint64_t>(uint64_t{1} << 30, dev_total / 20);
        const uint64_t base = (uint64_t)opts.n_seq_max * stream_bytes + reserve;
        const double share = std::clamp(opts.resident_vram_share, 0.0, 0.95);
        const uint64_t room = dev_free > base ? (uint64_t)((double)(dev_free - base) * share) : 0;
        n_resident = (uint32_t)std::min<uint64_t>(room / stream_bytes, 256 - std::min<uint32_t>(opts.n_seq_max, 256));
        p->cinfo.resident_reason = std::to_string(n_resident) + " streams of " + std::to_string(stream_bytes >> 20) +
                                   " MiB fit " + std::to_string((int)(share * 100 + 0.5)) + "% of the " +
                                   std::to_string((dev_free > base ? dev_free - base : 0) >> 20) +
                                   " MiB of device memory free after the model, the work streams and a " +
                                   std::to_string(reserve >> 20) + " MiB reserve";
    }
    const uint32_t n_seq_total = opts.n_seq_max + n_resident;
    if (n_seq_total > 256) return invalid_argument("n_seq_max + resident streams must be at most 256");

    llama_context_params cp = llama_context_default_params();
    // Every sequence may hold n_ctx tokens. In exact mode each has its own stream of
    // n_ctx cells; in shared mode one stream holds n_ctx * n_seq_max cells.
    cp.n_ctx = n_ctx * n_seq_total;
    cp.n_seq_max = n_seq_total;
    cp.n_batch = opts.chunk_tokens;
    cp.n_ubatch = opts.chunk_tokens;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.type_k = *kvt;
    cp.type_v = *kvt;
    cp.kv_unified = opts.mode == kv_mode::shared;
    cp.flash_attn_type = opts.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    p->ctx.reset(llama_init_from_model(p->model.get(), cp));
    if (!p->ctx) return engine_error("llama.cpp could not create a context (n_ctx=" + std::to_string(cp.n_ctx) +
                                     ", KV type " + opts.kv_type + "); try a smaller --n-ctx");

    p->cinfo.n_ctx_seq = opts.mode == kv_mode::exact ? llama_n_ctx_seq(p->ctx.get()) : n_ctx;
    p->cinfo.n_ctx_seq = std::min(p->cinfo.n_ctx_seq, n_ctx);
    p->cinfo.n_seq_max = n_seq_total;
    p->cinfo.n_seq_resident = n_resident;
    p->cinfo.flash_attn = opts.flash_attn;
    p->n_stream = opts.mode == kv_mode::exact ? n_seq_total : 1;  // as kv_unified decides
    p->cinfo.chunk_tokens = opts.chunk_tokens;
    p->cinfo.kv_type = opts.kv_type;
    p->cinfo.mode = opts.mode;
    p->cinfo.backend = std::string(backend_name());
    p->cinfo.n_threads = n_threads;
    p->cinfo.kv_bytes_per_token = kv_bytes_per_token;
    p->cinfo.kv_streams_bytes = (uint64_t)p->cinfo.n_seq_max * p->cinfo.n_ctx_seq * kv_bytes_per_token;

    p->batch = llama_batch_init((int32_t)opts.chunk_tokens, 0, 1);
    return std::unique_ptr<engine>(new engine(std::move(p)));
}

const engine_options & engine::options() const { return p_->opts; }
const model_info & engine::model() const { return p_->minfo; }
const context_info & engine::context() const { return p_->cinfo; }

result<std::vector<token_id>> engine::tokenize(std::string_view text, bool parse_special) const {
    if (text.size() > (size_t)INT32_MAX / 2) return out_of_range("text too large to tokenize");
    std::vector<token_id> out(text.size() + 8);
    int32_t n = llama_tokenize(p_->vocab, text.data(), (int32_t)text.size(), out.data(), (int32_t)out.size(),
                               /*add_special=*/false, parse_special);
    if (n < 0) {
        out.resize((size_t)-n);
        n = llama_tokenize(p_->vocab, text.data(), (int32_t)text.size(), out.data(), (int32_t)out.size(), false,
                           parse_special);
        if (n < 0) return engine_error("llama_tokenize failed");
    }
    out.resize((size_t)n);
    return out;
}

result<std::string> engine::detokenize(std::span<const token_id> tokens) const {
    for (token_id t : tokens)
        if (t < 0 || t >= p_->minfo.n_vocab) return invalid_argument("token id " + std::to_string(t) + " out of vocabulary");
    std::string out(tokens.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(p_->vocab, tokens.data(), (int32_t)tokens.size(), out.data(), (int32_t)out.size(),
                                 false, false);
    if (n < 0) {
        out.resize((size_t)-n);
        n = llama_detokenize(p_->vocab, tokens.data(), (int32_t)tokens.size(), out.data(), (int32_t)out.size(), false,
                             false);
        if (n < 0) return engine_error("llama_detokenize failed");
    }
    out.resize((size_t)n);
    return out;
}

std::vector<std::string> engine::special_token_texts() const {
    std::vector<std::string> out;
    const int32_t n = llama_vocab_n_tokens(p_->vocab);
    for (token_id t = 0; t < n; ++t) {
        if (!(llama_vocab_get_attr(p_->vocab, t) &
              (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN)))
            continue;
        char buf[256];
        const int32_t k = llama_token_to_piece(p_->vocab, t, buf, sizeof buf, 0, true);
        if (k > 0) out.emplace_back(buf, (size_t)k);
    }
    std::sort(out.begin(), out.end(), [](const std::string & a, const std::string & b) {
        return a.size() != b.size() ? a.size() > b.size() : a < b;
    });
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

std::optional<std::array<token_id, 3>> engine::fim_tokens() const {
    const token_id pre = llama_vocab_fim_pre(p_->vocab), suf = llama_vocab_fim_suf(p_->vocab),
                   mid = llama_vocab_fim_mid(p_->vocab);
    if (pre < 0 || suf < 0 || mid < 0) return std::nullopt;
    return std::array<token_id, 3>{pre, suf, mid};
}

std::string engine::token_piece(token_id t) const {
    char buf[256];
    int32_t n = llama_token_to_piece(p_->vocab, t, buf, sizeof buf, 0, false);
    if (n < 0) {
        std::string s((size_t)-n, '\0');
        n = llama_token_to_piece(p_->vocab, t, s.data(), (int32_t)s.size(), 0, false);
        return n < 0 ? std::string() : s.substr(0, (size_t)n);
    }
    return std::string(buf, (size_t)n);
}

result<std::string> engine::apply_chat_template(std::span<const chat_message> messages,
                                                bool add_generation_prompt) const {
    if (p_->minfo.chat_template.empty()) return failed_precondition("the model has no chat template");
    std::vector<llama_chat_message> msgs;
    size_t total = 0;
    for (const auto & m : messages) {
        msgs.push_back({m.role.c_str(), m.content.c_str()});
        total += m.role.size() + m.content.size();
    }
    std::string buf(total * 2 + 256, '\0');
    const char * tmpl = p_->minfo.chat_template.c_str();
    int32_t n = llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), add_generation_prompt, buf.data(),
                                          (int32_t)buf.size());
    if (n < 0) return failed_precondition("the model's chat template is not supported by llama_chat_apply_template");
    if ((size_t)n > buf.size()) {
        buf.resize((size_t)n);
        n = llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), add_generation_prompt, buf.data(),
                                      (int32_t)buf.size());
    }
    buf.resize((size_t)n);
    return buf;
}

bool engine::is_end_of_generation(token_id t) const { return llama_vocab_is_eog(p_->vocab, t); }

status engine::prefill(seq_id seq, std::span<const token_id> tokens, pos_t pos0,
                       std::span<const pos_t> boundaries, std::vector<float> * last_logits,
                       int32_t chunk_tokens) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if (chunk_tokens == 0) chunk_tokens = (int32_t)p_->cinfo.chunk_tokens;
    if (chunk_tokens < 1 || chunk_tokens > (int32_t)p_->cinfo.chunk_tokens)
        return invalid_argument("prefill: chunk_tokens must be in [1, " + std::to_string(p_->cinfo.chunk_tokens) + "]");
    if (tokens.empty()) return invalid_argument("prefill: no tokens (empty prompt)");
    if (pos0 < 0) return invalid_argument("prefill: negative start position");
    if ((uint64_t)pos0 + tokens.size() > p_->cinfo.n_ctx_seq)
        return out_of_range("prompt needs " + std::to_string((uint64_t)pos0 + tokens.size()) +
                            " tokens but the context holds " + std::to_string(p_->cinfo.n_ctx_seq) + " per sequence");
    if (!is_chunk_start(pos0, boundaries, chunk_tokens))
        return failed_precondition("prefill: start position " + std::to_string(pos0) +
                                   " is not a canonical chunk start (warm KV would differ from cold)");
    if (seq_n_tokens(seq) != pos0)
        return failed_precondition("prefill: sequence " + std::to_string(seq) + " holds " +
                                   std::to_string(seq_n_tokens(seq)) + " tokens, expected " + std::to_string(pos0));
    for (token_id t : tokens)
        if (t < 0 || t >= p_->minfo.n_vocab) return invalid_argument("prefill: token id " + std::to_string(t) + " out of vocabulary");
    auto chunks = plan_chunks(pos0, (int32_t)tokens.size(), boundaries, chunk_tokens);
    for (size_t i = 0; i < chunks.size(); ++i) {
        auto [b, e] = chunks[i];
        const bool last = i + 1 == chunks.size();
        status st = p_->decode(seq, tokens.data() + (b - pos0), e - b, b, last && last_logits != nullptr);
        if (!st.ok()) {
            llama_memory_seq_rm(p_->mem(), seq, pos0, -1);  // leave the sequence as it was
            return st.with_context("prefill");
        }
    }
    if (last_logits) p_->copy_logits(last_logits);
    return {};
}

struct token_sampler::impl {
    sampler_ptr chain;  // null: greedy
};

token_sampler::token_sampler(std::unique_ptr<impl> p) : p_(std::move(p)) {}
token_sampler::~token_sampler() = default;

namespace {
// A literal as a regex (std::regex ECMAScript syntax): every metacharacter escaped.
std::string regex_escape(const std::string & s) {
    std::string out;
    for (char c : s) {
        if (std::string_view(".^$|()[]{}*+?\\/-").find(c) != std::string_view::npos) out += '\\';
        out += c;
    }
    return out;
}
}  // namespace

result<std::unique_ptr<token_sampler>> token_sampler::make(const sampling_params & sp, const engine & e) {
    const int32_t n_vocab = e.model().n_vocab;
    if (sp.max_tokens < 0) return invalid_argument("max_tokens must not be negative");
    if (sp.temperature > 0 && (sp.top_p <= 0 || sp.top_p > 1)) return invalid_argument("top_p must be in (0, 1]");
    if (sp.top_k < 0) return invalid_argument("top_k must not be negative");
    if (!std::isfinite(sp.presence_penalty) || !std::isfinite(sp.frequency_penalty))
        return invalid_argument("penalties must be finite");
    std::vector<llama_logit_bias> bias;
    for (const auto & [tok, b] : sp.logit_bias) {
        if (tok < 0 || tok >= n_vocab)
            return invalid_argument("logit_bias: token " + std::to_string(tok) + " is outside the vocabulary (0.." +
                                    std::to_string(n_vocab - 1) + ")");
        if (!std::isfinite(b)) return invalid_argument("logit_bias: a bias must be finite");
        bias.push_back({tok, b});
    }
    const bool penalties = sp.presence_penalty != 0 || sp.frequency_penalty != 0;
    auto p = std::make_unique<impl>();
    if (sp.temperature > 0 || penalties || !bias.empty() || !sp.grammar.empty()) {
        p->chain.reset(llama_sampler_chain_init(llama_sampler_chain_default_params()));
        if (!bias.empty())
            llama_sampler_chain_add(p->chain.get(), llama_sampler_init_logit_bias(n_vocab, (int32_t)bias.size(), bias.data()));
        if (penalties)
            llama_sampler_chain_add(p->chain.get(), llama_sampler_init_penalties(n_vocab, k_penalty_window, 1.0f,
                                                                                 sp.frequency_penalty, sp.presence_penalty));
        if (!sp.grammar.empty()) {
            llama_sampler * g = nullptr;
            if (sp.grammar_lazy) {
                std::vector<std::string> patterns = sp.grammar_trigger_patterns;
                std::vector<llama_token> tokens;
                for (const std::string & w : sp.grammar_trigger_words) {
                    auto t = e.tokenize(w, true);
                    if (t.ok() && t->size() == 1) tokens.push_back((*t)[0]);
                    else patterns.push_back(regex_escape(w));
                }
                std::vector<const char *> pc;
                for (const auto & s : patterns) pc.push_back(s.c_str());
                g = llama_sampler_init_grammar_lazy_patterns(e.p_->vocab, sp.grammar.c_str(), "root", pc.data(), pc.size(),
                                                             tokens.data(), tokens.size());
            } else {
                g = llama_sampler_init_grammar(e.p_->vocab, sp.grammar.c_str(), "root");
            }
            if (!g) return invalid_argument("the grammar does not parse (GBNF with a rule named root)");
            if (!sp.grammar_lazy && !sp.grammar_prefill.empty()) {
                auto toks = e.tokenize(sp.grammar_prefill, true);
                if (!toks.ok()) {
                    llama_sampler_free(g);
                    return toks.error();
                }
                for (token_id t : *toks) llama_sampler_accept(g, t);
            }
            llama_sampler_chain_add(p->chain.get(), g);
        }
    }
    if (sp.temperature <= 0) {
        if (p->chain) llama_sampler_chain_add(p->chain.get(), llama_sampler_init_greedy());
    } else {
        if (sp.top_k > 0) llama_sampler_chain_add(p->chain.get(), llama_sampler_init_top_k(sp.top_k));
        if (sp.top_p < 1.0f) llama_sampler_chain_add(p->chain.get(), llama_sampler_init_top_p(sp.top_p, 1));
        llama_sampler_chain_add(p->chain.get(), llama_sampler_init_temp(sp.temperature));
        llama_sampler_chain_add(p->chain.get(), llama_sampler_init_dist(sp.seed));
    }
    return std::unique_ptr<token_sampler>(new token_sampler(std::move(p)));
}

token_id token_sampler::sample(std::span<const float> l) {
    if (!p_->chain) return (token_id)(std::max_element(l.begin(), l.end()) - l.begin());  // first maximum
    // One candidate array per thread, kept: every request's sampler would otherwise
    // allocate and fault in n_vocab entries (1.8 MB for a 152k vocabulary) before its
    // first token.
    thread_local std::vector<llama_token_data> cand;
    cand.resize(l.size());
    for (size_t i = 0; i < l.size(); ++i) cand[i] = {(llama_token)i, l[i], 0.0f};
    llama_token_data_array arr{cand.data(), cand.size(), -1, false};
    llama_sampler_apply(p_->chain.get(), &arr);
    const llama_token t = arr.data[arr.selected].id;
    llama_sampler_accept(p_->chain.get(), t);  // the penalties count it from now on
    return t;
}

struct generation_step::impl {
    const engine * e = nullptr;
    sampling_params sp;
    std::unique_ptr<token_sampler> sampler;
    text_stream text;
    std::vector<token_id> tokens;
    explicit impl(std::vector<std::string> stop) : text(std::move(stop)) {}
};

namespace {
// log-softmax over the whole vocabulary: the chosen token's and the k largest.
token_logprobs logprobs_of(const engine & e, std::span<const float> logits, token_id chosen, int32_t k) {
    float mx = -INFINITY;
    for (float x : logits) mx = std::max(mx, x);
    double sum = 0;
    for (float x : logits) sum += std::exp((double)x - mx);
    const float log_z = mx + (float)std::log(sum);
    token_logprobs out;
    out.chosen = {chosen, logits[(size_t)chosen] - log_z, e.token_piece(chosen)};
    const size_t n = std::min<size_t>((size_t)std::max(k, 0), logits.size());
    if (n > 0) {
        std::vector<token_id> idx(logits.size());
        for (size_t i = 0; i < idx.size(); ++i) idx[i] = (token_id)i;
        std::partial_sort(idx.begin(), idx.begin() + (long)n, idx.end(), [&](token_id a, token_id b) {
            return logits[(size_t)a] > logits[(size_t)b] || (logits[(size_t)a] == logits[(size_t)b] && a < b);
        });
        for (size_t i = 0; i < n; ++i) out.top.push_back({idx[i], logits[(size_t)idx[i]] - log_z, e.token_piece(idx[i])});
    }
    return out;
}
}  // namespace

generation_step::generation_step(std::unique_ptr<impl> p) : p_(std::move(p)) {}
generation_step::~generation_step() = default;

result<std::unique_ptr<generation_step>> generation_step::make(const engine & e, const sampling_params & sp) {
    auto sampler = token_sampler::make(sp, e);
    if (!sampler.ok()) return sampler.error();
    auto p = std::make_unique<impl>(sp.stop);
    p->e = &e;
    p->sp = sp;
    p->sampler = std::move(sampler.value());
    return std::unique_ptr<generation_step>(new generation_step(std::move(p)));
}

generation_step::decision generation_step::next(std::span<const float> logits, pos_t n_in_seq) {
    decision d;
    auto end = [&d](finish_reason r) {
        d.finished = true;
        d.finish = r;
        return d;
    };
    if ((int32_t)p_->tokens.size() >= p_->sp.max_tokens) return end(finish_reason::length);
    d.token = p_->sampler->sample(logits);
    if (p_->sp.n_logprobs >= 0) d.logprobs = logprobs_of(*p_->e, logits, d.token, p_->sp.n_logprobs);
    if (p_->e->is_end_of_generation(d.token)) return end(finish_reason::eos);
    p_->tokens.push_back(d.token);
    d.delta = p_->text.push(p_->e->token_piece(d.token));
    if (p_->text.stopped()) return end(finish_reason::stop);
    if ((int32_t)p_->tokens.size() >= p_->sp.max_tokens) return end(finish_reason::length);
    if ((uint32_t)n_in_seq + 1 > p_->e->context().n_ctx_seq) return end(finish_reason::context_full);
    return d;
}

std::string generation_step::finish() { return p_->text.finish(); }
int32_t generation_step::n_generated() const { return (int32_t)p_->tokens.size(); }
const std::vector<token_id> & generation_step::tokens() const { return p_->tokens; }
const std::string & generation_step::text() const { return p_->text.text(); }

result<generation> engine::generate(seq_id seq, std::vector<float> logits, const sampling_params & sp,
                                    std::vector<float> * logits_out) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if ((int32_t)logits.size() != p_->minfo.n_vocab)
        return invalid_argument("generate: logits must have n_vocab entries (prefill first)");
    auto gs = generation_step::make(*this, sp);
    if (!gs.ok()) return gs.error();
    generation_step & step = **gs;

    generation g;
    auto t0 = std::chrono::steady_clock::now();
    pos_t pos = seq_n_tokens(seq);
    for (;;) {
        if (logits_out && step.n_generated() < sp.max_tokens)
            logits_out->insert(logits_out->end(), logits.begin(), logits.end());
        auto d = step.next(logits, pos);
        if (d.finished) {
            g.finish = d.finish;
            break;
        }
        status st = p_->decode(seq, &d.token, 1, pos, true);
        if (!st.ok()) return st.with_context("generate");
        ++pos;
        p_->copy_logits(&logits);
    }
    step.finish();
    g.tokens = step.tokens();
    g.text = step.text();
    g.t_decode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return g;
}

status engine::decode_step(std::span<const step_input> inputs, std::vector<std::vector<float>> & logits) {
    if (inputs.empty()) return invalid_argument("decode_step: no inputs");
    if (inputs.size() > p_->cinfo.chunk_tokens) return invalid_argument("decode_step: more inputs than the batch holds");
    auto & batch = p_->batch;
    batch.n_tokens = (int32_t)inputs.size();
    for (size_t i = 0; i < inputs.size(); ++i) {
        const auto & in = inputs[i];
        WARMCTX_RETURN_IF_ERROR(p_->check_seq(in.seq));
        if (in.token < 0 || in.token >= p_->minfo.n_vocab) return invalid_argument("decode_step: token out of vocabulary");
        if ((uint32_t)in.pos >= p_->cinfo.n_ctx_seq) return out_of_range("decode_step: sequence is full");
        for (size_t j = 0; j < i; ++j)
            if (inputs[j].seq == in.seq) return invalid_argument("decode_step: a sequence appears twice");
        batch.token[i] = in.token;
        batch.pos[i] = in.pos;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = in.seq;
        batch.logits[i] = 1;
    }
    WARMCTX_RETURN_IF_ERROR(decode_status(llama_decode(p_->ctx.get(), batch)).with_context("decode_step"));
    logits.resize(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
        const float * l = llama_get_logits_ith(p_->ctx.get(), (int32_t)i);
        logits[i].assign(l, l + p_->minfo.n_vocab);
    }
    return {};
}

status engine::copy_seq(seq_id src, seq_id dst) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(src));
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(dst));
    if (src == dst) return {};
    llama_memory_seq_rm(p_->mem(), dst, -1, -1);
    llama_memory_seq_cp(p_->mem(), src, dst, -1, -1);
    return {};
}

status engine::copy_seq_now(seq_id src, seq_id dst) {
    WARMCTX_RETURN_IF_ERROR(copy_seq(src, dst));
    if (src == dst) return {};
    // llama.cpp copies a stream's data at its next decode: one token decoded into `dst`
    // after what it holds, then removed, makes it happen now. The token takes the next
    // free cell and gives it back, so the cells a later prefill takes are the same.
    const pos_t at = seq_n_tokens(dst);
    if ((uint64_t)at >= p_->cinfo.n_ctx_seq) {
        clear_seq(dst);
        return failed_precondition("copy_seq_now: the stream is full, no cell to decode into");
    }
    const token_id t = 0;
    status st = p_->decode(dst, &t, 1, at, false);
    llama_memory_seq_rm(p_->mem(), dst, at, -1);
    if (!st.ok()) clear_seq(dst);
    return st;
}

status engine::trim_seq(seq_id seq, pos_t from) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if (from < 0) return invalid_argument("trim position must not be negative");
    if (!llama_memory_seq_rm(p_->mem(), seq, from, -1)) return engine_error("llama_memory_seq_rm refused the trim");
    return {};
}

void engine::clear_seq(seq_id seq) {
    if (p_->check_seq(seq).ok()) llama_memory_seq_rm(p_->mem(), seq, -1, -1);
}

void engine::clear_all() { llama_memory_clear(p_->mem(), true); }

pos_t engine::seq_n_tokens(seq_id seq) const {
    if (!p_->check_seq(seq).ok()) return 0;
    return llama_memory_seq_pos_max(p_->mem(), seq) + 1;  // pos_max is -1 when empty
}

status engine::apply_pending_copies(seq_id scratch) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(scratch));
    if (seq_n_tokens(scratch) != 0) return failed_precondition("apply_pending_copies: the scratch sequence is not empty");
    const token_id t = 0;
    status st = p_->decode(scratch, &t, 1, 0, false);  // llama_decode applies pending copies first
    llama_memory_seq_rm(p_->mem(), scratch, -1, -1);
    return st;
}

result<std::vector<uint8_t>> engine::save_seq(seq_id seq) const {
    auto saved = save_seq_raw(seq);
    if (!saved.ok()) return saved.error();
    auto out = portable_state(*saved);
    if (!out.ok()) return engine_error("save_seq: " + out.error().message());
    return out;
}

result<std::vector<uint8_t>> engine::portable_state(std::span<const uint8_t> raw) const {
    // To the one-stream form (see the layout above read_stream_record).
    uint32_t id = 0;
    if (raw.size() >= 8) std::memcpy(&id, raw.data() + 4, 4);
    auto st = parse_seq_state(raw, (int32_t)id, p_->n_stream);
    if (!st.ok()) return st.error();
    std::vector<uint8_t> out;
    out.reserve(16 + (st->record ? st->record->end - st->record->begin : 0));
    put_u32(out, k_seq_state_magic);
    put_u32(out, 0);
    put_u32(out, 1);
    if (st->record) append_record(out, raw, *st->record, 0);
    else put_u32(out, 0);
    return out;
}

result<std::vector<uint8_t>> engine::save_seq_raw(seq_id seq) const {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    size_t n = llama_state_seq_get_size(p_->ctx.get(), seq);
    std::vector<uint8_t> raw(n);
    size_t w = llama_state_seq_get_data(p_->ctx.get(), raw.data(), raw.size(), seq);
    if (w == 0 && n != 0) return engine_error("llama_state_seq_get_data failed");
    raw.resize(w);
    return raw;
}

status engine::load_seq_raw(seq_id seq, std::span<const uint8_t> bytes) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if (bytes.empty()) return invalid_argument("load_seq_raw: empty state");
    llama_memory_seq_rm(p_->mem(), seq, -1, -1);
    size_t r = llama_state_seq_set_data(p_->ctx.get(), bytes.data(), bytes.size(), seq);
    if (r == 0) return corrupt("llama_state_seq_set_data rejected the state");
    return {};
}

status engine::load_seq(seq_id seq, std::span<const uint8_t> bytes) {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    if (bytes.empty()) return invalid_argument("load_seq: empty state");
    auto full = raw_state(bytes, seq);
    if (!full.ok()) return full.error();
    llama_memory_seq_rm(p_->mem(), seq, -1, -1);
    size_t r = llama_state_seq_set_data(p_->ctx.get(), full->data(), full->size(), seq);
    if (r == 0) return corrupt("llama_state_seq_set_data rejected the state (wrong model, KV type or corrupt bytes)");
    return {};
}

result<std::vector<uint8_t>> engine::raw_state(std::span<const uint8_t> bytes, seq_id seq) const {
    WARMCTX_RETURN_IF_ERROR(p_->check_seq(seq));
    auto st = parse_seq_state(bytes, 0, 1);  // save_seq's one-stream form only
    if (!st.ok()) return st.error();
    // A state made in a context with longer sequences may not fit this one's.
    if (st->record && ((uint64_t)st->record->n_cells > p_->cinfo.n_ctx_seq ||
                       (uint64_t)st->record->max_pos >= p_->cinfo.n_ctx_seq))
        return out_of_range("load_seq: the state holds " + std::to_string(st->record->n_cells) +
                            " cells up to position " + std::to_string(st->record->max_pos) + " but a sequence holds " +
                            std::to_string(p_->cinfo.n_ctx_seq) + " tokens");
    // Expanded to this context's stream count: the record (into `seq`'s own stream,
    // whatever its place), then empty streams.
    std::vector<uint8_t> full;
    full.reserve(bytes.size() + 4 * (size_t)p_->n_stream);
    put_u32(full, k_seq_state_magic);
    put_u32(full, (uint32_t)seq);
    put_u32(full, p_->n_stream);
    if (st->record) append_record(full, bytes, *st->record, seq);
    else put_u32(full, 0);
    for (uint32_t s = 1; s < p_->n_stream; ++s) put_u32(full, 0);
    return full;
}

}  // namespace warmctx
