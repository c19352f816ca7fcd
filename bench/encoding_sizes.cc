// Encoded size of sparse blocks relative to COO, per encoding and for `auto`
// (the smallest, chosen per block), on uniformly random and on clustered
// indices:
//
//   build/bench/encoding_sizes
//
// Blocks cover 1,000,000 indices; values are N(0, 1) float32. Clustered
// indices: runs whose lengths are geometric with mean 8 start at uniformly
// random positions until the density is reached (DenseStream's observation
// that top-k indices of real gradients cluster). Seeded, so the table is
// reproducible.
#include <cstdio>
#include <random>
#include <set>

#include "worker/sparse/codec.h"

namespace {

using gradmesh::sparse::Encoding;
using gradmesh::sparse::IndexRange;
using gradmesh::sparse::SparseBlock;
using gradmesh::sparse::ValueType;

constexpr uint64_t kN = 1'000'000;

SparseBlock Make(double density, bool clustered, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::geometric_distribution<int> run_length(1.0 / 8);
  const size_t k = static_cast<size_t>(density * kN);
  std::set<uint32_t> chosen;
  while (chosen.size() < k) {
    const uint32_t start = static_cast<uint32_t>(rng() % kN);
    const int length = clustered ? 1 + run_length(rng) : 1;
    for (int i = 0; i < length && chosen.size() < k; ++i) {
      chosen.insert(static_cast<uint32_t>((start + i) % kN));
    }
  }
  SparseBlock block;
  for (uint32_t i : chosen) block.push_back(i, normal(rng));
  return block;
}

}  // namespace

int main() {
  const IndexRange range{0, kN};
  const char* names[] = {"COO", "delta-varint", "runs", "bitmap", "dense"};
  for (ValueType type : {ValueType::kFloat32, ValueType::kFloat16}) {
    std::printf("\n%s values, size relative to float32 COO\n\n",
                type == ValueType::kFloat32 ? "float32" : "float16");
    std::printf(
        "| indices | density | COO | delta-varint | runs | bitmap |"
        " dense | auto (picks) |\n|---|---|---|---|---|---|---|---|\n");
    for (bool clustered : {false, true}) {
      for (double density : {0.001, 0.01, 0.05, 0.10}) {
        const SparseBlock block = Make(density, clustered, 7);
        const double coo = gradmesh::sparse::EncodedSize(
            block, range, Encoding::kCoo, ValueType::kFloat32);
        std::printf("| %s | %.1f%% |", clustered ? "clustered" : "uniform",
                    density * 100);
        for (int e = 0; e < gradmesh::sparse::kEncodingCount; ++e) {
          std::printf(" %.1f%% |",
                      100 *
                          gradmesh::sparse::EncodedSize(
                              block, range, static_cast<Encoding>(e), type) /
                          coo);
        }
        const Encoding best =
            gradmesh::sparse::SmallestEncoding(block, range, type);
        std::printf(
            " %.1f%% (%s) |\n",
            100 * gradmesh::sparse::EncodedSize(block, range, best, type) / coo,
            names[static_cast<int>(best)]);
      }
    }
  }
  return 0;
}
