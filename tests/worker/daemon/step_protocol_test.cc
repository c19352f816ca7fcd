// The step protocol alone: the agreement, the vote, promises to peers in
// doubt, resolution in doubt and the outcome table's memory, with the
// all-gather and the peers faked, then with several members over the loopback
// and fault-injecting transports; time on a fake clock (a pause moves it to
// its end at once).
#include "worker/daemon/step_protocol.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/group_ops.h"
#include "worker/transport/fault_injection.h"
#include "worker/transport/loopback.h"

namespace gradmesh::daemon {
namespace {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1000))
      : now_(start) {}
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
  mutable absl::Time now_;
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
                                     std::string vote, absl::Time, double*) {
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
    return {.gather = [](const Group&, uint64_t, std::string, absl::Time,
                         double*) -> absl::StatusOr<std::vector<std::string>> {
              return absl::DeadlineExceededError("votes did not come");
            },
            .ask_outcome =
                [answers](const std::string& address, const OutcomeKey& key,
                          const std::vector<std::string>&, absl::Time) {
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
      {.gather = [&](const Group& g, uint64_t, std::string vote, absl::Time,
                     double*) -> absl::StatusOr<std::vector<std::string>> {
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

TEST_F(StepProtocolTest, AnswerInDoubtStopsLearningFromTheMembersNamedGone) {
  // m2 applied the step; this worker (m0) is in doubt. m1, in doubt too,
  // asks it naming m2 gone (a newer view left m2 out) and hears "in doubt":
  // m1 may give the step up on that answer, so m2's "applied" no longer
  // counts here. It names m2 gone in its next round's questions, then gives
  // the step up as well.
  StepProtocol* self = nullptr;
  std::vector<std::vector<std::string>> named;
  StepPeers peers = InDoubtPeers({});
  peers.ask_outcome = [&](const std::string& address, const OutcomeKey& key,
                          const std::vector<std::string>& gone,
                          absl::Time) -> absl::StatusOr<Outcome> {
    if (address == "a2") return Outcome::kCommitted;
    named.push_back(gone);
    EXPECT_EQ(self->Decide(key, true, {"m2"}), Outcome::kInDoubt);
    return Outcome::kInDoubt;
  };
  StepProtocol protocol(std::move(peers), &clock_, nullptr, {});
  self = &protocol;
  EXPECT_TRUE(absl::IsDeadlineExceeded(Vote(protocol)));
  EXPECT_EQ(protocol.Decide(kKey, true), Outcome::kInDoubt);
  // The first round's questions went out before m1's: a second names m2.
  EXPECT_THAT(named, ::testing::ElementsAre(::testing::IsEmpty(),
                                            ::testing::ElementsAre("m2")));
}

// m0 sees a newer view that left m2 out; m1 does not. m2 applied the step
// and both can reach it. m0 names m2 gone to m1, so m1 stops following m2;
// m1 must then name m2 gone in its own questions, or m0, whose answer let m1
// give the step up, would still follow m2 and apply it.
TEST_F(StepProtocolTest, WorkersInDoubtPassOnTheMembersNamedGone) {
  auto newer = std::make_shared<Group>(ThreeMembers(/*epoch=*/3));
  newer->view.member_ids = {"m0", "m1"};
  std::unique_ptr<StepProtocol> m0, m1;
  absl::Notification m1_asking, m1_bound, m1_done;
  // The questions to peers go out in parallel: each is told once.
  std::once_flag asking_once, bound_once;
  StepPeers m0_peers = InDoubtPeers({});
  m0_peers.current = [newer] { return newer; };
  m0_peers.ask_outcome = [&](const std::string& address, const OutcomeKey& key,
                             const std::vector<std::string>& gone,
                             absl::Time) -> absl::StatusOr<Outcome> {
    if (address == "a2") {
      m1_done.WaitForNotification();
      return Outcome::kCommitted;
    }
    m1_asking.WaitForNotification();
    const Outcome theirs = m1->Decide(key, true, gone);
    std::call_once(bound_once, [&] { m1_bound.Notify(); });
    return theirs;
  };
  StepPeers m1_peers = InDoubtPeers({});
  m1_peers.ask_outcome = [&](const std::string& address, const OutcomeKey& key,
                             const std::vector<std::string>& gone,
                             absl::Time) -> absl::StatusOr<Outcome> {
    std::call_once(asking_once, [&] { m1_asking.Notify(); });
    m1_bound.WaitForNotification();
    if (address == "a2") return Outcome::kCommitted;
    return m0->Decide(key, true, gone);
  };
  m0 = std::make_unique<StepProtocol>(std::move(m0_peers), &clock_, nullptr,
                                      StepProtocolOptions{});
  m1 = std::make_unique<StepProtocol>(std::move(m1_peers), &clock_, nullptr,
                                      StepProtocolOptions{});
  absl::Status m1_status;
  std::thread m1_votes([&] {
    Group g1 = ThreeMembers();
    g1.rank = 1;
    bool refused = false;
    m1_status = m1->Vote(g1, kKey, 99, true, kDigest,
                         clock_.Now() + absl::Seconds(10), &refused);
    m1_done.Notify();
  });
  bool refused = false;
  const absl::Status m0_status =
      m0->Vote(ThreeMembers(), kKey, 99, true, kDigest,
               clock_.Now() + absl::Seconds(10), &refused);
  m1_votes.join();
  // Neither applied it.
  EXPECT_TRUE(absl::IsDeadlineExceeded(m0_status)) << m0_status;
  EXPECT_TRUE(absl::IsDeadlineExceeded(m1_status)) << m1_status;
  EXPECT_NE(m0->Decide(kKey, true), Outcome::kCommitted);
  EXPECT_NE(m1->Decide(kKey, true), Outcome::kCommitted);
}

TEST_F(StepProtocolTest, PastTheBoundAnAnswerInDoubtPromisesNothing) {
  StepProtocol* self = nullptr;
  std::vector<Outcome> heard;
  StepPeers peers = InDoubtPeers({});
  peers.ask_outcome = [&](const std::string& address, const OutcomeKey& key,
                          const std::vector<std::string>&,
                          absl::Time) -> absl::StatusOr<Outcome> {
    if (address == "a2" && heard.empty()) {
      std::vector<std::string> many;
      for (size_t i = 0; i < StepProtocol::kMaxGone; ++i) {
        many.push_back(absl::StrCat("n", i));
      }
      heard.push_back(self->Decide(key, true, many));
      heard.push_back(self->Decide(key, true, {"one more"}));
    }
    return Outcome::kInDoubt;
  };
  StepProtocol protocol(std::move(peers), &clock_, nullptr, {});
  self = &protocol;
  EXPECT_TRUE(absl::IsDeadlineExceeded(Vote(protocol)));
  EXPECT_THAT(heard,
              ::testing::ElementsAre(Outcome::kInDoubt, Outcome::kVoting));
}

// Two workers in doubt about a step that a third, m2, applied; a newer view
// left m2 out, and m0 cannot reach it, while m1 can (issue: a worker in
// doubt gave the step up on its peers' "in doubt" while one of them went on
// to learn "applied" from a member it could still reach).
TEST_F(StepProtocolTest, WorkersInDoubtDoNotSplitOverAMemberOnlyOneReaches) {
  auto newer = std::make_shared<Group>(ThreeMembers(/*epoch=*/3));
  newer->view.member_ids = {"m0", "m1"};
  std::unique_ptr<StepProtocol> m0, m1;
  absl::Notification m0_done;
  absl::Status m0_status;
  // m0 sees the newer view; m2 is unreachable from it.
  StepPeers m0_peers = InDoubtPeers({});
  m0_peers.current = [newer] { return newer; };
  m0_peers.ask_outcome = [&](const std::string& address, const OutcomeKey& key,
                             const std::vector<std::string>& gone,
                             absl::Time) -> absl::StatusOr<Outcome> {
    if (address == "a2") return absl::UnavailableError("black-holed");
    return m1->Decide(key, true, gone);
  };
  // m1 has not seen the newer view; m2 answers it once m0 has settled.
  StepPeers m1_peers = InDoubtPeers({});
  m1_peers.ask_outcome = [&](const std::string& address, const OutcomeKey& key,
                             const std::vector<std::string>& gone,
                             absl::Time) -> absl::StatusOr<Outcome> {
    if (address == "a2") {
      if (!m0_done.HasBeenNotified()) {
        Group g = ThreeMembers();
        m0_status = m0->Vote(g, kKey, 99, true, kDigest,
                             clock_.Now() + absl::Seconds(10), &refused_);
        m0_done.Notify();
      }
      return Outcome::kCommitted;
    }
    m0_done.WaitForNotification();
    return m0->Decide(key, true, gone);
  };
  m0 = std::make_unique<StepProtocol>(std::move(m0_peers), &clock_, nullptr,
                                      StepProtocolOptions{});
  m1 = std::make_unique<StepProtocol>(std::move(m1_peers), &clock_, nullptr,
                                      StepProtocolOptions{});
  Group g1 = ThreeMembers();
  g1.rank = 1;
  bool refused = false;
  const absl::Status m1_status = m1->Vote(
      g1, kKey, 99, true, kDigest, clock_.Now() + absl::Seconds(10), &refused);
  // Both give the step up, with the vote's cause: neither applied it.
  EXPECT_TRUE(absl::IsDeadlineExceeded(m0_status)) << m0_status;
  EXPECT_TRUE(absl::IsDeadlineExceeded(m1_status)) << m1_status;
  EXPECT_NE(m0->Decide(kKey, true), Outcome::kCommitted);
  EXPECT_NE(m1->Decide(kKey, true), Outcome::kCommitted);
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

std::string RecordBytes(const StepRecord& record) {
  std::string bytes(sizeof(record), '\0');
  std::memcpy(bytes.data(), &record, sizeof(record));
  return bytes;
}

class AgreeTest : public StepProtocolTest {
 protected:
  // The other members bring `theirs[rank]` (rank 0's is this worker's).
  absl::Status Agree(std::vector<std::string> theirs, const StepRecord& mine) {
    StepProtocol protocol(
        {.gather =
             [&](const Group&, uint64_t, std::string m, absl::Time, double*) {
               theirs[0] = m;
               return absl::StatusOr<std::vector<std::string>>(theirs);
             }},
        &clock_, nullptr, {});
    return protocol.Agree(ThreeMembers(), "fc", 5, mine,
                          clock_.Now() + absl::Seconds(1));
  }
  const StepRecord mine_{.fingerprint = 11, .values = 100};
};

TEST_F(AgreeTest, EqualRecordsAgree) {
  EXPECT_TRUE(Agree({"", RecordBytes(mine_), RecordBytes(mine_)}, mine_).ok());
}

TEST_F(AgreeTest, ABucketThatDiffersNamesTheRank) {
  StepRecord other = mine_;
  other.fingerprint = 12;
  const absl::Status status =
      Agree({"", RecordBytes(mine_), RecordBytes(other)}, mine_);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr("bucket 'fc' differs between workers"));
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("rank 2"));
}

TEST_F(AgreeTest, NonFiniteValuesAnywhereFailTheStepNamingEveryRank) {
  StepRecord bad = mine_;
  bad.nonfinite = 3;
  const absl::Status status =
      Agree({"", RecordBytes(bad), RecordBytes(bad)}, mine_);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr("(rank 1: 3, rank 2: 3)"));
}

TEST_F(AgreeTest, ARecordOfAnotherSizeIsRefused) {
  const absl::Status status = Agree({"", RecordBytes(mine_), "short"}, mine_);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr("rank 2 sent an agreement record of 5"));
}

// Three members, each with its own protocol, over the loopback network
// through fault-injecting wrappers: the gather is the daemon's (Bruck over
// the transport), a question to a peer is its Decide. The clock starts at
// the real time (the transports wait on it) and jumps over pauses.
class ThreeMembersOverLoopback : public ::testing::Test {
 protected:
  static constexpr int kSize = 3;
  ThreeMembersOverLoopback() : clock_(absl::Now()), net_(kSize) {
    for (int r = 0; r < kSize; ++r) {
      auto group = std::make_shared<Group>(ThreeMembers());
      group->rank = r;
      faulty_.push_back(
          new transport::FaultInjectingTransport(net_.endpoint(r)));
      group->transport.reset(faulty_.back());
      groups_.push_back(group);
    }
    for (int r = 0; r < kSize; ++r) {
      protocols_.push_back(std::make_unique<StepProtocol>(
          StepPeers{
              .gather = Gather(r),
              .ask_outcome = [this](const std::string& address,
                                    const OutcomeKey& key,
                                    const std::vector<std::string>& gone,
                                    absl::Time) -> absl::StatusOr<Outcome> {
                const int peer = address[1] - '0';
                if (crashed_[peer]) {
                  return absl::UnavailableError("crashed");
                }
                return protocols_[peer]->Decide(key, true, gone);
              },
              .current = [this] { return current_; }},
          &clock_, nullptr,
          StepProtocolOptions{.view_wait = absl::Seconds(1)}));
    }
  }

  StepPeers::Gather Gather(int r) {
    return [this, r](const Group& g, uint64_t operation, std::string mine,
                     absl::Time deadline, double* waited) {
      return engine::GatherSmall({.transport = g.transport.get(),
                                  .epoch = g.view.epoch,
                                  .rank = r,
                                  .size = g.size()},
                                 operation, std::move(mine), deadline,
                                 /*same_size=*/false, waited);
    };
  }

  // Runs `body(rank)` on a thread per member that has not crashed.
  std::vector<absl::Status> OnEveryMember(
      const std::function<absl::Status(int)>& body) {
    std::vector<absl::Status> out(kSize);
    std::vector<std::thread> threads;
    for (int r = 0; r < kSize; ++r) {
      if (!crashed_[r]) threads.emplace_back([&, r] { out[r] = body(r); });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  absl::Status Vote(int r, uint64_t digest) {
    bool refused = false;
    return protocols_[r]->Vote(*groups_[r], kKey, /*operation=*/77, true,
                               digest, absl::Now() + absl::Milliseconds(500),
                               &refused);
  }

  FakeClock clock_;
  transport::LoopbackNetwork net_;
  std::vector<transport::FaultInjectingTransport*> faulty_;  // groups own
  std::vector<std::shared_ptr<Group>> groups_;
  std::vector<std::unique_ptr<StepProtocol>> protocols_;
  std::vector<bool> crashed_ = std::vector<bool>(kSize, false);
  std::shared_ptr<Group> current_;
};

TEST_F(ThreeMembersOverLoopback, AgreeThenVoteCommitsEverywhere) {
  const std::vector<absl::Status> out = OnEveryMember([&](int r) {
    GM_RETURN_IF_ERROR(protocols_[r]->Agree(*groups_[r], "fc", 5,
                                            {.fingerprint = 1, .values = 10},
                                            absl::Now() + absl::Seconds(5)));
    return Vote(r, kDigest);
  });
  for (int r = 0; r < kSize; ++r) {
    EXPECT_TRUE(out[r].ok()) << r << ": " << out[r];
    EXPECT_EQ(protocols_[r]->Decide(kKey, true), Outcome::kCommitted);
  }
}

TEST_F(ThreeMembersOverLoopback, ANaNOnOneMemberFailsTheAgreementAlike) {
  const std::vector<absl::Status> out = OnEveryMember([&](int r) {
    return protocols_[r]->Agree(
        *groups_[r], "fc", 5,
        {.fingerprint = 1, .values = 10, .nonfinite = r == 1 ? 1u : 0u},
        absl::Now() + absl::Seconds(5));
  });
  for (int r = 0; r < kSize; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(out[r])) << out[r];
    EXPECT_EQ(out[r].message(), out[0].message());
  }
}

// Rank 2's vote never reaches rank 0: ranks 1 and 2 hear every vote and
// apply the step; rank 0, in doubt, asks them and applies it too.
TEST_F(ThreeMembersOverLoopback, AMemberThatMissedAVoteLearnsTheCommit) {
  faulty_[2]->DropSendsTo(0);
  const std::vector<absl::Status> out =
      OnEveryMember([&](int r) { return Vote(r, kDigest); });
  for (int r = 0; r < kSize; ++r) {
    EXPECT_TRUE(out[r].ok()) << r << ": " << out[r];
    EXPECT_EQ(protocols_[r]->Decide(kKey, true), Outcome::kCommitted) << r;
  }
}

// Rank 2 dies before it votes: nobody applies the step. Once a newer view
// leaves it out, the others settle on the abort with the cause, not
// DataLoss, and alike.
TEST_F(ThreeMembersOverLoopback, AMemberDeadBeforeItsVoteAbortsTheStep) {
  crashed_[2] = true;
  faulty_[2]->Abort(absl::UnavailableError("rank 2 died"));
  current_ = std::make_shared<Group>(ThreeMembers(/*epoch=*/3));
  current_->view.member_ids = {"m0", "m1"};
  const std::vector<absl::Status> out =
      OnEveryMember([&](int r) { return Vote(r, kDigest); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsUnavailable(out[r])) << r << ": " << out[r];
    EXPECT_NE(protocols_[r]->Decide(kKey, true), Outcome::kCommitted);
  }
}

}  // namespace
}  // namespace gradmesh::daemon
