// Generates GGUF models: the shapes, Qwen2 tensors with seeded pseudo-random weights
// (the other architectures: model_maker_archs.cpp), the real Qwen2 tokenizer metadata
// copied from llama.cpp's vocab file, and quantization through llama.cpp's own
// llama_model_quantize.
#include "engine/model_maker.h"
#include "util/resources.h"
#include "model_maker_internal.h"

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

namespace fs = std::filesystem;

namespace warmctx {

const std::vector<model_shape> & model_shapes() {
    // Published dimensions; every training context declared 65536 so that a 47k-token
    // prompt fits one slot of llama-server as well as ours (no rope scaling).
    static const std::vector<model_shape> k_shapes = {
        // Tiny shapes for tests: fast on a 2-core CPU, the real 151,936-token vocabulary.
        {.name = "tiny", .n_layer = 2, .n_embd = 64, .n_head = 4, .n_head_kv = 2, .n_ff = 128, .for_tests = true},
        // Qwen3.5 hybrid: Gated DeltaNet layers, full attention every 2nd layer (1 and 3),
        // tied embeddings.
        {.name = "tiny-hybrid", .arch = "qwen35", .template_name = "Qwen3.5-4B.jinja", .n_layer = 4, .n_embd = 64,
         .n_head = 4, .n_head_kv = 2, .n_ff = 128, .rope_freq_base = 10000000.0f, .head_dim = 64, .n_rot = 16,
         .full_attn_interval = 2, .ssm_d_state = 32, .ssm_n_group = 2, .ssm_dt_rank = 4, .ssm_d_conv = 4,
         .for_tests = true},
        // tiny-hybrid's dimensions and template with every layer full attention (Qwen3's
        // dense architecture): the plain model a tiny hybrid is compared with.
        {.name = "tiny-plain", .arch = "qwen3", .template_name = "Qwen3.5-4B.jinja", .n_layer = 4, .n_embd = 64,
         .n_head = 4, .n_head_kv = 2, .n_ff = 128, .rope_freq_base = 10000000.0f, .head_dim = 64,
         .for_tests = true},
        // gpt-oss: a 64-token sliding window on every other layer, 4 experts (2 used), sinks.
        {.name = "tiny-swa", .arch = "gpt-oss", .template_name = "openai-gpt-oss-120b.jinja", .n_layer = 4,
         .n_embd = 64, .n_head = 4, .n_head_kv = 2, .n_ff = 64, .rope_freq_base = 150000.0f, .rms_eps = 1e-5f,
         .head_dim = 64, .tied_embd = false, .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 64, .n_swa = 64,
         .for_tests = true},
        // Qwen3 MoE: 8 experts, 2 used, a separate output matrix.
        {.name = "tiny-moe", .arch = "qwen3moe", .template_name = "Qwen3-Coder.jinja", .n_layer = 2, .n_embd = 64,
         .n_head = 4, .n_head_kv = 2, .n_ff = 128, .rope_freq_base = 10000000.0f, .head_dim = 64, .tied_embd = false,
         .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 64, .for_tests = true},
        // LFM2 with a 64-token window on its attention layers (0 and 2; 1 and 3 short
        // convolutions): a hybrid with a sliding window, a memory warmctx does not cut, so
        // served without reuse across turns (memory_kind::unsupported).
        {.name = "tiny-unsupported", .arch = "lfm2", .template_name = "LFM2.5-Instruct.jinja", .n_layer = 4,
         .n_embd = 64, .n_head = 4, .n_head_kv = 2, .n_ff = 128, .rope_freq_base = 1000000.0f, .rms_eps = 1e-5f,
         .head_dim = 16, .n_swa = 64, .full_attn_interval = 2, .ssm_d_conv = 3, .for_tests = true},
        // Benchmarks: Qwen2.5 0.5B, 1.5B (tied embeddings) and 7B (a separate output matrix).
        {.name = "qwen2.5-0.5b", .n_layer = 24, .n_embd = 896, .n_head = 14, .n_head_kv = 2, .n_ff = 4864},
        {.name = "qwen2.5-1.5b", .n_layer = 28, .n_embd = 1536, .n_head = 12, .n_head_kv = 2, .n_ff = 8960},
        {.name = "qwen2.5-7b", .n_layer = 28, .n_embd = 3584, .n_head = 28, .n_head_kv = 4, .n_ff = 18944,
         .tied_embd = false},
        // Qwen3.5-4B: 32 layers (8 full attention, 24 Gated DeltaNet), head 256 (64 rotary),
        // linear attention 16 key / 32 value heads of 128.
        {.name = "qwen3.5-hybrid", .arch = "qwen35", .template_name = "Qwen3.5-4B.jinja", .n_layer = 32,
         .n_embd = 2560, .n_head = 16, .n_head_kv = 4, .n_ff = 9216, .rope_freq_base = 10000000.0f,
         .head_dim = 256, .n_rot = 64, .full_attn_interval = 4, .ssm_d_state = 128, .ssm_n_group = 16,
         .ssm_dt_rank = 32, .ssm_d_conv = 4},
        // The same dimensions with every layer full attention (Qwen3's dense architecture,
        // the same template): the plain model the hybrid is compared with at the same depth.
        {.name = "qwen3.5-plain", .arch = "qwen3", .template_name = "Qwen3.5-4B.jinja", .n_layer = 32,
         .n_embd = 2560, .n_head = 16, .n_head_kv = 4, .n_ff = 9216, .rope_freq_base = 10000000.0f,
         .head_dim = 256},
        // gpt-oss-20b: 24 layers, 32 experts (4 used) of 2880, 128-token window.
        {.name = "gpt-oss-20b", .arch = "gpt-oss", .template_name = "openai-gpt-oss-120b.jinja", .n_layer = 24,
         .n_embd = 2880, .n_head = 64, .n_head_kv = 8, .n_ff = 2880, .rope_freq_base = 150000.0f,
         .rms_eps = 1e-5f, .head_dim = 64, .tied_embd = false, .n_expert = 32, .n_expert_used = 4,
         .n_ff_exp = 2880, .n_swa = 128},
        // Qwen3-Coder-30B-A3B: 48 layers, 128 experts (8 used) of 768.
        {.name = "qwen3-coder-30b-a3b", .arch = "qwen3moe", .template_name = "Qwen3-Coder.jinja", .n_layer = 48,
         .n_embd = 2048, .n_head = 32, .n_head_kv = 4, .n_ff = 6144, .rope_freq_base = 10000000.0f,
         .head_dim = 128, .tied_embd = false, .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768},
    };
    return k_shapes;
}

const model_shape * find_model_shape(const std::string & name) {
    for (const auto & s : model_shapes())
        if (s.name == name) return &s;
    return nullptr;
}

std::string default_vocab_path() {
    // Shipped beside the binary (share/warmctx/), found relative to it: the build tree
    // and an installed prefix alike, never the source tree.
    auto p = find_data_file(k_default_vocab_name);
    return p.ok() ? *p : data_file_candidates(k_default_vocab_name).front();
}

namespace mm_detail {

// The chat template a shape's models carry (Qwen2.5's for the qwen2 shapes, with its
// tool format; the family's own for the others), shipped beside the binary like the
// vocabulary. "" when not found (the vocabulary's own template stays).
std::string shape_chat_template(const model_shape & shape) {
    auto p = find_data_file(shape.template_name);
    if (!p.ok()) return {};
    std::ifstream f(*p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

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

status copy_tokenizer(gguf_context * out, const std::string & vocab_path, const std::string & tmpl, int64_t * n_vocab) {
    gguf_init_params vp{/*no_alloc=*/true, nullptr};
    gguf_context * vocab = gguf_init_from_file(vocab_path.c_str(), vp);
    if (!vocab) return invalid_argument("cannot read vocab file '" + vocab_path + "' as GGUF");
    const int64_t tok_id = gguf_find_key(vocab, "tokenizer.ggml.tokens");
    if (tok_id < 0) {
        gguf_free(vocab);
        return invalid_argument("vocab file '" + vocab_path + "' has no tokenizer.ggml.tokens");
    }
    if (n_vocab) *n_vocab = (int64_t)gguf_get_arr_n(vocab, tok_id);
    // The real tokenizer: every tokenizer.* key of the vocab file. gguf_set_kv copies
    // all keys, so copy into a scratch context, drop the rest.
    gguf_context * all = gguf_init_empty();
    gguf_set_kv(all, vocab);
    gguf_free(vocab);
    for (int64_t i = gguf_get_n_kv(all) - 1; i >= 0; --i) {
        const char * key = gguf_get_key(all, i);
        if (std::strncmp(key, "tokenizer.", 10) != 0) gguf_remove_key(all, key);
    }
    gguf_set_kv(out, all);
    gguf_free(all);
    if (!tmpl.empty()) gguf_set_val_str(out, "tokenizer.chat_template", tmpl.c_str());
    return {};
}

}  // namespace mm_detail

using namespace mm_detail;

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
    // Tied embeddings, as Qwen2.5-0.5B/1.5B: no separate output.weight (7B has one).
    t.push_back({"token_embd.weight", s.n_embd, n_vocab, init_kind::uniform, 1.0f});
    t.push_back({"output_norm.weight", s.n_embd, 1, init_kind::ones, 0});
    if (!s.tied_embd) t.push_back({"output.weight", s.n_embd, n_vocab, init_kind::uniform, w_in});
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
    // The real tokenizer, and the shape's chat template.
    int64_t n_vocab = 0;
    WARMCTX_RETURN_IF_ERROR(copy_tokenizer(out.get(), vocab_path, shape_chat_template(shape), &n_vocab));

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
        if (pad && std::fwrite(zeros.data(), 1, pad, f.get()) != pad)
            return io_error("write failed on '" + out_path + "'");
        ++done;
        if (progress && (done % 24 == 0 || done == specs.size()))
            progress("  weights: " + std::to_string(done) + "/" + std::to_string(specs.size()) + " tensors");
    }
    if (std::fflush(f.get()) != 0 || fsync(fileno(f.get())) != 0) return io_error("flush failed on '" + out_path + "'");
    return {};
}

}  // namespace

namespace {

status quantize(const std::string & in, const std::string & out, llama_ftype ftype, int32_t n_threads) {
    llama_model_quantize_params qp = llama_model_quantize_default_params();
    qp.ftype = ftype;
    qp.nthread = n_threads;
    if (llama_model_quantize(in.c_str(), out.c_str(), &qp) != 0) return engine_error("llama_model_quantize failed");
    return {};
}

// Writes the model at tmp_out through scratch files named from it.
// qwen2: the f16 file written here, quantized unless f16. Other architectures: the f16
// file llama.cpp writes, quantized (f16 too: that sets the file type), then its
// tokenizer keys made the vocab file's and its chat template the family's.
status build_model(const model_shape & shape, llama_ftype ftype, const make_model_options & opts,
                   const std::string & vocab, const std::string & tmp_out) {
    std::error_code ec;
    const std::string tmp_f16 = tmp_out + ".f16", tmp_q = tmp_out + ".q";
    struct scratch {
        std::vector<std::string> p;
        ~scratch() {
            std::error_code e;
            for (auto & f : p) fs::remove(f, e);
        }
    };
    scratch tmp{{tmp_f16, tmp_q}};
    const std::string type = opts.type;
    if (shape.arch == "qwen2") {
        const bool f16 = ftype == LLAMA_FTYPE_MOSTLY_F16;
        WARMCTX_RETURN_IF_ERROR(write_f16_model(shape, opts.seed, vocab, f16 ? tmp_out : tmp_f16, opts.progress));
        if (f16) return {};
        if (opts.progress) opts.progress("quantizing to " + type + " with llama_model_quantize");
        return quantize(tmp_f16, tmp_out, ftype, opts.n_threads).with_context("type " + type);
    }
    if (opts.progress) opts.progress("  building the " + shape.arch + " tensors with llama_model_init_from_user");
    WARMCTX_RETURN_IF_ERROR(write_arch_model(shape, opts.seed, vocab, tmp_f16, opts.progress));
    if (opts.progress) opts.progress("quantizing to " + type + " with llama_model_quantize");
    WARMCTX_RETURN_IF_ERROR(quantize(tmp_f16, tmp_q, ftype, opts.n_threads).with_context("type " + type));
    fs::remove(tmp_f16, ec);
    return finish_arch_model(tmp_q, shape, opts.seed, vocab, tmp_out);
}

}  // namespace

status make_model(const make_model_options & opts) {
    const model_shape * shape = find_model_shape(opts.shape);
    if (!shape) {
        std::string names;
        for (const auto & s : model_shapes()) names += (names.empty() ? "" : ", ") + s.name;
        return invalid_argument("unknown shape '" + opts.shape + "' (expected one of " + names + ")");
    }
    llama_ftype ftype;
    if (opts.type == "f16") ftype = LLAMA_FTYPE_MOSTLY_F16;
    else if (opts.type == "q8_0") ftype = LLAMA_FTYPE_MOSTLY_Q8_0;
    else if (opts.type == "q4_0") ftype = LLAMA_FTYPE_MOSTLY_Q4_0;
    else return invalid_argument("unknown type '" + opts.type + "' (expected f16, q8_0 or q4_0)");
    if (opts.out_path.empty()) return invalid_argument("no output path given");
    const std::string vocab = opts.vocab_path.empty() ? default_vocab_path() : opts.vocab_path;
    std::error_code ec;
    if (vocab.empty() || !fs::exists(vocab, ec))
        return not_found("vocab file '" + vocab +
                         "' not found (pass --vocab PATH to llama.cpp's models/ggml-vocab-qwen2.gguf)");
    const fs::path out(opts.out_path);
    if (out.has_parent_path()) fs::create_directories(out.parent_path(), ec);

    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
    }, nullptr);

    const std::string tmp_out = opts.out_path + "." + std::to_string(getpid()) + ".tmp";
    if (opts.progress)
        opts.progress("generating " + shape->name + " (" + shape->arch + ", " + std::to_string(shape->n_layer) +
                      " layers, n_embd " + std::to_string(shape->n_embd) + ") seed " + std::to_string(opts.seed));
    status st = build_model(*shape, ftype, opts, vocab, tmp_out);
    if (st.ok()) fs::rename(tmp_out, opts.out_path, ec);
    if (st.ok() && ec) st = io_error("cannot rename into '" + opts.out_path + "': " + ec.message());
    if (!st.ok()) { fs::remove(tmp_out, ec); return st; }
    if (opts.progress)
        opts.progress("wrote " + opts.out_path + " (" + std::to_string(fs::file_size(opts.out_path, ec)) + " bytes)");
    return {};
}

result<std::string> ensure_model(const std::string & shape, const std::string & type, uint64_t seed,
                                 const std::function<void(const std::string &)> & progress) {
    const std::string path = cache_home() + "/models/" + shape + "-" + type + "-seed" + std::to_string(seed) + ".gguf";
    std::error_code ec;
    const model_shape * ms = find_model_shape(shape);
    if (ms && fs::exists(path, ec)) {
        // A model generated by an older warmctx carries another chat template: made again.
        const std::string want = shape_chat_template(*ms);
        if (want.empty() || model_chat_template(path) == want) return path;
        if (progress)
            progress("the cached " + shape + " " + type + " model has an older chat template; generating it again");
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
