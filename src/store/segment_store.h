// store/segment_store.h - segments stored server-side, per workspace, so a client
// sends only the volatile tail each turn (POST /v1/workspaces/{id}/chat/completions).
//
// Bounded: a number of workspaces, segments per workspace, bytes per segment and bytes
// in all (a segment's bytes = id + content + path + role). A put that would cross a
// bound is refused with nothing changed, and says which bound (store_refusal).
//
// Durable when given a directory (`serve` puts it beside the disk tier's snapshots, in
// <cache dir>/workspaces; the format is docs/workspace-store-format.md): one file per
// segment, <dir>/<workspace>/<xxh3 of its id>.wcseg, and one per workspace for its use
// count, <dir>/<workspace>/uses.wcmeta. Each file is
// "warmctx-store 1 <xxh3-128 of the body>\n" + a JSON body, written as the disk tier
// writes a snapshot (store/durable_file.h: a temporary file, fsync, rename, fsync of the
// directory), so a crash leaves the old file or the new one. A put or an erase changes
// memory only once its file change is durable (a failed write changes nothing). load()
// reads them back at start: a file that fails its checksum or its checks goes to
// <dir>/.quarantine/ (the newest 16 kept), a temporary file left by a crash is removed.
//
// Shared (store_persistence::shared: several processes' stores on one directory, as
// replicas behind a load balancer): the files are the truth, memory a view of them. get,
// list, put, erase and drop first re-read the workspace's directory (names and stat; a
// file is read only when new or changed), so a segment another process PUT is seen, and
// one it removed is gone; load() leaves a temp file younger than shared_temp_grace_ms
// alone (another process's write in progress). Two processes that PUT one segment at once
// leave one of the two whole files (the later rename). The bounds are the directory's:
// a file in it was admitted by some process's put, so a refresh or a load reads every
// sound file (only a segment larger than max_segment_bytes is refused), and a put checks
// max_workspaces and max_store_bytes against the whole directory (re-read first, at most
// every shared_refresh_ms, and always before a new workspace's first segment).
// workspaces() re-reads the whole directory the same way; the use counts file is the last
// writer's.
//
// Thread safety: every member is safe to call from any thread; `mu_` guards the map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/fs.h"
#include "warmctx/kind_table.h"
#include "warmctx/segments.h"
#include "warmctx/status.h"

namespace warmctx {

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
    // The disk is shared with a cache that may give room back (the disk tier's
    // snapshots): a write that fails for a full disk asks it for room (at least the
    // bytes it needs; it returns the bytes freed) and, when some were freed, is tried
    // once more. Unset: a full disk fails the write.
    std::function<uint64_t(uint64_t)> make_room;
    // Other processes use the directory too (see "Shared" above).
    bool shared = false;
    int64_t shared_temp_grace_ms = 10 * 60 * 1000;
    int64_t shared_refresh_ms = 250;  // how stale the whole directory's view may be
};

// What load() found.
struct store_load_report {
    size_t n_workspaces = 0, n_segments = 0;
    size_t n_quarantined = 0;  // damaged files moved to .quarantine/
    size_t n_skipped = 0;      // sound files refused now (a kind the kind table lacks, a bound)
    std::vector<std::string> problems;  // one line per quarantined or skipped file
};

// Why a put changed nothing.
enum class store_refusal {
    none,
    segment_too_large,  // over max_segment_bytes
    store_full,         // max_workspaces or max_store_bytes reached
    workspace_full,     // max_segments_per_workspace reached
    write_failed,       // durable store: the file could not be written
};

class segment_store {
  public:
    explicit segment_store(store_limits limits, store_persistence persist = {})
        : limits_(limits), persist_(std::move(persist)) {}

    bool durable() const { return persist_.fs != nullptr; }
    // Reads the persisted store (once, at start, before any other call). A directory whose
    // name `is_workspace_id` refuses is left alone (a problem line). Errors: io_error (the
    // directory cannot be created or listed).
    result<store_load_report> load(const kind_table & kinds,
                                   const std::function<bool(std::string_view)> & is_workspace_id);

    // Creates or replaces `seg` in `ws` (REQUIRES: ids already validated). `created`
    // says which; `changed` (optional) whether anything differs from what was stored.
    // Errors: resource_exhausted (a bound; `refusal` says which), or the file system's
    // (durable store: the file could not be written; nothing changed). `refusal`
    // (optional) is none on success.
    status put(const std::string & ws, segment seg, bool & created, bool * changed = nullptr,
               store_refusal * refusal = nullptr);
    std::optional<segment> get(const std::string & ws, const std::string & id) const;
    // The workspace's segments ordered by id; nullopt when it has none stored.
    std::optional<std::vector<segment>> list(const std::string & ws) const;
    // The stored workspace ids, sorted.
    std::vector<std::string> workspaces() const;
    // false: no such segment. Errors: the file system's (durable: the file could not be
    // removed).
    result<bool> erase(const std::string & ws, const std::string & id);
    // Removes the workspace; returns how many segments it held. Errors: the file system's.
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
    // `admitted`: the segment is a file of a shared directory another put already
    // checked; only its size is checked again.
    status check_put(const std::string & ws, const segment & seg, size_t nb, const segment *& old,
                     store_refusal & refusal, bool admitted = false) const;
    void insert_locked(const std::string & ws, segment seg, const segment * old);
    // One file of a workspace's directory at load. Called with mu_ held.
    void load_file(const std::string & ws, const std::string & name, const kind_table & kinds,
                   const std::string & stamp, store_load_report & rep);
    std::string ws_dir(const std::string & ws) const { return persist_.dir + "/" + ws; }
    // A workspace directory that is a symbolic link is not the store's: nothing is read,
    // written or removed through it (failed_precondition; false when it is not a link).
    status check_not_link(const std::string & dir) const;
    std::string seg_path(const std::string & ws, const std::string & id) const;
    status write_sealed(const std::string & dir, const std::string & name, const std::string & body);
    void quarantine(const std::string & path, const std::string & name, const std::string & why,
                    store_load_report & rep);

    // A shared store: `ws`'s directory into memory (see "Shared"). Called with mu_ held;
    // const because readers call it: the view it changes is mutable.
    void refresh_locked(const std::string & ws) const;
    // A shared store: every workspace directory (and those of the view that are gone), at
    // most every shared_refresh_ms unless `now`. Called with mu_ held.
    void refresh_all_locked(bool now) const;
    void erase_locked(const std::string & ws, const std::string & id) const;
    // A segment file as it was read: its version, and the id it held ("" when refused).
    struct seen_file {
        file_version version;
        std::string id;
    };

    store_limits limits_;
    store_persistence persist_;
    kind_table kinds_;                                                   // load()'s, for refresh
    std::function<bool(std::string_view)> is_workspace_id_;               // load()'s, for refresh
    mutable int64_t last_full_refresh_ms_ = 0;                            // guarded by mu_
    mutable std::mutex mu_;
    // The view of the files (a shared store's readers refresh it, hence mutable).
    mutable std::map<std::string, std::map<std::string, segment>> ws_;    // guarded by mu_
    mutable std::map<std::string, std::map<std::string, seen_file>> seen_;  // shared: by ws, file name
    std::map<std::string, use_record> uses_;                              // guarded by mu_
    mutable size_t n_bytes_ = 0;                                          // guarded by mu_
    mutable size_t n_segments_ = 0;                                       // guarded by mu_
    uint64_t n_write_failures_ = 0;                                       // guarded by mu_
};

// The sealed file format of a durable store: header line + body. unseal checks the
// header and the checksum; errors: corrupt, naming what is wrong.
std::string seal_store_file(const std::string & body);
result<std::string> unseal_store_file(const std::vector<uint8_t> & bytes);

}  // namespace warmctx
