// The workspaces' learned volatility on disk (store/volatility_store.h).
#include "store/volatility_store.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "durable_file.h"
#include "warmctx/hash.h"

namespace warmctx {

namespace {
constexpr const char * k_quarantine_dir = "quarantine";

uint64_t unix_ms() {
    return (uint64_t)std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}
}  // namespace

struct volatility_store::impl {
    file_system & fs;
    std::string dir;

    mutable std::mutex mu;
    std::condition_variable cv_work, cv_idle;
    // By file name: the text to write, or nullopt to remove the file. The writer takes the
    // whole map at once; `writing` holds what it took until those are done.
    std::map<std::string, std::optional<std::string>> pending, writing;
    bool stop = false;
    volatility_store_stats st;
    std::thread writer;

    impl(file_system & f, std::string d) : fs(f), dir(std::move(d)) {}

    std::string name_of(const std::string & ws) const { return hash_bytes(ws.data(), ws.size()).hex() + ".json"; }

    void quarantine(const std::string & name, const std::string & why) {
        const std::string qdir = dir + "/" + k_quarantine_dir;
        const std::string path = dir + "/" + name;
        std::fprintf(stderr, "warmctx: %s: %s (moved to %s)\n", path.c_str(), why.c_str(), qdir.c_str());
        if (!fs.create_dirs(qdir).ok() || !quarantine_file(fs, path, qdir, std::to_string(unix_ms()) + "-" + name, why))
            (void)fs.remove_file(path);
        {
            std::lock_guard lk(mu);
            ++st.n_quarantined;
        }
        // The newest few: names begin with when they were set aside.
        auto names = fs.list_dir(qdir);
        if (names.ok() && names->size() > 2 * k_max_quarantined)  // each with its .reason
            for (size_t i = 0; i + 2 * k_max_quarantined < names->size(); ++i)
                (void)fs.remove_file(qdir + "/" + (*names)[i]);
    }

    void write(const std::string & name, const std::optional<std::string> & text) {
        status s;
        if (!text) {
            s = fs.remove_file(dir + "/" + name);
            if (s.code() == status_code::not_found) s = {};
        } else {
            s = write_file_durably(fs, dir, name, std::span((const uint8_t *)text->data(), text->size()));
        }
        std::lock_guard lk(mu);
        if (s.ok()) {
            if (text) ++st.n_writes;
            return;
        }
        ++st.n_write_failures;
        // Best effort: the order is learned again after a restart.
        std::fprintf(stderr, "warmctx: could not save a workspace's learned order (%s/%s): %s\n", dir.c_str(),
                     name.c_str(), s.to_string().c_str());
    }

    void run() {
        std::unique_lock lk(mu);
        for (;;) {
            cv_work.wait(lk, [&] { return stop || !pending.empty(); });
            if (pending.empty()) return;  // stopped, nothing left
            writing.swap(pending);
            lk.unlock();
            for (const auto & [name, text] : writing) write(name, text);
            lk.lock();
            writing.clear();
            if (pending.empty()) cv_idle.notify_all();
        }
    }
};

result<std::unique_ptr<volatility_store>> volatility_store::open(file_system & fs, std::string dir) {
    if (auto link = fs.is_link(dir); link.ok() && *link)
        return failed_precondition(dir + " is a symbolic link (it could lead anywhere)");
    WARMCTX_RETURN_IF_ERROR(fs.create_dirs(dir).with_context("the learned order's directory"));
    auto p = std::make_unique<impl>(fs, std::move(dir));
    // Temporary files a crash left: the old file (or none) is whole beside them.
    if (auto names = fs.list_dir(p->dir); names.ok())
        for (const std::string & n : *names)
            if (is_temp_file_name(n)) (void)fs.remove_file(p->dir + "/" + n);
    impl * raw = p.get();
    p->writer = std::thread([raw] { raw->run(); });
    return std::unique_ptr<volatility_store>(new volatility_store(std::move(p)));
}

volatility_store::volatility_store(std::unique_ptr<impl> p) : p_(std::move(p)) {}

volatility_store::~volatility_store() {
    {
        std::lock_guard lk(p_->mu);
        p_->stop = true;
    }
    p_->cv_work.notify_all();
    p_->writer.join();
}

std::optional<volatility_state> volatility_store::read(const std::string & workspace) {
    const std::string name = p_->name_of(workspace);
    {
        std::lock_guard lk(p_->mu);
        // Not yet written: what was queued is what is learned.
        for (const auto * m : {&p_->pending, &p_->writing})
            if (auto it = m->find(name); it != m->end()) {
                if (!it->second) return std::nullopt;
                auto st = volatility_from_json(*it->second);
                return st.ok() ? std::optional<volatility_state>(std::move(*st)) : std::nullopt;
            }
        ++p_->st.n_reads;
    }
    auto f = p_->fs.open_readable(p_->dir + "/" + name);
    if (!f.ok()) return std::nullopt;  // none (or unreadable now: nothing learned)
    if ((*f)->size() > k_max_file_bytes) {
        f->reset();
        p_->quarantine(name, "larger than any learned state (" + std::to_string(k_max_file_bytes) + " bytes)");
        return std::nullopt;
    }
    std::string text((size_t)(*f)->size(), '\0');
    if (!(*f)->read_at(0, text.size(), reinterpret_cast<uint8_t *>(text.data())).ok()) return std::nullopt;
    f->reset();
    auto st = volatility_from_json(text);
    if (!st.ok()) {
        p_->quarantine(name, "not a learned state: " + st.error().message());
        return std::nullopt;
    }
    return std::move(*st);
}

void volatility_store::put(const std::string & workspace, const volatility_state & st) {
    std::string text = volatility_to_json(st);
    {
        std::lock_guard lk(p_->mu);
        p_->pending[p_->name_of(workspace)] = std::move(text);
    }
    p_->cv_work.notify_all();
}

void volatility_store::remove(const std::string & workspace) {
    {
        std::lock_guard lk(p_->mu);
        p_->pending[p_->name_of(workspace)] = std::nullopt;
    }
    p_->cv_work.notify_all();
}

void volatility_store::flush() {
    std::unique_lock lk(p_->mu);
    p_->cv_idle.wait(lk, [&] { return p_->pending.empty() && p_->writing.empty(); });
}

volatility_store_stats volatility_store::stats() const {
    std::lock_guard lk(p_->mu);
    return p_->st;
}

const std::string & volatility_store::dir() const { return p_->dir; }

std::string volatility_store::path_of(const std::string & workspace) const {
    return p_->dir + "/" + p_->name_of(workspace);
}

}  // namespace warmctx
