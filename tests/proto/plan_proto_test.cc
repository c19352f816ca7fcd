// The plan's one proto adapter: every field survives the round trip, and a
// message from an older coordinator (new fields unset) reads as the
// defaults.
#include "proto/plan_proto.h"

#include <vector>

#include "gtest/gtest.h"

namespace gradmesh {
namespace {

TEST(PlanProtoTest, EveryFieldSurvivesTheRoundTrip) {
  const collectives::Plan plan{.algorithm = "oktopk",
                               .density = 0.05,
                               .teams = 3,
                               .encoding = "runs",
                               .values = "fp16",
                               .quantize_bits = 2,
                               .oktopk_tau = 9,
                               .oktopk_tau_prime = 4,
                               .seed = 1234,
                               .exact_below = 99,
                               .dense_sizes = {20000, 70000},
                               .warmup_steps = 50,
                               .fusion = "after_fusion",
                               .chunk_bytes = 65536,
                               .autotuning = true,
                               .note = "autotune trial of d=3"};
  v1::Plan proto;
  PlanToProto(plan, &proto);
  const collectives::Plan back = PlanFromProto(proto);
  EXPECT_EQ(back.algorithm, plan.algorithm);
  EXPECT_EQ(back.density, plan.density);
  EXPECT_EQ(back.teams, plan.teams);
  EXPECT_EQ(back.encoding, plan.encoding);
  EXPECT_EQ(back.values, plan.values);
  EXPECT_EQ(back.quantize_bits, plan.quantize_bits);
  EXPECT_EQ(back.oktopk_tau, plan.oktopk_tau);
  EXPECT_EQ(back.oktopk_tau_prime, plan.oktopk_tau_prime);
  EXPECT_EQ(back.seed, plan.seed);
  EXPECT_EQ(back.exact_below, plan.exact_below);
  EXPECT_EQ(back.dense_sizes, plan.dense_sizes);
  EXPECT_EQ(back.warmup_steps, plan.warmup_steps);
  EXPECT_EQ(back.fusion, plan.fusion);
  EXPECT_EQ(back.chunk_bytes, plan.chunk_bytes);
  EXPECT_EQ(back.autotuning, plan.autotuning);
  EXPECT_EQ(back.note, plan.note);
}

TEST(PlanProtoTest, FieldsAnOlderCoordinatorLeavesUnsetAreTheDefaults) {
  v1::Plan proto;
  proto.set_algorithm("oktopk");
  const collectives::Plan back = PlanFromProto(proto);
  const collectives::Plan defaults;
  EXPECT_EQ(back.quantize_bits, 0);
  EXPECT_EQ(back.oktopk_tau, defaults.oktopk_tau);
  EXPECT_EQ(back.oktopk_tau_prime, defaults.oktopk_tau_prime);
  EXPECT_EQ(back.seed, defaults.seed);
  // An older coordinator's workers summed every bucket with its algorithm.
  EXPECT_EQ(back.exact_below, 0u);
  EXPECT_EQ(back.fusion, "per_tensor");
  EXPECT_TRUE(back.dense_sizes.empty());
  EXPECT_EQ(back.warmup_steps, 0u);
}

TEST(PlanProtoTest, DenseSizesArriveAscending) {
  v1::Plan proto;
  for (uint64_t n : {70000, 20000, 50000}) proto.add_dense_sizes(n);
  EXPECT_EQ(PlanFromProto(proto).dense_sizes,
            (std::vector<uint64_t>{20000, 50000, 70000}));
}

}  // namespace
}  // namespace gradmesh
