#include "worker/collectives/tensor_quota.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/numeric/int128.h"
#include "common/status_macros.h"
#include "worker/kernels/topk.h"

namespace gradmesh::collectives {

namespace {

// Entries of `block` (sorted) with indices in `range`: [first, last).
std::pair<size_t, size_t> EntriesIn(const sparse::SparseBlock& block,
                                    sparse::IndexRange range) {
  const auto begin = block.indices.begin();
  const auto first = std::lower_bound(begin, block.indices.end(), range.begin);
  const auto last = std::lower_bound(first, block.indices.end(), range.end);
  return {static_cast<size_t>(first - begin),
          static_cast<size_t>(last - begin)};
}

void AppendEntries(const sparse::SparseBlock& from, sparse::SparseBlock* to) {
  to->indices.insert(to->indices.end(), from.indices.begin(),
                     from.indices.end());
  to->values.insert(to->values.end(), from.values.begin(), from.values.end());
}

// Largest-remainder apportionment of k over `lengths` (k <= their sum).
std::vector<uint64_t> Apportion(uint64_t k,
                                const std::vector<uint64_t>& lengths) {
  const uint64_t total =
      std::accumulate(lengths.begin(), lengths.end(), uint64_t{0});
  std::vector<uint64_t> quotas(lengths.size());
  std::vector<std::pair<uint64_t, size_t>> remainders;  // (remainder, part)
  uint64_t given = 0;
  for (size_t j = 0; j < lengths.size(); ++j) {
    const absl::uint128 share = absl::uint128(k) * lengths[j];
    quotas[j] = absl::Uint128Low64(share / total);
    remainders.emplace_back(absl::Uint128Low64(share % total), j);
    given += quotas[j];
  }
  std::stable_sort(
      remainders.begin(), remainders.end(),
      [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t r = 0; given < k; ++r, ++given) ++quotas[remainders[r].second];
  return quotas;
}

}  // namespace

TensorQuotas::TensorQuotas(std::vector<uint64_t> starts)
    : starts_(std::move(starts)) {
  GM_CHECK(starts_.empty() || starts_.front() == 0) << "first tensor at 0";
  GM_CHECK(std::is_sorted(starts_.begin(), starts_.end())) << "tensor order";
}

std::vector<TensorQuotas::Part> TensorQuotas::Split(
    uint64_t k, sparse::IndexRange range) const {
  if (!per_tensor()) return {{range, std::min(k, range.size())}};
  std::vector<Part> parts;
  std::vector<uint64_t> lengths;
  // From the tensor holding range.begin on, while tensors start in range.
  const size_t first = static_cast<size_t>(
      std::upper_bound(starts_.begin(), starts_.end(), range.begin) -
      starts_.begin() - 1);
  for (size_t t = first; t < starts_.size() && starts_[t] < range.end; ++t) {
    const uint64_t end = t + 1 < starts_.size() ? starts_[t + 1] : range.end;
    const uint64_t begin = std::max(starts_[t], range.begin);
    const uint64_t stop = std::min(end, range.end);
    if (begin >= stop) continue;
    parts.push_back({{begin, stop}, 0});
    lengths.push_back(stop - begin);
  }
  if (parts.empty()) return parts;
  const std::vector<uint64_t> quotas =
      Apportion(std::min(k, range.size()), lengths);
  for (size_t j = 0; j < parts.size(); ++j) parts[j].quota = quotas[j];
  if (k < parts.size()) return parts;
  // No tensor without: each part at 0 takes one from the largest quota.
  for (Part& part : parts) {
    if (part.quota > 0) continue;
    auto largest = std::max_element(
        parts.begin(), parts.end(),
        [](const Part& a, const Part& b) { return a.quota < b.quota; });
    --largest->quota;
    part.quota = 1;
  }
  return parts;
}

sparse::SparseBlock TensorQuotas::TopK(const kernels::TopKSelector& topk,
                                       absl::Span<const float> x, uint64_t k,
                                       uint64_t begin) const {
  const std::vector<Part> parts = Split(k, {begin, begin + x.size()});
  if (parts.size() <= 1) {  // within one tensor: the plain selection
    return topk.TopKAbs(x, k, static_cast<uint32_t>(begin));
  }
  std::vector<sparse::IndexRange> segments;
  std::vector<uint64_t> quotas;
  for (const Part& part : parts) {
    segments.push_back({part.range.begin - begin, part.range.end - begin});
    quotas.push_back(part.quota);
  }
  sparse::SparseBlock selected;
  for (const sparse::SparseBlock& block : topk.SegmentedTopKAbs(
           x, segments, quotas, static_cast<uint32_t>(begin))) {
    AppendEntries(block, &selected);
  }
  return selected;
}

void TensorQuotas::SplitTopK(const kernels::TopKSelector& topk,
                             const sparse::SparseBlock& block, uint64_t k,
                             sparse::IndexRange range,
                             sparse::SparseBlock* kept,
                             sparse::SparseBlock* dropped) const {
  GM_CHECK(block.size() == 0 || (range.Contains(block.indices.front()) &&
                                 range.Contains(block.indices.back())))
      << "block entries outside the selection's range";
  const std::vector<Part> parts = Split(k, range);
  if (parts.size() <= 1) {  // within one tensor: the plain selection
    topk.SplitTopKAbs(block, k, kept, dropped);
    return;
  }
  *kept = {};
  *dropped = {};
  for (const Part& part : parts) {
    const auto [first, last] = EntriesIn(block, part.range);
    sparse::SparseBlock slice;
    slice.indices.assign(block.indices.begin() + first,
                         block.indices.begin() + last);
    slice.values.assign(block.values.begin() + first,
                        block.values.begin() + last);
    sparse::SparseBlock part_kept, part_dropped;
    topk.SplitTopKAbs(slice, part.quota, &part_kept, &part_dropped);
    AppendEntries(part_kept, kept);
    AppendEntries(part_dropped, dropped);
  }
}

uint64_t CountMissingTensors(absl::Span<const uint64_t> starts, uint64_t n,
                             const sparse::SparseBlock& result) {
  if (starts.empty()) return result.size() == 0 && n > 0 ? 1 : 0;
  uint64_t missing = 0;
  for (size_t t = 0; t < starts.size(); ++t) {
    const uint64_t end = t + 1 < starts.size() ? starts[t + 1] : n;
    if (starts[t] == end) continue;
    const auto [first, last] = EntriesIn(result, {starts[t], end});
    if (first == last) ++missing;
  }
  return missing;
}

}  // namespace gradmesh::collectives
