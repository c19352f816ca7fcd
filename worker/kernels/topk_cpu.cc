// Reference-quality CPU top-k: gather the nonzero positions, nth_element on
// (|x| desc, index asc), sort the winners by index. O(n) expected time and
// O(nonzeros) extra memory.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "worker/kernels/topk.h"

namespace gradmesh::kernels {
namespace {

// Returns the positions of the top-k nonzero entries of `values`, ascending.
std::vector<uint32_t> SelectPositions(absl::Span<const float> values,
                                      size_t k) {
  std::vector<uint32_t> positions;
  if (k == 0) return positions;
  positions.reserve(std::min(values.size(), 4 * k + 16));
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] != 0.0f) positions.push_back(static_cast<uint32_t>(i));
  }
  if (positions.size() > k) {
    auto before = [&values](uint32_t a, uint32_t b) {
      const float fa = std::fabs(values[a]);
      const float fb = std::fabs(values[b]);
      return fa > fb || (fa == fb && a < b);
    };
    std::nth_element(positions.begin(), positions.begin() + k - 1,
                     positions.end(), before);
    positions.resize(k);
    std::sort(positions.begin(), positions.end());
  }
  return positions;
}

}  // namespace

sparse::SparseBlock TopKAbs(absl::Span<const float> x, size_t k,
                            uint32_t base_index) {
  const std::vector<uint32_t> positions = SelectPositions(x, k);
  sparse::SparseBlock out;
  out.reserve(positions.size());
  for (uint32_t p : positions) out.push_back(base_index + p, x[p]);
  return out;
}

void SplitTopKAbs(const sparse::SparseBlock& block, size_t k,
                  sparse::SparseBlock* kept, sparse::SparseBlock* dropped) {
  const std::vector<uint32_t> positions = SelectPositions(block.values, k);
  kept->clear();
  dropped->clear();
  kept->reserve(positions.size());
  dropped->reserve(block.size() - positions.size());
  size_t next = 0;
  for (size_t i = 0; i < block.size(); ++i) {
    if (next < positions.size() && positions[next] == i) {
      kept->push_back(block.indices[i], block.values[i]);
      ++next;
    } else {
      dropped->push_back(block.indices[i], block.values[i]);
    }
  }
}

sparse::SparseBlock SelectAbsAtLeast(absl::Span<const float> x,
                                     float threshold, uint32_t base_index) {
  sparse::SparseBlock out;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] != 0.0f && std::fabs(x[i]) >= threshold) {
      out.push_back(base_index + static_cast<uint32_t>(i), x[i]);
    }
  }
  return out;
}

float KthLargestAbs(absl::Span<const float> x, size_t k) {
  float kth = std::numeric_limits<float>::infinity();
  for (uint32_t p : SelectPositions(x, k)) kth = std::min(kth, std::fabs(x[p]));
  return kth;
}

}  // namespace gradmesh::kernels
