// warmctx snapshot ls | show | verify | rm - the disk tier's files, from the outside.
//
// Every subcommand opens the directory scan-only: it never quarantines, never deletes a
// temp file (a running server may be writing it) and never evicts; only `rm` removes, and
// only what it is asked to.
#include <chrono>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "store/snapshot_store.h"

namespace warmctx::cli {
namespace {

struct snapshot_args {
    std::string cache_dir;
    bool json = false;
    std::vector<std::string> names;  // show / rm: file names or key hex prefixes
    bool all = false;                // rm --all
};

std::string default_cache_dir() { return default_disk_dir(); }

result<std::unique_ptr<snapshot_store>> open_scan_only(const snapshot_args & a) {
    snapshot_store_options o;
    o.dir = a.cache_dir.empty() ? default_cache_dir() : a.cache_dir;
    o.scan_only = true;
    auto s = snapshot_store::open(o);
    if (!s && s.error().code() == status_code::not_found)
        return not_found("snapshot directory '" + o.dir + "' does not exist");
    return s;
}

uint64_t now_unix_ms() {
    return (uint64_t)std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// "42s", "7m", "3h", "12d"
std::string age_text(uint64_t created_ms, uint64_t now_ms) {
    uint64_t s = now_ms > created_ms ? (now_ms - created_ms) / 1000 : 0;
    if (s < 120) return std::to_string(s) + "s";
    if (s < 7200) return std::to_string(s / 60) + "m";
    if (s < 172800) return std::to_string(s / 3600) + "h";
    return std::to_string(s / 86400) + "d";
}

nlohmann::json entry_json(const snapshot_entry & e, uint64_t now_ms) {
    return {
        {"file", e.file_name},
        {"key", e.key.chain.hex()},
        {"workspace", e.key.workspace},
        {"n_tokens", e.meta.n_tokens()},
        {"n_blocks", e.meta.blocks.size()},
        {"n_segments", e.meta.prompt_manifest.segments.size()},
        {"file_bytes", e.file_bytes},
        {"kv_bytes", e.kv_bytes},
        {"class", retention_class_name(e.meta.last_class())},
        {"profile_fingerprint", e.meta.profile_fingerprint.hex()},
        {"created_unix_ms", e.meta.created_unix_ms},
        {"age_s", now_ms > e.meta.created_unix_ms ? (now_ms - e.meta.created_unix_ms) / 1000 : 0},
    };
}

nlohmann::json rejected_json(const rejected_file & r) {
    return {{"file", r.file_name},
            {"defect", r.defect == snapshot_defect::none ? "io_error" : snapshot_defect_name(r.defect)},
            {"reason", r.reason}};
}

// The entries `name` designates: a whole file name, or a prefix (>= 4 hex digits) of keys.
result<std::vector<snapshot_entry>> resolve(const snapshot_store & store, const std::string & name) {
    std::vector<snapshot_entry> out;
    for (const snapshot_entry & e : store.list())
        if (e.file_name == name) return std::vector<snapshot_entry>{e};
    if (name.size() < 4) return invalid_argument("'" + name + "': give a file name or at least 4 hex digits of a key");
    for (const snapshot_entry & e : store.list())
        if (e.file_name.rfind(name, 0) == 0) out.push_back(e);
    if (out.empty()) return not_found("no snapshot matches '" + name + "' in " + store.options().dir);
    return out;
}

int run_ls(const snapshot_args & a) {
    auto s = open_scan_only(a);
    if (!s) return fail(s.error());
    const snapshot_store & store = **s;
    const uint64_t now = now_unix_ms();
    auto entries = store.list();
    auto rejected = store.rejected();
    uint64_t total = 0;
    for (const auto & e : entries) total += e.file_bytes;
    if (a.json) {
        nlohmann::json files = nlohmann::json::array(), bad = nlohmann::json::array();
        for (const auto & e : entries) files.push_back(entry_json(e, now));
        for (const auto & r : rejected) bad.push_back(rejected_json(r));
        nlohmann::json j = {{"dir", store.options().dir}, {"n_files", entries.size()}, {"total_bytes", total},
                            {"files", files}, {"rejected", bad}};
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("%-14s  %-20s  %8s  %12s  %-8s  %-12s  %6s\n", "key", "workspace", "tokens", "bytes", "class",
                "profile", "age");
    for (const auto & e : entries) {
        std::string ws = e.key.workspace.size() > 20 ? e.key.workspace.substr(0, 17) + "..." : e.key.workspace;
        std::printf("%-14s  %-20s  %8d  %12llu  %-8s  %-12s  %6s\n", e.key.chain.short_hex().c_str(), ws.c_str(),
                    e.meta.n_tokens(), (unsigned long long)e.file_bytes,
                    std::string(retention_class_name(e.meta.last_class())).c_str(),
                    e.meta.profile_fingerprint.short_hex().c_str(), age_text(e.meta.created_unix_ms, now).c_str());
    }
    std::printf("%zu files, %llu bytes in %s\n", entries.size(), (unsigned long long)total,
                store.options().dir.c_str());
    for (const auto & r : rejected)
        std::printf("BAD %s: %s\n", r.file_name.c_str(), r.reason.c_str());
    return 0;
}

int run_show(const snapshot_args & a) {
    auto s = open_scan_only(a);
    if (!s) return fail(s.error());
    const snapshot_store & store = **s;
    for (const auto & r : store.rejected())
        if (!a.names.empty() && r.file_name == a.names[0]) {
            return fail(corrupt(r.file_name + " fails its header check: " + r.reason));
        }
    auto found = resolve(store, a.names.at(0));
    if (!found) return fail(found.error());
    if (found->size() > 1) {
        std::string m = "'" + a.names[0] + "' matches " + std::to_string(found->size()) + " snapshots:";
        for (const auto & e : *found) m += " " + e.file_name;
        return fail(invalid_argument(m));
    }
    const snapshot_entry & e = found->front();
    const uint64_t now = now_unix_ms();
    if (a.json) {
        nlohmann::json j = entry_json(e, now);
        j["profile"] = e.meta.prof.to_json();
        j["manifest"] = e.meta.prompt_manifest.to_json();
        nlohmann::json blocks = nlohmann::json::array();
        for (const block & b : e.meta.blocks)
            blocks.push_back({{"chain", b.chain.hex()}, {"begin", b.begin}, {"end", b.end},
                              {"class", retention_class_name(b.retention)}, {"segment_index", b.segment_index}});
        j["blocks"] = blocks;
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("file        %s\n", e.file_name.c_str());
    std::printf("key         %s\n", e.key.chain.hex().c_str());
    std::printf("workspace   %s\n", e.key.workspace.c_str());
    std::printf("tokens      %d in %zu blocks (last block's class: %s)\n", e.meta.n_tokens(), e.meta.blocks.size(),
                std::string(retention_class_name(e.meta.last_class())).c_str());
    std::printf("bytes       %llu (KV %llu)\n", (unsigned long long)e.file_bytes, (unsigned long long)e.kv_bytes);
    std::printf("created     %s ago (unix ms %llu)\n", age_text(e.meta.created_unix_ms, now).c_str(),
                (unsigned long long)e.meta.created_unix_ms);
    std::printf("profile     %s\n", e.meta.profile_fingerprint.hex().c_str());
    for (const auto & [name, value] : e.meta.prof.canonical_fields())
        std::printf("  %-20s %s\n", std::string(name).c_str(), value.c_str());
    std::printf("manifest\n%s", e.meta.prompt_manifest.to_table().c_str());
    return 0;
}

int run_verify(const snapshot_args & a) {
    auto s = open_scan_only(a);
    if (!s) return fail(s.error());
    snapshot_store & store = **s;
    nlohmann::json files = nlohmann::json::array();
    int n_ok = 0, n_bad = 0;
    auto report = [&](const std::string & file, const std::string & what, bool ok) {
        if (ok) ++n_ok;
        else ++n_bad;
        if (a.json) files.push_back({{"file", file}, {"ok", ok}, {"detail", what}});
        else std::printf("%s %s%s%s\n", ok ? "ok " : "BAD", file.c_str(), what.empty() ? "" : ": ", what.c_str());
    };
    for (const auto & r : store.rejected()) report(r.file_name, r.reason, false);
    for (const snapshot_entry & e : store.list()) {
        // A full read: both checksums, the chain hashes against the tokens, the name.
        // Scan-only, so a bad file is reported and left where it is.
        auto l = store.load(e.key);
        if (l.ok())
            report(e.file_name,
                   std::to_string(e.meta.n_tokens()) + " tokens, " + std::to_string(e.file_bytes) + " bytes", true);
        else
            report(e.file_name, l.error().message(), false);
    }
    if (a.json) {
        nlohmann::json j = {{"dir", store.options().dir}, {"n_ok", n_ok}, {"n_bad", n_bad}, {"files", files}};
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::printf("%d ok, %d bad in %s\n", n_ok, n_bad, store.options().dir.c_str());
    }
    return n_bad > 0 ? 1 : 0;
}

int run_rm(const snapshot_args & a) {
    if (a.all == !a.names.empty()) {
        return fail(invalid_argument("rm: name snapshots (file names or key prefixes) or give --all"));
    }
    auto s = open_scan_only(a);
    if (!s) return fail(s.error());
    snapshot_store & store = **s;
    size_t n_removed = 0;
    if (a.all) {
        auto n = store.remove_all();
        if (!n) return fail(n.error());
        n_removed = *n;
    } else {
        for (const std::string & name : a.names) {
            // A file that failed its header check is not indexed; rm may still delete it.
            bool was_bad = false;
            for (const auto & r : store.rejected())
                if (r.file_name == name) was_bad = true;
            if (was_bad) {
                status st = posix_fs().remove_file(store.path_of(name));
                if (!st.ok()) return fail(st);
                ++n_removed;
                continue;
            }
            auto found = resolve(store, name);
            if (!found) return fail(found.error());
            if (found->size() > 1) {
                return fail(invalid_argument("'" + name + "' matches " + std::to_string(found->size()) +
                                             " snapshots; give more of the key or the file name"));
            }
            status st = store.remove(found->front().key);
            if (!st.ok()) return fail(st);
            ++n_removed;
        }
    }
    if (a.json) std::printf("%s\n", nlohmann::json({{"removed", n_removed}}).dump(2).c_str());
    else std::printf("removed %zu snapshot file%s\n", n_removed, n_removed == 1 ? "" : "s");
    return 0;
}

}  // namespace

void register_snapshot_commands(CLI::App & app, int & rc) {
    auto * snap = app.add_subcommand("snapshot", "list, inspect, verify and remove snapshot files (the disk tier)");
    snap->require_subcommand(1);
    auto add_common = [](CLI::App * c, snapshot_args & a) {
        c->add_option("--cache-dir", a.cache_dir, "snapshot directory (default: " + default_cache_dir() + ")");
        c->add_flag("--json", a.json, "print JSON");
    };

    auto ls = std::make_shared<snapshot_args>();
    auto * c_ls = snap->add_subcommand("ls", "list snapshot files: workspace, tokens, bytes, class, profile, age");
    add_common(c_ls, *ls);
    on_run(c_ls, rc, [ls] { return run_ls(*ls); });

    auto show = std::make_shared<snapshot_args>();
    auto * c_show = snap->add_subcommand("show", "one file's header, profile and manifest");
    add_common(c_show, *show);
    c_show->add_option("snapshot", show->names, "file name or key prefix (>= 4 hex digits)")->required()->expected(1);
    on_run(c_show, rc, [show] { return run_show(*show); });

    auto verify = std::make_shared<snapshot_args>();
    auto * c_verify = snap->add_subcommand("verify", "read every file fully and check it; non-zero exit if any is bad");
    add_common(c_verify, *verify);
    on_run(c_verify, rc, [verify] { return run_verify(*verify); });

    auto rm = std::make_shared<snapshot_args>();
    auto * c_rm = snap->add_subcommand("rm", "remove snapshot files");
    add_common(c_rm, *rm);
    c_rm->add_option("snapshots", rm->names, "file names or key prefixes");
    c_rm->add_flag("--all", rm->all, "remove every snapshot file in the directory");
    on_run(c_rm, rc, [rm] { return run_rm(*rm); });
}

}  // namespace warmctx::cli
