// warmctx/fs.h - the file-system seam (LevelDB's Env, in small): every file warmctx reads
// or writes (snapshots, model digests) goes through it.
//
// Everything warmctx writes to disk goes through a `file_system`, so the same code runs
// on the real OS (posix_fs), in memory (mem_fs: tests, and a model of what survives a
// crash) and under injected faults (faulty_fs). Paths are plain strings with '/'
// separators; no call resolves "~" or environment variables.
//
// Durability contract (what a caller may rely on after a crash, on every implementation):
//   - bytes appended to a file are durable only after that file's sync() returned ok;
//   - a create, rename or remove is durable only after sync_dir() of the directory that
//     holds the name returned ok (rename: of both directories, when they differ);
//   - rename() atomically replaces the target: after a crash the name refers to the old
//     file or to the new one, never to a mix and never to nothing (when the old existed);
//   - directory-entry changes become durable in the order they were made.
// So a durable replace is: write temp, sync(temp), close, rename(temp, final),
// sync_dir(dir) - and a crash anywhere in it leaves the old file or the new one.
//
// Errors: not_found (no such file or directory), io_error (the OS said no: the message
// carries the errno text, e.g. "No space left on device"), invalid_argument (bad path).
// Implementations are thread-safe: calls may come from several threads at once (one
// writable_file / readable_file object is used by one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "warmctx/status.h"

namespace warmctx {

// A file being written, from offset 0, append only.
class writable_file {
  public:
    virtual ~writable_file() = default;  // closes without syncing if close() was not called
    // Appends all of `data` (short writes and EINTR are retried inside). On error some
    // prefix of `data` may have been written.
    virtual status append(std::span<const uint8_t> data) = 0;
    // fsync: makes every byte appended so far durable (not the file's name: see sync_dir).
    virtual status sync() = 0;
    // Closes the file; the object accepts no more calls but the destructor.
    virtual status close() = 0;
};

// A file opened for reading. All reads see the file as it was opened: a rename over
// its name afterwards does not change what this object reads (POSIX fd semantics).
class readable_file {
  public:
    virtual ~readable_file() = default;
    virtual uint64_t size() const = 0;
    // Reads exactly n bytes at `offset` into dst. Errors: out_of_range when
    // [offset, offset + n) is not inside the file, io_error.
    virtual status read_at(uint64_t offset, size_t n, uint8_t * dst) const = 0;
};

// What identifies one version of a file: a change of any field means the bytes may have
// changed. ctime and the inode catch a same-size rewrite with a restored mtime (cp -p,
// rsync -t) and a replace by rename.
struct file_version {
    uint64_t size = 0;
    int64_t mtime_ns = 0, ctime_ns = 0;
    uint64_t inode = 0, device = 0;
    bool operator==(const file_version &) const = default;
};

class file_system {
  public:
    virtual ~file_system() = default;

    // Creates (or truncates) `path` for writing. The parent directory must exist.
    virtual result<std::unique_ptr<writable_file>> create_file(const std::string & path) = 0;
    virtual result<std::unique_ptr<readable_file>> open_readable(const std::string & path) = 0;
    // Bytes in the file. Errors: not_found.
    virtual result<uint64_t> file_size(const std::string & path) = 0;
    // The version of a regular file. Errors: not_found, io_error (not a regular file).
    virtual result<file_version> stat_file(const std::string & path) = 0;
    // Atomically replaces `to` by `from` (see the durability contract).
    virtual status rename_file(const std::string & from, const std::string & to) = 0;
    virtual status remove_file(const std::string & path) = 0;
    // The names (not paths) of the entries of `dir`, files and directories, without
    // "." and "..", sorted byte-wise.
    virtual result<std::vector<std::string>> list_dir(const std::string & dir) = 0;
    // mkdir -p; ok when the directory exists. The new directories are durable on
    // return (their parents are synced).
    virtual status create_dirs(const std::string & dir) = 0;
    // fsync of a directory: makes its entries' creates, renames and removes durable.
    virtual status sync_dir(const std::string & dir) = 0;
    // Whether `path` itself is a symbolic link (not followed); false when it does not
    // exist. A store refuses to write, read or remove through a link inside its own
    // directory (it could lead anywhere). File systems without links answer false.
    virtual result<bool> is_link(const std::string & path) {
        (void)path;
        return false;
    }

    // Helpers over the calls above.
    result<std::vector<uint8_t>> read_file(const std::string & path);
    // Up to n bytes from `offset` (fewer when the file is shorter; none past its end).
    result<std::vector<uint8_t>> read_range(const std::string & path, uint64_t offset, uint64_t n);
    // Creates, appends, syncs and closes: a file that is complete on disk but whose
    // NAME is durable only after sync_dir.
    status write_file(const std::string & path, std::span<const uint8_t> data);
};

// The real OS. open/write/fsync/rename/unlink, pread for reads; EINTR and short writes
// retried; errno text in every error message. Opening for reading never blocks: a FIFO
// or device where a file was expected is refused (io_error), not waited on. One
// process-wide instance.
file_system & posix_fs();

// ---- in memory ----------------------------------------------------------------------

// An in-memory file system that models what survives a crash (see the durability
// contract): each file keeps its bytes as of its last sync(), and the directory entries
// keep a journal of creates, renames and removes since they were last made durable.
// sync_dir(d) makes durable every journalled change up to the last one that touched d
// (a journal commit: ordered, like ext4's). Directories themselves are durable as soon
// as create_dirs returns. Readers get a copy of the file at open time.
class mem_fs final : public file_system {
  public:
    mem_fs();
    ~mem_fs() override;

    result<std::unique_ptr<writable_file>> create_file(const std::string & path) override;
    result<std::unique_ptr<readable_file>> open_readable(const std::string & path) override;
    result<uint64_t> file_size(const std::string & path) override;
    result<file_version> stat_file(const std::string & path) override;
    status rename_file(const std::string & from, const std::string & to) override;
    status remove_file(const std::string & path) override;
    result<std::vector<std::string>> list_dir(const std::string & dir) override;
    status create_dirs(const std::string & dir) override;
    status sync_dir(const std::string & dir) override;

    // Simulates a power cut and a reboot: every file goes back to its bytes as of its
    // last sync and every directory entry to its durable state. With a non-zero seed the
    // crash is less kind but still within the contract: each file keeps a pseudo-random
    // prefix of its unsynced appended bytes, and a pseudo-random prefix of the
    // not-yet-durable directory journal survives. Handles of files open at the crash
    // must not be used afterwards.
    void crash(uint64_t seed = 0);

    // A disk of `bytes` (0 = unlimited, the default): an append that would take the live
    // files' bytes beyond it writes nothing and fails with "No space left on device
    // (ENOSPC)", as a full disk does; removing files frees their bytes.
    void set_capacity(uint64_t bytes);

    // Test helpers: overwrite bytes / truncate a file in place (no durability games:
    // the change is durable at once).
    status corrupt_byte(const std::string & path, uint64_t offset, uint8_t xor_mask);
    status truncate(const std::string & path, uint64_t n_bytes);

    struct state;  // opaque; shared with the open file handles

  private:
    std::shared_ptr<state> s_;
};

// ---- faults -------------------------------------------------------------------------

// The mutating operations faulty_fs counts. Reads are counted apart (n_reads).
enum class fs_op : uint8_t { create, append, sync, close, rename, remove, create_dirs, sync_dir };
std::string_view fs_op_name(fs_op op);

enum class fs_fault : uint8_t {
    io_error,     // the op fails with io_error and does nothing
    short_write,  // append: writes the first half of the data, then fails
    no_space,     // append: writes nothing, fails with "No space left on device (ENOSPC)"
    sync_fails,   // sync / sync_dir: fails and makes nothing durable
    torn_write,   // append: writes the first half and returns ok (a lying device)
    bit_flip,     // append: flips one bit of the data written and returns ok (silent corruption)
    crash,        // the op does not happen and neither does any later one: every call
                  // fails with io_error("crashed") until reset(). Pair with mem_fs::crash().
};
std::string_view fs_fault_name(fs_fault f);

// Wraps another file system and injects faults, deterministically: by the index of a
// mutating operation (counted from 0 over all kinds, since construction or reset()), by
// the n-th operation of one kind, or pseudo-randomly from a seed. A fault that does not
// apply to the op it lands on (short_write on a rename) acts as io_error.
class faulty_fs final : public file_system {
  public:
    explicit faulty_fs(file_system & base);
    ~faulty_fs() override;

    // The op_index-th mutating operation (from 0) gets `f`.
    void inject_at(uint64_t op_index, fs_fault f);
    // The nth (from 0) operation of kind `op` gets `f`.
    void inject_on(fs_op op, uint64_t nth, fs_fault f);
    // Every mutating op of a kind in `faults`' applicable set fails with probability
    // `p`, drawn from a generator seeded with `seed`; the fault is picked from `faults`.
    void inject_random(uint64_t seed, double p, std::vector<fs_fault> faults);
    // Forgets every rule, the crashed state and the counters.
    void reset();

    bool crashed() const;
    uint64_t n_ops() const;                // mutating operations attempted so far
    uint64_t n_faults() const;             // faults injected so far
    uint64_t n_reads(const std::string & path) const;  // open_readable calls on a path
    uint64_t n_reads_total() const;

    result<std::unique_ptr<writable_file>> create_file(const std::string & path) override;
    result<std::unique_ptr<readable_file>> open_readable(const std::string & path) override;
    result<uint64_t> file_size(const std::string & path) override;
    result<file_version> stat_file(const std::string & path) override;
    status rename_file(const std::string & from, const std::string & to) override;
    status remove_file(const std::string & path) override;
    result<std::vector<std::string>> list_dir(const std::string & dir) override;
    status create_dirs(const std::string & dir) override;
    status sync_dir(const std::string & dir) override;
    result<bool> is_link(const std::string & path) override { return base_.is_link(path); }

    struct state;  // opaque; shared with the open file handles

  private:
    file_system & base_;
    std::shared_ptr<state> s_;
};

}  // namespace warmctx
