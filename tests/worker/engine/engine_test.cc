#include "worker/engine/engine.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace gradmesh::engine
