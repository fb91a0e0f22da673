// Generates GGUF models of architectures other than qwen2 (qwen35, gpt-oss, qwen3moe, lfm2)
// through llama.cpp's public model builder: llama_model_init_from_user creates every
// tensor the architecture needs from metadata keys alone and calls back to fill each,
// llama_model_save_to_file writes the model. The keys are the plain GGUF names of
// llama.cpp's src/llama-arch.cpp (LLM_KV_NAMES), "<arch>.<key>".
#include "model_maker_internal.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>
#include <unistd.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"

namespace fs = std::filesystem;

namespace warmctx::mm_detail {
namespace {

struct gguf_deleter { void operator()(gguf_context * g) const { gguf_free(g); } };
struct ggml_deleter { void operator()(ggml_context * g) const { ggml_free(g); } };
struct model_deleter { void operator()(llama_model * m) const { llama_model_free(m); } };
struct file_closer { void operator()(FILE * f) const { std::fclose(f); } };
using gguf_ptr = std::unique_ptr<gguf_context, gguf_deleter>;

// Qwen3.5's multimodal rotary sections over n_rot/2 pairs: [11, 11, 10, 0] for n_rot 64.
std::vector<int32_t> qwen35_rope_sections(int32_t n_rot) {
    const int32_t s = n_rot / 2, a = (s + 2) / 3;
    return {a, a, s - 2 * a, 0};
}

// The architecture's hyperparameters as GGUF keys: those each arch's load_hparams reads
// in llama.cpp (src/llama-model.cpp, src/models/<arch>.cpp).
void set_arch_kvs(gguf_context * g, const model_shape & s, uint64_t seed) {
    const std::string a = s.arch + ".";
    auto u32 = [&](const char * k, int32_t v) { gguf_set_val_u32(g, (a + k).c_str(), (uint32_t)v); };
    auto f32 = [&](const char * k, float v) { gguf_set_val_f32(g, (a + k).c_str(), v); };
    const int32_t head_dim = s.head_dim_or_default();
    const int32_t n_rot = s.n_rot > 0 ? s.n_rot : head_dim;
    gguf_set_val_str(g, "general.architecture", s.arch.c_str());
    gguf_set_val_str(g, "general.name", ("warmctx " + s.name + " seed " + std::to_string(seed)).c_str());
    u32("block_count", s.n_layer);
    u32("context_length", s.n_ctx_train);
    u32("embedding_length", s.n_embd);
    u32("feed_forward_length", s.n_ff);
    u32("attention.head_count", s.n_head);
    u32("attention.head_count_kv", s.n_head_kv);
    u32("attention.key_length", head_dim);
    u32("attention.value_length", head_dim);
    u32("rope.dimension_count", n_rot);
    f32("rope.freq_base", s.rope_freq_base);
    f32("attention.layer_norm_rms_epsilon", s.rms_eps);
    if (s.n_expert > 0) {
        u32("expert_count", s.n_expert);
        u32("expert_used_count", s.n_expert_used);
        u32("expert_feed_forward_length", s.n_ff_exp);
    }
    if (s.n_swa > 0) u32("attention.sliding_window", s.n_swa);  // gpt-oss: every other layer
    if (s.arch == "qwen35") {
        u32("ssm.conv_kernel", s.ssm_d_conv);
        u32("ssm.state_size", s.ssm_d_state);
        u32("ssm.group_count", s.ssm_n_group);
        u32("ssm.time_step_rank", s.ssm_dt_rank);
        u32("ssm.inner_size", s.ssm_d_state * s.ssm_dt_rank);
        u32("full_attention_interval", s.full_attn_interval);
        const auto sec = qwen35_rope_sections(n_rot);
        gguf_set_arr_data(g, (a + "rope.dimension_sections").c_str(), GGUF_TYPE_INT32, sec.data(), sec.size());
    }
    if (s.arch == "lfm2") {
        // LFM2: short-convolution layers (no KV heads) beside attention every
        // full_attn_interval-th layer; with a sliding window on the attention layers,
        // llama.cpp keeps it as a hybrid of a recurrent state and a windowed KV.
        std::vector<uint32_t> heads, heads_kv;
        for (int32_t il = 0; il < s.n_layer; ++il) {
            const bool attn =
                il % std::max(1, s.full_attn_interval) == 0;  // llama.cpp reads the head size from layer 0
            heads.push_back(attn ? (uint32_t)s.n_head : 0);
            heads_kv.push_back(attn ? (uint32_t)s.n_head_kv : 0);
        }
        gguf_set_arr_data(g, (a + "attention.head_count").c_str(), GGUF_TYPE_UINT32, heads.data(), heads.size());
        gguf_set_arr_data(g, (a + "attention.head_count_kv").c_str(), GGUF_TYPE_UINT32, heads_kv.data(),
                          heads_kv.size());
        u32("shortconv.l_cache", s.ssm_d_conv);
    }
}

// A shape of the same architecture and tensor names with every width small: the names
// llama.cpp gives the tensors, found cheaply before the real (large) build.
model_shape probe_shape(const model_shape & s) {
    model_shape p = s;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 64;
    p.n_rot = 16;
    p.n_ff = 64;
    p.n_ff_exp = 32;
    p.n_expert = std::min(s.n_expert, 4);
    p.n_expert_used = std::min(s.n_expert_used, 2);
    p.ssm_d_state = 16;
    p.ssm_n_group = 2;
    p.ssm_dt_rank = 4;
    return p;
}

bool ends_with(const std::string & s, const char * suffix) {
    const size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Stored f16 (then quantized by llama_model_quantize): the weight matrices. Norms,
// biases, the router, the convolution and the other 1-D tensors stay f32, as in
// converted files.
bool stored_f16(const std::string & name, int n_dims) {
    return n_dims >= 2 && !ends_with(name, ".bias") && name.find("ssm_conv1d") == std::string::npos &&
           name.find("shortconv.conv.") == std::string::npos && name.find("ffn_gate_inp") == std::string::npos;
}

struct tensor_name { std::string name; int n_dims; };

// llama_model_init_from_user creates every optional tensor of the architecture too:
// per-tensor scales (of FP8/NVFP4 checkpoints), attention biases, a separate output
// matrix. The real models of these families have none of them (gpt-oss has its biases),
// so the written file leaves them out and llama.cpp loads it as it loads a converted one.
bool kept_in_file(const model_shape & s, const std::string & name) {
    if (ends_with(name, ".scale") || ends_with(name, ".input_scale")) return false;
    if (s.arch == "gpt-oss") return true;
    if (ends_with(name, ".bias") && name.find("ssm_dt") == std::string::npos) return false;
    return !(s.tied_embd && name == "output.weight");
}

// Weight values, by name: norms 1 (activations stay finite), the Gated DeltaNet decay
// A = -1 (a decaying state), biases and other 1-D tensors small, the embedding
// uniform(-1, 1), matrices uniform with variance 1/fan_in (ne0 is the input width).
struct fill_rule { bool constant; float value; };
fill_rule rule_for(const ggml_tensor * t) {
    const std::string n = t->name;
    if (n.find("norm") != std::string::npos) return {true, 1.0f};
    if (ends_with(n, ".ssm_a")) return {true, -1.0f};
    if (ends_with(n, ".bias") || ggml_n_dims(t) == 1) return {false, 0.02f};
    if (n.rfind("token_embd", 0) == 0) return {false, 1.0f};
    return {false, std::sqrt(3.0f / (float)t->ne[0])};
}

struct fill_state { uint64_t seed; size_t done = 0, total = 0; const progress_fn * progress; };

// llama_model_set_tensor_data_t: fills one tensor (f32 or f16) in chunks, seeded by the
// tensor's name, so the values do not depend on the order llama.cpp asks for them.
void fill_tensor(ggml_tensor * t, void * ud) {
    auto * st = static_cast<fill_state *>(ud);
    const fill_rule r = rule_for(t);
    const int64_t n = ggml_nelements(t);
    const size_t elt = ggml_type_size(t->type);
    uint64_t s = st->seed ^ fnv1a(t->name);
    const float inv = 1.0f / 9007199254740992.0f;  // 2^-53
    constexpr int64_t k_chunk = 1 << 20;
    std::vector<float> vals;
    std::vector<ggml_fp16_t> half;
    for (int64_t off = 0; off < n; off += k_chunk) {
        const int64_t m = std::min(k_chunk, n - off);
        vals.resize((size_t)m);
        for (int64_t i = 0; i < m; ++i)
            vals[(size_t)i] = r.constant ? r.value : (2.0f * (float)(splitmix64(s) >> 11) * inv - 1.0f) * r.value;
        const void * data = vals.data();
        if (t->type == GGML_TYPE_F16) {
            half.resize((size_t)m);
            ggml_fp32_to_fp16_row(vals.data(), half.data(), m);
            data = half.data();
        }
        ggml_backend_tensor_set(t, data, (size_t)off * elt, (size_t)m * elt);
    }
    ++st->done;
    if (st->progress && *st->progress && (st->done % 48 == 0 || st->done == st->total))
        (*st->progress)("  weights: " + std::to_string(st->done) + "/" + std::to_string(st->total) + " tensors");
}

void record_name(ggml_tensor * t, void * ud) {
    static_cast<std::vector<tensor_name> *>(ud)->push_back({t->name, ggml_n_dims(t)});
}

// Weights on the CPU only (no device in the list), no progress dots.
llama_model_params cpu_params() {
    static ggml_backend_dev_t no_devices[] = {nullptr};
    llama_model_params mp = llama_model_default_params();
    mp.devices = no_devices;
    mp.n_gpu_layers = 0;
    mp.progress_callback = [](float, void *) { return true; };
    return mp;
}

result<gguf_ptr> arch_metadata(const model_shape & s, uint64_t seed, const std::string & vocab_path) {
    gguf_ptr g(gguf_init_empty());
    set_arch_kvs(g.get(), s, seed);
    WARMCTX_RETURN_IF_ERROR(copy_tokenizer(g.get(), vocab_path, shape_chat_template(s), nullptr));
    return result<gguf_ptr>(std::move(g));
}

}  // namespace

status write_arch_model(const model_shape & shape, uint64_t seed, const std::string & vocab_path,
                        const std::string & out_path, const progress_fn & progress) {
    // 1. The tensor names, from a narrow build of the same architecture and depth.
    std::vector<tensor_name> names;
    {
        auto meta = arch_metadata(probe_shape(shape), seed, vocab_path);
        if (!meta) return meta.error();
        std::unique_ptr<llama_model, model_deleter> probe(
            llama_model_init_from_user(meta->get(), record_name, &names, cpu_params()));
        if (!probe) return engine_error("llama.cpp cannot build a " + shape.arch + " model from shape " + shape.name);
    }
    // 2. The real build: the metadata names the f16 tensors (the rest default to f32).
    auto meta = arch_metadata(shape, seed, vocab_path);
    if (!meta) return meta.error();
    for (const auto & tn : names) {
        if (!stored_f16(tn.name, tn.n_dims)) continue;
        ggml_tensor t;
        std::memset(&t, 0, sizeof(t));
        t.type = GGML_TYPE_F16;
        ggml_set_name(&t, tn.name.c_str());
        gguf_add_tensor(meta->get(), &t);
    }
    fill_state st{seed, 0, names.size(), &progress};
    std::unique_ptr<llama_model, model_deleter> model(
        llama_model_init_from_user(meta->get(), fill_tensor, &st, cpu_params()));
    if (!model) return engine_error("llama.cpp cannot build a " + shape.arch + " model of shape " + shape.name);
    if (progress) progress("  writing with llama_model_save_to_file");
    llama_model_save_to_file(model.get(), out_path.c_str());
    std::error_code ec;
    if (!fs::exists(out_path, ec) || fs::file_size(out_path, ec) == 0)
        return io_error("llama_model_save_to_file wrote nothing to '" + out_path + "'");
    return {};
}

status finish_arch_model(const std::string & in_path, const model_shape & shape, uint64_t seed,
                         const std::string & vocab_path, const std::string & out_path) {
    ggml_context * tctx = nullptr;
    gguf_init_params ip{/*no_alloc=*/true, &tctx};
    gguf_ptr in(gguf_init_from_file(in_path.c_str(), ip));
    std::unique_ptr<ggml_context, ggml_deleter> tensors(tctx);
    if (!in) return io_error("cannot read '" + in_path + "' as GGUF");
    // The keys the model was built from (the saver adds every hyperparameter at its
    // default, and drops the chat template), and the quantizer's file type.
    auto meta = arch_metadata(shape, seed, vocab_path);
    if (!meta) return meta.error();
    gguf_ptr out = std::move(*meta);
    for (const char * key : {"general.quantization_version", "general.file_type"}) {
        const int64_t id = gguf_find_key(in.get(), key);
        if (id >= 0) gguf_set_val_u32(out.get(), key, gguf_get_val_u32(in.get(), id));
    }
    std::vector<const ggml_tensor *> kept;
    std::vector<size_t> src_offset;
    for (int64_t i = 0; i < gguf_get_n_tensors(in.get()); ++i) {
        const ggml_tensor * t = ggml_get_tensor(tctx, gguf_get_tensor_name(in.get(), i));
        if (!t) return engine_error("tensor " + std::to_string(i) + " of '" + in_path + "' not found");
        if (!kept_in_file(shape, t->name)) continue;
        gguf_add_tensor(out.get(), t);
        kept.push_back(t);
        src_offset.push_back(gguf_get_data_offset(in.get()) + gguf_get_tensor_offset(in.get(), i));
    }
    std::unique_ptr<FILE, file_closer> src(std::fopen(in_path.c_str(), "rb"));
    std::unique_ptr<FILE, file_closer> dst(std::fopen(out_path.c_str(), "wb"));
    if (!src || !dst)
        return io_error("cannot open '" + in_path + "' or create '" + out_path + "': " + std::strerror(errno));
    std::vector<uint8_t> buf(gguf_get_meta_size(out.get()));
    gguf_get_meta_data(out.get(), buf.data());
    if (std::fwrite(buf.data(), 1, buf.size(), dst.get()) != buf.size())
        return io_error("write failed on '" + out_path + "'");
    // Each kept tensor's bytes, at the offsets gguf gave them (each padded to the alignment).
    const size_t align = gguf_get_alignment(out.get());
    size_t at = 0;
    buf.assign(1 << 22, 0);
    for (size_t i = 0; i < kept.size(); ++i) {
        if (gguf_get_tensor_offset(out.get(), (int64_t)i) != at)
            return engine_error("unexpected tensor offset in '" + out_path + "'");
        if (fseeko(src.get(), (off_t)src_offset[i], SEEK_SET) != 0) return io_error("seek failed on '" + in_path + "'");
        const size_t nbytes = ggml_nbytes(kept[i]), padded = GGML_PAD(nbytes, align);
        for (size_t done = 0; done < nbytes;) {
            const size_t n = std::min(buf.size(), nbytes - done);
            if (std::fread(buf.data(), 1, n, src.get()) != n) return io_error("read failed on '" + in_path + "'");
            if (std::fwrite(buf.data(), 1, n, dst.get()) != n) return io_error("write failed on '" + out_path + "'");
            done += n;
        }
        static const std::vector<uint8_t> zeros(64, 0);
        for (size_t pad = padded - nbytes; pad > 0;) {
            const size_t n = std::min(pad, zeros.size());
            if (std::fwrite(zeros.data(), 1, n, dst.get()) != n) return io_error("write failed on '" + out_path + "'");
            pad -= n;
        }
        at += padded;
    }
    if (std::ferror(src.get())) return io_error("read failed on '" + in_path + "'");
    if (std::fflush(dst.get()) != 0 || fsync(fileno(dst.get())) != 0)
        return io_error("flush failed on '" + out_path + "'");
    return {};
}

}  // namespace warmctx::mm_detail
