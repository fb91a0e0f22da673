// merge_stored_segments: how a chat on a stored workspace combines the stored segments
// with the request's own (POST /v1/workspaces/{id}/chat/completions). No model.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/workspace_store.h"

namespace warmctx::server_detail {
namespace {

segment seg(std::string id, std::string content, segment_kind k = segment_kind::instructions) {
    return segment{std::move(id), k, "", "", std::move(content)};
}

std::vector<std::string> ids_and_contents(const std::vector<segment> & v) {
    std::vector<std::string> out;
    for (const segment & s : v) out.push_back(s.id + "=" + s.content);
    return out;
}

TEST(merge_stored_segments_test, request_segments_replace_stored_ones_of_the_same_id) {
    auto m = merge_stored_segments({seg("a", "1"), seg("b", "2"), seg("c", "3")}, {seg("x", "9"), seg("b", "new")});
    EXPECT_EQ(ids_and_contents(m), (std::vector<std::string>{"a=1", "c=3", "x=9", "b=new"}));
}

TEST(merge_stored_segments_test, stored_first_then_the_request_in_its_order) {
    auto m = merge_stored_segments({seg("b", "2"), seg("d", "4")}, {seg("z", "26", segment_kind::user), seg("a", "1")});
    EXPECT_EQ(ids_and_contents(m), (std::vector<std::string>{"b=2", "d=4", "z=26", "a=1"}));
    EXPECT_EQ(m[2].kind, segment_kind::user);
}

TEST(merge_stored_segments_test, either_side_empty) {
    EXPECT_EQ(ids_and_contents(merge_stored_segments({seg("a", "1")}, {})), (std::vector<std::string>{"a=1"}));
    EXPECT_EQ(ids_and_contents(merge_stored_segments({}, {seg("a", "1")})), (std::vector<std::string>{"a=1"}));
    EXPECT_TRUE(merge_stored_segments({}, {}).empty());
}

TEST(merge_stored_segments_test, duplicates_within_the_request_are_left_for_validation) {
    auto m = merge_stored_segments({seg("a", "1"), seg("b", "2")}, {seg("a", "x"), seg("a", "y")});
    EXPECT_EQ(ids_and_contents(m), (std::vector<std::string>{"b=2", "a=x", "a=y"}));
}

TEST(merge_stored_segments_test, a_replacement_may_change_the_kind_path_and_role) {
    segment r = seg("a", "x", segment_kind::diff);
    r.path = "f.cc";
    r.role = "user";
    auto m = merge_stored_segments({seg("a", "1")}, {r});
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0].kind, segment_kind::diff);
    EXPECT_EQ(m[0].path, "f.cc");
    EXPECT_EQ(m[0].role, "user");
}

}  // namespace
}  // namespace warmctx::server_detail
