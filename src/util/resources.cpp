#include "util/resources.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>
#include <sys/stat.h>

namespace warmctx {

namespace {

bool is_regular_file(const std::string & p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string env_dir(const char * var) {
    const char * v = std::getenv(var);
    return v && *v ? std::string(v) : std::string();
}

result<std::string> first_existing(std::string_view what, std::string_view name, const std::vector<std::string> & c) {
    for (const auto & p : c)
        if (is_regular_file(p)) return p;
    std::string looked;
    for (const auto & p : c) looked += (looked.empty() ? "" : ", ") + p;
    return not_found(std::string(what) + " '" + std::string(name) + "' not found (looked at: " + looked + ")");
}

}  // namespace

uint64_t physical_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

uint64_t available_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    uint64_t kib = 0;
    while (in >> key >> kib) {
        std::getline(in, unit);
        if (key == "MemAvailable:") return kib * 1024;
    }
    return 0;
}

uint64_t default_kv_share_bytes() {
    const uint64_t phys = physical_memory_bytes();
    if (phys == 0) return uint64_t{2} << 30;
    return std::min(phys / 4, uint64_t{8} << 30);
}

std::string executable_dir() {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return {};
    std::string p(buf, (size_t)n);
    const size_t slash = p.find_last_of('/');
    return slash == std::string::npos ? std::string() : p.substr(0, slash);
}

std::vector<std::string> data_file_candidates(std::string_view name) {
    std::vector<std::string> c;
    const std::string n(name);
    if (auto d = env_dir("WARMCTX_DATA_DIR"); !d.empty()) c.push_back(d + "/" + n);
    if (auto e = executable_dir(); !e.empty()) {
        c.push_back(e + "/../share/warmctx/" + n);
        c.push_back(e + "/share/warmctx/" + n);
    }
    return c;
}

std::vector<std::string> tool_candidates(std::string_view name) {
    std::vector<std::string> c;
    const std::string n(name);
    if (auto d = env_dir("WARMCTX_TOOLS_DIR"); !d.empty()) c.push_back(d + "/" + n);
    if (auto e = executable_dir(); !e.empty()) {
        c.push_back(e + "/../libexec/warmctx/" + n);
        c.push_back(e + "/bin/" + n);
        c.push_back(e + "/" + n);
    }
    return c;
}

result<std::string> find_data_file(std::string_view name) {
    return first_existing("data file", name, data_file_candidates(name));
}

result<std::string> find_tool(std::string_view name) { return first_existing("tool", name, tool_candidates(name)); }

}  // namespace warmctx
