#include "workspace_store.h"

#include <set>

namespace warmctx::server_detail {

maybe_error workspace_store::put(const std::string & ws, segment seg, bool & created) {
    const size_t nb = bytes_of(seg);
    if (nb > limits_.max_segment_bytes)
        return payload_too_large("segment '" + seg.id + "' is " + std::to_string(nb) +
                                 " bytes; the store takes at most " + std::to_string(limits_.max_segment_bytes) +
                                 " bytes per segment");
    std::lock_guard<std::mutex> lk(mu_);
    auto wit = ws_.find(ws);
    if (wit == ws_.end() && ws_.size() >= limits_.max_workspaces)
        return too_many_requests("store_full",
                                 "the workspace store holds its maximum of " + std::to_string(limits_.max_workspaces) +
                                     " workspaces; DELETE one first",
                                 0);
    const segment * old = nullptr;
    if (wit != ws_.end()) {
        auto sit = wit->second.find(seg.id);
        if (sit != wit->second.end()) old = &sit->second;
        if (!old && wit->second.size() >= limits_.max_segments_per_workspace)
            return too_many_requests("workspace_full",
                                     "workspace '" + ws + "' holds its maximum of " +
                                         std::to_string(limits_.max_segments_per_workspace) + " segments",
                                     0);
    }
    const size_t freed = old ? bytes_of(*old) : 0;
    if (n_bytes_ - freed + nb > limits_.max_store_bytes)
        return too_many_requests("store_full",
                                 "the workspace store is full (" + std::to_string(n_bytes_) + " of " +
                                     std::to_string(limits_.max_store_bytes) + " bytes); DELETE segments first",
                                 0);
    created = old == nullptr;
    n_bytes_ = n_bytes_ - freed + nb;
    if (created) ++n_segments_;
    std::string id = seg.id;
    ws_[ws][id] = std::move(seg);
    return std::nullopt;
}

std::optional<segment> workspace_store::get(const std::string & ws, const std::string & id) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto wit = ws_.find(ws);
    if (wit == ws_.end()) return std::nullopt;
    auto sit = wit->second.find(id);
    if (sit == wit->second.end()) return std::nullopt;
    return sit->second;
}

std::optional<std::vector<segment>> workspace_store::list(const std::string & ws) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto wit = ws_.find(ws);
    if (wit == ws_.end()) return std::nullopt;
    std::vector<segment> out;
    out.reserve(wit->second.size());
    for (const auto & [id, s] : wit->second) out.push_back(s);
    return out;
}

std::vector<std::string> workspace_store::workspaces() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::string> out;
    for (const auto & [id, m] : ws_) out.push_back(id);
    return out;
}

bool workspace_store::erase(const std::string & ws, const std::string & id) {
    std::lock_guard<std::mutex> lk(mu_);
    auto wit = ws_.find(ws);
    if (wit == ws_.end()) return false;
    auto sit = wit->second.find(id);
    if (sit == wit->second.end()) return false;
    n_bytes_ -= bytes_of(sit->second);
    --n_segments_;
    wit->second.erase(sit);
    if (wit->second.empty()) ws_.erase(wit);  // a workspace exists while it holds a segment
    return true;
}

size_t workspace_store::drop(const std::string & ws) {
    std::lock_guard<std::mutex> lk(mu_);
    auto wit = ws_.find(ws);
    if (wit == ws_.end()) return 0;
    size_t n = wit->second.size();
    for (const auto & [id, s] : wit->second) n_bytes_ -= bytes_of(s);
    n_segments_ -= n;
    ws_.erase(wit);
    return n;
}

size_t workspace_store::n_bytes() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_bytes_;
}

size_t workspace_store::n_segments() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_segments_;
}

std::vector<segment> merge_stored_segments(std::vector<segment> stored, std::vector<segment> request) {
    std::set<std::string> ids;
    for (const segment & s : request) ids.insert(s.id);
    std::vector<segment> merged;
    for (segment & s : stored)
        if (!ids.count(s.id)) merged.push_back(std::move(s));
    for (segment & s : request) merged.push_back(std::move(s));
    return merged;
}

}  // namespace warmctx::server_detail
