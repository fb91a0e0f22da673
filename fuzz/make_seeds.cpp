// Writes the generated seeds of fuzz/corpus/: snapshot files, profile, manifest and
// kind-table JSON, all made by warmctx's own writers from a small assembled prompt, so
// the seeds follow the formats as they are. Run it again when a format changes:
//
//   build-fuzz/fuzz/warmctx_fuzz_seeds fuzz/corpus
//
// (the request seeds of chat_request/, workspace_routes/ and json/ are written by hand).
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "fake_text_model.h"
#include "fuzz_common.h"
#include "warmctx/assembler.h"
#include "warmctx/kind_table.h"
#include "store/snapshot.h"

using namespace warmctx;

namespace {

void write(const std::string & path, const void * data, size_t n) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(static_cast<const char *>(data), static_cast<std::streamsize>(n));
    FUZZ_CHECK_MSG(f.good(), "cannot write " + path);
}
void write(const std::string & path, const std::string & text) { write(path, text.data(), text.size()); }
void write(const std::string & path, const std::vector<uint8_t> & bytes) { write(path, bytes.data(), bytes.size()); }

assembled_prompt sample_prompt(const profile & prof, bool generation_prompt) {
    static const testing::fake_text_model model;
    std::vector<segment> segs = {
        {"system", segment_kind::system, "", "", "You are a careful coding assistant."},
        {"map", segment_kind::repo_map, "src/map.txt", "", "src/\n  main.cc\n  util.h\n"},
        {"h0000", segment_kind::history, "", "assistant", "Earlier answer."},
        {"user", segment_kind::user, "", "", "What does main do?"},
    };
    auto prompt = assemble(segs, kind_table{}, model, prof, "tenant", prof.chunk_tokens, generation_prompt);
    FUZZ_CHECK_MSG(prompt.ok(), prompt.error().message());
    return *prompt;
}

// The snapshot of the first n_blocks blocks of `prompt`, with a few bytes of stand-in KV.
std::vector<uint8_t> snapshot_bytes(const assembled_prompt & prompt, const profile & prof, size_t n_blocks,
                                    const std::string & workspace) {
    snapshot_meta m;
    m.prof = prof;
    m.profile_fingerprint = prof.fingerprint();
    m.workspace = workspace;
    m.prompt_manifest = prompt.prompt_manifest;
    m.blocks.assign(prompt.blocks.begin(), prompt.blocks.begin() + static_cast<ptrdiff_t>(n_blocks));
    m.created_unix_ms = 1'700'000'000'000;
    std::vector<token_id> tokens(prompt.tokens.begin(), prompt.tokens.begin() + m.n_tokens());
    std::vector<uint8_t> kv(24);
    for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<uint8_t>(i * 37 + 11);
    auto bytes = encode_snapshot(m, tokens, kv);
    FUZZ_CHECK_MSG(bytes.ok(), bytes.error().message());
    return *bytes;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    profile prof = fuzz::fixture_profile();
    profile other = prof;
    other.yarn = "ext=1;attn=1;beta_fast=32;beta_slow=1;orig_ctx=32768";
    other.kv_mode = "shared";
    other.flash_attn = true;
    other.n_gpu_layers = -1;
    other.rope_freq_scale = 0.25f;

    const assembled_prompt prompt = sample_prompt(prof, true);
    FUZZ_CHECK(prompt.blocks.size() > 4);
    write(dir + "/snapshot/stable-prefix.wcsnap", snapshot_bytes(prompt, prof, 4, "ws-a"));
    write(dir + "/snapshot/one-block.wcsnap", snapshot_bytes(prompt, prof, 1, ""));
    write(dir + "/snapshot/whole-prompt.wcsnap",
          snapshot_bytes(prompt, prof, prompt.blocks.size(), "auto-0123456789abcdef"));

    write(dir + "/profile/default.json", dump_json(prof.to_json()));
    write(dir + "/profile/shared-yarn.json", dump_json(other.to_json(), 1));
    write(dir + "/manifest/with-generation-prompt.json", dump_json(prompt.prompt_manifest.to_json()));
    write(dir + "/manifest/without.json", dump_json(sample_prompt(prof, false).prompt_manifest.to_json(), 1));
    write(dir + "/kind_table/defaults.json", dump_json(kind_table{}.to_json()));
    write(dir + "/kind_table/overrides.json",
          R"({"kinds": {"repo_map": {"retention": "highest", "order": 2},)"
          R"( "history": {"role": "user", "segment_role": false, "header": true, "stability": "stable_ish"}}})");
    write(dir + "/kind_table/empty.json", "{}");
    std::printf("seeds written under %s\n", dir.c_str());
    return 0;
}
