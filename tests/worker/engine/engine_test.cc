#include "worker/engine/engine.h"

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/grpc_network.h"
#include "tests/support/multi_rank.h"
#include "worker/transport/loopback.h"

namespace gradmesh::engine {
namespace {

using ::gradmesh::testing::RandomVector;
using ::gradmesh::testing::RunRanks;

std::vector<float> Residual(const Engine& engine, absl::string_view name) {
  std::vector<float> out;
  engine.ReadResidual(
      name, [&](absl::Span<const float> r) { out.assign(r.begin(), r.end()); });
  return out;
}

TEST(EngineTest, RejectsBadOptions) {
  transport::LoopbackNetwork net(6);
  auto check = [&](collectives::AlgorithmOptions algorithm) {
    return CheckOptions(
        {.transport = net.endpoint(0), .options = {.algorithm = algorithm}});
  };
  EXPECT_TRUE(absl::IsInvalidArgument(check({.teams = 4})));
  EXPECT_TRUE(absl::IsInvalidArgument(check({.algorithm = "nope"})));
  EXPECT_TRUE(absl::IsInvalidArgument(check({.density = 2.0})));
  EXPECT_TRUE(check({.teams = 3}).ok());
}

// Residuals persist per buffer across iterations (error feedback): with
// a low density the residual carries the rest into the next call, and two
// buffers do not mix.
TEST(EngineTest, KeepsResidualsPerBufferAcrossIterations) {
  constexpr int kWorld = 4;
  constexpr uint64_t kN = 1000;
  transport::LoopbackNetwork net(kWorld);
  RunRanks(net, [&](int r, transport::Transport* t) {
    Engine engine;
    const GroupConfig group{
        .transport = t,
        .options = {.algorithm = {.density = 0.05, .teams = 2},
                    .timeout = absl::Seconds(30)}};
    uint64_t op = 0;
    for (int it = 0; it < 4; ++it) {
      for (const char* name : {"a", "b"}) {
        const std::vector<float> g =
            RandomVector(kN, 7 * it + r + (name[0] == 'b' ? 1000 : 0));
        collectives::OpStats stats;
        auto result = engine.AllReduce(
            group, {.buffer = name, .gradient = g, .operation = op++}, &stats);
        ASSERT_TRUE(result.ok()) << result.status();
        EXPECT_LE(result->size(), 50u);
        EXPECT_EQ(Residual(engine, name).size(), kN);
      }
    }
    EXPECT_TRUE(Residual(engine, "c").empty());
    // A size change is refused and leaves the residual alone.
    const std::vector<float> before = Residual(engine, "a");
    collectives::OpStats stats;
    const std::vector<float> wrong(kN + 1);
    EXPECT_TRUE(absl::IsInvalidArgument(
        engine.AllReduce(group, {.buffer = "a", .gradient = wrong}, &stats)
            .status()));
    EXPECT_THAT(Residual(engine, "a"), ::testing::ElementsAreArray(before));
  });
}

// One pass: the finite values go into the residual, the others are counted
// and left out; a refusal from `agree` keeps the finite gradient there.
TEST(EngineTest, LeavesNonFiniteValuesOutAndKeepsTheRestOnRefusal) {
  transport::LoopbackNetwork net(1);
  Engine engine;
  const GroupConfig group{.transport = net.endpoint(0)};
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> g = {1.0f, std::nanf(""), -2.0f, inf};
  uint64_t seen = 99;
  std::vector<float> residual_seen;
  collectives::OpStats stats;
  auto result =
      engine.AllReduce(group,
                       {.buffer = "x",
                        .gradient = g,
                        .agree =
                            [&](uint64_t nonfinite) {
                              seen = nonfinite;
                              return absl::InvalidArgumentError("refused");
                            },
                        .residual_out =
                            [&](absl::Span<const float> r) {
                              residual_seen.assign(r.begin(), r.end());
                            }},
                       &stats);
  EXPECT_TRUE(absl::IsInvalidArgument(result.status()));
  EXPECT_EQ(seen, 2u);
  EXPECT_THAT(residual_seen, ::testing::ElementsAre(1.0f, 0.0f, -2.0f, 0.0f));
  EXPECT_THAT(Residual(engine, "x"),
              ::testing::ElementsAre(1.0f, 0.0f, -2.0f, 0.0f));
  // Keep adds the same way; Drop forgets the buffer.
  ASSERT_TRUE(engine.Keep("x", g).ok());
  EXPECT_THAT(Residual(engine, "x"),
              ::testing::ElementsAre(2.0f, 0.0f, -4.0f, 0.0f));
  engine.Drop("x");
  EXPECT_TRUE(Residual(engine, "x").empty());
}

// Distinct buffers run concurrently over one transport, each under its own
// operation id, started in opposite orders on the two ranks.
TEST(EngineTest, RunsBuffersConcurrentlyInAnyOrder) {
  constexpr uint64_t kN = 2000;
  transport::LoopbackNetwork net(2);
  Engine engines[2];
  std::vector<sparse::SparseBlock> results(4);
  RunRanks(net, [&](int r, transport::Transport* t) {
    const GroupConfig group{.transport = t,
                            .options = {.algorithm = {.density = 0.1}}};
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      const int b = r == 0 ? i : 1 - i;
      threads.emplace_back([&, b] {
        const std::vector<float> g = RandomVector(kN, 10 * b + r);
        collectives::OpStats stats;
        auto result =
            engines[r].AllReduce(group,
                                 {.buffer = b == 0 ? "p" : "q",
                                  .gradient = g,
                                  .operation = static_cast<uint64_t>(100 + b)},
                                 &stats);
        ASSERT_TRUE(result.ok()) << result.status();
        results[2 * b + r] = *std::move(result);
      });
      if (r == 1) absl::SleepFor(absl::Milliseconds(20));
    }
    for (std::thread& thread : threads) thread.join();
  });
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(results[2 * b].indices, results[2 * b + 1].indices);
    EXPECT_EQ(results[2 * b].values, results[2 * b + 1].values);
  }
}

// The engine applies an algorithm's proposal only after the commit said
// yes: refused, every rank's residual is old residual + gradient, bit for
// bit; allowed, it is what the algorithm's own AllReduce leaves.
TEST(EngineTest, AppliesTheProposalOnlyAfterTheCommit) {
  constexpr int kP = 4;
  constexpr uint64_t kN = 997;
  for (const std::string& name : collectives::AlgorithmNames()) {
    for (bool refuse : {true, false}) {
      SCOPED_TRACE(absl::StrCat(name, refuse ? " refused" : " allowed"));
      transport::LoopbackNetwork net(kP);
      std::vector<Engine> engines(kP);
      std::vector<std::vector<float>> gradients, expected(kP);
      for (int r = 0; r < kP; ++r) gradients.push_back(RandomVector(kN, 7 + r));
      const collectives::AlgorithmOptions options{.algorithm = name,
                                                  .density = 0.05};
      if (refuse) {
        expected = gradients;  // the residual was zero
      } else {
        // What the algorithm alone leaves, on twins of the same instances.
        transport::LoopbackNetwork twin_net(kP);
        std::vector<std::unique_ptr<collectives::Collective>> twins;
        for (int r = 0; r < kP; ++r) {
          twins.push_back(*collectives::CreateCollective(options, kP, r, kN));
          expected[r].assign(kN, 0.0f);
        }
        testing::RunIteration(twin_net, twins, gradients, expected, 1);
      }
      RunRanks(net, [&](int r, transport::Transport* t) {
        collectives::OpStats stats;
        auto result = engines[r].AllReduce(
            {.transport = t, .options = {.algorithm = options}},
            {.buffer = "g",
             .gradient = gradients[r],
             .operation = 1,
             .commit =
                 [&](const sparse::SparseBlock&) {
                   return refuse ? absl::AbortedError("refused")
                                 : absl::OkStatus();
                 }},
            &stats);
        EXPECT_EQ(absl::IsAborted(result.status()), refuse) << result.status();
      });
      for (int r = 0; r < kP; ++r) {
        EXPECT_EQ(Residual(engines[r], "g"), expected[r]) << "rank " << r;
      }
    }
  }
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
  std::vector<Engine> engines(world);
  std::vector<GroupConfig> groups;
  for (int r = 0; r < world; ++r) {
    groups.push_back(
        {.transport = net.endpoint(r),
         .options = {
             .algorithm = {.algorithm = algorithm,
                           .density = 0.02,
                           .teams =
                               algorithm == "spardl" && world % 2 == 0 ? 2 : 1},
             .timeout = absl::Seconds(30)}});
  }
  for (int it = 0; it < kIterations; ++it) {
    std::vector<std::vector<float>> gradients(world), before(world);
    for (int r = 0; r < world; ++r) {
      gradients[r] = RandomVector(kN, 100 * it + r);
      before[r] = Residual(engines[r], "g");
      if (before[r].empty()) before[r].assign(kN, 0.0f);
    }
    const testing::MassBalance balance(gradients, before);
    RunRanks(net, [&](int r, transport::Transport*) {
      collectives::OpStats stats;
      auto result =
          engines[r].AllReduce(groups[r],
                               {.buffer = "g",
                                .gradient = gradients[r],
                                .operation = static_cast<uint64_t>(it)},
                               &stats);
      ASSERT_TRUE(result.ok()) << result.status();
      out.results[it * world + r] = *std::move(result);
    });
    for (int r = 0; r < world; ++r) {
      out.residuals[r] = Residual(engines[r], "g");
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
