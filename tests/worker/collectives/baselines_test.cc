// The baselines (dense ring, TopkA, Gaussiank, TopkDSA, gTopk, Ok-Topk) on the
// loopback transport, each against an independent sequential reference.
#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/multi_rank.h"
#include "tests/support/reference.h"
#include "worker/collectives/registry.h"
#include "worker/collectives/schedule.h"
#include "worker/collectives/topka.h"
#include "worker/transport/fault_injection.h"
#include "worker/transport/loopback.h"

namespace gradmesh::collectives {
namespace {

using ::gradmesh::testing::MassBalance;
using ::gradmesh::testing::RandomVector;
using ::gradmesh::testing::RankRun;
using ::gradmesh::testing::RunIteration;
using ::gradmesh::testing::SortKthLargest;
using ::gradmesh::testing::SortTopK;
using ::gradmesh::testing::Sparse;
using ::gradmesh::testing::ToSparse;

constexpr int kTau = 3;       // Ok-Topk periods, short so that tests cross
constexpr int kTauPrime = 2;  // several of them

// ---------------------------------------------------------------------------
// Independent references: all P workers in lockstep, written from the papers.
// Each returns the result and the bytes every worker receives, and updates
// the residuals.
// ---------------------------------------------------------------------------

struct Expected {
  Sparse result;
  std::vector<uint64_t> bytes_received;
};

uint64_t Begin(uint64_t n, int parts, int b) { return b * n / parts; }

// Accumulators and their top-k selections.
struct Local {
  std::vector<std::vector<float>> acc;
  std::vector<Sparse> selected;
};

Local Select(const std::vector<std::vector<float>>& gradients,
             const std::vector<std::vector<float>>& residuals, uint64_t k,
             bool gaussian) {
  Local local;
  for (size_t r = 0; r < gradients.size(); ++r) {
    std::vector<float> acc = residuals[r];
    for (size_t i = 0; i < acc.size(); ++i) acc[i] += gradients[r][i];
    local.selected.push_back(gaussian ? ToSparse(GaussianSelect(acc, k))
                                      : SortTopK(ToSparse(acc), k));
    local.acc.push_back(std::move(acc));
  }
  return local;
}

// acc with the selected entries removed.
std::vector<float> Without(std::vector<float> acc, const Sparse& selected) {
  for (const auto& [i, x] : selected) acc[i] = 0.0f;
  return acc;
}

Expected DenseReference(const std::vector<std::vector<float>>& gradients,
                        std::vector<std::vector<float>>& residuals) {
  const int p = gradients.size();
  const uint64_t n = gradients[0].size();
  std::vector<std::vector<float>> acc = residuals;
  for (int r = 0; r < p; ++r) {
    for (uint64_t i = 0; i < n; ++i) acc[r][i] += gradients[r][i];
  }
  Expected out;
  out.bytes_received.assign(p, 0);
  // Chunk c is summed g_c, then g_(c+1) + that, and so on round the ring.
  for (int c = 0; c < p; ++c) {
    for (uint64_t i = Begin(n, p, c); i < Begin(n, p, c + 1); ++i) {
      float sum = acc[c][i];
      for (int j = 1; j < p; ++j) sum = acc[(c + j) % p][i] + sum;
      out.result[i] = sum;
    }
  }
  for (int w = 0; w < p && p > 1; ++w) {
    const uint64_t own = Begin(n, p, w + 1) - Begin(n, p, w);
    const int next = (w + 1) % p;
    const uint64_t next_size = Begin(n, p, next + 1) - Begin(n, p, next);
    out.bytes_received[w] = 4 * (2 * n - own - next_size);
  }
  for (auto& r : residuals) std::fill(r.begin(), r.end(), 0.0f);
  return out;
}

Expected AllGatherReference(const std::vector<std::vector<float>>& gradients,
                            std::vector<std::vector<float>>& residuals,
                            uint64_t k, bool gaussian) {
  const int p = gradients.size();
  Local local = Select(gradients, residuals, k, gaussian);
  Expected out;
  for (int r = 0; r < p; ++r) {
    for (const auto& [i, x] : local.selected[r]) out.result[i] += x;
  }
  for (int w = 0; w < p; ++w) {
    uint64_t others = 0;
    for (int r = 0; r < p; ++r) others += r == w ? 0 : local.selected[r].size();
    out.bytes_received.push_back(8 * others);
    residuals[w] = Without(local.acc[w], local.selected[w]);
  }
  return out;
}

Expected GTopkReference(const std::vector<std::vector<float>>& gradients,
                        std::vector<std::vector<float>>& residuals,
                        uint64_t k) {
  const int p = gradients.size();
  Local local = Select(gradients, residuals, k, false);
  std::vector<Sparse> current = local.selected;
  for (int w = 0; w < p; ++w)
    residuals[w] = Without(local.acc[w], local.selected[w]);
  Expected out;
  out.bytes_received.assign(p, 0);
  // Binomial tree: at level t, w (a multiple of 2^(t+1)) absorbs w + 2^t.
  for (int bit = 1; bit < p; bit *= 2) {
    for (int w = 0; w + bit < p; w += 2 * bit) {
      Sparse sum = current[w];
      for (const auto& [i, x] : current[w + bit]) sum[i] += x;
      out.bytes_received[w] += 8 * current[w + bit].size();
      current[w] = SortTopK(sum, k);
      for (const auto& [i, x] : sum) {
        if (!current[w].count(i)) residuals[w][i] += x;
      }
    }
  }
  out.result = current[0];
  for (int w = 1; w < p; ++w) out.bytes_received[w] += 8 * out.result.size();
  return out;
}

Expected DsaReference(const std::vector<std::vector<float>>& gradients,
                      std::vector<std::vector<float>>& residuals, uint64_t k) {
  const int p = gradients.size();
  const uint64_t n = gradients[0].size();
  Local local = Select(gradients, residuals, k, false);
  Expected out;
  out.bytes_received.assign(p, 0);
  for (int q = 0; q < p; ++q) {
    const uint64_t lo = Begin(n, p, q), hi = Begin(n, p, q + 1);
    // SparCML's summation: sparse while |H1| + |H2| <= delta = N/2.
    Sparse sum;
    bool dense = false;
    for (int r = 0; r < p; ++r) {
      Sparse part(local.selected[r].lower_bound(lo),
                  local.selected[r].lower_bound(hi));
      if (r != q) out.bytes_received[q] += 8 * part.size();
      if (!dense && sum.size() + part.size() > (hi - lo) / 2) dense = true;
      for (const auto& [i, x] : part) sum[i] += x;
    }
    for (int w = 0; w < p; ++w) {
      if (w != q)
        out.bytes_received[w] += 1 + (dense ? 4 * (hi - lo) : 8 * sum.size());
    }
    for (const auto& [i, x] : sum) {
      if (x != 0.0f) out.result[i] = x;
    }
  }
  for (int w = 0; w < p; ++w)
    residuals[w] = Without(local.acc[w], local.selected[w]);
  return out;
}

// Ok-Topk keeps thresholds and regions across iterations.
class OkTopkReference {
 public:
  OkTopkReference(int p, uint64_t n, uint64_t k) : p_(p), n_(n), k_(k) {
    for (int r = 0; r <= p; ++r) bounds_.push_back(Begin(n, p, r));
  }

  Expected Iterate(const std::vector<std::vector<float>>& gradients,
                   std::vector<std::vector<float>>& residuals) {
    const bool evaluate = t_ % kTauPrime == 0;
    const bool repartition = t_ % kTau == 0;
    std::vector<std::vector<float>> acc = residuals;
    for (int r = 0; r < p_; ++r) {
      for (uint64_t i = 0; i < n_; ++i) acc[r][i] += gradients[r][i];
    }
    if (evaluate) {
      local_th_.clear();
      for (int r = 0; r < p_; ++r)
        local_th_.push_back(SortKthLargest(acc[r], k_));
    }
    std::vector<Sparse> local(p_);
    for (int r = 0; r < p_; ++r) {
      for (uint64_t i = 0; i < n_; ++i) {
        if (acc[r][i] != 0.0f && std::fabs(acc[r][i]) >= local_th_[r]) {
          local[r][i] = acc[r][i];
        }
      }
    }
    if (repartition) {
      std::vector<uint64_t> sums(p_ + 1, 0);
      for (int r = 0; r < p_; ++r) {
        const std::vector<std::pair<uint32_t, float>> sel(local[r].begin(),
                                                          local[r].end());
        for (int b = 1; b < p_; ++b) {
          sums[b] +=
              sel.empty() ? Begin(n_, p_, b) : sel[b * sel.size() / p_].first;
        }
      }
      for (int b = 1; b < p_; ++b)
        bounds_[b] = std::max(bounds_[b - 1], sums[b] / p_);
    }
    std::vector<Sparse> reduced(p_);
    std::vector<float> all_reduced;
    for (int q = 0; q < p_; ++q) {
      for (int r = 0; r < p_; ++r) {
        for (auto it = local[r].lower_bound(bounds_[q]);
             it != local[r].lower_bound(bounds_[q + 1]); ++it) {
          reduced[q][it->first] += it->second;
        }
      }
      for (const auto& [i, x] : reduced[q]) all_reduced.push_back(x);
    }
    if (evaluate) global_th_ = SortKthLargest(all_reduced, k_);
    Expected out;
    for (int q = 0; q < p_; ++q) {
      for (const auto& [i, x] : reduced[q]) {
        if (x != 0.0f && std::fabs(x) >= global_th_) out.result[i] = x;
      }
    }
    for (int r = 0; r < p_; ++r) {
      residuals[r] = acc[r];
      for (const auto& [i, x] : local[r]) {
        if (out.result.count(i)) residuals[r][i] = 0.0f;
      }
    }
    ++t_;
    return out;
  }

 private:
  int p_;
  uint64_t n_, k_;
  int t_ = 0;
  std::vector<float> local_th_;
  float global_th_ = 0;
  std::vector<uint64_t> bounds_;
};

// ---------------------------------------------------------------------------
// P in 1..16, several n and densities, four iterations, every algorithm.
// ---------------------------------------------------------------------------

using Param = std::tuple<std::string, int, uint64_t, double>;

class BaselineTest : public ::testing::TestWithParam<Param> {};

TEST_P(BaselineTest, AgreesWithReferenceAndConservesMass) {
  const auto& [algorithm, world, n, density] = GetParam();
  constexpr int kIterations = 4;
  const uint64_t k = SelectionSize(n, density);
  transport::LoopbackNetwork network(world);
  std::vector<std::unique_ptr<Collective>> instances;
  for (int r = 0; r < world; ++r) {
    auto created = CreateCollective({.algorithm = algorithm,
                                     .density = density,
                                     .oktopk_tau = kTau,
                                     .oktopk_tau_prime = kTauPrime},
                                    world, r, n);
    ASSERT_TRUE(created.ok()) << created.status();
    instances.push_back(*std::move(created));
  }
  std::vector<std::vector<float>> residuals(world, std::vector<float>(n, 0.0f));
  std::vector<std::vector<float>> expected_residuals = residuals;
  OkTopkReference oktopk(world, n, k);
  const int levels = CeilLog2(world);

  for (int it = 0; it < kIterations; ++it) {
    SCOPED_TRACE(absl::StrCat("iteration ", it));
    std::vector<std::vector<float>> gradients;
    for (int r = 0; r < world; ++r) {
      gradients.push_back(RandomVector(n, 977 * it + 13 * r + n));
    }
    const MassBalance balance(gradients, residuals);
    const std::vector<RankRun> runs =
        RunIteration(network, instances, gradients, residuals, it);

    Expected expected;
    if (algorithm == "dense") {
      expected = DenseReference(gradients, expected_residuals);
    } else if (algorithm == "topka" || algorithm == "gaussiank") {
      expected = AllGatherReference(gradients, expected_residuals, k,
                                    algorithm == "gaussiank");
    } else if (algorithm == "gtopk") {
      expected = GTopkReference(gradients, expected_residuals, k);
    } else if (algorithm == "topkdsa") {
      expected = DsaReference(gradients, expected_residuals, k);
    } else {
      ASSERT_EQ(algorithm, "oktopk");
      expected = oktopk.Iterate(gradients, expected_residuals);
    }

    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(runs[r].status.ok())
          << "rank " << r << ": " << runs[r].status;
      // Bitwise identical on every rank.
      ASSERT_EQ(runs[r].result.indices, runs[0].result.indices);
      for (size_t e = 0; e < runs[r].result.size(); ++e) {
        ASSERT_EQ(std::bit_cast<uint32_t>(runs[r].result.values[e]),
                  std::bit_cast<uint32_t>(runs[0].result.values[e]));
      }
      ASSERT_TRUE(sparse::Validate(runs[r].result, {0, n}).ok());
      ASSERT_EQ(ToSparse(runs[r].result), expected.result) << "rank " << r;
      for (uint64_t i = 0; i < n; ++i) {
        ASSERT_EQ(residuals[r][i], expected_residuals[r][i])
            << "rank " << r << " index " << i;
      }
      const OpStats& s = runs[r].stats;
      if (!expected.bytes_received.empty()) {
        EXPECT_EQ(s.bytes_received, expected.bytes_received[r]) << "rank " << r;
      }
      // Table I, with 4-byte indexes and values (8 bytes per sparse value).
      if (algorithm == "dense") {
        EXPECT_EQ(s.rounds, 2 * (world - 1));
        EXPECT_LE(s.bytes_received, 4 * 2 * (n / world + 1) * (world - 1));
      } else if (algorithm == "topka") {
        EXPECT_EQ(s.rounds, levels);
        EXPECT_LE(s.bytes_received, 8 * k * (world - 1));
      } else if (algorithm == "gaussiank") {
        EXPECT_EQ(s.rounds, levels);
      } else if (algorithm == "gtopk") {
        EXPECT_LE(s.rounds, 2 * levels);
        EXPECT_LE(s.bytes_received, 8 * k * (levels + 1));
        if (r == 0) {
          EXPECT_EQ(s.rounds, 2 * levels);
          EXPECT_LE(s.bytes_received, 8 * k * levels);
        }
      } else if (algorithm == "topkdsa") {
        EXPECT_EQ(s.rounds, world - 1 + levels);
      }
    }

    ASSERT_TRUE(balance.Holds(runs[0].result, residuals));
  }
}

std::string BaselineName(const ::testing::TestParamInfo<Param>& info) {
  const auto& [algorithm, world, n, density] = info.param;
  return absl::StrCat(algorithm, "_P", world, "_n", n, "_density",
                      static_cast<int>(density * 100));
}

INSTANTIATE_TEST_SUITE_P(
    AlgorithmsWorldsSizesDensities, BaselineTest,
    ::testing::Combine(::testing::Values("dense", "topka", "gaussiank",
                                         "topkdsa", "gtopk", "oktopk"),
                       ::testing::Range(1, 17),
                       ::testing::Values<uint64_t>(0, 5, 1000, 3001),
                       ::testing::Values(0.01, 0.3)),
    BaselineName);

// The loopback network with every endpoint behind a fault injector.
class FaultyNetwork {
 public:
  explicit FaultyNetwork(int size) : base_(size) {
    for (int r = 0; r < size; ++r) {
      endpoints_.push_back(std::make_unique<transport::FaultInjectingTransport>(
          base_.endpoint(r)));
    }
  }
  int size() const { return base_.size(); }
  transport::FaultInjectingTransport* endpoint(int r) {
    return endpoints_[r].get();
  }

 private:
  transport::LoopbackNetwork base_;
  std::vector<std::unique_ptr<transport::FaultInjectingTransport>> endpoints_;
};

// One dense ring all-reduce of n values on `world` ranks of `network`,
// checked against the reference: the same exact sum on every rank, Table I's
// rounds and bytes; returns the runs.
template <typename Network>
std::vector<RankRun> ExpectDenseRingExact(Network& network, uint64_t n) {
  const int world = network.size();
  std::vector<std::unique_ptr<Collective>> instances;
  for (int r = 0; r < world; ++r) {
    auto created = CreateCollective({.algorithm = "dense"}, world, r, n);
    EXPECT_TRUE(created.ok()) << created.status();
    if (!created.ok()) return {};
    instances.push_back(*std::move(created));
  }
  std::vector<std::vector<float>> gradients;
  for (int r = 0; r < world; ++r) gradients.push_back(RandomVector(n, r));
  std::vector<std::vector<float>> residuals(world, std::vector<float>(n, 0.0f));
  std::vector<std::vector<float>> expected_residuals = residuals;
  const Expected expected = DenseReference(gradients, expected_residuals);
  std::vector<RankRun> runs =
      RunIteration(network, instances, gradients, residuals, 0);
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(runs[r].status.ok()) << runs[r].status;
    EXPECT_EQ(ToSparse(runs[r].result), expected.result) << "rank " << r;
    EXPECT_EQ(runs[r].stats.rounds, 2 * (world - 1));
    EXPECT_EQ(runs[r].stats.bytes_received, expected.bytes_received[r]);
  }
  return runs;
}

// The dense ring moves chunks over 256k values in pieces: the sum, the bytes
// and the rounds stay those of the unpipelined ring, on every rank.
TEST(DenseRingTest, LargeChunksMoveInPiecesAndTheSumStaysExact) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("P = ", world));
    transport::LoopbackNetwork network(world);
    // Chunks of 262145 values: 2 pieces a round, not one message.
    for (const RankRun& run :
         ExpectDenseRingExact(network, (262144 + 1) * world)) {
      EXPECT_EQ(run.stats.messages_received, 2 * run.stats.rounds);
      EXPECT_EQ(run.stats.messages_sent, 2 * run.stats.rounds);
    }
  }
}

// Each piece has a tag of its own: a piece sent twice is not taken for the
// next one (pieces of one chunk have the same size, so nothing else would
// tell).
TEST(DenseRingTest, APieceSentTwiceIsNotTakenForTheNext) {
  FaultyNetwork network(3);
  network.endpoint(1)->MangleSends(
      [](int, const transport::Tag&, std::string payload) {
        return std::vector<std::string>{payload, payload};
      });
  ExpectDenseRingExact(network, 3 * 2 * 262144);  // 2 equal pieces a chunk
}

// ---------------------------------------------------------------------------
// Table I on inputs that meet the papers' assumptions: every worker's large
// values are spread evenly over the P partitions and all workers share them
// (k = 4P of n = 400P), so every quantity is exact.
// ---------------------------------------------------------------------------

std::vector<std::vector<float>> SharedSpreadGradients(int world, uint64_t n,
                                                      uint64_t k, int seed) {
  std::vector<std::vector<float>> out;
  for (int r = 0; r < world; ++r) {
    std::vector<float> g = RandomVector(n, seed * 100 + r);
    for (float& x : g) x *= 1e-3f;
    // k / P large values in each partition, at the same places on every
    // worker, all positive so that sums never cancel.
    for (uint64_t j = 0; j < k; ++j) {
      g[j * (n / k) + 3] = 10.0f + static_cast<float>((j * 7 + r) % 13);
    }
    out.push_back(std::move(g));
  }
  return out;
}

class BaselineCostTest : public ::testing::TestWithParam<int> {};

TEST_P(BaselineCostTest, TopkDsaAndOkTopkMeetTableOne) {
  const int world = GetParam();
  const uint64_t n = 400 * world;
  const double density = 0.01;
  const double k = 4.0 * world;
  const double P = world;
  for (const std::string algorithm : {"topkdsa", "oktopk"}) {
    SCOPED_TRACE(algorithm);
    transport::LoopbackNetwork network(world);
    std::vector<std::unique_ptr<Collective>> instances;
    for (int r = 0; r < world; ++r) {
      instances.push_back(*CreateCollective({.algorithm = algorithm,
                                             .density = density,
                                             .oktopk_tau = 64,
                                             .oktopk_tau_prime = 32},
                                            world, r, n));
    }
    std::vector<std::vector<float>> residuals(world,
                                              std::vector<float>(n, 0.0f));
    for (int it = 0; it < 4; ++it) {
      const auto runs =
          RunIteration(network, instances,
                       SharedSpreadGradients(world, n, k, it), residuals, it);
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(runs[r].status.ok()) << runs[r].status;
        const double received = runs[r].stats.bytes_received;
        if (algorithm == "topkdsa") {
          // [4 k (P-1)/P, (2k + n)(P-1)/P] words, plus one representation
          // byte per gathered partition. Full overlap: the lower end.
          EXPECT_EQ(runs[r].stats.figures.dense_partitions.value_or(-1), 0);
          EXPECT_DOUBLE_EQ(received, 4 * 4 * k * (P - 1) / P + (P - 1));
          EXPECT_LE(received, 4 * (2 * k + n) * (P - 1) / P + (P - 1));
        } else if (it > 0) {
          // Ok-Topk without threshold re-evaluation (iterations 2..tau'):
          // [2 k (P-1)/P, 6 k (P-1)/P] words, plus the 4-byte counts
          // all-gathered before balancing.
          EXPECT_EQ(runs[r].stats.figures.thresholds_evaluated.value_or(-1), 0);
          EXPECT_EQ(runs[r].stats.figures.global_selected.value_or(-1), k);
          EXPECT_GE(received, 4 * 2 * k * (P - 1) / P);
          EXPECT_LE(received, 4 * 6 * k * (P - 1) / P + 4 * (P - 1));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, BaselineCostTest, ::testing::Range(1, 17));

// A call that fails in the caller's agreement (after Accumulate)
// still counts toward Ok-Topk's periods, so that a rank whose agreement
// failed stays in step with one whose call failed later; the gradient stays
// in the residual.
TEST(OkTopkTest, CallsFailedInTheAgreementCountTowardThePeriods) {
  constexpr uint64_t kN = 200;
  transport::LoopbackNetwork network(1);
  auto instance = *CreateCollective({.algorithm = "oktopk",
                                     .density = 0.05,
                                     .oktopk_tau = 100,
                                     .oktopk_tau_prime = 2},
                                    1, 0, kN);
  std::vector<float> residual(kN, 0.0f);
  const std::vector<float> gradient = RandomVector(kN, 3);
  std::vector<int64_t> evaluated;
  for (int call = 0; call < 3; ++call) {
    const OpContext context{.transport = network.endpoint(0),
                            .operation = static_cast<uint64_t>(call)};
    OpStats stats;
    if (call == 1) {
      // Accumulated, then refused by the caller's agreement: never reduced.
      EXPECT_TRUE(
          instance->Accumulate(gradient, absl::MakeSpan(residual), &stats)
              .ok());
    } else {
      auto result = instance->AllReduce(gradient, absl::MakeSpan(residual),
                                        context, &stats);
      EXPECT_TRUE(result.ok()) << result.status();
    }
    evaluated.push_back(stats.figures.thresholds_evaluated.value_or(-1));
  }
  // Calls 0 and 2 re-evaluate (period 2); the failed call 1 was counted.
  EXPECT_EQ(evaluated[0], 1);
  EXPECT_EQ(evaluated[2], 1);
}

// TopkDSA switches a partition to dense exactly when |H1| + |H2| passes
// delta = N/2: with N = 40 per partition (delta = 20) and every worker
// putting k/P values into each partition, at indices no other worker uses,
// each partition sums to k values, and the switch happens for k > 20.
TEST(TopkDsaTest, SwitchesToDenseWhereDeltaSays) {
  for (const auto& [world, k, dense] :
       std::vector<std::tuple<int, uint64_t, bool>>{
           {4, 20, false}, {4, 24, true}, {2, 20, false}, {2, 22, true}}) {
    const uint64_t n = 40 * world;
    transport::LoopbackNetwork network(world);
    std::vector<std::unique_ptr<Collective>> instances;
    std::vector<std::vector<float>> gradients;
    for (int r = 0; r < world; ++r) {
      instances.push_back(*CreateCollective(
          {.algorithm = "topkdsa",
           .density = static_cast<double>(k) / static_cast<double>(n)},
          world, r, n));
      std::vector<float> g(n, 0.0f);
      for (int q = 0; q < world; ++q) {
        for (uint64_t j = 0; j < k / world; ++j) {
          g[q * 40 + j * world + r] = 1.0f + j;
        }
      }
      gradients.push_back(std::move(g));
    }
    std::vector<std::vector<float>> residuals(world,
                                              std::vector<float>(n, 0.0f));
    const auto runs = RunIteration(network, instances, gradients, residuals, 0);
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(runs[r].status.ok());
      EXPECT_EQ(runs[r].stats.figures.dense_partitions.value_or(-1),
                dense ? world : 0)
          << "P=" << world << " k=" << k;
      EXPECT_EQ(runs[r].result.size(), k * world);
    }
  }
}

// Ok-Topk re-balances before its allgatherv when one region holds more than
// 4x the mean of the global values, and the result does not change.
TEST(OkTopkTest, BalancesSkewedRegions) {
  constexpr int kWorld = 8;
  constexpr uint64_t kN = 8000;
  transport::LoopbackNetwork network(kWorld);
  std::vector<std::unique_ptr<Collective>> instances;
  std::vector<std::vector<float>> gradients;
  for (int r = 0; r < kWorld; ++r) {
    instances.push_back(*CreateCollective({.algorithm = "oktopk",
                                           .density = 0.01,
                                           .oktopk_tau = 1000,
                                           .oktopk_tau_prime = 1000},
                                          kWorld, r, kN));
    gradients.push_back(RandomVector(kN, r));
  }
  // Iteration 1 balances the regions on uniform data; iteration 2 puts every
  // large value into region 0 while the boundaries stay.
  std::vector<std::vector<float>> residuals(kWorld,
                                            std::vector<float>(kN, 0.0f));
  auto runs = RunIteration(network, instances, gradients, residuals, 0);
  for (const RankRun& run : runs) {
    ASSERT_TRUE(run.status.ok());
    EXPECT_EQ(run.stats.figures.balanced.value_or(-1), 0);
  }
  // Then into region 0, then into the last region (where most workers hold
  // nothing to re-balance).
  for (const bool at_start : {true, false}) {
    std::vector<std::vector<float>> skewed = gradients;
    for (int r = 0; r < kWorld; ++r) {
      for (uint64_t i = 0; i < kN; ++i) {
        const bool inside = at_start ? i < 400 : i >= kN - 400;
        skewed[r][i] *= inside ? 100.0f : 0.0f;
      }
    }
    runs =
        RunIteration(network, instances, skewed, residuals, at_start ? 1 : 2);
    for (const RankRun& run : runs) {
      ASSERT_TRUE(run.status.ok()) << run.status;
      EXPECT_EQ(run.stats.figures.balanced.value_or(-1), 1);
      EXPECT_EQ(run.result, runs[0].result);
      EXPECT_GT(run.result.size(), 0u);
    }
  }
}

// ---------------------------------------------------------------------------
// Gaussiank's threshold and the registry.
// ---------------------------------------------------------------------------

TEST(GaussianTest, PercentPointFunctionMatchesKnownQuantiles) {
  EXPECT_NEAR(NormalPpf(0.5), 0.0, 1e-12);
  EXPECT_NEAR(NormalPpf(0.975), 1.959963984540054, 1e-9);
  EXPECT_NEAR(NormalPpf(0.995), 2.575829303548901, 1e-9);
  EXPECT_NEAR(NormalPpf(1e-6), -4.753424308822899, 1e-8);
  EXPECT_NEAR(NormalPpf(0.01), -2.326347874040841, 1e-9);
}

TEST(GaussianTest, SelectsAThresholdSetOfAtLeastThreeQuartersOfK) {
  std::vector<float> x = RandomVector(100000, 5);
  for (uint64_t k : {10u, 1000u, 20000u}) {
    const sparse::SparseBlock s = GaussianSelect(x, k);
    EXPECT_GE(s.size(), (3 * k + 3) / 4) << k;
    // A threshold set: nothing unselected is larger than anything selected.
    float smallest = INFINITY;
    for (float v : s.values) smallest = std::min(smallest, std::fabs(v));
    const Sparse chosen = ToSparse(s);
    for (uint32_t i = 0; i < x.size(); ++i) {
      if (!chosen.count(i)) {
        ASSERT_LT(std::fabs(x[i]), smallest);
      }
    }
  }
  // Heavy-tailed data: the Gaussian guess is too high and gets scaled down.
  for (float& v : x) v = v * v * v;
  EXPECT_GE(GaussianSelect(x, 1000).size(), 750u);
}

// No algorithm changes the residual before its proposal is applied: dropped
// (the members refused the step), the accumulator (old residual + gradient)
// stays, bit for bit; applied, it becomes the new residual.
TEST(CommitTest, EveryAlgorithmKeepsTheAccumulatorUntilItsProposalIsApplied) {
  constexpr int kP = 4;
  constexpr uint64_t kN = 400;
  for (const std::string& name : AlgorithmNames()) {
    SCOPED_TRACE(name);
    for (bool refuse : {true, false}) {
      transport::LoopbackNetwork network(kP);
      std::vector<std::vector<float>> gradients, residuals, accumulators;
      std::vector<std::unique_ptr<Collective>> instances;
      for (int r = 0; r < kP; ++r) {
        gradients.push_back(RandomVector(kN, 10 + r));
        residuals.push_back(RandomVector(kN, 20 + r));
        accumulators.push_back(residuals[r]);
        for (uint64_t i = 0; i < kN; ++i) {
          accumulators[r][i] += gradients[r][i];
        }
        instances.push_back(
            *CreateCollective({.algorithm = name, .density = 0.05}, kP, r, kN));
      }
      std::vector<absl::Status> statuses(kP);
      testing::RunRanks(network, [&](int r, transport::Transport* t) {
        const OpContext context{.transport = t,
                                .deadline = absl::Now() + absl::Seconds(20)};
        OpStats stats;
        auto residual = absl::MakeSpan(residuals[r]);
        statuses[r] =
            instances[r]->Accumulate(gradients[r], residual, &stats).status();
        if (!statuses[r].ok()) return;
        auto proposal = instances[r]->Reduce(residual, context, &stats);
        statuses[r] = proposal.status();
        if (proposal.ok() && !refuse) {
          std::move(proposal->apply)(proposal->result, residual);
        }
      });
      for (int r = 0; r < kP; ++r) {
        EXPECT_TRUE(statuses[r].ok()) << statuses[r];
        EXPECT_EQ(residuals[r] == accumulators[r], refuse) << "rank " << r;
      }
    }
  }
}

TEST(RegistryTest, KnowsEveryAlgorithmAndRejectsTheRest) {
  for (const std::string& name : AlgorithmNames()) {
    EXPECT_TRUE(CreateCollective({.algorithm = name}, 4, 1, 100).ok()) << name;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(
      CreateCollective({.algorithm = "allreduce"}, 4, 1, 100).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      CreateCollective({.algorithm = "topka", .teams = 2}, 4, 1, 100)
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      CreateCollective({.algorithm = "gtopk", .density = 0}, 4, 1, 100)
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      CreateCollective({.algorithm = "oktopk", .oktopk_tau = 0}, 4, 1, 100)
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      CreateCollective({.algorithm = "topkdsa", .quantize_bits = 3}, 4, 1, 100)
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      CreateCollective({.algorithm = "topka", .quantize_bits = 4}, 4, 1, 100)
          .status()));
  EXPECT_TRUE(
      CreateCollective({.algorithm = "topkdsa", .quantize_bits = 4}, 4, 1, 100)
          .ok());
}

}  // namespace
}  // namespace gradmesh::collectives

namespace gradmesh::collectives {
namespace {

// TopkDSA's quantized dense phase: identical results on every rank, the
// conservation identity (the owner keeps the rounding error), every value
// within one quantization level of the exact sum, and seeded repeatability.
TEST(TopkDsaTest, QuantizedDensePhaseConservesMassWithinOneLevel) {
  constexpr int kWorld = 8;
  constexpr uint64_t kN = 4096;
  for (int bits : {2, 4, 8}) {
    SCOPED_TRACE(absl::StrCat(bits, " bits"));
    std::vector<std::vector<Sparse>> results(2);
    for (int repeat = 0; repeat < 2; ++repeat) {
      transport::LoopbackNetwork network(kWorld);
      std::vector<std::unique_ptr<Collective>> instances;
      for (int r = 0; r < kWorld; ++r) {
        instances.push_back(*CreateCollective({.algorithm = "topkdsa",
                                               .density = 0.3,
                                               .quantize_bits = bits,
                                               .seed = 9},
                                              kWorld, r, kN));
      }
      std::vector<std::vector<float>> residuals(kWorld,
                                                std::vector<float>(kN, 0.0f));
      for (int it = 0; it < 2; ++it) {
        std::vector<std::vector<float>> gradients;
        for (int r = 0; r < kWorld; ++r) {
          gradients.push_back(RandomVector(kN, 50 * it + r));
        }
        std::vector<std::vector<float>> exact_residuals = residuals;
        const Expected exact =
            DsaReference(gradients, exact_residuals, SelectionSize(kN, 0.3));
        const MassBalance balance(gradients, residuals);
        const auto runs =
            RunIteration(network, instances, gradients, residuals, it);
        ASSERT_TRUE(runs[0].status.ok()) << runs[0].status;
        EXPECT_EQ(runs[0].stats.figures.dense_partitions.value_or(-1), kWorld);
        for (const RankRun& run : runs) EXPECT_EQ(run.result, runs[0].result);
        const Sparse got = ToSparse(runs[0].result);
        results[repeat].push_back(got);
        // Within one level of the exact sum; bucket scales are at most the
        // largest |exact sum| of the partition.
        float largest = 0;
        for (const auto& [i, x] : exact.result)
          largest = std::max(largest, std::fabs(x));
        const float level = largest / ((1 << (bits - 1)) - 1);
        for (const auto& [i, x] : exact.result) {
          const auto it2 = got.find(i);
          const float q = it2 == got.end() ? 0.0f : it2->second;
          ASSERT_LE(std::fabs(q - x), level * 1.0001f) << "index " << i;
        }
        ASSERT_TRUE(balance.Holds(runs[0].result, residuals));
      }
    }
    EXPECT_EQ(results[0], results[1]);  // seeded: the same twice
  }
}

}  // namespace
}  // namespace gradmesh::collectives
