#include "worker/collectives/exact_tail.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/multi_rank.h"
#include "worker/collectives/registry.h"
#include "worker/transport/loopback.h"

namespace gradmesh::collectives {
namespace {

using ::gradmesh::testing::MassBalance;
using ::gradmesh::testing::RandomVector;
using ::gradmesh::testing::RunIteration;

constexpr int kP = 4;
constexpr uint64_t kN = 2003;
constexpr uint64_t kTail = 301;  // the last two tensors
const std::vector<uint64_t> kStarts = {0, 900, 1702, 1900};

std::vector<std::unique_ptr<Collective>> Make(AlgorithmOptions options,
                                              uint64_t n) {
  std::vector<std::unique_ptr<Collective>> out;
  for (int r = 0; r < kP; ++r) {
    auto c = CreateCollective(options, kP, r, n);
    EXPECT_TRUE(c.ok()) << c.status();
    out.push_back(*std::move(c));
  }
  return out;
}

std::vector<std::vector<float>> Part(const std::vector<std::vector<float>>& v,
                                     uint64_t begin, uint64_t end) {
  std::vector<std::vector<float>> out;
  for (const auto& x : v) out.emplace_back(x.begin() + begin, x.begin() + end);
  return out;
}

class ExactTailTest : public ::testing::TestWithParam<std::string> {
 protected:
  AlgorithmOptions Options() const {
    return {.algorithm = GetParam(),
            .density = 0.02,
            .teams = GetParam() == "spardl" ? 2 : 1,
            .tensor_starts = kStarts};
  }
};

// Over three iterations (error feedback carried): the same result on every
// rank; mass conserved; the tail's entries the exact sum with no residual;
// and bitwise what the algorithm over the head and the dense ring over the
// tail give as two buffers of their own, residuals included.
TEST_P(ExactTailTest, SumsTheTailExactlyAndTheHeadAsTheAlgorithmAlone) {
  AlgorithmOptions options = Options();
  options.exact_tail = kTail;
  auto whole = Make(options, kN);
  AlgorithmOptions head_options = Options();
  head_options.tensor_starts = {0, 900};
  auto head = Make(head_options, kN - kTail);
  auto tail = Make({.algorithm = "dense"}, kTail);
  transport::LoopbackNetwork net(kP), head_net(kP), tail_net(kP);
  std::vector<std::vector<float>> residuals(kP, std::vector<float>(kN));
  std::vector<std::vector<float>> head_residuals(
      kP, std::vector<float>(kN - kTail));
  std::vector<std::vector<float>> tail_residuals(kP, std::vector<float>(kTail));
  for (uint64_t it = 0; it < 3; ++it) {
    SCOPED_TRACE(absl::StrCat("iteration ", it));
    std::vector<std::vector<float>> gradients;
    for (int r = 0; r < kP; ++r)
      gradients.push_back(RandomVector(kN, 31 * it + r));
    const MassBalance balance(gradients, residuals);
    const auto runs = RunIteration(net, whole, gradients, residuals, it);
    const auto head_runs = RunIteration(
        head_net, head, Part(gradients, 0, kN - kTail), head_residuals, it);
    const auto tail_runs = RunIteration(
        tail_net, tail, Part(gradients, kN - kTail, kN), tail_residuals, it);
    for (int r = 0; r < kP; ++r) {
      ASSERT_TRUE(runs[r].status.ok()) << runs[r].status;
      EXPECT_EQ(runs[r].result.indices, runs[0].result.indices);
      EXPECT_EQ(runs[r].result.values, runs[0].result.values);
      // The parts' counts added up.
      EXPECT_EQ(runs[r].stats.bytes_received,
                head_runs[r].stats.bytes_received +
                    tail_runs[r].stats.bytes_received);
      EXPECT_EQ(runs[r].stats.rounds,
                head_runs[r].stats.rounds + tail_runs[r].stats.rounds);
      EXPECT_EQ(runs[r].stats.result_nonzeros, runs[r].result.size());
      EXPECT_EQ(Part(residuals, 0, kN - kTail)[r], head_residuals[r]);
      EXPECT_THAT(Part(residuals, kN - kTail, kN)[r], ::testing::Each(0.0f));
    }
    EXPECT_TRUE(balance.Holds(runs[0].result, residuals));
    sparse::SparseBlock expected = head_runs[0].result;
    for (size_t e = 0; e < tail_runs[0].result.size(); ++e) {
      expected.indices.push_back(
          static_cast<uint32_t>(kN - kTail + tail_runs[0].result.indices[e]));
      expected.values.push_back(tail_runs[0].result.values[e]);
    }
    EXPECT_EQ(runs[0].result.indices, expected.indices);
    EXPECT_EQ(runs[0].result.values, expected.values);
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ExactTailTest,
                         ::testing::Values("spardl", "topka", "gtopk",
                                           "topkdsa", "oktopk"));

TEST(ExactTailOptionsTest, RejectsATailLongerThanTheBuffer) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      CreateCollective({.exact_tail = 11}, kP, 0, 10).status()));
  // The whole buffer: the dense ring alone; a tail on the dense ring: the
  // same ring.
  EXPECT_TRUE(CreateCollective({.exact_tail = 10}, kP, 0, 10).ok());
  EXPECT_TRUE(
      CreateCollective({.algorithm = "dense", .exact_tail = 11}, kP, 0, 10)
          .ok());
}

// A bad size is refused before either part changes.
TEST(ExactTailOptionsTest, ABadSizeChangesNothing) {
  auto c = CreateCollective({.exact_tail = 4}, 1, 0, 10);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> residual(10, 1.0f);
  OpStats stats;
  const std::vector<float> gradient(9, 1.0f);
  EXPECT_TRUE(absl::IsInvalidArgument(
      (*c)->Accumulate(gradient, absl::MakeSpan(residual), &stats).status()));
  EXPECT_THAT(residual, ::testing::Each(1.0f));
}

TEST(ExactTailOptionsTest, KeepsTheTensorStartsBelowTheHead) {
  EXPECT_THAT(StartsBelow(kStarts, kN - kTail), ::testing::ElementsAre(0, 900));
  EXPECT_TRUE(StartsBelow({}, 5).empty());
}

}  // namespace
}  // namespace gradmesh::collectives
