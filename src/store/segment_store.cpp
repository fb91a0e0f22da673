#include "store/segment_store.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "durable_file.h"
#include "warmctx/assembler.h"
#include "warmctx/hash.h"
#include "util/json.h"

namespace warmctx {

namespace {

constexpr std::string_view k_magic = "warmctx-store 1 ";
constexpr const char * k_seg_ext = ".wcseg";
constexpr const char * k_uses_name = "uses.wcmeta";
constexpr size_t k_quarantine_max_files = 16;
// Damaged files go here. A workspace id never starts with '.', so no workspace can be
// this directory (it was "quarantine", a valid id: that workspace's files were skipped
// at every start and trimmed away as quarantine overflow).
constexpr const char * k_quarantine_dir = ".quarantine";
constexpr const char * k_legacy_quarantine_dir = "quarantine";

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A name the store itself gives a file in a workspace's directory: a segment (its id's
// 32-hex-digit hash), the use counts, or a temp file.
bool is_store_file_name(std::string_view n) {
    if (n == k_uses_name || is_temp_file_name(n)) return true;
    if (n.size() != 32 + std::string_view(k_seg_ext).size() || n.substr(32) != k_seg_ext) return false;
    return std::all_of(n.begin(), n.begin() + 32,
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

int64_t unix_ms_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// An optional string field: "" when absent.
result<std::string> optional_string(const nlohmann::json & j, std::string_view key, std::string_view where) {
    auto it = j.find(key);
    if (it == j.end()) return std::string();
    return json_as_string(*it, std::string(where) + ", field '" + std::string(key) + "'");
}

result<std::string> required_string(const nlohmann::json & j, std::string_view key, std::string_view where) {
    auto v = json_field(j, key, where);
    if (!v.ok()) return v.error();
    return json_as_string(**v, std::string(where) + ", field '" + std::string(key) + "'");
}

// A segment file's body (docs/workspace-store-format.md), of workspace `ws`.
result<segment> read_segment_body(std::string_view body, const std::string & ws) {
    auto j = parse_json(body);
    if (!j.ok()) return j.error();
    if (!j->is_object()) return invalid_argument("not a segment of workspace " + ws);
    auto owner = optional_string(*j, "workspace", "segment");
    if (!owner.ok() || *owner != ws) return invalid_argument("not a segment of workspace " + ws);
    segment seg;
    auto id = required_string(*j, "id", "segment");
    if (!id.ok()) return id.error();
    seg.id = std::move(*id);
    auto kind_name = required_string(*j, "kind", "segment");
    if (!kind_name.ok()) return kind_name.error();
    auto kind = parse_segment_kind(*kind_name);
    if (!kind.ok()) return kind.error();
    seg.kind = *kind;
    for (auto [key, field] : {std::pair{"path", &seg.path}, std::pair{"role", &seg.role}}) {
        auto v = optional_string(*j, key, "segment");
        if (!v.ok()) return v.error();
        *field = std::move(*v);
    }
    auto content = required_string(*j, "content", "segment");
    if (!content.ok()) return content.error();
    seg.content = std::move(*content);
    return seg;
}

}  // namespace

std::string seal_store_file(const std::string & body) {
    return std::string(k_magic) + hash_string(body).hex() + "\n" + body;
}

result<std::string> unseal_store_file(const std::vector<uint8_t> & bytes) {
    const std::string_view all(reinterpret_cast<const char *>(bytes.data()), bytes.size());
    const size_t head = k_magic.size() + 32 + 1;
    if (all.size() < head || all.substr(0, k_magic.size()) != k_magic || all[head - 1] != '\n')
        return status(status_code::corrupt, "not a warmctx store file (bad header)");
    const std::string_view want = all.substr(k_magic.size(), 32);
    std::string body(all.substr(head));
    if (hash_string(body).hex() != want) return status(status_code::corrupt, "checksum mismatch");
    return body;
}

std::string segment_store::seg_path(const std::string & ws, const std::string & id) const {
    return ws_dir(ws) + "/" + hash_string(id).hex() + k_seg_ext;
}

status segment_store::check_not_link(const std::string & dir) const {
    auto link = persist_.fs->is_link(dir);
    if (!link.ok()) return link.error();
    if (*link)
        return failed_precondition("'" + dir + "' is a symbolic link: the workspace store does not follow links out of "
                                               "its directory");
    return {};
}

status segment_store::write_sealed(const std::string & dir, const std::string & name, const std::string & body) {
    file_system & fs = *persist_.fs;
    if (dir != persist_.dir) WARMCTX_RETURN_IF_ERROR(check_not_link(dir));
    WARMCTX_RETURN_IF_ERROR(fs.create_dirs(dir));
    const std::string sealed = seal_store_file(body);
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t *>(sealed.data()), sealed.size());
    status st = write_file_durably(fs, dir, name, bytes);
    // A full disk: the snapshot cache beside the store gives room back, and the write is
    // tried once more (a durable write never loses to a cache).
    if (!st.ok() && is_disk_full(st) && persist_.make_room && persist_.make_room(2 * sealed.size() + 4096) > 0)
        st = write_file_durably(fs, dir, name, bytes);
    if (!st.ok()) ++n_write_failures_;
    return st;
}

void segment_store::quarantine(const std::string & path, const std::string & name, const std::string & why,
                                 store_load_report & rep) {
    file_system & fs = *persist_.fs;
    const std::string qdir = persist_.dir + "/" + k_quarantine_dir;
    rep.problems.push_back(path + ": " + why + " (moved to " + qdir + ")");
    ++rep.n_quarantined;
    if (!fs.create_dirs(qdir).ok() || !quarantine_file(fs, path, qdir, name)) {
        (void)fs.remove_file(path);
        return;
    }
    // Keep the newest few: names sort by when they were quarantined.
    auto names = fs.list_dir(qdir);
    if (names.ok() && names->size() > k_quarantine_max_files)
        for (size_t i = 0; i + k_quarantine_max_files < names->size(); ++i)
            (void)fs.remove_file(qdir + "/" + (*names)[i]);
}

result<store_load_report> segment_store::load(const kind_table & kinds,
                                                const std::function<bool(std::string_view)> & is_workspace_id) {
    store_load_report rep;
    if (!durable()) return rep;
    file_system & fs = *persist_.fs;
    WARMCTX_RETURN_IF_ERROR(fs.create_dirs(persist_.dir).with_context("workspace store"));
    auto dirs = fs.list_dir(persist_.dir);
    if (!dirs.ok()) return dirs.error().with_context("workspace store");
    std::lock_guard<std::mutex> lk(mu_);
    kinds_ = kinds;
    is_workspace_id_ = is_workspace_id;
    last_full_refresh_ms_ = unix_ms_now();
    const std::string stamp = std::to_string(unix_ms_now()) + "-";
    for (const std::string & ws : *dirs) {
        if (ws == k_quarantine_dir) continue;
        if (!is_workspace_id(ws)) {
            rep.problems.push_back(persist_.dir + "/" + ws + ": not a workspace id, left alone");
            continue;
        }
        if (status st = check_not_link(ws_dir(ws)); !st.ok()) {
            rep.problems.push_back(st.message() + "; left alone");
            continue;
        }
        auto files = fs.list_dir(ws_dir(ws));
        if (!files.ok()) continue;  // a plain file where a workspace directory belongs
        for (const std::string & name : *files) load_file(ws, name, kinds, stamp, rep);
    }
    rep.n_workspaces = ws_.size();
    for (auto it = uses_.begin(); it != uses_.end();) it = ws_.count(it->first) ? std::next(it) : uses_.erase(it);
    return rep;
}

void segment_store::load_file(const std::string & ws, const std::string & name, const kind_table & kinds,
                                const std::string & stamp, store_load_report & rep) {
    file_system & fs = *persist_.fs;
    const std::string path = ws_dir(ws) + "/" + name;
    // An older version's quarantine, beside (or instead of) a workspace named
    // "quarantine": its files ("<ms>-<ws>-<hash>.wcseg") move to the new one.
    if (ws == k_legacy_quarantine_dir && !is_store_file_name(name)) {
        const std::string qdir = persist_.dir + "/" + k_quarantine_dir;
        if (fs.create_dirs(qdir).ok()) (void)quarantine_file(fs, path, qdir, name);
        return;
    }
    if (is_temp_file_name(name)) {  // a write a crash interrupted (shared: once it is old)
        if (persist_.shared) {
            auto v = fs.stat_file(path);
            if (!v.ok() || v->mtime_ns / 1'000'000 > unix_ms_now() - persist_.shared_temp_grace_ms) return;
        }
        (void)fs.remove_file(path);
        return;
    }
    const bool is_seg = ends_with(name, k_seg_ext), is_uses = name == k_uses_name;
    if (!is_seg && !is_uses) return;
    auto version = fs.stat_file(path);  // a regular file, never a FIFO or device
    if (!version.ok()) return;
    if (version->size > limits_.max_segment_bytes * 7 + 4096) {  // JSON escapes at most 6 bytes per byte
        quarantine(path, stamp + ws + "-" + name, "larger than any segment the store takes", rep);
        return;
    }
    auto bytes = fs.read_file(path);
    if (!bytes.ok()) return;
    auto body = unseal_store_file(*bytes);
    if (!body.ok()) {
        quarantine(path, stamp + ws + "-" + name, body.error().message(), rep);
        return;
    }
    if (is_uses) {  // without an unsigned `uses`, the workspace counts no uses
        auto j = parse_json(*body);
        if (j.ok() && j->is_object() && j->value("uses", nlohmann::json()).is_number_unsigned()) {
            auto & u = uses_[ws];
            u.uses = (*j)["uses"].get<uint64_t>();
            const nlohmann::json last = j->value("last_used_unix_ms", nlohmann::json());
            u.last_used_unix_ms = last.is_number_integer() ? last.get<int64_t>() : 0;
        }
        return;
    }
    auto seg = read_segment_body(*body, ws);
    if (seg.ok() && seg_path(ws, seg->id) != path) seg = invalid_argument("its name is not its id's hash");
    if (!seg.ok()) {
        quarantine(path, stamp + ws + "-" + name, seg.error().message(), rep);
        return;
    }
    if (status st = validate_segments(std::span<const segment>(&*seg, 1), kinds); !st.ok()) {
        rep.problems.push_back(path + ": " + st.message() + " (kept on disk, not loaded)");
        ++rep.n_skipped;
        return;
    }
    const segment * old = nullptr;
    store_refusal refusal = store_refusal::none;
    if (status st = check_put(ws, *seg, bytes_of(*seg), old, refusal, /*admitted=*/persist_.shared); !st.ok()) {
        rep.problems.push_back(path + ": " + st.message() + " (kept on disk, not loaded)");
        ++rep.n_skipped;
        return;
    }
    if (persist_.shared) seen_[ws][name] = {*version, seg->id};
    insert_locked(ws, std::move(*seg), old);
    ++rep.n_segments;
}

void segment_store::erase_locked(const std::string & ws, const std::string & id) const {
    auto wit = ws_.find(ws);
    if (wit == ws_.end()) return;
    auto sit = wit->second.find(id);
    if (sit == wit->second.end()) return;
    n_bytes_ -= bytes_of(sit->second);
    --n_segments_;
    wit->second.erase(sit);
    if (wit->second.empty()) ws_.erase(wit);
}

void segment_store::refresh_locked(const std::string & ws) const {
    if (!durable() || !persist_.shared) return;
    file_system & fs = *persist_.fs;
    std::map<std::string, file_version> now;
    // A link where the workspace's directory was holds nothing of the store's.
    auto files = check_not_link(ws_dir(ws)).ok() ? fs.list_dir(ws_dir(ws))
                                                  : result<std::vector<std::string>>(not_found("a link"));
    // A directory that cannot be read (the shared filesystem is away) keeps the view as it
    // is; one that does not exist holds nothing.
    if (!files.ok() && files.error().code() != status_code::not_found) return;
    if (files.ok())
        for (const std::string & name : *files)
            if (ends_with(name, k_seg_ext) && is_store_file_name(name))
                if (auto v = fs.stat_file(ws_dir(ws) + "/" + name); v.ok()) now[name] = *v;
    auto & known = seen_[ws];
    for (auto it = known.begin(); it != known.end();) {  // removed by another process
        if (now.count(it->first)) {
            ++it;
            continue;
        }
        if (!it->second.id.empty()) erase_locked(ws, it->second.id);
        it = known.erase(it);
    }
    for (const auto & [name, version] : now) {  // new, or replaced by another process
        auto k = known.find(name);
        if (k != known.end() && k->second.version == version) continue;
        seen_file sf{version, ""};
        // Larger than any segment the store takes (load()'s check): not read at all - a
        // huge or sparse file would cost every request of the workspace its size in memory.
        const bool too_large = version.size > limits_.max_segment_bytes * 7 + 4096;
        result<std::vector<uint8_t>> bytes =
            too_large ? result<std::vector<uint8_t>>(invalid_argument("larger than any segment the store takes"))
                      : fs.read_file(ws_dir(ws) + "/" + name);
        if (!bytes.ok() && !too_large) continue;  // gone meanwhile: the next refresh sees it
        auto body = bytes.ok() ? unseal_store_file(*bytes) : result<std::string>(bytes.error());
        auto seg = body.ok() ? read_segment_body(*body, ws) : result<segment>(body.error());
        const segment * old = nullptr;
        store_refusal why = store_refusal::none;
        // A damaged or refused file is left for load() (at a start) to quarantine or skip.
        if (seg.ok() && seg_path(ws, seg->id) == ws_dir(ws) + "/" + name &&
            validate_segments(std::span<const segment>(&*seg, 1), kinds_).ok() &&
            check_put(ws, *seg, bytes_of(*seg), old, why, /*admitted=*/true).ok()) {
            sf.id = seg->id;
            n_bytes_ = n_bytes_ - (old ? bytes_of(*old) : 0) + bytes_of(*seg);
            if (!old) ++n_segments_;
            ws_[ws][seg->id] = std::move(*seg);
        } else if (k != known.end() && !k->second.id.empty()) {
            erase_locked(ws, k->second.id);
        }
        known[name] = std::move(sf);
    }
    if (known.empty()) seen_.erase(ws);
}

void segment_store::refresh_all_locked(bool now) const {
    if (!durable() || !persist_.shared) return;
    const int64_t t = unix_ms_now();
    if (!now && t - last_full_refresh_ms_ < persist_.shared_refresh_ms) return;
    auto dirs = persist_.fs->list_dir(persist_.dir);
    if (!dirs.ok()) return;  // the shared filesystem is away: the view stays as it is
    last_full_refresh_ms_ = t;
    std::set<std::string> names;
    for (const std::string & ws : *dirs)
        if (ws != k_quarantine_dir && (!is_workspace_id_ || is_workspace_id_(ws))) names.insert(ws);
    for (const auto & [ws, segs] : ws_) names.insert(ws);  // gone from the directory: out of the view
    for (const std::string & ws : names) refresh_locked(ws);
}

status segment_store::check_put(const std::string & ws, const segment & seg, size_t nb, const segment *& old,
                                  store_refusal & refusal, bool admitted) const {
    old = nullptr;
    refusal = store_refusal::none;
    auto refuse = [&](store_refusal why, std::string message) {
        refusal = why;
        return resource_exhausted(std::move(message));
    };
    if (nb > limits_.max_segment_bytes)
        return refuse(store_refusal::segment_too_large,
                      "segment '" + seg.id + "' is " + std::to_string(nb) + " bytes; the store takes at most " +
                          std::to_string(limits_.max_segment_bytes) + " bytes per segment");
    auto wit = ws_.find(ws);
    if (admitted) {
        if (wit != ws_.end())
            if (auto sit = wit->second.find(seg.id); sit != wit->second.end()) old = &sit->second;
        return {};
    }
    if (wit == ws_.end() && ws_.size() >= limits_.max_workspaces)
        return refuse(store_refusal::store_full, "the workspace store holds its maximum of " +
                                                     std::to_string(limits_.max_workspaces) +
                                                     " workspaces; DELETE one first");
    if (wit != ws_.end()) {
        auto sit = wit->second.find(seg.id);
        if (sit != wit->second.end()) old = &sit->second;
        if (!old && wit->second.size() >= limits_.max_segments_per_workspace)
            return refuse(store_refusal::workspace_full, "workspace '" + ws + "' holds its maximum of " +
                                                             std::to_string(limits_.max_segments_per_workspace) +
                                                             " segments");
    }
    const size_t freed = old ? bytes_of(*old) : 0;
    if (n_bytes_ - freed + nb > limits_.max_store_bytes)
        return refuse(store_refusal::store_full, "the workspace store is full (" + std::to_string(n_bytes_) + " of " +
                                                     std::to_string(limits_.max_store_bytes) +
                                                     " bytes); DELETE segments first");
    return {};
}

void segment_store::insert_locked(const std::string & ws, segment seg, const segment * old) {
    const size_t freed = old ? bytes_of(*old) : 0;
    n_bytes_ = n_bytes_ - freed + bytes_of(seg);
    if (!old) ++n_segments_;
    std::string id = seg.id;
    ws_[ws][id] = std::move(seg);
}

status segment_store::put(const std::string & ws, segment seg, bool & created, bool * changed,
                            store_refusal * refusal) {
    store_refusal why = store_refusal::none;
    if (!refusal) refusal = &why;
    *refusal = store_refusal::none;
    std::lock_guard<std::mutex> lk(mu_);
    refresh_locked(ws);
    // Shared: the bounds are the directory's, so the view is the whole directory's first
    // (a new workspace always re-reads it: the workspace count must be right).
    refresh_all_locked(/*now=*/ws_.find(ws) == ws_.end());
    const segment * old = nullptr;
    WARMCTX_RETURN_IF_ERROR(check_put(ws, seg, bytes_of(seg), old, *refusal));
    const bool same = old && old->kind == seg.kind && old->path == seg.path && old->role == seg.role &&
                      old->content == seg.content;
    if (changed) *changed = !same;
    created = old == nullptr;
    if (same) return {};
    if (durable()) {
        nlohmann::json j = {{"workspace", ws},
                            {"id", seg.id},
                            {"kind", segment_kind_name(seg.kind)},
                            {"path", seg.path},
                            {"role", seg.role},
                            {"content", seg.content}};
        const std::string path = seg_path(ws, seg.id);
        const std::string name = path.substr(path.rfind('/') + 1);
        if (status st = write_sealed(ws_dir(ws), name, dump_json(j)); !st.ok()) {
            *refusal = store_refusal::write_failed;
            return st;
        }
        if (persist_.shared)
            if (auto v = persist_.fs->stat_file(path); v.ok()) seen_[ws][name] = {*v, seg.id};
    }
    insert_locked(ws, std::move(seg), old);
    return {};
}

std::optional<segment> segment_store::get(const std::string & ws, const std::string & id) const {
    std::lock_guard<std::mutex> lk(mu_);
    refresh_locked(ws);
    auto wit = ws_.find(ws);
    if (wit == ws_.end()) return std::nullopt;
    auto sit = wit->second.find(id);
    if (sit == wit->second.end()) return std::nullopt;
    return sit->second;
}

std::optional<std::vector<segment>> segment_store::list(const std::string & ws) const {
    std::lock_guard<std::mutex> lk(mu_);
    refresh_locked(ws);
    auto wit = ws_.find(ws);
    if (wit == ws_.end()) return std::nullopt;
    std::vector<segment> out;
    out.reserve(wit->second.size());
    for (const auto & [id, s] : wit->second) out.push_back(s);
    return out;
}

std::vector<std::string> segment_store::workspaces() const {
    std::lock_guard<std::mutex> lk(mu_);
    refresh_all_locked(/*now=*/false);
    std::vector<std::string> out;
    for (const auto & [id, m] : ws_) out.push_back(id);
    return out;
}

result<bool> segment_store::erase(const std::string & ws, const std::string & id) {
    std::lock_guard<std::mutex> lk(mu_);
    refresh_locked(ws);
    auto wit = ws_.find(ws);
    if (wit == ws_.end()) return false;
    auto sit = wit->second.find(id);
    if (sit == wit->second.end()) return false;
    if (durable()) {
        if (status st = check_not_link(ws_dir(ws)); !st.ok()) return st;
        status st = persist_.fs->remove_file(seg_path(ws, id));
        if (st.ok() || st.code() == status_code::not_found) st = persist_.fs->sync_dir(ws_dir(ws));
        if (!st.ok()) {
            ++n_write_failures_;
            return st;
        }
    }
    if (persist_.shared)
        if (auto k = seen_.find(ws); k != seen_.end()) k->second.erase(seg_path(ws, id).substr(ws_dir(ws).size() + 1));
    n_bytes_ -= bytes_of(sit->second);
    --n_segments_;
    wit->second.erase(sit);
    if (wit->second.empty()) {  // a workspace exists while it holds a segment
        ws_.erase(wit);
        uses_.erase(ws);
        if (durable()) {
            (void)persist_.fs->remove_file(ws_dir(ws) + "/" + k_uses_name);
            (void)persist_.fs->sync_dir(ws_dir(ws));
        }
    }
    return true;
}

result<size_t> segment_store::drop(const std::string & ws) {
    std::lock_guard<std::mutex> lk(mu_);
    refresh_locked(ws);
    auto wit = ws_.find(ws);
    if (wit == ws_.end()) return size_t{0};
    if (durable()) {
        file_system & fs = *persist_.fs;
        WARMCTX_RETURN_IF_ERROR(check_not_link(ws_dir(ws)));
        for (const auto & [id, sg] : wit->second) {
            status st = fs.remove_file(seg_path(ws, id));
            if (!st.ok() && st.code() != status_code::not_found) {
                ++n_write_failures_;
                (void)fs.sync_dir(ws_dir(ws));
                return st;  // the segments removed so far are gone on restart; memory keeps all
            }
        }
        (void)fs.remove_file(ws_dir(ws) + "/" + k_uses_name);
        if (status st = fs.sync_dir(ws_dir(ws)); !st.ok()) {
            ++n_write_failures_;
            return st;
        }
    }
    seen_.erase(ws);
    size_t n = wit->second.size();
    for (const auto & [id, s] : wit->second) n_bytes_ -= bytes_of(s);
    n_segments_ -= n;
    ws_.erase(wit);
    uses_.erase(ws);
    return n;
}

void segment_store::note_use(const std::string & ws) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!ws_.count(ws)) return;
    auto & u = uses_[ws];
    ++u.uses;
    u.last_used_unix_ms = unix_ms_now();
    u.dirty = true;
}

std::vector<std::string> segment_store::use_order() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::pair<use_record, std::string>> v;
    for (const auto & [ws, m] : ws_) {
        auto it = uses_.find(ws);
        v.emplace_back(it == uses_.end() ? use_record{} : it->second, ws);
    }
    std::stable_sort(v.begin(), v.end(), [](const auto & a, const auto & b) {
        if (a.first.uses != b.first.uses) return a.first.uses > b.first.uses;
        return a.first.last_used_unix_ms > b.first.last_used_unix_ms;
    });
    std::vector<std::string> out;
    for (auto & [u, ws] : v) out.push_back(ws);
    return out;
}

status segment_store::flush_uses() {
    std::lock_guard<std::mutex> lk(mu_);
    if (!durable()) return {};
    status first;
    for (auto & [ws, u] : uses_) {
        if (!u.dirty || !ws_.count(ws)) continue;
        nlohmann::json j = {{"uses", u.uses}, {"last_used_unix_ms", u.last_used_unix_ms}};
        status st = write_sealed(ws_dir(ws), k_uses_name, dump_json(j));
        if (st.ok()) u.dirty = false;
        else if (first.ok()) first = st;
    }
    return first;
}

uint64_t segment_store::n_write_failures() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_write_failures_;
}

size_t segment_store::n_bytes() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_bytes_;
}

size_t segment_store::n_segments() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_segments_;
}

}  // namespace warmctx
