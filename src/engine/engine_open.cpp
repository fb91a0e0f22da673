// Opening an engine: the model file checked and loaded, and the context sized (tokens
// per sequence, resident streams, KV bytes) from the options, the model and the device.
#include "engine_impl.h"
#include "util/resources.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <utility>

#include "ggml.h"
#include "ggml-backend.h"
#include "gguf.h"
#include "llama.h"

namespace warmctx {

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

struct gguf_deleter { void operator()(gguf_context * g) const { gguf_free(g); } };
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
    if (fb >= 0 && gguf_get_kv_type(g.get(), fb) == GGUF_TYPE_FLOAT32)
        mi.rope_freq_base = gguf_get_val_f32(g.get(), fb);
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

namespace {

// The options that need no model to be checked.
status check_options(const engine_options & opts, ggml_type kv_type) {
    if (opts.n_ctx != 0 && opts.n_ctx < 16) return invalid_argument("n_ctx must be at least 16 tokens");
    if (opts.n_seq_max < 1 || opts.n_seq_max > 256) return invalid_argument("n_seq_max must be in [1, 256]");
    if (opts.chunk_tokens < 1 || opts.chunk_tokens > 8192) return invalid_argument("chunk_tokens must be in [1, 8192]");
    if (ggml_is_quantized(kv_type) && !opts.flash_attn)
        return invalid_argument("a quantized KV type (" + opts.kv_type + ") needs flash attention (--flash-attn)");
    return {};
}

// What the loaded model says of itself, over what its file's header said.
void describe_loaded_model(const llama_model * model, const llama_vocab * vocab, const engine_options & opts,
                           model_info & mi) {
    char buf[256];
    if (llama_model_desc(model, buf, sizeof buf) > 0) mi.description = buf;
    if (!opts.chat_template.empty()) {
        mi.chat_template = opts.chat_template;
        mi.chat_template_overridden = true;
    } else if (const char * t = llama_model_chat_template(model, nullptr)) {
        mi.chat_template = t;
    }
    for (auto [tok, out] : {std::pair{llama_vocab_bos(vocab), &mi.bos_text},
                            std::pair{llama_vocab_eos(vocab), &mi.eos_text}}) {
        if (tok < 0) continue;
        char tb[256];
        const int32_t n = llama_token_to_piece(vocab, tok, tb, sizeof tb, 0, true);
        if (n > 0) out->assign(tb, (size_t)n);
    }
    mi.n_vocab = llama_vocab_n_tokens(vocab);
    mi.n_ctx_train = llama_model_n_ctx_train(model);
    mi.n_layer = llama_model_n_layer(model);
    mi.n_embd = llama_model_n_embd(model);
    mi.n_head = llama_model_n_head(model);
    mi.size_bytes = llama_model_size(model);
    mi.n_params = llama_model_n_params(model);
}

// The bytes of K and V one token takes in every layer.
uint64_t kv_bytes_per_token(const llama_model * model, const model_info & mi, ggml_type kv_type) {
    const int32_t n_head = llama_model_n_head(model);
    const int32_t n_head_kv = llama_model_n_head_kv(model);
    const uint64_t head_dim = n_head > 0 ? (uint64_t)mi.n_embd / (uint64_t)n_head : 0;
    const double bytes_per_elem = ggml_type_sizef(kv_type);
    return (uint64_t)((double)mi.n_layer * 2.0 * (double)n_head_kv * (double)head_dim * bytes_per_elem);
}

// Tokens per sequence: as asked, else the model's training context, cut to what
// opts.auto_ctx_max_bytes holds for every work stream. `reason` says which.
uint32_t choose_n_ctx(const engine_options & opts, const model_info & mi, uint64_t kv_per_token,
                      std::string & reason) {
    if (opts.n_ctx != 0) {
        reason = "as asked";
        return opts.n_ctx;
    }
    const uint32_t train = mi.n_ctx_train > 0 ? (uint32_t)mi.n_ctx_train : 4096;
    uint32_t n_ctx = train;
    reason = "the model's training context";
    if (opts.auto_ctx_max_bytes > 0 && kv_per_token > 0) {
        const uint64_t fit = opts.auto_ctx_max_bytes / ((uint64_t)opts.n_seq_max * kv_per_token) / 256 * 256;
        if (fit < n_ctx) {
            n_ctx = (uint32_t)std::max<uint64_t>(fit, 256);
            reason = "the largest whose " + std::to_string(opts.n_seq_max) + " KV streams fit " +
                     std::to_string(opts.auto_ctx_max_bytes >> 20) + " MiB (training context " +
                     std::to_string(train) + ")";
        }
    }
    return n_ctx;
}

// The first GPU's free and total memory once the model is in it (0, 0: no GPU).
std::pair<uint64_t, uint64_t> gpu_memory() {
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_GPU) continue;
        size_t free_bytes = 0, total_bytes = 0;
        ggml_backend_dev_memory(dev, &free_bytes, &total_bytes);
        return {free_bytes, total_bytes};
    }
    return {0, 0};
}

// The first GPU's page-locked host buffer type (nullptr: none, or no GPU).
ggml_backend_buffer_type_t gpu_host_buffer_type() {
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU) return ggml_backend_dev_host_buffer_type(dev);
    }
    return nullptr;
}

// On the CPU the device tier is RAM, beside the work streams and the pool of cached
// prefixes, which take up to default_kv_share_bytes() each: the resident streams take
// at most as much, and at most resident_vram_share of what is available once the work
// streams, the pool's share and a reserve are counted; at most three per work stream
// (the agents one machine's cores serve at once). A warm turn whose prefix one of them
// holds starts there at once, even while every work stream writes.
uint32_t n_resident_in_ram(const engine_options & opts, uint64_t stream_bytes, std::string & reason) {
    const uint64_t avail = available_memory_bytes(), share_max = default_kv_share_bytes();
    if (stream_bytes == 0 || avail == 0) {
        reason = "none: the memory available is unknown";
        return 0;
    }
    const uint64_t reserve = std::max<uint64_t>(uint64_t{1} << 30, physical_memory_bytes() / 20);
    const uint64_t base = (uint64_t)opts.n_seq_max * stream_bytes + share_max + reserve;
    const double share = std::clamp(opts.resident_vram_share, 0.0, 0.95);
    const uint64_t room = std::min<uint64_t>(avail > base ? (uint64_t)((double)(avail - base) * share) : 0, share_max);
    const uint64_t most =
        std::min<uint64_t>(3 * (uint64_t)opts.n_seq_max, 256 - std::min<uint32_t>(opts.n_seq_max, 256));
    const auto n = (uint32_t)std::min<uint64_t>(room / stream_bytes, most);
    reason = std::to_string(n) + " streams of " + std::to_string(stream_bytes >> 20) +
             " MiB in RAM (the model runs on the CPU): at most 3 per work stream, within " +
             std::to_string(room >> 20) + " MiB (" + std::to_string((int)(share * 100 + 0.5)) + "% of the " +
             std::to_string((avail > base ? avail - base : 0) >> 20) +
             " MiB available after the work streams, the pool's share and a reserve, at most " +
             std::to_string(share_max >> 20) + " MiB)";
    return n;
}

// The resident streams (exact mode) the device - a GPU, or RAM on the CPU - has room
// for, beside the work streams: as asked, else a share of what is left after a reserve.
// `reason` says why.
uint32_t choose_n_resident(const engine_options & opts, bool on_gpu, uint64_t dev_free, uint64_t dev_total,
                           uint64_t stream_bytes, std::string & reason) {
    uint32_t n_resident = 0;
    if (opts.n_seq_resident >= 0) {
        n_resident = (uint32_t)opts.n_seq_resident;
        reason = n_resident > 0 ? "as asked" : "none asked";
    } else if (opts.mode != kv_mode::exact) {
        reason = "none: shared KV mode";
    } else if (!on_gpu) {
        n_resident = n_resident_in_ram(opts, stream_bytes, reason);
    } else if (stream_bytes > 0) {
        // A reserve for llama.cpp's compute buffers, then the share of what is left.
        const uint64_t reserve = std::max<uint64_t>(uint64_t{1} << 30, dev_total / 20);
        const uint64_t base = (uint64_t)opts.n_seq_max * stream_bytes + reserve;
        const double share = std::clamp(opts.resident_vram_share, 0.0, 0.95);
        const uint64_t room = dev_free > base ? (uint64_t)((double)(dev_free - base) * share) : 0;
        n_resident = (uint32_t)std::min<uint64_t>(room / stream_bytes, 256 - std::min<uint32_t>(opts.n_seq_max, 256));
        reason = std::to_string(n_resident) + " streams of " + std::to_string(stream_bytes >> 20) + " MiB fit " +
                 std::to_string((int)(share * 100 + 0.5)) + "% of the " +
                 std::to_string((dev_free > base ? dev_free - base : 0) >> 20) +
                 " MiB of device memory free after the model, the work streams and a " +
                 std::to_string(reserve >> 20) + " MiB reserve";
    }
    return n_resident;
}

llama_context_params context_params(const engine_options & opts, uint32_t n_ctx, uint32_t n_seq_total,
                                     int32_t n_threads, ggml_type kv_type) {
    llama_context_params cp = llama_context_default_params();
    // Every sequence may hold n_ctx tokens. In exact mode each has its own stream of
    // n_ctx cells; in shared mode one stream holds n_ctx * n_seq_max cells.
    cp.n_ctx = n_ctx * n_seq_total;
    cp.n_seq_max = n_seq_total;
    cp.n_batch = opts.chunk_tokens;
    cp.n_ubatch = opts.chunk_tokens;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.type_k = kv_type;
    cp.type_v = kv_type;
    cp.kv_unified = opts.mode == kv_mode::shared;
    cp.flash_attn_type = opts.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    return cp;
}

}  // namespace

result<std::unique_ptr<engine>> engine::open(const engine_options & opts) {
    WARMCTX_RETURN_IF_ERROR(check_gguf_file(opts.model_path));
    auto kvt = parse_kv_type(opts.kv_type);
    if (!kvt) return kvt.error();
    WARMCTX_RETURN_IF_ERROR(check_options(opts, *kvt));
    init_backend(opts.verbose);

    auto p = std::make_unique<impl>();
    p->opts = opts;
    auto mi = read_model_info(opts.model_path);
    if (!mi) return mi.error();
    p->minfo = std::move(mi.value());

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = opts.n_gpu_layers < 0 ? 999 : opts.n_gpu_layers;
    p->model.reset(llama_model_load_from_file(opts.model_path.c_str(), mp));
    if (!p->model)
        return engine_error("llama.cpp could not load model '" + opts.model_path + "' (see the error above)");
    p->vocab = llama_model_get_vocab(p->model.get());
    describe_loaded_model(p->model.get(), p->vocab, opts, p->minfo);

    const int32_t n_threads =
        opts.n_threads > 0 ? opts.n_threads : (int32_t)std::max(1u, std::thread::hardware_concurrency());
    const uint64_t kv_per_token = kv_bytes_per_token(p->model.get(), p->minfo, *kvt);
    const uint32_t n_ctx = choose_n_ctx(opts, p->minfo, kv_per_token, p->cinfo.n_ctx_reason);
    // The GPU's memory once the model is in it, and the resident streams it has room for.
    const auto [dev_free, dev_total] = gpu_memory();
    const bool on_gpu = dev_total > 0 && opts.n_gpu_layers != 0;
    p->cinfo.device_free_bytes = dev_free;
    p->cinfo.device_total_bytes = dev_total;
    p->cinfo.n_gpu_layers = on_gpu ? (opts.n_gpu_layers < 0 ? p->minfo.n_layer
                                                            : std::min(opts.n_gpu_layers, p->minfo.n_layer))
                                   : 0;
    const uint64_t stream_bytes = (uint64_t)n_ctx * kv_per_token;
    const uint32_t n_resident =
        choose_n_resident(opts, on_gpu, dev_free, dev_total, stream_bytes, p->cinfo.resident_reason);
    const uint32_t n_seq_total = opts.n_seq_max + n_resident;
    if (n_seq_total > 256) return invalid_argument("n_seq_max + resident streams must be at most 256");

    // Small batches are padded (engine::pad_rows) where flash attention runs on the CPU
    // and a batch holds the padded rows.
    // Not with a recurrent state: the padded rows would advance it.
    const bool pads = opts.flash_attn && !on_gpu && opts.chunk_tokens >= (uint32_t)k_pad_to &&
                      !llama_model_is_recurrent(p->model.get()) && !llama_model_is_hybrid(p->model.get());
    // Where small batches are padded, a stream's last k_pad_cells cells hold a padded
    // batch's extra rows for the moment they exist: the streams get those cells beyond
    // n_ctx, so that a sequence holds all n_ctx tokens it was asked for (the model's
    // training context is then whole, not 64 tokens short), unless padding_within_n_ctx.
    const uint32_t reserve = pads ? k_pad_cells : 0;
    const uint32_t beyond = opts.padding_within_n_ctx ? 0 : reserve;
    llama_context_params cp = context_params(opts, n_ctx + beyond, n_seq_total, n_threads, *kvt);
    // A sliding window's cache as large as the rest: a stream keeps every cell at the
    // cold run's place, so it is cut back like plain KV (engine.h, memory_kind).
    cp.swa_full = llama_model_n_swa(p->model.get()) > 0;
    p->ctx.reset(llama_init_from_model(p->model.get(), cp));
    if (!p->ctx) return engine_error("llama.cpp could not create a context (n_ctx=" + std::to_string(cp.n_ctx) +
                                     ", KV type " + opts.kv_type + "); try a smaller --n-ctx");

    ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    p->threadpool.reset(ggml_threadpool_new(&tpp));
    if (p->threadpool) llama_attach_threadpool(p->ctx.get(), p->threadpool.get(), p->threadpool.get());

    p->cinfo.n_ctx_seq = opts.mode == kv_mode::exact ? llama_n_ctx_seq(p->ctx.get()) : n_ctx;
    if (p->cinfo.n_ctx_seq <= reserve)
        return invalid_argument("n_ctx " + std::to_string(n_ctx) + " leaves no room beside the " +
                                std::to_string(reserve) + " cells flash attention's padding keeps; ask for more");
    p->cinfo.n_ctx_seq = std::min(p->cinfo.n_ctx_seq - reserve, n_ctx);
    p->cinfo.n_seq_max = n_seq_total;
    p->cinfo.n_seq_resident = n_resident;
    p->cinfo.flash_attn = opts.flash_attn;
    p->n_stream = opts.mode == kv_mode::exact ? n_seq_total : 1;  // as kv_unified decides
    p->cinfo.chunk_tokens = opts.chunk_tokens;
    p->cinfo.kv_type = opts.kv_type;
    p->cinfo.mode = opts.mode;
    p->cinfo.backend = std::string(backend_name());
    p->cinfo.n_threads = n_threads;
    p->cinfo.kv_bytes_per_token = kv_per_token;
    // What llama.cpp allocated: its cells per stream (the padding's and its own rounding
    // included), not only those a sequence may fill.
    const uint64_t cells = opts.mode == kv_mode::exact ? (uint64_t)llama_n_ctx_seq(p->ctx.get()) * n_seq_total
                                                       : (uint64_t)llama_n_ctx(p->ctx.get());
    p->cinfo.kv_streams_bytes = cells * kv_per_token;
    p->cinfo.pads_rows = pads;
    if (pads) p->init_pad_costs();

    p->batch = llama_batch_init((int32_t)opts.chunk_tokens, 0, 1);
    p->ckpts.resize(n_seq_total);
    p->window_real_from.assign(n_seq_total, 0);
    WARMCTX_RETURN_IF_ERROR(p->probe_memory(p->cinfo.memory, p->cinfo.kv_bytes_per_token));
    if (pads && opts.free_splits && opts.mode == kv_mode::exact && p->cinfo.memory.kind == memory_kind::plain &&
        !p->cinfo.memory.checkpoints)
        WARMCTX_RETURN_IF_ERROR(p->probe_free_splits());
    if (!on_gpu && opts.exact_steps && opts.mode == kv_mode::exact && drops_a_draft(p->cinfo.memory) &&
        p->cinfo.n_ctx_seq >= 270)
        WARMCTX_RETURN_IF_ERROR(p->probe_steps());
    if (p->cinfo.memory.kind != memory_kind::plain) {
        if (opts.mode == kv_mode::shared)
            return invalid_argument("--kv-mode shared supports plain attention models only; this model's memory is " +
                                    std::string(memory_kind_name(p->cinfo.memory.kind)) + " (use --kv-mode exact)");
        p->cinfo.kv_streams_bytes = cells * p->cinfo.kv_bytes_per_token +
                                    (uint64_t)n_seq_total * p->cinfo.memory.recurrent_bytes;
    }
    if (on_gpu) p->staging_buft = gpu_host_buffer_type();  // the KV is on the device (offload_kqv)
    return std::unique_ptr<engine>(new engine(std::move(p)));
}

}  // namespace warmctx
