// server/workspace_store.h - segments stored server-side, per workspace, so a client
// sends only the volatile tail each turn (POST /v1/workspaces/{id}/chat/completions).
//
// Bounded: a number of workspaces, segments per workspace, bytes per segment and bytes
// in all (a segment's bytes = id + content + path + role). A PUT that would cross a
// bound is refused with nothing changed: 413 when the one segment is too large, 429
// when the store (or the workspace) is full.
//
// Durable when given a directory (`serve` puts it beside the disk tier's snapshots, in
// <cache dir>/workspaces): one file per segment, <dir>/<workspace>/<xxh3 of its id>.wcseg,
// and one per workspace for its use count, <dir>/<workspace>/uses.wcmeta. Each file is
// "warmctx-store 1 <xxh3-128 of the body>\n" + a JSON body, written as the disk tier
// writes a snapshot: a temporary file, fsync, rename, fsync of the directory, so a crash
// leaves the old file or the new one. A PUT or DELETE changes memory only once its file
// change is durable (a failed write is a 507 and changes nothing). load() reads them
// back at start: a file that fails its checksum or its checks goes to <dir>/.quarantine/
// (the newest 16 kept), a temporary file left by a crash is removed.
//
// Thread safety: every member is safe to call from any thread; `mu_` guards the map.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "api_error.h"
#include "warmctx/fs.h"
#include "warmctx/kind_table.h"
#include "warmctx/segments.h"

namespace warmctx::server_detail {

struct store_limits {
    size_t max_workspaces = 1024;
    size_t max_segments_per_workspace = 4096;
    size_t max_segment_bytes = 4u << 20;
    size_t max_store_bytes = 256u << 20;
};

// Where a durable store keeps its files.
struct store_persistence {
    file_system * fs = nullptr;  // nullptr: memory only
    std::string dir;
};

// What load() found.
struct store_load_report {
    size_t n_workspaces = 0, n_segments = 0;
    size_t n_quarantined = 0;  // damaged files moved to .quarantine/
    size_t n_skipped = 0;      // sound files refused now (a kind the kind table lacks, a bound)
    std::vector<std::string> problems;  // one line per quarantined or skipped file
};

class workspace_store {
  public:
    explicit workspace_store(store_limits limits, store_persistence persist = {})
        : limits_(limits), persist_(std::move(persist)) {}

    bool durable() const { return persist_.fs != nullptr; }
    // Reads the persisted store (once, at start, before any other call). Errors: io_error
    // (the directory cannot be created or listed).
    result<store_load_report> load(const kind_table & kinds);

    // Creates or replaces `seg` in `ws` (REQUIRES: ids already validated). `created`
    // says which; `changed` (optional) whether anything differs from what was stored.
    // Errors: 413 (segment too large), 429 (a bound is reached), 507 (durable store: the
    // file could not be written; nothing changed).
    maybe_error put(const std::string & ws, segment seg, bool & created, bool * changed = nullptr);
    std::optional<segment> get(const std::string & ws, const std::string & id) const;
    // The workspace's segments ordered by id; nullopt when it has none stored.
    std::optional<std::vector<segment>> list(const std::string & ws) const;
    // The stored workspace ids, sorted.
    std::vector<std::string> workspaces() const;
    // false: no such segment. Errors: 507 (durable: the file could not be removed).
    result<bool> erase(const std::string & ws, const std::string & id);
    // Removes the workspace; returns how many segments it held. Errors: 507.
    result<size_t> drop(const std::string & ws);

    // A chat used the workspace (counted for use_order; persisted by flush_uses).
    void note_use(const std::string & ws);
    // The stored workspaces, most used first (then most recently used).
    std::vector<std::string> use_order() const;
    // Writes the use counts that changed since the last flush (durable store).
    status flush_uses();

    size_t n_bytes() const;
    size_t n_segments() const;
    uint64_t n_write_failures() const;

  private:
    static size_t bytes_of(const segment & s) { return s.id.size() + s.content.size() + s.path.size() + s.role.size(); }

    struct use_record {
        uint64_t uses = 0;
        int64_t last_used_unix_ms = 0;
        bool dirty = false;
    };
    // Checks the bounds for putting `seg` (nb bytes) into `ws`; `old` is set to the
    // stored segment of that id, if any. Called with mu_ held.
    maybe_error check_put(const std::string & ws, const segment & seg, size_t nb, const segment *& old) const;
    void insert_locked(const std::string & ws, segment seg, const segment * old);
    std::string ws_dir(const std::string & ws) const { return persist_.dir + "/" + ws; }
    std::string seg_path(const std::string & ws, const std::string & id) const;
    status write_sealed(const std::string & dir, const std::string & name, const std::string & body);
    void quarantine(const std::string & path, const std::string & name, const std::string & why, store_load_report & rep);

    store_limits limits_;
    store_persistence persist_;
    mutable std::mutex mu_;
    std::map<std::string, std::map<std::string, segment>> ws_;  // guarded by mu_
    std::map<std::string, use_record> uses_;                     // guarded by mu_
    size_t n_bytes_ = 0;                                         // guarded by mu_
    size_t n_segments_ = 0;                                      // guarded by mu_
    uint64_t n_write_failures_ = 0;                              // guarded by mu_
};

// 507 store_write_failed: a durable store could not write (the disk is full, say).
api_error store_write_error(const status & st);

// The sealed file format of a durable store: header line + body. unseal checks the
// header and the checksum; errors: data_loss naming what is wrong.
std::string seal_store_file(const std::string & body);
result<std::string> unseal_store_file(const std::vector<uint8_t> & bytes);

// The segments of a chat on a stored workspace: the stored segments (in their order,
// by id) except those whose id one of the request's segments also has, then the
// request's segments in their order. A request segment replaces the stored one of the
// same id for this request only; the store is not changed. Nothing is validated here
// (validate_segments runs on the result: duplicate ids within the request stay
// duplicates, and are refused there).
std::vector<segment> merge_stored_segments(std::vector<segment> stored, std::vector<segment> request);

}  // namespace warmctx::server_detail
