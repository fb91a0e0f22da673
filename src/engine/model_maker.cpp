// Generates GGUF models: Qwen2 tensors with seeded pseudo-random weights, the real
// Qwen2 tokenizer metadata copied from llama.cpp's vocab file, and quantization
// through llama.cpp's own llama_model_quantize.
#include "warmctx/model_maker.h"
#include "warmctx/resources.h"

#include <fstream>
#include <sstream>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <unistd.h>

#include "ggml.h"
#include "gguf.h"
#include "llama.h"

constexpr const char * k_default_vocab_name = "ggml-vocab-qwen2.gguf";
constexpr const char * k_generated_template_name = "qwen2.5-chat-template.jinja";

namespace fs = std::filesystem;

namespace warmctx {

const std::vector<model_shape> & model_shapes() {
    // Real Qwen2.5 dimensions; training context raised to 65536 so that a 47k-token
    // prompt fits one slot of llama-server as well as ours.
    static const std::vector<model_shape> k_shapes = {
        {"tiny", 2, 64, 4, 2, 128, 65536, 1000000.0f, 1e-6f},
        {"qwen2.5-0.5b", 24, 896, 14, 2, 4864, 65536, 1000000.0f, 1e-6f},
        {"qwen2.5-1.5b", 28, 1536, 12, 2, 8960, 65536, 1000000.0f, 1e-6f},
    };
    return k_shapes;
}

std::string default_vocab_path() {
    // Shipped beside the binary (share/warmctx/), found relative to it: the build tree
    // and an installed prefix alike, never the source tree.
    auto p = find_data_file(k_default_vocab_name);
    return p.ok() ? *p : data_file_candidates(k_default_vocab_name).front();
}

// The chat template generated models carry: Qwen2.5's (the shapes are Qwen2.5's), with
// its tool format, shipped beside the binary like the vocabulary. "" when not found (the
// vocabulary's own template stays).
std::string generated_model_template() {
    auto p = find_data_file(k_generated_template_name);
    if (!p.ok()) return {};
    std::ifstream f(*p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string cache_home() {
    if (const char * h = std::getenv("WARMCTX_HOME"); h && *h) return h;
    if (const char * x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/warmctx";
    if (const char * home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/warmctx";
    return ".warmctx";
}

namespace {

// tokenizer.chat_template of a GGUF file ("" when absent or unreadable).
std::string model_chat_template(const std::string & path) {
    gguf_init_params p{/*no_alloc=*/true, nullptr};
    gguf_context * g = gguf_init_from_file(path.c_str(), p);
    if (!g) return {};
    std::string t;
    const int64_t id = gguf_find_key(g, "tokenizer.chat_template");
    if (id >= 0 && gguf_get_kv_type(g, id) == GGUF_TYPE_STRING) t = gguf_get_val_str(g, id);
    gguf_free(g);
    return t;
}

struct gguf_deleter { void operator()(gguf_context * g) const { gguf_free(g); } };
struct ggml_deleter { void operator()(ggml_context * g) const { ggml_free(g); } };
struct file_closer { void operator()(FILE * f) const { std::fclose(f); } };

uint64_t splitmix64(uint64_t & s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string & s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) { h ^= c; h *= 0x100000001b3ull; }
    return h;
}

enum class init_kind { ones, uniform };

struct tensor_spec {
    std::string name;
    int64_t ne0 = 0, ne1 = 1;
    init_kind init = init_kind::uniform;
    float scale = 0.0f;   // half-width of the uniform distribution
};

std::vector<tensor_spec> qwen2_tensors(const model_shape & s, int64_t n_vocab) {
    const int64_t head_dim = s.n_embd / s.n_head;
    const int64_t n_embd_kv = head_dim * s.n_head_kv;
    const float w_in = std::sqrt(3.0f / (float)s.n_embd);   // uniform with variance 1/fan_in
    const float w_ff = std::sqrt(3.0f / (float)s.n_ff);
    std::vector<tensor_spec> t;
    // Tied embeddings, as Qwen2.5-0.5B/1.5B: no separate output.weight.
    t.push_back({"token_embd.weight", s.n_embd, n_vocab, init_kind::uniform, 1.0f});
    t.push_back({"output_norm.weight", s.n_embd, 1, init_kind::ones, 0});
    for (int i = 0; i < s.n_layer; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        t.push_back({p + "attn_norm.weight", s.n_embd, 1, init_kind::ones, 0});
        t.push_back({p + "attn_q.weight", s.n_embd, s.n_embd, init_kind::uniform, w_in});
        t.push_back({p + "attn_q.bias", s.n_embd, 1, init_kind::uniform, 0.02f});
        t.push_back({p + "attn_k.weight", s.n_embd, n_embd_kv, init_kind::uniform, w_in});
        t.push_back({p + "attn_k.bias", n_embd_kv, 1, init_kind::uniform, 0.02f});
        t.push_back({p + "attn_v.weight", s.n_embd, n_embd_kv, init_kind::uniform, w_in});
        t.push_back({p + "attn_v.bias", n_embd_kv, 1, init_kind::uniform, 0.02f});
        t.push_back({p + "attn_output.weight", s.n_embd, s.n_embd, init_kind::uniform, w_in});
        t.push_back({p + "ffn_norm.weight", s.n_embd, 1, init_kind::ones, 0});
        t.push_back({p + "ffn_gate.weight", s.n_embd, s.n_ff, init_kind::uniform, w_in});
        t.push_back({p + "ffn_up.weight", s.n_embd, s.n_ff, init_kind::uniform, w_in});
        t.push_back({p + "ffn_down.weight", s.n_ff, s.n_embd, init_kind::uniform, w_ff});
    }
    return t;
}

// Norm weights and biases stay f32 (as in converted Qwen2 files); matrices are f16.
ggml_type storage_type(const tensor_spec & t) { return t.ne1 == 1 ? GGML_TYPE_F32 : GGML_TYPE_F16; }

void fill(const tensor_spec & t, uint64_t seed, std::vector<float> & out) {
    const size_t n = (size_t)(t.ne0 * t.ne1);
    out.resize(n);
    if (t.init == init_kind::ones) { std::fill(out.begin(), out.end(), 1.0f); return; }
    uint64_t s = seed ^ fnv1a(t.name);
    const float inv = 1.0f / 9007199254740992.0f;  // 2^-53
    for (size_t i = 0; i < n; ++i) {
        float u = (float)(splitmix64(s) >> 11) * inv;   // [0, 1)
        out[i] = (2.0f * u - 1.0f) * t.scale;
    }
}

status write_f16_model(const model_shape & shape, uint64_t seed, const std::string & vocab_path,
                       const std::string & out_path, const std::function<void(const std::string &)> & progress) {
    gguf_init_params vp{/*no_alloc=*/true, nullptr};
    std::unique_ptr<gguf_context, gguf_deleter> vocab(gguf_init_from_file(vocab_path.c_str(), vp));
    if (!vocab) return invalid_argument("cannot read vocab file '" + vocab_path + "' as GGUF");
    int64_t tok_id = gguf_find_key(vocab.get(), "tokenizer.ggml.tokens");
    if (tok_id < 0) return invalid_argument("vocab file '" + vocab_path + "' has no tokenizer.ggml.tokens");
    const int64_t n_vocab = (int64_t)gguf_get_arr_n(vocab.get(), tok_id);

    std::unique_ptr<gguf_context, gguf_deleter> out(gguf_init_empty());
    gguf_set_val_str(out.get(), "general.architecture", "qwen2");
    gguf_set_val_str(out.get(), "general.name", ("warmctx " + shape.name + " seed " + std::to_string(seed)).c_str());
    gguf_set_val_u32(out.get(), "general.file_type", LLAMA_FTYPE_MOSTLY_F16);
    gguf_set_val_u32(out.get(), "qwen2.block_count", (uint32_t)shape.n_layer);
    gguf_set_val_u32(out.get(), "qwen2.context_length", (uint32_t)shape.n_ctx_train);
    gguf_set_val_u32(out.get(), "qwen2.embedding_length", (uint32_t)shape.n_embd);
    gguf_set_val_u32(out.get(), "qwen2.feed_forward_length", (uint32_t)shape.n_ff);
    gguf_set_val_u32(out.get(), "qwen2.attention.head_count", (uint32_t)shape.n_head);
    gguf_set_val_u32(out.get(), "qwen2.attention.head_count_kv", (uint32_t)shape.n_head_kv);
    gguf_set_val_f32(out.get(), "qwen2.rope.freq_base", shape.rope_freq_base);
    gguf_set_val_f32(out.get(), "qwen2.attention.layer_norm_rms_epsilon", shape.rms_eps);
    {
        // The real tokenizer and chat template: every tokenizer.* key of the vocab file.
        // gguf_set_kv copies all keys, so copy into a scratch context, drop the rest.
        std::unique_ptr<gguf_context, gguf_deleter> all(gguf_init_empty());
        gguf_set_kv(all.get(), vocab.get());
        for (int64_t i = gguf_get_n_kv(all.get()) - 1; i >= 0; --i) {
            const char * key = gguf_get_key(all.get(), i);
            if (std::strncmp(key, "tokenizer.", 10) != 0) gguf_remove_key(all.get(), key);
        }
        gguf_set_kv(out.get(), all.get());
        if (const std::string t = generated_model_template(); !t.empty())
            gguf_set_val_str(out.get(), "tokenizer.chat_template", t.c_str());
    }

    const auto specs = qwen2_tensors(shape, n_vocab);
    ggml_init_params ip{ggml_tensor_overhead() * (specs.size() + 8), nullptr, /*no_alloc=*/true};
    std::unique_ptr<ggml_context, ggml_deleter> meta(ggml_init(ip));
    for (const auto & s : specs) {
        ggml_tensor * t = s.ne1 == 1 ? ggml_new_tensor_1d(meta.get(), storage_type(s), s.ne0)
                                     : ggml_new_tensor_2d(meta.get(), storage_type(s), s.ne0, s.ne1);
        ggml_set_name(t, s.name.c_str());
        gguf_add_tensor(out.get(), t);
    }

    std::unique_ptr<FILE, file_closer> f(std::fopen(out_path.c_str(), "wb"));
    if (!f) return io_error("cannot create '" + out_path + "': " + std::strerror(errno));
    std::vector<uint8_t> meta_bytes(gguf_get_meta_size(out.get()));
    gguf_get_meta_data(out.get(), meta_bytes.data());
    if (std::fwrite(meta_bytes.data(), 1, meta_bytes.size(), f.get()) != meta_bytes.size())
        return io_error("write failed on '" + out_path + "'");
    const size_t align = gguf_get_alignment(out.get());
    std::vector<float> vals;
    std::vector<ggml_fp16_t> half;
    const std::vector<uint8_t> zeros(align, 0);
    size_t done = 0;
    for (const auto & s : specs) {
        fill(s, seed, vals);
        const void * data = vals.data();
        size_t nbytes = vals.size() * sizeof(float);
        if (storage_type(s) == GGML_TYPE_F16) {
            half.resize(vals.size());
            ggml_fp32_to_fp16_row(vals.data(), half.data(), (int64_t)vals.size());
            data = half.data();
            nbytes = half.size() * sizeof(ggml_fp16_t);
        }
        if (std::fwrite(data, 1, nbytes, f.get()) != nbytes) return io_error("write failed on '" + out_path + "'");
        const size_t pad = (align - nbytes % align) % align;
        if (pad && std::fwrite(zeros.data(), 1, pad, f.get()) != pad) return io_error("write failed on '" + out_path + "'");
        ++done;
        if (progress && (done % 24 == 0 || done == specs.size()))
            progress("  weights: " + std::to_string(done) + "/" + std::to_string(specs.size()) + " tensors");
    }
    if (std::fflush(f.get()) != 0 || fsync(fileno(f.get())) != 0) return io_error("flush failed on '" + out_path + "'");
    return {};
}

}  // namespace

status make_model(const make_model_options & opts) {
    const model_shape * shape = nullptr;
    std::string names;
    for (const auto & s : model_shapes()) {
        if (s.name == opts.shape) shape = &s;
        names += (names.empty() ? "" : ", ") + s.name;
    }
    if (!shape) return invalid_argument("unknown shape '" + opts.shape + "' (expected one of " + names + ")");
    llama_ftype ftype;
    if (opts.type == "f16") ftype = LLAMA_FTYPE_MOSTLY_F16;
    else if (opts.type == "q8_0") ftype = LLAMA_FTYPE_MOSTLY_Q8_0;
    else if (opts.type == "q4_0") ftype = LLAMA_FTYPE_MOSTLY_Q4_0;
    else return invalid_argument("unknown type '" + opts.type + "' (expected f16, q8_0 or q4_0)");
    if (opts.out_path.empty()) return invalid_argument("no output path given");
    const std::string vocab = opts.vocab_path.empty() ? default_vocab_path() : opts.vocab_path;
    std::error_code ec;
    if (vocab.empty() || !fs::exists(vocab, ec))
        return not_found("vocab file '" + vocab + "' not found (pass --vocab PATH to llama.cpp's models/ggml-vocab-qwen2.gguf)");
    const fs::path out(opts.out_path);
    if (out.has_parent_path()) fs::create_directories(out.parent_path(), ec);

    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
    }, nullptr);

    const std::string pid = std::to_string(getpid());
    const std::string tmp_f16 = opts.out_path + ".f16." + pid + ".tmp";
    const std::string tmp_out = opts.out_path + "." + pid + ".tmp";
    auto cleanup = [&] { fs::remove(tmp_f16, ec); fs::remove(tmp_out, ec); };
    if (opts.progress) opts.progress("generating " + shape->name + " (" + std::to_string(shape->n_layer) + " layers, n_embd " +
                                     std::to_string(shape->n_embd) + ") seed " + std::to_string(opts.seed));
    const std::string & f16_path = ftype == LLAMA_FTYPE_MOSTLY_F16 ? tmp_out : tmp_f16;
    status st = write_f16_model(*shape, opts.seed, vocab, f16_path, opts.progress);
    if (!st.ok()) { cleanup(); return st; }
    if (ftype != LLAMA_FTYPE_MOSTLY_F16) {
        if (opts.progress) opts.progress("quantizing to " + opts.type + " with llama_model_quantize");
        llama_model_quantize_params qp = llama_model_quantize_default_params();
        qp.ftype = ftype;
        qp.nthread = opts.n_threads;
        if (llama_model_quantize(tmp_f16.c_str(), tmp_out.c_str(), &qp) != 0) {
            cleanup();
            return engine_error("llama_model_quantize failed for type " + opts.type);
        }
        fs::remove(tmp_f16, ec);
    }
    fs::rename(tmp_out, opts.out_path, ec);
    if (ec) { cleanup(); return io_error("cannot rename into '" + opts.out_path + "': " + ec.message()); }
    if (opts.progress) opts.progress("wrote " + opts.out_path + " (" + std::to_string(fs::file_size(opts.out_path, ec)) + " bytes)");
    return {};
}

result<std::string> ensure_model(const std::string & shape, const std::string & type, uint64_t seed,
                                 const std::function<void(const std::string &)> & progress) {
    const std::string path = cache_home() + "/models/" + shape + "-" + type + "-seed" + std::to_string(seed) + ".gguf";
    std::error_code ec;
    if (fs::exists(path, ec)) {
        // A model generated by an older warmctx carries another chat template: made again.
        const std::string want = generated_model_template();
        if (want.empty() || model_chat_template(path) == want) return path;
        if (progress) progress("the cached " + shape + " " + type + " model has an older chat template; generating it again");
    }
    if (progress) progress("generating " + shape + " " + type + " (seed " + std::to_string(seed) + ") once at " + path);
    make_model_options mo;
    mo.shape = shape;
    mo.type = type;
    mo.seed = seed;
    mo.out_path = path;
    mo.progress = progress;
    WARMCTX_RETURN_IF_ERROR(make_model(mo).with_context("generating " + shape + " " + type));
    return path;
}

result<std::string> ensure_default_model(const std::function<void(const std::string &)> & progress) {
    const std::string path = cache_home() + "/models/qwen2.5-0.5b-q4_0-seed0.gguf";
    std::error_code ec;
    if (!fs::exists(path, ec) && progress)
        progress("no --model given and the default model is not cached yet; generating it once");
    return ensure_model("qwen2.5-0.5b", "q4_0", 0, progress);
}

}  // namespace warmctx
