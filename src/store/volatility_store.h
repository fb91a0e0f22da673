// store/volatility_store.h - what each workspace has learned about its segments
// (warmctx/volatility.h: change rates, the learned order, finer blocks, the habits of its
// conversation), kept on disk so that a restart keeps it.
//
// One file per workspace, <dir>/<xxh3-128 of its name, hex>.json, in the format of
// docs/volatility-format.md. Written as the other stores write (store/durable_file.h: a
// temporary file, fsync, rename over the name, fsync of the directory), so a crash leaves
// the old file or the new one, whole; and on a thread of the store's own, so a slow or
// stuck disk never holds the caller (the engine thread). A file that cannot be read as the
// format is moved to <dir>/quarantine/ (the newest k_max_quarantined kept) and reads as
// nothing learned: the workspace learns again.
//
// Thread safety: every call may be made from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "warmctx/fs.h"
#include "warmctx/status.h"
#include "warmctx/volatility.h"

namespace warmctx {

struct volatility_store_stats {
    uint64_t n_reads = 0;          // files read (a workspace seen for the first time)
    uint64_t n_writes = 0;         // files written, durably
    uint64_t n_write_failures = 0; // writes that failed (said on stderr; the next one tries again)
    uint64_t n_quarantined = 0;    // unreadable files set aside
};

class volatility_store {
  public:
    static constexpr size_t k_max_quarantined = 16;
    // A larger file is not this format: it is set aside unread.
    static constexpr uint64_t k_max_file_bytes = uint64_t{4} << 20;

    // Keeps the files in `dir` (created if missing). A `dir` that is a symbolic link could
    // lead anywhere: failed_precondition, and the caller keeps what it learns in memory.
    // Errors: failed_precondition (a link), io_error (the directory cannot be made).
    static result<std::unique_ptr<volatility_store>> open(file_system & fs, std::string dir);
    // Writes what is pending, then joins the writer.
    ~volatility_store();
    volatility_store(const volatility_store &) = delete;
    volatility_store & operator=(const volatility_store &) = delete;

    // What `workspace` learned, read from its file: nullopt when there is none, or it was
    // unreadable (then quarantined). A write queued for it and not yet done is what it
    // reads.
    std::optional<volatility_state> read(const std::string & workspace);
    // Queues `workspace`'s state for the writer (a newer put of it replaces a pending one).
    void put(const std::string & workspace, const volatility_state & st);
    // Queues the removal of `workspace`'s file.
    void remove(const std::string & workspace);
    // Waits until every put and remove queued before the call is done.
    void flush();

    volatility_store_stats stats() const;
    const std::string & dir() const;
    // The file of `workspace`.
    std::string path_of(const std::string & workspace) const;

  private:
    struct impl;
    explicit volatility_store(std::unique_ptr<impl> p);
    std::unique_ptr<impl> p_;
};

}  // namespace warmctx
