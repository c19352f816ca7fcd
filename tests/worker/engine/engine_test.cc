#include "worker/engine/engine.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/grpc_network.h"
#include "tests/support/multi_rank.h"
#include "worker/transport/loopback.h"

namespace gradmesh::engine {
namespace {

using ::gradmesh::testing::RandomVector;
using ::gradmesh::testing::RunRanks;

TEST(EngineTest, RejectsBadOptionsUpFront) {
  transport::LoopbackNetwork net(6);
  EXPECT_TRUE(absl::IsInvalidArgument(
      Engine::Create(net.endpoint(0), {.algorithm = {.teams = 4}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      Engine::Create(net.endpoint(0), {.algorithm = {.algorithm = "nope"}})
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      Engine::Create(net.endpoint(0), {.algorithm = {.density = 2.0}})
          .status()));
}

// Residuals persist per buffer across iterations (error feedback): with
// density 1 nothing is left behind, with a low density the residual carries
// the rest into the next call, and two buffers do not mix.
TEST(EngineTest, KeepsResidualsPerBufferAcrossIterations) {
  constexpr int kWorld = 4;
  constexpr uint64_t kN = 1000;
  transport::LoopbackNetwork net(kWorld);
  RunRanks(net, [&](int r, transport::Transport* t) {
    auto engine =
        *Engine::Create(t, {.algorithm = {.density = 0.05, .teams = 2},
                            .timeout = absl::Seconds(30)});
    for (int it = 0; it < 4; ++it) {
      for (const char* name : {"a", "b"}) {
        const std::vector<float> g =
            RandomVector(kN, 7 * it + r + (name[0] == 'b' ? 1000 : 0));
        collectives::OpStats stats;
        auto result = engine->AllReduce(name, g, &stats);
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_LE(result->size(), 50u);
        EXPECT_EQ(engine->residual(name).size(), kN);
      }
    }
    EXPECT_TRUE(engine->residual("c").empty());
    // A size change is refused and leaves the residual alone.
    const std::vector<float> before(engine->residual("a").begin(),
                                    engine->residual("a").end());
    collectives::OpStats stats;
    EXPECT_TRUE(absl::IsInvalidArgument(
        engine->AllReduce("a", std::vector<float>(kN + 1), &stats).status()));
    EXPECT_THAT(std::vector<float>(engine->residual("a").begin(),
                                   engine->residual("a").end()),
                ::testing::ElementsAreArray(before));
  });
}

// The engine over each algorithm, run over the loopback transport and over
// the gRPC transport on in-process channels (small chunks, so messages cross
// chunk boundaries): every rank gets the same result, mass is conserved, and
// both transports give bitwise the same results, residuals and byte counts.
struct Outcome {
  std::vector<sparse::SparseBlock> results;  // [iteration * P + rank]
  std::vector<std::vector<float>> residuals;
  std::vector<transport::Counters> counters;
};

template <typename Network>
Outcome RunEngines(Network& net, const std::string& algorithm, int world) {
  constexpr uint64_t kN = 3001;
  constexpr int kIterations = 3;
  Outcome out;
  out.results.resize(kIterations * world);
  out.residuals.resize(world);
  std::vector<std::unique_ptr<Engine>> engines(world);
  for (int r = 0; r < world; ++r) {
    auto created = Engine::Create(
        net.endpoint(r),
        {.algorithm = {.algorithm = algorithm,
                       .density = 0.02,
                       .teams =
                           algorithm == "spardl" && world % 2 == 0 ? 2 : 1},
         .timeout = absl::Seconds(30)});
    EXPECT_TRUE(created.ok()) << created.status();
    if (!created.ok()) return out;
    engines[r] = *std::move(created);
  }
  for (int it = 0; it < kIterations; ++it) {
    std::vector<std::vector<float>> gradients(world), before(world);
    for (int r = 0; r < world; ++r) {
      gradients[r] = RandomVector(kN, 100 * it + r);
      const auto residual = engines[r]->residual("g");
      before[r] = residual.empty()
                      ? std::vector<float>(kN, 0.0f)
                      : std::vector<float>(residual.begin(), residual.end());
    }
    const testing::MassBalance balance(gradients, before);
    RunRanks(net, [&](int r, transport::Transport*) {
      collectives::OpStats stats;
      auto result = engines[r]->AllReduce("g", gradients[r], &stats);
      ASSERT_TRUE(result.ok()) << result.status();
      out.results[it * world + r] = *std::move(result);
    });
    for (int r = 0; r < world; ++r) {
      const auto residual = engines[r]->residual("g");
      out.residuals[r].assign(residual.begin(), residual.end());
      EXPECT_EQ(out.results[it * world + r].indices,
                out.results[it * world].indices);
      EXPECT_EQ(out.results[it * world + r].values,
                out.results[it * world].values);
    }
    EXPECT_TRUE(balance.Holds(out.results[it * world], out.residuals));
  }
  for (int r = 0; r < world; ++r) {
    out.counters.push_back(net.endpoint(r)->counters());
  }
  return out;
}

class EngineOverTransportsTest
    : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(EngineOverTransportsTest, GrpcMatchesLoopbackBitwise) {
  const auto& [algorithm, world] = GetParam();
  transport::LoopbackNetwork loopback(world);
  testing::GrpcNetwork grpc(world, /*chunk_bytes=*/256);
  const Outcome expected = RunEngines(loopback, algorithm, world);
  const Outcome actual = RunEngines(grpc, algorithm, world);
  ASSERT_EQ(actual.results.size(), expected.results.size());
  for (size_t i = 0; i < expected.results.size(); ++i) {
    EXPECT_EQ(actual.results[i].indices, expected.results[i].indices);
    EXPECT_EQ(actual.results[i].values, expected.results[i].values);
  }
  EXPECT_EQ(actual.residuals, expected.residuals);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(actual.counters[r].bytes_sent_to,
              expected.counters[r].bytes_sent_to);
    EXPECT_EQ(actual.counters[r].bytes_received_from,
              expected.counters[r].bytes_received_from);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllAlgorithms, EngineOverTransportsTest,
    ::testing::Combine(::testing::ValuesIn(collectives::AlgorithmNames()),
                       ::testing::Values(1, 2, 3, 4, 6)),
    [](const auto& param_info) {
      return std::get<0>(param_info.param) + "_P" +
             std::to_string(std::get<1>(param_info.param));
    });

}  // namespace
}  // namespace gradmesh::engine
