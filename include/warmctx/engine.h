// warmctx/engine.h - the engine adapter: the only warmctx code that sees llama.cpp.
//
// Everything above this header works with plain token ids. One `engine` owns one
// model and one context; it is NOT thread-safe: one thread (the engine thread) owns it.
//
// KV modes
//   exact  - one KV stream per sequence (llama.cpp kv_unified = false). copy_seq copies
//            a whole stream, cell layout included, so a reused prefix plus a tail
//            prefilled in canonical chunks gives logits bit-identical to a cold run.
//            Costs a copy of the prefix's KV per reuse.
//   shared - one unified KV; copy_seq makes the destination share the source's cells
//            (no copy). Attention then runs over a different cell layout than a cold
//            run, so logits may differ in the last bits (measured: ~1e-3..1e-1).
//
// Canonical chunks
//   prefill() splits a prompt by the rule in warmctx/chunking.h (plan_chunks) and may
//   only start at a chunk start (is_chunk_start), so a warm run that reuses the KV of
//   [0, P) computes [P, n) in exactly the chunks a cold run used.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/chunking.h"  // the canonical chunking rule prefill() follows
#include "warmctx/sampling.h"
#include "warmctx/status.h"
#include "warmctx/types.h"

namespace warmctx {


enum class kv_mode { exact, shared };
std::string_view kv_mode_name(kv_mode m);
result<kv_mode> parse_kv_mode(std::string_view s);

// What a model's memory is, learned at open. It decides what a cached prefix can be:
//   plain          - attention KV on every layer: cut back to any position.
//   sliding_window - some layers attend to the last n_swa tokens only (gpt-oss, Gemma).
//                    A stream keeps every cell (llama.cpp's full-size window cache), so
//                    it is cut back like plain KV; a saved state holds only the window at
//                    its end, so it is cut back to a checkpoint (the window there).
//   recurrent      - a recurrent state (Mamba, RWKV): cannot be cut back at all, only
//                    replaced by a checkpoint (the state at an earlier position).
//   hybrid         - recurrent layers beside attention layers (Qwen3.5, Qwen3-Next):
//                    attention KV cut back, the recurrent state from a checkpoint.
//   unsupported    - a memory whose saved state warmctx cannot read (say, a hybrid with
//                    a sliding window): served, but nothing is reused across turns.
// Checkpoints are taken by prefill at every canonical chunk end (every block end).
enum class memory_kind { plain, sliding_window, recurrent, hybrid, unsupported };
std::string_view memory_kind_name(memory_kind k);

struct memory_info {
    memory_kind kind = memory_kind::plain;
    bool reuse = true;               // prefixes are reused across turns (false: every turn cold)
    bool checkpoints = false;        // reuse below a state's end needs a checkpoint there
    int32_t n_swa = 0;               // the sliding window in tokens (0: none)
    uint64_t checkpoint_bytes = 0;   // one checkpoint (the window, or the recurrent state)
    uint64_t recurrent_bytes = 0;    // the recurrent state one sequence holds (0: none)
    std::string note;                // one line: what is reused and how
};

// Whether a decode's last positions can be cut back exactly, as a draft sampling did not
// choose needs (warmctx/drafts.h): plain KV and a sliding window's (its cache keeps every
// cell where a cold run has it), not a recurrent state.
inline bool drops_a_draft(const memory_info & m) {
    return m.kind == memory_kind::plain || m.kind == memory_kind::sliding_window;
}

struct engine_options {
    std::string model_path;
    uint32_t n_ctx = 8192;        // context per sequence, tokens; 0 = automatic: the model's
                                  // training context, or the largest (a multiple of 256)
                                  // whose n_seq_max streams fit auto_ctx_max_bytes
    uint64_t auto_ctx_max_bytes = 0;  // for n_ctx 0: the streams' KV bytes at most (0 = no bound)
    // Where small batches are padded (context_info::pads_rows), the k_pad_cells cells the
    // padding needs come beyond n_ctx: a sequence holds n_ctx tokens. True: they come out of
    // n_ctx (a bench comparing a layout cell for cell with another server's).
    bool padding_within_n_ctx = false;
    // Measure at open whether a prompt's KV is the same whatever decode calls it is split
    // into (context_info::splits_freely); false: never split freely (canonical chunks).
    bool free_splits = true;
    // Measure at open whether a lone decode row needs a second to give the bits it has among
    // others (context_info::pads_steps); false: never pad a step.
    bool exact_steps = true;
    // The most a lone row padded to two may cost against the row alone, measured at open,
    // for the engine to pad (a cost, not a correctness bound: either way drafts are on by
    // default only where steps are exact). Timed, so a loaded machine may measure more.
    double steps_pad_max_cost = 1.2;
    uint32_t n_seq_max = 4;       // sequences the context can hold at once
    // Resident streams beyond n_seq_max (the device tier): KV streams of n_ctx cells that
    // keep workspaces' prefixes where the model runs. >= 0: that many; -1: on a GPU, as
    // many as fit resident_vram_share of the device memory free once the model and the
    // n_seq_max streams are in it (less a reserve for compute buffers), at most 256
    // streams in all; on the CPU none. context_info says what was chosen and why.
    int32_t n_seq_resident = 0;
    double resident_vram_share = 0.5;
    uint32_t chunk_tokens = 512;  // canonical chunk size (also llama's n_batch/n_ubatch)
    int32_t n_threads = 0;        // 0 = all hardware threads
    int32_t n_gpu_layers = 0;     // layers to offload when built with CUDA (-1 = all)
    std::string kv_type = "f16";  // f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | iq4_nl
    kv_mode mode = kv_mode::exact;
    bool flash_attn = false;      // the commands turn it on by default (as llama-server does)
    bool verbose = false;         // let llama.cpp log to stderr
    // The chat template: the model's own unless `chat_template` is given (the text of a
    // Jinja template, e.g. read from --chat-template-file). `jinja` off renders with
    // llama.cpp's built-in per-message templates instead (no tools in the template).
    std::string chat_template;
    bool jinja = true;
};

struct chat_message {
    std::string role;     // system | user | assistant | tool
    std::string content;
};

struct model_info {
    std::string path;
    std::string description;       // llama_model_desc, e.g. "qwen2 1B Q4_0"
    std::string architecture;      // general.architecture
    std::string chat_template;     // tokenizer.chat_template, or the override ("" if none)
    bool chat_template_overridden = false;
    std::string bos_text, eos_text;  // the BOS / EOS tokens' text ("" if none)
    uint64_t size_bytes = 0;       // bytes of tensor data
    uint64_t n_params = 0;
    int32_t n_vocab = 0;
    int32_t n_ctx_train = 0;
    int32_t n_layer = 0;
    int32_t n_embd = 0;
    int32_t n_head = 0;            // attention (query) heads per layer (0: not loaded yet)
    float rope_freq_base = 0;      // from the model's metadata (0 if absent)
};

struct context_info {
    uint32_t n_ctx_seq = 0;        // tokens one sequence can hold
    uint32_t n_seq_max = 0;        // every stream, the resident ones included
    uint32_t n_seq_resident = 0;   // of which resident (engine_options::n_seq_resident)
    std::string resident_reason;   // how n_seq_resident was chosen, for a start-up line
    int32_t n_gpu_layers = 0;      // layers llama.cpp offloaded (of n_layer)
    uint64_t device_free_bytes = 0, device_total_bytes = 0;  // the GPU's, at open (0: none)
    bool flash_attn = false;
    uint32_t chunk_tokens = 0;
    std::string kv_type;
    kv_mode mode = kv_mode::exact;
    std::string backend;           // "CPU" or "CUDA"
    int32_t n_threads = 0;
    uint64_t kv_bytes_per_token = 0;  // K+V, all attention layers (a sliding window's too)
    uint64_t kv_streams_bytes = 0;    // the KV the context allocated: n_seq_max streams of
                                      // n_ctx_seq cells (exact mode), or one of as many
                                      // (with pads_rows each stream has k_pad_cells more,
                                      // and llama.cpp rounds a stream up to 256 cells)
    bool pads_rows = false;           // small batches are padded (engine::pad_rows)
    // Measured at open (engine_options::free_splits): where small batches are padded and
    // the memory is plain attention, the same tokens prefilled in different decode calls
    // (each of 64 rows or more, every shorter one padded) gave the same bits. Then prefill
    // decodes in calls of chunk_tokens from wherever it starts, every call under 64 rows
    // padded, and may start at any position: a warm turn resumes at any token.
    bool splits_freely = false;
    double splits_probe_ms = 0;       // what measuring it took at open
    // Measured at open on the CPU (engine_options::exact_steps): a
    // decode step of one row alone gives other bits than the same row among others (other
    // jobs' rows, a draft), and two rows do not, and two rows cost at most
    // engine_options::steps_pad_max_cost (1.2x) one. Then a
    // lone row is decoded padded to two (decode_step), so an answer is the same decoded
    // alone, batched or drafted.
    bool pads_steps = false;
    // Measured with pads_steps: one row of each of two sequences gives the bits two rows of
    // one do (flash attention on). Then a lone row's pad goes into an empty sequence beside
    // it where there is one (its attention is over nothing), and a step's sequences whose
    // ids follow each other share a call; else the pad follows the row in its own sequence
    // and each sequence's rows are a call of their own.
    bool pads_beside = false;
    double steps_pad_cost = 0;    // two rows' time over one row's, as measured (0: not measured)
    // A step's rows give the same bits alone, beside others or with a draft (on the GPU:
    // not measured, false). Where false, drafts are off unless asked (default_draft_max).
    bool steps_exact = false;
    std::string n_ctx_reason;      // how n_ctx_seq was chosen, for a start-up line
    memory_info memory;            // what the model's memory is and what can be reused
};

// One token of one sequence in a batched decode step.
struct step_input {
    seq_id seq = 0;
    token_id token = 0;
    pos_t pos = 0;
    // Its sampling reads only the first maximum of the logits after it (greedy and nothing
    // else: generation_step::needs_first_max_only): decode_step then gives that index and
    // copies none of the n_vocab logits (a step of 65 rows of a 151,936-token vocabulary
    // would copy 39.5 MB, then read it again to pick).
    bool first_max_only = false;
};

class engine {
  public:
    // Loads the model and creates the context. Errors: not_found (no file),
    // invalid_argument (not a GGUF, bad option), engine_error (llama.cpp failed).
    static result<std::unique_ptr<engine>> open(const engine_options & opts);
    ~engine();
    engine(const engine &) = delete;
    engine & operator=(const engine &) = delete;

    const model_info & model() const;
    const context_info & context() const;
    const engine_options & options() const;

    // Text -> tokens. `parse_special` lets "<|im_start|>" become one control token.
    result<std::vector<token_id>> tokenize(std::string_view text, bool parse_special = true) const;
    result<std::string> detokenize(std::span<const token_id> tokens) const;
    // A token's text; a control token's ("<|channel|>") only when `special`, else "".
    std::string token_piece(token_id t, bool special = false) const;
    // The fill-in-the-middle tokens (prefix, suffix, middle), when the vocabulary has all three.
    std::optional<std::array<token_id, 3>> fim_tokens() const;
    // The text of every token that tokenize(text, true) parses as one special token
    // (control, user-defined and unknown tokens), longest first.
    std::vector<std::string> special_token_texts() const;
    // Renders messages through the model's own chat template.
    result<std::string> apply_chat_template(std::span<const chat_message> messages,
                                            bool add_generation_prompt) const;
    bool is_end_of_generation(token_id t) const;

    // Computes the KV of `tokens` at positions [pos0, pos0 + n) in sequence `seq`,
    // in canonical chunks (see plan_chunks). The sequence must hold exactly [0, pos0).
    // REQUIRES is_chunk_start(pos0, boundaries, chunk_tokens), unless the context splits
    // freely (context_info::splits_freely): then any pos0, and calls of chunk_tokens from
    // pos0 on whatever the boundaries, every call under 64 rows padded.
    // If `last_logits` is given, it receives the n_vocab logits after the last token.
    // Errors: invalid_argument (empty, bad seq), failed_precondition (pos0 not a chunk
    //         start, or the sequence does not hold exactly [0, pos0)),
    //         out_of_range (pos0 + n > n_ctx_seq), engine_error.
    // `chunk_tokens` 0 means the context's chunk_tokens; a smaller value is allowed
    // (it is part of the cache profile: KV made with one chunk size never serves another).
    // Where the memory needs checkpoints (memory_info::checkpoints), one is taken at every
    // chunk end in `checkpoint_ends` (sorted; empty: at every chunk end).
    status prefill(seq_id seq, std::span<const token_id> tokens, pos_t pos0,
                   std::span<const pos_t> boundaries, std::vector<float> * last_logits = nullptr,
                   int32_t chunk_tokens = 0, std::span<const pos_t> checkpoint_ends = {});

    // One llama_decode call of `tokens` at positions [pos, pos + n) of `seq` (n at most
    // chunk_tokens), the last token's logits requested, timed two ways: until
    // llama_decode returns (the host's share: batch split, slot search, graph build,
    // inputs such as the attention mask, kernel launches) and until the device is done
    // and the logits are read. A diagnostic for `warmctx-bench calls`: it skips
    // prefill's canonical-chunk check, so KV it makes is not warm == cold material.
    struct decode_timing { double host_ms = 0, total_ms = 0; };
    result<decode_timing> timed_decode(seq_id seq, std::span<const token_id> tokens, pos_t pos);

    // Rows a decode of `n` tokens starting at position `pos` is padded with (0: none).
    // With flash attention on the CPU, llama.cpp computes a batch of fewer than 64 query
    // rows one row at a time, each reading every KV cell before it; 64 rows or more take
    // its tiled path, several times cheaper per row once the sequence is deep (at 4k
    // tokens of the 0.5B model, 48 rows cost 789 ms and 64 rows 535 ms). So a batch whose
    // rows would cost clearly more alone than 64 rows do is padded to 64 with copies of
    // its last token at the positions after it, whose KV is removed again at once. The
    // choice is a pure function of the model's shape, `n` and `pos` (a cost model in
    // engine.cpp), so a warm prefill and its cold reference pad the same chunks; prompts
    // are unchanged and the cells a later prefill takes are the same. Never on a GPU or
    // without flash attention. Where the context splits freely, every call of 1 to 63 rows.
    int32_t pad_rows(int32_t n, pos_t pos) const;
    uint64_t padded_decodes() const;  // decodes padded so far
    uint64_t prefill_decodes() const;  // llama_decode calls prefill() made so far
    uint64_t checkpoints_taken() const;  // checkpoints taken so far (models that keep them)
    // The engine thread's time in taking them so far (out of the device and into host
    // memory), and the mean time one took (0 before the first).
    double checkpoint_ms() const;
    double checkpoint_mean_ms() const;
    static constexpr int32_t k_pad_to = 64;     // ggml's flash-attention query tile
    static constexpr uint32_t k_pad_cells = 64;  // cells each stream keeps for the padding

    // Generates after the last prefilled token of `seq`, whose logits are `logits`
    // (as returned by prefill). Greedy when temperature <= 0, else a seeded chain of
    // top-k, top-p, temperature and a distribution sampler. `logits_out`, if given,
    // receives each step's logits concatenated (n_vocab floats per generated token).
    // `drafts` (the prompt in it as its running text): where sp.draft_max > 0 and the
    // memory drops_a_draft, each decode carries the draft it proposes (warmctx/drafts.h); the
    // answer is the same as without.
    result<generation> generate(seq_id seq, std::vector<float> logits, const sampling_params & sp,
                                std::vector<float> * logits_out = nullptr, draft_index * drafts = nullptr);

    // One decode step for several sequences at once (continuous batching): each input's
    // token is appended to its sequence at `pos`; `logits` receives one n_vocab vector
    // per input, in order. A sequence may have several rows (a token and a draft after
    // it: warmctx/drafts.h), adjacent and at consecutive positions. REQUIRES at most
    // chunk_tokens inputs. Where `first_max` is given it receives one entry per input: for
    // an input marked first_max_only the index of its logits' first maximum (its `logits`
    // entry is left empty), else -1.
    // Errors (every llama_decode failure is mapped the same way, here and in prefill and
    // generate): resource_exhausted (no free KV slot), cancelled (aborted),
    // invalid_argument (a batch llama.cpp refused), engine_error (any other code).
    status decode_step(std::span<const step_input> inputs, std::vector<std::vector<float>> & logits,
                       std::vector<token_id> * first_max = nullptr);

    // Sequence operations (positions are token positions).
    // dst := src (dst is cleared first), its checkpoints included.
    status copy_seq(seq_id src, seq_id dst);
    // copy_seq, with the data copied before it returns (llama.cpp copies a stream at its
    // next decode: this decodes one token into dst and removes it; on a recurrent model,
    // whose state a copy shares until either decodes, into another sequence that is empty
    // where one is), so that the source may be changed, or either read or loaded as a
    // state, right away. REQUIRES dst's copy to hold fewer than n_ctx tokens. Errors:
    // those of decoding; dst is then empty.
    status copy_seq_now(seq_id src, seq_id dst);
    // Drops positions [from, end). Where the memory has checkpoints
    // (memory_info::checkpoints) and the cut needs one, the window or recurrent state is
    // replaced by the checkpoint at `from`. Errors: failed_precondition (no checkpoint at
    // `from`: the sequence is unchanged), engine_error.
    status trim_seq(seq_id seq, pos_t from);
    // The positions a sequence keeps checkpoints at, and the bytes they take.
    std::vector<pos_t> checkpoints(seq_id seq) const;
    uint64_t checkpoint_bytes_held() const;
    // Host memory allocated for moving states that holds none: the spare checkpoint buffers
    // kept for the next checkpoints, and (on a GPU) the page-locked buffer states pass through.
    uint64_t state_scratch_bytes() const;
    // Whether trim_seq(seq, from) can cut there: any position of plain KV (or of a window
    // whose cells there are real), else where a checkpoint is or at the sequence's end.
    bool can_trim(seq_id seq, pos_t from) const;
    // Forgets the checkpoint of `seq` at `n_tokens` (nothing where there is none): a cut
    // there then takes the one before it and prefills the rest.
    void drop_checkpoint(seq_id seq, pos_t n_tokens);
    void clear_seq(seq_id seq);
    void clear_all();
    pos_t seq_n_tokens(seq_id seq) const;      // max pos + 1, 0 if empty

    // llama.cpp copies a sequence's KV lazily, inside the next decode. Before reading
    // the state of a sequence that was the destination of copy_seq, force the pending
    // copies: this decodes one token into `scratch` (REQUIRES: empty) and removes it.
    status apply_pending_copies(seq_id scratch);

    // One sequence's state as bytes, and back. REQUIRES for save_seq: no copy into
    // `seq` pending (see apply_pending_copies). The bytes are llama.cpp's sequence state
    // as a one-stream context writes it (seq id 0), so they depend neither on this
    // context's stream count (n_seq_max in exact mode) nor on which sequence is saved:
    // a state loads into any context of the same model, KV type and mode whose
    // sequences hold its tokens. Only a model whose memory is one attention KV cache is
    // supported. Errors: save_seq engine_error (another memory layout); load_seq
    // corrupt (not save_seq's form, or llama.cpp refused it), out_of_range (more tokens
    // than a sequence holds here).
    result<std::vector<uint8_t>> save_seq(seq_id seq) const;
    status load_seq(seq_id seq, std::span<const uint8_t> bytes);
    // The same in llama.cpp's own layout for this context, with no conversion: for state
    // that never leaves this engine (the RAM pool), where a load is then one parse and
    // one copy of the KV. REQUIRES for load_seq_raw: bytes from save_seq_raw of this
    // engine (any sequence).
    result<std::vector<uint8_t>> save_seq_raw(seq_id seq) const;
    status load_seq_raw(seq_id seq, std::span<const uint8_t> bytes);
    // Between the two forms, without touching the KV streams: save_seq(s) is
    // portable_state(save_seq_raw(s)), and load_seq(s, b) loads raw_state(b, s).
    // Errors: corrupt (not the expected form), out_of_range (raw_state: more tokens than
    // a sequence holds here).
    result<std::vector<uint8_t>> portable_state(std::span<const uint8_t> raw) const;
    result<std::vector<uint8_t>> raw_state(std::span<const uint8_t> portable, seq_id seq) const;
    // truncate_seq_state for this model's states (either form): where the memory has
    // checkpoints, to a position with a checkpoint only (out_of_range otherwise).
    status truncate_state(std::vector<uint8_t> & state, pos_t n_tokens) const;

  private:
    friend class token_sampler;  // a grammar sampler needs the vocabulary
    struct impl;
    explicit engine(std::unique_ptr<impl> p);
    std::unique_ptr<impl> p_;
};

// Metadata of a GGUF file without loading its tensors (cheap). Errors as engine::open.
result<model_info> read_model_info(const std::string & path);

// The llama.cpp commit warmctx was built against (for the cache profile).
std::string_view llama_commit();
std::string_view backend_name();

// Cuts a plain model's sequence state of either form, in place, to the prefix [0, n_tokens): its
// first n_tokens cells, which must hold positions 0..n_tokens-1 in that order (a prefix
// prefilled or loaded at position 0 of an emptied stream, as every cached prefix is).
// Rewrites the bytes; no engine call, so no KV stream is needed to cut a copy.
// Errors (the state is then unchanged): corrupt (not a state of a plain attention KV
// cache, or cells out of that order), out_of_range (the state holds fewer than n_tokens
// cells), invalid_argument (n_tokens < 0).
status truncate_seq_state(std::vector<uint8_t> & state, pos_t n_tokens);

}  // namespace warmctx
