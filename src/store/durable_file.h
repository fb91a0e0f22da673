// store/durable_file.h - how the store layer replaces a file and sets a damaged one aside,
// over the file-system seam (warmctx/fs.h), for the snapshot store and the workspace store
// alike.
//
// Replacing a file: write it under a temporary name in the same directory, fsync it, close
// it, rename it over the final name, fsync the directory - so that a crash leaves the old
// file or the new one, complete (fs.h's durability contract). The temporary name is unique
// to the process and the write, so two writers of one name (two stores in one process, two
// processes on one directory) never write the same temporary file; a reader at start
// removes what a crash left (names ending in the temporary suffix).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "warmctx/fs.h"
#include "warmctx/status.h"

namespace warmctx {

inline constexpr std::string_view k_temp_file_suffix = ".tmp";

// "<final_name>.<pid>-<n>.tmp", n counting the calls of this process.
std::string unique_temp_name(std::string_view final_name);
bool is_temp_file_name(std::string_view name);

// A file being written under a temporary name, to be renamed over its final name.
// Destroyed before commit() (or after a failed step), it removes the temporary file.
class durable_file {
  public:
    // Creates `dir`/`temp_name` (a unique_temp_name of `final_name`). Errors: create_file's.
    static result<durable_file> create(file_system & fs, std::string dir, std::string final_name,
                                       std::string temp_name);
    durable_file(durable_file && o) noexcept;
    durable_file & operator=(durable_file &&) = delete;
    ~durable_file();

    writable_file & out() { return *file_; }
    // fsync and close: the temporary file is complete on disk. Errors: sync's, close's
    // (the temporary file is then removed).
    status finish();
    // REQUIRES finish() succeeded. Renames the file over its final name, then fsyncs the
    // directory. Errors: the rename's (the temporary file is removed, the old file stays).
    // The directory sync's outcome goes to `dir_sync`; without it, a failed directory sync
    // is the error (the new file is in place, but a crash may lose the rename).
    status commit(status * dir_sync = nullptr);
    // Removes the temporary file now (as the destructor would).
    void discard();

  private:
    durable_file(file_system & fs, std::string dir, std::string final_name, std::string temp_name,
                 std::unique_ptr<writable_file> file);
    file_system * fs_;
    std::string dir_, final_name_, temp_name_;
    std::unique_ptr<writable_file> file_;
    bool done_ = false;  // committed or discarded: nothing left to remove
};

// The whole of `bytes` as `dir`/`final_name`, through a durable_file. Errors: any step's,
// the directory's sync included; on error the temporary file is gone and the old file
// (if any) is whole.
status write_file_durably(file_system & fs, const std::string & dir, const std::string & final_name,
                          std::span<const uint8_t> bytes);

// Sets a damaged file aside: renames `path` to `quarantine_dir`/`name` (the directory must
// exist), writes `name`.reason beside it when `reason` is not empty (best effort: it is
// for a person; the file is what matters), and fsyncs the quarantine directory. false when
// the rename failed: the file is still at `path`.
bool quarantine_file(file_system & fs, const std::string & path, const std::string & quarantine_dir,
                     const std::string & name, std::string_view reason = {});

}  // namespace warmctx
