// The real file system: POSIX calls, EINTR and short transfers retried, errno in messages.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "warmctx/fs.h"

namespace warmctx {
namespace {

// "open '/x/y': No such file or directory" as not_found, anything else as io_error.
status errno_status(std::string_view what, const std::string & path, int err) {
    std::string m = std::string(what) + " '" + path + "': " + std::strerror(err);
    if (err == ENOENT) return not_found(std::move(m));
    return io_error(std::move(m));
}

std::string parent_dir(const std::string & path) {
    size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

class posix_writable_file final : public writable_file {
  public:
    posix_writable_file(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
    ~posix_writable_file() override {
        if (fd_ >= 0) ::close(fd_);
    }

    status append(std::span<const uint8_t> data) override {
        if (fd_ < 0) return internal_error("append to closed file '" + path_ + "'");
        const uint8_t * p = data.data();
        size_t left = data.size();
        while (left > 0) {
            // Large writes are split so a single write() never exceeds what Linux
            // transfers at once anyway (~2 GiB); short writes are simply continued.
            ssize_t w = ::write(fd_, p, std::min<size_t>(left, size_t{1} << 30));
            if (w < 0) {
                if (errno == EINTR) continue;
                return errno_status("write", path_, errno);
            }
            if (w == 0) return io_error("write '" + path_ + "': wrote 0 bytes");
            p += w;
            left -= (size_t)w;
        }
        return {};
    }

    status sync() override {
        if (fd_ < 0) return internal_error("sync of closed file '" + path_ + "'");
        // fsync, not fdatasync: the file's size is metadata that must be durable too.
        while (::fsync(fd_) != 0) {
            if (errno != EINTR) return errno_status("fsync", path_, errno);
        }
        return {};
    }

    status close() override {
        if (fd_ < 0) return {};
        int fd = fd_;
        fd_ = -1;
        // close() is not retried on EINTR: on Linux the descriptor is gone either way.
        if (::close(fd) != 0 && errno != EINTR) return errno_status("close", path_, errno);
        return {};
    }

  private:
    std::string path_;
    int fd_;
};

class posix_readable_file final : public readable_file {
  public:
    posix_readable_file(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
    ~posix_readable_file() override { ::close(fd_); }

    uint64_t size() const override { return size_; }

    status read_at(uint64_t offset, size_t n, uint8_t * dst) const override {
        if (offset > size_ || n > size_ - offset)
            return out_of_range("read '" + path_ + "': [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                ") is outside the file's " + std::to_string(size_) + " bytes");
        while (n > 0) {
            ssize_t r = ::pread(fd_, dst, std::min<size_t>(n, size_t{1} << 30), (off_t)offset);
            if (r < 0) {
                if (errno == EINTR) continue;
                return errno_status("read", path_, errno);
            }
            // The file shrank since it was opened (someone truncated it in place).
            if (r == 0) return io_error("read '" + path_ + "': unexpected end of file");
            dst += r;
            offset += (uint64_t)r;
            n -= (size_t)r;
        }
        return {};
    }

  private:
    std::string path_;
    int fd_;
    uint64_t size_;
};

class posix_file_system final : public file_system {
  public:
    result<std::unique_ptr<writable_file>> create_file(const std::string & path) override {
        int fd;
        do {
            fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        } while (fd < 0 && errno == EINTR);
        if (fd < 0) return errno_status("create", path, errno);
        return std::unique_ptr<writable_file>(new posix_writable_file(path, fd));
    }

    result<std::unique_ptr<readable_file>> open_readable(const std::string & path) override {
        int fd;
        do {
            // O_NONBLOCK: a FIFO named like a snapshot must not block the caller; it is
            // refused below as not a regular file (for a regular file the flag is moot).
            fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        } while (fd < 0 && errno == EINTR);
        if (fd < 0) return errno_status("open", path, errno);
        struct stat st;
        if (::fstat(fd, &st) != 0) {
            int err = errno;
            ::close(fd);
            return errno_status("stat", path, err);
        }
        if (!S_ISREG(st.st_mode)) {
            ::close(fd);
            return io_error("open '" + path + "': not a regular file");
        }
        return std::unique_ptr<readable_file>(new posix_readable_file(path, fd, (uint64_t)st.st_size));
    }

    result<uint64_t> file_size(const std::string & path) override {
        struct stat st;
        if (::stat(path.c_str(), &st) != 0) return errno_status("stat", path, errno);
        return (uint64_t)st.st_size;
    }

    result<file_version> stat_file(const std::string & path) override {
        struct stat st;
        if (::stat(path.c_str(), &st) != 0) return errno_status("stat", path, errno);
        if (!S_ISREG(st.st_mode)) return io_error("stat '" + path + "': not a regular file");
        file_version v;
        v.size = (uint64_t)st.st_size;
        v.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
        v.ctime_ns = int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
        v.inode = (uint64_t)st.st_ino;
        v.device = (uint64_t)st.st_dev;
        return v;
    }

    status rename_file(const std::string & from, const std::string & to) override {
        if (::rename(from.c_str(), to.c_str()) != 0) return errno_status("rename", from + "' to '" + to, errno);
        return {};
    }

    status remove_file(const std::string & path) override {
        if (::unlink(path.c_str()) != 0) return errno_status("remove", path, errno);
        return {};
    }

    result<bool> is_link(const std::string & path) override {
        struct stat st;
        if (::lstat(path.c_str(), &st) != 0) {
            if (errno == ENOENT || errno == ENOTDIR) return false;
            return errno_status("stat", path, errno);
        }
        return S_ISLNK(st.st_mode);
    }

    result<std::vector<std::string>> list_dir(const std::string & dir) override {
        DIR * d = ::opendir(dir.c_str());
        if (!d) return errno_status("list", dir, errno);
        std::vector<std::string> names;
        errno = 0;
        while (struct dirent * e = ::readdir(d)) {
            if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
            names.emplace_back(e->d_name);
        }
        int err = errno;
        ::closedir(d);
        if (err != 0) return errno_status("list", dir, err);
        std::sort(names.begin(), names.end());
        return names;
    }

    status create_dirs(const std::string & dir) override {
        if (dir.empty()) return invalid_argument("create_dirs: empty path");
        struct stat st;
        if (::stat(dir.c_str(), &st) == 0) {
            if (S_ISDIR(st.st_mode)) return {};
            return io_error("create directory '" + dir + "': exists and is not a directory");
        }
        std::string parent = parent_dir(dir);
        if (parent != dir) WARMCTX_RETURN_IF_ERROR(create_dirs(parent));
        if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno_status("create directory", dir, errno);
        // The new entry lives in the parent: make it durable there.
        return sync_dir(parent);
    }

    status sync_dir(const std::string & dir) override {
        int fd;
        do {
            fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        } while (fd < 0 && errno == EINTR);
        if (fd < 0) return errno_status("open directory", dir, errno);
        int rc;
        while ((rc = ::fsync(fd)) != 0 && errno == EINTR) {
        }
        int err = errno;
        ::close(fd);
        if (rc != 0) return errno_status("fsync directory", dir, err);
        return {};
    }
};

}  // namespace

file_system & posix_fs() {
    static posix_file_system fs;
    return fs;
}

// ---- helpers shared by every implementation --------------------------------------------

result<std::vector<uint8_t>> file_system::read_file(const std::string & path) {
    auto f = open_readable(path);
    if (!f) return f.error();
    std::vector<uint8_t> out((size_t)(*f)->size());
    WARMCTX_RETURN_IF_ERROR((*f)->read_at(0, out.size(), out.data()));
    return out;
}

result<std::vector<uint8_t>> file_system::read_range(const std::string & path, uint64_t offset, uint64_t n) {
    auto f = open_readable(path);
    if (!f) return f.error();
    uint64_t size = (*f)->size();
    if (offset >= size) return std::vector<uint8_t>{};
    std::vector<uint8_t> out((size_t)std::min(n, size - offset));
    WARMCTX_RETURN_IF_ERROR((*f)->read_at(offset, out.size(), out.data()));
    return out;
}

status file_system::write_file(const std::string & path, std::span<const uint8_t> data) {
    auto f = create_file(path);
    if (!f) return f.error();
    WARMCTX_RETURN_IF_ERROR((*f)->append(data));
    WARMCTX_RETURN_IF_ERROR((*f)->sync());
    return (*f)->close();
}

}  // namespace warmctx
