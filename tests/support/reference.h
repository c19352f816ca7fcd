// Plain helpers for the tests' independent sequential references: ordered
// maps and full sorts, no engine code.
#ifndef GRADMESH_TESTS_SUPPORT_REFERENCE_H_
#define GRADMESH_TESTS_SUPPORT_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "worker/sparse/sparse_block.h"

namespace gradmesh::testing {

using Sparse = std::map<uint32_t, float>;

// Top q of the nonzero entries by (|x| desc, index asc), by a full sort.
inline Sparse SortTopK(const Sparse& entries, uint64_t q) {
  std::vector<std::pair<uint32_t, float>> v;
  for (const auto& [i, x] : entries) {
    if (x != 0.0f) v.emplace_back(i, x);
  }
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    const float fa = std::fabs(a.second);
    const float fb = std::fabs(b.second);
    return fa != fb ? fa > fb : a.first < b.first;
  });
  if (v.size() > q) v.resize(q);
  return Sparse(v.begin(), v.end());
}

inline Sparse ToSparse(const std::vector<float>& dense) {
  Sparse out;
  for (uint32_t i = 0; i < dense.size(); ++i) out[i] = dense[i];
  return out;
}

inline Sparse ToSparse(const sparse::SparseBlock& block) {
  Sparse out;
  for (size_t e = 0; e < block.size(); ++e) {
    out[block.indices[e]] = block.values[e];
  }
  return out;
}

// The k-th largest nonzero |value| (+inf for k = 0 or no nonzero value).
inline float SortKthLargest(std::vector<float> values, uint64_t k) {
  std::vector<float> magnitudes;
  for (float v : values) {
    if (v != 0.0f) magnitudes.push_back(std::fabs(v));
  }
  if (k == 0 || magnitudes.empty())
    return std::numeric_limits<float>::infinity();
  std::sort(magnitudes.rbegin(), magnitudes.rend());
  return magnitudes[std::min<uint64_t>(k, magnitudes.size()) - 1];
}

}  // namespace gradmesh::testing

#endif  // GRADMESH_TESTS_SUPPORT_REFERENCE_H_
