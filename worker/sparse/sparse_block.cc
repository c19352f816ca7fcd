#include "worker/sparse/sparse_block.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/fnv1a.h"
#include "common/status_macros.h"
#include "common/work_meter.h"

namespace gradmesh::sparse {

absl::Status Validate(const SparseBlock& block, IndexRange range) {
  if (block.indices.size() != block.values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse block has ", block.indices.size(), " indices but ",
                     block.values.size(), " values"));
  }
  for (size_t i = 0; i < block.indices.size(); ++i) {
    const uint32_t index = block.indices[i];
    if (!range.Contains(index)) {
      return absl::InvalidArgumentError(absl::StrCat("sparse index ", index,
                                                     " outside [", range.begin,
                                                     ", ", range.end, ")"));
    }
    if (i > 0 && index <= block.indices[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse indices not strictly increasing at position ", i,
                       ": ", block.indices[i - 1], " then ", index));
    }
  }
  return absl::OkStatus();
}

SparseBlock Add(const SparseBlock& a, const SparseBlock& b) {
  CountMerged(a.size() + b.size());
  SparseBlock out;
  out.reserve(a.size() + b.size());
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (a.indices[i] < b.indices[j]) {
      out.push_back(a.indices[i], a.values[i]);
      ++i;
    } else if (b.indices[j] < a.indices[i]) {
      out.push_back(b.indices[j], b.values[j]);
      ++j;
    } else {
      out.push_back(a.indices[i], a.values[i] + b.values[j]);
      ++i;
      ++j;
    }
  }
  for (; i < a.size(); ++i) out.push_back(a.indices[i], a.values[i]);
  for (; j < b.size(); ++j) out.push_back(b.indices[j], b.values[j]);
  return out;
}

void ScatterAdd(const SparseBlock& block, absl::Span<float> dense) {
  CountAccumulated(block.size());
  for (size_t i = 0; i < block.size(); ++i) {
    GM_CHECK(block.indices[i] < dense.size()) << "index " << block.indices[i];
    dense[block.indices[i]] += block.values[i];
  }
}

void Densify(const SparseBlock& block, IndexRange range,
             absl::Span<float> dense) {
  GM_CHECK(dense.size() == range.size());
  std::fill(dense.begin(), dense.end(), 0.0f);
  auto first =
      std::lower_bound(block.indices.begin(), block.indices.end(), range.begin);
  for (auto it = first; it != block.indices.end() && *it < range.end; ++it) {
    dense[*it - range.begin] = block.values[it - block.indices.begin()];
  }
}

SparseBlock Slice(const SparseBlock& block, IndexRange range) {
  const auto begin =
      std::lower_bound(block.indices.begin(), block.indices.end(), range.begin);
  const auto end = std::lower_bound(begin, block.indices.end(), range.end);
  const size_t from = begin - block.indices.begin();
  const size_t to = end - block.indices.begin();
  return SparseBlock{{begin, end},
                     {block.values.begin() + from, block.values.begin() + to}};
}

uint64_t Digest(const SparseBlock& block) {
  const uint64_t hash = Fnv1aWords(
      absl::string_view(reinterpret_cast<const char*>(block.indices.data()),
                        block.indices.size() * sizeof(uint32_t)));
  return Fnv1aWords(
      absl::string_view(reinterpret_cast<const char*>(block.values.data()),
                        block.values.size() * sizeof(float)),
      hash);
}

}  // namespace gradmesh::sparse
