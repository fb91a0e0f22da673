// faulty_fs: injects faults into another file system, deterministically.
#include <map>
#include <mutex>
#include <optional>
#include <random>

#include "warmctx/fs.h"

namespace warmctx {

std::string_view fs_op_name(fs_op op) {
    switch (op) {
        case fs_op::create: return "create";
        case fs_op::append: return "append";
        case fs_op::sync: return "sync";
        case fs_op::close: return "close";
        case fs_op::rename: return "rename";
        case fs_op::remove: return "remove";
        case fs_op::create_dirs: return "create_dirs";
        case fs_op::sync_dir: return "sync_dir";
    }
    return "?";
}

std::string_view fs_fault_name(fs_fault f) {
    switch (f) {
        case fs_fault::io_error: return "io_error";
        case fs_fault::short_write: return "short_write";
        case fs_fault::no_space: return "no_space";
        case fs_fault::sync_fails: return "sync_fails";
        case fs_fault::torn_write: return "torn_write";
        case fs_fault::bit_flip: return "bit_flip";
        case fs_fault::crash: return "crash";
    }
    return "?";
}

namespace {

bool applies(fs_fault f, fs_op op) {
    switch (f) {
        case fs_fault::io_error:
        case fs_fault::crash: return true;
        case fs_fault::short_write:
        case fs_fault::no_space:
        case fs_fault::torn_write:
        case fs_fault::bit_flip: return op == fs_op::append;
        case fs_fault::sync_fails: return op == fs_op::sync || op == fs_op::sync_dir;
    }
    return false;
}

status crashed_status() { return io_error("file system crashed (injected)"); }

}  // namespace

struct faulty_fs::state {
    std::mutex mu;  // guards everything below
    uint64_t n_ops = 0;
    uint64_t n_faults = 0;
    std::map<fs_op, uint64_t> n_by_kind;
    std::map<uint64_t, fs_fault> at_index;
    std::map<std::pair<fs_op, uint64_t>, fs_fault> on_kind;
    std::optional<std::mt19937_64> rng;
    double p = 0;
    std::vector<fs_fault> random_faults;
    bool crashed = false;
    std::map<std::string, uint64_t> reads;
    uint64_t n_reads_total = 0;

    // Counts one mutating op and says which fault, if any, it gets. A crash fault
    // flips the crashed state for this op and every later one. Also returns a seed for
    // faults that need randomness (which bit to flip), derived from the op index.
    struct verdict {
        std::optional<fs_fault> fault;
        uint64_t op_index = 0;
    };
    verdict decide(fs_op op) {
        std::lock_guard lock(mu);
        verdict v;
        if (crashed) {
            v.fault = fs_fault::crash;
            return v;
        }
        v.op_index = n_ops++;
        uint64_t nth = n_by_kind[op]++;
        if (auto it = at_index.find(v.op_index); it != at_index.end()) v.fault = it->second;
        if (!v.fault)
            if (auto it = on_kind.find({op, nth}); it != on_kind.end()) v.fault = it->second;
        if (!v.fault && rng && !random_faults.empty()) {
            std::vector<fs_fault> usable;
            for (fs_fault f : random_faults)
                if (applies(f, op)) usable.push_back(f);
            // Draw the probability even when nothing applies, so the sequence of
            // decisions depends only on the seed and the sequence of ops.
            bool hit = std::uniform_real_distribution<double>(0, 1)(*rng) < p;
            if (hit && !usable.empty())
                v.fault = usable[std::uniform_int_distribution<size_t>(0, usable.size() - 1)(*rng)];
        }
        if (v.fault && !applies(*v.fault, op)) v.fault = fs_fault::io_error;
        if (v.fault) {
            ++n_faults;
            if (*v.fault == fs_fault::crash) crashed = true;
        }
        return v;
    }

    bool is_crashed() {
        std::lock_guard lock(mu);
        return crashed;
    }
};

namespace {

status injected(fs_op op, fs_fault f) {
    if (f == fs_fault::crash) return crashed_status();
    if (f == fs_fault::no_space)
        return io_error(std::string(fs_op_name(op)) + ": No space left on device (ENOSPC, injected)");
    if (f == fs_fault::sync_fails)
        return io_error(std::string(fs_op_name(op)) + ": Input/output error (failed fsync, injected)");
    return io_error(std::string(fs_op_name(op)) + ": Input/output error (injected " + std::string(fs_fault_name(f)) +
                    ")");
}

class faulty_writable_file final : public writable_file {
  public:
    faulty_writable_file(std::shared_ptr<faulty_fs::state> s, std::unique_ptr<writable_file> base)
        : s_(std::move(s)), base_(std::move(base)) {}

    status append(std::span<const uint8_t> data) override {
        auto v = s_->decide(fs_op::append);
        if (!v.fault) return base_->append(data);
        switch (*v.fault) {
            case fs_fault::short_write: {
                WARMCTX_RETURN_IF_ERROR(base_->append(data.first(data.size() / 2)));
                return io_error("append: short write, " + std::to_string(data.size() / 2) + " of " +
                                std::to_string(data.size()) + " bytes (injected)");
            }
            case fs_fault::torn_write: return base_->append(data.first(data.size() / 2));
            case fs_fault::bit_flip: {
                if (data.empty()) return base_->append(data);
                std::vector<uint8_t> copy(data.begin(), data.end());
                std::mt19937_64 rng(v.op_index * 0x9E3779B97F4A7C15ull + 1);
                size_t bit = std::uniform_int_distribution<size_t>(0, copy.size() * 8 - 1)(rng);
                copy[bit / 8] ^= (uint8_t)(1u << (bit % 8));
                return base_->append(copy);
            }
            default: return injected(fs_op::append, *v.fault);
        }
    }

    status sync() override {
        auto v = s_->decide(fs_op::sync);
        if (v.fault) return injected(fs_op::sync, *v.fault);
        return base_->sync();
    }

    status close() override {
        auto v = s_->decide(fs_op::close);
        if (v.fault) {
            // The descriptor is released either way (as with close(2) failing).
            (void)base_->close();
            return injected(fs_op::close, *v.fault);
        }
        return base_->close();
    }

  private:
    std::shared_ptr<faulty_fs::state> s_;
    std::unique_ptr<writable_file> base_;
};

}  // namespace

faulty_fs::faulty_fs(file_system & base) : base_(base), s_(std::make_shared<state>()) {}
faulty_fs::~faulty_fs() = default;

void faulty_fs::inject_at(uint64_t op_index, fs_fault f) {
    std::lock_guard lock(s_->mu);
    s_->at_index[op_index] = f;
}

void faulty_fs::inject_on(fs_op op, uint64_t nth, fs_fault f) {
    std::lock_guard lock(s_->mu);
    s_->on_kind[{op, nth}] = f;
}

void faulty_fs::inject_random(uint64_t seed, double p, std::vector<fs_fault> faults) {
    std::lock_guard lock(s_->mu);
    s_->rng.emplace(seed);
    s_->p = p;
    s_->random_faults = std::move(faults);
}

void faulty_fs::reset() {
    std::lock_guard lock(s_->mu);
    s_->n_ops = s_->n_faults = s_->n_reads_total = 0;
    s_->n_by_kind.clear();
    s_->at_index.clear();
    s_->on_kind.clear();
    s_->rng.reset();
    s_->random_faults.clear();
    s_->crashed = false;
    s_->reads.clear();
}

bool faulty_fs::crashed() const { return s_->is_crashed(); }

uint64_t faulty_fs::n_ops() const {
    std::lock_guard lock(s_->mu);
    return s_->n_ops;
}

uint64_t faulty_fs::n_faults() const {
    std::lock_guard lock(s_->mu);
    return s_->n_faults;
}

uint64_t faulty_fs::n_reads(const std::string & path) const {
    std::lock_guard lock(s_->mu);
    auto it = s_->reads.find(path);
    return it == s_->reads.end() ? 0 : it->second;
}

uint64_t faulty_fs::n_reads_total() const {
    std::lock_guard lock(s_->mu);
    return s_->n_reads_total;
}

result<std::unique_ptr<writable_file>> faulty_fs::create_file(const std::string & path) {
    auto v = s_->decide(fs_op::create);
    if (v.fault) return injected(fs_op::create, *v.fault);
    auto f = base_.create_file(path);
    if (!f) return f.error();
    return std::unique_ptr<writable_file>(new faulty_writable_file(s_, std::move(f.value())));
}

result<std::unique_ptr<readable_file>> faulty_fs::open_readable(const std::string & path) {
    {
        std::lock_guard lock(s_->mu);
        if (s_->crashed) return crashed_status();
        ++s_->reads[path];
        ++s_->n_reads_total;
    }
    return base_.open_readable(path);
}

result<uint64_t> faulty_fs::file_size(const std::string & path) {
    if (s_->is_crashed()) return crashed_status();
    return base_.file_size(path);
}

result<file_version> faulty_fs::stat_file(const std::string & path) {
    if (s_->is_crashed()) return crashed_status();
    return base_.stat_file(path);
}

status faulty_fs::rename_file(const std::string & from, const std::string & to) {
    auto v = s_->decide(fs_op::rename);
    if (v.fault) return injected(fs_op::rename, *v.fault);
    return base_.rename_file(from, to);
}

status faulty_fs::remove_file(const std::string & path) {
    auto v = s_->decide(fs_op::remove);
    if (v.fault) return injected(fs_op::remove, *v.fault);
    return base_.remove_file(path);
}

result<std::vector<std::string>> faulty_fs::list_dir(const std::string & dir) {
    if (s_->is_crashed()) return crashed_status();
    return base_.list_dir(dir);
}

status faulty_fs::create_dirs(const std::string & dir) {
    auto v = s_->decide(fs_op::create_dirs);
    if (v.fault) return injected(fs_op::create_dirs, *v.fault);
    return base_.create_dirs(dir);
}

status faulty_fs::sync_dir(const std::string & dir) {
    auto v = s_->decide(fs_op::sync_dir);
    if (v.fault) return injected(fs_op::sync_dir, *v.fault);
    return base_.sync_dir(dir);
}

}  // namespace warmctx
