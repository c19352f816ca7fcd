#include "server/link_reports.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradmesh::server {
namespace {

using ::testing::ElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
constexpr absl::Duration kSettle = absl::Seconds(3);
constexpr absl::Duration kQuarantine = absl::Seconds(30);

const absl::flat_hash_set<std::string> kMembers = {"a", "b", "c", "d"};

// A node cut off from every peer is named by all of them, and it names them
// all; the one named most goes, not the first one named.
TEST(LinkReportsTest, TheMemberNamedByTheMostGoes) {
  LinkReports reports(kSettle, kQuarantine);
  reports.Update("a", {"b", "c", "d"}, kT0);  // a heard first
  reports.Update("b", {"a"}, kT0 + absl::Seconds(1));
  reports.Update("c", {"a"}, kT0 + absl::Seconds(1));
  reports.Update("d", {"a"}, kT0 + absl::Seconds(2));
  // Nothing until the newest report has stood the settle time: a's alone
  // would name d (one each, the last in node-id order).
  EXPECT_FALSE(reports.Choose(kMembers, kT0 + kSettle).has_value());
  const std::optional<LinkReports::Verdict> settled =
      reports.Choose(kMembers, kT0 + absl::Seconds(2) + kSettle);
  ASSERT_TRUE(settled.has_value());
  EXPECT_EQ(settled->node_id, "a");
  EXPECT_THAT(settled->reporters, ElementsAre("b", "c", "d"));
}

// Of the two ends of one bad link, one goes: the last in node-id order.
TEST(LinkReportsTest, OneEndOfABadLinkGoes) {
  LinkReports reports(kSettle, kQuarantine);
  reports.Update("b", {"c"}, kT0);
  reports.Update("c", {"b"}, kT0);
  EXPECT_FALSE(reports.Choose(kMembers, kT0 + kSettle - absl::Nanoseconds(1))
                   .has_value());
  const std::optional<LinkReports::Verdict> verdict =
      reports.Choose(kMembers, kT0 + kSettle);
  ASSERT_TRUE(verdict.has_value());
  EXPECT_EQ(verdict->node_id, "c");
  EXPECT_THAT(verdict->reporters, ElementsAre("b"));
}

// A report keeps the time it was first made while it is repeated; one not
// repeated is forgotten, and so are reports by or about non-members and a
// member's own name.
TEST(LinkReportsTest, OnlyStandingReportsAboutMembersCount) {
  LinkReports reports(kSettle, kQuarantine);
  reports.Update("a", {"b"}, kT0);
  reports.Update("a", {"b"}, kT0 + absl::Seconds(2));  // still since kT0
  EXPECT_TRUE(reports.Choose(kMembers, kT0 + kSettle).has_value());
  reports.Update("a", {}, kT0 + absl::Seconds(3));  // b is reachable again
  EXPECT_FALSE(reports.Choose(kMembers, kT0 + absl::Minutes(1)).has_value());
  reports.Update("a", {"b"}, kT0 + absl::Seconds(4));  // a new report
  EXPECT_FALSE(reports.Choose(kMembers, kT0 + absl::Seconds(5)).has_value());
  EXPECT_TRUE(reports.Choose(kMembers, kT0 + absl::Seconds(7)).has_value());
  reports.Forget("b");  // b left: reports about it go
  EXPECT_FALSE(reports.Choose(kMembers, kT0 + absl::Minutes(1)).has_value());
  reports.Update("a", {"b"}, kT0);
  reports.Forget("a");  // a left: its reports go
  EXPECT_FALSE(reports.Choose(kMembers, kT0 + absl::Minutes(1)).has_value());

  reports.Update("x", {"b"}, kT0);  // not a member
  reports.Update("c", {"c", "y"}, kT0);
  EXPECT_FALSE(reports.Choose(kMembers, kT0 + absl::Minutes(1)).has_value());
}

// The removed process is kept out for the quarantine, doubled at each
// removal (to 16x); a new process of the node is not.
TEST(LinkReportsTest, TheRemovedProcessIsKeptOutForLongerEachTime) {
  LinkReports reports(kSettle, kQuarantine);
  EXPECT_EQ(reports.KeepOut("b", 7, kT0), kQuarantine);
  absl::Status refused = reports.MayJoin("b", 7, kT0 + absl::Seconds(29));
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("1.0 s more"));
  EXPECT_TRUE(reports.MayJoin("b", 8, kT0).ok());  // restarted
  EXPECT_TRUE(reports.MayJoin("a", 7, kT0).ok());
  EXPECT_TRUE(reports.MayJoin("b", 7, kT0 + kQuarantine).ok());

  EXPECT_EQ(reports.KeepOut("b", 7, kT0), 2 * kQuarantine);
  EXPECT_EQ(reports.KeepOut("b", 7, kT0), 4 * kQuarantine);
  EXPECT_EQ(reports.KeepOut("b", 7, kT0), 8 * kQuarantine);
  EXPECT_EQ(reports.KeepOut("b", 7, kT0), 16 * kQuarantine);
  EXPECT_EQ(reports.KeepOut("b", 7, kT0), 16 * kQuarantine);
  EXPECT_EQ(reports.KeepOut("b", 8, kT0), kQuarantine);  // a new process
  EXPECT_EQ(reports.removals().at("b"), 7);
}

}  // namespace
}  // namespace gradmesh::server
