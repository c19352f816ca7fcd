// The step protocol alone: the vote, promises to peers in doubt, resolution
// in doubt and the outcome table's memory, with the all-gather and the peers
// faked and time on a fake clock (a pause moves it to its end at once).
#include "worker/daemon/step_protocol.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradmesh::daemon {
namespace {

class FakeClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  bool AwaitWithDeadline(absl::Mutex*, const absl::Condition& condition,
                         absl::Time deadline) const override {
    if (condition.Eval()) return true;
    absl::MutexLock lock(&mu_);
    now_ = std::max(now_, deadline);
    return false;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ = absl::FromUnixSeconds(1000);
};

constexpr OutcomeKey kKey{.bucket_id = 7, .step = 3, .epoch = 2};
constexpr uint64_t kDigest = 0x1234;

std::string YesVote(uint64_t digest) {
  std::string vote = "y";
  vote.append(reinterpret_cast<const char*>(&digest), sizeof(digest));
  return vote;
}

// Rank 0 of three members, m0..m2.
Group ThreeMembers(uint64_t epoch = 2) {
  Group g;
  g.view.epoch = epoch;
  g.view.member_ids = {"m0", "m1", "m2"};
  g.view.addresses = {"a0", "a1", "a2"};
  g.rank = 0;
  return g;
}

class StepProtocolTest : public ::testing::Test {
 protected:
  // The other members vote `theirs`; `mine` records this worker's vote.
  StepPeers VotingPeers(std::string theirs) {
    return {.gather = [this, theirs](const Group& g, uint64_t operation,
                                     std::string vote, absl::Time) {
      mine_ = vote;
      operation_ = operation;
      std::vector<std::string> votes(g.size(), theirs);
      votes[g.rank] = vote;
      return absl::StatusOr<std::vector<std::string>>(votes);
    }};
  }
  // The gather fails; peers answer with `answers[rank]` (an error status:
  // unreachable).
  StepPeers InDoubtPeers(std::vector<absl::StatusOr<Outcome>> answers) {
    return {
        .gather = [](const Group&, uint64_t, std::string,
                     absl::Time) -> absl::StatusOr<std::vector<std::string>> {
          return absl::DeadlineExceededError("votes did not come");
        },
        .ask_outcome =
            [answers](const std::string& address, const OutcomeKey& key,
                      absl::Time) {
              EXPECT_EQ(key, kKey);
              return answers[address[1] - '0'];
            }};
  }

  absl::Status Vote(StepProtocol& protocol, bool yes = true) {
    refused_ = false;
    return protocol.Vote(ThreeMembers(), kKey, /*operation=*/99, yes, kDigest,
                         clock_.Now() + absl::Seconds(10), &refused_);
  }

  FakeClock clock_;
  std::string mine_;
  uint64_t operation_ = 0;
  bool refused_ = false;
};

TEST_F(StepProtocolTest, EveryYesForTheSameResultCommits) {
  StepProtocol protocol(VotingPeers(YesVote(kDigest)), &clock_, nullptr, {});
  EXPECT_TRUE(Vote(protocol).ok());
  EXPECT_EQ(mine_, YesVote(kDigest));
  EXPECT_EQ(operation_, 99u);
  EXPECT_EQ(protocol.Decide(kKey, true), Outcome::kCommitted);
}

TEST_F(StepProtocolTest, ANoVoteAbortsTheStep) {
  StepProtocol protocol(VotingPeers("n"), &clock_, nullptr, {});
  const absl::Status status = Vote(protocol);
  EXPECT_TRUE(absl::IsAborted(status)) << status;
  EXPECT_TRUE(refused_);
  EXPECT_EQ(protocol.Decide(kKey, true), Outcome::kAborted);
}

TEST_F(StepProtocolTest, DifferingResultsAbortTheStep) {
  StepProtocol protocol(VotingPeers(YesVote(kDigest + 1)), &clock_, nullptr,
                        {});
  const absl::Status status = Vote(protocol);
  EXPECT_TRUE(absl::IsAborted(status)) << status;
  EXPECT_NE(status.message().find("differs"), absl::string_view::npos);
  EXPECT_TRUE(refused_);
}

TEST_F(StepProtocolTest, AClientThatGaveUpVotesNo) {
  StepProtocol protocol(VotingPeers(YesVote(kDigest)), &clock_, nullptr, {});
  EXPECT_TRUE(absl::IsAborted(Vote(protocol, /*yes=*/false)));
  EXPECT_EQ(mine_, "n");
}

TEST_F(StepProtocolTest, APromiseToAPeerInDoubtTurnsTheVoteIntoANo) {
  StepProtocol protocol(VotingPeers(YesVote(kDigest)), &clock_, nullptr, {});
  EXPECT_EQ(protocol.Decide(kKey, /*holds_registration=*/true),
            Outcome::kAborted);
  EXPECT_TRUE(absl::IsAborted(Vote(protocol)));
  EXPECT_EQ(mine_, "n");
  EXPECT_EQ(protocol.Decide(kKey, true), Outcome::kAborted);
}

TEST_F(StepProtocolTest, APeerAskingDuringTheVoteHearsItIsUndecided) {
  StepProtocol* self = nullptr;
  Outcome heard = Outcome::kAborted;
  StepProtocol protocol(
      {.gather = [&](const Group& g, uint64_t, std::string vote,
                     absl::Time) -> absl::StatusOr<std::vector<std::string>> {
        heard = self->Decide(kKey, /*holds_registration=*/true);
        return std::vector<std::string>(g.size(), vote);
      }},
      &clock_, nullptr, {});
  self = &protocol;
  EXPECT_TRUE(Vote(protocol).ok());
  // This worker voted yes: no promise to refuse, and the step applies.
  EXPECT_EQ(heard, Outcome::kVoting);
  EXPECT_EQ(protocol.Decide(kKey, true), Outcome::kCommitted);
}

TEST_F(StepProtocolTest, WithoutTheRegistrationDecidePromisesNothing) {
  StepProtocol protocol(VotingPeers(YesVote(kDigest)), &clock_, nullptr, {});
  EXPECT_EQ(protocol.Decide(kKey, /*holds_registration=*/false),
            Outcome::kInDoubt);
  EXPECT_TRUE(Vote(protocol).ok());
  EXPECT_EQ(mine_, YesVote(kDigest));
}

TEST_F(StepProtocolTest, InDoubtAppliesTheStepWhenAPeerDid) {
  StepProtocol protocol(
      InDoubtPeers({Outcome::kInDoubt, Outcome::kVoting, Outcome::kCommitted}),
      &clock_, nullptr, {});
  EXPECT_TRUE(Vote(protocol).ok());
  EXPECT_EQ(protocol.Decide(kKey, true), Outcome::kCommitted);
}

TEST_F(StepProtocolTest, InDoubtAbortsWhenAPeerRefused) {
  StepProtocol protocol(
      InDoubtPeers({Outcome::kInDoubt, Outcome::kAborted, Outcome::kVoting}),
      &clock_, nullptr, {});
  EXPECT_TRUE(absl::IsDeadlineExceeded(Vote(protocol)));
  EXPECT_EQ(protocol.Decide(kKey, true), Outcome::kAborted);
}

TEST_F(StepProtocolTest, InDoubtWithNoOneToAskKeepsTheCauseAndDecidesNothing) {
  StepPeers peers = InDoubtPeers({});
  peers.ask_outcome = nullptr;
  StepProtocol protocol(std::move(peers), &clock_, nullptr, {});
  EXPECT_TRUE(absl::IsDeadlineExceeded(Vote(protocol)));
  // An abort settled on in doubt is not a decision others may follow.
  EXPECT_EQ(protocol.Decide(kKey, true), Outcome::kInDoubt);
}

TEST_F(StepProtocolTest, APeerUnreachableWhileAMemberEndsInDataLoss) {
  const absl::Status gone = absl::UnavailableError("connection refused");
  StepProtocol protocol(InDoubtPeers({Outcome::kInDoubt, gone, gone}), &clock_,
                        nullptr, {.view_wait = absl::Seconds(5)});
  const absl::Time start = clock_.Now();
  const absl::Status status = Vote(protocol);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  // It asked until the deadline (10 s) and view_wait had passed, no longer
  // than one more pause.
  EXPECT_GE(clock_.Now() - start, absl::Seconds(15));
  EXPECT_LE(clock_.Now() - start, absl::Seconds(16));
}

TEST_F(StepProtocolTest, PeersANewerViewLeftOutAreGoneNotUndecided) {
  const absl::Status gone = absl::UnavailableError("connection refused");
  StepPeers peers = InDoubtPeers({Outcome::kInDoubt, gone, gone});
  auto newer = std::make_shared<Group>(ThreeMembers(/*epoch=*/3));
  newer->view.member_ids = {"m0"};
  peers.current = [newer] { return newer; };
  StepProtocol protocol(std::move(peers), &clock_, nullptr, {});
  const absl::Time start = clock_.Now();
  EXPECT_TRUE(absl::IsDeadlineExceeded(Vote(protocol)));
  EXPECT_EQ(clock_.Now(), start);  // decided at the first round of asking
  EXPECT_EQ(protocol.Decide(kKey, true), Outcome::kInDoubt);
}

TEST_F(StepProtocolTest, DecidedOutcomesAreForgottenPastTheLimitAndRetention) {
  StepProtocol protocol(VotingPeers("n"), &clock_, nullptr,
                        {.outcome_retention = absl::Minutes(5)});
  const auto key = [](uint64_t i) {
    return OutcomeKey{.bucket_id = 1, .step = i, .epoch = 1};
  };
  const uint64_t count = StepProtocol::kOutcomesKept + 10;
  for (uint64_t i = 0; i < count; ++i) protocol.Decide(key(i), true);
  // Past the limit but within the retention: every promise is kept.
  EXPECT_EQ(protocol.Decide(key(0), false), Outcome::kAborted);
  clock_.Advance(absl::Minutes(6));
  protocol.Decide(key(count), true);
  // The oldest are gone down to the limit; the newest stay.
  EXPECT_EQ(protocol.Decide(key(0), false), Outcome::kInDoubt);
  EXPECT_EQ(protocol.Decide(key(count), false), Outcome::kAborted);
}

}  // namespace
}  // namespace gradmesh::daemon
