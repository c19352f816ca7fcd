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

// A node cut off from every peer names them all, first, and each of them
// names it: its own reports do not count (it names more than half of the
// others), so it goes, not the last peer it named.
TEST(LinkReportsTest, ANodeCutOffFromEveryPeerGoes) {
  LinkReports reports(kSettle, kQuarantine);
  reports.Update("a", {"b", "c", "d"}, kT0);
  EXPECT_EQ(reports.Choose(kMembers, kT0 + kSettle), std::nullopt);
  reports.Update("b", {"a"}, kT0 + absl::Seconds(1));
  reports.Update("c", {"a"}, kT0 + absl::Seconds(2));
  // Not before every report has stood the settle time.
  EXPECT_EQ(reports.Choose(kMembers, kT0 + absl::Seconds(1) + kSettle),
            std::nullopt);
  const std::optional<LinkReports::Verdict> verdict =
      reports.Choose(kMembers, kT0 + absl::Seconds(2) + kSettle);
  ASSERT_TRUE(verdict.has_value());
  EXPECT_EQ(verdict->node_id, "a");
  EXPECT_THAT(verdict->reporters, ElementsAre("b", "c"));
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

// On a ring, a node cut off is named by its predecessor and names its
// successor, whichever report comes first: the tie goes to the one that
// reports others.
TEST(LinkReportsTest, ATieGoesToTheMemberThatReportsOthers) {
  LinkReports reports(kSettle, kQuarantine);
  reports.Update("b", {"c"}, kT0);  // a -> b (cut) -> c
  reports.Update("a", {"b"}, kT0 + absl::Milliseconds(500));
  EXPECT_EQ(reports.Choose(kMembers, kT0 + kSettle), std::nullopt);
  const std::optional<LinkReports::Verdict> verdict =
      reports.Choose(kMembers, kT0 + absl::Milliseconds(500) + kSettle);
  ASSERT_TRUE(verdict.has_value());
  EXPECT_EQ(verdict->node_id, "b");
}

// New reports put the choice off, but not past twice the settle time from
// the oldest.
TEST(LinkReportsTest, NewReportsDoNotPutTheChoiceOffForEver) {
  LinkReports reports(kSettle, kQuarantine);
  reports.Update("a", {"b"}, kT0);
  reports.Update("c", {"d"}, kT0 + absl::Seconds(5));
  EXPECT_EQ(reports.Choose(kMembers, kT0 + 2 * kSettle - absl::Seconds(1)),
            std::nullopt);
  EXPECT_TRUE(reports.Choose(kMembers, kT0 + 2 * kSettle).has_value());
}

// One reporter naming most of the others (starved, or cut off itself)
// removes nobody; with two members, one report is enough.
TEST(LinkReportsTest, AReporterNamingMostOthersDoesNotCount) {
  LinkReports reports(kSettle, kQuarantine);
  reports.Update("a", {"b", "c"}, kT0);
  EXPECT_EQ(reports.Choose(kMembers, kT0 + kSettle), std::nullopt);
  const std::optional<LinkReports::Verdict> pair =
      reports.Choose({"a", "b"}, kT0 + kSettle);
  ASSERT_TRUE(pair.has_value());
  EXPECT_EQ(pair->node_id, "b");
}

// A report keeps the time it was first made while it is repeated; one not
// repeated is forgotten, and so are reports by or about non-members, a
// member's own name, and every report once the members change.
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
  reports.ForgetReports();
  EXPECT_FALSE(reports.Choose(kMembers, kT0 + absl::Minutes(1)).has_value());

  reports.Update("x", {"b"}, kT0);  // not a member
  reports.Update("c", {"c", "y"}, kT0);
  EXPECT_FALSE(reports.Choose(kMembers, kT0 + absl::Minutes(1)).has_value());
}

// A coordinator that could not watch (paused) does not count that time.
TEST(LinkReportsTest, TimeTheCoordinatorDidNotWatchDoesNotSettleReports) {
  LinkReports reports(kSettle, kQuarantine);
  reports.Update("a", {"b"}, kT0);
  const absl::Time later = kT0 + absl::Seconds(10);
  reports.Excuse(absl::Seconds(9), later);
  EXPECT_FALSE(reports.Choose(kMembers, later).has_value());
  EXPECT_TRUE(reports.Choose(kMembers, later + absl::Seconds(2)).has_value());
}

// The removed node is kept out for the quarantine, doubled at each removal
// (to 16x), whatever its process; the count starts over once it has stayed
// in for 16 quarantines.
TEST(LinkReportsTest, TheRemovedNodeIsKeptOutForLongerEachTime) {
  LinkReports reports(kSettle, kQuarantine);
  EXPECT_EQ(reports.KeepOut("b", kT0), kQuarantine);
  const absl::Status refused = reports.MayJoin("b", kT0 + absl::Seconds(29));
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("kept out for 30 s"));
  EXPECT_EQ(reports.MayJoin("b", kT0 + absl::Seconds(1)), refused);  // same
  EXPECT_TRUE(reports.MayJoin("a", kT0).ok());
  EXPECT_TRUE(reports.MayJoin("b", kT0 + kQuarantine).ok());

  EXPECT_EQ(reports.KeepOut("b", kT0), 2 * kQuarantine);
  EXPECT_EQ(reports.KeepOut("b", kT0), 4 * kQuarantine);
  EXPECT_EQ(reports.KeepOut("b", kT0), 8 * kQuarantine);
  EXPECT_EQ(reports.KeepOut("b", kT0), 16 * kQuarantine);
  EXPECT_EQ(reports.KeepOut("b", kT0), 16 * kQuarantine);
  const absl::Time much_later = kT0 + 16 * kQuarantine + 17 * kQuarantine;
  EXPECT_EQ(reports.KeepOut("b", much_later), kQuarantine);
}

// The quarantines in force are listed by node id; one learned from an earlier
// coordinator's view counts in full from now, within this one's bounds, and
// never shortens a longer one.
TEST(LinkReportsTest, QuarantinesAreListedAndAdoptedWithinBounds) {
  LinkReports reports(kSettle, kQuarantine);
  reports.KeepOut("c", kT0);
  reports.KeepOut("b", kT0);
  reports.KeepOut("b", kT0);
  using Q = LinkReports::Quarantine;
  EXPECT_THAT(
      reports.Quarantines(kT0),
      ElementsAre(Q{.node_id = "b", .length = 2 * kQuarantine, .strikes = 2},
                  Q{.node_id = "c", .length = kQuarantine, .strikes = 1}));
  // c is back, on probation (length zero), for 16 quarantines.
  EXPECT_THAT(
      reports.Quarantines(kT0 + kQuarantine),
      ElementsAre(
          Q{.node_id = "b", .length = 2 * kQuarantine, .strikes = 2},
          Q{.node_id = "c", .length = absl::ZeroDuration(), .strikes = 1}));
  EXPECT_THAT(
      reports.Quarantines(kT0 + 17 * kQuarantine + absl::Seconds(1)),
      ElementsAre(
          Q{.node_id = "b", .length = absl::ZeroDuration(), .strikes = 2}));
  EXPECT_TRUE(
      reports.Quarantines(kT0 + 18 * kQuarantine + absl::Seconds(1)).empty());

  LinkReports adopted(kSettle, kQuarantine);
  const absl::Time t = kT0 + absl::Seconds(100);
  adopted.Adopt({.node_id = "b", .length = absl::Hours(100), .strikes = 99}, t);
  adopted.Adopt({.node_id = "c", .length = -absl::Seconds(1)}, t);
  adopted.Adopt({.node_id = "", .length = kQuarantine}, t);
  EXPECT_THAT(
      adopted.Quarantines(t),
      ElementsAre(
          Q{.node_id = "b", .length = 16 * kQuarantine, .strikes = 5},
          Q{.node_id = "c", .length = absl::ZeroDuration(), .strikes = 1}));
  adopted.Adopt({.node_id = "b", .length = kQuarantine, .strikes = 1}, t);
  adopted.Adopt({.node_id = "b", .length = absl::ZeroDuration()}, t);
  EXPECT_TRUE(absl::IsUnavailable(
      adopted.MayJoin("b", t + 16 * kQuarantine - absl::Seconds(1))));
  EXPECT_TRUE(adopted.MayJoin("b", t + 16 * kQuarantine).ok());
  // On probation: it may join (while it reaches every member), and its
  // next removal counts as a second in a row.
  EXPECT_TRUE(adopted.MayJoin("c", t).ok());
  EXPECT_TRUE(adopted.OnProbation("c", t + 16 * kQuarantine));
  EXPECT_FALSE(adopted.OnProbation("c", t + 17 * kQuarantine));
  EXPECT_EQ(adopted.KeepOut("c", t + kQuarantine), 2 * kQuarantine);
}

}  // namespace
}  // namespace gradmesh::server
