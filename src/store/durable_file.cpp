#include "durable_file.h"

#include <unistd.h>

#include <atomic>

namespace warmctx {

std::string unique_temp_name(std::string_view final_name) {
    static std::atomic<uint64_t> n_temp{0};
    return std::string(final_name) + "." + std::to_string(static_cast<long>(::getpid())) + "-" +
           std::to_string(++n_temp) + std::string(k_temp_file_suffix);
}

bool is_temp_file_name(std::string_view name) {
    return name.size() >= k_temp_file_suffix.size() &&
           name.substr(name.size() - k_temp_file_suffix.size()) == k_temp_file_suffix;
}

durable_file::durable_file(file_system & fs, std::string dir, std::string final_name, std::string temp_name,
                           std::unique_ptr<writable_file> file)
    : fs_(&fs), dir_(std::move(dir)), final_name_(std::move(final_name)), temp_name_(std::move(temp_name)),
      file_(std::move(file)) {}

durable_file::durable_file(durable_file && o) noexcept
    : fs_(o.fs_), dir_(std::move(o.dir_)), final_name_(std::move(o.final_name_)), temp_name_(std::move(o.temp_name_)),
      file_(std::move(o.file_)), done_(o.done_) {
    o.done_ = true;
}

durable_file::~durable_file() { discard(); }

result<durable_file> durable_file::create(file_system & fs, std::string dir, std::string final_name,
                                          std::string temp_name) {
    auto f = fs.create_file(dir + "/" + temp_name);
    if (!f) return f.error();
    return durable_file(fs, std::move(dir), std::move(final_name), std::move(temp_name), std::move(f.value()));
}

status durable_file::finish() {
    status st = file_->sync();
    if (st.ok()) st = file_->close();
    if (!st.ok()) discard();
    return st;
}

status durable_file::commit(status * dir_sync) {
    if (status st = fs_->rename_file(dir_ + "/" + temp_name_, dir_ + "/" + final_name_); !st.ok()) {
        discard();
        return st;
    }
    done_ = true;
    status synced = fs_->sync_dir(dir_);
    if (dir_sync) {
        *dir_sync = synced;
        return {};
    }
    return synced;
}

void durable_file::discard() {
    if (done_) return;
    done_ = true;
    file_.reset();  // closes without syncing
    (void)fs_->remove_file(dir_ + "/" + temp_name_);  // may fail too (a crash): the next start removes it
}

status write_file_durably(file_system & fs, const std::string & dir, const std::string & final_name,
                          std::span<const uint8_t> bytes) {
    const std::string temp_name = unique_temp_name(final_name);
    auto f = durable_file::create(fs, dir, final_name, temp_name);
    if (!f) {
        (void)fs.remove_file(dir + "/" + temp_name);
        return f.error();
    }
    status st = f->out().append(bytes);
    if (st.ok()) st = f->finish();
    if (st.ok()) st = f->commit();
    return st;
}

bool quarantine_file(file_system & fs, const std::string & path, const std::string & quarantine_dir,
                     const std::string & name, std::string_view reason) {
    const std::string q = quarantine_dir + "/" + name;
    if (!fs.rename_file(path, q).ok()) return false;
    if (!reason.empty())
        (void)fs.write_file(q + ".reason", std::span((const uint8_t *)reason.data(), reason.size()));
    (void)fs.sync_dir(quarantine_dir);
    return true;
}

}  // namespace warmctx
