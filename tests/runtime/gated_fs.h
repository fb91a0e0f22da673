// A file system that holds snapshot writes at a gate the test controls: create_file of a
// temp file (a snapshot_store put's first step) waits while the gate is closed, and so,
// when asked (gate_quarantine), does a rename into quarantine/. The test
// can wait until a write has reached the gate, so nothing is synchronised by sleeping.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "warmctx/fs.h"

namespace warmctx::testing {

class gated_fs final : public file_system {
  public:
    explicit gated_fs(file_system & base) : base_(base) {}

    void close_gate() {
        std::lock_guard lk(mu_);
        open_ = false;
    }
    void open_gate() {
        {
            std::lock_guard lk(mu_);
            open_ = true;
        }
        cv_.notify_all();
    }
    // Waits until `n` writes have reached the gate since construction.
    void wait_entered(uint64_t n) {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return n_entered_ >= n; });
    }
    uint64_t n_entered() const {
        std::lock_guard lk(mu_);
        return n_entered_;
    }
    uint64_t n_opens_for_read() const {
        std::lock_guard lk(mu_);
        return n_reads_;
    }

    result<std::unique_ptr<writable_file>> create_file(const std::string & path) override {
        if (path.size() > 4 && path.compare(path.size() - 4, 4, ".tmp") == 0) {
            std::unique_lock lk(mu_);
            ++n_entered_;
            cv_.notify_all();
            cv_.wait(lk, [&] { return open_; });
        }
        return base_.create_file(path);
    }
    result<std::unique_ptr<readable_file>> open_readable(const std::string & path) override {
        {
            std::lock_guard lk(mu_);
            ++n_reads_;
        }
        return base_.open_readable(path);
    }
    result<uint64_t> file_size(const std::string & path) override { return base_.file_size(path); }
    result<file_version> stat_file(const std::string & path) override { return base_.stat_file(path); }
    // A rename into a quarantine/ directory waits at the gate too when gate_quarantine().
    void gate_quarantine() {
        std::lock_guard lk(mu_);
        quarantine_too_ = true;
    }
    status rename_file(const std::string & from, const std::string & to) override {
        if (to.find("/quarantine/") != std::string::npos) {
            std::unique_lock lk(mu_);
            if (quarantine_too_) {
                ++n_entered_;
                cv_.notify_all();
                cv_.wait(lk, [&] { return open_; });
            }
        }
        return base_.rename_file(from, to);
    }
    status remove_file(const std::string & path) override { return base_.remove_file(path); }
    result<std::vector<std::string>> list_dir(const std::string & dir) override { return base_.list_dir(dir); }
    status create_dirs(const std::string & dir) override { return base_.create_dirs(dir); }
    status sync_dir(const std::string & dir) override { return base_.sync_dir(dir); }

  private:
    file_system & base_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool open_ = true;
    bool quarantine_too_ = false;
    uint64_t n_entered_ = 0;
    uint64_t n_reads_ = 0;
};

// Opens the gate when it goes out of scope: declared after the object that writes
// through it, a failed assertion does not leave that object's destructor waiting on a
// closed gate.
struct gate_opener {
    gated_fs & fs;
    ~gate_opener() { fs.open_gate(); }
};

// The snapshot files (not temp files, not quarantine/) in `dir`.
inline std::vector<std::string> snapshot_files(file_system & fs, const std::string & dir) {
    std::vector<std::string> out;
    auto names = fs.list_dir(dir);
    if (!names.ok()) return out;
    for (const auto & n : *names)
        if (n.size() > 7 && n.compare(n.size() - 7, 7, ".wcsnap") == 0) out.push_back(n);
    return out;
}

}  // namespace warmctx::testing
