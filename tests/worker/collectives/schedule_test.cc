#include "worker/collectives/schedule.h"

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradmesh::collectives {
namespace {

constexpr int kMaxGroup = 1024;

int Mod(int a, int p) { return ((a % p) + p) % p; }

// Block j of a run; runs start inside [0, p) and hold at most p blocks.
int At(BlockRun run, int j, int p) {
  const int b = run.first + j;
  return b >= p ? b - p : b;
}

std::vector<int> Blocks(BlockRun run, int p) {
  std::vector<int> out;
  for (int i = 0; i < run.count; ++i) out.push_back(Mod(run.first + i, p));
  return out;
}

TEST(ScheduleTest, CeilLog2AndPowerOfTwo) {
  EXPECT_EQ(CeilLog2(1), 0);
  EXPECT_EQ(CeilLog2(2), 1);
  EXPECT_EQ(CeilLog2(3), 2);
  EXPECT_EQ(CeilLog2(6), 3);
  EXPECT_EQ(CeilLog2(1024), 10);
  EXPECT_EQ(CeilLog2(1025), 11);
  EXPECT_TRUE(IsPowerOfTwo(1));
  EXPECT_TRUE(IsPowerOfTwo(8));
  EXPECT_FALSE(IsPowerOfTwo(6));
  EXPECT_FALSE(IsPowerOfTwo(0));
}

// Figure 5 of the SparDL paper, 0-based: worker 0 is the paper's worker 1.
// Bags: B0 = {0}, B1 = {1}, B2 = {2, 3}, B3 = {4, 5}.
// Step 1 (distance 4): sends B3 to worker 4 and receives 2 blocks from worker
// 2 (the paper's Example 2 says worker 2, 1-based; Theorem 1 gives worker 3,
// 1-based, which is 2 here). Step 2 (distance 2): B2 to worker 2, receives
// from worker 4. Step 3 (distance 1): B1 to worker 1, receives from worker 5.
TEST(ScheduleTest, SparReduceScatterMatchesSixWorkerExample) {
  const std::vector<Step> steps = PlanSparReduceScatter(6, 0);
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(
      steps[0],
      (Step{.send_to = 4, .recv_from = 2, .send = {4, 2}, .recv = {0, 2}}));
  EXPECT_EQ(
      steps[1],
      (Step{.send_to = 2, .recv_from = 4, .send = {2, 2}, .recv = {0, 2}}));
  EXPECT_EQ(
      steps[2],
      (Step{.send_to = 1, .recv_from = 5, .send = {1, 1}, .recv = {0, 1}}));
  // Worker 3 (the paper's worker 4) at step 1: bag {1, 2} (blocks 7, 8 mod 6)
  // to worker 1, two blocks {3, 4} from worker 5.
  const std::vector<Step> w3 = PlanSparReduceScatter(6, 3);
  EXPECT_THAT(Blocks(w3[0].send, 6), ::testing::ElementsAre(1, 2));
  EXPECT_EQ(w3[0].send_to, 1);
  EXPECT_EQ(w3[0].recv_from, 5);
  EXPECT_THAT(Blocks(w3[0].recv, 6), ::testing::ElementsAre(3, 4));
}

// For every group size up to 1024 and every position: each block other than
// w is sent exactly once, w is never sent, the bag received is a subset of the
// blocks still held (Theorem 1), what a sender sends is what its target
// expects, and after the last step only block w is held.
TEST(ScheduleTest, SparReduceScatterIsConsistentUpTo1024) {
  for (int p = 1; p <= kMaxGroup; ++p) {
    std::vector<std::vector<Step>> plans;
    for (int w = 0; w < p; ++w) plans.push_back(PlanSparReduceScatter(p, w));
    // Violations are counted in the hot loops and asserted once per p.
    int sent_unheld = 0, theorem_1 = 0, mismatched = 0, wrong_end = 0;
    std::vector<char> held(p);
    std::vector<int> sent_count(p);
    for (int w = 0; w < p; ++w) {
      ASSERT_EQ(static_cast<int>(plans[w].size()), CeilLog2(p)) << p;
      std::fill(held.begin(), held.end(), 1);
      std::fill(sent_count.begin(), sent_count.end(), 0);
      for (size_t i = 0; i < plans[w].size(); ++i) {
        const Step& step = plans[w][i];
        for (int j = 0; j < step.send.count; ++j) {
          const int b = At(step.send, j, p);
          sent_unheld += !held[b];
          ++sent_count[b];
          held[b] = 0;
        }
        for (int j = 0; j < step.recv.count; ++j) {
          theorem_1 += !held[At(step.recv, j, p)];
        }
        // The matching step of the source sends exactly what w expects.
        const Step& source = plans[step.recv_from][i];
        mismatched += source.send_to != w || !(source.send == step.recv);
      }
      for (int b = 0; b < p; ++b) {
        wrong_end += held[b] != (b == w) || sent_count[b] != (b == w ? 0 : 1);
      }
    }
    ASSERT_EQ(sent_unheld, 0) << "p=" << p << ": a block sent twice";
    ASSERT_EQ(theorem_1, 0) << "p=" << p << ": received bag not held";
    ASSERT_EQ(mismatched, 0) << "p=" << p << ": sender and receiver disagree";
    ASSERT_EQ(wrong_end, 0) << "p=" << p << ": not left with block w alone";
  }
}

// Every position ends with every block exactly once, the blocks it sends are
// ones it holds, and sender and receiver agree at each step.
TEST(ScheduleTest, BruckAllGatherIsConsistentUpTo1024) {
  for (int p = 1; p <= kMaxGroup; ++p) {
    std::vector<std::vector<Step>> plans;
    for (int w = 0; w < p; ++w) plans.push_back(PlanBruckAllGather(p, w));
    int sent_unheld = 0, mismatched = 0, not_once = 0;
    std::vector<int> have(p);
    for (int w = 0; w < p; ++w) {
      ASSERT_EQ(static_cast<int>(plans[w].size()), CeilLog2(p));
      std::fill(have.begin(), have.end(), 0);
      have[w] = 1;
      for (size_t s = 0; s < plans[w].size(); ++s) {
        const Step& step = plans[w][s];
        for (int j = 0; j < step.send.count; ++j) {
          sent_unheld += !have[At(step.send, j, p)];
        }
        for (int j = 0; j < step.recv.count; ++j) {
          ++have[At(step.recv, j, p)];
        }
        const Step& source = plans[step.recv_from][s];
        mismatched += source.send_to != w || !(source.send == step.recv);
      }
      for (int b = 0; b < p; ++b) not_once += have[b] != 1;
    }
    ASSERT_EQ(sent_unheld, 0) << "p=" << p << ": sent a block not held";
    ASSERT_EQ(mismatched, 0) << "p=" << p << ": sender and receiver disagree";
    ASSERT_EQ(not_once, 0) << "p=" << p << ": a block arrived 0 or 2+ times";
  }
}

TEST(ScheduleTest, RecursiveDoublingPairsUpTo1024) {
  for (int p = 1; p <= kMaxGroup; p *= 2) {
    for (int g = 0; g < p; ++g) {
      const std::vector<int> partners = PlanRecursiveDoubling(p, g);
      ASSERT_EQ(static_cast<int>(partners.size()), CeilLog2(p));
      std::set<int> reached{g};
      for (size_t t = 0; t < partners.size(); ++t) {
        ASSERT_EQ(PlanRecursiveDoubling(p, partners[t])[t], g);
        std::set<int> next = reached;
        for (int m : reached) next.insert(m ^ (1 << t));
        reached = next;
      }
      ASSERT_EQ(static_cast<int>(reached.size()), p);
    }
  }
}

TEST(ScheduleTest, BlockRangesTileTheGradient) {
  for (uint64_t n : {0ull, 1ull, 5ull, 17ull, 1000ull, 4294967295ull}) {
    for (int parts = 1; parts <= 64; ++parts) {
      uint64_t expected_begin = 0;
      uint64_t smallest = n;
      uint64_t largest = 0;
      for (int b = 0; b < parts; ++b) {
        const sparse::IndexRange r = BlockRange(n, parts, b);
        ASSERT_EQ(r.begin, expected_begin);
        ASSERT_LE(r.begin, r.end);
        smallest = std::min(smallest, r.size());
        largest = std::max(largest, r.size());
        expected_begin = r.end;
      }
      ASSERT_EQ(expected_begin, n);
      ASSERT_LE(largest - smallest, 1u);
    }
  }
}

TEST(ScheduleTest, QuotasNeverExceedK) {
  for (uint64_t n : {0ull, 3ull, 10ull, 1000ull}) {
    for (uint64_t k = 0; k <= n; k += std::max<uint64_t>(1, n / 7)) {
      for (int parts = 1; parts <= 16; ++parts) {
        uint64_t total = 0;
        for (int b = 0; b < parts; ++b) {
          const uint64_t size = BlockRange(n, parts, b).size();
          const uint64_t q = BlockQuota(k, parts, b, size);
          ASSERT_LE(q, size);
          total += q;
        }
        ASSERT_LE(total, k);
        if (n >= k * parts) {  // no block is smaller than its quota
          ASSERT_EQ(total, k);
        }
      }
    }
  }
}

TEST(ScheduleTest, TeamLayoutIsConsecutive) {
  const TeamLayout layout{.world_size = 12, .teams = 3};
  EXPECT_EQ(layout.team_size(), 4);
  EXPECT_EQ(layout.team_of(5), 1);
  EXPECT_EQ(layout.position_of(5), 1);
  for (int r = 0; r < 12; ++r) {
    EXPECT_EQ(layout.rank_of(layout.team_of(r), layout.position_of(r)), r);
  }
}

// Group sizes for the O(p^2) checks: every p to 64, then larger and odd ones
// up to the limit.
std::vector<int> QuadraticSizes() {
  std::vector<int> sizes;
  for (int p = 1; p <= 64; ++p) sizes.push_back(p);
  for (int p : {100, 127, 255, 256, 257, 511, 1000, 1023, kMaxGroup}) {
    sizes.push_back(p);
  }
  return sizes;
}

TEST(ScheduleTest, TreeReduceGathersEveryPositionAtTheRootUpTo1024) {
  for (int p = 1; p <= kMaxGroup; ++p) {
    std::vector<std::vector<TreeStep>> plans(p);
    for (int w = 0; w < p; ++w) plans[w] = PlanTreeReduce(p, w);
    // holds[w]: how many positions' values w has summed so far.
    std::vector<int> holds(p, 1);
    std::vector<bool> sent(p, false);
    for (int t = 0; t < CeilLog2(p); ++t) {
      for (int w = 0; w < p; ++w) {
        for (const TreeStep& step : plans[w]) {
          if (step.level != t || !step.send) continue;
          ASSERT_FALSE(sent[w]) << p << " " << w;
          ASSERT_THAT(plans[step.peer],
                      ::testing::Contains(TreeStep{.level = t, .peer = w}))
              << p << " " << w;
          holds[step.peer] += holds[w];
          sent[w] = true;
        }
      }
    }
    ASSERT_EQ(holds[0], p) << p;
    int receives = 0;
    for (int w = 0; w < p; ++w) {
      for (const TreeStep& step : plans[w]) receives += step.send ? 0 : 1;
    }
    ASSERT_EQ(receives, p - 1) << p;  // one per send: no receive waits forever
    for (int w = 0; w < p; ++w) {
      ASSERT_EQ(sent[w], w != 0) << p << " " << w;
      // Receives come before the one send.
      for (size_t i = 0; i + 1 < plans[w].size(); ++i) {
        ASSERT_FALSE(plans[w][i].send);
      }
    }
  }
}

TEST(ScheduleTest, TreeBroadcastReachesEveryPositionOnceUpTo1024) {
  for (int p = 1; p <= kMaxGroup; ++p) {
    std::vector<std::vector<TreeStep>> plans(p);
    for (int w = 0; w < p; ++w) plans[w] = PlanTreeBroadcast(p, w);
    std::vector<int> received(p, 0);
    std::vector<bool> has(p, false);
    has[0] = true;
    for (int t = CeilLog2(p) - 1; t >= 0; --t) {
      for (int w = 0; w < p; ++w) {
        for (const TreeStep& step : plans[w]) {
          if (step.level != t || !step.send) continue;
          ASSERT_TRUE(has[w]) << p << " " << w;
          ASSERT_THAT(plans[step.peer],
                      ::testing::Contains(TreeStep{.level = t, .peer = w}));
          has[step.peer] = true;
          ++received[step.peer];
        }
      }
    }
    int receives = 0;
    for (int w = 0; w < p; ++w) {
      ASSERT_TRUE(has[w]) << p << " " << w;
      ASSERT_EQ(received[w], w == 0 ? 0 : 1) << p << " " << w;
      for (const TreeStep& step : plans[w]) receives += step.send ? 0 : 1;
    }
    ASSERT_EQ(receives, p - 1) << p;  // one per send: no receive waits forever
  }
}

TEST(ScheduleTest, RingSumsEveryBlockThenGathersIt) {
  for (int p : QuadraticSizes()) {
    std::vector<std::vector<Step>> reduce(p), gather(p);
    for (int w = 0; w < p; ++w) {
      reduce[w] = PlanRingReduceScatter(p, w);
      gather[w] = PlanRingAllGather(p, w);
      ASSERT_EQ(static_cast<int>(reduce[w].size()), p - 1);
    }
    // count[w][b]: contributions to block b that w holds.
    std::vector<std::vector<int>> count(p, std::vector<int>(p, 1));
    for (int s = 0; s + 1 < p; ++s) {
      std::vector<int> arriving(p);  // at out.send_to, from w
      for (int w = 0; w < p; ++w) {
        const Step& out = reduce[w][s];
        const Step& in = reduce[out.send_to][s];
        ASSERT_EQ(in.recv_from, w);
        ASSERT_EQ(in.recv, out.send);
        arriving[w] = count[w][out.send.first];
      }
      for (int w = 0; w < p; ++w) {
        const Step& out = reduce[w][s];
        count[out.send_to][out.send.first] += arriving[w];
      }
    }
    // Position w then owns the whole sum of block w + 1.
    std::vector<std::vector<bool>> whole(p, std::vector<bool>(p, false));
    for (int w = 0; w < p; ++w) {
      ASSERT_EQ(count[w][Mod(w + 1, p)], p) << p << " " << w;
      whole[w][Mod(w + 1, p)] = true;
    }
    for (int s = 0; s + 1 < p; ++s) {
      for (int w = 0; w < p; ++w) {
        const Step& out = gather[w][s];
        const Step& in = gather[out.send_to][s];
        ASSERT_EQ(in.recv_from, w);
        ASSERT_EQ(in.recv, out.send);
        ASSERT_TRUE(whole[w][out.send.first]) << p << " " << w << " " << s;
      }
      for (int w = 0; w < p; ++w) {
        whole[gather[w][s].send_to][gather[w][s].send.first] = true;
      }
    }
    for (int w = 0; w < p; ++w) {
      ASSERT_THAT(whole[w], ::testing::Each(true)) << p << " " << w;
    }
  }
}

TEST(ScheduleTest, RotationPairsEveryTwoPositionsOnce) {
  for (int p : QuadraticSizes()) {
    std::vector<std::vector<Step>> plans(p);
    for (int w = 0; w < p; ++w) plans[w] = PlanRotation(p, w);
    for (int w = 0; w < p; ++w) {
      ASSERT_EQ(static_cast<int>(plans[w].size()), p - 1);
      std::set<int> targets;
      for (size_t s = 0; s < plans[w].size(); ++s) {
        const Step& step = plans[w][s];
        ASSERT_EQ(plans[step.send_to][s].recv_from, w);
        ASSERT_EQ(step.send.first, step.send_to);
        targets.insert(step.send_to);
      }
      ASSERT_EQ(static_cast<int>(targets.size()), p - 1);
      ASSERT_FALSE(targets.contains(w));
    }
  }
}

TEST(ScheduleTest, BalanceMovesEveryPositionToItsTargetOnce) {
  std::mt19937 rng(7);
  for (int p : QuadraticSizes()) {
    for (int trial = 0; trial < 3; ++trial) {
      std::vector<uint64_t> counts(p);
      for (uint64_t& c : counts) c = rng() % 50;
      if (trial == 1) counts[rng() % p] += 400 * static_cast<uint64_t>(p);
      if (trial == 2) std::fill(counts.begin(), counts.end(), 0);
      const Balance balance = PlanBalance(counts);
      const uint64_t total = balance.total();
      uint64_t largest = 0;
      for (uint64_t c : counts) largest = std::max(largest, c);
      ASSERT_EQ(balance.needed, total > 0 && largest * p > 4 * total);
      for (int to = 0; to < p; ++to) {
        uint64_t next = to * total / p;  // what `to` must receive next
        for (int from = 0; from < p; ++from) {
          const PositionRange range = balance.Transfer(from, to);
          if (range.size() == 0) continue;
          ASSERT_EQ(range.begin, next) << p << " " << from << " " << to;
          ASSERT_GE(range.begin, balance.offsets[from]);
          ASSERT_LE(range.end, balance.offsets[from + 1]);
          next = range.end;
        }
        ASSERT_EQ(next, (to + 1) * total / p) << p << " " << to;
      }
    }
  }
}

TEST(ScheduleTest, PhasesHaveDisjointTagSpaces) {
  EXPECT_EQ(PhaseStep(0), 0u);
  EXPECT_EQ(PhaseStep(1), kPhaseSteps);
  EXPECT_EQ(PhaseStep(2, 5), 2 * kPhaseSteps + 5);
  // The longest phase, a ring or a rotation of the largest world, fits.
  EXPECT_LE(PlanRotation(kPhaseSteps, 0).size(), kPhaseSteps);
  EXPECT_LE(PlanRingAllGather(kPhaseSteps, 0).size(), kPhaseSteps);
  EXPECT_DEATH(PhaseStep(1, kPhaseSteps), "step");
}

}  // namespace
}  // namespace gradmesh::collectives
