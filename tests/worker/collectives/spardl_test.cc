#include "worker/collectives/spardl.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/multi_rank.h"
#include "tests/support/reference.h"
#include "worker/transport/fault_injection.h"
#include "worker/transport/loopback.h"

namespace gradmesh::collectives {
namespace {

using ::gradmesh::testing::MassBalance;
using ::gradmesh::testing::RandomVector;
using ::gradmesh::testing::RankRun;
using ::gradmesh::testing::RunIteration;
using ::gradmesh::testing::RunRanks;
using ::gradmesh::testing::SortTopK;
using ::gradmesh::testing::Sparse;

// ---------------------------------------------------------------------------
// An independent, sequential SparDL written from the paper's text: all P
// workers in lockstep, dense std::vectors and std::maps, top-k by full sort.
// It shares no code with the engine (only the design decisions documented in
// spardl.h: consecutive teams, quotas, the 1/2^t and 1/d residual shares).
// ---------------------------------------------------------------------------

// Algorithm 2 of the paper, for one block of quota q and d teams.
struct ReferenceH {
  ReferenceH(uint64_t quota, int d)
      : q(quota),
        lo(std::ceil(static_cast<double>(quota) / d)),
        h(static_cast<double>(quota) / d),
        step(0.01 * static_cast<double>(quota) * (d - 1) / d) {}
  uint64_t Current() const {
    return static_cast<uint64_t>(
        std::clamp<long long>(std::llround(h), static_cast<long long>(lo),
                              static_cast<long long>(q)));
  }
  void Update(uint64_t gathered) {
    const bool too_many = gathered > q;
    const bool growing = step > 0;
    if (too_many != growing) {  // moving the right way
      if (flag) {
        step *= 2;
        flag = false;
      } else {
        flag = true;
      }
    } else {
      step = -step / 2;
      flag = false;
    }
    step = std::clamp(step, -(q - lo), q - lo);
    h = std::clamp(h + step, lo, static_cast<double>(q));
  }
  double q, lo, h, step;
  bool flag = false;
};

class ReferenceSparDl {
 public:
  ReferenceSparDl(int world, int teams, uint64_t n, double density)
      : P_(world),
        d_(teams),
        p_(world / teams),
        n_(n),
        residual_(world, std::vector<float>(n, 0.0f)) {
    k_ = n == 0 ? 0
                : std::clamp<uint64_t>(
                      std::max<long long>(1, std::llround(density * n)), 1, n);
    for (int b = 0; b < p_; ++b) {
      begin_.push_back(b * n / p_);
      end_.push_back((b + 1) * n / p_);
    }
    SetQuotas(0);
    for (int b = 0; b < p_; ++b) h_.emplace_back(quota_[b], d_);
  }

  // Block b's quota in round `round`: k / p, one more for k mod p blocks,
  // which are the first ones, or (k < p) the k blocks from `round` mod p on.
  void SetQuotas(uint64_t round) {
    quota_.assign(p_, 0);
    for (int b = 0; b < p_; ++b) {
      const uint64_t first = k_ < static_cast<uint64_t>(p_) ? round % p_ : 0;
      const uint64_t offset = (b + p_ - first) % p_;
      quota_[b] = std::min<uint64_t>(k_ / p_ + (offset < k_ % p_ ? 1 : 0),
                                     end_[b] - begin_[b]);
    }
  }

  uint64_t k() const { return k_; }
  const std::vector<float>& residual(int w) const { return residual_[w]; }

  struct Output {
    Sparse result;
    std::vector<uint64_t> bytes_received;
  };

  Output Iterate(const std::vector<std::vector<float>>& gradients) {
    SetQuotas(round_++);
    if (k_ < static_cast<uint64_t>(p_)) {  // h follows the rotated quota
      for (int b = 0; b < p_; ++b) h_[b] = ReferenceH(quota_[b], d_);
    }
    Output out;
    out.bytes_received.assign(P_, 0);
    std::vector<std::vector<float>> acc(P_), work(P_);
    for (int w = 0; w < P_; ++w) {
      acc[w] = residual_[w];
      for (uint64_t i = 0; i < n_; ++i) acc[w][i] += gradients[w][i];
      work[w] = acc[w];
    }
    auto team = [&](int w) { return w / p_; };
    auto pos = [&](int w) { return w % p_; };
    // Cut block b of worker w to its quota; the rest stays in work.
    auto cut = [&](int w, int b) {
      Sparse block;
      for (uint64_t i = begin_[b]; i < end_[b]; ++i) block[i] = work[w][i];
      Sparse kept = SortTopK(block, quota_[b]);
      for (const auto& [i, x] : kept) work[w][i] = 0.0f;
      return kept;
    };

    // Spar-Reduce-Scatter: bag j of w holds blocks w+2^(j-1) .. w+2^j-1, the
    // last one cut at p-1; at step i bag l-i+1 goes to w + 2^(l-i).
    int l = 0;
    while ((1 << l) < p_) ++l;
    for (int i = 1; i <= l; ++i) {
      const int j = l - i + 1;
      std::vector<Sparse> message(P_);
      for (int w = 0; w < P_; ++w) {
        for (int o = 1 << (j - 1); o < std::min(1 << j, p_); ++o) {
          for (const auto& e : cut(w, (pos(w) + o) % p_)) message[w].insert(e);
        }
      }
      for (int w = 0; w < P_; ++w) {
        const int target = team(w) * p_ + (pos(w) + (1 << (l - i))) % p_;
        for (const auto& [idx, x] : message[w]) work[target][idx] += x;
        out.bytes_received[target] += 8 * message[w].size();
      }
    }
    std::vector<Sparse> own(P_);
    for (int w = 0; w < P_; ++w) own[w] = cut(w, pos(w));

    auto keep_share = [&](int w, const Sparse& sum, const Sparse& kept,
                          float share) {
      for (const auto& [i, x] : sum) {
        if (!kept.count(i)) work[w][i] += share * x;
      }
    };
    if (d_ > 1 && (d_ & (d_ - 1)) == 0) {
      // R-SAG: recursive doubling between same positions of teams.
      for (int t = 0; (1 << t) < d_; ++t) {
        std::vector<Sparse> next(P_);
        for (int w = 0; w < P_; ++w) {
          const int partner = (team(w) ^ (1 << t)) * p_ + pos(w);
          const Sparse& lower = team(w) < team(partner) ? own[w] : own[partner];
          const Sparse& higher =
              team(w) < team(partner) ? own[partner] : own[w];
          Sparse sum = lower;
          for (const auto& [i, x] : higher) sum[i] += x;
          next[w] = SortTopK(sum, quota_[pos(w)]);
          keep_share(w, sum, next[w], 1.0f / static_cast<float>(2 << t));
          out.bytes_received[w] += 8 * own[partner].size();
        }
        own = next;
      }
    } else if (d_ > 1) {
      // B-SAG: top-h, all-gather across teams, sum in team order, cut.
      std::vector<Sparse> top_h(P_);
      for (int w = 0; w < P_; ++w) {
        top_h[w] = SortTopK(own[w], h_[pos(w)].Current());
        keep_share(w, own[w], top_h[w], 1.0f);
      }
      std::vector<uint64_t> gathered(p_);
      for (int w = 0; w < P_; ++w) {
        Sparse sum;
        for (int t = 0; t < d_; ++t) {
          for (const auto& [i, x] : top_h[t * p_ + pos(w)]) sum[i] += x;
          if (t != team(w)) {
            out.bytes_received[w] += 8 * top_h[t * p_ + pos(w)].size();
          }
        }
        gathered[pos(w)] = sum.size();
        own[w] = SortTopK(sum, quota_[pos(w)]);
        keep_share(w, sum, own[w], 1.0f / static_cast<float>(d_));
      }
      for (int b = 0; b < p_; ++b) h_[b].Update(gathered[b]);
    }

    // Bruck all-gather inside the team: the union of the team's blocks.
    for (int w = 0; w < P_; ++w) {
      for (int o = 0; o < p_; ++o) {
        if (o == pos(w)) continue;
        out.bytes_received[w] += 8 * own[team(w) * p_ + o].size();
      }
    }
    for (int w = 0; w < p_; ++w)
      out.result.insert(own[w].begin(), own[w].end());

    // Global residual collection.
    for (int w = 0; w < P_; ++w) {
      residual_[w] = acc[w];
      for (const auto& [i, x] : out.result) residual_[w][i] = work[w][i];
    }
    return out;
  }

 private:
  int P_, d_, p_;
  uint64_t n_, k_;
  uint64_t round_ = 0;
  std::vector<uint64_t> begin_, end_, quota_;
  std::vector<ReferenceH> h_;
  std::vector<std::vector<float>> residual_;
};

// ---------------------------------------------------------------------------
// Running the engine on P loopback ranks.
// ---------------------------------------------------------------------------

std::vector<std::unique_ptr<SparDl>> MakeInstances(int world, int teams,
                                                   uint64_t n, double density) {
  std::vector<std::unique_ptr<SparDl>> instances;
  for (int r = 0; r < world; ++r) {
    auto instance =
        SparDl::Create(world, r, n, {.density = density, .teams = teams});
    EXPECT_TRUE(instance.ok()) << instance.status();
    instances.push_back(*std::move(instance));
  }
  return instances;
}

int ExpectedRounds(int world, int teams) {
  return 2 * CeilLog2(world / teams) + CeilLog2(teams);
}

std::vector<std::tuple<int, int>> AllWorldsAndTeams() {
  std::vector<std::tuple<int, int>> out;
  for (int p = 1; p <= 16; ++p) {
    for (int d = 1; d <= p; ++d) {
      if (p % d == 0) out.emplace_back(p, d);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// P in 1..16, every d, several n (n < P and n not divisible by P included),
// several densities, three iterations with residuals carried.
// ---------------------------------------------------------------------------

class SparDlTest : public ::testing::TestWithParam<
                       std::tuple<std::tuple<int, int>, uint64_t, double>> {};

TEST_P(SparDlTest, AgreesWithReferenceConservesMassAndCostsWhatItShould) {
  const auto [world_and_teams, n, density] = GetParam();
  const auto [world, teams] = world_and_teams;
  constexpr int kIterations = 3;
  transport::LoopbackNetwork network(world);
  auto instances = MakeInstances(world, teams, n, density);
  ReferenceSparDl reference(world, teams, n, density);
  std::vector<std::vector<float>> residuals(world, std::vector<float>(n, 0.0f));

  for (int it = 0; it < kIterations; ++it) {
    SCOPED_TRACE(absl::StrCat("iteration ", it));
    std::vector<std::vector<float>> gradients;
    for (int r = 0; r < world; ++r) {
      gradients.push_back(RandomVector(n, 1000 * it + r + 7 * n));
    }
    const MassBalance balance(gradients, residuals);

    const std::vector<RankRun> runs =
        RunIteration(network, instances, gradients, residuals, it);
    const ReferenceSparDl::Output expected = reference.Iterate(gradients);

    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(runs[r].status.ok())
          << "rank " << r << ": " << runs[r].status;
      // Every rank holds the bitwise identical result.
      ASSERT_EQ(runs[r].result.indices, runs[0].result.indices) << "rank " << r;
      for (size_t e = 0; e < runs[r].result.size(); ++e) {
        ASSERT_EQ(std::bit_cast<uint32_t>(runs[r].result.values[e]),
                  std::bit_cast<uint32_t>(runs[0].result.values[e]))
            << "rank " << r << " entry " << e;
      }
      ASSERT_TRUE(sparse::Validate(runs[r].result, {0, n}).ok());
      EXPECT_LE(runs[r].result.size(), reference.k());
      EXPECT_EQ(runs[r].stats.result_nonzeros, runs[r].result.size());
      EXPECT_EQ(runs[r].stats.rounds, ExpectedRounds(world, teams));
      EXPECT_EQ(runs[r].stats.messages_received, runs[r].stats.messages_sent);
      EXPECT_EQ(runs[r].stats.bytes_received, expected.bytes_received[r])
          << "rank " << r;
      // The independent reference: same result, same residuals.
      Sparse got;
      for (size_t e = 0; e < runs[r].result.size(); ++e) {
        got[runs[r].result.indices[e]] = runs[r].result.values[e];
      }
      ASSERT_EQ(got, expected.result) << "rank " << r;
      for (uint64_t i = 0; i < n; ++i) {
        ASSERT_EQ(residuals[r][i], reference.residual(r)[i])
            << "rank " << r << " index " << i;
      }
    }

    // Conservation, index by index: inputs = result + residuals.
    ASSERT_TRUE(balance.Holds(runs[0].result, residuals));
  }
}

std::string SparDlTestName(
    const ::testing::TestParamInfo<
        std::tuple<std::tuple<int, int>, uint64_t, double>>& info) {
  const auto& [world_and_teams, n, density] = info.param;
  return absl::StrCat("P", std::get<0>(world_and_teams), "_d",
                      std::get<1>(world_and_teams), "_n", n, "_density",
                      static_cast<int>(density * 100));
}

INSTANTIATE_TEST_SUITE_P(
    WorldsTeamsSizesDensities, SparDlTest,
    ::testing::Combine(::testing::ValuesIn(AllWorldsAndTeams()),
                       ::testing::Values<uint64_t>(0, 3, 37, 1000, 4103),
                       ::testing::Values(0.01, 0.25, 1.0)),
    SparDlTestName);

// ---------------------------------------------------------------------------
// Table I, with 4-byte indexes and 4-byte values (8 bytes per sparse value):
// here n = 240 p and k = 8 p, so every block has the same quota k/p = 8 and
// is full, and the formulas hold exactly (B-SAG: within its bounds).
// ---------------------------------------------------------------------------

class SparDlCostTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(SparDlCostTest, RoundsAndBytesMatchTableOne) {
  const auto [world, teams] = GetParam();
  const int p = world / teams;
  const uint64_t n = 240 * p;
  const double density = 1.0 / 30;
  const double k = 8.0 * p;
  const double P = world;
  const double d = teams;
  transport::LoopbackNetwork network(world);
  auto instances = MakeInstances(world, teams, n, density);
  std::vector<std::vector<float>> residuals(world, std::vector<float>(n, 0.0f));
  for (int it = 0; it < 4; ++it) {
    std::vector<std::vector<float>> gradients;
    for (int r = 0; r < world; ++r)
      gradients.push_back(RandomVector(n, 31 * it + r));
    const std::vector<RankRun> runs =
        RunIteration(network, instances, gradients, residuals, it);
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(runs[r].status.ok()) << runs[r].status;
      const OpStats& s = runs[r].stats;
      const double received = static_cast<double>(s.bytes_received);
      if (teams == 1) {
        // SparDL: 2 ceil(log2 P) alpha + 4 (P-1)/P k beta.
        EXPECT_EQ(s.rounds, 2 * CeilLog2(world));
        EXPECT_DOUBLE_EQ(received, 4 * 4 * (P - 1) / P * k);
        EXPECT_EQ(s.bytes_sent, s.bytes_received);
      } else if (IsPowerOfTwo(teams)) {
        // R-SAG: (2 log(P/d) + log d) alpha + 2((2P-2d)/P + d/P log d) k beta.
        EXPECT_EQ(s.rounds, 2 * CeilLog2(p) + CeilLog2(teams));
        EXPECT_DOUBLE_EQ(
            received, 4 * 2 * ((2 * P - 2 * d) / P + d / P * std::log2(d)) * k);
      } else {
        // B-SAG, equation (10). The paper's lower bound is loose (its SRS
        // term is divided by d); the tight one, SRS + (d-1) k/P + the final
        // all-gather of blocks of at least k/P values, is checked as well.
        EXPECT_EQ(s.rounds, 2 * CeilLog2(p) + CeilLog2(teams));
        EXPECT_GE(received, 4 * 2 * (d * d + P - 2 * d) / (P * d) * k);
        EXPECT_GE(received, 8 * (P * d + P - 2 * d) / (P * d) * k);
        EXPECT_LE(received, 4 * 2 * (d * d + 2 * P - 3 * d) / P * k);
        EXPECT_GE(s.figures.bsag_h.value_or(-1),
                  static_cast<int64_t>(std::ceil(8.0 / teams)));
        EXPECT_LE(s.figures.bsag_h.value_or(-1), 8);
      }
    }
  }
}

std::string WorldAndTeamsName(
    const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
  return absl::StrCat("P", std::get<0>(info.param), "_d",
                      std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllWorldsAndTeams, SparDlCostTest,
                         ::testing::ValuesIn(AllWorldsAndTeams()),
                         WorldAndTeamsName);

// ---------------------------------------------------------------------------
// B-SAG's h follows Algorithm 2 and moves the gathered count toward L.
// ---------------------------------------------------------------------------

TEST(BsagHControllerTest, StartsAtKOverPAndStaysInRange) {
  BsagHController h(/*quota=*/300, /*teams=*/3);
  EXPECT_EQ(h.h(), 100u);
  for (int i = 0; i < 50; ++i) {
    h.Update(/*gathered=*/100);  // far too few: h must grow
    EXPECT_GE(h.h(), 100u);
    EXPECT_LE(h.h(), 300u);
  }
  EXPECT_EQ(h.h(), 300u);
  for (int i = 0; i < 50; ++i) h.Update(/*gathered=*/900);  // far too many
  EXPECT_EQ(h.h(), 100u);
}

TEST(BsagHControllerTest, DoublesOnSecondConsecutiveMoveAndHalvesOnTurn) {
  BsagHController h(/*quota=*/10000, /*teams=*/3);
  // step = 0.01 * 10000 * 2/3 = 66.67; initial h = 3333.3.
  h.Update(0);  // right direction, first time: flag only
  EXPECT_EQ(h.h(), 3400u);
  h.Update(0);  // second time: step doubles to 133.3
  EXPECT_EQ(h.h(), 3533u);
  h.Update(20000);  // turn: step = -66.67
  EXPECT_EQ(h.h(), 3467u);
}

// ---------------------------------------------------------------------------
// Bad input and faults end in a clear error, never a crash or a hang, and
// nothing is lost: a failed call leaves residual + gradient as the residual.
// ---------------------------------------------------------------------------

TEST(SparDlErrorsTest, InvalidOptionsAreInvalidArgument) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      SparDl::Create(6, 0, 100, {.density = 0.1, .teams = 4}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SparDl::Create(6, 0, 100, {.density = 0.1, .teams = 0}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SparDl::Create(4, 0, 100, {.density = 0.0, .teams = 1}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SparDl::Create(4, 0, 100, {.density = 1.5, .teams = 1}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SparDl::Create(4, 0, 100, {.density = std::nan(""), .teams = 1})
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SparDl::Create(4, 4, 100, {.density = 0.1, .teams = 1}).status()));
  EXPECT_TRUE(SparDl::Create(6, 5, 100, {.density = 1.0, .teams = 3}).ok());
}

// k < p: the blocks that carry the k units change every round, so every
// block is sent within p rounds and no residual grows without bound (a
// metric of 10 values on more workers than k), with one team and with
// B-SAG's three (whose h follows the rotated quota).
class SparDlQuotaTest : public ::testing::TestWithParam<int> {};

TEST_P(SparDlQuotaTest, WithKBelowPEveryBlockIsSentWithinPRounds) {
  constexpr int kWorld = 6;
  constexpr uint64_t kN = 12;  // density 0.1: k = 1, below p
  const int teams = GetParam();
  const int p = kWorld / teams;
  const uint64_t block = kN / p;
  const int rounds = 10 * kWorld;
  transport::LoopbackNetwork network(kWorld);
  auto instances = MakeInstances(kWorld, teams, kN, 0.1);
  std::vector<std::vector<float>> residuals(kWorld,
                                            std::vector<float>(kN, 0.0f));
  const std::vector<std::vector<float>> ones(kWorld,
                                             std::vector<float>(kN, 1.0f));
  std::vector<int> last_sent(kN, -1);
  for (int round = 0; round < rounds; ++round) {
    const std::vector<RankRun> runs =
        RunIteration(network, instances, ones, residuals, round);
    for (const RankRun& run : runs) ASSERT_TRUE(run.status.ok()) << run.status;
    for (uint32_t i : runs[0].result.indices) last_sent[i] = round;
    for (int b = 0; b < p; ++b) {
      int block_last = -1;
      for (uint64_t i = b * block; i < (b + 1) * block; ++i) {
        block_last = std::max(block_last, last_sent[i]);
      }
      ASSERT_GT(block_last, round - p) << "block " << b << " round " << round;
    }
  }
  // Each coordinate gains 1 a round (and B-SAG's shares), and its block is
  // sent every p rounds: bounded, where a block left out grows by 1 a round.
  for (int r = 0; r < kWorld; ++r) {
    for (float x : residuals[r]) EXPECT_LE(x, 2.0f * block * p + 1.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Teams, SparDlQuotaTest, ::testing::Values(1, 3));

TEST(SparDlErrorsTest, WrongSizeChangesNothing) {
  transport::LoopbackNetwork network(1);
  auto spardl = *SparDl::Create(1, 0, 10, {.density = 0.5});
  std::vector<float> residual(10, 1.0f);
  std::vector<float> gradient(9, 1.0f);
  OpStats stats;
  auto result = spardl->AllReduce(gradient, absl::MakeSpan(residual),
                                  {.transport = network.endpoint(0)}, &stats);
  EXPECT_TRUE(absl::IsInvalidArgument(result.status())) << result.status();
  EXPECT_THAT(residual, ::testing::Each(1.0f));
}

TEST(SparDlErrorsTest, CrashedPeerFailsEveryRankPromptlyAndLosesNothing) {
  constexpr int kWorld = 6;
  constexpr uint64_t kN = 600;
  transport::LoopbackNetwork network(kWorld);
  transport::FaultInjectingTransport faulty(network.endpoint(2));
  faulty.CrashAfterSends(1, absl::UnavailableError("rank 2 was killed"));
  auto instances = MakeInstances(kWorld, 1, kN, 0.1);
  std::vector<std::vector<float>> gradients, residuals;
  for (int r = 0; r < kWorld; ++r) {
    gradients.push_back(RandomVector(kN, r));
    residuals.push_back(RandomVector(kN, 100 + r));
  }
  const std::vector<std::vector<float>> old_residuals = residuals;
  std::vector<absl::Status> statuses(kWorld);
  const absl::Time start = absl::Now();
  RunRanks(network, [&](int r, transport::Transport* t) {
    OpContext context{.transport = r == 2 ? &faulty : t,
                      .deadline = absl::Now() + absl::Seconds(30)};
    OpStats stats;
    statuses[r] = instances[r]
                      ->AllReduce(gradients[r], absl::MakeSpan(residuals[r]),
                                  context, &stats)
                      .status();
    // As replay and the daemon do: a failed rank stops its endpoint.
    if (!statuses[r].ok()) t->Abort(statuses[r]);
  });
  // Far below the 30 s deadline: failure spreads, nobody waits it out.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_FALSE(statuses[r].ok()) << "rank " << r;
    EXPECT_TRUE(absl::IsUnavailable(statuses[r])) << statuses[r];
    for (uint64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(residuals[r][i], old_residuals[r][i] + gradients[r][i]);
    }
  }
}

TEST(SparDlErrorsTest, LostMessageEndsInDeadlineExceeded) {
  constexpr int kWorld = 4;
  transport::LoopbackNetwork network(kWorld);
  transport::FaultInjectingTransport faulty(network.endpoint(1));
  faulty.DropSendsTo(0);
  auto instances = MakeInstances(kWorld, 2, 400, 0.1);
  std::vector<absl::Status> statuses(kWorld);
  const absl::Time start = absl::Now();
  RunRanks(network, [&](int r, transport::Transport* t) {
    std::vector<float> gradient = RandomVector(400, r);
    std::vector<float> residual(400, 0.0f);
    OpContext context{.transport = r == 1 ? &faulty : t,
                      .deadline = absl::Now() + absl::Milliseconds(300)};
    OpStats stats;
    statuses[r] =
        instances[r]
            ->AllReduce(gradient, absl::MakeSpan(residual), context, &stats)
            .status();
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(absl::IsDeadlineExceeded(statuses[0])) << statuses[0];
}

TEST(SparDlErrorsTest, MalformedPeerMessageIsInvalidArgument) {
  transport::LoopbackNetwork network(2);
  auto spardl = *SparDl::Create(2, 0, 100, {.density = 0.1});
  // Rank 1 is played by the test: it sends 7 bytes for SRS step 0.
  ASSERT_TRUE(network.endpoint(1)->Send(0, {.step = 0}, "garbage").ok());
  std::vector<float> gradient = RandomVector(100, 1);
  std::vector<float> residual(100, 0.0f);
  OpStats stats;
  auto result = spardl->AllReduce(gradient, absl::MakeSpan(residual),
                                  {.transport = network.endpoint(0),
                                   .deadline = absl::Now() + absl::Seconds(5)},
                                  &stats);
  EXPECT_TRUE(absl::IsInvalidArgument(result.status())) << result.status();
  EXPECT_THAT(result.status().message(), ::testing::HasSubstr("rank 1"));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(residual[i], gradient[i]);
}

}  // namespace
}  // namespace gradmesh::collectives
