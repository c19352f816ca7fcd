#include "worker/sparse/coo.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradmesh::sparse {

static_assert(std::endian::native == std::endian::little,
              "the COO wire format is little-endian and copied raw");

std::string EncodeCoo(absl::Span<const SparseBlock* const> blocks) {
  size_t total = 0;
  for (const SparseBlock* b : blocks) total += b->size();
  std::string out(total * kCooEntryBytes, '\0');
  char* index_out = out.data();
  char* value_out = out.data() + total * sizeof(uint32_t);
  for (const SparseBlock* b : blocks) {
    const size_t n = b->size();
    if (n == 0) continue;
    std::memcpy(index_out, b->indices.data(), n * sizeof(uint32_t));
    std::memcpy(value_out, b->values.data(), n * sizeof(float));
    index_out += n * sizeof(uint32_t);
    value_out += n * sizeof(float);
  }
  return out;
}

absl::StatusOr<std::vector<SparseBlock>> DecodeCoo(
    absl::string_view bytes, absl::Span<const IndexRange> ranges) {
  if (bytes.size() % kCooEntryBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "COO message of ", bytes.size(), " bytes is not a multiple of 8"));
  }
  const size_t total = bytes.size() / kCooEntryBytes;
  const char* index_in = bytes.data();
  const char* value_in = bytes.data() + total * sizeof(uint32_t);
  std::vector<SparseBlock> out(ranges.size());
  size_t current = 0;
  for (size_t e = 0; e < total; ++e) {
    uint32_t index;
    float value;
    std::memcpy(&index, index_in + e * sizeof(uint32_t), sizeof(index));
    std::memcpy(&value, value_in + e * sizeof(float), sizeof(value));
    while (current < ranges.size() && !ranges[current].Contains(index)) {
      ++current;
    }
    if (current == ranges.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("COO entry ", e, " has index ", index,
                       " outside the remaining block ranges of the message"));
    }
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("COO entry ", e, " has a non-finite value"));
    }
    SparseBlock& block = out[current];
    if (!block.empty() && index <= block.indices.back()) {
      return absl::InvalidArgumentError(
          absl::StrCat("COO indices not increasing at entry ", e));
    }
    block.push_back(index, value);
  }
  return out;
}

absl::StatusOr<SparseBlock> DecodeCoo(absl::string_view bytes,
                                      IndexRange range) {
  auto blocks = DecodeCoo(bytes, absl::MakeConstSpan(&range, 1));
  if (!blocks.ok()) return blocks.status();
  return std::move((*blocks)[0]);
}

}  // namespace gradmesh::sparse
