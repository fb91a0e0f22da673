// mem_fs: an in-memory file system that models what a crash keeps.
//
// Model
//   inode  - a file's bytes: `data` (what reads see) and `synced` (what survives a crash;
//            updated by sync()). Files are append-only after create, so the unsynced part
//            of a file is always data[synced.size(), data.size()).
//   live   - path -> inode: the names as the running process sees them.
//   durable- path -> inode: the names as they would be found after a crash.
//   journal- the create/rename/remove operations applied to `live` but not yet to
//            `durable`, in order. sync_dir(d) applies every entry up to the last one that
//            touched d (a journal commit). crash() applies none (or, seeded, a prefix).
//   dirs   - directories; durable as soon as they exist (a simplification: the store
//            creates its directories once, at open).
// One mutex guards all of it (the state is shared with open file handles).
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "warmctx/fs.h"

namespace warmctx {

namespace {

struct inode {
    std::vector<uint8_t> data;
    std::vector<uint8_t> synced;
    uint64_t id = next_id();  // unique in the process: stat_file's inode number
    uint64_t version = 0;     // bumped by every change of `data`: stat_file's mtime
    static uint64_t next_id() {
        static std::atomic<uint64_t> n{1};
        return n.fetch_add(1);
    }
};

struct journal_entry {
    enum kind_t { create, rename, remove } kind;
    std::string path;      // create/remove: the name; rename: the source
    std::string to;        // rename: the target
    std::shared_ptr<inode> node;  // create: the new inode
};

std::string parent_of(const std::string & path) {
    size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

// "a/b/" -> "a/b"; the mem_fs keys never end in '/'.
std::string normalize(std::string p) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    return p;
}

}  // namespace

struct mem_fs::state {
    std::mutex mu;  // guards everything below
    std::map<std::string, std::shared_ptr<inode>> live;
    std::map<std::string, std::shared_ptr<inode>> durable;
    std::vector<journal_entry> journal;
    std::set<std::string> dirs{".", "/"};
    uint64_t capacity = 0;  // 0 = unlimited

    // REQUIRES mu. Bytes of the live files (a node renamed or hard to reach counts once).
    uint64_t used() const {
        std::set<const inode *> seen;
        uint64_t n = 0;
        for (const auto & [name, node] : live)
            if (seen.insert(node.get()).second) n += node->data.size();
        return n;
    }

    void apply(const journal_entry & e, std::map<std::string, std::shared_ptr<inode>> & names) {
        switch (e.kind) {
            case journal_entry::create: names[e.path] = e.node; break;
            case journal_entry::remove: names.erase(e.path); break;
            case journal_entry::rename: {
                auto it = names.find(e.path);
                if (it == names.end()) break;  // cannot happen for a journal applied in order
                auto node = it->second;
                names.erase(it);
                names[e.to] = node;
                break;
            }
        }
    }

    bool touches(const journal_entry & e, const std::string & dir) const {
        return parent_of(e.path) == dir || (e.kind == journal_entry::rename && parent_of(e.to) == dir);
    }
};

namespace {

class mem_writable_file final : public writable_file {
  public:
    mem_writable_file(std::shared_ptr<mem_fs::state> s, std::shared_ptr<inode> node)
        : s_(std::move(s)), node_(std::move(node)) {}

    status append(std::span<const uint8_t> data) override {
        if (closed_) return internal_error("append to a closed file");
        std::lock_guard lock(s_->mu);
        if (s_->capacity && s_->used() + data.size() > s_->capacity)
            return io_error("append: No space left on device (ENOSPC)");
        node_->data.insert(node_->data.end(), data.begin(), data.end());
        node_->version++;
        return {};
    }
    status sync() override {
        if (closed_) return internal_error("sync of a closed file");
        std::lock_guard lock(s_->mu);
        node_->synced = node_->data;
        return {};
    }
    status close() override {
        closed_ = true;
        return {};
    }

  private:
    std::shared_ptr<mem_fs::state> s_;
    std::shared_ptr<inode> node_;
    bool closed_ = false;
};

class mem_readable_file final : public readable_file {
  public:
    explicit mem_readable_file(std::vector<uint8_t> data) : data_(std::move(data)) {}
    uint64_t size() const override { return data_.size(); }
    status read_at(uint64_t offset, size_t n, uint8_t * dst) const override {
        if (offset > data_.size() || n > data_.size() - offset)
            return out_of_range("read [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                ") outside a file of " + std::to_string(data_.size()) + " bytes");
        std::copy_n(data_.begin() + (ptrdiff_t)offset, n, dst);
        return {};
    }

  private:
    std::vector<uint8_t> data_;
};

}  // namespace

mem_fs::mem_fs() : s_(std::make_shared<state>()) {}
mem_fs::~mem_fs() = default;

result<std::unique_ptr<writable_file>> mem_fs::create_file(const std::string & path_in) {
    std::string path = normalize(path_in);
    std::lock_guard lock(s_->mu);
    if (!s_->dirs.count(parent_of(path))) return not_found("create '" + path + "': no such directory");
    if (s_->dirs.count(path)) return io_error("create '" + path + "': is a directory");
    auto node = std::make_shared<inode>();
    journal_entry e{journal_entry::create, path, {}, node};
    s_->apply(e, s_->live);
    s_->journal.push_back(std::move(e));
    return std::unique_ptr<writable_file>(new mem_writable_file(s_, node));
}

result<std::unique_ptr<readable_file>> mem_fs::open_readable(const std::string & path_in) {
    std::string path = normalize(path_in);
    std::lock_guard lock(s_->mu);
    auto it = s_->live.find(path);
    if (it == s_->live.end()) return not_found("open '" + path + "': no such file");
    return std::unique_ptr<readable_file>(new mem_readable_file(it->second->data));
}

result<uint64_t> mem_fs::file_size(const std::string & path_in) {
    std::string path = normalize(path_in);
    std::lock_guard lock(s_->mu);
    auto it = s_->live.find(path);
    if (it == s_->live.end()) return not_found("stat '" + path + "': no such file");
    return (uint64_t)it->second->data.size();
}

result<file_version> mem_fs::stat_file(const std::string & path_in) {
    std::string path = normalize(path_in);
    std::lock_guard lock(s_->mu);
    auto it = s_->live.find(path);
    if (it == s_->live.end()) return not_found("stat '" + path + "': no such file");
    file_version v;
    v.size = it->second->data.size();
    v.mtime_ns = (int64_t)it->second->version;
    v.inode = it->second->id;
    return v;
}

status mem_fs::rename_file(const std::string & from_in, const std::string & to_in) {
    std::string from = normalize(from_in), to = normalize(to_in);
    std::lock_guard lock(s_->mu);
    if (!s_->live.count(from)) return not_found("rename '" + from + "': no such file");
    if (!s_->dirs.count(parent_of(to))) return not_found("rename to '" + to + "': no such directory");
    if (s_->dirs.count(to)) return io_error("rename to '" + to + "': is a directory");
    if (from == to) return {};
    journal_entry e{journal_entry::rename, from, to, nullptr};
    s_->apply(e, s_->live);
    s_->journal.push_back(std::move(e));
    return {};
}

status mem_fs::remove_file(const std::string & path_in) {
    std::string path = normalize(path_in);
    std::lock_guard lock(s_->mu);
    if (!s_->live.count(path)) return not_found("remove '" + path + "': no such file");
    journal_entry e{journal_entry::remove, path, {}, nullptr};
    s_->apply(e, s_->live);
    s_->journal.push_back(std::move(e));
    return {};
}

result<std::vector<std::string>> mem_fs::list_dir(const std::string & dir_in) {
    std::string dir = normalize(dir_in);
    std::lock_guard lock(s_->mu);
    if (!s_->dirs.count(dir)) return not_found("list '" + dir + "': no such directory");
    std::vector<std::string> names;
    auto base = [&](const std::string & p) { return p.substr(p.find_last_of('/') + 1); };
    for (auto & [p, node] : s_->live)
        if (parent_of(p) == dir) names.push_back(base(p));
    for (auto & d : s_->dirs)
        if (d != dir && d != "." && d != "/" && parent_of(d) == dir) names.push_back(base(d));
    std::sort(names.begin(), names.end());
    return names;
}

status mem_fs::create_dirs(const std::string & dir_in) {
    std::string dir = normalize(dir_in);
    if (dir.empty()) return invalid_argument("create_dirs: empty path");
    std::lock_guard lock(s_->mu);
    if (s_->live.count(dir)) return io_error("create directory '" + dir + "': exists and is not a directory");
    for (std::string d = dir; !s_->dirs.count(d); d = parent_of(d)) s_->dirs.insert(d);
    return {};
}

status mem_fs::sync_dir(const std::string & dir_in) {
    std::string dir = normalize(dir_in);
    std::lock_guard lock(s_->mu);
    if (!s_->dirs.count(dir)) return not_found("sync directory '" + dir + "': no such directory");
    size_t last = 0;  // one past the last journal entry touching dir
    for (size_t i = 0; i < s_->journal.size(); ++i)
        if (s_->touches(s_->journal[i], dir)) last = i + 1;
    for (size_t i = 0; i < last; ++i) s_->apply(s_->journal[i], s_->durable);
    s_->journal.erase(s_->journal.begin(), s_->journal.begin() + (ptrdiff_t)last);
    return {};
}

void mem_fs::set_capacity(uint64_t bytes) {
    std::lock_guard lock(s_->mu);
    s_->capacity = bytes;
}

void mem_fs::crash(uint64_t seed) {
    std::lock_guard lock(s_->mu);
    std::mt19937_64 rng(seed);
    size_t keep_journal = 0;
    if (seed != 0) keep_journal = std::uniform_int_distribution<size_t>(0, s_->journal.size())(rng);
    for (size_t i = 0; i < keep_journal; ++i) s_->apply(s_->journal[i], s_->durable);
    s_->journal.clear();
    // Every inode still reachable loses its unsynced bytes (or, seeded, part of them).
    std::set<inode *> seen;
    for (auto & [p, node] : s_->durable) {
        if (!seen.insert(node.get()).second) continue;
        size_t keep = node->synced.size();
        if (seed != 0 && node->data.size() > node->synced.size() &&
            std::equal(node->synced.begin(), node->synced.end(), node->data.begin()))
            keep = std::uniform_int_distribution<size_t>(node->synced.size(), node->data.size())(rng);
        if (keep == node->synced.size()) {
            node->data = node->synced;
        } else {
            node->data.resize(keep);
            node->version++;
            node->synced = node->data;
        }
    }
    s_->live = s_->durable;
}

status mem_fs::corrupt_byte(const std::string & path_in, uint64_t offset, uint8_t xor_mask) {
    std::string path = normalize(path_in);
    std::lock_guard lock(s_->mu);
    auto it = s_->live.find(path);
    if (it == s_->live.end()) return not_found("corrupt '" + path + "': no such file");
    inode & n = *it->second;
    if (offset >= n.data.size()) return out_of_range("corrupt '" + path + "': offset past the end");
    n.data[offset] ^= xor_mask;
    n.version++;
    if (offset < n.synced.size()) n.synced[offset] ^= xor_mask;
    return {};
}

status mem_fs::truncate(const std::string & path_in, uint64_t n_bytes) {
    std::string path = normalize(path_in);
    std::lock_guard lock(s_->mu);
    auto it = s_->live.find(path);
    if (it == s_->live.end()) return not_found("truncate '" + path + "': no such file");
    inode & n = *it->second;
    if (n_bytes > n.data.size()) return out_of_range("truncate '" + path + "': would grow the file");
    n.data.resize(n_bytes);
    n.version++;
    if (n.synced.size() > n_bytes) n.synced.resize(n_bytes);
    return {};
}

}  // namespace warmctx
