// Bitwise stability of every algorithm: fixed inputs, several iterations with
// residuals carried, and the digests of what every rank ends with, against
// digests recorded from an earlier build. The inputs come from libstdc++'s
// normal distribution and the sums from this machine's float arithmetic: on
// another standard library or compiler the digests may differ with no change
// in the code; record them anew there. A change that moves code around
// must leave them all equal; a change that means to alter what an algorithm
// selects, sends or applies updates them, and says so in its commit.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fnv1a.h"
#include "gtest/gtest.h"
#include "tests/support/multi_rank.h"
#include "worker/collectives/registry.h"

namespace gradmesh::collectives {
namespace {

using ::gradmesh::testing::RandomVector;
using ::gradmesh::testing::RankRun;
using ::gradmesh::testing::RunIteration;

constexpr uint64_t kN = 10007;
constexpr int kIterations = 4;

struct GoldenCase {
  std::string name;
  int world_size;
  AlgorithmOptions options;
  uint64_t digest;  // recorded from RunCase
};

void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.name; }

uint64_t DigestFloats(const std::vector<float>& values, uint64_t hash) {
  return Fnv1a(absl::string_view(reinterpret_cast<const char*>(values.data()),
                                 values.size() * sizeof(float)),
               hash);
}

// The recorded digests hash results byte-wise with FNV-1a, whatever
// sparse::Digest uses.
uint64_t ResultDigest(const sparse::SparseBlock& block) {
  const uint64_t hash = Fnv1a(
      absl::string_view(reinterpret_cast<const char*>(block.indices.data()),
                        block.indices.size() * sizeof(uint32_t)));
  return DigestFloats(block.values, hash);
}

// One digest over every iteration's result (checked equal on every rank)
// and every rank's final residual.
uint64_t RunCase(const GoldenCase& c) {
  const int p = c.world_size;
  transport::LoopbackNetwork network(p);
  std::vector<std::unique_ptr<Collective>> instances;
  for (int r = 0; r < p; ++r) {
    auto created = CreateCollective(c.options, p, r, kN);
    EXPECT_TRUE(created.ok()) << created.status();
    if (!created.ok()) return 0;
    instances.push_back(*std::move(created));
  }
  std::vector<std::vector<float>> residuals(p, std::vector<float>(kN, 0.0f));
  uint64_t hash = kFnv1aBasis;
  for (int t = 0; t < kIterations; ++t) {
    std::vector<std::vector<float>> gradients;
    for (int r = 0; r < p; ++r)
      gradients.push_back(RandomVector(kN, 97 * t + r));
    std::vector<RankRun> runs =
        RunIteration(network, instances, gradients, residuals, t + 1);
    for (int r = 0; r < p; ++r) {
      EXPECT_TRUE(runs[r].status.ok()) << runs[r].status;
      EXPECT_EQ(sparse::Digest(runs[r].result), sparse::Digest(runs[0].result))
          << "rank " << r << " iteration " << t;
    }
    hash = Fnv1a(absl::StrCat(ResultDigest(runs[0].result)), hash);
  }
  for (const std::vector<float>& residual : residuals) {
    hash = DigestFloats(residual, hash);
  }
  return hash;
}

AlgorithmOptions Options(std::string algorithm, double density) {
  AlgorithmOptions options;
  options.algorithm = std::move(algorithm);
  options.density = density;
  return options;
}

std::vector<GoldenCase> Cases() {
  std::vector<GoldenCase> cases;
  const auto add = [&](std::string name, int p, AlgorithmOptions options,
                       uint64_t digest) {
    cases.push_back({std::move(name), p, std::move(options), digest});
  };
  // TopkDSA's sparse path sums the same selections as TopkA: same digest.
  const absl::flat_hash_map<std::string, uint64_t> plain = {
      {"spardl_p4", 0xeff17b99ecd3c6beu},
      {"dense_p4", 0x8b004d68e5b3932fu},
      {"topka_p4", 0x8e37687b4005d18bu},
      {"gaussiank_p4", 0xc635d3541b2d12feu},
      {"topkdsa_p4", 0x8e37687b4005d18bu},
      {"gtopk_p4", 0x2d58d78bd481fd7au},
      {"oktopk_p4", 0xcbb1c43b1680ecc4u},
      {"spardl_p6", 0x779775eabdbc9599u},
      {"dense_p6", 0x19c5354b19d3bc23u},
      {"topka_p6", 0x96385db2c05f4a32u},
      {"gaussiank_p6", 0x9ebd09383bc27c76u},
      {"topkdsa_p6", 0x96385db2c05f4a32u},
      {"gtopk_p6", 0x05b0f4504034a494u},
      {"oktopk_p6", 0x5228e29339348154u},
  };
  for (int p : {4, 6}) {
    for (const char* algorithm : {"spardl", "dense", "topka", "gaussiank",
                                  "topkdsa", "gtopk", "oktopk"}) {
      AlgorithmOptions options = Options(algorithm, 0.02);
      options.oktopk_tau = 3;
      options.oktopk_tau_prime = 2;
      const std::string name = absl::StrCat(algorithm, "_p", p);
      add(name, p, options, plain.at(name));
    }
  }
  AlgorithmOptions rsag = Options("spardl", 0.02);
  rsag.teams = 2;
  add("spardl_rsag_p4_d2", 4, rsag, 0x4fcfea424fd5684au);
  AlgorithmOptions bsag = Options("spardl", 0.02);
  bsag.teams = 3;
  add("spardl_bsag_p6_d3", 6, bsag, 0x33e48657e52d319fu);
  for (const char* algorithm : {"spardl", "topka"}) {
    AlgorithmOptions fused = Options(algorithm, 0.02);
    fused.tensor_starts = {0, 7, 3000, 3001, 9000};
    add(absl::StrCat(algorithm, "_tensors_p6"), 6, fused,
        algorithm == std::string("spardl") ? 0xd1a11743f1d0bcf8u
                                           : 0xea9c1a2fb65c7ae4u);
  }
  add("topkdsa_dense_p4", 4, Options("topkdsa", 0.3), 0x96f95c4f9ec73032u);
  AlgorithmOptions quantized = Options("topkdsa", 0.2);
  quantized.quantize_bits = 4;
  quantized.seed = 5;
  add("topkdsa_q4_p4", 4, quantized, 0x4985e03a9a4700f2u);
  AlgorithmOptions fp16 = Options("gtopk", 0.02);
  fp16.wire = *WireFormat::Parse("auto", "fp16");
  add("gtopk_auto_fp16_p6", 6, fp16, 0xaae432479b871d90u);
  AlgorithmOptions bf16 = Options("spardl", 0.02);
  bf16.wire = *WireFormat::Parse("delta", "bf16");
  add("spardl_delta_bf16_p4", 4, bf16, 0x75fb24c361369f43u);
  return cases;
}

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenTest, DigestsUnchanged) {
  const GoldenCase& c = GetParam();
  const uint64_t digest = RunCase(c);
  EXPECT_EQ(absl::StrFormat("%016x", digest),
            absl::StrFormat("%016x", c.digest))
      << c.name;
}

INSTANTIATE_TEST_SUITE_P(AllAlgorithms, GoldenTest,
                         ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<GoldenCase>& param) {
                           return param.param.name;
                         });

}  // namespace
}  // namespace gradmesh::collectives
